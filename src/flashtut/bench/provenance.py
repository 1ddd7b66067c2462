"""Where a measurement came from: device, software versions, date, command, git commit.

Written into every JSON file the harness saves, so a committed figure can be traced to the run
that produced it. Deliberately hostname-free (files are committed to a public repository).
Versions are read from package metadata, so recording them imports neither triton nor cupy.
"""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from ..version import __version__


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cupy_version() -> str | None:
    # cupy ships under several distribution names (cupy, cupy-cuda12x, cupy-cuda13x, ...)
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == "cupy" or name.startswith("cupy-cuda"):
            return f"{dist.version} ({name})"
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> dict | None:
    """The commit of the repository this package was imported from (None outside a checkout).

    FLASHTUT_SOURCE_COMMIT overrides it: a copy of the working tree on another machine may carry a
    stale .git, and the commit it was copied from is then known only to whoever copied it.
    """
    given = os.environ.get("FLASHTUT_SOURCE_COMMIT", "").strip()
    if given:
        return {"commit": given, "dirty": False, "from": "FLASHTUT_SOURCE_COMMIT"}
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def device_info(device) -> dict:
    device = torch.device(device)
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        major, minor = props.major, props.minor
        return {
            "type": "cuda",
            "name": props.name,
            "compute_capability": f"{major}.{minor}",
            "memory_bytes": int(props.total_memory),
            "multiprocessors": int(props.multi_processor_count),
        }
    return {"type": "cpu", "name": _cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


def command_line(argv: list[str] | None) -> str | None:
    """The command as a reader would type it again (``python -m flashtut.bench ...``)."""
    if argv is None:
        return None
    return shlex.join(["python", "-m", "flashtut.bench", *argv])


def collect(device, argv: list[str] | None = None, call: str | None = None) -> dict:
    """Provenance of a run on ``device``; ``argv`` is the CLI's argument list, ``call`` a
    description of a Python-level call when there was no command line."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(argv),
        "call": call,
        "git": git_commit(),
        "device": device_info(device),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": cudnn,
            "triton": _dist_version("triton"),
            "cupy": _cupy_version(),
            "numpy": _dist_version("numpy"),
            "flashtut": __version__,
        },
        "platform": {"system": platform.system(), "machine": platform.machine(),
                     "python_implementation": platform.python_implementation()},
        "env": {k: os.environ[k] for k in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }


__all__ = ["collect", "device_info", "git_commit", "command_line"]


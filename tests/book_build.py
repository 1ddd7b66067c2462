"""The book build of ``tests/book/test_book.py``, started in the background as soon as collection ends
(``tests/conftest.py`` calls :func:`schedule` and :func:`stop` and provides the fixtures below).

Building the book executes every notebook, one after the other, in one process: minutes of a single
core. So when a selected test needs the build (the ``book`` fixture), the build starts as soon as the
tests are collected, and those tests run last: on a machine of two cores the notebooks execute while
the rest of the suite runs beside them, and the ``book`` fixture waits for whatever is left.

The build drops the notebooks' execution cache first (``_config.yml`` caches executions for ``make
book``), so every notebook runs against the library as it is now. ``FLASHTUT_BOOK_REUSE=1`` and
``FLASHTUT_BOOK_TOC`` are read here (see ``test_book.py``).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
LOG = ROOT / "_build" / "book-build.log"


@dataclass
class Build:
    returncode: int
    seconds: float
    log: Path
    toc: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _jupyter_book() -> str | None:
    beside = Path(sys.executable).parent / "jupyter-book"
    return str(beside) if beside.exists() else shutil.which("jupyter-book")


def _toc() -> Path:
    return Path(os.environ.get("FLASHTUT_BOOK_TOC", ROOT / "_toc.yml")).resolve()


def _reuse() -> bool:
    return os.environ.get("FLASHTUT_BOOK_REUSE") == "1" and (HTML / "index.html").exists()


class _Running:
    """The build in flight: its process, command, start time and open log."""

    def __init__(self, exe: str):
        self.cmd = [exe, "build", str(ROOT), "-W", "-n", "--keep-going"]
        if _toc() != (ROOT / "_toc.yml").resolve():
            self.cmd += ["--toc", str(_toc())]
        LOG.parent.mkdir(parents=True, exist_ok=True)
        # a fresh execution of every notebook: the cache keys on the cells' code, not on src/, and
        # Sphinx rereads (so executes) only the documents whose files changed since its last build
        for stale in (".jupyter_cache", ".doctrees"):
            shutil.rmtree(ROOT / "_build" / stale, ignore_errors=True)
        self.log = LOG.open("w")
        self.start = time.perf_counter()
        # a session of its own, so that an interrupted test run can stop it with its notebook kernels
        # one thread for the notebooks' PyTorch: the suite runs beside the build, and two processes
        # each spinning two OpenMP threads on two cores run several times slower than one each
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)

    def wait(self) -> tuple[int, float]:
        returncode = self.proc.wait()
        self.log.close()
        return returncode, time.perf_counter() - self.start

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait()
        self.log.close()


_RUNNING: _Running | None = None


def schedule(config, items) -> None:
    """Run the tests that read the build last and start it, if any of ``items`` (what -m and -k left)
    needs it."""
    global _RUNNING
    needs = [item for item in items if "book" in getattr(item, "fixturenames", ())]
    if not needs:
        return
    # the tests that read the build run last, in their order
    items[:] = [item for item in items if item not in needs] + needs
    exe = _jupyter_book()
    if config.option.collectonly or _reuse() or exe is None or _RUNNING is not None:
        return
    _RUNNING = _Running(exe)
    torch.set_num_threads(1)          # the suite's share of the cores, beside the build (see _Running)


def stop() -> None:
    """Stop a build that no test waited for (-x ended the session early, or ^C)."""
    global _RUNNING
    if _RUNNING is not None:
        _RUNNING.stop()
        _RUNNING = None


@pytest.fixture(scope="session")
def capsys_session_disabled(pytestconfig):
    """Print straight to the terminal, past pytest's capture, so paths and timings show up."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")

    def emit(message: str):
        if capman is not None:
            with capman.global_and_fixture_disabled():
                print(message, flush=True)
        else:
            print(message, flush=True)

    return emit


@pytest.fixture(scope="session")
def book(capsys_session_disabled) -> Build:
    """The finished build (it started when collection ended)."""
    global _RUNNING
    if _reuse():
        capsys_session_disabled(f"\n[book] reusing the HTML in {HTML} (FLASHTUT_BOOK_REUSE=1)")
        return Build(0, 0.0, LOG if LOG.exists() else Path(os.devnull), _toc())
    if _RUNNING is None:
        exe = _jupyter_book()
        if exe is None:
            pytest.skip("jupyter-book is not installed in this environment (make test installs it)")
        _RUNNING = _Running(exe)        # not started at collection (a test that calls it directly)
    running, _RUNNING = _RUNNING, None
    returncode, seconds = running.wait()
    capsys_session_disabled(f"\n[book] `{' '.join(running.cmd)}` exited {returncode} after {seconds:.0f} s "
                            f"(started when collection ended); log: {LOG}")
    return Build(returncode, seconds, LOG, _toc())

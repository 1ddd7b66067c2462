"""The book build of ``tests/book/test_book.py``, started in the background as soon as collection ends
(``tests/conftest.py`` calls :func:`schedule` and :func:`stop` and provides the fixtures below).

Building the book executes every notebook, one after the other, in one process: minutes of a single
core. So when a selected test needs the build (the ``book`` fixture), the build starts as soon as the
tests are collected, and those tests run last: on a machine of two cores the notebooks execute while
the rest of the suite runs beside them, and the ``book`` fixture waits for whatever is left.

Under pytest-xdist (``make test`` runs ``-n auto``) the workers collect and run the tests and the
controller owns the build: a worker that collects a test needing it leaves a mark file, the controller
starts the build when a worker's collection ends, and writes its exit code to a result file that the
``book`` fixture of any worker waits for. One build, whatever the number of workers.

The build drops the notebooks' execution cache first (``_config.yml`` caches executions for ``make
book``), so every notebook runs against the library as it is now. ``FLASHTUT_BOOK_REUSE=1`` and
``FLASHTUT_BOOK_TOC`` are read here (see ``test_book.py``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
LOG = ROOT / "_build" / "book-build.log"
#: how long a worker's ``book`` fixture waits for the controller's build
WAIT_S = 3600


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
#: the xdist controller's session token (a worker reads it from ``workerinput``)
_TOKEN = uuid.uuid4().hex[:12]


def _worker_token(config) -> str | None:
    """The controller's token when ``config`` is an xdist worker's, else None."""
    return getattr(config, "workerinput", {}).get("flashtut_book_token")


def _needs_mark(token: str) -> Path:
    return ROOT / "_build" / f".book-needed-{token}"


def _result_file(token: str) -> Path:
    return ROOT / "_build" / f".book-result-{token}.json"


def configure_node(node) -> None:
    """xdist controller: hand each worker the session's token."""
    node.workerinput["flashtut_book_token"] = _TOKEN


def schedule(config, items) -> None:
    """Run the tests that read the build last and start it, if any of ``items`` (what -m and -k left)
    needs it (under xdist: leave the controller a mark that it is needed)."""
    global _RUNNING
    needs = [item for item in items if "book" in getattr(item, "fixturenames", ())]
    if not needs:
        return
    # the tests that read the build run last, in their order
    items[:] = [item for item in items if item not in needs] + needs
    exe = _jupyter_book()
    if config.option.collectonly or _reuse() or exe is None or _RUNNING is not None:
        return
    torch.set_num_threads(1)          # the suite's share of the cores, beside the build (see _Running)
    token = _worker_token(config)
    if token is not None:
        _needs_mark(token).parent.mkdir(parents=True, exist_ok=True)
        _needs_mark(token).touch()
        return
    _RUNNING = _Running(exe)


def collection_finished() -> None:
    """xdist controller, when a worker has collected: start the build if a worker marked it needed,
    and write its exit code and time to the result file when it ends."""
    global _RUNNING
    if _RUNNING is not None or not _needs_mark(_TOKEN).exists():
        return
    _needs_mark(_TOKEN).unlink()
    running = _RUNNING = _Running(_jupyter_book())

    def report():
        returncode, seconds = running.wait()
        tmp = _result_file(_TOKEN).with_suffix(".tmp")
        tmp.write_text(json.dumps({"returncode": returncode, "seconds": seconds, "cmd": running.cmd}))
        tmp.replace(_result_file(_TOKEN))

    threading.Thread(target=report, daemon=True).start()


def stop() -> None:
    """Stop a build that no test waited for (-x ended the session early, or ^C), and remove the
    controller's token files."""
    global _RUNNING
    if _RUNNING is not None:
        _RUNNING.stop()
        _RUNNING = None
    for path in (_needs_mark(_TOKEN), _result_file(_TOKEN)):
        path.unlink(missing_ok=True)


def _wait_for_controller(token: str, emit) -> Build:
    result = _result_file(token)
    deadline = time.monotonic() + WAIT_S
    while not result.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the book build of the xdist controller did not finish in {WAIT_S} s (log: {LOG})")
        time.sleep(1.0)
    done = json.loads(result.read_text())
    emit(f"\n[book] `{' '.join(done['cmd'])}` exited {done['returncode']} after {done['seconds']:.0f} s "
         f"(started by the xdist controller when collection ended); log: {LOG}")
    return Build(done["returncode"], done["seconds"], LOG, _toc())


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
def book(capsys_session_disabled, pytestconfig) -> Build:
    """The finished build (it started when collection ended)."""
    global _RUNNING
    if _reuse():
        capsys_session_disabled(f"\n[book] reusing the HTML in {HTML} (FLASHTUT_BOOK_REUSE=1)")
        return Build(0, 0.0, LOG if LOG.exists() else Path(os.devnull), _toc())
    token = _worker_token(pytestconfig)
    if token is not None and _jupyter_book() is not None:
        return _wait_for_controller(token, capsys_session_disabled)
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

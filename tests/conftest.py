"""Shared test set-up.

* ``gpu``-marked tests are skipped when no CUDA GPU is present.
* The book build starts in the background when collection ends (under pytest-xdist, once, in the
  controller), and the tests that read it run last (``book_build.py``).
* Without a GPU, Triton runs through its CPU interpreter: TRITON_INTERPRET must be set before
  triton is first imported, so it is set here, before any test module imports flashtut.
"""
import os
from pathlib import Path

import pytest
import torch

import book_build
from book_build import book, capsys_session_disabled  # noqa: F401 (fixtures of tests/book/test_book.py)

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist starts a worker per core: one PyTorch thread each, or they oversubscribe the cores
    torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)          # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    book_build.schedule(config, items)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found); run on a GPU with `make gpu-test`")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session):
    book_build.stop()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):                      # pytest-xdist's controller: one build for all workers
    book_build.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    book_build.collection_finished()


@pytest.fixture
def gen():
    """A seeded CPU generator: every test draws fresh random inputs, reproducibly."""
    return torch.Generator().manual_seed(1234)


def pytest_terminal_summary(terminalreporter):
    """Keep the CUDA compiler's resource report (registers, shared memory, stack, spills of every
    kernel build, recorded by tests/kernels/test_cuda_compile.py) in the test output, passed or not."""
    lines = []
    for outcome in ("passed", "failed"):
        for rep in terminalreporter.stats.get(outcome, []):
            if rep.when == "call" and "test_cuda_compile" in rep.nodeid:
                # each property holds one line per kernel and architecture, joined by "; "
                lines += [part for _, value in rep.user_properties for part in str(value).split("; ")]
    if lines:
        terminalreporter.section("CUDA resource report (ptxas -v, from tests/kernels/test_cuda_compile.py)")
        for line in lines:
            terminalreporter.write_line(line)


#: data that only an experiment reads lives in experiments/<study>/data
EXPERIMENT_DATA = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*/data"))


def notebook_cells(name: str) -> list[tuple[str, str, list]]:
    """``(kind, source, tags)`` of every cell of ``notebooks/<name>``, in order."""
    import json

    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / name).read_text())
    return [(c["cell_type"], "".join(c["source"]), c.get("metadata", {}).get("tags", [])) for c in nb["cells"]]


def measured_cells(cells) -> list[tuple[list, tuple, list[str]]]:
    """For each code cell of ``cells`` (as :func:`notebook_cells` gives them) that loads committed results:
    its tags, the cell after it (where the caption goes) and the files it names in ``load_results``."""
    import re

    out = []
    for i, (kind, src, tags) in enumerate(cells):
        files = re.findall(r'load_results\("([^"]+)"', src)
        if kind == "code" and files:
            out.append((tags, cells[i + 1], files))
    return out


def load_committed(name: str):
    """A committed results file by name: the book's (as the chapters load it), else an experiment's."""
    from flashtut import results_data

    for folder in [None, *EXPERIMENT_DATA]:
        try:
            return results_data.load_results(name, data_dir=folder)
        except results_data.ResultsMissing:
            continue
    raise results_data.ResultsMissing(name, "book/data or experiments/*/data")

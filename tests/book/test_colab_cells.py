"""The Colab set-up cell: one definition (``flashtut.colab``), the repository URL read from
``_config.yml``, every notebook's first code cell equal to it, and ``sync`` that is idempotent and
points a fork at itself (exercised on copies in a temporary directory)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is part of the book toolchain (requirements-dev.txt)")

from flashtut import colab

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FORK = "https://github.com/someone-else/fa-fork"


def expected_cell() -> str:
    return colab.setup_cell(*colab.read_repository(ROOT / "_config.yml"))


def first_code_cell(path: Path) -> str | None:
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return next((c.source for c in nb.cells if c.cell_type == "code"), None)
    m = colab._first_myst_cell(path.read_text())
    return None if m is None else m.group(1).rstrip("\n")


@pytest.fixture
def book_copy(tmp_path) -> Path:
    """_config.yml, notebooks/ and the book/ pages, copied into tmp_path."""
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    (tmp_path / "notebooks").mkdir()
    for nb in NOTEBOOKS:
        shutil.copy(nb, tmp_path / "notebooks" / nb.name)
    (tmp_path / "book").mkdir()
    for page in (ROOT / "book").glob("*.md"):
        shutil.copy(page, tmp_path / "book" / page.name)
    return tmp_path


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- the committed notebooks ---------------------------------------------------------------------

def test_module_cell_matches_this_checkouts_config():
    url, branch = colab.read_repository(ROOT / "_config.yml")
    assert (colab.REPO_URL, colab.BRANCH) == (url, branch)
    assert colab.SETUP_CELL == expected_cell()
    assert f"git+{url}@{branch}" in colab.SETUP_CELL


@pytest.mark.skipif(not NOTEBOOKS, reason="notebooks/ holds no .ipynb yet")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_first_code_cell_is_the_setup_cell(path):
    assert first_code_cell(path) == expected_cell(), (
        f"{path.name}: the first code cell is not the synced set-up cell; "
        "run `python -m flashtut.colab sync`")


def test_myst_pages_with_the_setup_cell_are_in_sync():
    pages = [p for p in colab.notebook_paths(ROOT) if p.suffix == ".md"]
    assert ROOT / "book" / "errata.md" in pages, "the errata page should open with the set-up cell"
    for page in pages:
        assert first_code_cell(page) == expected_cell(), f"{page.name}: run `python -m flashtut.colab sync`"


# --- sync on copies --------------------------------------------------------------------------------

def test_sync_is_idempotent(book_copy):
    colab.sync(book_copy)
    after_first = snapshot(book_copy)
    assert colab.sync(book_copy) == []
    assert snapshot(book_copy) == after_first
    for path in colab.notebook_paths(book_copy):
        assert first_code_cell(path) == expected_cell()


def test_sync_repo_points_config_and_every_cell_at_a_fork_and_back(book_copy):
    original_url, original_branch = colab.read_repository(book_copy / "_config.yml")
    # one round trip first, so that every notebook has been written once by nbformat (sync leaves
    # files whose cell is already right untouched, byte for byte)
    colab.sync(book_copy, repo=FORK)
    colab.sync(book_copy, repo=original_url)
    synced = snapshot(book_copy)
    config_before = (book_copy / "_config.yml").read_text().splitlines()

    changed = colab.sync(book_copy, repo=FORK + ".git/", branch="dev")
    assert book_copy / "_config.yml" in changed
    assert colab.read_repository(book_copy / "_config.yml") == (FORK, "dev")
    config_after = (book_copy / "_config.yml").read_text().splitlines()
    differing = [(a, b) for a, b in zip(config_before, config_after) if a != b]
    assert len(config_before) == len(config_after) and len(differing) == 2, differing
    for path in colab.notebook_paths(book_copy):
        cell = first_code_cell(path)
        assert f"git+{FORK}@dev" in cell and original_url not in cell, path.name
    assert colab.sync(book_copy, repo=FORK, branch="dev") == []

    colab.sync(book_copy, repo=original_url, branch=original_branch)
    assert snapshot(book_copy) == synced


def test_sync_replaces_a_stale_setup_cell_and_keeps_other_first_cells(tmp_path):
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    (tmp_path / "notebooks").mkdir()
    stale = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A chapter"),
        nbformat.v4.new_code_cell('try:\n    import flashtut\nexcept ImportError:\n'
                                  '    %pip install -q "flashtut @ git+https://example.org/old"\n'
                                  'device = flashtut.notebook.pick_device()',
                                  execution_count=3,
                                  outputs=[nbformat.v4.new_output("stream", text="old\n")]),
        nbformat.v4.new_code_cell("x = 1"),
    ])
    own_first = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
    nbformat.write(stale, tmp_path / "notebooks" / "a.ipynb")
    nbformat.write(own_first, tmp_path / "notebooks" / "b.ipynb")

    colab.sync(tmp_path)
    cell = expected_cell()
    a = nbformat.read(tmp_path / "notebooks" / "a.ipynb", as_version=4)
    assert [c.source for c in a.cells] == ["# A chapter", cell, "x = 1"]
    assert a.cells[1].outputs == [] and a.cells[1].execution_count is None
    b = nbformat.read(tmp_path / "notebooks" / "b.ipynb", as_version=4)
    assert [c.source for c in b.cells] == [cell, "import torch"]
    nbformat.validate(b)


def test_read_repository_understands_quotes_and_comments(tmp_path):
    cfg = tmp_path / "_config.yml"
    cfg.write_text(textwrap.dedent("""\
        title: x
        repository:
          url: "https://github.com/a/b"   # the fork
          branch: 'work'
        html:
          url: https://ignored.example.com
        """))
    assert colab.read_repository(cfg) == ("https://github.com/a/b", "work")
    cfg.write_text("title: no repository section\n")
    assert colab.read_repository(cfg) == (colab.DEFAULT_REPO_URL, colab.DEFAULT_BRANCH)


@pytest.mark.parametrize("bad", ["github.com/a/b", "http://github.com/a/b", "https://github.com/a b",
                                 'https://github.com/a/"b', "https://github.com/a/b?x=1"])
def test_bad_repo_urls_are_rejected(bad, book_copy):
    with pytest.raises(ValueError, match="repo"):
        colab.setup_cell(bad)
    before = snapshot(book_copy)
    assert colab.main(["sync", "--root", str(book_copy), "--repo", bad]) == 2
    assert snapshot(book_copy) == before


def test_bad_arguments_get_the_documented_errors():
    with pytest.raises(TypeError, match="repo"):
        colab.setup_cell(42)
    with pytest.raises(ValueError, match="branch"):
        colab.setup_cell(colab.DEFAULT_REPO_URL, "main; rm -rf /")
    with pytest.raises(FileNotFoundError, match="_config.yml"):
        colab.sync(Path("/nonexistent-book-root"))


def test_cli_sync_reports_then_finds_nothing_to_do(book_copy):
    cmd = [sys.executable, "-m", "flashtut.colab", "sync", "--root", str(book_copy)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    second = subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert "everything already in sync" in second.stdout
    shown = subprocess.run([sys.executable, "-m", "flashtut.colab", "show"], check=True,
                           capture_output=True, text=True)
    assert shown.stdout.rstrip("\n") == colab.SETUP_CELL


# --- the cell itself runs ------------------------------------------------------------------------

# The cell, run by a real IPython shell in a fresh process where importing flashtut fails until
# "pip" (a stand-in for subprocess.run) has run, or fails for good: what the reader sees is what
# the shell prints.
RUN_CELL = r"""
import contextlib, importlib.abc, io, json, subprocess, sys
from IPython.core.interactiveshell import InteractiveShell

cell = sys.stdin.read()
mode = sys.argv[1]                          # present | missing | fails
blocked = {"on": mode != "present"}
calls = []


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked["on"] and name.split(".")[0] == "flashtut":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def fake_run(cmd, **kwargs):
    calls.append(cmd)
    if mode == "fails":
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version\n"
                                           "ERROR: No matching distribution found for flashtut\n")
    blocked["on"] = False                   # "installing" makes the package importable
    return subprocess.CompletedProcess(cmd, 0, "", "")


subprocess.run = fake_run
sys.meta_path.insert(0, Block())
shell = InteractiveShell.instance()
shown = io.StringIO()
with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(shown):
    result = shell.run_cell(cell)
print(json.dumps({"calls": calls, "ok": result.success, "shown": shown.getvalue(),
                  "device": str(shell.user_ns.get("device"))}))
"""


def _run_setup_cell(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUN_CELL, mode], input=colab.SETUP_CELL,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("installed", [True, False], ids=["flashtut-installed", "flashtut-missing"])
def test_setup_cell_runs_and_installs_only_when_missing(installed):
    result = _run_setup_cell("present" if installed else "missing")
    assert result["ok"], result["shown"]
    assert result["device"] in ("cpu", "cuda")
    if installed:
        assert result["calls"] == []
    else:
        # the running kernel's own Python installs the package (what %pip would do), quietly
        assert result["calls"] == [[sys.executable, "-m", "pip", "install", "-q",
                                    f"flashtut @ git+{colab.REPO_URL}@{colab.BRANCH}"]]


def test_a_failed_install_says_in_one_line_what_failed_and_what_to_do():
    result = _run_setup_cell("fails")
    assert not result["ok"] and result["device"] == "None"
    lines = result["shown"].strip().splitlines()
    # one line: no pip output, no restart note, no traceback (let alone two)
    assert len(lines) == 1, result["shown"]
    assert "Traceback" not in result["shown"] and "ImportError" not in result["shown"]
    line = lines[0]
    assert line.startswith(f"SetupError: pip could not install flashtut @ git+{colab.REPO_URL}@{colab.BRANCH}")
    assert "(ERROR: No matching distribution found for flashtut)" in line     # pip's own reason
    assert line.endswith("Check the network connection and the URL, then run this cell again.")


def test_setup_cell_is_plain_python_that_fits_the_code_box():
    # no IPython magic (a failed %pip cannot be detected), and no line wider than the book's code box
    import ast

    ast.parse(colab.SETUP_CELL)
    assert "%pip" not in colab.SETUP_CELL and "returncode" in colab.SETUP_CELL
    assert max(len(line) for line in colab.SETUP_CELL.splitlines()) <= 88

"""Committed notebooks carry no outputs and no execution counts, are valid nbformat 4, run on the
``python3`` kernel the book build uses, and are all listed in the table of contents; the chapters
in ``SHORT_LINE_CHAPTERS`` keep every code line within ``MAX_CODE_LINE`` characters.

Outputs belong to the build (which executes every notebook), not to the repository: stripped
notebooks keep diffs readable and cannot show results that the code no longer produces.
"""
from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is part of the book toolchain (requirements-dev.txt)")
import yaml

from flashtut import colab

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

needs_notebooks = pytest.mark.skipif(not NOTEBOOKS, reason="notebooks/ holds no .ipynb yet")


def _ids(paths):
    return [p.name for p in paths]


@needs_notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_valid_nbformat4(path):
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    assert nb.nbformat == 4, f"{path.name}: nbformat {nb.nbformat}, expected 4"
    nbformat.validate(nb)
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    assert kernel == "python3", f"{path.name}: kernelspec name {kernel!r}; the book executes with 'python3'"


@needs_notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_has_no_outputs_or_execution_counts(path):
    nb = nbformat.read(path, as_version=4)
    dirty = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            dirty.append(f"cell {i}: {len(cell.outputs)} output(s)")
        if cell.get("execution_count") is not None:
            dirty.append(f"cell {i}: execution_count {cell.execution_count}")
    assert not dirty, (f"{path.name} was committed with results; strip them "
                       f"(jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)}):\n"
                       + "\n".join(dirty))


@needs_notebooks
def test_every_notebook_is_in_the_table_of_contents():
    # only_build_toc_files: a notebook missing from _toc.yml would silently never be built or run
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = set()

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                listed.add(e["file"].removesuffix(".ipynb").removesuffix(".md"))
            walk(e.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    orphans = [p.name for p in NOTEBOOKS if f"notebooks/{p.stem}" not in listed]
    assert not orphans, f"notebooks not listed in _toc.yml: {orphans}"


# A code cell of the rendered book scrolls sideways once a line passes about 80 characters (and on a
# phone long before). Chapters listed here are kept within the limit; add one once it is rewrapped.
MAX_CODE_LINE = 80
SHORT_LINE_CHAPTERS = ["01_memory_hierarchy", "02_naive_attention", "03_safe_softmax",
                       "04_online_softmax", "05_tiled_attention", "06_backward", "07_triton",
                       "08_cuda", "09_results", "10_beyond", "11_hopper", "12_real_model", "13_masks"]


def long_code_lines(nb, limit: int = MAX_CODE_LINE) -> list[str]:
    """``cell i, line j (n chars): text`` for every code line longer than ``limit``, except the
    lines of the Colab set-up cell (written by ``flashtut.colab``; the line of its ``%pip install``
    that holds the whole repository URL is as long as the URL makes it)."""
    setup = set(colab.setup_cell(*colab.read_repository(ROOT / "_config.yml")).splitlines())
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for j, line in enumerate(cell.source.splitlines(), 1):
            if len(line) > limit and line not in setup:
                found.append(f"cell {i}, line {j} ({len(line)} chars): {line}")
    return found


@pytest.mark.parametrize("stem", SHORT_LINE_CHAPTERS)
def test_code_lines_fit_the_code_box(stem):
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    assert path.exists(), f"SHORT_LINE_CHAPTERS names {stem}, which is not in notebooks/"
    long = long_code_lines(nbformat.read(path, as_version=4))
    assert not long, (f"{path.name}: code lines over {MAX_CODE_LINE} characters scroll sideways "
                      f"in the book; break them inside brackets or name a value:\n" + "\n".join(long))


def test_long_code_lines_flags_a_long_line_and_spares_only_the_setup_cell():
    setup = colab.setup_cell(*colab.read_repository(ROOT / "_config.yml"))
    wide = "x = " + " + ".join(["1"] * 40)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup),
                                         nbformat.v4.new_markdown_cell(wide),
                                         nbformat.v4.new_code_cell("y = 2\n" + wide)])
    assert long_code_lines(nb) == [f"cell 2, line 2 ({len(wide)} chars): {wide}"]
    assert long_code_lines(nb, limit=len(wide)) == []


@needs_notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_solutions_are_folded_on_the_page(path):
    """A reader sees an exercise before its answer: every code cell that starts with "# Solution" carries
    the ``hide-input`` tag, which the book renders as a folded "Show code cell source"."""
    nb = nbformat.read(path, as_version=4)
    open_solutions = [c.get("id") for c in nb.cells if c.cell_type == "code"
                      and c.source.lstrip().startswith("# Solution")
                      and "hide-input" not in c.get("metadata", {}).get("tags", [])]
    assert not open_solutions, f"{path.name}: solution cells shown unfolded: {open_solutions}"

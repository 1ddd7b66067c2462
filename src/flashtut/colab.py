"""The first code cell of every chapter, defined once, and the command that keeps it in sync.

The repository URL lives in one place, ``repository.url`` (and ``repository.branch``) of the book's
``_config.yml``: the launch buttons read it there, and ``python -m flashtut.colab sync`` copies it
into the set-up cell of every notebook, so a reader who opens a chapter in Colab installs
``flashtut`` from the same repository the button came from. To point a fork at itself::

    python -m flashtut.colab sync --repo https://github.com/YOU/flash-attention-from-scratch

rewrites ``_config.yml`` and every notebook's first cell; commit the result.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# the repository's URL and branch are read from _config.yml by flashtut.repository; this module
# writes them into notebooks and _config.yml
from .repository import (BRANCH, CHECKOUT_ROOT, DEFAULT_BRANCH, DEFAULT_REPO_URL, REPO_URL,  # noqa: F401
                         check_branch, check_repo_url, read_repository, repository_block)


def write_repository(config_path: str | Path, url: str | None = None, branch: str | None = None) -> bool:
    """Set ``repository.url`` / ``repository.branch`` in ``_config.yml`` in place, keeping every
    other line (and comment) as it is. Returns whether the file changed."""
    path = Path(config_path)
    text = path.read_text()
    lines = text.splitlines()
    start, end = repository_block(lines)
    wanted = {}
    if url is not None:
        wanted["url"] = check_repo_url(url)
    if branch is not None:
        wanted["branch"] = check_branch(branch)
    if not wanted:
        return False
    if start < 0:
        lines += ["", "repository:"] + [f"  {k}: {v}" for k, v in wanted.items()]
    else:
        seen = set()
        for i in range(start + 1, end):
            m = re.match(r"^(\s+)(url|branch):", lines[i])
            if m and m.group(2) in wanted:
                lines[i] = f"{m.group(1)}{m.group(2)}: {wanted[m.group(2)]}"
                seen.add(m.group(2))
        missing = [f"  {k}: {v}" for k, v in wanted.items() if k not in seen]
        lines[start + 1:start + 1] = missing
    new = "\n".join(lines) + "\n"
    if new == text:
        return False
    path.write_text(new)
    return True


# The set-up cell's first line; it marks the MyST pages of book/ that carry the cell (the errata),
# as opposed to pages that only compute some of their text (how_to_run shows the cell itself).
SETUP_MARKER = "# Colab / fresh machine: install flashtut if missing, then pick GPU or CPU"


def setup_cell(repo_url: str = DEFAULT_REPO_URL, branch: str = DEFAULT_BRANCH) -> str:
    """The text of the first code cell of every notebook, for a given repository and branch.

    ``import flashtut.notebook`` (not just ``import flashtut``) because the helpers module is not
    imported by the package itself. pip runs as ``sys.executable -m pip`` (the running kernel's
    Python, as ``%pip`` would) in a subprocess whose exit status the cell checks: when the install
    fails (no network, a wrong URL) the reader gets one line saying what failed, with pip's last
    line, and what to do, instead of pip's output, a restart note and two tracebacks.
    ``_render_traceback_`` is IPython's hook for an exception that prints itself.
    """
    url, branch = check_repo_url(repo_url), check_branch(branch)
    return (
        f"{SETUP_MARKER}\n"
        "try:\n"
        "    import flashtut.notebook\n"
        "except ImportError:\n"
        "    import subprocess\n"
        "    import sys\n"
        "\n"
        "    class SetupError(Exception):\n"
        "        def _render_traceback_(self):    # IPython: the message alone\n"
        "            return [f\"SetupError: {self}\"]\n"
        "\n"
        f'    PKG = "flashtut @ git+{url}@{branch}"\n'
        '    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q",\n'
        "                          PKG], capture_output=True, text=True)\n"
        "    if pip.returncode != 0:\n"
        '        why = (pip.stderr.strip().splitlines() or ["no message"])[-1]\n'
        "        raise SetupError(\n"
        '            f"pip could not install {PKG} ({why}). Check the network "\n'
        '            "connection and the URL, then run this cell again.") from None\n'
        "    import flashtut.notebook\n"
        "device = flashtut.notebook.pick_device()"
    )


SETUP_CELL = setup_cell(REPO_URL, BRANCH)


# --- rewriting notebooks -------------------------------------------------------------------------

def _is_setup_cell(source: str) -> bool:
    """Whether a cell is a (possibly stale) set-up cell that sync may overwrite."""
    return source.startswith(SETUP_MARKER) or ("pick_device(" in source and "pip install" in source)


def _read_notebook(path: Path):
    """``path`` as an nbformat v4 notebook, or a ValueError that says what is wrong with it."""
    import nbformat

    if not path.is_file():
        raise ValueError(f"{path} is not a notebook file (it is a directory or not a regular file)")
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds for a malformed file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path} is not a valid Jupyter notebook ({first[:200]})") from None
    if not isinstance(getattr(nb, "cells", None), list):
        raise ValueError(f"{path} is not a valid Jupyter notebook (no list of cells)")
    return nb


def _sync_ipynb(path: Path, cell_text: str) -> bool:
    import nbformat

    nb = _read_notebook(path)
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), None)
    if first is not None and nb.cells[first].source == cell_text:
        return False
    if first is not None and _is_setup_cell(nb.cells[first].source):
        nb.cells[first].source = cell_text
        nb.cells[first].outputs = []
        nb.cells[first].execution_count = None
    else:
        # the author's own first cell stays; the set-up cell goes in front of it
        at = first if first is not None else len(nb.cells)
        nb.cells.insert(at, nbformat.v4.new_code_cell(cell_text))
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return True


_CODE_CELL_RE = re.compile(r"^```\{code-cell\}[^\n]*\n(?:(?::[^\n]*\n)*)(.*?)^```[ \t]*$",
                           re.MULTILINE | re.DOTALL)


def _first_myst_cell(text: str):
    """The first ``{code-cell}`` of a MyST markdown notebook (a regex match whose group 1 is the
    cell's code), or None for a plain markdown page."""
    if not (text.startswith("---") and "jupytext:" in text.split("\n---", 1)[0]):
        return None
    return _CODE_CELL_RE.search(text)


def _carries_setup_cell(text: str) -> bool:
    m = _first_myst_cell(text)
    return m is not None and _is_setup_cell(m.group(1))


def _sync_myst(path: Path, cell_text: str) -> bool:
    text = path.read_text()
    m = _first_myst_cell(text)
    if m is None:
        return False
    new = text[:m.start(1)] + cell_text + "\n" + text[m.end(1):]
    if new == text:
        return False
    path.write_text(new)
    return True


def notebook_paths(root: str | Path) -> list[Path]:
    """Every chapter notebook (``notebooks/*.ipynb``) and every MyST markdown notebook under
    ``book/`` whose first code cell is the set-up cell."""
    root = Path(root)
    paths = sorted((root / "notebooks").glob("*.ipynb"))
    for p in sorted((root / "book").glob("*.md")):
        if not p.is_file():
            raise ValueError(f"{p} is not a file (a directory named like a page?)")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{p}: cannot read it ({exc})") from None
        if _carries_setup_cell(text):
            paths.append(p)
    return paths


def sync(root: str | Path = CHECKOUT_ROOT, repo: str | None = None, branch: str | None = None) -> list[Path]:
    """Write the set-up cell into the first code cell of every notebook under ``root``, with the
    repository read from ``root/_config.yml`` (after setting it there when ``repo``/``branch`` are
    given). Returns the files that changed; a second run changes nothing."""
    root = Path(root)
    config = root / "_config.yml"
    if not config.is_file():
        raise FileNotFoundError(f"root: {root} has no _config.yml; run from the repository root or pass --root")
    changed = []
    if write_repository(config, url=repo, branch=branch):
        changed.append(config)
    cell = setup_cell(*read_repository(config))
    for path in notebook_paths(root):
        done = _sync_ipynb(path, cell) if path.suffix == ".ipynb" else _sync_myst(path, cell)
        if done:
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashtut.colab",
        description="Keep the first (Colab set-up) cell of every notebook in step with the "
                    "repository URL in _config.yml.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_sync = sub.add_parser("sync", help="rewrite the first code cell of every notebook")
    p_sync.add_argument("--repo", help="set repository.url in _config.yml first (for a fork)")
    p_sync.add_argument("--branch", help="set repository.branch in _config.yml first")
    p_sync.add_argument("--root", default=None,
                        help="the book root (default: the current directory if it has _config.yml, "
                             "else this checkout)")
    sub.add_parser("show", help="print the set-up cell for this checkout")
    args = parser.parse_args(argv)

    if args.command == "show":
        print(SETUP_CELL)
        return 0
    root = Path(args.root) if args.root else (Path.cwd() if (Path.cwd() / "_config.yml").is_file()
                                              else CHECKOUT_ROOT)
    try:
        changed = sync(root, repo=args.repo, branch=args.branch)
    except (ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    url, branch = read_repository(root / "_config.yml")
    print(f"repository: {url} (branch {branch})")
    if changed:
        for path in changed:
            print(f"updated {path.relative_to(root) if path.is_relative_to(root) else path}")
    else:
        print("everything already in sync")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

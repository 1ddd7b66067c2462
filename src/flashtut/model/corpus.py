"""The training text: the book's own prose, read from the checkout this package came from.

Documents are the Markdown pages of ``book/`` and the Markdown cells of the chapters in
``notebooks/`` (code cells are left out: the model learns English about attention, not Python).
Nothing is downloaded. A ``pip install`` without the repository has no ``book/`` folder; then the
corpus is the docstrings of ``flashtut``'s own modules, which every installation has, and
:attr:`Corpus.source` says which one was read.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .tokenizer import ByteTokenizer


@dataclass(frozen=True)
class Corpus:
    """``documents``: ``(name, text)`` pairs in a fixed order; ``source``: where they were read."""
    documents: tuple
    source: str

    @property
    def text(self) -> str:
        return "\n\n".join(text for _, text in self.documents)

    def tokens(self, tokenizer=None) -> torch.Tensor:
        """The whole corpus as one int64 tensor of token ids (bytes by default)."""
        return (tokenizer or ByteTokenizer()).encode(self.text)

    def paragraphs(self, min_chars: int = 1) -> list[str]:
        """The corpus cut at blank lines: natural documents of very different lengths, for
        packed and padded batches."""
        return [p.strip() for _, text in self.documents for p in text.split("\n\n") if len(p.strip()) >= min_chars]


def find_book_root(start=None) -> Path | None:
    """The repository root (a folder with ``_toc.yml``, ``book/`` and ``notebooks/``): above this
    file in a source checkout, else ``start`` (default: the working directory) or a parent of it."""
    def is_root(p: Path) -> bool:
        return (p / "_toc.yml").is_file() and (p / "book").is_dir() and (p / "notebooks").is_dir()

    here = Path(__file__).resolve()
    cwd = Path(start).resolve() if start is not None else Path.cwd()
    for p in (*here.parents, cwd, *cwd.parents):
        if is_root(p):
            return p
    return None


def _notebook_markdown(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    return "\n\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                       for c in cells if c.get("cell_type") == "markdown")


def book_documents(root) -> tuple:
    """``(name, text)`` of every ``book/*.md`` page and every ``notebooks/*.ipynb`` chapter's
    Markdown, sorted by path."""
    root = Path(root)
    docs = [(p.relative_to(root).as_posix(), p.read_text(encoding="utf-8")) for p in sorted((root / "book").glob("*.md"))]
    docs += [(p.relative_to(root).as_posix(), _notebook_markdown(p)) for p in sorted((root / "notebooks").glob("*.ipynb"))]
    return tuple((name, text) for name, text in docs if text.strip())


def package_documents() -> tuple:
    """``(module, docstring)`` of every module, class and function of the installed ``flashtut``."""
    package = Path(__file__).resolve().parents[1]
    docs = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = [tree, *(n for n in ast.walk(tree)
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
        text = "\n\n".join(d for d in (ast.get_docstring(n) for n in nodes) if d)
        if text:
            docs.append((path.relative_to(package.parent).as_posix(), text))
    return tuple(docs)


def load_corpus(root=None) -> Corpus:
    """The book's prose from ``root`` (default: :func:`find_book_root`), or the package's docstrings
    when there is no checkout. ``root`` given but not a checkout: ``ValueError``."""
    if root is not None:
        root = Path(root)
        if not ((root / "book").is_dir() and (root / "notebooks").is_dir()):
            raise ValueError(f"root must be the repository root (with book/ and notebooks/), got {root}")
    else:
        root = find_book_root()
    if root is None:
        return Corpus(package_documents(), "docstrings of the installed flashtut (no book checkout found)")
    return Corpus(book_documents(root), f"the book's prose: {root.name}/book/*.md and the notebooks' Markdown")


__all__ = ["Corpus", "load_corpus", "find_book_root", "book_documents", "package_documents"]

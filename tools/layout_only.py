"""Check that edits to Python files changed layout only: same code, same docstring and comment words.

    python tools/layout_only.py [REV] [FILE ...]

For each file (default: the ``.py`` files that differ from ``REV``, default ``HEAD``) it compares the
old (at ``REV``) and the new (working tree) module three ways:

* ``ast.dump`` with the docstrings removed (the first string-constant statement of every module,
  class and function body): the code itself, whatever its line breaks, must be identical;
* the docstrings, whitespace collapsed: rewrapped text may move, not change;
* the words of all comments, in order: a comment may be rewrapped or moved onto its own line, not
  reworded.

Exits 1 when any file differs in any of them.
"""
from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize

DEFS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _split_docstrings(tree: ast.AST) -> list[str]:
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, DEFS) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docs.append(" ".join(first.value.value.split()))
                node.body = node.body[1:]
    return docs


def _comment_words(text: str) -> list[str]:
    words = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            words.extend(tok.string.lstrip("#").split())
    return words


def compare(old: str, new: str) -> list[str]:
    problems = []
    old_tree, new_tree = ast.parse(old), ast.parse(new)
    if _split_docstrings(old_tree) != _split_docstrings(new_tree):
        problems.append("docstring text differs")
    if ast.dump(old_tree) != ast.dump(new_tree):
        problems.append("code (AST without docstrings) differs")
    if _comment_words(old) != _comment_words(new):
        problems.append("comment words differ")
    return problems


def main(argv: list[str]) -> int:
    rev = "HEAD"
    if argv and not argv[0].endswith(".py"):
        rev, argv = argv[0], argv[1:]
    files = argv or subprocess.run(["git", "diff", "--name-only", rev, "--", "*.py"],
                                   check=True, capture_output=True, text=True).stdout.split()
    bad = 0
    for path in files:
        old = subprocess.run(["git", "show", f"{rev}:{path}"], check=True,
                             capture_output=True, text=True).stdout
        with open(path) as f:
            new = f.read()
        problems = compare(old, new)
        print(f"{path}: {'; '.join(problems) if problems else 'layout only (AST identical)'}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

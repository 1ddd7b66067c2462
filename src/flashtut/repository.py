"""The book's repository: its URL and branch, read from ``repository:`` of the book's ``_config.yml``.

One place names the repository: ``_config.yml`` (the launch buttons read it there). This module reads
it for the package (``flashtut.colab`` writes it into the notebooks' set-up cell; the worklogs link to
files of the repository through :func:`file_url`)::

    from flashtut import repository
    repository.REPO_URL, repository.BRANCH          # from _config.yml, else the defaults below
    repository.file_url("experiments/hopper_options/LOG.md")

An installed copy (site-packages) has no ``_config.yml`` beside it and uses the defaults.
"""
from __future__ import annotations

import re
from pathlib import Path

DEFAULT_REPO_URL = "https://github.com/flashtut/flash-attention-from-scratch"
DEFAULT_BRANCH = "main"

#: the root of the checkout this module sits in (src/flashtut/repository.py): the book's root
CHECKOUT_ROOT = Path(__file__).resolve().parents[2]

_URL_RE = re.compile(r"^https://[A-Za-z0-9.-]+(?::[0-9]+)?(/[A-Za-z0-9._~%/-]*)?$")
_BRANCH_RE = re.compile(r"^[A-Za-z0-9._/-]+$")
_PATH_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")


def check_repo_url(url) -> str:
    """``url`` as an https repository URL without a trailing ``/`` or ``.git``; TypeError or
    ValueError naming ``repo`` otherwise."""
    if not isinstance(url, str):
        raise TypeError(f"repo: expected a str URL, got {type(url).__name__}")
    url = url.strip().rstrip("/")
    if url.endswith(".git"):
        url = url[:-4]
    if not _URL_RE.match(url):
        raise ValueError(f"repo: got {url!r}; accepted: an https:// repository URL without spaces, "
                         "quotes or query, e.g. https://github.com/you/flash-attention-from-scratch")
    return url


def check_branch(branch) -> str:
    """``branch`` if it is a plausible git branch name; TypeError or ValueError naming it otherwise."""
    if not isinstance(branch, str):
        raise TypeError(f"branch: expected a str, got {type(branch).__name__}")
    if not _BRANCH_RE.match(branch) or ".." in branch or branch.startswith(("-", "/")):
        raise ValueError(f"branch: got {branch!r}; accepted: a git branch name such as 'main'")
    return branch


def repository_block(lines: list[str]) -> tuple[int, int]:
    """Line span [start, end) of the top-level ``repository:`` mapping of a YAML file, start
    pointing at the ``repository:`` line itself; (-1, -1) when there is none."""
    for i, line in enumerate(lines):
        if re.match(r"^repository:\s*(#.*)?$", line):
            end = i + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
                end += 1
            return i, end
    return -1, -1


def _unquote(value: str) -> str:
    value = re.sub(r"\s+#.*$", "", value.strip())
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return value


def read_repository(config_path: str | Path) -> tuple[str, str]:
    """``(url, branch)`` from the ``repository:`` section of a Jupyter Book ``_config.yml``.

    A line-based reader, so that ``flashtut`` needs no YAML library on a reader's machine; it
    understands the block mapping that ``_config.yml`` uses (``url:`` and ``branch:`` keys).
    """
    lines = Path(config_path).read_text().splitlines()
    start, end = repository_block(lines)
    url, branch = DEFAULT_REPO_URL, DEFAULT_BRANCH
    if start < 0:
        return url, branch
    for line in lines[start + 1:end]:
        m = re.match(r"^\s+(url|branch):\s*(.*)$", line)
        if m and _unquote(m.group(2)):
            if m.group(1) == "url":
                url = check_repo_url(_unquote(m.group(2)))
            else:
                branch = check_branch(_unquote(m.group(2)))
    return url, branch


def _default_repository() -> tuple[str, str]:
    config = CHECKOUT_ROOT / "_config.yml"
    if config.is_file():
        try:
            return read_repository(config)
        except (OSError, ValueError):
            pass
    return DEFAULT_REPO_URL, DEFAULT_BRANCH


REPO_URL, BRANCH = _default_repository()


def file_url(path: str, repo_url: str | None = None, branch: str | None = None) -> str:
    """The web page of a file of the repository (``path`` relative to its root), for links from the
    book to files outside it, such as an experiment's log. GitHub, GitLab, Gitea and Forgejo all serve
    ``<repo>/blob/<branch>/<path>``."""
    if not isinstance(path, str):
        raise TypeError(f"path: expected a str, got {type(path).__name__}")
    if not _PATH_RE.match(path) or ".." in path.split("/"):
        raise ValueError(f"path: got {path!r}; accepted: a file's path relative to the repository root, "
                         "such as 'experiments/hopper_options/LOG.md'")
    url = check_repo_url(repo_url if repo_url is not None else REPO_URL)
    return f"{url}/blob/{check_branch(branch if branch is not None else BRANCH)}/{path}"


__all__ = ["DEFAULT_REPO_URL", "DEFAULT_BRANCH", "CHECKOUT_ROOT", "REPO_URL", "BRANCH", "check_repo_url",
           "check_branch", "repository_block", "read_repository", "file_url"]

"""The committed measurements the chapters draw: find them, load them, say where they came from.

A chapter without a GPU draws its figures from JSON files measured once on a GPU and committed with
their provenance (device, versions, date, the command that measured them, what they hold).
They live in the repository's ``book/data`` and ship inside the package as ``flashtut/data`` (package
data), so a notebook opened alone, in Colab, draws the same figures. This module is how every chapter
gets at them::

    from flashtut import results_data
    rows, provenance = results_data.load_results("bench_h200*.json")   # every matching file
    for p in provenance:
        print(results_data.describe(p))                               # device, versions, command

Where a name is looked up: ``data_dir=`` when given (a reader's own run, a test's temporary folder,
an experiment's ``data/``), else ``$FLASHTUT_DATA`` when set, else the package's own data
(``importlib.resources``). A file that is not there raises :class:`ResultsMissing` (a
``FileNotFoundError``) whose message names the file and the folder; ``missing="print"`` prints that
message and returns empty lists instead, so a notebook cell can go on without the data.

``book/data/README.md`` lists the files, one line each, generated from their own provenance by
``python -m flashtut.results_data --manifest``.
"""
from __future__ import annotations

import json
import os
import re
import textwrap
from importlib import resources
from pathlib import Path

import torch

from .bench import results as _results
from .bench.roofline import ceilings_from_rows, measure_roofline
from .repository import BRANCH, REPO_URL  # noqa: F401  (re-exported: where the data came from)

DATA_ENV = "FLASHTUT_DATA"
#: the folder of the committed results, relative to the repository root
REPO_DATA_DIR = "book/data"

_GLOB_CHARS = re.compile(r"[*?\[]")
_NAME_RE = re.compile(r"^[A-Za-z0-9._*?\[\]-]+$")


class ResultsMissing(FileNotFoundError):
    """A committed results file is not where it was looked for. ``name`` is the file (or
    pattern) asked for, ``where`` the folder looked in."""

    def __init__(self, name: str, where: str):
        self.name, self.where = name, where
        super().__init__(f"{name}: not found in {where}. The committed measurements are listed, with "
                         f"the command that made each, in {REPO_DATA_DIR}/README.md of the repository.")


# --- where ----------------------------------------------------------------------------------------

def _check_name(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name: expected a file name or pattern (str), got {type(name).__name__}")
    if not _NAME_RE.match(name):
        raise ValueError(f"name: got {name!r}; accepted: a file name of {REPO_DATA_DIR} such as "
                         "'memory_h200.json', or a pattern such as 'bench_h200*.json' (no folders)")
    return name


def package_data_dir() -> Path | None:
    """The measurements shipped inside the package (``flashtut/data``), or None if absent. In a
    checkout, ``src/flashtut/data`` is a link to ``book/data``: one copy, two ways in."""
    try:
        folder = Path(str(resources.files("flashtut") / "data"))
    except (ModuleNotFoundError, TypeError):
        return None
    return folder if folder.is_dir() else None


def local_data_dir() -> Path | None:
    """The folder of committed results this session reads: ``$FLASHTUT_DATA`` when set (it must then
    be a folder), else the package's own data; None if neither exists."""
    env = os.environ.get(DATA_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise ValueError(f"${DATA_ENV}: got {env!r}, which is not a folder; accepted: the path of "
                             f"a folder of results files (such as a checkout's {REPO_DATA_DIR}), or unset")
        return path
    return package_data_dir()


def _folder(data_dir) -> Path:
    if data_dir is None:
        found = local_data_dir()
        if found is None:
            raise ResultsMissing("the committed results", "this installation, which ships no flashtut/data "
                                 f"folder; reinstall flashtut, or set ${DATA_ENV} to a checkout's {REPO_DATA_DIR}")
        return found
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ValueError(f"data_dir: got {str(data_dir)!r}, which is not a folder; accepted: a folder "
                         "of results files, or None for the book's own")
    return path


def find(pattern: str, data_dir=None) -> list[Path]:
    """The committed files (or those of ``data_dir``) whose names match ``pattern``, sorted by name.
    Raises :class:`ResultsMissing` if none."""
    _check_name(pattern)
    folder = _folder(data_dir)
    paths = sorted(p for p in folder.glob(pattern) if p.is_file()) if _GLOB_CHARS.search(pattern) \
        else [p for p in (folder / pattern,) if p.is_file()]
    if not paths:
        raise ResultsMissing(pattern, str(folder))
    return paths


def data_path(name: str, data_dir=None) -> Path:
    """The path of one committed file (``book/data/<name>`` in the repository). Raises
    :class:`ResultsMissing`."""
    _check_name(name)
    if _GLOB_CHARS.search(name):
        raise ValueError(f"name: got the pattern {name!r}; data_path takes one file name "
                         "(find() and load_results() take patterns)")
    return find(name, data_dir)[0]


# --- what -----------------------------------------------------------------------------------------

def load_results(pattern_or_name: str, data_dir=None, missing: str = "raise") -> tuple[list[dict], list[dict]]:
    """Rows and provenance of every committed file matching ``pattern_or_name``.

    Returns ``(rows, provenance_list)``. Rows are in ``flashtut.bench``'s layout (so
    ``flashtut.figures.bench_plots`` draws them), each tagged with ``source`` (its file's name) and
    ``device`` (the GPU's name from the file's provenance, else the file's stem). When several
    files measure the same thing, the one with the latest provenance date wins. Each provenance
    entry is the file's ``provenance`` block plus ``file``, ``path``, ``kind``, ``config`` and
    ``rows`` (how many rows it gave). ``missing``: ``"raise"`` raises :class:`ResultsMissing`,
    ``"print"`` prints its message and returns ``([], [])``.
    """
    if missing not in ("raise", "print"):
        raise ValueError(f"missing: got {missing!r}; accepted: 'raise' or 'print'")
    try:
        paths = find(pattern_or_name, data_dir)
    except ResultsMissing as exc:
        if missing == "raise":
            raise
        print(exc)
        return [], []
    docs = []
    for path in paths:
        doc = _results.load_results(path)
        prov = dict(doc.get("provenance") or {})
        docs.append((str(prov.get("date") or ""), path, doc, prov))
    tagged, provenance = [], []
    for date, path, doc, prov in docs:
        device = (prov.get("device") or {}).get("name") if isinstance(prov.get("device"), dict) else prov.get("device")
        rows = [dict(r, source=path.name) for r in doc["rows"]]
        for r in rows:
            r.setdefault("device", device or path.stem)
        tagged.append((date, path.name, rows))
        provenance.append(dict(prov, file=path.name, path=str(path), kind=doc.get("kind"),
                               config=doc.get("config") or {}, rows=len(doc["rows"])))
    provenance.sort(key=lambda p: (str(p.get("date") or ""), p["file"]))
    return _results.merge_latest(tagged), provenance


_MACHINE_DIR = re.compile(r"(?:/root/out|/tmp/tmp[\w.-]*|/tmp)/(?=[^\s/])")


def public_command(command: str) -> str:
    """``command`` as a reader can run it: the folders of the machine that measured (``/root/out/``,
    a ``/tmp/tmp...`` directory) dropped, so that ``--out /root/out/x.json`` reads ``--out x.json``."""
    if not isinstance(command, str):
        raise TypeError(f"command must be a str, got {type(command).__name__}")
    return _MACHINE_DIR.sub("", command)


def describe(prov: dict, width: int = 90) -> str:
    """A few lines a reader can check a number against: file, device, versions, date, command
    (every line wrapped at ``width`` characters, so that a notebook's output box does not scroll
    sideways; a command breaks only at spaces)."""
    dev = prov.get("device")
    if isinstance(dev, dict):
        device = dev.get("name") or "?"
        if dev.get("compute_capability"):
            device += f" (compute capability {dev['compute_capability']})"
    else:
        device = dev or "device not recorded"
    versions = prov.get("versions") or {}
    vtext = ", ".join(f"{k} {v}" for k, v in versions.items() if v and k in
                      ("torch", "cuda", "cudnn", "triton", "cupy", "python", "flashtut"))
    git = prov.get("git") or {}
    wrap = lambda text: textwrap.fill(text, width, subsequent_indent="    ",  # noqa: E731
                                      break_long_words=False, break_on_hyphens=False)
    lines = [wrap(f"{prov.get('file', '?')} ({prov.get('kind') or 'results'}, {prov.get('rows', '?')} rows): "
                  f"{device}")]
    if prov.get("provisional"):
        lines.append(wrap("  PROVISIONAL: reference figures, not a measurement of this project; "
                          + (prov.get("note") or "to be replaced by a measured run")))
    if prov.get("what"):
        lines.append(wrap(f"  what: {prov['what']}"))
    if vtext:
        lines.append(wrap(f"  versions: {vtext}"))
    if prov.get("date"):
        lines.append(f"  measured: {prov['date']}")
    if prov.get("command") or prov.get("call"):
        lines.append(wrap(f"  command: {public_command(prov.get('command') or prov.get('call'))}"))
    if git.get("commit"):
        lines.append(f"  git commit: {git['commit'][:12]}")
    return "\n".join(lines)


def provenance_rows(provs: list[dict]) -> tuple[list[str], list[list[str]], list[str]]:
    """The provenance of several files as ``(header, body, commands)``: a table with one row per
    file (what :func:`describe` says, in cells that a narrow screen can wrap;
    ``flashtut.notebook.show_provenance`` renders it) and, apart, the command that measured each
    file. A command in a table cell either widens the table past the page or, wrapped, squeezes
    its column to a word a line, so it goes under the table, where it wraps like a sentence."""
    header = ["file", "device", "measured (UTC)", "software"]
    body, commands = [], []
    for prov in provs:
        dev = prov.get("device")
        device = (dev.get("name") or "?") if isinstance(dev, dict) else (dev or "not recorded")
        versions = prov.get("versions") or {}
        software = ", ".join(f"{k} {v}" for k, v in versions.items()
                             if v and k in ("torch", "cuda", "triton", "cupy"))
        command = public_command(prov.get("command") or prov.get("call") or "")
        name = prov.get("file", "?")
        what = [f"`{name}` ({prov.get('kind') or 'results'}, {prov.get('rows', '?')} rows)"]
        if prov.get("provisional"):
            what.append("provisional: reference figures, not a measurement of this project")
        if prov.get("what"):
            what.append(str(prov["what"]))
        body.append(["; ".join(what), device, str(prov.get("date") or "?")[:16].replace("T", " "),
                     software or "-"])
        commands.append(f"`{name}`: `{command}`" if command else f"`{name}`: no command recorded")
    return header, body, commands


# --- chapter 01's roofline ---------------------------------------------------------------------

def data_dir() -> Path:
    """The folder of the committed results (``$FLASHTUT_DATA`` if set), as :func:`local_data_dir`
    finds it; :class:`ResultsMissing` (a ``FileNotFoundError``) when there is none."""
    return _folder(None)


def load_roofline_data(path=None) -> dict:
    """The committed copy bandwidth and matrix rates (``book/data/h200_roofline.json``, written by
    ``python -m flashtut.bench roofline``), in the layout of
    :func:`flashtut.bench.roofline.ceilings_from_rows`, with the file's ``provenance`` (device,
    versions, date, command) under ``provenance["measured"]``."""
    path = Path(path) if path is not None else data_path("h200_roofline.json")
    doc = _results.load_results(path)
    if doc.get("kind") != "roofline":
        raise ValueError(f"{path}: holds {doc.get('kind')!r} results; accepted: the output of "
                         "`python -m flashtut.bench roofline`")
    prov = doc.get("provenance") or {}
    name = (prov.get("device") or {}).get("name", "unknown GPU")
    note = f"measured on {prov.get('date', '?')} with `{prov.get('command', '?')}`"
    out = ceilings_from_rows(doc["rows"], name, note)
    out["provenance"]["measured"] = prov
    return out


def roofline_data(device=None) -> dict:
    """Measure the reader's GPU when there is one, else load the committed H200 figures."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        return measure_roofline(device)
    return load_roofline_data()


# --- the README's results table ------------------------------------------------------------------

#: the README's results table: (label, implementation, committed files it is read from); one run of the
#: code as it ships, every row and its baseline timed in one process
HEADLINE_SOURCES = (
    ("`flashtut.triton_attention` (chapter 7)", "triton", "cuda_protocol_h100.json"),
    ("`flashtut.cuda_attention` (chapters 8 and 11)", "cuda", "cuda_protocol_h100.json"),
    ("PyTorch SDPA, cuDNN backend (for scale)", "sdpa-cudnn", "cuda_protocol_h100.json"),
)


def headline_table(data_dir=None) -> str:
    """The README's results table, regenerated from the committed data (:data:`HEADLINE_SOURCES`): ratios
    to SDPA flash at D = 128, N = 16384 (``flashtut.bench.report.headline_table``)."""
    from .bench.report import headline_table as _table

    return _table([(label, impl, load_results(pattern, data_dir)[0])
                   for label, impl, pattern in HEADLINE_SOURCES])


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "/")


def catalog(folder=None) -> list[dict]:
    """One entry per committed file (or per file of ``folder``), from the file's own provenance:
    ``file``, ``what`` (what it holds), ``device``, ``date`` and ``command`` (the one that measures
    it again: ``rerun`` where the recorded command no longer runs as written, else the recorded
    one with its output path in ``book/data``), sorted by name."""
    folder = _folder(folder)
    out = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        prov = doc.get("provenance") or {}
        dev = prov.get("device")
        command = prov.get("rerun")
        if not command:
            command = prov.get("command") or prov.get("call") or None
            if command and "--out" in command:
                command = re.sub(r"--out \S+", f"--out {REPO_DATA_DIR}/{path.name}", command)
        out.append({"file": path.name, "what": prov.get("summary") or prov.get("what") or doc.get("kind") or "?",
                    "device": (dev.get("name") or "?") if isinstance(dev, dict) else (dev or "?"),
                    "date": str(prov.get("date") or "?")[:10], "command": command})
    return out


def commands(folder=None) -> list[tuple[str, str, str | None]]:
    """``(file, what it holds, command)`` for each committed file, as :func:`catalog` has them."""
    return [(e["file"], e["what"], e["command"]) for e in catalog(folder)]


def manifest(folder=None) -> str:
    """``book/data/README.md``: one line per committed file, from :func:`catalog` (the file's own
    provenance)."""
    lines = ["# The committed measurements", "",
             "Generated from each file's own provenance by `python -m flashtut.results_data --manifest > "
             f"{REPO_DATA_DIR}/README.md` (a test keeps it current). The chapters read these files through "
             "`flashtut.results_data`, which finds them inside the installed package (`flashtut/data`, a "
             "link to this folder in a checkout). Data that only an experiment reads lives in "
             "`experiments/<study>/data/`.", "",
             "| file | what it holds | device, date | command |", "| --- | --- | --- | --- |"]
    for e in catalog(folder):
        lines.append(f"| `{e['file']}` | {_one_line(e['what'])} | {e['device']}, {e['date']} | "
                     f"`{_one_line(e['command'] or 'none recorded')}` |")
    return "\n".join(lines) + "\n"


def _main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m flashtut.results_data",
                                 description="List the committed measurements (book/data/README.md).")
    ap.add_argument("--manifest", action="store_true", required=True,
                    help="print book/data/README.md, generated from the files' provenance")
    ap.add_argument("--data-dir", default=None, help="a folder of results files (default: the book's)")
    a = ap.parse_args(argv)
    if a.data_dir is not None and not Path(a.data_dir).is_dir():
        ap.error(f"--data-dir: {a.data_dir} is not a folder")
    print(manifest(a.data_dir), end="")
    return 0


__all__ = ["DATA_ENV", "ResultsMissing", "load_results", "data_path", "find", "describe", "provenance_rows",
           "local_data_dir", "package_data_dir", "data_dir", "load_roofline_data", "roofline_data",
           "catalog", "commands", "manifest", "REPO_URL", "BRANCH", "HEADLINE_SOURCES",
           "headline_table"]


if __name__ == "__main__":
    raise SystemExit(_main())

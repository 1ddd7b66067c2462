"""Small helpers the chapters call: pick the device, show library source, note what needs a GPU."""
from __future__ import annotations

import html
import inspect
from pathlib import Path

import torch


def pick_device(verbose: bool = True) -> torch.device:
    """The GPU when there is one, else the CPU; says which and what that means for the chapter."""
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        if verbose:
            major, minor = torch.cuda.get_device_capability()
            print(f"Using {torch.cuda.get_device_name()} (sm_{major}{minor}).")
    else:
        dev = torch.device("cpu")
        if verbose:
            # two lines: one would be wider than a code box on the page
            print("No CUDA GPU found: running on the CPU at small sizes.")
            print("GPU-only cells say so and show the committed H200 results instead.")
    return dev


def has_gpu() -> bool:
    return torch.cuda.is_available()


def source_of(obj) -> str:
    """The source text of a function, class or module of the library."""
    return inspect.getsource(obj)


def _collapse(code, summary: str | None):
    """``code`` as it is, or folded into an HTML ``<details>`` under ``summary``: a long listing
    stays one click away, in the book and in Colab alike (a MyST dropdown shows raw in Colab)."""
    if summary is None:
        return code
    from html import escape

    from IPython.display import HTML

    return HTML(f"<details><summary>{escape(summary)}</summary>\n{code._repr_html_()}\n</details>")


def show_source(obj, language: str = "python", collapsed: str | None = None):
    """Display the library's own source of ``obj`` (a function, class or module) highlighted, so
    the page shows the code that runs rather than a copy that could drift; with ``collapsed``, folded
    under that summary line."""
    from IPython.display import Code

    return _collapse(Code(source_of(obj), language=language), collapsed)


def show_file(path, language: str | None = None, start: int | str | None = None, end: int | str | None = None,
              collapsed: str | None = None):
    """Display a file shipped in the package (for example a ``.cu`` kernel), optionally lines
    ``start``..``end`` (1-based, inclusive; a string stands for the first line that contains it, ``end``
    searched from ``start`` on, so a section stays shown as the file changes around it); with
    ``collapsed``, folded under that summary line."""
    from IPython.display import Code

    p = Path(path)
    if not p.is_absolute():
        p = Path(__file__).parent / p
    text = p.read_text()
    if start is not None or end is not None:
        lines = text.splitlines()
        start, end = _line_of(lines, start, 1, "start"), _line_of(lines, end, _line_of(lines, start, 1, "start"), "end")
        text = "\n".join(lines[(start or 1) - 1:end])
    if language is None:
        language = {".cu": "cuda", ".cuh": "cuda", ".py": "python"}.get(p.suffix, "text")
    return _collapse(Code(text, language=language), collapsed)


def _line_of(lines, mark, first: int, name: str):
    """``mark`` as a 1-based line number: an int as it is, a string the first line from ``first`` on that
    contains it (ValueError naming ``name`` when none does)."""
    if mark is None or isinstance(mark, int):
        return mark
    for i in range((first or 1) - 1, len(lines)):
        if mark in lines[i]:
            return i + 1
    raise ValueError(f"{name}: no line contains {mark!r}")


def collapsed(obj, summary: str):
    """Display ``obj`` (for example what ``show_file`` returns) folded under a one-line
    ``summary`` that opens on a click: an HTML ``<details>`` element, which the book and Colab
    both render (a long kernel listing then does not push the text apart)."""
    from IPython.display import HTML

    body = obj._repr_html_() if hasattr(obj, "_repr_html_") else f"<pre>{html.escape(str(obj))}</pre>"
    return HTML(f"<details>\n<summary>{html.escape(summary)}</summary>\n\n{body}\n</details>")


def show_table(header, body):
    """Display a computed table as a Markdown table: on a narrow screen it wraps its cells
    instead of scrolling sideways as printed text does. Cells are formatted with ``str``."""
    from IPython.display import Markdown

    from .bench.report import format_table

    cells = [[str(c).replace("|", "\\|") for c in row] for row in body]
    return Markdown(format_table([str(h) for h in header], cells, markdown=True))


def measured_caption(rows, text: str = ""):
    """The one caption line under a measured figure or table: ``text`` then "Measured on an
    NVIDIA H200; data: `file.json`." with the GPU and the files taken from ``rows`` (as
    ``results_data.load_results`` tags them: ``device`` and ``source``). Returns Markdown."""
    from IPython.display import Markdown

    rows = list(rows)
    if not rows:
        raise ValueError("rows: got none; the caption names the GPU and files the rows came from")
    devices = sorted({str(r.get("device") or "an unrecorded GPU") for r in rows})
    files = sorted({str(r["source"]) for r in rows if r.get("source")})
    gpu = " and ".join(("an " if d.upper().startswith(("NVIDIA", "A", "H")) else "a ") + d for d in devices)
    data = ", ".join(f"`{f}`" for f in files) or "not recorded"
    return Markdown(f"*{text.strip() + ' ' if text.strip() else ''}Measured on {gpu}; data: {data}.*")


def show_provenance(provs):
    """Display the provenance of loaded results files (``results_data.load_results``) as one
    Markdown table, a row per file, and under it the command that measured each file."""
    from IPython.display import Markdown

    from .results_data import provenance_rows

    header, body, commands = provenance_rows(provs)
    listed = "\n".join(f"* {c}" for c in commands)
    return Markdown(f"{show_table(header, body).data}\n\nMeasured with:\n\n{listed}")

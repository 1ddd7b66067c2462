"""Text tables of results: what the CLI prints at the end and what a notebook can show."""
from __future__ import annotations

import math
import re
from collections import defaultdict

IMPL_ORDER = ["naive", "tiled", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn", "triton", "cuda"]


def ladder_key(name: str):
    """Sort key of a CUDA ladder step's name: ``cuda-v2`` before ``cuda-v10``."""
    m = re.match(r"cuda-v(\d+)(.*)", name)
    return (int(m.group(1)), m.group(2)) if m else (10**6, name)


def impl_order(names) -> list[str]:
    """Reference implementations first, then PyTorch's, then ours, then the ladder in order."""
    names = list(dict.fromkeys(names))
    known = [n for n in IMPL_ORDER if n in names]
    ladder = sorted((n for n in names if n.startswith("cuda-v")), key=ladder_key)
    rest = sorted(n for n in names if n not in known and n not in ladder)
    return known + ladder + rest


SPEED_KEY = ("mode", "dtype", "B", "H", "Nq", "Nk", "D", "causal")


def _fmt(x, spec: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return format(x, spec or ".3g")
    return str(x)


def format_table(header: list[str], body: list[list[str]], markdown: bool = False, left=(0,)) -> str:
    """Columns padded to their widest cell (right-aligned but for ``left``), or Markdown."""
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    if markdown:
        line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
        sep = "| " + " | ".join("-" * w for w in widths) + " |"
        return "\n".join([line(header), sep, *(line(r) for r in body)])
    line = lambda cells: "  ".join(c.ljust(w) if i in left else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in body)])


def _worst_err(row) -> float | None:
    errs = [e for e in (row.get("err") or {}).values() if e is not None]
    return max(errs) if errs else None


def speed_table(rows: list[dict], baseline: str = "sdpa-flash", markdown: bool = False,
                show_unavailable: bool = False) -> str:
    """One line per speed row: time, TFLOP/s, ratio to ``baseline`` on the same case, the
    largest error, and the status (with the reason when not ``ok``). Rows of implementations
    that could not run are left out unless ``show_unavailable`` (``unavailable_notes`` lists
    them once each)."""
    base = {tuple(r.get(k) for k in SPEED_KEY): r["tflops"] for r in rows
            if r.get("impl") == baseline and r.get("tflops")}
    header = ["impl", "mode", "dtype", "B", "H", "Nq", "Nk", "D", "causal", "ms", "TFLOP/s",
              f"x {baseline}", "max err", "2x torch", "status"]
    if not base:                      # no baseline measured: no ratio column
        header.pop(11)
    body = []
    for r in rows:
        if r.get("status") == "unavailable" and not show_unavailable:
            continue
        b = base.get(tuple(r.get(k) for k in SPEED_KEY))
        ratio = r["tflops"] / b if b and r.get("tflops") else None
        status = r.get("status") or "-"
        if status != "ok" and r.get("reason"):
            status += ": " + r["reason"].splitlines()[0][:70]
        body.append([r["impl"], r["mode"], r["dtype"], _fmt(r["B"]), _fmt(r["H"]), _fmt(r["Nq"]),
                     _fmt(r["Nk"]), _fmt(r["D"]), _fmt(r["causal"]), _fmt(r.get("ms"), ".4g"),
                     _fmt(r.get("tflops"), ".3g")] + ([_fmt(ratio, ".2f")] if base else [])
                    + [_fmt(_worst_err(r), ".2e"), _fmt(r.get("fa_criterion")), status])
    return format_table(header, body, markdown, left=(0, 1, 2, len(header) - 1))


def notes(rows: list[dict]) -> list[str]:
    """One line per (implementation, status, reason) that is not ``ok``, with how many rows."""
    counts: dict = {}
    for r in rows:
        if r.get("status") not in (None, "ok", "skipped") and r.get("reason"):
            key = (r["impl"], r["status"], r["reason"])
            counts[key] = counts.get(key, 0) + 1
    return [f"{impl}: {status} ({n} row{'s' if n > 1 else ''}): {reason}"
            for (impl, status, reason), n in counts.items()]


def memory_table(rows: list[dict], markdown: bool = False) -> str:
    """Peak extra MiB per implementation (columns) and N (lines); OOM where it ran out."""
    impls = list(dict.fromkeys(r["impl"] + ("" if r.get("mode", "fwd") == "fwd" else " (fwd+bwd)")
                               for r in rows))
    cell = defaultdict(dict)
    for r in rows:
        name = r["impl"] + ("" if r.get("mode", "fwd") == "fwd" else " (fwd+bwd)")
        if r.get("status") == "ok":
            cell[r["N"]][name] = f"{r['peak_extra_bytes'] / 2**20:.1f}"
        else:
            cell[r["N"]][name] = {"oom": "OOM", "skipped": "(OOM)", "unavailable": "n/a"}.get(r.get("status"), "error")
    body = [[str(n)] + [cell[n].get(i, "-") for i in impls] for n in sorted(cell)]
    return format_table(["N \\ peak extra MiB"] + impls, body, markdown)


def roofline_table(rows: list[dict], markdown: bool = False) -> str:
    body = []
    for r in rows:
        if r.get("what") == "copy":
            body.append(["copy", "-", _fmt(r["bytes"] / 2**20, ".0f") + " MiB", _fmt(r["ms"], ".4g"),
                         _fmt(r["gb_per_s"], ".4g") + " GB/s", r.get("status", "ok")])
        elif r.get("what") == "matmul":
            st = r.get("status") or "-"
            if st != "ok" and r.get("reason"):
                st += ": " + r["reason"][:80]
            body.append(["matmul", r["dtype"], f"n={r['n']}", _fmt(r.get("ms"), ".4g"),
                         (_fmt(r.get("tflops"), ".4g") + " TFLOP/s") if r.get("tflops") else "-", st])
        elif r.get("what") == "instruction":
            st = r.get("status") or "-"
            if st != "ok" and r.get("reason"):
                st += ": " + r["reason"][:80]
            size = f"{r['grid']} x {r['threads']} threads" if r.get("grid") else "-"
            body.append([r["instruction"], r["dtype"], size, _fmt(r.get("ms"), ".4g"),
                         (_fmt(r.get("tflops"), ".4g") + " TFLOP/s") if r.get("tflops") else "-", st])
    return format_table(["what", "dtype", "size", "ms", "rate", "status"], body, markdown)


def ratio_table(rows: list[dict], baseline: str = "sdpa-flash") -> list[dict]:
    """For every case where ``baseline`` has a speed, each implementation's TFLOP/s over the
    baseline's: ``[{"mode", "dtype", "D", "N", "causal", ..., "ratios": {impl: ratio}}]``."""
    speed = [r for r in rows if r.get("kind", "speed") == "speed" and r.get("tflops")]
    groups = defaultdict(dict)
    for r in speed:             # ratios only within one device's results
        groups[(r.get("device"),) + tuple(r.get(k) for k in SPEED_KEY)][r["impl"]] = r["tflops"]
    out = []
    for key, by_impl in groups.items():
        b = by_impl.get(baseline)
        if not b:
            continue
        entry = dict(zip(("device",) + SPEED_KEY, key))
        entry["N"] = entry["Nq"]
        entry["baseline_tflops"] = b
        entry["ratios"] = {i: t / b for i, t in by_impl.items() if i != baseline}
        out.append(entry)
    out.sort(key=lambda e: (str(e["device"]), e["mode"], e["dtype"], e["D"], e["causal"], e["N"]))
    return out


def format_ratio_table(table: list[dict], baseline: str = "sdpa-flash", markdown: bool = True) -> str:
    """``ratio_table`` as text: one line per case, one column per implementation."""
    impls = impl_order(i for e in table for i in e["ratios"])
    devices = len({e.get("device") for e in table}) > 1
    header = (["device"] if devices else []) + ["mode", "dtype", "D", "N", "causal", f"{baseline} TFLOP/s"] \
        + [f"{i} / {baseline}" for i in impls]
    body = [([str(e.get("device"))] if devices else [])
            + [e["mode"], e["dtype"], str(e["D"]), str(e["N"]), _fmt(e["causal"]), f"{e['baseline_tflops']:.1f}"]
            + [_fmt(e["ratios"].get(i), ".2f") for i in impls] for e in table]
    return format_table(header, body, markdown)


#: the tables' short dtype names
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


#: the backward run as the book shows it (book/perflog_cuda_bwd.md, chapter 08), for
#: :func:`case_table`: header -> implementation, or {D: implementation}
BWD_GRID_COLUMNS = {
    # headers short enough for a phone: what each is, the text around the table says
    "separate dQ": "cuda-bwd-separate-dq",
    "old default": {128: "cuda-bwd-atomic-dq-w8-1bar-v4", 64: "cuda-bwd-atomic-dq-w8-1bar"},
    "grid": "cuda-bwd-atomic-dq-w8-split2x4",
    "grid, 128 q": "cuda-bwd-atomic-dq-w8-split2x4-m128",
}


def column_impl(column, D):
    """The implementation a column names at head dim ``D``: a name, or ``{D: name}``."""
    return column.get(D) if isinstance(column, dict) else column


def case_table(rows: list[dict], columns: dict, baseline: str = "sdpa-flash",
               mode: str = "bwd") -> tuple[list[str], list[list[str]]]:
    """One line per case (D, N, dtype, causal) of ``mode`` where ``baseline`` ran: the baseline's
    TFLOP/s, then per column "TFLOP/s (ratio to the baseline)" of the implementation it names:
    ``columns`` maps a header to a name, or to ``{D: name}`` where the column is a different
    implementation at each head dim (``-`` where it names none or did not run). D descending,
    then N, float16 before bfloat16, non-causal first. Returns (header, body) for
    :func:`format_table` or ``flashtut.notebook.show_table``."""
    tf = {(r["impl"], r["D"], r["N"], r["dtype"], r["causal"]): r["tflops"] for r in rows
          if r.get("kind", "speed") == "speed" and r.get("mode") == mode and r.get("tflops")}
    cases = sorted({k[1:] for k in tf if k[0] == baseline},
                   key=lambda c: (-c[0], c[1], c[2] != "float16", c[3]))
    body = []
    for D, N, dtype, causal in cases:
        b = tf[(baseline, D, N, dtype, causal)]
        cells = [str(D), str(N), SHORT_DTYPE.get(dtype, dtype), _fmt(causal), f"{b:.0f}"]
        for column in columns.values():
            t = tf.get((column_impl(column, D), D, N, dtype, causal))
            cells.append(f"{t:.0f} ({t / b:.2f})" if t else "-")
        body.append(cells)
    return ["D", "N", "dtype", "causal", f"{baseline} TFLOP/s"] + list(columns), body


def gains(rows: list[dict], column, base, mode: str = "fwd") -> dict:
    """How much faster ``column`` ran than ``base`` (each a name, or ``{D: name}`` as in
    :func:`case_table`), in percent, on every case where both ran:
    ``{D: {(N, dtype, causal): percent}}`` (a head dim where either names none is left out)."""
    tf = {(r["impl"], r["D"], r["N"], r["dtype"], r["causal"]): r["tflops"] for r in rows
          if r.get("kind", "speed") == "speed" and r.get("mode") == mode and r.get("tflops")}
    out: dict = {}
    for (impl, D, N, dtype, causal), t in tf.items():
        other = tf.get((column_impl(column, D), D, N, dtype, causal))
        if impl == column_impl(base, D) and other:
            out.setdefault(D, {})[(N, dtype, causal)] = 100 * (other / t - 1)
    return out


def ratio_summary(rows: list[dict], impls, baseline: str = "sdpa-flash", mode: str = "bwd") -> list[dict]:
    """Per head dim and implementation of ``impls``: the geometric mean, minimum and maximum of
    its TFLOP/s over ``baseline``'s on the same cases, and how many cases:
    ``[{"D", "impl", "gmean", "min", "max", "cases"}]``, D descending, ``impls`` in order."""
    out = []
    for e in (e for e in ratio_table(rows, baseline) if e["mode"] == mode):
        for impl in impls:
            if impl in e["ratios"]:
                out.append((e["D"], impl, e["ratios"][impl]))
    summary = []
    for D in sorted({d for d, _, _ in out}, reverse=True):
        for impl in impls:
            v = [x for d, i, x in out if d == D and i == impl]
            if v:
                g = math.exp(sum(math.log(x) for x in v) / len(v))
                summary.append(dict(D=D, impl=impl, gmean=g, min=min(v), max=max(v), cases=len(v)))
    return summary


def format_ratio_summary(summary: list[dict], names: dict | None = None) -> list[str]:
    """:func:`ratio_summary` as one line per head dim: "D = 128: name 0.879 (0.86 to 0.91); ..."
    (``names`` shortens an implementation's name)."""
    names = names or {}
    lines = []
    for D in dict.fromkeys(s["D"] for s in summary):
        parts = [f"{names.get(s['impl'], s['impl'])} {s['gmean']:.3f} ({s['min']:.2f} to {s['max']:.2f})"
                 for s in summary if s["D"] == D]
        lines.append(f"D = {D}: " + "; ".join(parts))
    return lines


def ladder_summary(rows: list[dict], rungs: dict, baseline: str = "sdpa-flash", mode: str = "fwd",
                   head_dims=(128, 64)) -> tuple[list[str], list[list[str]]]:
    """A worklog's final ladder in one table: per rung (``rungs``: label -> implementation, or
    ``{D: implementation}`` as in :func:`case_table`, or either with its pass as ``(column, mode)``),
    its ratio to ``baseline`` per head dim over the cases both ran, as "gmean (min to max)"
    (:func:`ratio_summary`); "-" where the rung has no build at that head dim. Returns
    (header, body) for :func:`format_table`."""
    body = []
    for label, column in rungs.items():
        column, rung_mode = column if isinstance(column, tuple) else (column, mode)
        impls = [i for i in (column_impl(column, D) for D in head_dims) if i]
        summary = {(s["D"], s["impl"]): s for s in ratio_summary(rows, impls, baseline, rung_mode)}
        cells = [label]
        for D in head_dims:
            s = summary.get((D, column_impl(column, D)))
            cells.append(f"{s['gmean']:.2f} ({s['min']:.2f} to {s['max']:.2f})" if s else "-")
        body.append(cells)
    return ["rung"] + [f"D = {D}: x {baseline}, gmean (min to max)" for D in head_dims], body


def rung_table(rows: list[dict], profile: list[dict], rungs: dict, D: int, mode: str = "fwd",
               baseline: str = "sdpa-flash") -> tuple[list[str], list[list[str]]]:
    """A kernel ladder the way a worklog shows it: per rung (``rungs``: implementation -> what it
    changes), its ratio to ``baseline`` over the cases of head dim ``D`` (geometric mean, min to
    max, from :func:`ratio_summary`) beside its Nsight Compute profile (``profile``: rows with
    ``impl``, ``tensor_pipe_pct``, ``registers`` and ``top_stalls_per_issue``, as the CUDA
    ladder's runs record them). Returns (header, body) for :func:`format_table`."""
    summary = {s["impl"]: s for s in ratio_summary(rows, list(rungs), baseline, mode) if s["D"] == D}
    prof = {p["impl"]: p for p in profile}
    body = []
    for impl, change in rungs.items():
        s, p = summary.get(impl), prof.get(impl, {})
        stalls = {k: v for k, v in p.get("top_stalls_per_issue", {}).items() if k != "selected"}
        body.append([impl, change,
                     f"{s['gmean']:.3f} ({s['min']:.2f} to {s['max']:.2f})" if s else "-",
                     f"{p['tensor_pipe_pct']:.1f}" if p else "-", str(p.get("registers", "-")),
                     ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in list(stalls.items())[:2]) or "-"])
    return (["rung", "change", f"x {baseline} (gmean, range)", "tensor pipe %", "registers",
             "top stalls per issue"], body)

#: the instructions that tell which tensor-core path a kernel takes (and how it feeds it)
SASS_COLUMNS = ("HGMMA", "HMMA", "LDSM", "LDGSTS", "UTMALDG", "USETMAXREG")


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def sass_table(rows: list[dict], markdown: bool = True) -> str:
    """The ``sass`` rows of a results file (``flashtut.bench.sass``) as one line per implementation,
    setting and kernel name: how many compiled versions were read and the count of each of
    :data:`SASS_COLUMNS` in them (a range where the versions differ)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("kind") == "sass" and r.get("counts"):
            name = r["kernel"].split("<")[0].split("(")[0].replace("void ", "")
            groups[(r["impl"], r.get("setting", "default"), name)].append(r["counts"])
    body = [[impl, setting, name, str(len(c))] + [_span([x.get(op, 0) for x in c]) for op in SASS_COLUMNS]
            for (impl, setting, name), c in sorted(groups.items())]
    return format_table(["impl", "setting", "kernel", "versions", *SASS_COLUMNS], body, markdown, left=(0, 1, 2))


def setting_table(rows: list[dict], impl: str = "triton", markdown: bool = True) -> str:
    """``impl``'s speed in each setting a results file holds (``flashtut.bench.sass``: Triton's
    defaults against ``DISABLE_MMA_V3=1``), with SDPA flash timed in the same process as the
    reference: one line per mode, N and mask."""
    cells: dict[tuple, dict] = defaultdict(dict)
    settings = []
    for r in rows:
        if r.get("kind") != "speed" or not r.get("tflops") or not r["impl"].startswith(impl):
            continue
        setting = r.get("setting", "default")
        if setting not in settings:
            settings.append(setting)
        cells[(r["mode"], r["N"], r["causal"])][setting] = (r["tflops"], r.get("speedup_vs_sdpa_flash"))
    head = ["mode", "N", "causal"] + [f"{impl} {s} TFLOP/s (x SDPA flash)" for s in settings]
    body = []
    for key in sorted(cells, key=lambda k: (k[0] != "fwd", k[1], k[2])):
        row = [key[0], str(key[1]), "yes" if key[2] else "no"]
        for s in settings:
            t = cells[key].get(s)
            row.append("-" if t is None else f"{t[0]:.0f} ({t[1]:.2f})" if t[1] else f"{t[0]:.0f}")
        body.append(row)
    return format_table(head, body, markdown)


#: the four columns of :func:`headline_table`: (header, mode, causal)
HEADLINE_COLUMNS = (("forward", "fwd", False), ("forward, causal", "fwd", True),
                    ("backward", "bwd", False), ("backward, causal", "bwd", True))


def headline_table(sources: list[tuple[str, str, list[dict]]], D: int = 128, N: int = 16384,
                   dtypes=("float16", "bfloat16"), baseline: str = "sdpa-flash") -> str:
    """The README's results table, in Markdown: one line per (label, dtype), the TFLOP/s of
    implementation ``impl`` over ``baseline``'s at head dim ``D`` and length ``N`` (forward and
    backward, causal or not), each ratio taken within the rows it came with (one process).
    ``sources``: ``[(label, impl, rows)]``; ``-`` where ``impl`` has no such row."""
    body = []
    for label, impl, rows in sources:
        tf = {(r["impl"], r["mode"], r["dtype"], r["causal"]): r["tflops"] for r in rows
              if r.get("kind", "speed") == "speed" and r.get("tflops") and r.get("D") == D
              and r.get("N") == N}
        for dtype in dtypes:
            cells = [label, SHORT_DTYPE.get(dtype, dtype)]
            for _, mode, causal in HEADLINE_COLUMNS:
                mine, base = tf.get((impl, mode, dtype, causal)), tf.get((baseline, mode, dtype, causal))
                cells.append(f"{mine / base:.2f}" if mine and base else "-")
            body.append(cells)
    header = ["kernel", "dtype"] + [h for h, _, _ in HEADLINE_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "| --- | --- | " + " | ".join("---:" for _ in HEADLINE_COLUMNS) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])

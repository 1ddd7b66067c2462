"""What chapter 9 reads out of the result rows: one ratio table, the spans its text quotes, the
instruction ceilings, the machine-code evidence and the memory endpoints.

Every function takes rows (as ``flashtut.results_data.load_results`` returns them) and returns a
table (``header, body``, ready for ``flashtut.notebook.show_table``) or numbers; nothing here opens
a file, so the chapter's folded cells stay one call each and the tests check the same code.
"""
from __future__ import annotations

import math

from .report import ratio_table

BASELINE = "sdpa-flash"
#: the columns of the headline table: (implementation in its rows, column title)
HEADLINE_COLUMNS = (("triton", "Triton (ch. 7)"), ("cuda-mma", "CUDA mma.sync (ch. 8)"),
                    ("cuda", "cuda_attention"), ("sdpa-cudnn", "cuDNN"))


def _ok(rows):
    return [r for r in rows if r.get("kind", "speed") == "speed" and r.get("status", "ok") == "ok"
            and r.get("tflops")]


def _check_rows(rows, name: str):
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"{name} must be a list of result rows, got {type(rows).__name__}")


def ratios(rows, impl: str, baseline: str = BASELINE, **case) -> dict:
    """``{(mode, dtype, D, N, causal): impl's TFLOP/s over baseline's}`` for the cases of ``rows``
    where both were timed in the same run; keyword arguments (``mode="fwd"``, ``N=16384`` ...)
    keep only the cases that match."""
    _check_rows(rows, "rows")
    out = {}
    for e in ratio_table(_ok(rows), baseline):
        if impl in e["ratios"] and all(e[k] == v for k, v in case.items()):
            out[(e["mode"], e["dtype"], e["D"], e["N"], bool(e["causal"]))] = e["ratios"][impl]
    return out


def span(values, spec: str = ".2f") -> str:
    """``"lo to hi"`` of some numbers, formatted with ``spec``."""
    values = list(values)
    if not values:
        raise ValueError("span needs at least one value")
    return f"{min(values):{spec}} to {max(values):{spec}}"


def span_table(rows, mode: str, columns: dict, baseline: str = BASELINE):
    """Ratios to ``baseline`` as ``"lo to hi"`` spans: one line per head dim and mask, one column per
    implementation of ``columns`` (name in the rows -> column title), each span over the sequence lengths
    and dtypes ``rows`` timed for ``mode`` (``"fwd"`` or ``"bwd"``). Returns ``(header, body)``."""
    _check_rows(rows, "rows")
    if mode not in ("fwd", "bwd"):
        raise ValueError(f"mode must be 'fwd' or 'bwd', got {mode!r}")
    if not columns:
        raise ValueError("columns: give at least one {implementation: title}")
    cols = {impl: ratios(rows, impl, baseline, mode=mode) for impl in columns}
    keys = sorted({(k[2], k[4]) for c in cols.values() for k in c})
    if not keys:
        raise ValueError(f"no {mode} case of {', '.join(columns)} with a {baseline} time in the rows")
    body = []
    for D, causal in keys:
        row = [str(D), "yes" if causal else "no"]
        for impl in columns:
            vals = [x for k, x in cols[impl].items() if (k[2], k[4]) == (D, causal)]
            row.append(span(vals) if vals else "-")
        body.append(row)
    return ["D", "causal", *columns.values()], body


def headline_table(sweep, protocol, N: int | None = None, dtype: str = "float16"):
    """Chapter 9's ratio table: one line per pass, head dim and mask at ``N`` (None: the longest
    sequence ``protocol`` timed) and ``dtype``, one
    column per implementation of :data:`HEADLINE_COLUMNS`, each its TFLOP/s over ``sdpa-flash``'s
    timed in the same process. Triton's ratios come from ``sweep`` (the protocol sweep), the CUDA
    kernels' and cuDNN's from ``protocol`` (``cuda_protocol_h200.json``: chapter 8's mma.sync
    kernels as ``cuda-mma`` and ``cuda_attention`` as shipped as ``cuda``). Returns
    ``(header, body)``."""
    _check_rows(sweep, "sweep")
    _check_rows(protocol, "protocol")
    if N is None:
        N = max((r["N"] for r in _ok(protocol) if r.get("N")), default=None)
        if N is None:
            raise ValueError("protocol holds no timed case")
    if not isinstance(N, int) or isinstance(N, bool) or N <= 0:
        raise ValueError(f"N must be a positive int, got {N!r}")
    source = {"triton": sweep}
    cols = {impl: ratios(source.get(impl, protocol), impl, N=N, dtype=dtype) for impl, _ in HEADLINE_COLUMNS}
    keys = sorted({(k[0], k[2], k[4]) for c in cols.values() for k in c},
                  key=lambda k: (k[0] != "fwd", k[1], k[2]))
    if not keys:
        raise ValueError(f"no case at N={N}, {dtype} with a {BASELINE} time in the rows")
    header = ["pass", "D", "causal"] + [title for _, title in HEADLINE_COLUMNS]
    body = []
    for mode, D, causal in keys:
        row = [mode, str(D), "yes" if causal else "no"]
        for impl, _ in HEADLINE_COLUMNS:
            x = cols[impl].get((mode, dtype, D, N, causal))
            row.append("-" if x is None else f"{x:.2f}")
        body.append(row)
    return header, body


def headline_spans(sweep, protocol) -> dict:
    """``{(impl, mode): "lo to hi"}``: each headline implementation's ratio to ``sdpa-flash`` over
    every case at N = 4096 and 16384 (both dtypes, both head dims, causal and not)."""
    out = {}
    for impl, _ in HEADLINE_COLUMNS:
        rows = sweep if impl == "triton" else protocol
        for mode in ("fwd", "bwd"):
            vals = [x for k, x in ratios(rows, impl, mode=mode).items() if k[3] in (4096, 16384)]
            if vals:
                out[impl, mode] = span(vals)
    return out


def instruction_ceilings(rows) -> dict:
    """``{instruction: {dtype: TFLOP/s}}`` from the ``instruction`` rows of a roofline file
    (``python -m flashtut.bench roofline --what instruction``)."""
    _check_rows(rows, "rows")
    out: dict = {}
    for r in rows:
        if r.get("what") == "instruction" and r.get("status") == "ok" and r.get("tflops"):
            out.setdefault(r["instruction"], {})[r["dtype"]] = r["tflops"]
    return out


def instruction_table(rows, peak_tflops: float):
    """The instruction ceilings as ``(header, body)``, each with its share of ``peak_tflops``."""
    if not peak_tflops or peak_tflops <= 0:
        raise ValueError(f"peak_tflops must be positive, got {peak_tflops!r}")
    ceil = instruction_ceilings(rows)
    body = [[f"`{name}`", dt, f"{t:.0f}", f"{t / peak_tflops:.0%}"]
            for name, by in ceil.items() for dt, t in by.items()]
    return ["instruction", "dtype", "TFLOP/s", f"of the {peak_tflops:.0f} peak"], body


_FORWARD = {"triton": "attn_fwd_kernel", "sdpa-flash": "flash_fwd_kernel"}
_OPS = ("HGMMA", "HMMA", "LDSM")


def sass_counts(rows, impl: str, setting: str = "default") -> dict:
    """``{op: (min, max)}`` of :data:`_OPS` over the compiled versions of ``impl``'s forward
    kernel in ``setting`` (the ``sass`` rows of ``sass_evidence_h200.json``)."""
    _check_rows(rows, "rows")
    counts = [r["counts"] for r in rows
              if r.get("kind") == "sass" and r.get("counts") and r["impl"] == impl
              and r.get("setting", "default") == setting and _FORWARD[impl] in r.get("kernel", "")]
    if not counts:
        raise ValueError(f"no SASS counts of {impl}'s forward kernel in setting {setting!r}")
    return {op: (min(c.get(op, 0) for c in counts), max(c.get(op, 0) for c in counts)) for op in _OPS}


def setting_ratios(rows, setting: str, mode: str) -> list[float]:
    """Triton's TFLOP/s over SDPA flash's (timed in the same process) in ``setting`` and ``mode``."""
    _check_rows(rows, "rows")
    return [r["speedup_vs_sdpa_flash"] for r in rows
            if r.get("kind") == "speed" and r["impl"].startswith("triton")
            and r.get("setting", "default") == setting and r["mode"] == mode and r.get("speedup_vs_sdpa_flash")]


def evidence_table(rows, off: str = "DISABLE_MMA_V3=1"):
    """The forward kernels' matrix instructions and operand loads (``HGMMA`` = wgmma, ``HMMA`` =
    mma.sync, ``LDSM`` = ldmatrix) and their speed over SDPA flash: Triton with its defaults,
    Triton with ``off``, and SDPA flash itself. Returns ``(header, body)``."""
    def cells(c):
        return [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in (c[op] for op in _OPS)]

    body = [["Triton, defaults"] + cells(sass_counts(rows, "triton"))
            + [span(setting_ratios(rows, "default", "fwd"))],
            [f"Triton, `{off}`"] + cells(sass_counts(rows, "triton", off)) + [span(setting_ratios(rows, off, "fwd"))],
            ["`sdpa-flash`"] + cells(sass_counts(rows, "sdpa-flash")) + ["1"]]
    return ["forward kernel", "HGMMA", "HMMA", "LDSM", "x sdpa-flash"], body


def memory_summary(rows) -> list[str]:
    """One line per implementation of a memory file: its peak extra memory at the smallest and
    largest N, the exponent of the growth between them, and the N at which it ran out of memory."""
    _check_rows(rows, "rows")
    from .report import impl_order

    ok = [r for r in rows if r.get("status") == "ok" and r.get("peak_extra_bytes")]
    lines = []
    for impl in impl_order({r["impl"] for r in ok}):
        pts = sorted((r["N"], r["peak_extra_bytes"]) for r in ok if r["impl"] == impl)
        text = f"`{impl}`: {pts[0][1] / 2**20:,.1f} MiB at N = {pts[0][0]}, {pts[-1][1] / 2**20:,.1f} MiB at N = {pts[-1][0]}"
        if len(pts) > 1:
            growth = math.log(pts[-1][1] / pts[0][1]) / math.log(pts[-1][0] / pts[0][0])
            text += f" (grows as $N^{{{growth:.2f}}}$)"
        oom = sorted(r["N"] for r in rows if r.get("impl") == impl and r.get("status") == "oom")
        if oom:
            text += f"; out of memory at N = {oom[0]}"
        lines.append(text)
    return lines


def live_table(rows, baseline: str = BASELINE):
    """A narrow table of a small live sweep (``bench.run_speed``): implementation, pass, N, mask,
    milliseconds, TFLOP/s, the ratio to ``baseline`` on the same case, the largest error and the
    status; the batch, heads, head dim and dtype of a live sweep are one value each, stated once by
    the cell that ran it. Returns ``(header, body)``."""
    _check_rows(rows, "rows")
    from .report import SPEED_KEY, _fmt, _worst_err

    base = {tuple(r.get(k) for k in SPEED_KEY): r["tflops"] for r in rows
            if r.get("impl") == baseline and r.get("tflops")}
    body = []
    for r in rows:
        if r.get("status") == "unavailable":
            continue
        b = base.get(tuple(r.get(k) for k in SPEED_KEY))
        body.append([r["impl"], r["mode"], _fmt(r["Nq"]), _fmt(r["causal"]), _fmt(r.get("ms"), ".3g"),
                     _fmt(r.get("tflops"), ".3g"), _fmt(r["tflops"] / b if b and r.get("tflops") else None, ".2f"),
                     _fmt(_worst_err(r), ".1e"), r.get("status") or "-"])
    return ["impl", "pass", "N", "causal", "ms", "TFLOP/s", f"x {baseline}", "max err", "status"], body

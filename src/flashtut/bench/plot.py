"""Figures of benchmark results, in the book's style (``flashtut.figures.style``).

Every function takes loaded rows (``flashtut.bench.results.load_rows(path)``, or what
``run_speed``/``run_memory``/``run_roofline`` returned) and returns a matplotlib ``Figure``, so a
notebook can show it; ``draw_all`` writes every figure the rows allow to files (the ``plot``
subcommand). An implementation keeps its colour and marker in every figure.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..figures import style as _style
from ..figures.style import PALETTE, subplots
from .report import format_ratio_table, ratio_table
from .results import normalise_rows

_ORDER = ["naive", "tiled", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn", "triton", "cuda"]


def _ladder_key(name: str):
    m = re.match(r"cuda-v(\d+)(.*)", name)
    return (int(m.group(1)), m.group(2)) if m else (10**6, name)


def impl_order(names) -> list[str]:
    """Reference implementations first, then PyTorch's, then ours, then the ladder in order."""
    names = list(dict.fromkeys(names))
    known = [n for n in _ORDER if n in names]
    ladder = sorted((n for n in names if n.startswith("cuda-v")), key=_ladder_key)
    rest = sorted(n for n in names if n not in known and n not in ladder)
    return known + ladder + rest


_OTHERS: dict[str, int] = {}


def impl_style(name: str) -> dict:
    """Colour, marker and line style of an implementation: the one table of
    ``flashtut.figures.style.IMPL_STYLE``; other names get the next spare colour, in order seen."""
    base = name.split(" [")[0]
    return _style.impl_style(base, _OTHERS.setdefault(base, len(_OTHERS)))


def _rows(rows, kind):
    """Rows of one kind; when they come from more than one device, each row's ``series`` names
    its device too (``"impl [device]"``), so results of two machines are never mixed up."""
    out = [dict(r) for r in normalise_rows(rows) if r.get("kind") == kind]
    devices = {r.get("device") for r in out}
    for r in out:
        name = r.get("impl", r.get("what", ""))
        r["series"] = f"{name} [{r.get('device')}]" if len(devices) > 1 else name
    return out


def _log2_n_axis(ax, ns):
    ax.set_xscale("log", base=2)
    ns = sorted(set(ns))
    if ns:
        ax.set_xticks(ns)
        ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in ns])
        ax.minorticks_off()


def speed_figure(rows, D: int, mode: str = "fwd", dtypes=None, impls=None, title: str | None = None):
    """TFLOP/s against N, one line per implementation, for head dim ``D`` and ``mode``: a panel
    per dtype (rows of panels) and causal setting (columns)."""
    speed = [r for r in _rows(rows, "speed") if r.get("D") == D and r.get("mode") == mode
             and r.get("status", "ok") == "ok" and r.get("tflops")]
    if impls is not None:
        speed = [r for r in speed if r["impl"] in impls]
    if not speed:
        raise ValueError(f"no successful {mode} speed rows with D={D} to plot")
    dtypes = list(dtypes) if dtypes else sorted({r["dtype"] for r in speed})
    causals = sorted({bool(r.get("causal")) for r in speed})
    fig, axes = subplots(len(dtypes), len(causals), figsize=(4.2 * len(causals) + 1.6, 3.2 * len(dtypes)),
                         squeeze=False, sharey=True)
    names = impl_order(r["series"] for r in speed)
    for i, dt in enumerate(dtypes):
        for j, c in enumerate(causals):
            ax = axes[i][j]
            panel = [r for r in speed if r["dtype"] == dt and bool(r.get("causal")) == c]
            for name in names:
                pts = sorted((r["N"], r["tflops"]) for r in panel if r["series"] == name)
                if pts:
                    ax.plot(*zip(*pts), label=name, **impl_style(name))
            _log2_n_axis(ax, [r["N"] for r in panel])
            ax.set_title(f"{dt}, {'causal' if c else 'not causal'}")
            ax.set_xlabel("sequence length N")
            if j == 0:
                ax.set_ylabel(f"{mode} TFLOP/s")
            ax.set_ylim(bottom=0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside right center")
    devices = {r.get("device") for r in speed}
    device = next(iter(devices)) if len(devices) == 1 else None
    fig.suptitle(title or f"{'Forward' if mode == 'fwd' else 'Backward'} speed, head dim {D}"
                 + (f" ({device})" if device else ""))
    return fig


def memory_figure(rows, mode: str = "fwd", title: str | None = None):
    """Peak extra memory against N on log-log axes, one line per implementation; a cross marks
    the first N at which an implementation ran out of memory."""
    mem = [r for r in _rows(rows, "memory") if r.get("mode", "fwd") == mode]
    ok = [r for r in mem if r.get("status") == "ok" and r.get("peak_extra_bytes")]
    if not ok:
        raise ValueError(f"no successful {mode} memory rows to plot")
    fig, ax = subplots(figsize=(6.4, 4.0))
    for name in impl_order(r["series"] for r in ok):
        style = impl_style(name)
        pts = sorted((r["N"], r["peak_extra_bytes"] / 2**20) for r in ok if r["series"] == name)
        ax.plot(*zip(*pts), label=name, **style)
        oom = sorted(r["N"] for r in mem if r["series"] == name and r.get("status") == "oom")
        if oom:
            ax.plot([oom[0]], [pts[-1][1]], marker="x", markersize=11, mew=2, color=style["color"],
                    linestyle="none")
            ax.annotate(f"OOM at N={oom[0]}", (oom[0], pts[-1][1]), textcoords="offset points",
                        xytext=(6, -4), fontsize=8, color=style["color"])
    _log2_n_axis(ax, [r["N"] for r in mem])
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak extra memory (MiB)")
    first = ok[0]
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_title(title or (f"{'One forward' if mode == 'fwd' else 'Forward + backward'}: "
                           f"B={first['B']}, H={first['H']}, D={first['D']}, {first['dtype']}"))
    ax.legend()
    return fig


def ladder_figure(rows, mode: str = "fwd", dtype: str | None = None, D: int | None = None,
                  N: int | None = None, causal: bool = False, others=("naive", "sdpa-flash", "cuda"),
                  title: str | None = None):
    """Bars of TFLOP/s for each CUDA ladder step (and ``others`` for comparison) on one case:
    by default the largest N with the most ladder results, float16 if present, D=128 if present."""
    speed = [r for r in _rows(rows, "speed") if r.get("mode") == mode and r.get("tflops")
             and r.get("status", "ok") == "ok" and bool(r.get("causal")) == causal]
    ladder = [r for r in speed if r["impl"].startswith("cuda-v")]
    if not ladder:
        raise ValueError(f"no successful {mode} rows of the CUDA ladder (cuda-v*) to plot")
    if dtype is None:
        dts = {r["dtype"] for r in ladder}
        dtype = "float16" if "float16" in dts else sorted(dts)[0]
    if D is None:
        ds = {r["D"] for r in ladder if r["dtype"] == dtype}
        D = 128 if 128 in ds else max(ds)
    if N is None:
        ns = [r["N"] for r in ladder if r["dtype"] == dtype and r["D"] == D]
        N = max(ns, key=lambda n: (ns.count(n), n))
    case = [r for r in speed if r["dtype"] == dtype and r["D"] == D and r["N"] == N]
    names = [n for n in impl_order(r["impl"] for r in case) if n.startswith("cuda-v") or n in others]
    vals = [max(r["tflops"] for r in case if r["impl"] == n) for n in names]
    fig, ax = subplots(figsize=(6.4, 0.45 * len(names) + 1.4))
    ypos = list(range(len(names)))[::-1]
    ax.barh(ypos, vals, color=[impl_style(n)["color"] for n in names])
    ax.set_yticks(ypos)
    ax.set_yticklabels(names)
    for y, val in zip(ypos, vals):
        ax.annotate(f"{val:.3g}", (val, y), textcoords="offset points", xytext=(4, -3), fontsize=8)
    ax.set_xlabel(f"{mode} TFLOP/s")
    ax.grid(axis="y", visible=False)
    first = case[0]
    ax.set_title(title or f"CUDA ladder: B={first['B']}, H={first['H']}, N={N}, D={D}, {dtype}"
                 + (", causal" if causal else ""))
    return fig


def roofline_figure(rows, points=None, title: str | None = None):
    """The roofline from measured ceilings: one roof per matmul dtype over the copy bandwidth.
    ``points`` is an optional list of ``(label, flops_per_byte)`` drawn as vertical marks."""
    roof = _rows(rows, "roofline")
    copy = [r for r in roof if r.get("what") == "copy" and r.get("gb_per_s")]
    mm = [r for r in roof if r.get("what") == "matmul" and r.get("tflops")]
    if not copy or not mm:
        raise ValueError("need a copy row and at least one matmul row to draw a roofline")
    import numpy as np

    bw = copy[0]["gb_per_s"] * 1e9
    fig, ax = subplots(figsize=(6.4, 4.0))
    x = np.logspace(-1, 4, 200)
    for i, r in enumerate(sorted(mm, key=lambda r: -r["tflops"])):
        peak = r["tflops"] * 1e12
        ax.plot(x, np.minimum(peak, bw * x) / 1e12, color=PALETTE[i % len(PALETTE)],
                label=f"{r['dtype']}: {r['tflops']:.3g} TFLOP/s, ridge {peak / bw:.3g} FLOP/B")
    for label, ai in points or ():
        ax.axvline(ai, color=PALETTE[-1], linestyle=":")
        ax.annotate(label, (ai, ax.get_ylim()[0]), rotation=90, fontsize=8, xytext=(3, 8),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of memory traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(title or f"Roofline: copy bandwidth {copy[0]['gb_per_s']:.0f} GB/s")
    ax.legend(fontsize=8)
    return fig


def draw_all(rows, out_dir, formats=("png", "svg"), baseline: str = "sdpa-flash") -> list[Path]:
    """Write every figure the rows allow (and the ratio table as Markdown) under ``out_dir``."""
    import matplotlib.pyplot as plt

    rows = normalise_rows(rows)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, stem):
        for fmt in formats:
            path = out_dir / f"{stem}.{fmt}"
            fig.savefig(path, bbox_inches="tight")
            written.append(path)
        plt.close(fig)

    speed = [r for r in rows if r.get("kind") == "speed" and r.get("tflops")]
    for D, mode in sorted({(r["D"], r["mode"]) for r in speed}):
        save(speed_figure(rows, D, mode), f"speed_D{D}_{mode}")
    for mode in sorted({r.get("mode", "fwd") for r in rows if r.get("kind") == "memory"
                        and r.get("status") == "ok"}):
        save(memory_figure(rows, mode), "memory" if mode == "fwd" else f"memory_{mode}")
    for mode in sorted({r["mode"] for r in speed if r["impl"].startswith("cuda-v")}):
        for causal in sorted({bool(r.get("causal")) for r in speed if r["impl"].startswith("cuda-v")}):
            save(ladder_figure(rows, mode, causal=causal), f"ladder_{mode}" + ("_causal" if causal else ""))
    if any(r.get("kind") == "roofline" and r.get("what") == "copy" for r in rows) and \
            any(r.get("kind") == "roofline" and r.get("tflops") for r in rows):
        save(roofline_figure(rows), "roofline")
    table = ratio_table(rows, baseline)
    if table:
        path = out_dir / f"ratios_to_{baseline}.md"
        path.write_text(format_ratio_table(table, baseline) + "\n")
        written.append(path)
    return written


__all__ = ["speed_figure", "memory_figure", "ladder_figure", "roofline_figure", "ratio_table",
           "format_ratio_table", "draw_all", "impl_style", "impl_order"]

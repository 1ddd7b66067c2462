"""Figures of benchmark results, in the book's style (``flashtut.figures.style``).

Every function takes rows (``flashtut.results_data.load_results(name)``, or what
``flashtut.bench.run_speed``/``run_memory``/``run_roofline`` returned) and returns a matplotlib
``Figure``, so a notebook can show it; ``all_figures`` lists every figure the rows allow, which
``python -m flashtut.figures plot`` writes to files. Nothing here opens a file. An
implementation keeps its colour and marker in every figure.
"""
from __future__ import annotations

from ..bench.report import IMPL_ORDER, format_ratio_table, impl_order, ladder_key, ratio_table  # noqa: F401  (re-exported for notebooks)
from . import roofline as _roofline
from . import style as _style
from .style import PALETTE, subplots

_OTHERS: dict[str, int] = {}


def impl_style(name: str) -> dict:
    """Colour, marker and line style of an implementation: the one table of
    ``flashtut.figures.style.IMPL_STYLE``; other names get the next spare colour, in order seen."""
    base = name.split(" [")[0]                     # "impl [device]" keeps the impl's look
    return _style.impl_style(base, _OTHERS.setdefault(base, len(_OTHERS)))


def _rows(rows, kind):
    """Rows of one kind; when they come from more than one device, each row's ``series`` names
    its device too (``"impl [device]"``), so results of two machines are never mixed up."""
    out = [dict(r) for r in rows if r.get("kind") == kind]
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
                  N: int | None = None, causal=False, others=("naive", "sdpa-flash", "cuda"),
                  title: str | None = None, steps: str = "cuda-v"):
    """Bars of TFLOP/s for each step of a ladder (and ``others`` for comparison) on one case:
    by default the largest N with the most ladder results, float16 if present, D=128 if present.
    ``causal`` is one mask (``False``, ``True``) or several (``(False, True)``: one bar each,
    side by side). ``steps`` is the prefix of the steps' names: ``"cuda-v"`` for chapter 8's
    ladder, ``"hopper-"`` for chapter 11's rungs."""
    masks = tuple(causal) if isinstance(causal, (tuple, list)) else (causal,)
    if not masks or any(not isinstance(c, bool) for c in masks):
        raise ValueError(f"causal: got {causal!r}; accepted: True, False or a tuple of them")
    speed = [r for r in _rows(rows, "speed") if r.get("mode") == mode and r.get("tflops")
             and r.get("status", "ok") == "ok" and bool(r.get("causal")) in masks]
    ladder = [r for r in speed if r["impl"].startswith(steps)]
    if not ladder:
        raise ValueError(f"no successful {mode} rows of the ladder ({steps}*) to plot")
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
    names = [n for n in impl_order(r["impl"] for r in case) if n.startswith(steps) or n in others]
    height = 0.8 / len(masks)
    fig, ax = subplots(figsize=(6.4, (0.3 + 0.25 * len(masks)) * len(names) + 1.4))
    ypos = list(range(len(names)))[::-1]
    for m, c in enumerate(masks):
        vals = [max((r["tflops"] for r in case if r["impl"] == n and bool(r.get("causal")) == c), default=0.0)
                for n in names]
        ys = [y + (len(masks) - 1) / 2 * height - m * height for y in ypos]
        if len(masks) == 1:
            ax.barh(ys, vals, height, color=[impl_style(n)["color"] for n in names])
        else:
            ax.barh(ys, vals, height, color=PALETTE[m], label="causal" if c else "not causal")
        for y, val in zip(ys, vals):
            ax.annotate(f"{val:.3g}", (val, y), textcoords="offset points", xytext=(4, -3), fontsize=8)
    ax.set_yticks(ypos)
    ax.set_yticklabels(names)
    ax.set_xlabel(f"{mode} TFLOP/s")
    ax.grid(axis="y", visible=False)
    if len(masks) > 1:
        ax.legend()
    first = case[0]
    ax.set_title(title or f"CUDA ladder: B={first['B']}, H={first['H']}, N={N}, D={D}, {dtype}"
                 + (", causal" if masks == (True,) else ""))
    return fig


def roofs_from_rows(rows) -> list[tuple[str, float, float]]:
    """``(dtype, TFLOP/s, copy GB/s)`` per successful matmul row of roofline rows, fastest first:
    the ``roofs`` of :func:`flashtut.figures.roofline.roofline_figure`."""
    roof = _rows(rows, "roofline")
    copy = [r for r in roof if r.get("what") == "copy" and r.get("gb_per_s")]
    mm = [r for r in roof if r.get("what") == "matmul" and r.get("tflops")]
    if not copy or not mm:
        raise ValueError("need a copy row and at least one matmul row to draw a roofline")
    return [(r["dtype"], r["tflops"], copy[0]["gb_per_s"]) for r in sorted(mm, key=lambda r: -r["tflops"])]


def roofline_figure(rows, points=None, title: str | None = None):
    """The roofline from measured ceilings (roofline rows): one roof per matmul dtype over the
    copy bandwidth, drawn by :func:`flashtut.figures.roofline.roofline_figure`; ``points`` is an
    optional list of ``(label, flops_per_byte)`` placed on the fastest roof."""
    roofs = roofs_from_rows(rows)
    return _roofline.roofline_figure(roofs, points or (),
                                     title=title or f"Roofline: copy bandwidth {roofs[0][2]:.0f} GB/s")


def all_figures(rows, baseline: str = "sdpa-flash") -> tuple[list[tuple[str, object]], str | None]:
    """Every figure the rows allow, as ``(file stem, Figure)``, and the Markdown table of ratios
    to ``baseline`` (None when the baseline was not measured)."""
    figures = []
    speed = [r for r in rows if r.get("kind") == "speed" and r.get("tflops")]
    for D, mode in sorted({(r["D"], r["mode"]) for r in speed}):
        figures.append((f"speed_D{D}_{mode}", speed_figure(rows, D, mode)))
    for mode in sorted({r.get("mode", "fwd") for r in rows if r.get("kind") == "memory"
                        and r.get("status") == "ok"}):
        figures.append(("memory" if mode == "fwd" else f"memory_{mode}", memory_figure(rows, mode)))
    for mode in sorted({r["mode"] for r in speed if r["impl"].startswith("cuda-v")}):
        for causal in sorted({bool(r.get("causal")) for r in speed if r["impl"].startswith("cuda-v")}):
            figures.append((f"ladder_{mode}" + ("_causal" if causal else ""), ladder_figure(rows, mode, causal=causal)))
    if any(r.get("kind") == "roofline" and r.get("what") == "copy" for r in rows) and \
            any(r.get("kind") == "roofline" and r.get("tflops") for r in rows):
        figures.append(("roofline", roofline_figure(rows)))
    table = ratio_table(rows, baseline)
    return figures, (format_ratio_table(table, baseline) if table else None)


__all__ = ["speed_figure", "memory_figure", "ladder_figure", "roofline_figure", "roofs_from_rows", "ratio_table",
           "format_ratio_table", "all_figures", "impl_style", "impl_order"]

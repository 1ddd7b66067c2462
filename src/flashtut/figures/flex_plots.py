"""Figures and tables of chapter 13 (masks and score modifications).

``tile_kinds_figure`` draws maps of tile kinds (``flashtut.block_mask``: empty / partial / full),
one panel per mask. ``versus_flex_figure`` and ``versus_flex_table`` take ``flashtut.bench`` speed
rows of ``experiments/flex/bench_flex.py`` (ours, ``triton-flex``, against PyTorch's compiled
FlexAttention, ``flex``): the speed ratio per mask, forward and backward. Nothing here opens a file.
"""
from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from .style import INK, impl_style, subplots

#: empty, partial, full
KIND_COLORS = ["#ffffff", "#E69F00", "#0072B2"]
KIND_NAMES = ["empty: skipped", "partial: mask applied", "full: no mask"]
OURS, THEIRS = "triton-flex", "flex"


def tile_kinds_figure(kinds: dict, block: int | None = None):
    """One panel per entry of ``kinds`` (name -> 2-D int array of 0/1/2, query blocks x key blocks),
    with the legend of the three kinds under them."""
    names = list(kinds)
    fig, axes = subplots(1, len(names), figsize=(2.6 * len(names), 3.1), squeeze=False)
    cmap = ListedColormap(KIND_COLORS)
    for ax, name in zip(axes[0], names):
        k = np.asarray(kinds[name])
        ax.imshow(k, cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
        ax.set_xticks(np.arange(-0.5, k.shape[1], 1), minor=True)
        ax.set_yticks(np.arange(-0.5, k.shape[0], 1), minor=True)
        ax.grid(which="minor", color=INK, linewidth=0.5, alpha=0.6)
        ax.grid(which="major", visible=False)
        ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
        visited = int((k > 0).sum())
        ax.set_title(f"{name}\n{visited}/{k.size} tiles visited", fontsize=10)
        ax.set_xlabel("key block")
    axes[0][0].set_ylabel("query block")
    fig.legend(handles=[Patch(facecolor=c, edgecolor=INK, label=n) for c, n in zip(KIND_COLORS, KIND_NAMES)],
               loc="outside lower center", ncol=3)
    if block:
        fig.suptitle(f"tiles of {block} x {block}", fontsize=10)
    return fig


def _pairs(rows):
    """``{(D, dtype, N, mask, mode): {impl: row}}`` of the ok speed rows of both sides."""
    out: dict = {}
    for r in rows:
        if r.get("kind") == "speed" and r.get("status") == "ok" and r.get("impl") in (OURS, THEIRS):
            out.setdefault((r["D"], r["dtype"], r["N"], r.get("mask"), r["mode"]), {})[r["impl"]] = r
    return {k: v for k, v in out.items() if len(v) == 2}


def versus_flex_rows(rows) -> list[dict]:
    """One dict per (D, dtype, N, mask): TFLOP/s of both sides and the speed ratio (their time over
    ours: above 1 we are faster), forward and backward, and the worst ratio of our error to theirs."""
    table: dict = {}
    for (D, dtype, N, mask, mode), pair in _pairs(rows).items():
        e = table.setdefault((D, dtype, N, mask), {"D": D, "dtype": dtype, "N": N, "mask": mask})
        e[f"{mode}_ours"] = pair[OURS]["tflops"]
        e[f"{mode}_theirs"] = pair[THEIRS]["tflops"]
        e[f"{mode}_ratio"] = pair[THEIRS]["ms"] / pair[OURS]["ms"]
        mine, theirs = pair[OURS].get("err") or {}, pair[THEIRS].get("err") or {}
        if mine and theirs:
            e["err_ratio"] = max(mine[n] / max(theirs[n], 1e-6) for n in mine if n in theirs)
    return list(table.values())


def versus_flex_table(rows) -> tuple[list[str], list[list[str]]]:
    """Header and body of the Markdown table (``flashtut.notebook.show_table``): per case, one cell
    per pass, the speed ratio then our TFLOP/s, "0.92x (379)" (PyTorch's TFLOP/s is ours over the
    ratio), and the error ratio. Five short columns besides D and dtype, one word or number each,
    so that the table fits a phone's column without wrapping; the caption says what they hold."""
    header = ["D", "dtype", "N", "mask / mod", "forward", "backward", "error"]
    body = []
    for e in versus_flex_rows(rows):
        passes = [f"{e[f'{m}_ratio']:.2f}x ({e[f'{m}_ours']:.0f})" if f"{m}_ratio" in e else "-"
                  for m in ("fwd", "bwd")]
        body.append([str(e["D"]), e["dtype"], str(e["N"]), str(e["mask"]), *passes,
                     f"{e['err_ratio']:.2f}" if "err_ratio" in e else "-"])
    return header, body


def versus_flex_figure(rows, D: int | None = None, dtype: str | None = None):
    """Speed ratio to PyTorch's FlexAttention per mask (bars: forward, backward), one panel per N,
    for one head dim and dtype (the first measured, unless given)."""
    table = versus_flex_rows(rows)
    if not table:
        raise ValueError("rows: no mask measured for both triton-flex and flex")
    D = D or table[0]["D"]
    dtype = dtype or table[0]["dtype"]
    table = [e for e in table if e["D"] == D and e["dtype"] == dtype]
    ns = sorted({e["N"] for e in table})
    fig, axes = subplots(1, len(ns), figsize=(4.2 * len(ns), 3.4), squeeze=False, sharey=True)
    for ax, N in zip(axes[0], ns):
        sub = [e for e in table if e["N"] == N]
        x = np.arange(len(sub))
        for i, (mode, shade) in enumerate((("fwd", 1.0), ("bwd", 0.55))):
            style = impl_style(OURS)
            ax.bar(x + (i - 0.5) * 0.38, [e.get(f"{mode}_ratio", 0.0) for e in sub], width=0.38,
                   color=style["color"], alpha=shade, label="forward" if mode == "fwd" else "backward")
        ax.axhline(1.0, color=INK, linewidth=1)
        ax.set_xticks(x, [e["mask"] for e in sub], rotation=35, ha="right")
        ax.set_title(f"N = {N}, D = {D}, {dtype}", fontsize=10)
        ax.grid(axis="x", visible=False)
    axes[0][0].set_ylabel("speed vs PyTorch FlexAttention (x)")
    axes[0][0].legend(loc="lower left")
    return fig


__all__ = ["tile_kinds_figure", "versus_flex_figure", "versus_flex_table", "versus_flex_rows", "KIND_COLORS"]

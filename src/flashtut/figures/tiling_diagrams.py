"""Figures of chapter 05: which tiles a FlashAttention loop visits in which order, and the HBM
traffic that follows. Both are drawn from the schedules of ``flashtut.costs.io_complexity``, so the
pictures show exactly what the counts in the text count."""
from __future__ import annotations

from collections import Counter

import matplotlib.pyplot as plt

from ..costs import io_complexity as io
from .style import INK, PALETTE, subplots


def _tile_visits(algorithm: str, n_q_blocks: int, n_k_blocks: int, causal: bool):
    """Tiles ``(i, j)`` in visiting order, and per-block read/write counts of O and K."""
    events = io.schedule(algorithm, n_q_blocks, n_k_blocks, 1, 1, 1, causal)
    order, seen = [], set()
    o_reads, o_writes, k_reads = Counter(), Counter(), Counter()
    for e in events:
        if e.step is not None and e.tensor in ("K", "Q"):
            tile = e.step if algorithm == "flash2" else (e.step[1], e.step[0])
            if e.tensor == ("K" if algorithm == "flash2" else "Q") and tile not in seen:
                seen.add(tile)
                order.append(tile)
        if e.tensor == "O":
            (o_reads if e.op == "read" else o_writes)[e.block] += 1
        if e.tensor == "K":
            k_reads[e.block] += 1
    return order, o_reads, o_writes, k_reads


def _draw_order(ax, algorithm: str, n_q_blocks: int, n_k_blocks: int, causal: bool, title: str):
    order, o_reads, o_writes, k_reads = _tile_visits(algorithm, n_q_blocks, n_k_blocks, causal)
    cmap = plt.get_cmap("viridis")
    rank = {tile: r for r, tile in enumerate(order)}
    for i in range(n_q_blocks):
        for j in range(n_k_blocks):
            if (i, j) in rank:
                r = rank[(i, j)]
                ax.add_patch(plt.Rectangle((j, i), 0.94, 0.94, color=cmap(0.15 + 0.75 * r / max(1, len(order) - 1)),
                                           alpha=0.85))
                ax.text(j + 0.47, i + 0.5, str(r + 1), ha="center", va="center", fontsize=9, color="white",
                        fontweight="bold")
            else:
                ax.add_patch(plt.Rectangle((j, i), 0.94, 0.94, fill=False, hatch="///", edgecolor=INK, lw=0.5))
    xs = [j + 0.47 for i, j in order]
    ys = [i + 0.47 for i, j in order]
    ax.plot(xs, ys, color=PALETTE[1], lw=1.0, alpha=0.8, zorder=2)
    # the output column: how often each O_i makes a round trip to HBM
    x_o = n_k_blocks + 0.35
    for i in range(n_q_blocks):
        ax.add_patch(plt.Rectangle((x_o, i), 0.94, 0.94, color=PALETTE[3], alpha=0.3))
        ax.text(x_o + 0.47, i + 0.5, f"r{o_reads[i]}\nw{o_writes[i]}", ha="center", va="center", fontsize=8,
                color=INK)
    ax.text(x_o + 0.47, -0.25, "$O_i$", ha="center", va="bottom", fontsize=9, color=INK)
    for j in range(n_k_blocks):
        ax.text(j + 0.47, -0.25, f"$K_{{{j}}}$ r{k_reads[j]}", ha="center", va="bottom", fontsize=7.5, color=INK)
    for i in range(n_q_blocks):
        ax.text(-0.15, i + 0.47, f"$Q_{{{i}}}$", ha="right", va="center", fontsize=9, color=INK)
    ax.set_xlim(-0.9, n_k_blocks + 1.4)
    ax.set_ylim(n_q_blocks + 0.1, -0.9)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=10, color=INK)


def loop_order_figure(n_q_blocks: int = 4, n_k_blocks: int = 4, causal: bool = False):
    """Side by side, the score tiles ``S_ij`` in the order FlashAttention-1 (outer loop over K/V
    blocks) and FlashAttention-2 (outer loop over query blocks) visit them, numbered and joined
    by a path; hatched tiles are skipped (causal). The right column counts how often each output
    block ``O_i`` is read (r) and written (w) in HBM, the top row how often each ``K_j`` (and
    likewise ``V_j``) is read. Returns the ``Figure``."""
    for name, val in (("n_q_blocks", n_q_blocks), ("n_k_blocks", n_k_blocks)):
        if isinstance(val, bool) or not isinstance(val, int) or not 1 <= val <= 16:
            raise ValueError(f"{name} must be an integer from 1 to 16 (a readable diagram), got {val!r}")
    width = 8.6
    unit = (width / 2 - 0.3) / (n_k_blocks + 2.3)             # inches per tile, set by the width
    fig, axes = subplots(1, 2, figsize=(width, unit * (n_q_blocks + 1.0) + 0.8))
    mask = ", causal" if causal else ""
    _draw_order(axes[0], "flash1", n_q_blocks, n_k_blocks, causal,
                f"FlashAttention-1 order{mask}: outer loop over $K_j, V_j$")
    _draw_order(axes[1], "flash2", n_q_blocks, n_k_blocks, causal,
                f"FlashAttention-2 order{mask}: outer loop over $Q_i$")
    return fig


def hbm_traffic_figure(d: int = 64, sram_kib=(64, 227), ns=None, elem_bytes: int = 2):
    """HBM traffic (bytes, one head) against sequence length ``N`` on log-log axes: the standard
    algorithm, and FlashAttention in both loop orders for SRAM sizes of ``sram_kib`` KiB (tiles
    sized by ``io_complexity.block_sizes_for_sram``). The default sizes are the shared memory one
    thread block may use on a T4 and on an H100/H200 (``flashtut.hardware.GPUS``). Returns the
    ``Figure``."""
    if ns is None:
        ns = [2 ** p for p in range(9, 15)]
    if not sram_kib:
        raise ValueError("sram_kib must name at least one SRAM size in KiB, got an empty sequence")
    fig, ax = subplots(figsize=(6.6, 4.2))
    std = [io.hbm_traffic("standard", n, d, elem_bytes=elem_bytes).bytes for n in ns]
    ax.plot(ns, std, "o-", color=PALETTE[3], lw=2, label="standard: $\\Theta(Nd + N^2)$")
    for c, kib in enumerate(sram_kib):
        m_elems = kib * 1024 // elem_bytes
        colour = PALETTE[[0, 2, 4, 5][c % 4]]
        for alg, style in (("flash2", "s-"), ("flash1", "^--")):
            y = [io.hbm_traffic(alg, n, d, m_elems, elem_bytes=elem_bytes).bytes for n in ns]
            label = f"{'FA-2' if alg == 'flash2' else 'FA-1'} order, M = {kib} KiB"
            ax.plot(ns, y, style, color=colour, ms=4, lw=1.4, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("HBM bytes moved (one head)")
    ax.set_title(f"HBM traffic, d = {d}, {8 * elem_bytes}-bit elements", loc="left")
    ax.legend(fontsize=8)
    return fig


def memory_vs_n_figure(ns, measured: dict, title: str = "peak extra memory of one call"):
    """Measured memory against ``N`` on log-log axes, one line per entry of ``measured``
    (``{label: [bytes per N]}``, ``None`` for a size that ran out of memory), with guides of
    slope 2 (quadratic, dashed) through the first point of the first series and slope 1 (linear,
    dotted) through the first point of the last series.
    Returns the ``Figure``."""
    ns = list(ns)
    if len(ns) < 2 or not measured:
        raise ValueError(f"need at least two sizes and one series, got {len(ns)} sizes and {len(measured)} series")
    for label, ys in measured.items():
        if len(ys) != len(ns):
            raise ValueError(f"series {label!r} has {len(ys)} values for {len(ns)} sizes")
    fig, ax = subplots(figsize=(6.4, 4.0))
    for c, (label, ys) in enumerate(measured.items()):
        pts = [(n, y / 2 ** 20) for n, y in zip(ns, ys) if y]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=PALETTE[c % len(PALETTE)], lw=2, label=label)
    series = list(measured.values())
    for power, style, ys in ((2, "--", series[0]), (1, ":", series[-1])):
        anchor = next(((n, y / 2 ** 20) for n, y in zip(ns, ys) if y), None)
        if anchor is not None:
            n0, y0 = anchor
            ax.plot(ns, [y0 * (n / n0) ** power for n in ns], style, color=INK, lw=0.9,
                    label=f"∝ N{'²' if power == 2 else ''} (guide)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("MiB")
    ax.set_title(title, loc="left")
    ax.legend(fontsize=8)
    return fig


def _draw_backward_panel(ax, n_q_blocks: int, n_k_blocks: int, causal: bool, chosen, along: str,
                         colour: str, title: str, note: str):
    """One panel of :func:`backward_dataflow_figure`: the tile grid, the column (``along="col"``)
    or row (``"row"``) ``chosen`` filled, the tiles a causal mask hides hatched."""
    for i in range(n_q_blocks):
        for j in range(n_k_blocks):
            if causal and j > i:
                ax.add_patch(plt.Rectangle((j, i), 0.94, 0.94, fill=False, hatch="///", edgecolor=INK, lw=0.5))
                continue
            on = (j == chosen) if along == "col" else (i == chosen)
            ax.add_patch(plt.Rectangle((j, i), 0.94, 0.94, color=colour if on else "#DDDDDD",
                                       alpha=0.9 if on else 1.0))
            if on:
                ax.text(j + 0.47, i + 0.5, f"$S_{{{i}{j}}}$", ha="center", va="center", fontsize=11,
                        color="white", fontweight="bold")
    for j in range(n_k_blocks):
        ax.text(j + 0.47, -0.2, f"$K_{{{j}}}, V_{{{j}}}$", ha="center", va="bottom", fontsize=10, color=INK)
    for i in range(n_q_blocks):
        ax.text(-0.15, i + 0.47, f"$Q_{{{i}}}$", ha="right", va="center", fontsize=11, color=INK)
    ax.text(n_k_blocks / 2, n_q_blocks + 0.25, note, ha="center", va="top", fontsize=10.5, color=INK)
    ax.set_xlim(-0.9, n_k_blocks + 0.6)
    ax.set_ylim(n_q_blocks + 1.05, -0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title, fontsize=12, color=INK)


def backward_dataflow_figure(n_q_blocks: int = 5, n_k_blocks: int = 5, causal: bool = True,
                             key_block: int = 1, query_block: int = 3):
    """What feeds the backward's outputs, on the grid of score tiles ``S_ij`` (hatched: hidden by
    a causal mask, never computed). Left: ``dK_j`` and ``dV_j`` of key block ``key_block`` sum a
    column of tiles, which one thread block walks while it keeps them on chip. Right: ``dQ_i`` of
    query block ``query_block`` sums a row of tiles, each computed by a different key block's
    thread block. Returns the ``Figure``."""
    for name, val, hi in (("n_q_blocks", n_q_blocks, 12), ("n_k_blocks", n_k_blocks, 12),
                          ("key_block", key_block, n_k_blocks - 1), ("query_block", query_block, n_q_blocks - 1)):
        low = 0 if name.endswith("_block") else 1
        if isinstance(val, bool) or not isinstance(val, int) or not low <= val <= hi:
            raise ValueError(f"{name} must be an integer from {low} to {hi}, got {val!r}")
    width = 8.6
    unit = (width / 2 - 0.3) / (n_k_blocks + 1.5)
    fig, axes = subplots(1, 2, figsize=(width, unit * (n_q_blocks + 1.65) + 0.45))
    _draw_backward_panel(axes[0], n_q_blocks, n_k_blocks, causal, key_block, "col", PALETTE[0],
                         f"$dK_{{{key_block}}}, dV_{{{key_block}}}$: a column of tiles",
                         "one thread block, accumulators on chip,\nwritten once")
    _draw_backward_panel(axes[1], n_q_blocks, n_k_blocks, causal, query_block, "row", PALETTE[3],
                         f"$dQ_{{{query_block}}}$: a row of tiles",
                         "one tile from each key block's thread block:\natomic adds, or a second pass")
    return fig

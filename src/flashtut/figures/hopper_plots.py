"""Figures of chapter 11 (Hopper): how the wgmma accumulator becomes the A operand of the next
wgmma, and the ring of shared-memory stages that TMA fills and mbarriers guard. Every function
takes the numbers to draw (computed by ``flashtut.cuda.models.hopper_layout``) and returns a Figure."""
from __future__ import annotations

from matplotlib.patches import Rectangle

from .cuda_plots import _grid, _lane_color
from .style import INK, PALETTE, subplots


def accumulator_to_a_fragment(acc_labels, a_labels, threads):
    """Two grids, one above the other: who holds each element of a block of the S accumulator
    (``acc_labels[r][c]``, e.g. ``"T5\\ns3"``), and of the A operand of the P V wgmma
    (``a_labels``); ``threads[r][c]`` colours both by thread. Same colours in the same places: P
    never leaves the registers. The grids take the labels' shape (the book draws rows 0-7 of warp
    0, keys 0-15: few enough cells for labels of 9 points at the column's width)."""
    rows, cols = len(threads), len(threads[0]) if threads else 0
    if rows == 0 or cols == 0 or any(len(r) != cols for r in (*acc_labels, *a_labels, *threads)) \
            or len(acc_labels) != rows or len(a_labels) != rows:
        raise ValueError("acc_labels, a_labels and threads must be non-empty grids of one shape")
    fig, axes = subplots(2, 1, figsize=(6.6, 1.0 + 0.8 * rows))
    colors = [[_lane_color(t) for t in row] for row in threads]
    for ax, labels, title in ((axes[0], acc_labels, "S accumulator of m64nNk16: thread T, register s[i]"),
                              (axes[1], a_labels, "A operand of the P V wgmma: thread T, register a[j]")):
        _grid(ax, rows, cols, colors, labels, fontsize=10)
        ax.set_xlim(0, cols)
        ax.set_ylim(0, rows)
        ax.axis("off")
        ax.set_title(title, fontsize=10)
    return fig


def stage_ring(slots, stages: int):
    """The ring of ``stages`` shared-memory buffers of a TMA pipeline: one row per buffer, one column
    per tile, ``slots[i] = (stage, parity)`` of tile ``i`` marked in its buffer's row with the
    mbarrier phase parity the consumer waits on."""
    n = len(slots)
    fig, ax = subplots(figsize=(min(1.0 + 0.75 * n, 6.6), 1.0 + 0.75 * stages))
    for i, (stage, parity) in enumerate(slots):
        y = stages - 1 - stage
        ax.add_patch(Rectangle((i, y), 0.92, 0.85, facecolor=PALETTE[stage % len(PALETTE)], edgecolor=INK,
                               linewidth=0.5, alpha=0.9 if parity == 0 else 0.45, hatch=None if parity == 0 else "//"))
        ax.text(i + 0.46, y + 0.42, f"tile {i}\nparity {parity}", ha="center", va="center", fontsize=9,
                color="black")
    ax.set_xlim(-0.1, n)
    ax.set_ylim(-0.1, stages)
    ax.set_yticks([stages - 1 - s + 0.42 for s in range(stages)], [f"stage {s}" for s in range(stages)], fontsize=10)
    ax.set_xticks([])
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.grid(False)
    ax.set_title(f"{stages} stages: tile i goes to stage i mod {stages}; "
                 f"its phase parity is (i div {stages}) mod 2", fontsize=10)
    return fig

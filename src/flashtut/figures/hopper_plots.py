"""Figures of chapter 11 (Hopper): how the wgmma accumulator becomes the A operand of the next
wgmma, and the ring of shared-memory stages that TMA fills and mbarriers guard. Every function
takes the numbers to draw (computed by ``flashtut.cuda.models.hopper_layout``) and returns a Figure."""
from __future__ import annotations

from matplotlib.patches import Rectangle

from .cuda_plots import _grid, _lane_color
from .style import INK, PALETTE, subplots


def accumulator_to_a_fragment(acc_labels, a_labels, threads):
    """Two 16 x 16 grids side by side: who holds each element of the first 16 columns of warp 0's
    rows of the S accumulator (``acc_labels[r][c]``, e.g. ``"T5\\ns3"``), and of the A operand of
    the P V wgmma (``a_labels``); ``threads[r][c]`` colours both by thread. Same colours in the
    same places: P never leaves the registers."""
    fig, axes = subplots(1, 2, figsize=(10.5, 5.4))
    colors = [[_lane_color(t) for t in row] for row in threads]
    for ax, labels, title in ((axes[0], acc_labels, "S accumulator of m64nNk16: thread, register s[i]"),
                              (axes[1], a_labels, "A operand of the P V wgmma: thread, register a[j]")):
        _grid(ax, 16, 16, colors, labels, fontsize=4.2)
        ax.set_xlim(0, 16)
        ax.set_ylim(0, 16)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title, fontsize=9)
    fig.suptitle("warp 0 (rows 0-15), keys 0-15: s[i], s[i+1] packed in pairs are a[0..3]", color=INK)
    return fig


def stage_ring(slots, stages: int):
    """The ring of ``stages`` shared-memory buffers of a TMA pipeline: one row per buffer, one column
    per tile, ``slots[i] = (stage, parity)`` of tile ``i`` marked in its buffer's row with the
    mbarrier phase parity the consumer waits on."""
    n = len(slots)
    fig, ax = subplots(figsize=(min(1.0 + 0.7 * n, 11), 0.9 + 0.6 * stages))
    for i, (stage, parity) in enumerate(slots):
        y = stages - 1 - stage
        ax.add_patch(Rectangle((i, y), 0.92, 0.85, facecolor=PALETTE[stage % len(PALETTE)], edgecolor=INK,
                               linewidth=0.5, alpha=0.9 if parity == 0 else 0.45, hatch=None if parity == 0 else "//"))
        ax.text(i + 0.46, y + 0.42, f"tile {i}\nparity {parity}", ha="center", va="center", fontsize=6,
                color="black")
    ax.set_xlim(-0.1, n)
    ax.set_ylim(-0.1, stages)
    ax.set_yticks([stages - 1 - s + 0.42 for s in range(stages)], [f"stage {s}" for s in range(stages)], fontsize=7)
    ax.set_xticks([])
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.grid(False)
    ax.set_title(f"{stages} stages: tile i goes to stage i mod {stages}; "
                 f"its barrier's phase parity is (i div {stages}) mod 2", fontsize=9)
    return fig

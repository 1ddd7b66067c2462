"""Figures of chapter 08 (CUDA): who holds which data, the mma fragment layout, the swizzle, and
the fast kernel against SDPA flash (from ``flashtut.bench`` speed rows). Every function returns a
matplotlib Figure drawn in the book's style."""
from __future__ import annotations

import numpy as np
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..cuda.models import mma_layout
from .style import INK, PALETTE, subplots


def _grid(ax, rows, cols, colors, labels=None, x0=0.0, y0=0.0, fontsize=6):
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((x0 + c, y0 + rows - 1 - r), 1, 1, facecolor=colors[r][c],
                                   edgecolor=INK, linewidth=0.4))
            if labels is not None and labels[r][c]:
                ax.text(x0 + c + 0.5, y0 + rows - 0.5 - r, labels[r][c], ha="center", va="center",
                        fontsize=fontsize, color="black")


def _lane_color(lane: int) -> str:
    # the 4 lanes of one group share a hue family: neighbours in a row stay distinguishable
    return PALETTE[(lane // 4) % len(PALETTE)]


def _fragment(ax, cols: int, places, title: str) -> None:
    """One fragment of 16 rows and ``cols`` columns: ``places`` yields (row, column, lane, register)."""
    colors = [[None] * cols for _ in range(16)]
    labels = [[""] * cols for _ in range(16)]
    for r, c, lane, reg in places:
        colors[r][c] = _lane_color(lane)
        labels[r][c] = f"T{lane}\n{reg}"
    _grid(ax, 16, cols, colors, labels, fontsize=4.2)
    ax.set_title(title)


def mma_fragment_layout():
    """Which lane holds which element of the A (16x16), B (16x8) and C (16x8) fragments of
    ``mma.sync.m16n8k16``; labels are lane (T) and register (a/b/c index)."""
    fig, axes = subplots(1, 3, figsize=(11, 4.4), gridspec_kw={"width_ratios": [16, 8, 8]})
    # the fragment tables are flashtut.cuda.models.mma_layout's (the PTX ISA's)
    lanes = range(32)
    _fragment(axes[0], 16, ((*mma_layout.a_element(t, reg, e), t, f"a{reg}") for t in lanes for reg in range(4)
                            for e in range(2)), "A = Q or P (16 rows x 16 k)")
    _fragment(axes[1], 8, ((*mma_layout.b_element(t, reg, e), t, f"b{reg}") for t in lanes for reg in range(2)
                           for e in range(2)), "B = K^T or V (16 k x 8 n)")
    _fragment(axes[2], 8, ((*mma_layout.c_element(t, i), t, f"c{i}") for t in lanes for i in range(4)),
              "C = S or O (16 x 8, float32)")
    for ax, w in zip(axes, (16, 8, 8)):
        ax.set_xlim(0, w)
        ax.set_ylim(0, 16)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle("mma.sync.m16n8k16: lane T = 4 g + t holds these elements (g = row group, t = pair)",
                 color=INK)
    return fig


def thread_ownership():
    """Who holds what in each ladder step: v1 one thread per query row; v2/v3 one warp per 16
    rows, each lane two rows x a few columns of S and O."""
    fig, axes = subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    for r in range(8):
        ax.add_patch(Rectangle((0, 7 - r), 4, 1, facecolor=PALETTE[r % len(PALETTE)], edgecolor=INK, lw=0.5))
        ax.text(2, 7.5 - r, f"thread {r}: q row, o row, m, l", ha="center", va="center", fontsize=7,
                color="black")
    ax.add_patch(Rectangle((5, 2), 3, 4, facecolor="none", edgecolor=INK, lw=1, hatch="//"))
    ax.text(6.5, 6.4, "K/V tile\n(shared memory)", ha="center", fontsize=8)
    ax.add_patch(FancyArrowPatch((5, 4), (4.1, 4), arrowstyle="->", mutation_scale=12, color=INK))
    ax.text(4.55, 3.2, "same element\nto all threads\n(broadcast)", ha="center", fontsize=6)
    ax.set_xlim(-0.2, 8.4)
    ax.set_ylim(-0.2, 8.4)
    ax.axis("off")
    ax.set_title("v1: one thread per query row")
    ax = axes[1]
    warps = 4
    for w in range(warps):
        ax.add_patch(Rectangle((0, (warps - 1 - w) * 2), 3, 2, facecolor=PALETTE[w], edgecolor=INK, lw=0.5))
        ax.text(1.5, (warps - 1 - w) * 2 + 1, f"warp {w}\n16 query rows", ha="center", va="center",
                fontsize=7, color="black")
    ax.add_patch(Rectangle((4, 6), 4, 2, facecolor="none", edgecolor=INK, lw=0.8))
    ax.text(6, 7, "S = Q K^T: 16 x 64\n32 floats per lane", ha="center", va="center", fontsize=7)
    ax.add_patch(Rectangle((4, 3), 4, 2, facecolor="none", edgecolor=INK, lw=0.8))
    ax.text(6, 4, "P (16-bit) = A operand\n16 registers per lane", ha="center", va="center", fontsize=7)
    ax.add_patch(Rectangle((4, 0), 4, 2, facecolor="none", edgecolor=INK, lw=0.8))
    ax.text(6, 1, "O: 16 x D\nD/2 floats per lane", ha="center", va="center", fontsize=7)
    for y0, y1 in ((6, 5), (3, 2)):
        ax.add_patch(FancyArrowPatch((6, y0), (6, y1), arrowstyle="->", mutation_scale=12, color=INK))
    ax.add_patch(FancyArrowPatch((3, 7), (4, 7), arrowstyle="->", mutation_scale=12, color=PALETTE[0]))
    ax.set_xlim(-0.2, 8.4)
    ax.set_ylim(-0.2, 8.2)
    ax.axis("off")
    ax.set_title("v2/v3: a warp per 16 rows; S, P, O stay in registers")
    return fig


def swizzle_banks(rows: int = 8, chunks: int = 8):
    """Which 16-byte chunk of shared memory each (row, chunk) lands in, plain and swizzled
    (chunk c of row r stored at c XOR (r mod 8)). One ldmatrix reads one logical chunk column
    of 8 rows: plain, all 8 hit the same 4 banks; swizzled, they spread over all 32."""
    fig, axes = subplots(1, 2, figsize=(9, 3.6))
    for ax, swz, title in ((axes[0], False, "row-major: column 0 = 8-way bank conflict"),
                           (axes[1], True, "swizzled: c' = c XOR (r mod 8), conflict-free")):
        colors = [[None] * chunks for _ in range(rows)]
        labels = [[""] * chunks for _ in range(rows)]
        for r in range(rows):
            for c in range(chunks):
                phys = (c ^ (r % 8)) if swz else c
                colors[r][phys] = PALETTE[c % len(PALETTE)] if c == 0 else "#d9d9d9"
                labels[r][phys] = f"k{8 * c}"
        _grid(ax, rows, chunks, colors, labels, fontsize=6)
        ax.set_xlim(0, chunks)
        ax.set_ylim(0, rows)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(chunks) + 0.5, [f"{4 * c}-{4 * c + 3}" for c in range(chunks)], fontsize=6)
        ax.set_yticks(np.arange(rows) + 0.5, [f"row {rows - 1 - r}" for r in range(rows)], fontsize=6)
        ax.set_xlabel("banks of the 16-byte chunk (128-byte line)")
        ax.tick_params(length=0)
        for s in ax.spines.values():
            s.set_visible(False)
        ax.grid(False)
        ax.set_title(title, fontsize=9)
    return fig


def fast_vs_sdpa(rows, D: int = 128, mode: str = "fwd"):
    """TFLOP/s against N of the fast CUDA kernel and SDPA-flash, for each dtype and causal, from
    ``flashtut.bench`` speed rows of pass ``mode``. Where rows measured a point twice, the first
    counts. (The ladder's bars are ``flashtut.figures.bench_plots.ladder_figure``.)"""
    fig, ax = subplots(figsize=(7, 3.8))
    styles = {"cuda": "-", "sdpa-flash": "--"}
    short = {"float16": "fp16", "bfloat16": "bf16"}
    k = 0
    for dtype in ("float16", "bfloat16"):
        for causal in (False, True):
            for impl, ls in styles.items():
                pts = {}
                for r in rows:
                    if (r.get("impl") == impl and r.get("D") == D and r.get("dtype") == dtype
                            and r.get("causal") == causal and r.get("mode") == mode and r.get("tflops")):
                        pts.setdefault(r["N"], r["tflops"])
                if pts:
                    xs = sorted(pts)
                    ax.plot(xs, [pts[x] for x in xs], ls, marker="o", color=PALETTE[k % len(PALETTE)],
                            label=f"{impl} {short.get(dtype, dtype)}{' causal' if causal else ''}")
            k += 1
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(f"{mode} TFLOP/s")
    ax.set_title(f"fast CUDA kernel (solid) vs SDPA flash (dashed), D = {D}")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    return fig


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def warp_tiles(block_m: int = 64, block_n: int = 64, warps: int = 4, mma_m: int = 16, mma_n: int = 8):
    """The bridge from a Triton ``tl.dot`` to chapter 8: a ``block_m x block_n`` score tile split
    into one strip of rows per warp, and one warp's strip cut into the ``mma_m x mma_n`` tiles of
    ``mma.sync`` (each one instruction per step of k). Returns the ``Figure``."""
    for name, val in (("block_m", block_m), ("block_n", block_n), ("warps", warps), ("mma_m", mma_m),
                      ("mma_n", mma_n)):
        _positive(name, val)
    if block_m % (warps * mma_m) or block_n % mma_n:
        raise ValueError(f"block_m ({block_m}) must be a multiple of warps * mma_m ({warps * mma_m}) "
                         f"and block_n ({block_n}) of mma_n ({mma_n})")
    rows = block_m // warps
    fig, ax = subplots(figsize=(7.0, 4.6))
    for w in range(warps):
        y = block_m - (w + 1) * rows
        ax.add_patch(Rectangle((0, y), block_n, rows, facecolor=PALETTE[w % len(PALETTE)], alpha=0.35,
                               edgecolor=INK, linewidth=1.2))
        ax.text(block_n + 1, y + rows / 2, f"warp {w}: rows {w * rows}..{(w + 1) * rows - 1}",
                va="center", fontsize=10, color=INK)
    y0 = block_m - rows                                    # warp 0's strip, cut into mma tiles
    for r in range(rows // mma_m):
        for c in range(block_n // mma_n):
            ax.add_patch(Rectangle((c * mma_n, y0 + rows - (r + 1) * mma_m), mma_n, mma_m, fill=False,
                                   edgecolor=INK, linewidth=0.6))
    ax.text(mma_n / 2, block_m - mma_m / 2, f"{mma_m}×{mma_n}", ha="center", va="center", fontsize=8,
            color=INK)
    ax.set_xlim(0, block_n * 1.75)
    ax.set_ylim(0, block_m)
    ax.set_aspect("equal")
    ax.set_xticks([0, block_n])
    ax.set_yticks([0, block_m])
    ax.set_xlabel(f"keys of the tile (block_n = {block_n})")
    ax.set_ylabel(f"query rows (block_m = {block_m})")
    ax.grid(False)
    ax.set_title(f"S = Q Kᵀ for one tile: {warps} warps, warp 0 cut into mma.sync "
                 f"m{mma_m}n{mma_n} tiles", loc="left", fontsize=10)
    return fig


def pipeline_timeline(n_tiles: int = 4, stages: int = 2):
    """Load, compute and barrier of the key/value loop, one row per kind of work and one block per
    tile: without overlap (each tile's load waits for the previous tile's compute) and with
    ``stages``-deep ``cp.async`` buffering (tile ``j + 1`` loads while tile ``j`` computes).
    Durations are illustrative: a load as long as the compute of a tile. Returns the ``Figure``."""
    _positive("n_tiles", n_tiles)
    _positive("stages", stages)
    if stages < 2:
        raise ValueError(f"stages must be at least 2 for any overlap, got {stages}")
    load, mm1, soft, mm2 = 1.0, 0.4, 0.3, 0.4
    comp = mm1 + soft + mm2
    fig, axes = subplots(2, 1, figsize=(8.0, 4.2), sharex=True)
    lanes = {"load K_j, V_j (cp.async)": 2, "S = Q K_jᵀ, O += P V_j (mma)": 1, "softmax": 0}
    for ax, overlap in zip(axes, (False, True)):
        t_load_end, comp_ends = [], []
        comp_end = 0.0
        for j in range(n_tiles):
            if overlap:   # a buffer frees when the tile `stages` back has been computed
                free = comp_ends[j - stages] if j >= stages else 0.0
                start = max(t_load_end[j - 1] if j else 0.0, free)
            else:
                start = comp_end
            t_load_end.append(start + load)
            c0 = max(t_load_end[j], comp_end)
            color = PALETTE[j % len(PALETTE)]
            ax.broken_barh([(start, load)], (2 - 0.35, 0.7), facecolors=color, edgecolor=INK, lw=0.5)
            ax.broken_barh([(c0, mm1), (c0 + mm1 + soft, mm2)], (1 - 0.35, 0.7), facecolors=color,
                           edgecolor=INK, lw=0.5)
            ax.broken_barh([(c0 + mm1, soft)], (-0.35, 0.7), facecolors=color, edgecolor=INK, lw=0.5)
            ax.axvline(c0, color=INK, lw=0.6, ls=":")      # __syncthreads: the tile is in shared memory
            ax.text(start + load / 2, 2, f"j={j}", ha="center", va="center", fontsize=9)
            comp_end = c0 + comp
            comp_ends.append(comp_end)
        ax.set_yticks(list(lanes.values()), list(lanes.keys()))
        ax.set_title(("with " + f"{stages}-stage cp.async buffering: the next tile loads during this one's math"
                      if overlap else "no overlap: every load waits for the previous tile's math"),
                     loc="left", fontsize=10)
        ax.set_xlim(0, n_tiles * (load + comp) + 0.2)
        ax.grid(False)
    axes[1].set_xlabel("time (one tile's load = 1; dotted lines: barriers)")
    return fig


def ldmatrix_lanes():
    """``ldmatrix.sync.aligned.m8n8.x4``: which lane gives the shared-memory address of which
    16-byte row of a 16x16 half-precision operand (left), and which lane receives which two
    elements of one 8x8 matrix (right; register ``r_i`` of every lane holds matrix ``i``)."""
    fig, (ax_a, ax_r) = subplots(1, 2, figsize=(10.0, 4.8), gridspec_kw={"width_ratios": [1.35, 1]})
    for m in range(4):                        # matrix m: rows 8*(m % 2).., columns 8*(m // 2)..
        r0, c0 = 8 * (m % 2), 8 * (m // 2)
        for r in range(8):
            lane = 8 * m + r
            ax_a.add_patch(Rectangle((c0, 15 - (r0 + r)), 8, 1, facecolor=PALETTE[m], alpha=0.45,
                                     edgecolor=INK, linewidth=0.5))
            ax_a.text(c0 + 4, 15 - (r0 + r) + 0.5, f"lane {lane} → row {r0 + r}, cols {c0}..{c0 + 7}",
                      ha="center", va="center", fontsize=7, color="black")
        ax_a.text(c0 + 4, 16.4 if m % 2 == 0 else -1.1, f"matrix {m} → r{m}", ha="center",
                  fontsize=9, color=INK)
    ax_a.set_xlim(-0.5, 16.5)
    ax_a.set_ylim(-1.8, 17.2)
    ax_a.set_title("addresses: one 16-byte row per lane", loc="left", fontsize=10)
    ax_r.set_title("delivered: matrix 0 into r0 of each lane", loc="left", fontsize=10)
    for ax in (ax_a, ax_r):
        ax.set_aspect("equal")
        ax.axis("off")
    labels = [[f"T{4 * r + c // 2}" for c in range(8)] for r in range(8)]
    colors = [[_lane_color(4 * r + c // 2) for c in range(8)] for r in range(8)]
    _grid(ax_r, 8, 8, colors, labels, fontsize=7)
    ax_r.set_xlim(-0.2, 8.2)
    ax_r.set_ylim(-0.8, 8.6)
    ax_r.text(4, -0.6, "lane t holds row t / 4, columns 2 (t mod 4) and 2 (t mod 4) + 1",
              ha="center", fontsize=8, color=INK)
    return fig


def backward_dataflow():
    """The backward pass of chapters 6 to 8 as data flow: what each kernel reads from HBM, what it
    recomputes on chip, and what it writes. Returns the ``Figure``."""
    fig, ax = subplots(figsize=(9.0, 5.0))
    ax.axis("off")
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6)

    def box(x, y, w, h, text, color):
        ax.add_patch(Rectangle((x, y), w, h, facecolor=color, alpha=0.3, edgecolor=INK, linewidth=1))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9, color="black")

    def arrow(x0, y0, x1, y1):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=12,
                                     color=INK, linewidth=1))

    ax.text(0.1, 5.7, "HBM", fontsize=10, color=INK, weight="bold")
    ax.text(3.4, 5.7, "on chip, per tile", fontsize=10, color=INK, weight="bold")
    ax.text(8.3, 5.7, "HBM", fontsize=10, color=INK, weight="bold")
    box(0.1, 4.3, 2.2, 1.0, "O, dO", PALETTE[7])
    box(0.1, 2.6, 2.2, 1.2, "Q, K, V, dO,\nlse, Δ", PALETTE[7])
    box(0.1, 0.5, 2.2, 1.2, "Q, K, V, dO,\nlse, Δ", PALETTE[7])
    box(3.2, 4.3, 4.3, 1.0, "preprocess: Δ = rowsum(dO ∘ O)", PALETTE[5])
    box(3.2, 2.2, 4.3, 1.9, "dK, dV kernel (one block per key block)\nP = exp(scale · Q Kᵀ − lse)\n"
        "dV += Pᵀ dO,  dP = dO Vᵀ\ndS = P ∘ (dP − Δ),  dK += scale · dSᵀ Q", PALETTE[0])
    box(3.2, 0.2, 4.3, 1.7, "dQ kernel (one block per query block)\nP, dP, dS recomputed\n"
        "dQ += scale · dS K", PALETTE[1])
    box(8.3, 4.3, 1.6, 1.0, "Δ", PALETTE[7])
    box(8.3, 2.6, 1.6, 1.2, "dK, dV", PALETTE[7])
    box(8.3, 0.5, 1.6, 1.2, "dQ", PALETTE[7])
    for y in (4.8, 3.2, 1.1):
        arrow(2.3, y, 3.2, y)
        arrow(7.5, y, 8.3, y)
    ax.set_title("the backward: Δ first, then two kernels that recompute P from the log-sum-exp",
                 loc="left", fontsize=10)
    return fig

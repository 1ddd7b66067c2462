"""Chapter 14's figures: ring attention's merge across ranks, its schedule as a timeline, and who
computes which part of the causal score matrix under each cut, and the table of its measured
compute path on one GPU. Drawing only: each function takes numbers computed or measured elsewhere
(``flashtut.distributed``, the rows of ``experiments/ring/compute_path.py``) and returns the figure
or the table; none opens a file."""
from __future__ import annotations

from matplotlib.patches import Rectangle

from ..bench.report import SHORT_DTYPE
from .style import INK, PALETTE, subplots


def _rank_color(r: int) -> str:
    return PALETTE[r % len(PALETTE)]


def merge_weights_figure(weights):
    """One stacked bar per rank: the share ``exp(lse_s - lse)`` of one of its query rows' softmax mass
    that the key/value shard of each source rank ``s`` holds (``weights[rank][source]``). The shares
    of a bar sum to 1; they are the weights the merge gives each partial output."""
    world = len(weights)
    fig, ax = subplots(figsize=(6.4, 3.0))
    for r, row in enumerate(weights):
        bottom = 0.0
        for s, w in enumerate(row):
            if w > 0:
                ax.bar(r, w, bottom=bottom, color=_rank_color(s), edgecolor=INK, linewidth=0.6,
                       label=f"K/V of rank {s}" if r == 0 or all(x[s] == 0 for x in weights[:r]) else None)
                if w > 0.08:
                    ax.text(r, bottom + w / 2, f"{w:.2f}", ha="center", va="center", fontsize=9, color="black")
            bottom += w
    ax.set_xticks(range(world), [f"rank {r}" for r in range(world)])
    ax.set(ylabel="share of the row's softmax", ylim=(0, 1.05), title="one query row per rank: merge weights")
    ax.grid(False)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9)
    return fig


def ring_timeline_figure(work, comm: float):
    """The ring as a timeline: one lane per rank, a box per step (its length the step's work, its
    label the rank whose K/V it holds), and under it the transfer of that K/V on to the next rank
    (length ``comm``), which starts with the step. A step starts when the rank has finished the
    previous one and the K/V it needs has arrived.

    ``work[r]`` is the list of ``(source, work)`` of rank ``r``'s steps, in order."""
    world = len(work)
    start = [[0.0] * world for _ in range(world)]
    end = [[0.0] * world for _ in range(world)]
    for t in range(world):
        for r in range(world):
            ready = end[r][t - 1] if t else 0.0
            if t:     # the shard of step t left rank r - 1 when that rank began step t - 1
                ready = max(ready, start[(r - 1) % world][t - 1] + comm)
            start[r][t] = ready
            end[r][t] = ready + work[r][t][1]
    fig, ax = subplots(figsize=(7.2, 0.75 * world + 1.0))
    for r in range(world):
        y = world - 1 - r
        for t, (src, w) in enumerate(work[r]):
            ax.add_patch(Rectangle((start[r][t], y + 0.42), w, 0.5, facecolor=_rank_color(src), edgecolor=INK,
                                   linewidth=0.6, alpha=0.9))
            ax.text(start[r][t] + w / 2, y + 0.67, f"K/V {src}", ha="center", va="center", fontsize=8, color="black")
            if t < world - 1:
                ax.add_patch(Rectangle((start[r][t], y + 0.1), comm, 0.22, facecolor="white", edgecolor=INK,
                                       linewidth=0.6, hatch="///"))
    total = max(max(e) for e in end)
    ax.set_yticks([world - 1 - r + 0.5 for r in range(world)], [f"rank {r}" for r in range(world)])
    ax.set_xlim(0, total * 1.02)
    ax.set_ylim(0, world)
    ax.set_xlabel("time (units of one step's work)")
    ax.grid(False)
    ax.tick_params(axis="y", length=0)
    handles = [Rectangle((0, 0), 1, 1, facecolor="white", edgecolor=INK, hatch="///",
                         label="sending this K/V on to the next rank")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), fontsize=9)
    return fig


def owner_figure(panels):
    """The causal score matrix coloured by the rank that computes each pair (the rank holding the
    query), one panel per cut. ``panels`` is a list of ``(title, owner, work)``: ``owner[i]`` the
    rank holding sequence position ``i``, ``work`` the tiles per rank, written under the panel."""
    import numpy as np
    from matplotlib.colors import ListedColormap

    fig, axes = subplots(1, len(panels), figsize=(3.3 * len(panels), 3.6))
    axes = np.atleast_1d(axes)
    for ax, (title, owner, work) in zip(axes, panels):
        n = len(owner)
        world = max(owner) + 1
        grid = np.full((n, n), np.nan)
        for i, r in enumerate(owner):
            grid[i, : i + 1] = r
        cmap = ListedColormap([_rank_color(r) for r in range(world)])
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=world - 0.5, interpolation="nearest")
        ax.set_title(title, fontsize=11)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        ax.set_xlabel("keys ->\ntiles per rank: " + ", ".join(str(w) for w in work), fontsize=9)
        ax.set_ylabel("<- queries", fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, facecolor=_rank_color(r), label=f"rank {r}") for r in range(world)]
    fig.legend(handles=handles, loc="outside lower center", ncol=world, fontsize=9)
    return fig


#: the rows ``experiments/ring/compute_path.py`` writes for the ring's steps: ``ring-compute-w<world>``
RING_COMPUTE_PREFIX = "ring-compute-w"


def ring_compute_table(rows):
    """(header, body) of chapter 14's measured table for ``flashtut.notebook.show_table``: the ring's
    compute path on one GPU. One line per case (dtype, N, full or causal mask), one column per world
    size; each cell is the unsharded kernel's time over the time of every rank's kernels and merges,
    ``forward / backward`` (1.00: splitting the sequence costs nothing; ``-`` where a mode was not
    measured). ``rows``: speed rows of ``experiments/ring/compute_path.py`` (``impl``
    ``ring-compute-w<world>`` with ``vs_unsharded``); other rows are ignored. Cases sort float16
    before bfloat16, then by N, then full before causal."""
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"rows: expected a list of result rows (dicts), got {type(rows).__name__}")
    ratio = {}
    for r in rows:
        if not isinstance(r, dict):
            raise TypeError(f"rows: expected dicts, got an element of type {type(r).__name__}")
        if str(r.get("impl", "")).startswith(RING_COMPUTE_PREFIX) and r.get("vs_unsharded") is not None:
            ratio[(r["dtype"], r["N"], bool(r["causal"]), r["world"], r["mode"])] = r["vs_unsharded"]
    if not ratio:
        raise ValueError(f"rows: none is a ring compute row (impl '{RING_COMPUTE_PREFIX}<world>' with "
                         "vs_unsharded); pass the rows of experiments/ring/compute_path.py")
    order = {"float16": 0, "bfloat16": 1}
    cases = sorted({key[:3] for key in ratio}, key=lambda c: (order.get(c[0], 2), c[0], c[1], c[2]))
    worlds = sorted({key[3] for key in ratio})

    def cell(case, world):
        pair = [ratio.get((*case, world, mode)) for mode in ("fwd", "bwd")]
        return " / ".join("-" if x is None else f"{x:.2f}" for x in pair)

    body = [[f"{SHORT_DTYPE.get(c[0], c[0])}, {c[1] // 1024}k, {'causal' if c[2] else 'full'}"]
            + [cell(c, w) for w in worlds] for c in cases]
    return ["dtype, N, mask"] + [f"{w} ranks" for w in worlds], body


__all__ = ["merge_weights_figure", "ring_timeline_figure", "owner_figure", "ring_compute_table"]

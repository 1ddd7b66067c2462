"""Timelines of rung W3's schedule (chapter 11): the ping-pong of two consumer warpgroups on the
tensor cores, and the pipeline inside one warpgroup.

The order of the work is not drawn by hand: :func:`schedule` plays the operations that
``flashtut.cuda.models.hopper_schedule`` lists for the kernel (``producer_ops`` and ``consumer_ops``, the
same generators its barrier checker runs) with a duration for each, so the figure and the model of
the kernel cannot drift apart. The durations are a model of one 64 x 128 tile at head dim 128 on
one SM, in cycles: each product 512 (2 * 64 * 128 * 128 FLOP at 4096 FLOP per cycle), the softmax
of a tile a little more than its 8192 exponentials at 16 per cycle, a TMA copy of a tile 300. The
tensor cores run one product at a time in the order they were issued; a warpgroup's softmax runs
on its own threads; the copies go one after another.
"""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import Rectangle

from .style import INK, PALETTE, subplots

#: cycles of each kind of work in the model (see the module docstring)
DURATIONS = {"S": 512, "PV": 512, "softmax": 640, "rescale+pack": 64, "load": 300}


@dataclass(frozen=True)
class Span:
    """One piece of work on one lane: ``lane`` is ``"tma"``, ``"tensor"`` or ``("softmax", cw)``;
    ``who`` the consumer warpgroup (None for the producer); ``label`` e.g. ``"S2"``, ``"PV1"``,
    ``"softmax S2"``, ``"K1"``."""
    lane: object
    start: float
    end: float
    label: str
    who: int | None


def schedule(n_tiles: int, my_tiles: tuple[int, ...], stages: int = 2, durations: dict | None = None
             ) -> list[Span]:
    """The spans of one block of rung W3 with ``my_tiles[cw]`` of the block's ``n_tiles`` key tiles
    per consumer warpgroup, played in time from ``hopper_schedule``'s operations: an event-driven
    run in which each operation starts as soon as what it waits for is done (an mbarrier phase, a
    named barrier's generation, the wgmma groups a ``wait_group`` names)."""
    from ..cuda.models import hopper_schedule as hs

    if not isinstance(n_tiles, int) or n_tiles < 1:
        raise ValueError(f"n_tiles must be a positive integer, got {n_tiles!r}")
    if not isinstance(my_tiles, tuple) or len(my_tiles) not in (2, 3) or not all(
            isinstance(t, int) and 0 <= t <= n_tiles for t in my_tiles):
        raise ValueError(f"my_tiles must be a tuple of 2 or 3 counts in 0..n_tiles, got {my_tiles!r}")
    if not isinstance(stages, int) or stages < 2:
        raise ValueError(f"stages must be an integer of at least 2, got {stages!r}")
    dur = {**DURATIONS, **(durations or {})}
    consumers = range(len(my_tiles))
    procs = {"producer": hs.producer_ops(n_tiles, stages)}
    for cw in consumers:
        procs[cw] = hs.consumer_ops(cw, n_tiles, my_tiles[cw], stages, len(my_tiles))
    nxt = {name: next(gen, None) for name, gen in procs.items()}
    clock = {name: 0.0 for name in procs}
    done = {}           # mbarrier -> completion time of each phase
    pending = {}        # mbarrier -> (arrivals still due in the phase, latest arrival)
    counts = {"q_full": 1, **{f"{k}_full{s}": 1 for k in "kv" for s in range(stages)},
              **{f"{k}_empty{s}": len(my_tiles) * hs.WARPS for k in "kv" for s in range(stages)}}
    named = {}          # named barrier id -> [(who, time, waits)] of the generation in progress
    blocked = set()     # consumers inside bar.sync
    groups = {cw: [] for cw in consumers}
    free = {"tensor": 0.0, "tma": 0.0}
    spans = []

    def arrive(bar, n, t):
        due, latest = pending.get(bar, (counts[bar], 0.0))
        due, latest = due - n, max(latest, t)
        if due == 0:
            done.setdefault(bar, []).append(latest)
            due, latest = counts[bar], 0.0
        pending[bar] = (due, latest)

    def start_time(name, op):
        # when ``op`` can start, or None while what it waits for has not happened
        t = clock[name]
        if op[0] == "wait":
            phases = done.get(op[1], [])
            return max(t, phases[op[3]]) if len(phases) > op[3] else None
        if op[0] == "wgmma_wait":
            ends = [end for _, end in groups[name][:max(0, len(groups[name]) - op[1])]]
            return max([t, *ends])
        return t

    while any(op is not None for op in nxt.values()):
        ready = [(start_time(n, op), str(n), n) for n, op in nxt.items()
                 if op is not None and n not in blocked and start_time(n, op) is not None]
        if not ready:
            raise RuntimeError("the schedule stalled: every process waits (hopper_schedule's checker "
                               "would report this deadlock)")
        t, _, name = min(ready)
        op = nxt[name]
        kind = op[0]
        if kind == "load":
            start = max(t, free["tma"])
            free["tma"] = end = start + dur["load"]
            spans.append(Span("tma", start, end, op[2][0] + str(op[3]), None))
            arrive(op[1], 1, end)
        elif kind == "arrive":
            arrive(op[1], op[2], t)
        elif kind in ("sync", "bar_arrive"):
            gen = named.setdefault(op[1], [])
            gen.append((name, t, kind == "sync"))
            if kind == "sync":
                blocked.add(name)
            if len(gen) == 2:            # 256 threads: two warpgroups
                release = max(when for _, when, _ in gen)
                for who, _, waits in gen:
                    if waits:
                        blocked.discard(who)
                        clock[who] = release
                del named[op[1]]
        elif kind == "issue":
            work = "S" if op[1].startswith("S") else "PV"
            start = max(t, free["tensor"])
            free["tensor"] = end = start + dur[work]
            groups[name].append((op[1], end))
            spans.append(Span("tensor", start, end, op[1], name))
        elif kind == "wgmma_wait":
            del groups[name][:max(0, len(groups[name]) - op[1])]
        elif kind == "regs" and op[1] != "store":
            work = "softmax" if op[1].startswith("softmax") else op[1]
            spans.append(Span(("softmax", name), t, t + dur[work], op[1], name))
            t += dur[work]
        if name not in blocked:
            clock[name] = max(clock[name], t)
        nxt[name] = next(procs[name], None)
    return spans


def _draw(ax, spans, lanes, colors):
    ys = {lane: len(lanes) - 1 - i for i, (lane, _) in enumerate(lanes)}
    for sp in spans:
        if sp.lane not in ys:
            continue
        y = ys[sp.lane]
        color = colors.get(sp.who, "#999999")
        pv = sp.label.startswith("PV")
        soft = sp.lane != "tensor" and sp.lane != "tma"
        ax.add_patch(Rectangle((sp.start, y + 0.12), sp.end - sp.start, 0.76, facecolor=color,
                               edgecolor=INK, linewidth=0.6, alpha=0.55 if (pv or soft) else 0.95,
                               hatch="///" if pv else None))
        if sp.end - sp.start >= 250:     # softmax lanes: the tile alone ("S2": softmax(S2))
            ax.text((sp.start + sp.end) / 2, y + 0.5, _pretty(sp.label.replace("softmax ", "")),
                    ha="center", va="center", fontsize=10, color="black")
    ax.set_yticks([ys[lane] + 0.5 for lane, _ in lanes], [name for _, name in lanes], fontsize=10)
    ax.tick_params(axis="x", labelsize=10)
    ax.set_ylim(0, len(lanes))
    ax.set_xlim(0, max(sp.end for sp in spans) * 1.01)
    ax.grid(False)
    ax.tick_params(axis="y", length=0)
    for side in ("left", "top", "right"):
        ax.spines[side].set_visible(False)


def _pretty(label: str) -> str:
    # "S2" -> "S$_2$", "PV1" -> "P$_1$V$_1$"
    for head in ("PV", "S", "K", "V", "Q"):
        if label.startswith(head) and label[len(head):].isdigit():
            j = label[len(head):]
            return f"P$_{j}$V$_{j}$" if head == "PV" else f"{head}$_{j}$"
    return label


def pingpong_figure(n_tiles: int = 3):
    """Two consumer warpgroups of W3 over ``n_tiles`` key tiles: the producer's TMA copies on their
    own lane, the tensor cores running one warpgroup's products while the other computes its
    softmax (solid: S = Q K^T, hatched: P V), each warpgroup's softmax on its lane (a box "S2" there
    is softmax(S2))."""
    spans = schedule(n_tiles, (n_tiles, n_tiles))
    colors = {0: PALETTE[0], 1: PALETTE[1], None: "#999999"}
    lanes = [("tma", "TMA copies\n(producer)"), ("tensor", "tensor cores"),
             (("softmax", 0), "consumer 0:\nsoftmax of"), (("softmax", 1), "consumer 1:\nsoftmax of")]
    fig, ax = subplots(figsize=(6.6, 3.4))
    _draw(ax, spans, lanes, colors)
    ax.set_xlabel("cycles (model: 64 x 128 tiles, head dim 128)", fontsize=10)
    handles = [Rectangle((0, 0), 1, 1, facecolor=PALETTE[0], edgecolor=INK, label="consumer 0"),
               Rectangle((0, 0), 1, 1, facecolor=PALETTE[1], edgecolor=INK, label="consumer 1"),
               Rectangle((0, 0), 1, 1, facecolor="white", edgecolor=INK, hatch="///", label="P V (hatched)")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=3, fontsize=10)
    return fig


def intra_warpgroup_figure(n_tiles: int = 4):
    """One consumer warpgroup of W3 working alone (the other has no rows of the block): in each slot it issues
    S_j together with P_{j-1} V_{j-1}, waits for S_j only, and computes softmax(S_j) while
    P_{j-1} V_{j-1} is still on the tensor cores."""
    spans = schedule(n_tiles, (n_tiles, 0))
    colors = {0: PALETTE[0], None: "#999999"}
    lanes = [("tma", "TMA copies\n(producer)"), ("tensor", "tensor cores"),
             (("softmax", 0), "consumer 0:\nsoftmax of")]
    fig, ax = subplots(figsize=(6.6, 2.8))
    _draw(ax, spans, lanes, colors)
    ax.set_xlabel("cycles (model: 64 x 128 tiles, head dim 128)", fontsize=10)
    # bracket each overlap of a softmax with the previous tile's P V
    ax.text(0.0, 1.02, "<->  softmax(S$_j$) runs while P$_{j-1}$V$_{j-1}$ is on the tensor cores",
            transform=ax.transAxes, fontsize=10, va="bottom", color=INK)
    for sp in spans:
        if sp.lane == ("softmax", 0) and sp.label.startswith("softmax"):
            pv = next((p for p in spans if p.lane == "tensor" and p.label.startswith("PV")
                       and p.start < sp.end and p.end > sp.start), None)
            if pv is not None:
                lo, hi = max(sp.start, pv.start), min(sp.end, pv.end)
                ax.annotate("", xy=(lo, 1.02), xytext=(hi, 1.02),
                            arrowprops={"arrowstyle": "<->", "color": INK, "lw": 1.0})
    return fig

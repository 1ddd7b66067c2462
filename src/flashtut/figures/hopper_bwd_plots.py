"""Figures of chapter 11b (the backward on Hopper): the steps of one query block, in the order a rung
issues them, on the unit that runs each, with an arrow from every step to each step that waits for it.
The functions take the steps, dependencies and orders (``flashtut.cuda.models.hopper_bwd``) and return a
Figure."""
from __future__ import annotations

from matplotlib.patches import FancyBboxPatch

from .style import INK, PALETTE, subplots

#: the lanes, top to bottom: the unit each step runs on (shared-memory stores and the barrier share one)
LANES = (("tma", "TMA, stage"), ("tensor", "tensor cores"), ("registers", "registers"),
         ("shared", "shared memory"), ("global", "global memory"))
_LANE_OF = {"tma": 0, "tensor": 1, "registers": 2, "shared": 3, "barrier": 3, "global": 4}


def _label(name: str) -> str:
    # two short lines fit a box a column wide; "^T" as a transpose sign
    return name.replace(" ", "\n", 1).replace("^T", r"$^\top$")


def step_orders(units: dict, deps: dict, orders: dict):
    """One panel per entry of ``orders`` (title -> list of step names): each step a box in its issue
    position (x) on the lane of its unit (``units[name]``, y), and an arrow from each step of
    ``deps[name]`` to it. Steps issued later than a step that waits for them would point backwards;
    a valid order draws every arrow left to right."""
    if not orders:
        raise ValueError("orders: got none; give at least one {title: [step, ...]}")
    for title, order in orders.items():
        if sorted(order) != sorted(units) or set(deps) != set(units):
            raise ValueError(f"order {title!r}: must name each step of units (and deps) once")
        unknown = {u for u in units.values() if u not in _LANE_OF}
        if unknown:
            raise ValueError(f"units: unknown {sorted(unknown)}; accepted: {sorted(_LANE_OF)}")
    n = len(units)
    fig, axes = subplots(len(orders), 1, figsize=(6.6, 2.9 * len(orders)), squeeze=False)
    for ax, (title, order) in zip(axes[:, 0], orders.items()):
        where = {name: (x, len(LANES) - 1 - _LANE_OF[units[name]]) for x, name in enumerate(order)}
        for name, (x, y) in where.items():
            color = PALETTE[_LANE_OF[units[name]] % len(PALETTE)]
            ax.add_patch(FancyBboxPatch((x - 0.42, y - 0.33), 0.84, 0.66, boxstyle="round,pad=0.02",
                                        facecolor=color, edgecolor=INK, linewidth=0.6, alpha=0.35))
            ax.text(x, y, _label(name), ha="center", va="center", fontsize=9, color="black")
        for name, (x, y) in where.items():
            for d in deps[name]:
                x0, y0 = where[d]
                if y0 == y:      # along a lane: over the boxes between, top edge to top edge
                    start, end, bend = (x0, y0 + 0.33), (x, y + 0.33), -0.35
                else:            # right edge of the input to the left edge of the step
                    start, end, bend = (x0 + 0.42, y0), (x - 0.42, y), 0.0
                ax.annotate("", xy=end, xytext=start,
                            arrowprops=dict(arrowstyle="->", color=INK, linewidth=0.7, shrinkA=0, shrinkB=0,
                                            connectionstyle=f"arc3,rad={bend}"))
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_ylim(-0.6, len(LANES) - 0.2)
        ax.set_yticks(range(len(LANES)), [label for _, label in reversed(LANES)], fontsize=9)
        ax.set_xticks(range(n), [str(i + 1) for i in range(n)], fontsize=9)
        ax.set_xlabel("issue order", fontsize=9)
        ax.tick_params(length=0)
        ax.grid(False)
        for s in ax.spines.values():
            s.set_visible(False)
        ax.set_title(title, fontsize=10)
    return fig


#: the ladder as chapter 11b shows it: (rung, implementation in the sweeps, change, prediction before its run)
LADDER = (
    ("mma.sync", "cuda_mma", "chapter 8's backward (warp grid, mma.sync)", "-"),
    ("b1", "hopper_b1", "wgmma for the five products; dQ by float32 reductions", "about 1.2x"),
    ("b2", "hopper_b2", "TMA producer warpgroup, ring of 2 stages, setmaxnreg", "+10%"),
    ("b3", "hopper_b3", "dQ staged in shared memory, TMA reduce-add", "+5 to 10%"),
    ("b4", "hopper_b4", "dQ issued before dV and dK", "+3 to 5%"),
)


def ladder_table(sweeps, registers: dict, tensor_pipe: dict | None = None, baseline: str = "sdpa_flash",
                 head_dims=(64, 128)):
    """(header, body) of the backward ladder for ``flashtut.notebook.show_table``: per rung of
    :data:`LADDER`, its change, its prediction, its ratio to ``baseline`` per head dim (min to max over the
    cases, from the first of ``sweeps`` (lists of speed rows, one per process) that timed the rung, so that
    every ratio comes from one process), ``registers[rung]`` (ptxas' report), and with ``tensor_pipe``
    (``{(implementation, D): percent}``, Nsight Compute) a column of the tensor pipe's busy share."""
    from ..bench.report import ratio_summary

    if not sweeps or not all(isinstance(s, list) for s in sweeps):
        raise ValueError("sweeps: give a list of row lists, one per process")
    span = {}
    for rows in reversed(sweeps):           # the first sweep that timed a rung wins
        for s in ratio_summary(rows, [impl for _, impl, _, _ in LADDER], baseline):
            span[s["impl"], s["D"]] = f"{s['min']:.2f}-{s['max']:.2f}x"
    header = ["rung", "change", "predicted"] + [f"D = {d}" for d in head_dims]
    if tensor_pipe is not None:
        header.append("tensor pipe %, D = " + " / ".join(map(str, head_dims)))
    header.append("registers")
    body = []
    for rung, impl, change, predicted in LADDER:
        row = [rung, change, predicted] + [span.get((impl, d), "-") for d in head_dims]
        if tensor_pipe is not None:
            row.append(" / ".join(f"{tensor_pipe[impl, d]:.0f}" if (impl, d) in tensor_pipe else "-"
                                  for d in head_dims))
        row.append(registers.get(rung, "-"))
        body.append(row)
    return header, body


def tensor_pipe(profile_rows) -> dict:
    """``{(implementation, D): percent}`` of the tensor pipe's busy share in ``profile`` rows (as
    ``experiments/hopper_backward/ncu_rungs.py`` writes them), for :func:`ladder_table`."""
    from ..bench.profile import TENSOR

    return {(r["impl"], r["D"]): r["metrics"][TENSOR] for r in profile_rows
            if r.get("kind") == "profile" and r.get("mode") == "bwd" and TENSOR in r.get("metrics", {})}

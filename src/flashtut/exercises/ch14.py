"""Chapter 14 exercises: the zigzag ring's step plan. ``check_step_plan`` runs the reader's plan for
every rank and step of several worlds and lengths and checks the technique: every query-key pair
the causal mask lets through is scored exactly once, no hidden pair is scored, and every step is one
kernel call with a mask the kernels have (none, or top-left causal on a square)."""
from __future__ import annotations

import numbers

import numpy as np
import torch

from ..distributed.sharding import shard_ranges
from .checker import CheckResult, call_candidate, check_callable

#: (world, n) pairs the checker tries: odd lengths, chunks of unequal sizes, world 1 included
CASES = ((1, 7), (2, 9), (3, 25), (4, 16), (5, 41))


def _positions(n: int, rank: int, world: int) -> torch.Tensor:
    return torch.cat([torch.arange(b, e) for b, e in shard_ranges(n, rank, world, True)])


def _rows(value, name: str, limit: int):
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) for x in value)):
        return None, f"{name} must be a pair of ints (start, end), got {value!r}"
    lo, hi = (int(x) for x in value)
    if not 0 <= lo <= hi <= limit:
        return None, f"{name} = {value} is outside 0..{limit} (the shard has {limit} rows)"
    return (lo, hi), None


def check_step_plan(plan) -> CheckResult:
    """Check ``plan(rank, source, world, n) -> (q_rows, kv_rows, causal)``: which rows
    ``[start, end)`` of rank ``rank``'s query shard meet which rows of rank ``source``'s key/value
    shard when the causal sequence of ``n`` rows is cut by ``flashtut.distributed.shard`` (zigzag),
    and whether that call needs the causal mask (top-left, so only on a square: as many query rows
    as key rows). An empty range means the step computes nothing."""
    check_callable("plan", plan)
    for world, n in CASES:
        pos = [_positions(n, r, world) for r in range(world)]
        covered = torch.zeros(n, n, dtype=torch.int64)
        for rank in range(world):
            for source in range(world):
                label = f"plan(rank={rank}, source={source}, world={world}, n={n})"
                got, error, _ = call_candidate(plan, (rank, source, world, n), label)
                if error is not None:
                    return error
                if not (isinstance(got, (tuple, list)) and len(got) == 3):
                    return CheckResult(False, f"✗ {label} returned {got!r}; expected (q_rows, kv_rows, causal)")
                q_rows, why = _rows(got[0], "q_rows", len(pos[rank]))
                kv_rows, why2 = _rows(got[1], "kv_rows", len(pos[source]))
                if why or why2:
                    return CheckResult(False, f"✗ {label}: {why or why2}")
                causal = got[2]
                if not isinstance(causal, (bool, np.bool_)):
                    return CheckResult(False, f"✗ {label}: causal must be True or False, got {causal!r}")
                causal = bool(causal)
                qi = pos[rank][q_rows[0]:q_rows[1]]
                kj = pos[source][kv_rows[0]:kv_rows[1]]
                if causal and len(qi) != len(kj):
                    return CheckResult(False, f"✗ {label}: a causal step on {len(qi)} query rows and {len(kj)} "
                                              "key rows; the kernels' top-left mask is meant for a square")
                block = torch.ones(len(qi), len(kj), dtype=torch.int64)
                if causal:
                    block = torch.tril(block)
                hidden = (kj[None, :] > qi[:, None]) & block.bool()
                if hidden.any():
                    i, j = (int(x) for x in hidden.nonzero()[0])
                    return CheckResult(False, f"✗ {label} scores query {int(qi[i])} against key {int(kj[j])}, "
                                              "which the causal mask hides (a later key)")
                covered[qi[:, None], kj[None, :]] += block
        want = torch.tril(torch.ones(n, n, dtype=torch.int64))
        if not torch.equal(covered, want):
            bad = (covered != want).nonzero()[0]
            i, j = (int(x) for x in bad)
            what = "never" if covered[i, j] == 0 else f"{int(covered[i, j])} times"
            return CheckResult(False, f"✗ world={world}, n={n}: query {i} meets key {j} {what}; every pair "
                                      "with key <= query must be scored exactly once over the ring")
    return CheckResult(True, f"✓ every visible pair scored exactly once, nothing hidden scored, for "
                             f"{len(CASES)} worlds of 1 to 5 ranks and odd lengths")


def solution_step_plan(rank, source, world, n):
    """The zigzag plan (what :func:`flashtut.distributed.ring_schedule` returns)."""
    mine = shard_ranges(n, rank, world, True)
    theirs = shard_ranges(n, source, world, True)
    n_r = sum(e - b for b, e in mine)
    n_s = sum(e - b for b, e in theirs)
    first_r = mine[0][1] - mine[0][0]
    first_s = theirs[0][1] - theirs[0][0]
    if source == rank:
        return (0, n_r), (0, n_s), True      # its own chunks: a causal square
    if source < rank:
        return (0, n_r), (0, first_s), False  # the source's early chunk, in full
    return (first_r, n_r), (0, n_s), False    # only the late chunk sees a later rank


__all__ = ["check_step_plan", "solution_step_plan", "CASES"]

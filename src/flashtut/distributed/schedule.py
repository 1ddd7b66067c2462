"""The ring's schedule: at each step, which of a rank's query rows meet which rows of the key/value
shard it holds, and under which mask.

At step ``t`` rank ``r`` holds the keys and values of rank ``source = (r - t) mod world`` (each step
every rank passes what it holds to rank ``r + 1`` and receives from ``r - 1``). Without a mask all
its queries meet all those keys. With the zigzag cut (:mod:`flashtut.distributed.sharding`) a rank
holds an early chunk and a late one, and the causal mask between two ranks' chunks is one of three
shapes, each a plain call of a kernel:

* ``source == r``: its own two chunks, a causal square (top-left on equal lengths): the early chunk
  sees itself causally, the late chunk sees the early one in full and itself causally;
* ``source < r``: every query sees the source's early chunk in full and none of its late chunk;
* ``source > r``: only the late chunk's queries see anything, and they see the whole source shard.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import check_causal
from .sharding import check_world, shard_ranges


@dataclass(frozen=True)
class Step:
    """One step of one rank: ``q_rows`` of its query shard against ``kv_rows`` of the key/value
    shard of rank ``source`` (``[start, end)``, local to the shards), causal (top-left, on equal
    lengths) or not."""
    step: int
    rank: int
    source: int
    q_rows: tuple[int, int]
    kv_rows: tuple[int, int]
    causal: bool

    @property
    def pairs(self) -> int:
        """Query-key pairs the step scores (the causal square counts its lower triangle)."""
        nq, nk = self.q_rows[1] - self.q_rows[0], self.kv_rows[1] - self.kv_rows[0]
        return nq * (nq + 1) // 2 if self.causal else nq * nk


def shard_lengths(n: int, world: int, causal) -> list[tuple[int, int]]:
    """For each rank, ``(rows of its shard, rows of its first chunk)`` for a sequence of ``n`` rows."""
    out = []
    for r in range(world):
        ranges = shard_ranges(n, r, world, causal)
        out.append((sum(e - b for b, e in ranges), ranges[0][1] - ranges[0][0]))
    return out


def ring_schedule(rank: int, world: int, n: int, causal=False) -> list[Step]:
    """The ``world`` steps of rank ``rank`` for a sequence of ``n`` rows cut by
    :func:`flashtut.distributed.shard`."""
    rank, world = check_world(rank, world)
    causal = check_causal(causal) is not None
    lengths = shard_lengths(n, world, causal)
    n_r, first_r = lengths[rank]
    steps = []
    for t in range(world):
        src = (rank - t) % world
        n_s, first_s = lengths[src]
        if not causal:
            q, kv, masked = (0, n_r), (0, n_s), False
        elif src == rank:
            q, kv, masked = (0, n_r), (0, n_s), True
        elif src < rank:
            q, kv, masked = (0, n_r), (0, first_s), False
        else:
            q, kv, masked = (first_r, n_r), (0, n_s), False
        steps.append(Step(t, rank, src, q, kv, masked))
    return steps


__all__ = ["Step", "ring_schedule", "shard_lengths"]

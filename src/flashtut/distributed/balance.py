"""The work each rank of the ring does, counted in the tiles a kernel computes.

A step of the ring ends when its slowest rank ends, so the cut of the sequence must give every
rank the same work. :func:`work_per_rank` counts it for three cuts of a causal sequence (see
:mod:`flashtut.distributed.sharding`): ``"contiguous"`` (rank ``r`` holds the ``r``-th piece),
``"striped"`` (rank ``r`` holds tokens ``r, r + world, ...``) and ``"zigzag"`` (what
:func:`flashtut.distributed.shard` ships), with the rule the kernels skip by: a ``block x block``
tile is computed when it holds at least one visible query-key pair.
"""
from __future__ import annotations

import math

from ..checks import check_block, check_bool
from .schedule import ring_schedule
from .sharding import check_world, shard_ranges

#: the cuts :func:`work_per_rank` compares
SCHEMES = ("contiguous", "zigzag", "striped")


def tiles(n_q: int, n_k: int, block: int = 64, offset: int | None = None) -> int:
    """Tiles of ``block x block`` a kernel computes for ``n_q`` queries against ``n_k`` keys: all of
    them without a mask (``offset=None``); with one (query ``i`` sees key ``j <= i + offset``) only
    the tiles holding a visible pair."""
    if n_q <= 0 or n_k <= 0:
        return 0
    kb = math.ceil(n_k / block)
    if offset is None:
        return math.ceil(n_q / block) * kb
    total = 0
    for q0 in range(0, n_q, block):
        last = min(q0 + block, n_q) - 1 + offset           # the last key the block's last row sees
        if last >= 0:
            total += min(kb, last // block + 1)
    return total


def row_owner(n: int, world: int, scheme: str = "zigzag") -> list[int]:
    """The rank holding each of the ``n`` sequence positions under ``scheme`` (its queries are that
    rank's to compute)."""
    check_world(0, world)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(map(repr, SCHEMES))}, got {scheme!r}")
    if scheme == "striped":
        return [i % world for i in range(n)]
    owner = [0] * n
    for r in range(world):
        for b, e in shard_ranges(n, r, world, scheme == "zigzag"):
            owner[b:e] = [r] * (e - b)
    return owner


def work_per_rank(n: int, world: int, scheme: str = "zigzag", causal: bool = True, block: int = 64) -> list[int]:
    """Tiles of ``block x block`` each rank computes over the whole ring for a sequence of ``n``
    rows cut by ``scheme``: the sum over its ``world`` steps of the tiles its query shard computes
    against the key/value shard it holds then."""
    check_world(0, world)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(map(repr, SCHEMES))}, got {scheme!r}")
    causal = check_bool("causal", causal)
    block = check_block("block", block)
    out = []
    for r in range(world):
        if scheme == "zigzag":
            out.append(sum(tiles(s.q_rows[1] - s.q_rows[0], s.kv_rows[1] - s.kv_rows[0], block,
                                 0 if s.causal else None) for s in ring_schedule(r, world, n, causal)))
            continue
        total = 0
        for src in range(world):
            if scheme == "contiguous":
                (qb, qe), = shard_ranges(n, r, world, False)
                (kb, ke), = shard_ranges(n, src, world, False)
                if not causal or src < r:
                    total += tiles(qe - qb, ke - kb, block)
                elif src == r:
                    total += tiles(qe - qb, ke - kb, block, 0)
            else:  # striped: local row i is token i * world + r, local key j is token j * world + src
                nq, nk = len(range(r, n, world)), len(range(src, n, world))
                total += tiles(nq, nk, block, None if not causal else (0 if src <= r else -1))
        out.append(total)
    return out


def imbalance(work: list[int]) -> float:
    """``max / mean - 1``: how much longer the busiest rank works than an even share (every step of
    the ring waits for it)."""
    mean = sum(work) / len(work)
    return max(work) / mean - 1 if mean else 0.0


def balance_table(n: int, worlds=(2, 4, 8), block: int = 64, causal: bool = True) -> list[dict]:
    """One row per (world, scheme): the tiles of the busiest and the idlest rank, the imbalance
    against an even share, and the total next to one unsharded kernel's tiles."""
    whole = tiles(n, n, block, 0 if causal else None)
    rows = []
    for world in worlds:
        for scheme in SCHEMES:
            w = work_per_rank(n, world, scheme, causal, block)
            rows.append(dict(world=world, scheme=scheme, max_tiles=max(w), min_tiles=min(w),
                             imbalance=imbalance(w), total_tiles=sum(w), unsharded_tiles=whole))
    return rows


__all__ = ["SCHEMES", "tiles", "row_owner", "work_per_rank", "imbalance", "balance_table"]

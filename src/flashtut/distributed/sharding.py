"""How a sequence is cut over the ranks of a ring, and how much work each rank then does.

Without a mask every rank's queries meet every key, so any cut gives every rank the same work and
the plain one serves: rank ``r`` holds the ``r``-th of ``world`` contiguous pieces.

With a causal mask a contiguous cut is lopsided: the rank holding the last piece attends to every
key before it, the rank holding the first piece only to its own triangle. Two cuts fix it:

* striped (Brandes et al., 2023): rank ``r`` holds tokens ``r, r + world, r + 2 world, ...``.
  Every pair of ranks then meets through a causal triangle (the diagonal shifted by one for a
  later rank), so each of the ``world`` steps of the ring computes a diagonal band of partial tiles.
* zigzag (the cut of ring-flash-attention and Megatron's context parallelism, which this module
  ships): the sequence is cut into ``2 world`` chunks and rank ``r`` holds chunks ``r`` and
  ``2 world - 1 - r``, one early and one late. Rank ``r`` against its own chunks is an ordinary
  causal square; against an earlier rank's chunks its queries see exactly the first of them, in
  full; against a later rank's chunks only its late chunk sees them, in full. So one step per rank
  is causal and every other step is a rectangle without a mask and half the size: each rank does
  the same work, and the kernels need nothing but the two masks they already have (none and
  top-left causal on equal lengths), where striped would need a diagonal offset of -1.

:func:`flashtut.distributed.balance.work_per_rank` counts the tiles each rank computes under each cut.
"""
from __future__ import annotations

import numbers

import torch

from ..checks import check_causal, check_tensor
from ..decode import split_bounds

def check_world(rank, world) -> tuple[int, int]:
    for name, x in (("rank", rank), ("world", world)):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(x).__name__} {x!r}")
    if world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..world - 1 = 0..{world - 1}, got {rank}")
    return int(rank), int(world)


def chunk_bounds(n: int, world: int, causal: bool) -> list[tuple[int, int]]:
    """The ``[start, end)`` chunks the sequence is cut into: ``world`` of them without a mask,
    ``2 world`` with one (zigzag). Sizes differ by at most one row."""
    return split_bounds(n, 2 * world if causal else world)


def shard_ranges(n: int, rank: int, world: int, causal) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of the sequence that rank ``rank`` holds, in the order they are
    stacked in its shard: ``[chunk rank]`` without a mask, ``[chunk rank, chunk 2 world - 1 - rank]``
    (zigzag) with one."""
    rank, world = check_world(rank, world)
    causal = check_causal(causal) is not None
    need = 2 * world if causal else world
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < need:
        raise ValueError(f"the sequence has {n!r} rows; accepted: at least {need} "
                         f"({'2 * world chunks for the causal zigzag' if causal else 'one per rank'})")
    bounds = chunk_bounds(int(n), world, causal)
    return [bounds[rank], bounds[2 * world - 1 - rank]] if causal else [bounds[rank]]


def _check_dim(x: torch.Tensor, dim) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must index one of the {x.dim()} dims of x (shape {tuple(x.shape)}), got {dim}")
    return dim % x.dim()


def shard(x: torch.Tensor, rank: int, world: int, causal=False, *, dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along its sequence dim ``dim`` (2 for ``(B, H, N, D)``).

    Without a mask: the ``rank``-th of ``world`` contiguous pieces. With ``causal`` (``True``,
    ``"top-left"`` or ``"bottom-right"``, the same mask for a whole sequence): the zigzag cut, chunks
    ``rank`` and ``2 world - 1 - rank`` of ``2 world``, stacked in that order. Any length of at
    least ``world`` (``2 world`` causal) is accepted; pieces differ by at most one row. Returns a
    contiguous copy; :func:`unshard` inverts it.
    """
    check_tensor("x", x)
    dim = _check_dim(x, dim)
    ranges = shard_ranges(x.shape[dim], rank, world, causal)
    return torch.cat([x.narrow(dim, s, e - s) for s, e in ranges], dim=dim).contiguous()


def unshard(shards, world=None, causal=False, *, dim: int = 2) -> torch.Tensor:
    """The whole sequence from the list of every rank's shard, in rank order: the inverse of
    :func:`shard`. Called ``unshard(shards, causal)`` or ``unshard(shards, world, causal)``
    (``world``, when given, must be ``len(shards)``)."""
    if isinstance(world, (bool,)) and causal is False:      # unshard(shards, causal)
        world, causal = None, world
    if not isinstance(shards, (list, tuple)) or not shards:
        raise TypeError(f"shards must be a non-empty list of tensors (one per rank, in rank order), "
                        f"got {type(shards).__name__}")
    for i, s in enumerate(shards):
        check_tensor(f"shards[{i}]", s)
    if world is not None and (isinstance(world, bool) or not isinstance(world, numbers.Integral)
                              or world != len(shards)):
        raise ValueError(f"world must be the number of shards, {len(shards)}, got {world!r}")
    world = len(shards)
    causal = check_causal(causal) is not None
    dim = _check_dim(shards[0], dim)
    n = sum(s.shape[dim] for s in shards)
    pieces = [None] * (2 * world if causal else world)
    for r, s in enumerate(shards):
        ranges = shard_ranges(n, r, world, causal)
        if s.shape[dim] != sum(e - b for b, e in ranges):
            raise ValueError(f"shards[{r}] has {s.shape[dim]} rows along dim {dim}; shard(x, {r}, {world}, "
                             f"causal={causal}) of the {n} rows of all shards gives {sum(e - b for b, e in ranges)}")
        at = 0
        for (b, e), slot in zip(ranges, (r, 2 * world - 1 - r) if causal else (r,)):
            pieces[slot] = s.narrow(dim, at, e - b)
            at += e - b
    return torch.cat(pieces, dim=dim)


__all__ = ["shard", "unshard", "shard_ranges", "chunk_bounds", "check_world"]

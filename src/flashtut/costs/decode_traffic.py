"""The bytes one decoding step must move: the lower bound that makes decoding memory-bound.

A step of ``Nq`` new queries per sequence reads every cached key and value of every sequence
once, the queries once, and writes the output once. Nothing else is necessary, so this sum over
the GPU's copy bandwidth is the fastest the step can be; a kernel's *bandwidth fraction* is this
sum over its time, against the measured copy bandwidth. The split-KV kernel also writes and reads
its partial states (``num_splits`` outputs of ``D`` float32 values and one log-sum-exp per query
row): overhead, counted apart.
"""
from __future__ import annotations

from ..checks import check_block


def decode_step_bytes(lengths, heads: int, kv_heads: int, head_dim: int, itemsize: int,
                      n_queries: int = 1, num_splits: int = 1) -> dict:
    """Bytes of one decode step over caches of ``lengths`` positions (one per sequence).

    Returns ``{"kv": ..., "q_o": ..., "must": kv + q_o, "partials": ...}``: the cached keys and
    values (``2 * sum(lengths) * kv_heads * head_dim * itemsize``), the queries read and outputs
    written, their sum (what every implementation must move), and the split-KV partial states
    written and read back by the merge (zero for one split)."""
    lengths = [check_block("lengths[]", n) for n in lengths]
    heads, kv_heads = check_block("heads", heads), check_block("kv_heads", kv_heads)
    head_dim, itemsize = check_block("head_dim", head_dim), check_block("itemsize", itemsize)
    n_queries, num_splits = check_block("n_queries", n_queries), check_block("num_splits", num_splits)
    rows = len(lengths) * heads * n_queries
    kv = 2 * sum(lengths) * kv_heads * head_dim * itemsize
    q_o = 2 * rows * head_dim * itemsize
    partials = 0 if num_splits == 1 else 2 * rows * num_splits * (head_dim + 1) * 4
    return {"kv": kv, "q_o": q_o, "must": kv + q_o, "partials": partials}


def gqa_saving(heads: int, kv_heads: int) -> int:
    """How many times fewer K/V bytes grouped-query heads read than ``heads`` full heads would
    (the kernel reads each key/value head once for its whole group)."""
    return check_block("heads", heads) // check_block("kv_heads", kv_heads)


__all__ = ["decode_step_bytes", "gqa_saving"]

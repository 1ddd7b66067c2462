"""The attention each rank runs on one pair of shards: a kernel that returns ``(o, lse)`` and the
backward that takes them.

The ring needs exactly what a FlashAttention kernel already hands back: the output normalised over
the keys it saw and the log-sum-exp of its scores, so that partial states merge (chapter 04), and a
backward that recomputes the probabilities from ``q``, ``k`` and a log-sum-exp it is given. Handed
the log-sum-exp of the whole row (merged over every step) and the final output, the backward of one
pair of shards returns exactly that pair's share of ``dq``, ``dk`` and ``dv``.

Backends: ``"tiled"`` (:func:`flashtut.tiled_attention` with ``return_lse=True`` and
:func:`flashtut.tiled_attention_backward`: any device and dtype, float64 included) and ``"triton"``
(``triton_forward`` / ``triton_backward`` of :mod:`flashtut.triton.attention`: CUDA float16,
bfloat16 and float32, head dim up to 128). ``"auto"`` takes Triton for CUDA tensors it accepts and
the tiled loops otherwise.
"""
from __future__ import annotations

import torch

from ..tiled import tiled_attention, tiled_attention_backward

BACKENDS = ("auto", "tiled", "triton")


def resolve_backend(backend, q: torch.Tensor) -> str:
    """The backend ``"auto"`` means for ``q`` (or ``backend`` itself, checked)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend != "auto":
        return backend
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and q.shape[-1] <= 128:
        return "triton"
    return "tiled"


def shard_forward(q, k, v, causal: bool, scale: float, backend: str):
    """``(o, lse)`` of ``q`` against ``k``, ``v`` (top-left causal or no mask)."""
    if backend == "triton":
        from ..triton.attention import triton_forward
        return triton_forward(q, k, v, causal=causal, scale=scale)
    return tiled_attention(q, k, v, causal=causal, scale=scale, return_lse=True)


def shard_backward(q, k, v, o, lse, do, causal: bool, scale: float, backend: str):
    """``(dq, dk, dv)`` of one pair of shards, from the final ``o`` and the row's whole ``lse``."""
    if backend == "triton":
        from ..triton.attention import triton_backward
        return triton_backward(q, k, v, o, lse, do, causal=causal, scale=scale)
    return tiled_attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale)


__all__ = ["BACKENDS", "resolve_backend", "shard_forward", "shard_backward"]

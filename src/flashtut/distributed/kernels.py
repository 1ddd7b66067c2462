"""The attention each rank runs on one pair of shards: a kernel that returns ``(o, lse)``, the
merge of that partial state into the running one, and the backward that takes them.

The ring needs exactly what a FlashAttention kernel already hands back: the output normalised over
the keys it saw and the log-sum-exp of its scores, so that partial states merge (chapter 04), and a
backward that recomputes the probabilities from ``q``, ``k`` and a log-sum-exp it is given. Handed
the log-sum-exp of the whole row (merged over every step) and the final output, the backward of one
pair of shards returns exactly that pair's share of ``dq``, ``dk`` and ``dv``.

Backends: ``"tiled"`` (the loops of :func:`flashtut.tiled_attention` and
:func:`flashtut.tiled_attention_backward`: any device and dtype, float64 included) and ``"triton"``
(the launches of ``triton_forward`` / ``triton_backward`` of :mod:`flashtut.triton.attention`: CUDA
float16, bfloat16 and float32, head dim up to 128). ``"auto"`` takes Triton for CUDA tensors it
accepts and the tiled loops otherwise.

A ring makes ``world`` calls per rank and pass, so these are the unchecked entry points:
:func:`check_backend_inputs` checks what the public functions would, once per pass, and the
per-call overflow guard (a host sync for bfloat16 and float32) is left to the ring, which guards
the merged result once per pass (``ring.guard_output``, ``ring.guard_gradients``). The
log-sum-exp each call returns still carries its output rows' health, so nothing escapes.
"""
from __future__ import annotations

import torch

from ..tiled import attention_loops, backward_loops

BACKENDS = ("auto", "tiled", "triton")
#: the tiles of the tiled loops (any size gives the same result to rounding)
_TILE = 64


def resolve_backend(backend, q: torch.Tensor) -> str:
    """The backend ``"auto"`` means for ``q`` (or ``backend`` itself, checked)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend != "auto":
        return backend
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and q.shape[-1] <= 128:
        return "triton"
    return "tiled"


def check_backend_inputs(q, k, v, scale: float, backend: str) -> None:
    """What the backend's public function would check of one call (dtype, head dim, that the
    kernels can run here), checked once per pass instead of once per call; shapes are checked by
    the ring."""
    if backend == "triton":
        from ..triton.attention import _check_inputs
        _check_inputs(q, k, v, False, scale)


def _mask(causal: bool):
    return ("top-left" if causal else None), None


def shard_forward(q, k, v, causal: bool, scale: float, backend: str):
    """``(o, lse)`` of ``q`` against ``k``, ``v`` (top-left causal or no mask), unchecked and
    unguarded."""
    if backend == "triton":
        from ..triton.attention import _forward
        return _forward(q, k, v, _mask(causal), scale, guard=False)
    return attention_loops(q, k, v, _mask(causal)[0], 0, None, scale, _TILE, _TILE)


def shard_backward(q, k, v, o, lse, do, causal: bool, scale: float, backend: str):
    """``(dq, dk, dv)`` of one pair of shards, from the final ``o`` and the row's whole ``lse``,
    unchecked and unguarded."""
    if backend == "triton":
        from ..triton.attention import _backward
        return _backward(q, k, v, o, lse, do, _mask(causal), scale, guard=False)
    return backward_loops(q, k, v, o, lse, do, _mask(causal)[0], 0, None, scale, _TILE, _TILE)[:3]


def merge_into(o, lse, o_p, lse_p) -> None:
    """Merge the partial state ``(o_p, lse_p)`` into the running ``(o, lse)``, in place: the rule
    of :func:`flashtut.merge_attention_states` (chapter 04's merge of the states ``(lse, 1)``) in
    six PyTorch launches, two of them over ``o``. Every row of a step sees a key, so ``lse_p`` is
    finite (or NaN/+inf after an overflow, which then reaches ``lse`` and the guard)."""
    # the running keys' share of the merged mass, exp(lse - logaddexp(lse, lse_p))
    share = torch.sigmoid(lse - lse_p).unsqueeze(-1)
    o.mul_(share).addcmul_(o_p, 1 - share)             # each side weighed by its keys' share
    torch.logaddexp(lse, lse_p, out=lse)               # m + log(exp(lse - m) + exp(lse_p - m))


def shard_merge(o, lse, o_p, lse_p, backend: str) -> None:
    """:func:`merge_into`; with the Triton backend, the same rule in one launch
    (:func:`flashtut.triton.merge.merge_state_`, which reads and writes ``o`` once)."""
    if backend == "triton":
        from ..triton.merge import merge_state_
        merge_state_(o, lse, o_p, lse_p)
    else:
        merge_into(o, lse, o_p, lse_p)


__all__ = ["BACKENDS", "resolve_backend", "check_backend_inputs", "shard_forward", "shard_backward", "merge_into",
           "shard_merge"]

"""The softmax family, from the version that overflows to the one-pass online normaliser.

All functions work along the last dimension of a tensor of any leading shape.
"""
from __future__ import annotations

import torch

from .checks import accum_dtype, check_block, check_float_dtype, check_tensor


def _check_x(x) -> torch.Tensor:
    check_tensor("x", x)
    check_float_dtype("x", x)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have at least one element along its last dimension, got shape {tuple(x.shape)}")
    return x


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """``exp(x) / sum(exp(x))`` in the input's own dtype, with no maximum subtracted.

    Wrong on purpose: ``exp`` overflows to ``inf`` once an input passes about 11.09 in
    float16 (88.7 in float32). The row's sum is then ``inf``: each overflowing entry becomes
    ``inf / inf = nan`` and every other entry ``e^x / inf = 0``, so a row with one such entry
    comes out as ``[nan, 0, ..., 0]``, summing to ``nan``.
    """
    _check_x(x)
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def safe_softmax(x: torch.Tensor) -> torch.Tensor:
    """The three-pass safe softmax: (1) row maximum, (2) sum of ``exp(x - max)``, (3) normalise.

    Every exponent is at most 0, so nothing overflows. Sums are carried in float32 (float64
    for float64 input) and the result is cast back to ``x.dtype``.
    """
    _check_x(x)
    xa = x.to(accum_dtype(x.dtype))
    m = xa.amax(dim=-1, keepdim=True)                      # pass 1: read x
    d = torch.exp(xa - m).sum(dim=-1, keepdim=True)        # pass 2: read x again
    return (torch.exp(xa - m) / d).to(x.dtype)             # pass 3: read x, write y


def merge_softmax_states(m_a: torch.Tensor, d_a: torch.Tensor, m_b: torch.Tensor, d_b: torch.Tensor):
    """Merge two partial softmax states ``(max, sum of exp(x - max))`` of disjoint column sets.

    ``m = max(m_a, m_b)``, ``d = d_a * exp(m_a - m) + d_b * exp(m_b - m)``. The operation is
    associative and commutative, which is what lets tiles, warps and thread blocks each
    summarise their part and combine the summaries in any grouping. An empty state is
    ``(-inf, 0)``; merging it changes nothing.

    The four tensors must share one shape (no broadcasting: a mismatch is a bug in the caller),
    one floating dtype and one device; otherwise ``TypeError``/``ValueError``.
    """
    named = (("m_a", m_a), ("d_a", d_a), ("m_b", m_b), ("d_b", d_b))
    for name, t in named:
        check_tensor(name, t)
        check_float_dtype(name, t)
    for name, t in named[1:]:
        if tuple(t.shape) != tuple(m_a.shape):
            raise ValueError(f"{name} must have the shape of m_a, {tuple(m_a.shape)}, got {tuple(t.shape)}")
        if t.dtype != m_a.dtype:
            raise ValueError(f"{name} must have the dtype of m_a, {str(m_a.dtype).replace('torch.', '')}, "
                             f"got {str(t.dtype).replace('torch.', '')}")
        if t.device != m_a.device:
            raise ValueError(f"{name} must be on {m_a.device} like m_a, got {t.device}")
    m = torch.maximum(m_a, m_b)
    # where both maxima are -inf the state is empty; subtract 0 there instead of -inf to avoid nan
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    d = d_a * torch.exp(m_a - m_safe) + d_b * torch.exp(m_b - m_safe)
    return m, d


def online_softmax(x: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    """Online normaliser (Milakov and Gimelshein, 2018): two passes instead of three.

    Pass 1 streams over blocks of ``block_size`` columns (``None``: one column at a time) and
    keeps a running maximum ``m`` and a running sum ``d`` of ``exp(x - m)``; when a block raises
    the maximum, the old sum is rescaled by ``exp(m_old - m_new)``. Pass 2 normalises.
    """
    _check_x(x)
    n = x.shape[-1]
    bs = 1 if block_size is None else check_block("block_size", block_size)
    xa = x.to(accum_dtype(x.dtype))
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=xa.dtype, device=x.device)
    d = torch.zeros_like(m)
    for start in range(0, n, bs):                          # pass 1: read x once
        blk = xa[..., start:start + bs]
        m_blk = blk.amax(dim=-1, keepdim=True)
        m_blk_safe = torch.where(torch.isneginf(m_blk), torch.zeros_like(m_blk), m_blk)
        d_blk = torch.exp(blk - m_blk_safe).sum(dim=-1, keepdim=True)
        m, d = merge_softmax_states(m, d, m_blk, d_blk)
    return (torch.exp(xa - m) / d).to(x.dtype)             # pass 2: read x, write y

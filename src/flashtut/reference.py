"""Standard (naive) attention: the full score and probability matrices in memory.

This is what framework code without a fused kernel does, and the reference every faster
implementation is checked against (call it on float64 inputs for a float64 reference).
"""
from __future__ import annotations

import torch

from .checks import accum_dtype, check_causal, check_count, check_qkv, check_scale, raise_if_overflowed


def causal_mask(n_q: int, n_k: int, device=None, q_start: int = 0, k_start: int = 0) -> torch.Tensor:
    """Boolean mask, True where key ``j`` is *hidden* from query ``i`` (``j > i``).

    Top-left alignment, as ``scaled_dot_product_attention(is_causal=True)``: query ``i`` sees
    keys ``0..i`` whatever ``Nk`` is. ``q_start``/``k_start`` place a tile inside the matrix.
    """
    n_q, n_k = check_count("n_q", n_q, 0), check_count("n_k", n_k, 0)
    q_start, k_start = check_count("q_start", q_start, 0), check_count("k_start", k_start, 0)
    rows = torch.arange(q_start, q_start + n_q, device=device)[:, None]
    cols = torch.arange(k_start, k_start + n_k, device=device)[None, :]
    return cols > rows


def naive_attention(q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` with the ``(B, H, Nq, Nk)`` matrices materialised.

    Scores and probabilities are float32 (float64 for float64 inputs); the softmax subtracts
    the row maximum. The output has the shape and dtype of ``q``.
    """
    _, _, Nq, Nk, D = check_qkv(q, k, v)
    causal = check_causal(causal)
    scale = check_scale(scale, D)
    acc = accum_dtype(q.dtype)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale     # (B, H, Nq, Nk)
    if causal:
        s = s.masked_fill(causal_mask(Nq, Nk, q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)                                         # (B, H, Nq, Nk)
    o = torch.matmul(p, v.to(acc))
    raise_if_overflowed(o, q.dtype, scale, D)
    return o.to(q.dtype)


def attention_lse(q, k, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """The natural-log log-sum-exp of each query row's scaled, masked scores, ``(B, H, Nq)``.

    A reference for the ``lse`` that the tiled and fused kernels return.
    """
    _, _, Nq, Nk, D = check_qkv(q, k, k)
    causal = check_causal(causal)
    scale = check_scale(scale, D)
    acc = accum_dtype(q.dtype)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(causal_mask(Nq, Nk, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    raise_if_overflowed(lse, q.dtype, scale, D, "log-sum-exp", neg_inf_ok=True)
    return lse

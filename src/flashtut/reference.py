"""Standard (naive) attention: the full score and probability matrices in memory.

This is what framework code without a fused kernel does, and the reference every faster
implementation is checked against (call it on float64 inputs for a float64 reference).
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

from .checks import (accum_dtype, check_count, check_mask, check_window, check_qkv, check_scale,
                     diag_offset as _diag_offset, output_health, raise_if_overflowed,
                     rows_that_see_keys, scores_can_overflow)


def causal_mask(n_q: int, n_k: int, device=None, q_start: int = 0, k_start: int = 0,
                diag_offset: int = 0, window: int | None = None) -> torch.Tensor:
    """Boolean mask, True where key ``j`` is *hidden* from query ``i``.

    Query ``i`` sees key ``j`` when ``j <= i + diag_offset`` and, with a ``window``, when
    ``j > i + diag_offset - window``. ``diag_offset = 0`` is the top-left alignment of
    ``scaled_dot_product_attention(is_causal=True)`` (query ``i`` sees keys ``0..i`` whatever
    ``Nk`` is); ``Nk - Nq`` is bottom-right. ``q_start``/``k_start`` place a tile in the matrix.
    """
    n_q, n_k = check_count("n_q", n_q, 0), check_count("n_k", n_k, 0)
    q_start, k_start = check_count("q_start", q_start, 0), check_count("k_start", k_start, 0)
    if isinstance(diag_offset, (bool, np.bool_)) or not isinstance(diag_offset, numbers.Integral):
        raise TypeError(f"diag_offset must be an int, got {type(diag_offset).__name__} {diag_offset!r}")
    # clamp both to what these rows and columns can tell apart, so that huge values cannot overflow
    reach = q_start + n_q + k_start + n_k + 1
    diag_offset = max(-reach, min(int(diag_offset), reach))
    window = check_window(window, "top-left", 2 * reach, 2 * reach)
    rows = torch.arange(q_start, q_start + n_q, device=device)[:, None] + diag_offset
    cols = torch.arange(k_start, k_start + n_k, device=device)[None, :]
    hidden = cols > rows
    if window is not None:
        hidden = hidden | (cols <= rows - window)
    return hidden


def _grouped_scores(q, k, acc, scale):
    """``q k^T * scale`` with query heads grouped over their key/value head, as
    ``(B, Hkv, G, Nq, Nk)``: K is broadcast over the group, never copied per query head."""
    B, H, Nq, D = q.shape
    Hkv = k.shape[1]
    qg = q.to(acc).reshape(B, Hkv, (H // Hkv) * Nq, D)
    s = torch.matmul(qg, k.to(acc).transpose(-2, -1)) * scale
    return s.reshape(B, Hkv, H // Hkv, Nq, k.shape[2])


def visible_keys(i, n_k: int, diag_offset: int, window: int | None):
    """``[lo, hi)``: the keys query row(s) ``i`` may see (``hi <= lo``: none), for a causal mask."""
    hi = i + diag_offset + 1
    lo = hi - window if window is not None else hi * 0
    if isinstance(i, torch.Tensor):
        return lo.clamp(min=0), hi.clamp(max=n_k)
    return max(lo, 0), min(hi, n_k)


def _masked_scores(q, k, causal, scale, window):
    """Scores ``(B, Hkv, G, Nq, Nk)`` with hidden keys at ``-inf``, the ``(Nq, 1)`` rows that
    see no key at all (``None`` when every row sees one) and the range of rows that see one."""
    _, _, Nq, Nk, D = check_qkv(q, k, k, gqa=True)
    alignment, window = check_mask(causal, window, Nq, Nk)
    scale = check_scale(scale, D)
    s = _grouped_scores(q, k, accum_dtype(q.dtype), scale)
    empty = None
    if alignment is not None:
        off = _diag_offset(alignment, Nq, Nk)
        s = s.masked_fill(causal_mask(Nq, Nk, q.device, diag_offset=off, window=window), float("-inf"))
        # on the CPU: q may be on the meta device (memory.trace_traffic), where bool() cannot run
        lo, hi = visible_keys(torch.arange(Nq), Nk, off, window)
        if bool((hi <= lo).any()):
            empty = (hi <= lo)[:, None].to(q.device)
    return s, empty, rows_that_see_keys(alignment, window, Nq, Nk)


def naive_attention(q, k, v, causal=False, scale: float | None = None,
                    window: int | None = None) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` with the ``(B, H, Nq, Nk)`` matrices materialised.

    Scores and probabilities are float32 (float64 for float64 inputs); the softmax subtracts
    the row maximum. The output has the shape and dtype of ``q``. ``k``/``v`` may have fewer
    heads than ``q`` (grouped-query); ``causal`` is ``False``, ``True``/``"top-left"`` or
    ``"bottom-right"``; ``window`` limits each query to its ``window`` most recent visible keys.
    A query row that sees no key gets output 0.
    """
    check_qkv(q, k, v, gqa=True)
    s, empty, _ = _masked_scores(q, k, causal, scale, window)           # (B, Hkv, G, Nq, Nk)
    p = torch.softmax(s, dim=-1)
    if empty is not None:                # the softmax of a row of -inf is NaN; such a row sees nothing
        p = p.masked_fill(empty, 0.0)
    B, H, Nq, D = q.shape
    o = torch.matmul(p.flatten(2, 3), v.to(p.dtype)).reshape(B, H, Nq, D)
    scale = check_scale(scale, D)
    if scores_can_overflow(q.dtype, scale, D):
        # the guard every path shares, on each output row's health (0, or NaN: here an overflow
        # always reaches o through the softmax, and no second N x N pass is needed for an lse)
        raise_if_overflowed(output_health(o), q.dtype, scale, D,
                            inputs=(("q", q), ("k", k), ("v", v)))
    return o.to(q.dtype)


def attention_lse(q, k, causal=False, scale: float | None = None,
                  window: int | None = None) -> torch.Tensor:
    """The natural-log log-sum-exp of each query row's scaled, masked scores, ``(B, H, Nq)``.

    A reference for the ``lse`` that the tiled and fused kernels return; ``-inf`` for a row
    that sees no key.
    """
    s, _, seen = _masked_scores(q, k, causal, scale, window)
    lse = torch.logsumexp(s, dim=-1).flatten(1, 2)
    D = q.shape[-1]
    raise_if_overflowed(lse, q.dtype, check_scale(scale, D), D, "log-sum-exp", seen=seen,
                        inputs=(("q", q), ("k", k)))
    return lse


def naive_varlen_attention(q, k, v, bounds_q, bounds_k, causal=False, scale=None, window=None):
    """Packed-batch attention by the reference, one sequence at a time (autograd works through it).

    ``q`` is ``(total_q, H, D)``, ``k``/``v`` ``(total_k, Hkv, D)``; ``bounds_q``/``bounds_k`` are
    the ``cu_seqlens`` as lists. Sequence ``b`` attends only within itself.
    """
    outs = []
    for (q0, q1), (k0, k1) in zip(zip(bounds_q, bounds_q[1:]), zip(bounds_k, bounds_k[1:])):
        if q1 == q0:
            continue
        if k1 == k0:                     # no key at all: every row sees nothing, output 0
            outs.append(torch.zeros_like(q[q0:q1]) + 0 * q[q0:q1])
            continue
        seq = [t.transpose(0, 1)[None] for t in (q[q0:q1], k[k0:k1], v[k0:k1])]   # (1, H, n, D)
        outs.append(naive_attention(*seq, causal=causal, scale=scale, window=window)[0].transpose(0, 1))
    return torch.cat(outs, dim=0)

"""FlashAttention written as plain PyTorch loops over tiles (the algorithm, readable and slow).

Forward in FlashAttention-2 order: the outer loop walks query blocks, the inner loop walks
key/value blocks, and each query block's output stays in an accumulator that is rescaled
whenever the running maximum grows and divided by the running sum once, at the end.
Backward recomputes every probability tile from ``q``, ``k`` and the saved log-sum-exp.
The loops are vectorised over batch and heads only, so at any moment each ``(batch, head)``
holds one ``block_m x block_n`` score tile and never the ``Nq x Nk`` matrix.

With a causal mask (either alignment) or a sliding window the loops visit only the key blocks
a query block can see, and the query blocks that can see a key block: the skipped tiles are
never computed, which is where the saving of causal and local attention comes from.
"""
from __future__ import annotations

import torch

from .checks import (accum_dtype, check_block, check_bool, check_like, check_lse, check_mask,
                     check_qkv, check_scale, diag_offset, output_health, raise_if_flagged,
                     raise_if_overflowed, rows_that_see_keys)
from .reference import causal_mask, visible_keys


def _key_block_range(q0: int, q1: int, n_k: int, off: int, window, alignment) -> tuple[int, int]:
    """Keys ``[lo, hi)`` that some query of rows ``[q0, q1)`` may see."""
    if alignment is None:
        return 0, n_k
    lo, _ = visible_keys(q0, n_k, off, window)
    _, hi = visible_keys(q1 - 1, n_k, off, window)
    return lo, hi


def _query_block_range(k0: int, k1: int, n_q: int, off: int, window, alignment) -> tuple[int, int]:
    """Queries ``[lo, hi)`` that may see some key of ``[k0, k1)`` (the inverse of the above)."""
    if alignment is None:
        return 0, n_q
    lo = max(k0 - off, 0)                                  # j <= i + off
    hi = n_q if window is None else min(n_q, k1 - 1 - off + window)   # j > i + off - window
    return lo, hi


def _tile_mask(q0, q1, k0, k1, off, window, alignment, device):
    """The hidden-key mask of one tile, or None when the tile is fully visible."""
    if alignment is None:
        return None
    crosses_diag = k1 - 1 > q0 + off
    crosses_window = window is not None and k0 <= q1 - 1 + off - window
    if not (crosses_diag or crosses_window):
        return None
    return causal_mask(q1 - q0, k1 - k0, device, q0, k0, diag_offset=off, window=window)


def _expand_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """One tile of K or V repeated for the ``group`` query heads that share it."""
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def attention_loops(q, k, v, alignment, off: int, window, scale: float, block_m: int, block_n: int):
    """The forward loops of :func:`tiled_attention` on checked arguments, for any diagonal offset
    ``off`` (query ``i`` sees key ``j <= i + off`` when ``alignment`` is not None): split-KV
    decoding hands each chunk of the cache its own offset. Returns ``(o, lse)``."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    group = H // k.shape[1]
    acc_t = accum_dtype(q.dtype)
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Nq), dtype=acc_t, device=q.device)

    for q0 in range(0, Nq, block_m):                      # outer loop: query blocks
        q1 = min(q0 + block_m, Nq)
        qi = q[:, :, q0:q1].to(acc_t)
        m = torch.full((B, H, q1 - q0), float("-inf"), dtype=acc_t, device=q.device)
        l = torch.zeros((B, H, q1 - q0), dtype=acc_t, device=q.device)
        acc = torch.zeros((B, H, q1 - q0, D), dtype=acc_t, device=q.device)
        # key blocks wholly outside every row's diagonal/window are skipped, not masked
        lo, hi = _key_block_range(q0, q1, Nk, off, window, alignment)
        for k0 in range((lo // block_n) * block_n, hi, block_n):   # inner loop: key blocks
            k1 = min(k0 + block_n, Nk)
            kj = _expand_heads(k[:, :, k0:k1], group).to(acc_t)
            s = torch.matmul(qi, kj.transpose(-2, -1)) * scale
            hidden = _tile_mask(q0, q1, k0, k1, off, window, alignment, q.device)
            if hidden is not None:
                s = s.masked_fill(hidden, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            # a row that has seen no key yet keeps m = -inf; exp(-inf - -inf) would be NaN
            m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - m_safe)                 # rescales what was summed under m
            p = torch.exp(s - m_safe[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + torch.matmul(p, _expand_heads(v[:, :, k0:k1], group).to(acc_t))
            m = m_new
        seen = l > 0                                       # rows that saw no key: o = 0, lse = -inf
        o_blk = (acc / torch.where(seen, l, torch.ones_like(l))[..., None]).to(q.dtype)
        o[:, :, q0:q1] = o_blk
        # + 0, or NaN for a row whose output is not finite: the overflow guard reads lse alone
        lse[:, :, q0:q1] = (torch.where(seen, m + torch.log(l), torch.full_like(l, float("-inf")))
                            + output_health(o_blk))
    return o, lse


def tiled_attention(q, k, v, causal=False, scale: float | None = None,
                    block_m: int = 64, block_n: int = 64, return_lse: bool = False,
                    window: int | None = None):
    """FlashAttention-2 forward in PyTorch loops. Returns ``o`` or ``(o, lse)``.

    ``lse`` is the natural-log log-sum-exp of each row's scaled, masked scores,
    ``(B, H, Nq)``, float32 (float64 for float64 inputs); ``-inf`` for a row that sees no key,
    whose output is 0. ``k``/``v`` may have ``Hkv`` heads dividing ``H`` (grouped-query).
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v, gqa=True)
    alignment, window = check_mask(causal, window, Nq, Nk)
    scale = check_scale(scale, D)
    block_m = check_block("block_m", block_m)
    block_n = check_block("block_n", block_n)
    return_lse = check_bool("return_lse", return_lse)
    o, lse = attention_loops(q, k, v, alignment, diag_offset(alignment, Nq, Nk), window, scale,
                             block_m, block_n)
    # one check at the end, of the lse (it carries each output row's health)
    raise_if_overflowed(lse, q.dtype, scale, D, seen=rows_that_see_keys(alignment, window, Nq, Nk),
                        inputs=(("q", q), ("k", k), ("v", v)))
    return (o, lse) if return_lse else o


def tiled_attention_backward(q, k, v, o, lse, do, causal=False,
                             scale: float | None = None, block_m: int = 64,
                             block_n: int = 64, window: int | None = None):
    """FlashAttention-2 backward in PyTorch loops, no autograd.
    Returns ``(dq, dk, dv)``.

    ``P`` is recomputed tile by tile as ``exp(q k^T * scale - lse)``; with
    ``Delta = rowsum(dO * O)``: ``dV = P^T dO``, ``dP = dO V^T``,
    ``dS = P * (dP - Delta)``, ``dQ = dS K * scale``, ``dK = dS^T Q * scale``. Outer
    loop over key blocks (their ``dK`` and ``dV`` stay in accumulators), inner loop over
    query blocks (``dQ`` is added to). With grouped-query heads ``dk``/``dv`` have
    ``Hkv`` heads, each the sum over its group.
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v, gqa=True)
    check_like("o", o, q)
    check_like("do", do, q)
    check_lse(lse, B, H, Nq, q.device)
    alignment, window = check_mask(causal, window, Nq, Nk)
    scale = check_scale(scale, D)
    block_m = check_block("block_m", block_m)
    block_n = check_block("block_n", block_n)
    off = diag_offset(alignment, Nq, Nk)
    dq, dk, dv, health = backward_loops(q, k, v, o, lse, do, alignment, off, window,
                                        scale, block_m, block_n)
    named = (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do))
    raise_if_flagged(~torch.isfinite(health), q.dtype, scale, D, "gradients", named)
    return dq, dk, dv


def backward_loops(q, k, v, o, lse, do, alignment, off: int, window, scale: float, block_m: int, block_n: int):
    """The loops of :func:`tiled_attention_backward` on checked arguments, for any diagonal offset
    ``off``. Returns ``(dq, dk, dv, health)``: ``health`` is 0, or NaN once a gradient is not
    finite, for the caller's overflow guard (the ring of chapter 14 sums many calls and checks once)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    acc_t = accum_dtype(q.dtype)
    lse = lse.to(acc_t)
    # a row that saw no key has lse = -inf; +inf there makes its recomputed P
    # exp(s - inf) = 0
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    delta = (do.to(acc_t) * o.to(acc_t)).sum(dim=-1)      # (B, H, Nq): rowsum(dO * O)
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    # NaN once a gradient is not finite
    health = torch.zeros((), dtype=acc_t, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)

    for k0 in range(0, Nk, block_n):                      # outer loop: key blocks
        k1 = min(k0 + block_n, Nk)
        kj = _expand_heads(k[:, :, k0:k1], group).to(acc_t)
        vj = _expand_heads(v[:, :, k0:k1], group).to(acc_t)
        dk_acc = torch.zeros((B, H, k1 - k0, D), dtype=acc_t, device=q.device)
        dv_acc = torch.zeros_like(dk_acc)
        # query blocks wholly before the diagonal or past the window see none of these
        # keys
        lo, hi = _query_block_range(k0, k1, Nq, off, window, alignment)
        # inner loop: query blocks
        for q0 in range((lo // block_m) * block_m, hi, block_m):
            q1 = min(q0 + block_m, Nq)
            qi = q[:, :, q0:q1].to(acc_t)
            doi = do[:, :, q0:q1].to(acc_t)
            s = torch.matmul(qi, kj.transpose(-2, -1)) * scale
            hidden = _tile_mask(q0, q1, k0, k1, off, window, alignment, q.device)
            if hidden is not None:
                s = s.masked_fill(hidden, float("-inf"))
            p = torch.exp(s - lse[:, :, q0:q1, None])  # recomputed, exactly normalised
            dv_acc += torch.matmul(p.transpose(-2, -1), doi)
            dp = torch.matmul(doi, vj.transpose(-2, -1))
            ds = p * (dp - delta[:, :, q0:q1, None])
            dq[:, :, q0:q1] += torch.matmul(ds, kj) * scale
            dk_acc += torch.matmul(ds.transpose(-2, -1), qi) * scale
        # each key/value head gets the sum over the query heads of its group
        dk[:, :, k0:k1] = dk_acc.reshape(B, Hkv, group, k1 - k0, D).sum(2).to(k.dtype)
        dv[:, :, k0:k1] = dv_acc.reshape(B, Hkv, group, k1 - k0, D).sum(2).to(v.dtype)
        # each key block flags its own dK, dV tiles (as each kernel program does)
        health += (output_health(dk[:, :, k0:k1]).sum()
                   + output_health(dv[:, :, k0:k1]).sum())
    dq = dq.to(q.dtype)
    health += output_health(dq).sum()
    return dq, dk, dv, health

"""FlashAttention written as plain PyTorch loops over tiles (the algorithm, readable and slow).

Forward in FlashAttention-2 order: the outer loop walks query blocks, the inner loop walks
key/value blocks, and each query block's output stays in an accumulator that is rescaled
whenever the running maximum grows and divided by the running sum once, at the end.
Backward recomputes every probability tile from ``q``, ``k`` and the saved log-sum-exp.
The loops are vectorised over batch and heads only, so at any moment each ``(batch, head)``
holds one ``block_m x block_n`` score tile and never the ``Nq x Nk`` matrix.
"""
from __future__ import annotations

import torch

from .checks import (accum_dtype, check_block, check_bool, check_causal, check_like, check_lse,
                     check_qkv, check_scale, raise_if_overflowed)
from .reference import causal_mask


def _visible_key_end(q_end: int, n_k: int, causal: bool) -> int:
    """One past the last key a query block ending (exclusive) at ``q_end`` can see."""
    return min(n_k, q_end) if causal else n_k


def tiled_attention(q, k, v, causal: bool = False, scale: float | None = None,
                    block_m: int = 64, block_n: int = 64, return_lse: bool = False):
    """FlashAttention-2 forward in PyTorch loops. Returns ``o`` or ``(o, lse)``.

    ``lse`` is the natural-log log-sum-exp of each row's scaled, masked scores,
    ``(B, H, Nq)``, float32 (float64 for float64 inputs).
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    causal = check_causal(causal)
    scale = check_scale(scale, D)
    block_m = check_block("block_m", block_m)
    block_n = check_block("block_n", block_n)
    return_lse = check_bool("return_lse", return_lse)
    acc_t = accum_dtype(q.dtype)
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Nq), dtype=acc_t, device=q.device)

    for q0 in range(0, Nq, block_m):                      # outer loop: query blocks
        q1 = min(q0 + block_m, Nq)
        qi = q[:, :, q0:q1].to(acc_t)
        m = torch.full((B, H, q1 - q0), float("-inf"), dtype=acc_t, device=q.device)
        l = torch.zeros((B, H, q1 - q0), dtype=acc_t, device=q.device)
        acc = torch.zeros((B, H, q1 - q0, D), dtype=acc_t, device=q.device)
        # causal: key blocks that start after this block's last query are fully masked: skip them
        for k0 in range(0, _visible_key_end(q1, Nk, causal), block_n):   # inner loop: key blocks
            k1 = min(k0 + block_n, Nk)
            s = torch.matmul(qi, k[:, :, k0:k1].to(acc_t).transpose(-2, -1)) * scale
            if causal and k1 - 1 > q0:                    # tile crosses the diagonal
                s = s.masked_fill(causal_mask(q1 - q0, k1 - k0, q.device, q0, k0), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))      # finite: key 0 is in the first tile
            alpha = torch.exp(m - m_new)                  # rescales what was summed under m
            p = torch.exp(s - m_new[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + torch.matmul(p, v[:, :, k0:k1].to(acc_t))
            m = m_new
        o[:, :, q0:q1] = (acc / l[..., None]).to(q.dtype)  # written once per query block
        lse[:, :, q0:q1] = m + torch.log(l)
    raise_if_overflowed(o, q.dtype, scale, D)               # one check at the end, not per tile
    return (o, lse) if return_lse else o


def tiled_attention_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                             block_m: int = 64, block_n: int = 64):
    """FlashAttention-2 backward in PyTorch loops, no autograd. Returns ``(dq, dk, dv)``.

    ``P`` is recomputed tile by tile as ``exp(q k^T * scale - lse)``; with
    ``Delta = rowsum(dO * O)``: ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - Delta)``,
    ``dQ = dS K * scale``, ``dK = dS^T Q * scale``. Outer loop over key blocks (their ``dK``
    and ``dV`` stay in accumulators), inner loop over query blocks (``dQ`` is added to).
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    check_like("o", o, q)
    check_like("do", do, q)
    check_lse(lse, B, H, Nq, q.device)
    causal = check_causal(causal)
    scale = check_scale(scale, D)
    block_m = check_block("block_m", block_m)
    block_n = check_block("block_n", block_n)
    acc_t = accum_dtype(q.dtype)
    lse = lse.to(acc_t)
    delta = (do.to(acc_t) * o.to(acc_t)).sum(dim=-1)      # (B, H, Nq): rowsum(dO * O)
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)

    for k0 in range(0, Nk, block_n):                      # outer loop: key blocks
        k1 = min(k0 + block_n, Nk)
        kj = k[:, :, k0:k1].to(acc_t)
        vj = v[:, :, k0:k1].to(acc_t)
        dk_acc = torch.zeros((B, H, k1 - k0, D), dtype=acc_t, device=q.device)
        dv_acc = torch.zeros_like(dk_acc)
        # causal: query blocks that end before this key block starts see none of it
        first_q = (k0 // block_m) * block_m if causal else 0
        for q0 in range(first_q, Nq, block_m):            # inner loop: query blocks
            q1 = min(q0 + block_m, Nq)
            qi = q[:, :, q0:q1].to(acc_t)
            doi = do[:, :, q0:q1].to(acc_t)
            s = torch.matmul(qi, kj.transpose(-2, -1)) * scale
            if causal and k1 - 1 > q0:
                s = s.masked_fill(causal_mask(q1 - q0, k1 - k0, q.device, q0, k0), float("-inf"))
            p = torch.exp(s - lse[:, :, q0:q1, None])     # recomputed, exactly normalised
            dv_acc += torch.matmul(p.transpose(-2, -1), doi)
            dp = torch.matmul(doi, vj.transpose(-2, -1))
            ds = p * (dp - delta[:, :, q0:q1, None])
            dq[:, :, q0:q1] += torch.matmul(ds, kj) * scale
            dk_acc += torch.matmul(ds.transpose(-2, -1), qi) * scale
        dk[:, :, k0:k1] = dk_acc.to(k.dtype)
        dv[:, :, k0:k1] = dv_acc.to(v.dtype)
    # one sync for the three: amax propagates NaN and Inf
    raise_if_overflowed(torch.stack([g.abs().amax().to(acc_t) for g in (dq, dk, dv)]),
                        q.dtype, scale, D, "gradients")
    return dq.to(q.dtype), dk, dv

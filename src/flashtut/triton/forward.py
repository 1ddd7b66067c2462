"""The fused FlashAttention-2 forward kernel in Triton.

One program owns ``BLOCK_M`` query rows of one (batch, head): it loads them once, walks the
key/value tiles with the online softmax kept in registers (running max ``m``, running sum
``l``, output accumulator ``acc``), and writes its output rows and their log-sum-exp once.

Scores are carried in base 2: ``qk_scale = scale * log2(e)`` turns ``exp(scale * s - m)`` into
``exp2(qk_scale * s - m2)``, and the subtract-and-scale becomes one fused multiply-add per
score, with ``exp2`` the GPU's native exponential. The log-sum-exp is converted back to natural
log (times ``ln 2``) when it is stored.

The key loop runs in two parts. Tiles that need no mask (fully below the causal diagonal and
inside the key length) run first with plain loads; then the few tiles that cross the diagonal
or the end of the keys run with masks. With ``causal=True`` tiles entirely above the diagonal
are never visited: the second loop ends at the block's last query row.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..constants import LN2, LOG2E

# @triton.jit code reads module globals only when they are tl.constexpr
LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)


@triton.jit
def _fwd_key_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                  offs_m, offs_n, offs_d, start, end, n_k, head_dim, qk_scale,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                  PAD_D: tl.constexpr, DOT_PREC: tl.constexpr):
    d_ok = offs_d[None, :] < head_dim
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
        if MASKED:
            kv_ok = (cols[:, None] < n_k) & d_ok
            k = tl.load(k_ptrs, mask=kv_ok, other=0.0)
            v = tl.load(v_ptrs, mask=kv_ok, other=0.0)
        elif PAD_D:
            k = tl.load(k_ptrs, mask=d_ok, other=0.0)
            v = tl.load(v_ptrs, mask=d_ok, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)        # (BLOCK_M, BLOCK_N), raw q.k
        if MASKED:
            keep = cols[None, :] < n_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        # every row sees key 0 in the first tile, so m_new is finite from the first tile on
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)                          # rescales what was summed under m_i
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


# lengths are not specialised on: one compilation serves every sequence length
@triton.jit(do_not_specialize=["n_q", "n_k", "N_BUCKET"])
def attn_fwd_kernel(Q, K, V, O, LSE,
                    stride_qb, stride_qh, stride_qn,
                    stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn,
                    stride_ob, stride_oh, stride_on,
                    n_heads, n_q, n_k, head_dim, qk_scale, N_BUCKET,
                    CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                    DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid: ``(cdiv(n_q, BLOCK_M), B * H)``. ``LSE`` is ``(B*H, n_q)`` float32, natural log."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        # the last query blocks have the most keys to visit: start them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q_ok = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if CAUSAL:
        # keys below start_m are visible to every row of this block; the rest up to the
        # block's last row cross the diagonal; keys beyond it are masked for all rows: skipped
        free_end = (tl.minimum(start_m, n_k) // BLOCK_N) * BLOCK_N
        masked_end = tl.minimum(start_m + BLOCK_M, n_k)
    else:
        free_end = (n_k // BLOCK_N) * BLOCK_N
        masked_end = n_k
    acc, l_i, m_i = _fwd_key_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                  offs_m, offs_n, offs_d, 0, free_end, n_k, head_dim, qk_scale,
                                  BLOCK_N, False, CAUSAL, PAD_D, DOT_PREC)
    acc, l_i, m_i = _fwd_key_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                  offs_m, offs_n, offs_d, free_end, masked_end, n_k, head_dim,
                                  qk_scale, BLOCK_N, True, CAUSAL, PAD_D, DOT_PREC)

    acc = acc / l_i[:, None]                                        # normalise once, at the end
    lse = (m_i + tl.math.log2(l_i)) * LN2_C                         # base 2 -> natural log
    row_ok = offs_m < n_q
    tl.store(LSE + bh.to(tl.int64) * n_q + offs_m, lse, mask=row_ok)
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=q_ok)

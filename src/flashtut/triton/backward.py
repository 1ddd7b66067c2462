"""The FlashAttention-2 backward in Triton: three kernels, no atomics, no stored probabilities.

With ``P = exp(scale * Q K^T - lse)`` recomputed tile by tile from the saved log-sum-exp:

1. ``bwd_preprocess_kernel``: ``Delta = rowsum(dO * O)``, one float per query row. It is the
   ``rowsum(P * dP)`` that the softmax gradient needs, computed from two ``N x D`` tensors
   instead of the ``N x N`` ones.
2. ``bwd_dkdv_kernel``: one program per ``BLOCK_N`` keys keeps ``K``, ``V`` and the ``dK``,
   ``dV`` accumulators on chip and streams the query blocks past them:
   ``dV += P^T dO``, ``dS = P * (dO V^T - Delta)``, ``dK += dS^T Q``.
3. ``bwd_dq_kernel``: one program per ``BLOCK_M`` queries keeps ``Q``, ``dO`` and ``dQ`` on
   chip and streams the key blocks: ``dQ += dS K``.

Splitting ``dQ`` out costs a second recomputation of ``Q K^T`` and ``dO V^T`` (seven tile
products per tile pair instead of five) but every program owns the rows it writes, so there
are no atomic additions and the result is deterministic.

The kernels take the transposed view in the dK/dV kernel (``S^T = K Q^T``), so that ``P^T``
comes out of the product directly and needs no transpose before ``P^T dO``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..constants import LOG2E

# @triton.jit code reads module globals only when they are tl.constexpr
LOG2E_C = tl.constexpr(LOG2E)


@triton.jit
def bwd_preprocess_kernel(O, DO, DELTA,
                          stride_ob, stride_oh, stride_on,
                          stride_dob, stride_doh, stride_don,
                          n_heads, n_q, head_dim,
                          BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid ``(cdiv(n_q, BLOCK_M), B * H)``; ``DELTA`` is ``(B*H, n_q)`` float32."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * n_q + offs_m, tl.sum(o * do, 1), mask=offs_m < n_q)


@triton.jit
def _dkdv_query_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qn, stride_don,
                     offs_n, offs_m0, offs_d, start, end, n_q, head_dim, qk_scale,
                     BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                     PAD_D: tl.constexpr, DOT_PREC: tl.constexpr):
    d_ok = offs_d[None, :] < head_dim
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + offs_m0
        q_ptrs = q_base + rows[:, None] * stride_qn + offs_d[None, :]
        do_ptrs = do_base + rows[:, None] * stride_don + offs_d[None, :]
        if MASKED:
            row_ok = rows < n_q
            q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok, other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None] & d_ok, other=0.0)
            lse2 = tl.load(lse_base + rows, mask=row_ok, other=0.0) * LOG2E_C
            delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        else:
            if PAD_D:
                q = tl.load(q_ptrs, mask=d_ok, other=0.0)
                do = tl.load(do_ptrs, mask=d_ok, other=0.0)
            else:
                q = tl.load(q_ptrs)
                do = tl.load(do_ptrs)
            lse2 = tl.load(lse_base + rows) * LOG2E_C
            delta = tl.load(delta_base + rows)
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)              # (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])                 # P^T, already normalised
        if MASKED:
            keep = rows[None, :] < n_q
            if CAUSAL:
                keep = keep & (rows[None, :] >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)           # (dO V^T)^T
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


# lengths are not specialised on: one compilation serves every sequence length
@triton.jit(do_not_specialize=["n_q", "n_k", "N_BUCKET"])
def bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA,
                    stride_qb, stride_qh, stride_qn,
                    stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn,
                    stride_dob, stride_doh, stride_don,
                    stride_dkb, stride_dkh, stride_dkn,
                    stride_dvb, stride_dvh, stride_dvn,
                    n_heads, n_q, n_k, head_dim, scale, qk_scale, N_BUCKET,
                    CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                    DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid ``(cdiv(n_k, BLOCK_N), B * H)``. Writes ``dK`` and ``dV`` of its keys once."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (offs_n[:, None] < n_k) & (offs_d[None, :] < head_dim)
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=kv_ok, other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_dob + h * stride_doh
    lse_base = LSE + bh.to(tl.int64) * n_q
    delta_base = DELTA + bh.to(tl.int64) * n_q

    if CAUSAL:
        # queries before start_n see none of these keys (skipped); queries in
        # [start_n, start_n + BLOCK_N) see some of them (masked); later queries see all
        diag_end = tl.minimum(start_n + BLOCK_N, n_q)
        dk, dv = _dkdv_query_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                  stride_qn, stride_don, offs_n, offs_m0, offs_d,
                                  start_n, diag_end, n_q, head_dim, qk_scale,
                                  BLOCK_M, True, True, PAD_D, DOT_PREC)
        lo = start_n + BLOCK_N
    else:
        lo = 0
    free_end = lo + (tl.maximum(n_q - lo, 0) // BLOCK_M) * BLOCK_M
    dk, dv = _dkdv_query_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                              stride_qn, stride_don, offs_n, offs_m0, offs_d,
                              lo, free_end, n_q, head_dim, qk_scale,
                              BLOCK_M, False, False, PAD_D, DOT_PREC)
    dk, dv = _dkdv_query_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                              stride_qn, stride_don, offs_n, offs_m0, offs_d,
                              free_end, n_q, n_q, head_dim, qk_scale,
                              BLOCK_M, True, False, PAD_D, DOT_PREC)

    dk = dk * scale
    tl.store(DK + b * stride_dkb + h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + b * stride_dvb + h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def _dq_key_loop(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                 offs_m, offs_n0, offs_d, start, end, n_k, head_dim, qk_scale,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 PAD_D: tl.constexpr, DOT_PREC: tl.constexpr):
    d_ok = offs_d[None, :] < head_dim
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n0
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
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            keep = cols[None, :] < n_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


# lengths are not specialised on: one compilation serves every sequence length
@triton.jit(do_not_specialize=["n_q", "n_k", "N_BUCKET"])
def bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA,
                  stride_qb, stride_qh, stride_qn,
                  stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn,
                  stride_dob, stride_doh, stride_don,
                  stride_dqb, stride_dqh, stride_dqn,
                  n_heads, n_q, n_k, head_dim, scale, qk_scale, N_BUCKET,
                  CAUSAL: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                  DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid ``(cdiv(n_q, BLOCK_M), B * H)``. Writes ``dQ`` of its query rows once."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m                      # heaviest blocks first
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    q_ok = row_ok[:, None] & (offs_d[None, :] < head_dim)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=q_ok, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=q_ok, other=0.0)
    lse2 = tl.load(LSE + bh.to(tl.int64) * n_q + offs_m, mask=row_ok, other=0.0) * LOG2E_C
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if CAUSAL:
        free_end = (tl.minimum(start_m, n_k) // BLOCK_N) * BLOCK_N
        masked_end = tl.minimum(start_m + BLOCK_M, n_k)
    else:
        free_end = (n_k // BLOCK_N) * BLOCK_N
        masked_end = n_k
    dq = _dq_key_loop(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                      offs_m, offs_n0, offs_d, 0, free_end, n_k, head_dim, qk_scale,
                      BLOCK_N, False, CAUSAL, PAD_D, DOT_PREC)
    dq = _dq_key_loop(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                      offs_m, offs_n0, offs_d, free_end, masked_end, n_k, head_dim, qk_scale,
                      BLOCK_N, True, CAUSAL, PAD_D, DOT_PREC)
    dq = dq * scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=q_ok)

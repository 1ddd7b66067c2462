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

``dS`` is rounded to the input dtype (16 bits for float16/bfloat16) before the ``dK`` and ``dQ``
products, as FlashAttention-2 does, so that they run on the 16-bit tensor cores. ``DS_FP32=True``
keeps it in float32 (exact float32 products, slow): a switch for measuring what that rounding
costs, not for speed.

Splitting ``dQ`` out costs a second recomputation of ``Q K^T`` and ``dO V^T`` (seven tile
products per tile pair instead of five) but every program owns the rows it writes, so there
are no atomic additions and the result is deterministic. The five-product alternative is there
too (``FUSED_DQ``: the dK/dV program adds ``dS K`` into a float32 ``dQ`` with atomics, as
FlashAttention-2's CUDA backward does); on the H200 it measured slower (windowed backward at
N = 16384: 4.1-4.2 ms against 3.4-3.5 ms split), so the split kernels are the default.

The kernels take the transposed view in the dK/dV kernel (``S^T = K Q^T``), so that ``P^T``
comes out of the product directly and needs no transpose before ``P^T dO``.

Grouped-query heads: a dK/dV program belongs to one key/value head and loops over the query
heads of its group, adding their contributions into the same on-chip accumulators, then
writes ``dK``/``dV`` once. That keeps the kernel free of atomics and deterministic, reads each
K/V tile once per group, and needs neither a per-query-head copy of K/V nor a per-query-head
``dK``/``dV`` buffer to reduce afterwards (``H / Hkv`` times the memory of ``dK`` and ``dV``).
The query loops use ``query_range``, the inverse of the forward's ``key_range``, so query
blocks that see none of the program's keys (before the diagonal, past the window) are skipped.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..constants import LOG2E
from .forward import key_range, seq_bounds, visible

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
    rows = offs_m.to(tl.int64)[:, None]
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)
    o = tl.load(O + b * stride_ob + h * stride_oh + rows * stride_on + offs_d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows * stride_don
                 + offs_d[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * n_q + offs_m, tl.sum(o * do, 1),
             mask=offs_m < n_q)


@triton.jit
def query_range(n0, n_q, n_k, off, window, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query tiles for keys ``[n0, n0 + BLOCK_N)``: ``[lo, a)`` masked, ``[a, b)`` unmasked,
    ``[b, hi)`` masked, on the grid of multiples of ``BLOCK_M`` whatever ``BLOCK_N`` is (tiles
    never overlap, for any pair of tile sizes)."""
    if CAUSAL:
        lo = (tl.maximum(n0 - off, 0) // BLOCK_M) * BLOCK_M       # row i sees key j when i >= j - off
        # rows from n0 + BLOCK_N - 1 - off on see every key of the block (causally)
        a = tl.maximum(tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M, lo)
        if WINDOW:
            hi = tl.minimum(n_q, n0 + BLOCK_N - 1 - off + window)
            # rows below n0 - off + window still have the block's first key inside their window
            b = tl.minimum((tl.maximum(n0 - off + window, 0) // BLOCK_M) * BLOCK_M,
                           (n_q // BLOCK_M) * BLOCK_M)
        else:
            hi = n_q
            b = (n_q // BLOCK_M) * BLOCK_M
    else:
        hi = n_q
        b = (n_q // BLOCK_M) * BLOCK_M
        lo = hi * 0
        a = lo
    hi = tl.where(n0 < n_k, hi, 0)      # a program past its (packed) sequence's end: no work
    a = tl.minimum(a, hi)
    b = tl.maximum(a, tl.minimum(b, hi))
    return lo, a, b, hi


@triton.jit
def _dkdv_query_loop(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
                     stride_qn, stride_don, stride_dqn, offs_n, offs_m0, offs_d,
                     start, end, n_q, n_k, head_dim, qk_scale, off, window,
                     BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                     CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                     PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                     DS_FP32: tl.constexpr, FUSED_DQ: tl.constexpr,
                     WIDE_ROWS: tl.constexpr):
    d_ok = offs_d[None, :] < head_dim
    if WIDE_ROWS:
        # row * stride can pass 2**31: the first tile's offset in 64 bits, then
        # pointer steps
        q_ptrs = (q_base + start.to(tl.int64) * stride_qn
                  + offs_m0[:, None] * stride_qn + offs_d[None, :])
        do_ptrs = (do_base + start.to(tl.int64) * stride_don
                   + offs_m0[:, None] * stride_don + offs_d[None, :])
        if FUSED_DQ:
            dq_ptrs = (dq_base + start.to(tl.int64) * stride_dqn
                       + offs_m0[:, None] * stride_dqn + offs_d[None, :])
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + offs_m0
        if not WIDE_ROWS:
            # 32-bit offsets from the row numbers, recomputed each tile: pointer
            # tensors carried from tile to tile stay live across the software
            # pipeline and made this kernel spill registers (ptxas -v, sm_90a:
            # 132 bytes at 32x128 with 8 warps, 0 without them)
            q_ptrs = q_base + rows[:, None] * stride_qn + offs_d[None, :]
            do_ptrs = do_base + rows[:, None] * stride_don + offs_d[None, :]
            if FUSED_DQ:
                dq_ptrs = dq_base + rows[:, None] * stride_dqn + offs_d[None, :]
        if MASKED:
            row_ok = rows < n_q
            q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok, other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None] & d_ok, other=0.0)
            lse = tl.load(lse_base + rows, mask=row_ok, other=0.0)
            # a row that saw no key has lse = -inf: +inf makes its recomputed P
            # exactly 0
            lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E_C)
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
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)  # (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])  # P^T, already normalised
        if MASKED:
            keep = visible(rows[None, :], offs_n[:, None], n_k, off, window,
                           CAUSAL, WINDOW)
            p_t = tl.where(keep & (rows[None, :] < n_q), p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # (dO V^T)^T
        ds_t = p_t * (dp_t - delta[None, :])
        if DS_FP32:  # chapter 07: what rounding dS to 16 bits costs
            dk = tl.dot(ds_t, q.to(tl.float32), dk, input_precision="ieee")
            if FUSED_DQ:
                dq_part = tl.dot(tl.trans(ds_t), k.to(tl.float32),
                                 input_precision="ieee")
        else:
            ds_lo = ds_t.to(q.dtype)
            dk = tl.dot(ds_lo, q, dk, input_precision=DOT_PREC)
            if FUSED_DQ:
                dq_part = tl.dot(tl.trans(ds_lo), k, input_precision=DOT_PREC)
        if FUSED_DQ:
            # other key blocks add to the same rows at the same time: float32 atomics
            # (unscaled; the caller multiplies by ``scale`` once when it casts dQ back)
            if MASKED:
                tl.atomic_add(dq_ptrs, dq_part, mask=(rows < n_q)[:, None] & d_ok,
                              sem="relaxed")
            elif PAD_D:
                tl.atomic_add(dq_ptrs, dq_part, mask=d_ok, sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq_part, sem="relaxed")
        if WIDE_ROWS:
            q_ptrs += BLOCK_M * stride_qn
            do_ptrs += BLOCK_M * stride_don
            if FUSED_DQ:
                dq_ptrs += BLOCK_M * stride_dqn
    return dk, dv


# lengths are not specialised on: one compilation serves every sequence length
@triton.jit(do_not_specialize=["n_q", "n_k", "N_BUCKET", "window", "group"])
def bwd_dkdv_kernel(Q, K, V, DO, DK, DV, DQ, LSE, DELTA, CU_Q, CU_K, FLAG,
                    stride_qb, stride_qh, stride_qn,
                    stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn,
                    stride_dob, stride_doh, stride_don,
                    stride_dkb, stride_dkh, stride_dkn,
                    stride_dvb, stride_dvh, stride_dvn,
                    stride_dqb, stride_dqh, stride_dqn,
                    stride_lb, stride_lh,
                    n_kv_heads, group, n_q, n_k, head_dim,
                    scale, qk_scale, window, N_BUCKET,
                    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                    WINDOW: tl.constexpr, VARLEN: tl.constexpr,
                    BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    DS_FP32: tl.constexpr = False, FUSED_DQ: tl.constexpr = False,
                    GROUPED: tl.constexpr = True, WIDE_ROWS: tl.constexpr = True):
    """Grid ``(cdiv(max n_k, BLOCK_N), B * Hkv)``. Writes ``dK`` and ``dV`` of its keys
    once, summed over the ``group`` query heads that share its key/value head. With
    ``FUSED_DQ`` it also adds its share of ``dQ / scale`` into the float32 ``DQ``
    (zeroed by the caller) with atomics, and no ``bwd_dq_kernel`` is needed.
    ``GROUPED=False`` (one query head per key/value head) drops the loop over the group,
    whose loop-carried state cost registers; ``WIDE_ROWS`` keeps the query rows' offsets
    in 64 bits (needed once ``n_q * stride`` passes 2**31). ``FLAG`` (one int32, zeroed
    by the caller) is set to 1 by a program whose dK or dV is not finite: the overflow
    guard."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_kv_heads
    h_kv = bh % n_kv_heads
    q_start, n_q = seq_bounds(CU_Q, b, n_q, VARLEN)
    k_start, n_k = seq_bounds(CU_K, b, n_k, VARLEN)
    b = b.to(tl.int64)
    h_kv = h_kv.to(tl.int64)
    off = n_k - n_q if BOTTOM_RIGHT else 0
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    rows_n = (k_start + offs_n)[:, None]
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (offs_n[:, None] < n_k) & (offs_d[None, :] < head_dim)
    k = tl.load(K + b * stride_kb + h_kv * stride_kh + rows_n * stride_kn
                + offs_d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(V + b * stride_vb + h_kv * stride_vh + rows_n * stride_vn
                + offs_d[None, :], mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lo, a, b_end, hi = query_range(start_n, n_q, n_k, off, window,
                                   CAUSAL, WINDOW, BLOCK_M, BLOCK_N)

    # one query head per key/value head: a loop of one trip known when compiling,
    # which the compiler removes (a loop over a runtime count kept state live and
    # cost registers)
    # the query heads that read this key/value head
    for g in range(0, group if GROUPED else 1):
        h = h_kv * group + g
        q_base = Q + b * stride_qb + h * stride_qh + q_start * stride_qn
        do_base = DO + b * stride_dob + h * stride_doh + q_start * stride_don
        lse_base = LSE + b * stride_lb + h * stride_lh + q_start
        delta_base = DELTA + b * stride_lb + h * stride_lh + q_start
        dq_base = DQ + b * stride_dqb + h * stride_dqh + q_start * stride_dqn
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
            stride_qn, stride_don, stride_dqn, offs_n, offs_m0, offs_d,
            lo, a, n_q, n_k, head_dim, qk_scale, off, window, BLOCK_M, True,
            CAUSAL, WINDOW, PAD_D, DOT_PREC, DS_FP32, FUSED_DQ, WIDE_ROWS)
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
            stride_qn, stride_don, stride_dqn, offs_n, offs_m0, offs_d,
            a, b_end, n_q, n_k, head_dim, qk_scale, off, window, BLOCK_M, False,
            CAUSAL, WINDOW, PAD_D, DOT_PREC, DS_FP32, FUSED_DQ, WIDE_ROWS)
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base,
            stride_qn, stride_don, stride_dqn, offs_n, offs_m0, offs_d,
            b_end, hi, n_q, n_k, head_dim, qk_scale, off, window, BLOCK_M, True,
            CAUSAL, WINDOW, PAD_D, DOT_PREC, DS_FP32, FUSED_DQ, WIDE_ROWS)

    dk = (dk * scale).to(DK.dtype.element_ty)
    dv = dv.to(DV.dtype.element_ty)
    tl.store(DK + b * stride_dkb + h_kv * stride_dkh + rows_n * stride_dkn
             + offs_d[None, :], dk, mask=kv_ok)
    tl.store(DV + b * stride_dvb + h_kv * stride_dvh + rows_n * stride_dvn
             + offs_d[None, :], dv, mask=kv_ok)
    # overflow guard: a NaN or an infinity in this program's dK or dV raises the flag
    # (x * 0 is 0 for a finite x, NaN otherwise)
    health = tl.sum(tl.sum(dk.to(tl.float32) * 0.0 + dv.to(tl.float32) * 0.0, 1), 0)
    tl.store(FLAG, 1, mask=health != 0.0)


@triton.jit
def _dq_key_loop(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                 offs_m, offs_n0, offs_d, start, end, n_k, head_dim, qk_scale, off, window,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 WINDOW: tl.constexpr, PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                 DS_FP32: tl.constexpr):
    d_ok = offs_d[None, :] < head_dim
    k_ptrs = k_base + start.to(tl.int64) * stride_kn + offs_n0[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = v_base + start.to(tl.int64) * stride_vn + offs_n0[:, None] * stride_vn + offs_d[None, :]
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n0
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
            p = tl.where(visible(offs_m[:, None], cols[None, :], n_k, off, window, CAUSAL, WINDOW),
                         p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        if DS_FP32:
            dq = tl.dot(ds, k.to(tl.float32), dq, input_precision="ieee")
        else:
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return dq


# lengths are not specialised on: one compilation serves every sequence length
@triton.jit(do_not_specialize=["n_q", "n_k", "N_BUCKET", "window", "group"])
def bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, CU_Q, CU_K, FLAG,
                  stride_qb, stride_qh, stride_qn,
                  stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn,
                  stride_dob, stride_doh, stride_don,
                  stride_dqb, stride_dqh, stride_dqn,
                  stride_lb, stride_lh,
                  n_heads, group, n_q, n_k, head_dim,
                  scale, qk_scale, window, N_BUCKET,
                  CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                  WINDOW: tl.constexpr, VARLEN: tl.constexpr,
                  BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  DS_FP32: tl.constexpr = False):
    """Grid ``(cdiv(max n_q, BLOCK_M), B * H)``. Writes ``dQ`` of its query rows
    once, and sets ``FLAG`` to 1 when they are not finite."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # heaviest blocks first
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    q_start, n_q = seq_bounds(CU_Q, b, n_q, VARLEN)
    k_start, n_k = seq_bounds(CU_K, b, n_k, VARLEN)
    b = b.to(tl.int64)
    h = h.to(tl.int64)
    h_kv = h // group
    off = n_k - n_q if BOTTOM_RIGHT else 0
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = (q_start + offs_m)[:, None]
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    q_ok = row_ok[:, None] & (offs_d[None, :] < head_dim)
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows * stride_qn + offs_d[None, :],
                mask=q_ok, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows * stride_don
                 + offs_d[None, :], mask=q_ok, other=0.0)
    l_base = b * stride_lb + h * stride_lh + q_start
    lse = tl.load(LSE + l_base + offs_m, mask=row_ok, other=0.0)
    # a row that saw no key has lse = -inf: +inf makes its recomputed P exactly 0
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E_C)
    delta = tl.load(DELTA + l_base + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + h_kv * stride_kh + k_start * stride_kn
    v_base = V + b * stride_vb + h_kv * stride_vh + k_start * stride_vn
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, a, b_end, hi = key_range(start_m, n_q, n_k, off, window,
                                 CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
    if WINDOW:
        dq = _dq_key_loop(
            dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
            offs_m, offs_n0, offs_d, lo, a, n_k, head_dim, qk_scale, off, window,
            BLOCK_N, True, CAUSAL, WINDOW, PAD_D, DOT_PREC, DS_FP32)
    dq = _dq_key_loop(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
        offs_m, offs_n0, offs_d, a, b_end, n_k, head_dim, qk_scale, off, window,
        BLOCK_N, False, CAUSAL, WINDOW, PAD_D, DOT_PREC, DS_FP32)
    dq = _dq_key_loop(
        dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
        offs_m, offs_n0, offs_d, b_end, hi, n_k, head_dim, qk_scale, off, window,
        BLOCK_N, True, CAUSAL, WINDOW, PAD_D, DOT_PREC, DS_FP32)
    dq = (dq * scale).to(DQ.dtype.element_ty)
    tl.store(DQ + b * stride_dqb + h * stride_dqh + rows * stride_dqn + offs_d[None, :],
             dq, mask=q_ok)
    # overflow guard: a NaN or an infinity in this program's dQ raises the flag
    health = tl.sum(tl.sum(dq.to(tl.float32) * 0.0, 1), 0)
    tl.store(FLAG, 1, mask=health != 0.0)

"""The fused FlashAttention-2 forward kernel in Triton.

One program owns ``BLOCK_M`` query rows of one (batch, head): it loads them once, walks the
key/value tiles with the online softmax kept in registers (running max ``m``, running sum
``l``, output accumulator ``acc``), and writes its output rows and their log-sum-exp once.

Scores are carried in base 2: ``qk_scale = scale * log2(e)`` turns ``exp(scale * s - m)`` into
``exp2(qk_scale * s - m2)``, and the subtract-and-scale becomes one fused multiply-add per
score, with ``exp2`` the GPU's native exponential. The log-sum-exp is converted back to natural
log (times ``ln 2``) when it is stored.

The key loop runs in three parts, computed by ``key_range`` from the causal diagonal and the
window: tiles that cross the window's trailing edge (masked), tiles every row sees in full
(plain loads, no mask), then the tiles that cross the diagonal or the end of the keys (masked).
Tiles outside that range (above the diagonal, or wholly behind every row's window) are never
visited. Without a mask the first part is empty and the last holds only the ragged end.

Options for real models: grouped-query heads (the program of query head ``h`` reads key/value
head ``h // GROUP``), the bottom-right alignment (query ``i`` sees keys ``j <= i + Nk - Nq``), a
sliding window, and packed variable-length batches (``VARLEN``: sequence ``b`` is rows
``cu_seqlens[b]:cu_seqlens[b+1]``; programs past a short sequence's end do nothing). Row
offsets are 64-bit (``row * stride`` exceeds 2**31 in large strided views).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..constants import LN2, LOG2E

# @triton.jit code reads module globals only when they are tl.constexpr
LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)


@triton.jit
def seq_bounds(CU, b, n, VARLEN: tl.constexpr):
    """(first row, length) of sequence ``b``: from ``cu_seqlens`` when packed, else (0, n)."""
    if VARLEN:
        start = tl.load(CU + b)
        length = tl.load(CU + b + 1) - start
        start = start.to(tl.int64)
    else:
        start = (n * 0).to(tl.int64)
        length = n
    return start, length


@triton.jit
def key_range(m0, n_q, n_k, off, window, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tiles for query rows ``[m0, m0 + BLOCK_M)``: ``[lo, a)`` masked, ``[a, b)`` unmasked,
    ``[b, hi)`` masked, all on the grid of multiples of ``BLOCK_N``. Query ``i`` sees key ``j``
    when ``j <= i + off`` (causal) and ``j > i + off - window`` (window)."""
    if CAUSAL:
        hi = tl.maximum(tl.minimum(n_k, m0 + BLOCK_M + off), 0)
        # keys below m0 + off are visible (causally) to every row of the block
        b = (tl.maximum(tl.minimum(m0 + off, n_k), 0) // BLOCK_N) * BLOCK_N
        if WINDOW:
            lo = (tl.maximum(m0 + off - window + 1, 0) // BLOCK_N) * BLOCK_N
            # the block's last row sees keys from m0 + BLOCK_M + off - window on
            a = tl.maximum(tl.cdiv(tl.maximum(m0 + BLOCK_M + off - window, 0), BLOCK_N) * BLOCK_N, lo)
        else:
            lo = hi * 0
            a = lo
    else:
        hi = n_k
        b = (n_k // BLOCK_N) * BLOCK_N
        lo = hi * 0
        a = lo
    hi = tl.where(m0 < n_q, hi, 0)      # a program past its (packed) sequence's end: no work
    a = tl.minimum(a, hi)
    b = tl.maximum(a, tl.minimum(b, hi))
    return lo, a, b, hi


@triton.jit
def visible(rows, cols, n_k, off, window, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """``(rows, cols)`` mask of the keys each query row sees (``rows`` a column vector)."""
    keep = cols < n_k
    if CAUSAL:
        keep = keep & (cols <= rows + off)
    if WINDOW:
        keep = keep & (cols > rows + off - window)
    return keep


@triton.jit
def _fwd_key_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                  offs_m, offs_n, offs_d, start, end, n_k, head_dim, qk_scale,
                  off, window, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                  CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                  PAD_D: tl.constexpr, DOT_PREC: tl.constexpr):
    d_ok = offs_d[None, :] < head_dim
    # the first tile's row offset in 64 bits (row * stride can pass 2**31), then
    # pointer steps
    k_ptrs = (k_base + start.to(tl.int64) * stride_kn
              + offs_n[:, None] * stride_kn + offs_d[None, :])
    v_ptrs = (v_base + start.to(tl.int64) * stride_vn
              + offs_n[:, None] * stride_vn + offs_d[None, :])
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
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
        # (BLOCK_M, BLOCK_N), raw q.k
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if MASKED:
            s = tl.where(visible(offs_m[:, None], cols[None, :], n_k, off, window,
                                 CAUSAL, WINDOW),
                         s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            # a row that has seen no key yet keeps m = -inf; exp2(-inf - -inf) would
            # be NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_use = m_new
        p = tl.math.exp2(s * qk_scale - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)  # rescales what was summed under m_i
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


# lengths are not specialised on: one compilation serves every sequence length
@triton.jit(do_not_specialize=["n_q", "n_k", "N_BUCKET", "window", "group"])
def attn_fwd_kernel(Q, K, V, O, LSE, CU_Q, CU_K,
                    stride_qb, stride_qh, stride_qn,
                    stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn,
                    stride_ob, stride_oh, stride_on,
                    stride_lb, stride_lh,
                    n_heads, group, n_q, n_k, head_dim, qk_scale, window, N_BUCKET,
                    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                    WINDOW: tl.constexpr, VARLEN: tl.constexpr,
                    BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid: ``(cdiv(max n_q, BLOCK_M), B * H)``. ``LSE`` row ``i`` of (b, h) is at
    ``b * stride_lb + h * stride_lh + first row + i``, float32, natural log."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        # the last query blocks have the most keys to visit: start them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    q_start, n_q = seq_bounds(CU_Q, b, n_q, VARLEN)
    k_start, n_k = seq_bounds(CU_K, b, n_k, VARLEN)
    b = b.to(tl.int64)
    h = h.to(tl.int64)
    h_kv = h // group  # grouped-query: heads share K and V
    off = n_k - n_q if BOTTOM_RIGHT else 0
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = (Q + b * stride_qb + h * stride_qh
              + (q_start + offs_m[:, None]) * stride_qn + offs_d[None, :])
    q_ok = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    k_base = K + b * stride_kb + h_kv * stride_kh + k_start * stride_kn
    v_base = V + b * stride_vb + h_kv * stride_vh + k_start * stride_vn

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, a, b_end, hi = key_range(start_m, n_q, n_k, off, window,
                                 CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
    if WINDOW:
        acc, l_i, m_i = _fwd_key_loop(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
            offs_m, offs_n, offs_d, lo, a, n_k, head_dim, qk_scale,
            off, window, BLOCK_N, True, CAUSAL, WINDOW, PAD_D, DOT_PREC)
    acc, l_i, m_i = _fwd_key_loop(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
        offs_m, offs_n, offs_d, a, b_end, n_k, head_dim, qk_scale,
        off, window, BLOCK_N, False, CAUSAL, WINDOW, PAD_D, DOT_PREC)
    acc, l_i, m_i = _fwd_key_loop(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
        offs_m, offs_n, offs_d, b_end, hi, n_k, head_dim, qk_scale,
        off, window, BLOCK_N, True, CAUSAL, WINDOW, PAD_D, DOT_PREC)

    # a row that sees no key (bottom-right with Nq > Nk, or a window) has l = 0:
    # o = 0, lse = -inf
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]  # normalise once, at the end
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2_C, float("-inf"))
    # + 0, or NaN for a row whose output is not finite (overflow): the host's guard then
    # reads the lse alone, D times smaller than the output
    lse += tl.sum(acc * 0.0, 1)
    row_ok = offs_m < n_q
    tl.store(LSE + b * stride_lb + h * stride_lh + q_start + offs_m, lse, mask=row_ok)
    o_ptrs = (O + b * stride_ob + h * stride_oh
              + (q_start + offs_m[:, None]) * stride_on + offs_d[None, :])
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=q_ok)

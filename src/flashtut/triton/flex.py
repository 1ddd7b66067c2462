"""FlexAttention in Triton: the FlashAttention-2 kernels, walking a block mask's lists.

The kernels of ``forward.py`` and ``backward.py`` compute which key tiles a query block visits
from the causal diagonal and the window (``key_range``). Here the same loops read that from a
:class:`flashtut.block_mask.BlockMask` instead: per query block, the list of its **full** key blocks
(visited without any mask) and the list of its **partial** ones (visited with ``MASK_MOD``
evaluated on the tile, and bounds checks); empty blocks are not in either list, so they cost
nothing. One mechanism then serves causal, windows, documents, prefix-LM and any mask a reader
writes.

The lists are in units of the mask's blocks (``Q_BLOCK x KV_BLOCK``, 128 x 128 by default); a
kernel tile may be smaller (it divides the mask block) and then visits each listed block in
``KV_BLOCK // BLOCK_N`` steps of one flat loop (one loop, so the compiler pipelines its loads).

``SCORE_MOD`` and ``MASK_MOD`` are ``@triton.jit`` functions passed as ``tl.constexpr``
arguments, generated from the user's PyTorch functions by ``flashtut.triton.mods``; each mod
compiles its own kernel. ``HAS_SCORE``/``HAS_MASK`` are off without one, and the loops are then
the plain FlashAttention-2 ones (the scale folded into ``exp2``'s argument). A score mod sees the
scaled score ``scale * q . k`` in natural units, as PyTorch's FlexAttention does; its result is
carried in base 2 from there on. The backward multiplies ``dS`` by the mod's derivative
(``SCORE_GRAD``), and the dQ kernel, which visits every (query, key) pair of a head exactly once,
adds the gradients of the tensors the mod captures (``SCORE_GRAD_PARAMS``).

Grouped-query heads as in ``backward.py``: a dK/dV program owns one key/value head and loops over
the query heads of its group, each with its own lists (a mask may depend on the head).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..constants import LN2, LOG2E

LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)


@triton.jit
def no_score_mod(s, b, h, q_idx, kv_idx, X0, X1, X2, X3):
    """Stand-in for an absent score mod (never called: ``HAS_SCORE`` is off)."""
    return s


@triton.jit
def no_score_grad(s, b, h, q_idx, kv_idx, g, X0, X1, X2, X3):
    return g


@triton.jit
def no_score_grad_params(s, b, h, q_idx, kv_idx, g, X0, X1, X2, X3, G0, G1, G2, G3, VALID):
    return g


@triton.jit
def no_mask_mod(b, h, q_idx, kv_idx, X0, X1, X2, X3):
    """Stand-in for an absent mask mod (never called: ``HAS_MASK`` is off)."""
    return q_idx >= 0


@triton.jit
def _listed_tiles(a_base, b_base, stride_a, stride_b, idx_ptr, it, offs, offs_d, d_ok, n,
                  PARTIAL: tl.constexpr, PAD_D: tl.constexpr, BLOCK: tl.constexpr, LIST_BLOCK: tl.constexpr):
    """Step ``it`` of a walk over listed blocks of ``LIST_BLOCK`` rows, ``BLOCK`` rows a step: the rows
    (``idx``; clamped in bounds for the mods, ``idx_c``) and their tiles of two tensors (K and V, or Q
    and dO). ``PARTIAL``: rows past ``n`` read as zeros; a full block needs no bounds."""
    blk = tl.load(idx_ptr + it // (LIST_BLOCK // BLOCK))
    idx = blk * LIST_BLOCK + (it % (LIST_BLOCK // BLOCK)) * BLOCK + offs
    a_ptrs = a_base + idx[:, None] * stride_a + offs_d[None, :]
    b_ptrs = b_base + idx[:, None] * stride_b + offs_d[None, :]
    if PARTIAL:
        ok = (idx[:, None] < n) & d_ok
        a = tl.load(a_ptrs, mask=ok, other=0.0)
        b = tl.load(b_ptrs, mask=ok, other=0.0)
        idx_c = tl.minimum(idx, n - 1)
    else:
        if PAD_D:
            a = tl.load(a_ptrs, mask=d_ok, other=0.0)
            b = tl.load(b_ptrs, mask=d_ok, other=0.0)
        else:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        idx_c = idx
    return a, b, idx, idx_c


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, n_listed, idx_ptr,
                b, h, rows, offs_n, offs_d, n_q, n_k, head_dim, sm_scale, qk_scale,
                X0, X1, X2, X3, M0, M1, M2, M3,
                SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
                HAS_SCORE: tl.constexpr, HAS_MASK: tl.constexpr, PARTIAL: tl.constexpr,
                PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                BLOCK_N: tl.constexpr, KV_BLOCK: tl.constexpr):
    """The online softmax over the listed key blocks; ``PARTIAL``: apply the mask and bounds."""
    RATIO: tl.constexpr = KV_BLOCK // BLOCK_N
    d_ok = offs_d[None, :] < head_dim
    rows_c = tl.minimum(rows, n_q - 1)          # padding rows read the mods in bounds
    for it in range(0, n_listed * RATIO):
        k, v, cols, cols_c = _listed_tiles(k_base, v_base, stride_kn, stride_vn, idx_ptr, it, offs_n, offs_d,
                                           d_ok, n_k, PARTIAL, PAD_D, BLOCK_N, KV_BLOCK)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if HAS_SCORE:
            s = SCORE_MOD(s * sm_scale, b, h, rows_c[:, None], cols_c[None, :], X0, X1, X2, X3) * LOG2E_C
        else:
            s = s * qk_scale
        if PARTIAL:
            keep = cols[None, :] < n_k
            if HAS_MASK:
                keep = keep & MASK_MOD(b, h, rows_c[:, None], cols_c[None, :], M0, M1, M2, M3)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if PARTIAL or HAS_SCORE:
            # a row that has seen no key yet keeps m = -inf: exp2(-inf - -inf) would be NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["n_q", "n_k", "group", "n_kb", "nb_sb", "nb_sh"])
def flex_fwd_kernel(Q, K, V, O, LSE,
                    KV_NUM, KV_IDX, FULL_NUM, FULL_IDX,
                    X0, X1, X2, X3, M0, M1, M2, M3,
                    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                    nb_sb, nb_sh, n_kb,
                    n_heads, group, n_q, n_k, head_dim, sm_scale, qk_scale,
                    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
                    HAS_SCORE: tl.constexpr, HAS_MASK: tl.constexpr,
                    BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    Q_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr):
    """Grid ``(cdiv(n_q, BLOCK_M), B * H)``. ``KV_NUM``/``FULL_NUM`` ``(B', H', query blocks)``
    and ``KV_IDX``/``FULL_IDX`` ``(B', H', query blocks, n_kb)``, with ``nb_sb``/``nb_sh`` their
    batch and head strides in rows (0 where the mask is shared). ``LSE`` ``(B, H, n_q)``."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)      # the last query blocks tend to see most
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    q_ok = (rows[:, None] < n_q) & (offs_d[None, :] < head_dim)
    q = tl.load(Q + b64 * stride_qb + h64 * stride_qh + rows[:, None] * stride_qn + offs_d[None, :],
                mask=q_ok, other=0.0)
    k_base = K + b64 * stride_kb + (h64 // group) * stride_kh
    v_base = V + b64 * stride_vb + (h64 // group) * stride_vh
    # this program's row of the block mask
    row = (b * nb_sb + h * nb_sh + start_m // Q_BLOCK).to(tl.int64)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, l_i, m_i = _fwd_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, tl.load(FULL_NUM + row), FULL_IDX + row * n_kb,
        b, h, rows, offs_n, offs_d, n_q, n_k, head_dim, sm_scale, qk_scale,
        X0, X1, X2, X3, M0, M1, M2, M3, SCORE_MOD, MASK_MOD, HAS_SCORE, HAS_MASK, False,
        PAD_D, DOT_PREC, BLOCK_N, KV_BLOCK)
    acc, l_i, m_i = _fwd_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, tl.load(KV_NUM + row), KV_IDX + row * n_kb,
        b, h, rows, offs_n, offs_d, n_q, n_k, head_dim, sm_scale, qk_scale,
        X0, X1, X2, X3, M0, M1, M2, M3, SCORE_MOD, MASK_MOD, HAS_SCORE, HAS_MASK, True,
        PAD_D, DOT_PREC, BLOCK_N, KV_BLOCK)

    # a row that sees no key has l = 0: o = 0, lse = -inf
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2_C, float("-inf"))
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)
    tl.store(O + b64 * stride_ob + h64 * stride_oh + rows[:, None] * stride_on + offs_d[None, :],
             acc.to(O.dtype.element_ty), mask=q_ok)


@triton.jit
def _dq_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, n_listed, idx_ptr,
               b, h, rows, offs_n, offs_d, n_q, n_k, head_dim, sm_scale, qk_scale,
               X0, X1, X2, X3, M0, M1, M2, M3, G0, G1, G2, G3,
               SCORE_MOD: tl.constexpr, SCORE_GRAD_PARAMS: tl.constexpr, MASK_MOD: tl.constexpr,
               HAS_SCORE: tl.constexpr, HAS_MASK: tl.constexpr, PARTIAL: tl.constexpr,
               PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
               BLOCK_N: tl.constexpr, KV_BLOCK: tl.constexpr):
    RATIO: tl.constexpr = KV_BLOCK // BLOCK_N
    d_ok = offs_d[None, :] < head_dim
    rows_c = tl.minimum(rows, n_q - 1)
    for it in range(0, n_listed * RATIO):
        k, v, cols, cols_c = _listed_tiles(k_base, v_base, stride_kn, stride_vn, idx_ptr, it, offs_n, offs_d,
                                           d_ok, n_k, PARTIAL, PAD_D, BLOCK_N, KV_BLOCK)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if HAS_SCORE:
            s_nat = s * sm_scale
            p = tl.math.exp2(SCORE_MOD(s_nat, b, h, rows_c[:, None], cols_c[None, :], X0, X1, X2, X3) * LOG2E_C
                             - lse2[:, None])
        else:
            p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if PARTIAL:
            keep = (cols[None, :] < n_k) & (rows[:, None] < n_q)
            if HAS_MASK:
                keep = keep & MASK_MOD(b, h, rows_c[:, None], cols_c[None, :], M0, M1, M2, M3)
            p = tl.where(keep, p, 0.0)
        else:
            keep = rows[:, None] >= 0
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        if HAS_SCORE:   # through the mod: d score_mod / d score, and the captured tensors' gradients
            ds = SCORE_GRAD_PARAMS(s_nat, b, h, rows_c[:, None], cols_c[None, :], ds,
                                   X0, X1, X2, X3, G0, G1, G2, G3, keep)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit(do_not_specialize=["n_q", "n_k", "group", "n_kb", "nb_sb", "nb_sh"])
def flex_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA,
                   KV_NUM, KV_IDX, FULL_NUM, FULL_IDX,
                   X0, X1, X2, X3, M0, M1, M2, M3, G0, G1, G2, G3,
                   stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                   stride_dqb, stride_dqh, stride_dqn,
                   nb_sb, nb_sh, n_kb,
                   n_heads, group, n_q, n_k, head_dim, sm_scale, qk_scale,
                   SCORE_MOD: tl.constexpr, SCORE_GRAD_PARAMS: tl.constexpr, MASK_MOD: tl.constexpr,
                   HAS_SCORE: tl.constexpr, HAS_MASK: tl.constexpr,
                   BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   Q_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr):
    """Grid ``(cdiv(n_q, BLOCK_M), B * H)``: ``dQ`` of its rows, once; ``G*`` (float32, zeroed)
    gather the gradients of the score mod's captured tensors."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    row_ok = rows < n_q
    q_ok = row_ok[:, None] & (offs_d[None, :] < head_dim)
    q = tl.load(Q + b64 * stride_qb + h64 * stride_qh + rows[:, None] * stride_qn + offs_d[None, :],
                mask=q_ok, other=0.0)
    do = tl.load(DO + b64 * stride_dob + h64 * stride_doh + rows[:, None] * stride_don + offs_d[None, :],
                 mask=q_ok, other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * n_q + rows, mask=row_ok, other=0.0)
    # a row that saw no key has lse = -inf: +inf makes its recomputed P exactly 0
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E_C)
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + rows, mask=row_ok, other=0.0)
    k_base = K + b64 * stride_kb + (h64 // group) * stride_kh
    v_base = V + b64 * stride_vb + (h64 // group) * stride_vh
    row = (b * nb_sb + h * nb_sh + start_m // Q_BLOCK).to(tl.int64)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _dq_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                    tl.load(FULL_NUM + row), FULL_IDX + row * n_kb, b, h, rows, offs_n, offs_d,
                    n_q, n_k, head_dim, sm_scale, qk_scale, X0, X1, X2, X3, M0, M1, M2, M3, G0, G1, G2, G3,
                    SCORE_MOD, SCORE_GRAD_PARAMS, MASK_MOD, HAS_SCORE, HAS_MASK, False,
                    PAD_D, DOT_PREC, BLOCK_N, KV_BLOCK)
    dq = _dq_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                    tl.load(KV_NUM + row), KV_IDX + row * n_kb, b, h, rows, offs_n, offs_d,
                    n_q, n_k, head_dim, sm_scale, qk_scale, X0, X1, X2, X3, M0, M1, M2, M3, G0, G1, G2, G3,
                    SCORE_MOD, SCORE_GRAD_PARAMS, MASK_MOD, HAS_SCORE, HAS_MASK, True,
                    PAD_D, DOT_PREC, BLOCK_N, KV_BLOCK)
    tl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + rows[:, None] * stride_dqn + offs_d[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_ok)


@triton.jit
def _dkdv_blocks(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qn, stride_don,
                 n_listed, idx_ptr, b, h, cols, offs_m, offs_d, n_q, n_k, head_dim, sm_scale, qk_scale,
                 X0, X1, X2, X3, M0, M1, M2, M3,
                 SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
                 HAS_SCORE: tl.constexpr, HAS_MASK: tl.constexpr, PARTIAL: tl.constexpr,
                 PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                 BLOCK_M: tl.constexpr, Q_BLOCK: tl.constexpr):
    """Stream the listed query blocks past this program's keys, in the transposed view
    (``S^T = K Q^T``: ``P^T`` comes out ready for ``P^T dO``)."""
    RATIO: tl.constexpr = Q_BLOCK // BLOCK_M
    d_ok = offs_d[None, :] < head_dim
    cols_c = tl.minimum(cols, n_k - 1)
    for it in range(0, n_listed * RATIO):
        q, do, rows, rows_c = _listed_tiles(q_base, do_base, stride_qn, stride_don, idx_ptr, it, offs_m, offs_d,
                                            d_ok, n_q, PARTIAL, PAD_D, BLOCK_M, Q_BLOCK)
        if PARTIAL:
            row_ok = rows < n_q
            lse = tl.load(lse_base + rows, mask=row_ok, other=0.0)
            delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        else:
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E_C)
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)      # (BLOCK_N, BLOCK_M)
        if HAS_SCORE:
            s_nat = s_t * sm_scale
            p_t = tl.math.exp2(SCORE_MOD(s_nat, b, h, rows_c[None, :], cols_c[:, None], X0, X1, X2, X3) * LOG2E_C
                               - lse2[None, :])
        else:
            p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
        if PARTIAL:
            keep = (cols[:, None] < n_k) & (rows[None, :] < n_q)
            if HAS_MASK:
                keep = keep & MASK_MOD(b, h, rows_c[None, :], cols_c[:, None], M0, M1, M2, M3)
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        ds_t = p_t * (dp_t - delta[None, :])
        if HAS_SCORE:
            ds_t = SCORE_GRAD(s_nat, b, h, rows_c[None, :], cols_c[:, None], ds_t, X0, X1, X2, X3)
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit(do_not_specialize=["n_q", "n_k", "group", "n_qb", "nb_sb", "nb_sh"])
def flex_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA,
                     Q_NUM, Q_IDX, FULL_NUM, FULL_IDX,
                     X0, X1, X2, X3, M0, M1, M2, M3,
                     stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                     stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                     nb_sb, nb_sh, n_qb,
                     n_heads, n_kv_heads, group, n_q, n_k, head_dim, sm_scale, qk_scale,
                     SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
                     HAS_SCORE: tl.constexpr, HAS_MASK: tl.constexpr,
                     BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, DOT_PREC: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     Q_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr, GROUPED: tl.constexpr = True):
    """Grid ``(cdiv(n_k, BLOCK_N), B * Hkv)``. ``GROUPED=False`` (one query head per key/value
    head) makes the loop over the group one trip known when compiling, which the compiler removes
    (a loop over a runtime count keeps its state live and costs registers). ``Q_NUM``/``FULL_NUM`` ``(B', H', key blocks)``
    and ``Q_IDX``/``FULL_IDX`` ``(B', H', key blocks, n_qb)``: the transposed lists."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_kv_heads
    h_kv = bh % n_kv_heads
    start_n = pid_n * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    b64 = b.to(tl.int64)
    hkv64 = h_kv.to(tl.int64)
    kv_ok = (cols[:, None] < n_k) & (offs_d[None, :] < head_dim)
    k = tl.load(K + b64 * stride_kb + hkv64 * stride_kh + cols[:, None] * stride_kn + offs_d[None, :],
                mask=kv_ok, other=0.0)
    v = tl.load(V + b64 * stride_vb + hkv64 * stride_vh + cols[:, None] * stride_vn + offs_d[None, :],
                mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for g in range(0, group if GROUPED else 1):
        h = h_kv * group + g
        h64 = h.to(tl.int64)
        q_base = Q + b64 * stride_qb + h64 * stride_qh
        do_base = DO + b64 * stride_dob + h64 * stride_doh
        lse_base = LSE + (b64 * n_heads + h64) * n_q
        delta_base = DELTA + (b64 * n_heads + h64) * n_q
        row = (b * nb_sb + h * nb_sh + start_n // KV_BLOCK).to(tl.int64)
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qn, stride_don,
                              tl.load(FULL_NUM + row), FULL_IDX + row * n_qb, b, h, cols, offs_m, offs_d,
                              n_q, n_k, head_dim, sm_scale, qk_scale, X0, X1, X2, X3, M0, M1, M2, M3,
                              SCORE_MOD, SCORE_GRAD, MASK_MOD, HAS_SCORE, HAS_MASK, False,
                              PAD_D, DOT_PREC, BLOCK_M, Q_BLOCK)
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qn, stride_don,
                              tl.load(Q_NUM + row), Q_IDX + row * n_qb, b, h, cols, offs_m, offs_d,
                              n_q, n_k, head_dim, sm_scale, qk_scale, X0, X1, X2, X3, M0, M1, M2, M3,
                              SCORE_MOD, SCORE_GRAD, MASK_MOD, HAS_SCORE, HAS_MASK, True,
                              PAD_D, DOT_PREC, BLOCK_M, Q_BLOCK)
    tl.store(DK + b64 * stride_dkb + hkv64 * stride_dkh + cols[:, None] * stride_dkn + offs_d[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + b64 * stride_dvb + hkv64 * stride_dvh + cols[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_ok)

"""The split-KV decode kernels in Triton: a few new queries against a long, possibly paged, cache.

``decode_split_kernel``: one program per (sequence, key/value head, split, block of rows). Its
rows are the ``GROUP * Nq`` query rows that share the key/value head (grouped-query packing: the
``GROUP`` query heads of a group read each K/V tile once, together). It walks its split's keys
tile by tile with the online softmax of chapter 04 (base 2, as in the forward kernel) and writes
the split's partial state: the output normalised over its own keys and its log-sum-exp. With a
single split it writes the final output directly.

``decode_merge_kernel``: one program per query row; it merges the ``S`` partial states with the
rule of :func:`flashtut.merge_attention_states` (:func:`_merge_row`): weights
``exp2(lse_s - max)``, the output their weighted mean, the log-sum-exp ``max + log2(sum)``. With
``FUSED_MERGE`` the split kernel merges instead, in one launch: each program takes a ticket from
a counter of its (sequence, key/value head, row block) after writing its state, and the program
that takes the last ticket merges the ``S`` states of its rows (in split order, whichever program
finished last) and sets the counter back to zero for the next call.

Where a key lives: a contiguous cache keeps position ``p`` of sequence ``b`` at row ``p`` of
``K[b, h]``; a paged one at row ``p % PAGE`` of page ``TABLE[b, p // PAGE]``. When a tile of
``BLOCK_N`` keys sits inside one page (``PAGE % BLOCK_N == 0``) the program reads one table
entry per tile; otherwise one per key. With ``PAGE_AHEAD`` each iteration reads the table
entries of the next tile, so a tile's K/V loads never wait for a table read issued just before.

Split bounds come from the sequence's length at run time (each split a multiple of ``BLOCK_N``
keys), so the grid depends only on the batch, the heads and the split count: one launch shape
serves every length, which is what a captured CUDA graph needs.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..constants import LN2, LOG2E

LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)


@triton.jit
def _tile_pages(b, start_n, pos, limit, TABLE, stride_tb,
                PAGED: tl.constexpr, PAGE: tl.constexpr, TILE_IN_PAGE: tl.constexpr):
    """The block-table entries of the tile of key positions ``pos`` (starting at
    ``start_n``) of sequence ``b``: one (the page of the tile's first key) when the
    whole tile is in one page, else one per key; none for a tile at or past ``limit``
    (its entries may lie past the table's row). Unused (0) for a contiguous cache."""
    entries = TABLE + b * stride_tb        # sequence b's row of the table
    if PAGED:
        if TILE_IN_PAGE:
            page = tl.load(entries + start_n // PAGE, mask=start_n < limit, other=0)
        else:                 # one entry per key (in L1 after the first read)
            page = tl.load(entries + pos // PAGE, mask=pos < limit, other=0)
    else:
        page = 0
    return page


@triton.jit
def _key_place(b, pos, page, PAGED: tl.constexpr, PAGE: tl.constexpr):
    """Where key positions ``pos`` of sequence ``b`` live, given their table entries
    ``page`` (:func:`_tile_pages`): ``(block, row)``, 64-bit, with ``block`` indexing
    the cache's first dim (the sequence, or the page) and ``row`` its third."""
    if PAGED:
        blk = page.to(tl.int64)
        row = (pos % PAGE).to(tl.int64)
    else:
        blk = b
        row = pos.to(tl.int64)
    return blk, row


@triton.jit
def _merge_row(OP, LP, O, LSE, row, o_row, head_dim, num_splits,
               BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the ``num_splits`` partial states of query row ``row`` (its index in
    ``(B, H, Nq)``) into ``O`` at offset ``o_row`` and ``LSE`` (natural log). The
    states are read from L2 (``.cg``): in the fused merge, other programs wrote them
    moments ago, and this SM's L1 may hold an older copy of their lines."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    d_ok = offs_d < head_dim
    lse = tl.load(LP + row * num_splits + offs_s, mask=s_ok, other=float("-inf"),
                  cache_modifier=".cg")
    m = tl.max(lse, 0)              # finite: every row sees key 0, in the first split
    w = tl.math.exp2(lse - m)       # an empty split weighs exp2(-inf) = 0
    total = tl.sum(w, 0)
    o = tl.load(OP + (row * num_splits + offs_s)[:, None] * head_dim + offs_d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
    out = tl.sum(o * w[:, None], 0) / total
    tl.store(O + o_row + offs_d, out.to(O.dtype.element_ty), mask=d_ok)
    tl.store(LSE + row, (m + tl.math.log2(total)) * LN2_C)


@triton.jit(do_not_specialize=["n_q", "group", "num_splits"])
def decode_split_kernel(Q, K, V, SEQLENS, TABLE, O, LSE, OP, LP, COUNTERS,
                        stride_qb, stride_qh, stride_qn,
                        stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn,
                        stride_tb,
                        stride_ob, stride_oh, stride_on,
                        n_kv_heads, group, n_q, head_dim, qk_scale, num_splits,
                        SINGLE: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr,
                        TILE_IN_PAGE: tl.constexpr, PAGE_AHEAD: tl.constexpr,
                        FUSED_MERGE: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_S: tl.constexpr, EVEN_D: tl.constexpr,
                        DOT_PREC: tl.constexpr):
    """Grid ``(num_splits, B * Hkv, cdiv(GROUP * Nq, BLOCK_M))``. Writes ``O``
    ``(B, H, Nq, D)`` and the natural-log log-sum-exp ``LSE`` ``(B, H, Nq)`` when
    there is one split (``SINGLE``) or when it merges (``FUSED_MERGE``); otherwise
    only the float32 partial states ``OP`` ``(B, H, Nq, S, D)`` and ``LP``
    ``(B, H, Nq, S)`` (log-sum-exp in base 2), which ``decode_merge_kernel`` merges.
    ``COUNTERS``: one int32 per (sequence, key/value head, row block), zero before
    the launch and after it (fused merge only)."""
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // n_kv_heads).to(tl.int64)
    h_kv = (bh % n_kv_heads).to(tl.int64)
    n_k = tl.load(SEQLENS + b)

    # row r of this program: query head h_kv * group + r // n_q, query r % n_q
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < group * n_q
    head = h_kv * group + rows // n_q
    qi = rows % n_q
    offs_d = tl.arange(0, BLOCK_D)
    # no mask along D when D is the tile's width: the loads stay 16-byte vectors
    d_ok = (offs_d < BLOCK_D) if EVEN_D else (offs_d < head_dim)
    q_rows = b * stride_qb + head * stride_qh + qi * stride_qn
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    # bottom-right: query i is position n_k - n_q + i and sees keys j <= that
    last_key = n_k - n_q + qi

    # this split's keys: [start, end), a multiple of BLOCK_N keys each
    chunk = tl.cdiv(tl.cdiv(n_k, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, n_k)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    k_head = K + h_kv * stride_kh
    v_head = V + h_kv * stride_vh
    # with PAGE_AHEAD: the first tile's table entries, before the loop
    pages = _tile_pages(b, start, start + offs_n, end, TABLE, stride_tb,
                        PAGED, PAGE, TILE_IN_PAGE)
    for start_n in range(start, end, BLOCK_N):
        pos = start_n + offs_n
        key_ok = pos < end
        if PAGE_AHEAD:
            # this tile's entries came with the last iteration; fetch the next tile's
            here = pages
            pages = _tile_pages(b, start_n + BLOCK_N, pos + BLOCK_N, end, TABLE,
                                stride_tb, PAGED, PAGE, TILE_IN_PAGE)
        else:
            here = _tile_pages(b, start_n, pos, end, TABLE, stride_tb,
                               PAGED, PAGE, TILE_IN_PAGE)
        blk, row = _key_place(b, pos, here, PAGED, PAGE)
        if EVEN_D:
            kv_ok = key_ok[:, None]
        else:
            kv_ok = key_ok[:, None] & d_ok[None, :]
        k_rows = blk * stride_kb + row * stride_kn
        v_rows = blk * stride_vb + row * stride_vn
        k = tl.load(k_head + k_rows[:, None] + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_head + v_rows[:, None] + offs_d[None, :], mask=kv_ok, other=0.0)
        # (BLOCK_M, BLOCK_N) scores, in base 2
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        seen_key = key_ok[None, :] & (pos[None, :] <= last_key[:, None])
        s = tl.where(seen_key, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row that has seen no key yet keeps m = -inf; exp2(-inf - -inf) would be NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]
    out_ok = row_ok[:, None] & d_ok[None, :]
    n_heads = n_kv_heads * group
    if SINGLE:
        o_rows = b * stride_ob + head * stride_oh + qi * stride_on
        tl.store(O + o_rows[:, None] + offs_d[None, :], acc.to(O.dtype.element_ty),
                 mask=out_ok)
        lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2_C, float("-inf"))
        tl.store(LSE + (b * n_heads + head) * n_q + qi, lse, mask=row_ok)
    else:
        # OP is (B, H, Nq, S, D) and LP (B, H, Nq, S), contiguous
        state = ((b * n_heads + head) * n_q + qi) * num_splits + split
        tl.store(OP + state[:, None] * head_dim + offs_d[None, :], acc, mask=out_ok)
        lse2 = tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf"))
        tl.store(LP + state, lse2, mask=row_ok)
        if FUSED_MERGE:
            # every thread's stores are issued before the ticket (the barrier), and the
            # ticket's release makes them visible to the program that takes the last one
            tl.debug_barrier()
            counter = COUNTERS + bh * tl.num_programs(2) + tl.program_id(2)
            ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:
                # the last of the S programs: merge its rows, each in split order
                first = tl.program_id(2) * BLOCK_M
                for r in range(first, tl.minimum(first + BLOCK_M, group * n_q)):
                    h_r = h_kv * group + r // n_q
                    q_r = r % n_q
                    _merge_row(OP, LP, O, LSE, (b * n_heads + h_r) * n_q + q_r,
                               b * stride_ob + h_r * stride_oh + q_r * stride_on,
                               head_dim, num_splits, BLOCK_S, BLOCK_D)
                # ready for the next call
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["num_splits"])
def decode_merge_kernel(OP, LP, O, LSE, stride_ob, stride_oh, stride_on,
                        n_heads, n_q, head_dim, num_splits,
                        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid ``(B * H * Nq,)``: merge the ``S`` partial states of one query row into
    ``O`` (the output dtype) and ``LSE`` (float32, natural log)."""
    row = tl.program_id(0).to(tl.int64)
    qi = row % n_q
    bh = row // n_q
    h = bh % n_heads
    b = bh // n_heads
    _merge_row(OP, LP, O, LSE, row, b * stride_ob + h * stride_oh + qi * stride_on,
               head_dim, num_splits, BLOCK_S, BLOCK_D)

"""The Hopper layout model (flashtut.cuda.models.hopper_layout), checked by independent reasoning on the CPU.

The central check stores random Q, K and V tiles byte by byte where rung W1's loader puts them
(``tile_offset``), then reads every operand element back through the descriptors W1 builds, as
the PTX ISA's canonical layouts say the tensor cores read them (``operand_address``): every value
must come back where the matrix product expects it. The same reads with a wrong stride or an
unswizzled store must fail, so the check can tell right from wrong.
"""
from __future__ import annotations

import random

import pytest

from flashtut.cuda.models import hopper_layout as hl


def _store(matrix, rows, cols, offset=hl.tile_offset):
    """A shared-memory image (byte address -> value) of ``matrix`` stored as the kernel stores it."""
    mem = {}
    for r in range(rows):
        for c in range(cols):
            mem[offset(r, c, rows)] = matrix[r][c]
    return mem


def _rand(rows, cols, seed):
    rng = random.Random(seed)
    return [[rng.random() for _ in range(cols)] for _ in range(rows)]


# ------------------------------------------------------------------ swizzle

def test_swizzle_is_a_bijection_that_keeps_16_byte_chunks_whole():
    for atom in range(3):
        base = atom * hl.ATOM_BYTES
        image = {hl.swizzle128(base + a) for a in range(hl.ATOM_BYTES)}
        assert image == set(range(base, base + hl.ATOM_BYTES))  # stays in its 1024-byte atom
    for a in range(0, 4096, 16):
        s = hl.swizzle128(a)
        assert [hl.swizzle128(a + i) - s for i in range(16)] == list(range(16))
        assert hl.swizzle128(s) == a  # an XOR with bits the swizzle leaves alone: its own inverse


@pytest.mark.parametrize("rows,cols", [(128, 128), (128, 64), (64, 128)])
def test_tile_offset_fills_the_tile_exactly(rows, cols):
    offsets = sorted(hl.tile_offset(r, c, rows) for r in range(rows) for c in range(cols))
    assert offsets == list(range(0, rows * cols * 2, 2))


def test_rows_of_one_chunk_column_hit_eight_bank_groups():
    # ldmatrix and the tensor cores read 8 rows x 16 bytes at a time: with the swizzle those 8 rows
    # of one logical chunk fall in 8 bank groups; stored plainly they would all fall in one
    for rows, cols in ((128, 128), (128, 64)):
        for c in range(0, cols, 8):
            for r0 in range(0, rows, 8):
                swz = [hl.tile_offset(r, c, rows) for r in range(r0, r0 + 8)]
                plain = [(c // 64) * rows * 128 + r * 128 + (c % 64) * 2 for r in range(r0, r0 + 8)]
                assert hl.conflict_ways(swz) == 1
                assert hl.conflict_ways(plain) == 8
    # the loader: 8 consecutive threads store the 8 chunks of one row
    for r in range(16):
        assert hl.conflict_ways([hl.tile_offset(r, c, 128) for c in range(0, 64, 8)]) == 1


# ------------------------------------------------------------------ descriptors

def test_descriptor_fields_round_trip():
    rng = random.Random(0)
    for _ in range(500):
        f = {"start": 16 * rng.randrange(1 << 14), "lbo": 16 * rng.randrange(1 << 14),
             "sbo": 16 * rng.randrange(1 << 14), "base_offset": rng.randrange(8),
             "swizzle": rng.choice(list(hl.SWIZZLE_CODES))}
        desc = hl.encode_descriptor(**f)
        assert 0 <= desc < 1 << 64 and hl.decode_descriptor(desc) == f
    # the bit positions of the ISA's table, one field at a time
    assert hl.encode_descriptor(16, 0, 0, "none") == 1
    assert hl.encode_descriptor(0, 16, 0, "none") == 1 << 16
    assert hl.encode_descriptor(0, 0, 16, "none") == 1 << 32
    assert hl.encode_descriptor(0, 0, 0, "none", base_offset=1) == 1 << 49
    assert hl.encode_descriptor(0, 0, 0, "128B") == 1 << 62
    assert hl.encode_descriptor(0, 0, 0, "32B") == 3 << 62


def test_descriptor_rejects_what_it_cannot_encode():
    for bad in (8, -16, 1 << 18, 1.5):
        with pytest.raises(ValueError, match="multiple of 16"):
            hl.encode_descriptor(bad, 16, 1024)
    with pytest.raises(ValueError, match="swizzle"):
        hl.encode_descriptor(0, 16, 1024, swizzle="256B")
    with pytest.raises(ValueError, match="base_offset"):
        hl.encode_descriptor(0, 16, 1024, base_offset=8)


# ------------------------------------------------------------------ W1's operands, read as the tensor cores read them

@pytest.mark.parametrize("head_dim,block_n", [(64, 128), (128, 128), (128, 64), (64, 64)])
def test_w1_qk_operands_read_back_q_and_k(head_dim, block_n):
    q, k = _rand(128, head_dim, 1), _rand(block_n, head_dim, 2)
    k_base = 128 * head_dim * 2  # K follows Q, as in the kernel
    mem = _store(q, 128, head_dim)
    mem.update({k_base + a: x for a, x in _store(k, block_n, head_dim).items()})
    for wg in (0, 1):
        for ks in range(head_dim // 16):
            da, db = hl.w1_qk_descriptors(ks, head_dim, block_n, wg, 0, k_base)
            for m in range(64):
                for kk in range(16):
                    assert mem[hl.operand_address(da, m, kk, "K")] == q[64 * wg + m][16 * ks + kk]
            for n in range(block_n):
                for kk in range(16):
                    assert mem[hl.operand_address(db, n, kk, "K")] == k[n][16 * ks + kk]


@pytest.mark.parametrize("head_dim,block_n,split", [(64, 128, True), (128, 128, True), (128, 128, False),
                                                    (128, 64, False), (64, 64, False)])
def test_w1_pv_operands_read_back_v(head_dim, block_n, split):
    v = _rand(block_n, head_dim, 3)
    mem = _store(v, block_n, head_dim)
    for kp in range(block_n // 16):
        parts = hl.w1_pv_descriptors(kp, head_dim, block_n, split)
        width = head_dim // len(parts)
        for col0, desc in parts:
            for n in range(width):
                for kk in range(16):
                    assert mem[hl.operand_address(desc, n, kk, "MN")] == v[16 * kp + kk][col0 + n]


def test_wrong_layouts_are_caught():
    head_dim, block_n = 128, 128
    k = _rand(block_n, head_dim, 4)

    def reads_back(mem, desc, ks):
        return all(mem.get(hl.operand_address(desc, n, kk, "K")) == k[n][16 * ks + kk]
                   for n in range(block_n) for kk in range(16))

    good = _store(k, block_n, head_dim)
    _, desc = hl.w1_qk_descriptors(1, head_dim, block_n, 0)
    assert reads_back(good, desc, 1)
    # a stride of 512 bytes between 8-row groups reads the wrong rows
    f = hl.decode_descriptor(desc)
    wrong_sbo = hl.encode_descriptor(f["start"], f["lbo"], 512)
    assert not reads_back(good, wrong_sbo, 1)
    # the same tile stored without the swizzle is read wrongly through a 128-byte-swizzle descriptor
    plain = _store(k, block_n, head_dim, lambda r, c, rows: (c // 64) * rows * 128 + r * 128 + (c % 64) * 2)
    assert not reads_back(plain, desc, 1)


# ------------------------------------------------------------------ register fragments

@pytest.mark.parametrize("n", [64, 128])
def test_accumulator_layout_is_a_bijection(n):
    seen = {}
    for thread in range(128):
        for i in range(n // 2):
            rc = hl.accumulator_element(thread, i, n)
            assert rc not in seen
            seen[rc] = (thread, i)
            assert hl.accumulator_owner(*rc, n) == (thread, i)
    assert set(seen) == {(r, c) for r in range(64) for c in range(n)}
    # each warp owns 16 whole rows: the row max and sum need only the 4 lanes of a quad
    for (r, c), (thread, _) in seen.items():
        assert thread // 32 == r // 16
        assert {hl.accumulator_owner(r, cc, n)[0] // 4 for cc in range(n)} == {thread // 4}


def test_s_accumulator_is_p_as_a_fragments():
    # the reason P never goes through shared memory: each thread's S registers 8 kp .. 8 kp + 7,
    # packed in pairs, are exactly its A registers for keys 16 kp .. 16 kp + 15
    n = 128
    for thread in range(128):
        for kp in range(n // 16):
            for reg in range(4):
                for half in (0, 1):
                    row, col = hl.a_fragment_element(thread, reg, half)
                    i = hl.p_register(kp, reg)[half]
                    assert hl.accumulator_element(thread, i, n) == (row, 16 * kp + col)
    # and the A fragment covers the 64 x 16 tile once
    cells = [hl.a_fragment_element(t, r, h) for t in range(128) for r in range(4) for h in (0, 1)]
    assert sorted(cells) == [(r, c) for r in range(64) for c in range(16)]


# ------------------------------------------------------------------ barriers, registers

def test_ring_slot_phases():
    for stages in (1, 2, 3, 4):
        last = {}
        for i in range(5 * stages):
            stage, parity = hl.ring_slot(i, stages)
            assert stage == i % stages
            if stage in last:
                assert parity == 1 - last[stage]  # every refill of a stage completes one more phase
            last[stage] = parity
    with pytest.raises(ValueError, match="stages"):
        hl.ring_slot(3, 0)


def test_register_budget_counts_the_accumulators():
    b = hl.w1_register_budget(128, 128)
    # a 64 x 128 float32 accumulator over 128 threads is 64 registers each; P is half that (16-bit pairs)
    assert b["S accumulators (float32)"] == 64 * 128 // 128
    assert b["O accumulators (float32)"] == 64 * 128 // 128
    assert b["P as A fragments (2 x 16-bit)"] == 32
    assert sum(hl.w1_register_budget(64, 128).values()) < sum(b.values()) <= 255
    with pytest.raises(ValueError, match="head_dim"):
        hl.w1_register_budget(96)


def test_w3_budget_holds_the_pipelined_arrays_within_the_consumers_grant():
    from flashtut.cuda.configs import W2_REGS

    b = hl.w3_register_budget(128, 128)
    # the pipelining keeps one more 64 x 128 operand alive than W1's loop body at once: P of the tile
    # before, next to the S of this tile and O; 168 of the 240 registers setmaxnreg grants
    assert sum(b.values()) == 64 + 32 + 64 + 8 == 168 <= W2_REGS["consumer"]
    assert sum(hl.w3_register_budget(64, 128).values()) == 136
    assert sum(hl.w3_register_budget(64, 64).values()) == 32 + 16 + 32 + 8
    with pytest.raises(ValueError, match="block_n"):
        hl.w3_register_budget(128, 256)


@pytest.mark.parametrize("n_q,block_m", [(4096, 192), (4097, 192), (191, 192), (192, 192), (130, 128), (1, 64),
                                         (1000, 128)])
def test_query_blocks_cover_every_row_once_with_the_short_block_last_or_first(n_q, block_m):
    for tail_first in (False, True):
        blocks = hl.query_blocks(n_q, block_m, tail_first)
        assert len(blocks) == -(-n_q // block_m)
        rows = [r for m0, end in blocks for r in range(m0, end)]
        assert rows == list(range(n_q))                      # in order, each row once
        sizes = [end - m0 for m0, end in blocks]
        short = n_q - (len(blocks) - 1) * block_m
        assert sizes == ([short] + [block_m] * (len(blocks) - 1) if tail_first
                         else [block_m] * (len(blocks) - 1) + [short])
    with pytest.raises(ValueError, match="n_q"):
        hl.query_blocks(0, 192)


@pytest.mark.parametrize("n_q,n_k,diag", [(4096, 4096, 0), (333, 333, 0), (300, 150, -150), (150, 300, 150),
                                          (70, 700, 630)])
def test_consumer_tiles_are_the_tiles_the_causal_mask_leaves_each_warpgroup(n_q, n_k, diag):
    # against the mask itself: a warpgroup reads tile t iff one of its rows sees a key of it
    for block_m, consumers in ((192, 3), (128, 2)):
        for tail_first in (False, True):
            for m0, end in hl.query_blocks(n_q, block_m, tail_first):
                n_tiles, mine = hl.consumer_tiles(m0, end, n_k, 64, consumers, diag)
                for w in range(consumers):
                    rows = range(m0 + 64 * w, min(m0 + 64 * (w + 1), end))
                    seen = [t for t in range(-(-n_k // 64))
                            if any(min(i + diag, n_k - 1) >= 64 * t for i in rows)]
                    assert mine[w] == len(seen) and seen == list(range(len(seen))), (m0, end, w)
                assert n_tiles == max(mine)
    # the turns a causal N = 4096 grid of 192-row blocks spends idle: the short block first saves most
    turns = {}
    for tail_first in (False, True):
        blocks = [hl.consumer_tiles(m0, end, 4096) for m0, end in hl.query_blocks(4096, 192, tail_first)]
        turns[tail_first] = (sum(3 * n for n, _ in blocks), sum(sum(m) for _, m in blocks))
    assert turns == {False: (1152, 1056), True: (1089, 1056)}
    with pytest.raises(ValueError, match="m_end"):
        hl.consumer_tiles(0, 200, 4096)

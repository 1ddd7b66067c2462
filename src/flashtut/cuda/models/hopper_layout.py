"""The layout maths of the Hopper kernels, in plain Python (no GPU): what chapter 11 teaches and checks.

* the 128-byte swizzle as the hardware applies it to a shared-memory address, and the tile layout
  the kernels store (``tile_offset``, the same function as ``sw128_offset`` in ``ft_wgmma.cuh``);
* the wgmma matrix descriptor: encoding, decoding, and the shared-memory address a descriptor gives
  to each element of a K-major or MN-major operand (``operand_address``), written from the PTX ISA's
  canonical layouts, so that a tile stored one way can be read back the other way and compared;
* the register fragments of a warpgroup: which thread and register hold each element of the
  m64nNk16 accumulator and of the A operand taken from registers;
* shared-memory bank groups of 16-byte accesses, mbarrier phase parity in a ring of stages, and the
  register budgets of rungs W1 and W3 (W3's barrier schedule: ``flashtut.cuda.models.hopper_schedule``);
* the rows of W3's query blocks, with the short one last or first, and the key tiles each consumer
  warpgroup of a causal block reads.

Sizes are in bytes and elements are 16-bit (float16 / bfloat16) unless a function says otherwise.
"""
from __future__ import annotations

#: the 128-byte swizzle: rows of 128 bytes, its XOR pattern repeats every 8 rows (1024 bytes)
ROW_BYTES = 128
ATOM_ROWS = 8
ATOM_BYTES = ROW_BYTES * ATOM_ROWS
#: 16-bit elements per 128-byte row: a head dim wider than this is cut into column blocks
ROW_ELEMS = ROW_BYTES // 2
#: swizzle mode -> the 2-bit code in descriptor bits 62-63
SWIZZLE_CODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
#: threads in a warpgroup, rows of the wgmma accumulator it owns
WARPGROUP_THREADS = 128
WGMMA_M = 64


def swizzle128(addr: int) -> int:
    """The 128-byte swizzle of a shared-memory byte address: bits 4-6 (the 16-byte chunk within a
    128-byte row) XOR bits 7-9 (the row within a 1024-byte atom)."""
    _nonneg("addr", addr)
    return addr ^ (((addr >> 7) & 7) << 4)


def tile_offset(row: int, col: int, rows: int) -> int:
    """Byte offset of element ``(row, col)`` in the kernels' ``[cols / 64][rows][64]`` tile with the
    128-byte swizzle (the tile starts on a 1024-byte boundary, ``rows`` a multiple of 8): the
    unswizzled place of the element, swizzled as an address."""
    _nonneg("row", row), _nonneg("col", col)
    if rows % ATOM_ROWS or not 0 <= row < rows:
        raise ValueError(f"rows must be a multiple of 8 and row in [0, rows), got rows={rows}, row={row}")
    return swizzle128((col // ROW_ELEMS) * rows * ROW_BYTES + row * ROW_BYTES + (col % ROW_ELEMS) * 2)


# ------------------------------------------------------------------ matrix descriptors

def _field(name: str, value: int) -> int:
    # start address, LBO and SBO are stored as (x & 0x3FFFF) >> 4: 16-byte units below 256 KB
    if not isinstance(value, int) or value < 0 or value % 16 or value >= 1 << 18:
        raise ValueError(f"{name} must be a multiple of 16 in [0, 262144), got {value!r}")
    return value >> 4


def encode_descriptor(start: int, lbo: int, sbo: int, swizzle: str = "128B", base_offset: int = 0) -> int:
    """The 64-bit wgmma shared-memory matrix descriptor: start address (bits 0-13), leading-dimension
    byte offset (16-29), stride-dimension byte offset (32-45), base offset (49-51), swizzle (62-63)."""
    if swizzle not in SWIZZLE_CODES:
        raise ValueError(f"swizzle must be one of {sorted(SWIZZLE_CODES)}, got {swizzle!r}")
    if not isinstance(base_offset, int) or not 0 <= base_offset < 8:
        raise ValueError(f"base_offset must be an int in [0, 8), got {base_offset!r}")
    return (_field("start", start) | _field("lbo", lbo) << 16 | _field("sbo", sbo) << 32
            | base_offset << 49 | SWIZZLE_CODES[swizzle] << 62)


def decode_descriptor(desc: int) -> dict:
    """The fields of a descriptor, in bytes: ``{"start", "lbo", "sbo", "base_offset", "swizzle"}``."""
    if not isinstance(desc, int) or not 0 <= desc < 1 << 64:
        raise ValueError(f"desc must be a 64-bit unsigned int, got {desc!r}")
    mask = (1 << 14) - 1
    names = {code: name for name, code in SWIZZLE_CODES.items()}
    return {"start": (desc & mask) << 4, "lbo": (desc >> 16 & mask) << 4, "sbo": (desc >> 32 & mask) << 4,
            "base_offset": desc >> 49 & 7, "swizzle": names[desc >> 62 & 3]}


def operand_address(desc: int, mn: int, k: int, major: str) -> int:
    """The shared-memory byte address a 128-byte-swizzle descriptor gives to element ``(mn, k)`` of a
    wgmma operand (``mn``: row of A / column of B; ``k``: the reduction index, 0..15), by the ISA's
    canonical layouts (in 16-byte units T of 8 elements):

    * K-major: ``((8, m), (T, 2k)) : ((8T, SBO), (1, T))``: 8 rows of 128 bytes, then the next 8
      rows ``SBO`` bytes on; the 16 k-values of one instruction lie within a row;
    * MN-major: ``((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))``: 64 mn-values along a 128-byte
      row, the next 64 ``LBO`` bytes on; 8 k-rows of 128 bytes, the next 8 ``SBO`` bytes on.

    The swizzle is then applied to the address, which is why the tile must sit on 1024 bytes."""
    f = decode_descriptor(desc)
    if f["swizzle"] != "128B" or f["base_offset"]:
        raise ValueError("operand_address models the 128-byte swizzle with base offset 0 only")
    if not 0 <= k < 16 or mn < 0:
        raise ValueError(f"k must be in [0, 16) and mn >= 0, got mn={mn}, k={k}")
    if major == "K":
        addr = f["start"] + (mn // 8) * f["sbo"] + (mn % 8) * ROW_BYTES + k * 2
    elif major == "MN":
        addr = f["start"] + (mn // ROW_ELEMS) * f["lbo"] + (k // 8) * f["sbo"] + (k % 8) * ROW_BYTES \
            + (mn % ROW_ELEMS) * 2
    else:
        raise ValueError(f"major must be 'K' or 'MN', got {major!r}")
    return swizzle128(addr)


# ------------------------------------------------------------------ rung W1's operands

def w1_qk_descriptors(ks: int, head_dim: int, block_n: int, warpgroup: int, q_base: int = 0,
                      k_base: int = 0) -> tuple[int, int]:
    """(A, B) descriptors of k-step ``ks`` of S = Q K^T in rung W1: columns 16 ks.. of the
    warpgroup's 64 rows of the 128-row Q tile, and of the ``block_n``-row K tile (both K-major)."""
    a = q_base + warpgroup * WGMMA_M * ROW_BYTES + (ks // 4) * 128 * ROW_BYTES + (ks % 4) * 32
    b = k_base + (ks // 4) * block_n * ROW_BYTES + (ks % 4) * 32
    return encode_descriptor(a, 16, ATOM_BYTES), encode_descriptor(b, 16, ATOM_BYTES)


def w1_pv_descriptors(kp: int, head_dim: int, block_n: int, split: bool, v_base: int = 0) -> list[tuple[int, int]]:
    """``[(first output column, descriptor)]`` of k-step ``kp`` (keys 16 kp..) of O += P V in rung W1:
    V is N-major; one descriptor covering the head dim (LBO: the 64-column block stride), or with
    ``split`` one per 64-column block."""
    b = v_base + kp * 16 * ROW_BYTES
    if not split or head_dim == ROW_ELEMS:
        return [(0, encode_descriptor(b, block_n * ROW_BYTES, ATOM_BYTES))]
    return [(cb * ROW_ELEMS, encode_descriptor(b + cb * block_n * ROW_BYTES, ATOM_BYTES, ATOM_BYTES))
            for cb in range(head_dim // ROW_ELEMS)]


# ------------------------------------------------------------------ register fragments

def accumulator_element(thread: int, i: int, n: int) -> tuple[int, int]:
    """(row, col) of register ``i`` of warpgroup thread ``thread`` in an m64nNk16 float32 accumulator:
    warp w = thread / 32 owns rows 16w..16w+15; lane g = lane / 4, t = lane % 4."""
    if not 0 <= thread < WARPGROUP_THREADS or not 0 <= i < n // 2:
        raise ValueError(f"thread must be in [0, 128) and i in [0, {n // 2}), got {thread}, {i}")
    warp, lane = divmod(thread, 32)
    g, t = divmod(lane, 4)
    return 16 * warp + g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * t + i % 2


def accumulator_owner(row: int, col: int, n: int) -> tuple[int, int]:
    """(thread, register) that holds element ``(row, col)`` of the 64 x ``n`` accumulator."""
    if not 0 <= row < WGMMA_M or not 0 <= col < n:
        raise ValueError(f"(row, col) must be in [0, 64) x [0, {n}), got {(row, col)}")
    warp, r = divmod(row, 16)
    g, half = r % 8, r // 8
    t, odd = divmod(col % 8, 2)
    return 32 * warp + 4 * g + t, 4 * (col // 8) + 2 * half + odd


def a_fragment_element(thread: int, reg: int, half: int) -> tuple[int, int]:
    """(row, col) of 16-bit value ``half`` (0: low, 1: high) of register ``reg`` (0..3) of the
    64 x 16 A operand of wgmma taken from registers: rows g and g + 8 of the thread's warp,
    columns 2t.. (registers 0, 1) and 2t + 8.. (registers 2, 3)."""
    if not 0 <= thread < WARPGROUP_THREADS or reg not in range(4) or half not in (0, 1):
        raise ValueError(f"thread in [0, 128), reg in 0..3, half in (0, 1); got {thread}, {reg}, {half}")
    warp, lane = divmod(thread, 32)
    g, t = divmod(lane, 4)
    return 16 * warp + g + 8 * (reg % 2), 2 * t + 8 * (reg // 2) + half


def p_register(kp: int, reg: int) -> tuple[int, int]:
    """The S accumulator registers (i, i + 1) whose probabilities rung W1 packs into A register
    ``reg`` of k-step ``kp`` of O += P V."""
    return 8 * kp + 2 * reg, 8 * kp + 2 * reg + 1


# ------------------------------------------------------------------ banks, barriers, registers

def bank_groups(addresses) -> list[int]:
    """The 16-byte bank group (0..7: four 4-byte banks each) of each 16-byte access."""
    return [(a // 16) % 8 for a in addresses]


def conflict_ways(addresses) -> int:
    """How many shared-memory wavefronts 8 16-byte accesses (one phase of a warp's 16-byte request)
    need: 1 when they hit 8 different bank groups, up to 8 when they all hit one."""
    addresses = list(addresses)
    if len(addresses) != 8:
        raise ValueError(f"a phase of 16-byte accesses is 8 addresses, got {len(addresses)}")
    groups = bank_groups(addresses)
    return max(groups.count(b) for b in set(groups))


def ring_slot(i: int, stages: int) -> tuple[int, int]:
    """(stage, phase parity) of the ``i``-th tile in a ring of ``stages`` shared-memory buffers, each
    guarded by an mbarrier: the barrier's phase flips every time its stage is filled, so the consumer
    of tile ``i`` waits on parity ``(i // stages) % 2``."""
    _nonneg("i", i)
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive int, got {stages!r}")
    return i % stages, (i // stages) % 2


def w1_register_budget(head_dim: int, block_n: int = 128) -> dict:
    """32-bit registers per thread that rung W1's arrays need (ptxas adds addresses, loop state and
    temporaries): a warpgroup's 64 x N accumulators are spread over 128 threads, N / 2 each."""
    if head_dim not in (64, 128) or block_n not in (64, 128):
        raise ValueError(f"head_dim and block_n must be 64 or 128, got {head_dim}, {block_n}")
    return {"S accumulators (float32)": block_n // 2, "P as A fragments (2 x 16-bit)": block_n // 4,
            "O accumulators (float32)": head_dim // 2, "m, l for 2 rows": 4}


def w3_register_budget(head_dim: int, block_n: int = 128) -> dict:
    """32-bit registers per consumer thread that rung W3's arrays need while its pipeline is full: the
    S accumulator of tile j (its softmax runs), P of tile j - 1 (read by the P V wgmma still in flight,
    so it cannot share S's registers), O, and the row state. P of tile j is made in S's registers (the
    exponentials in place, packed after the P V), so it adds nothing to the peak. The consumers run at
    ``configs.W2_REGS["consumer"]`` (240) after setmaxnreg; ptxas adds addresses and temporaries."""
    w1 = w1_register_budget(head_dim, block_n)
    return {"S accumulator of tile j (float32)": w1["S accumulators (float32)"],
            "P of tile j - 1, read by the P V in flight": w1["P as A fragments (2 x 16-bit)"],
            "O accumulator (float32)": w1["O accumulators (float32)"],
            "m, l, alpha, -m * scale for 2 rows": 8}


def query_blocks(n_q: int, block_m: int, tail_first: bool = False) -> list[tuple[int, int]]:
    """(first row, one past the last row) of each query block of a W3 grid over ``n_q`` rows, in the
    order of the block index: blocks start at ``mb * block_m`` and the last one is short of rows; with
    ``tail_first`` (``FT_TAIL_FIRST``, which the kernel applies under a causal mask) they end at
    ``n_q - k * block_m`` and the short one is the first (``tma_block_at`` in ``ft_tma.cuh``)."""
    for name, x in (("n_q", n_q), ("block_m", block_m)):
        if not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    n_mb = -(-n_q // block_m)
    if tail_first:
        return [(max(0, n_q - (n_mb - mb) * block_m), n_q - (n_mb - 1 - mb) * block_m) for mb in range(n_mb)]
    return [(mb * block_m, min((mb + 1) * block_m, n_q)) for mb in range(n_mb)]


def consumer_tiles(m0: int, m_end: int, n_k: int, block_n: int = 128, consumers: int = 3,
                   diag_offset: int = 0) -> tuple[int, list[int]]:
    """Under a causal mask (query i sees key j iff j <= i + ``diag_offset``), the key tiles of ``block_n``
    keys the query block of rows ``m0`` to ``m_end - 1`` reads, and those each of its ``consumers``
    warpgroups of 64 rows reads: the tiles up to its last row's diagonal, none for a warpgroup with no
    row. Every consumer takes a turn per tile of the block, reading or idle (``w3_consume``)."""
    _nonneg("m0", m0)
    rows = WGMMA_M                     # each consumer warpgroup's rows: one wgmma's M
    if not isinstance(m_end, int) or not m0 < m_end <= m0 + rows * consumers:
        raise ValueError(f"m_end must be an int in ({m0}, {m0 + rows * consumers}], got {m_end!r}")
    tiles = lambda end: -(-min(n_k, max(0, end + diag_offset)) // block_n)  # noqa: E731
    mine = [tiles(min(m0 + rows * (w + 1), m_end)) if m0 + rows * w < m_end else 0 for w in range(consumers)]
    return tiles(m_end), mine


def _nonneg(name: str, x) -> None:
    if not isinstance(x, int) or x < 0:
        raise ValueError(f"{name} must be a non-negative int, got {x!r}")

"""The warp-level layouts of chapter 8's tensor-core kernels, modelled in PyTorch on the CPU.

A warp's 32 lanes each hold a few elements of the tiles that ``mma.sync.m16n8k16`` multiplies:
its *fragments*. The functions here say which (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
floating point type"; ``ft_mma.cuh`` writes the same table in its header):

* ``a_element``, ``b_element``, ``c_element``: the (row, column) of each lane's registers in the
  16 x 16 A operand, the 16 x 8 B operand and the 16 x 8 float32 accumulator C;
* ``load_a``, ``load_b``, ``load_c`` and ``store_c``: a tile scattered into per-lane fragments,
  shape ``(32, registers, values per register)``, and an accumulator gathered back;
* ``mma_m16n8k16``: the instruction, lane by lane: each output a lane holds is the dot product
  of a row of A and a column of B, whose elements it fetches from the lanes that hold them;
* ``c_to_a``: two accumulator tiles turned into one A operand with no data leaving its lane,
  which is why the probabilities of ``fwd_v2_mma.cu`` never go to shared memory;
* ``shfl_xor`` and ``quad_max``/``quad_sum``: ``__shfl_xor_sync`` and the 4-lane reductions of
  a row;
* ``ldmatrix_x4`` and the per-lane row addresses of ``fwd_v3_fast.cu`` (``a_addresses``,
  ``b_addresses``): which lane names which 16-byte row of shared memory, and what it receives.

Nothing here runs on a GPU: the tests check the model against ``a @ b``, and the CUDA kernels use
the same tables; a wrong entry would give a wrong product in both.
"""
from __future__ import annotations

import torch

WARP = 32
M, N, K = 16, 8, 16


def _lane(lane: int) -> tuple[int, int]:
    if not isinstance(lane, int) or not 0 <= lane < WARP:
        raise ValueError(f"lane must be an int in [0, 32), got {lane!r}")
    return divmod(lane, 4)                      # groupID g, thread in group t


def a_element(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(row, col) in the 16 x 16 A tile of value ``half`` (0: low 16 bits)
    of register ``reg`` (0..3) of ``lane``: a0 row g, a1 row g + 8, a2 and
    a3 the same rows 8 columns on."""
    g, t = _lane(lane)
    if reg not in range(4) or half not in (0, 1):
        raise ValueError(f"reg must be in 0..3 and half 0 or 1, "
                         f"got {reg!r}, {half!r}")
    return g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2)


def b_element(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(k, n) in the 16 x 8 B tile of value ``half`` of register ``reg`` (0, 1) of ``lane``:
    column g, rows 2t and 2t + 1 (b0) and 8 rows further (b1)."""
    g, t = _lane(lane)
    if reg not in (0, 1) or half not in (0, 1):
        raise ValueError(f"reg and half must be 0 or 1, got {reg!r}, {half!r}")
    return 2 * t + half + 8 * reg, g


def c_element(lane: int, i: int) -> tuple[int, int]:
    """(row, col) in the 16 x 8 float32 accumulator of value ``i`` (0..3) of ``lane``:
    c0, c1 on row g, c2, c3 on row g + 8, columns 2t and 2t + 1."""
    g, t = _lane(lane)
    if i not in range(4):
        raise ValueError(f"i must be in 0..3, got {i!r}")
    return g + 8 * (i // 2), 2 * t + i % 2


# (lane, register, half) -> (row, col) for every value a lane holds, as index tensors
def _table(element, regs: int, halves: int):
    rows = torch.empty(WARP, regs, halves, dtype=torch.long)
    cols = torch.empty_like(rows)
    for lane in range(WARP):
        for r in range(regs):
            for h in range(halves):
                rows[lane, r, h], cols[lane, r, h] = (
                    element(lane, r, h) if halves > 1 else element(lane, r))
    return rows, cols


_A = _table(a_element, 4, 2)
_B = _table(b_element, 2, 2)
_C = tuple(t[..., 0] for t in _table(c_element, 4, 1))


def _shape(name: str, tile, shape) -> torch.Tensor:
    if not isinstance(tile, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tile).__name__}")
    if tuple(tile.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tile.shape)}")
    return tile


def load_a(tile: torch.Tensor) -> torch.Tensor:
    """The A fragments of a 16 x 16 tile: ``(32, 4, 2)``, lane by register by half."""
    return _shape("tile", tile, (M, K))[_A]


def load_b(tile: torch.Tensor) -> torch.Tensor:
    """The B fragments of a 16 x 8 (k x n) tile: ``(32, 2, 2)``."""
    return _shape("tile", tile, (K, N))[_B]


def load_c(tile: torch.Tensor) -> torch.Tensor:
    """The accumulator fragments of a 16 x 8 tile: ``(32, 4)``."""
    return _shape("tile", tile, (M, N))[_C]


def store_c(frags: torch.Tensor) -> torch.Tensor:
    """The 16 x 8 tile that accumulator fragments ``(32, 4)`` hold."""
    tile = torch.empty(M, N, dtype=_shape("frags", frags, (WARP, 4)).dtype)
    tile[_C] = frags
    return tile


def _owners(table):
    # (row, col) -> (lane, reg, half) of the value that holds it, built from the forward map
    rows, cols = table
    where = {}
    for idx in torch.cartesian_prod(*(torch.arange(s) for s in rows.shape)).tolist():
        where[int(rows[tuple(idx)]), int(cols[tuple(idx)])] = tuple(idx)
    return where


_A_OWNER = _owners(_A)
_B_OWNER = _owners(_B)


def mma_m16n8k16(a: torch.Tensor, b: torch.Tensor,
                 c: torch.Tensor) -> torch.Tensor:
    """``D = A B + C`` on fragments (``(32, 4, 2)``, ``(32, 2, 2)``,
    ``(32, 4)``), one output value at a time: lane L's value i is row r of
    A times column n of B, each element fetched from the lane that holds
    it, plus L's own c value. The products accumulate in float32."""
    _shape("a", a, (WARP, 4, 2)), _shape("b", b, (WARP, 2, 2))
    _shape("c", c, (WARP, 4))
    d = c.to(torch.float32).clone()
    for lane in range(WARP):
        for i in range(4):
            r, n = c_element(lane, i)
            # _A_OWNER[r, k]: (lane, register, half) that holds A[r][k]
            row = torch.stack([a[_A_OWNER[r, kk]] for kk in range(K)])
            col = torch.stack([b[_B_OWNER[kk, n]] for kk in range(K)])
            d[lane, i] += (row.float() * col.float()).sum()
    return d


def c_to_a(c_lo: torch.Tensor, c_hi: torch.Tensor) -> torch.Tensor:
    """The A fragments of the 16 x 16 tile whose columns 0..7 are accumulator ``c_lo`` and 8..15
    ``c_hi``, built by each lane from its own values: a0 = (c_lo0, c_lo1), a1 = (c_lo2, c_lo3),
    a2 and a3 the same from ``c_hi``. (In the kernels a register holds the pair as 16 bits each.)"""
    _shape("c_lo", c_lo, (WARP, 4)), _shape("c_hi", c_hi, (WARP, 4))
    return torch.stack([c_lo[:, 0:2], c_lo[:, 2:4], c_hi[:, 0:2], c_hi[:, 2:4]], dim=1)


def shfl_xor(values: torch.Tensor, lane_mask: int) -> torch.Tensor:
    """``__shfl_xor_sync(0xffffffff, x, lane_mask)`` for all lanes: lane L gets lane L ^ mask's
    ``x`` (``values`` has the lane as its first dimension)."""
    if values.shape[0] != WARP:
        raise ValueError(f"values must have 32 lanes in dimension 0, got {tuple(values.shape)}")
    return values[torch.arange(WARP) ^ lane_mask]


def quad_max(values: torch.Tensor) -> torch.Tensor:
    """The maximum over the 4 lanes 4g..4g+3 that share a row, in every one of them: two
    butterfly steps, as ``quad_max`` in ``ft_mma.cuh``."""
    values = torch.maximum(values, shfl_xor(values, 1))
    return torch.maximum(values, shfl_xor(values, 2))


def quad_sum(values: torch.Tensor) -> torch.Tensor:
    """The sum over the 4 lanes that share a row, in every one of them (``quad_sum``)."""
    values = values + shfl_xor(values, 1)
    return values + shfl_xor(values, 2)


# ------------------------------------------------------------------ ldmatrix

def a_addresses(lane: int) -> tuple[int, int]:
    """(row, col) of the 8-element row of a 16 x 16 tile whose address ``lane`` gives to
    ``ldmatrix.x4`` in ``fwd_v3_fast.cu`` for an A operand (Q; and V, transposed): matrices
    0..3 are the quarters (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)."""
    _lane(lane)
    return lane % 8 + ((lane // 8) & 1) * 8, (lane // 16) * 8


def b_addresses(lane: int) -> tuple[int, int]:
    """The same for K, stored key-major, as the B operand of ``Q K^T``: matrices 0 and 1 are
    keys 0-7 at columns 0-7 and 8-15 (b0, b1 of the first 8 keys), matrices 2 and 3 keys 8-15."""
    _lane(lane)
    return lane % 8 + (lane // 16) * 8, ((lane // 8) & 1) * 8


def ldmatrix_x4(smem: torch.Tensor, addresses,
                trans: bool = False) -> torch.Tensor:
    """``ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`` on a 2-D tile
    of 16-bit values: lane i gives ``addresses[i]`` = (row, col), the start
    of row i % 8 of matrix i // 8 (8 consecutive elements); register m of
    lane L receives row L // 4, columns 2 (L % 4) and 2 (L % 4) + 1 of
    matrix m, or with ``trans`` the same of the transposed matrix.
    Returns ``(32, 4, 2)``."""
    if not isinstance(smem, torch.Tensor) or smem.dim() != 2:
        raise ValueError("smem must be a 2-D torch.Tensor "
                         "(rows of 16-bit values)")
    addresses = list(addresses)
    if len(addresses) != WARP:
        raise ValueError(f"addresses must give one (row, col) per lane, "
                         f"got {len(addresses)}")
    rows = [[smem[r, c:c + 8] for r, c in addresses[8 * m:8 * m + 8]]
            for m in range(4)]
    mats = torch.stack([torch.stack(m) for m in rows])      # (4, 8, 8)
    if trans:
        mats = mats.transpose(1, 2)
    out = torch.empty(WARP, 4, 2, dtype=smem.dtype)
    for lane in range(WARP):
        g, t = divmod(lane, 4)
        out[lane] = mats[:, g, 2 * t:2 * t + 2]
    return out

"""Which warp and lane of the dK/dV kernel's warp grid (``bwd_dkdv.cu`` built with
``DKDV_WARP_GRID``, ``BackwardConfig(warp_grid=True)``) holds which element of each tile, in plain
Python, so that a CPU test can check the index arithmetic the kernel assumes.

The block has 8 warps and 128 keys; a step covers ``block_m`` (64 or 128) queries. Warp
``w = 4 h + g``:

* S^T, dP^T, P^T, dS^T (keys x queries): keys ``32 g ..+32``, queries ``h * block_m / 2 ..`` (its
  half), two 16-row m-tiles of ``block_m / 16`` n-tiles of 8 (:func:`s_block`);
* dK, dV (keys x head dim): the same keys, columns ``h * D / 2 ..`` (:func:`dkdv_block`); the
  product ``dV += P^T dO`` needs P^T of its keys for all queries: its own half in registers, the
  other half written to shared memory by warp ``w ^ 4`` (:func:`partner`);
* dQ (queries x head dim): queries ``32 (w % (block_m / 32)) ..``, ``D * block_m / 256`` columns
  (:func:`dq_block`).

:func:`emulate_backward` runs the kernel's data flow on these blocks (own half of the queries
from registers, the partner's from the shared tiles, the barriers between) on the CPU.

The fragment layouts are those of the PTX ISA ("Matrix fragments for mma.m16n8k16 with floating
point type", and ``ldmatrix``): for lane ``l``, group ``g = l // 4`` and ``t = l % 4``, A register
``i`` (of 4, two 16-bit values each) holds row ``g + 8 (i % 2)``, columns ``2 t + 8 (i // 2)`` and
``+1``; B register ``i`` (of 2) holds rows ``2 t + 8 i``, ``+1`` of column ``g``; accumulator value
``i`` (of 4) row ``g + 8 (i // 2)``, column ``2 t + i % 2``. ``ldmatrix .x4``: lane ``8 m + r`` gives
the address of row ``r`` of 8x8 matrix ``m``, and lane ``4 r + w`` receives in register ``m`` the
values at columns ``2 w, 2 w + 1`` of its row ``r`` (``.trans``: rows ``2 w, 2 w + 1`` of column
``r``).
"""
from __future__ import annotations

WARPS = 8          # per block
BLOCK_N = 128      # keys per block: 4 key groups of 32
KEY_GROUPS = 4     # warps along the keys; the other factor (2) splits queries, then columns


def _check(block_m: int, head_dim: int) -> None:
    if block_m not in (64, 128) or head_dim not in (64, 128):
        raise ValueError(f"the warp grid is built for block_m 64 or 128 and head_dim 64 or 128, "
                         f"got block_m={block_m}, head_dim={head_dim}")


def partner(warp: int) -> int:
    """The warp that holds the other half of this warp's P^T and dS^T rows."""
    return warp ^ KEY_GROUPS


def s_block(warp: int, block_m: int) -> tuple[range, range]:
    """(key rows, query columns) of S^T, dP^T, P^T and dS^T this warp computes."""
    g, h = warp % KEY_GROUPS, warp // KEY_GROUPS
    qn = block_m // 2
    return range(32 * g, 32 * g + 32), range(h * qn, h * qn + qn)


def dkdv_block(warp: int, head_dim: int) -> tuple[range, range]:
    """(key rows, columns) of dK and dV this warp accumulates and stores."""
    g, h = warp % KEY_GROUPS, warp // KEY_GROUPS
    dh = head_dim // 2
    return range(32 * g, 32 * g + 32), range(h * dh, h * dh + dh)


def dq_cols(block_m: int, head_dim: int) -> int:
    """Columns of the dQ tile per warp (``DKDV_DQ_COLS``, ``BackwardConfig.dq_cols``)."""
    return head_dim * block_m // 256


def dq_block(warp: int, block_m: int, head_dim: int) -> tuple[range, range]:
    """(query rows of the step, columns) of dQ this warp computes and adds."""
    _check(block_m, head_dim)
    groups = block_m // 32
    cols = dq_cols(block_m, head_dim)
    qg, c0 = warp % groups, (warp // groups) * cols
    return range(32 * qg, 32 * qg + 32), range(c0, c0 + cols)


# ---- fragments ------------------------------------------------------------------------------

def a_elements(lane: int, reg: int) -> list[tuple[int, int]]:
    """(row, col) in a 16x16 A tile of the two values of A register ``reg`` of ``lane``."""
    g, t = lane // 4, lane % 4
    r, c = g + 8 * (reg % 2), 2 * t + 8 * (reg // 2)
    return [(r, c), (r, c + 1)]


def b_elements(lane: int, reg: int) -> list[tuple[int, int]]:
    """(k, n) in a 16x8 B tile of the two values of B register ``reg`` (0 or 1) of ``lane``."""
    g, t = lane // 4, lane % 4
    return [(2 * t + 8 * reg, g), (2 * t + 8 * reg + 1, g)]


def c_element(lane: int, i: int) -> tuple[int, int]:
    """(row, col) in a 16x8 accumulator tile of value ``i`` of ``lane``."""
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def acc_to_a(lane: int, reg: int) -> list[tuple[int, int, int]]:
    """What ``acc_to_a`` packs into A register ``reg`` of k-step ``kt``: (n-tile offset 0 or 1 from
    ``2 kt``, accumulator index) of each of its two values, as the kernel writes it."""
    nt, base = reg // 2, 2 * (reg % 2)
    return [(nt, base), (nt, base + 1)]


def lane_off_a(lane: int) -> tuple[int, int]:
    """(row, col) of the 16x16 block whose address lane ``lane`` passes (``lane_off_a``)."""
    return lane % 16, 8 * (lane // 16)


def lane_off_b(lane: int) -> tuple[int, int]:
    """(row, col) of the 16x16 block whose address lane ``lane`` passes (``lane_off_b``)."""
    return (lane % 8) + 8 * (lane // 16), 8 * ((lane // 8) % 2)


def ldmatrix_x4(offsets, trans: bool = False) -> list[list[list[tuple[int, int]]]]:
    """What ``ldmatrix.x4`` gives each lane when lane ``l`` passes the address of stored element
    ``offsets(l)`` (row, col; 8 consecutive values of that row are a matrix row): per lane, per
    register, the (row, col) of the stored values it receives, low half first."""
    rows = [offsets(l) for l in range(32)]      # lane 8 m + r: row r of matrix m starts here
    out = []
    for lane in range(32):
        r, w = lane // 4, lane % 4
        regs = []
        for m in range(4):
            if trans:   # column r of matrix m, rows 2w and 2w + 1
                regs.append([(rows[8 * m + 2 * w + e][0], rows[8 * m + 2 * w + e][1] + r) for e in (0, 1)])
            else:
                r0, c0 = rows[8 * m + r]
                regs.append([(r0, c0 + 2 * w), (r0, c0 + 2 * w + 1)])
        out.append(regs)
    return out


def store_a_frags(lane: int, kt: int, reg: int) -> list[tuple[int, int]]:
    """(row, col) of the 16 x 16 KT tile where ``store_a_frags`` puts A register ``reg`` of k-step
    ``kt`` of ``lane`` (relative to its row0, col0)."""
    row = lane // 4 + 8 * (reg % 2)
    col = 16 * kt + 2 * (lane % 4) + 8 * (reg // 2)
    return [(row, col), (row, col + 1)]


def bank_conflicts_32bit(addresses: list[int]) -> int:
    """Extra shared-memory wavefronts of one warp-wide 4-byte access at these byte addresses (0:
    every bank hit once per distinct word)."""
    banks: dict[int, set] = {}
    for a in addresses:
        banks.setdefault((a // 4) % 32, set()).add(a // 4)
    return max(len(words) for words in banks.values()) - 1


def ldmatrix_conflicts(row_addresses: list[int]) -> int:
    """Extra wavefronts of one ``ldmatrix`` phase: 8 lanes' 16-byte rows, conflict-free when they
    fall in the 8 different 16-byte bank groups of 128 bytes."""
    groups: dict[int, set] = {}
    for a in row_addresses:
        groups.setdefault((a // 16) % 8, set()).add(a // 16)
    return max(len(rows) for rows in groups.values()) - 1


# ---- the kernel's data flow on the grid ---------------------------------------------------------

def emulate_backward(q, k, v, do, lse, delta, scale: float, causal: bool, diag_offset: int,
                     block_m: int):
    """dQ, dK, dV of one (query head, K/V head) pair as the warp-grid kernel forms them, in
    PyTorch on the CPU: 128-key blocks, causal query blocks skipped and the per-element mask
    applied on edge tiles only, per warp its own S^T block (:func:`s_block`), P^T and dS^T rounded
    to the input dtype, dV, dK accumulated over its own half of the queries and then over the
    partner's from the shared tiles (:func:`dkdv_block`, :func:`partner`), dQ from the whole dS^T
    tile (:func:`dq_block`), float32 everywhere else. ``q``, ``do``: (Nq, D); ``k``, ``v``: (Nk, D),
    float16 or bfloat16; ``lse``: natural-log log-sum-exp of each query row (float32, ``-inf`` for a
    row that sees no key); ``delta``: rowsum(dO * O) (float32). Returns float32 tensors."""
    import torch

    dtype = q.dtype
    n_q, D = q.shape
    n_k = k.shape[0]
    _check(block_m, D)
    rnd = lambda x: x.to(dtype).float()   # noqa: E731  (P and dS packed into 16-bit A fragments)

    def f(x, n):   # a tile of n rows from shared memory: float32, rows past the end zero-filled
        return torch.cat([x.float(), torch.zeros(max(0, n - x.shape[0]), *x.shape[1:])])[:n]

    scale_log2 = scale * 1.4426950408889634
    lse2 = lse.float() * 1.4426950408889634
    dq = torch.zeros(n_q, D)
    dk, dv = torch.zeros(n_k, D), torch.zeros(n_k, D)
    for k0 in range(0, n_k, BLOCK_N):
        K, V = (f(x[k0:k0 + BLOCK_N], BLOCK_N) for x in (k, v))     # rows past Nk are zeros
        acc_dk, acc_dv = torch.zeros(BLOCK_N, D), torch.zeros(BLOCK_N, D)
        first_q = (max(0, k0 - diag_offset) // block_m) * block_m if causal else 0
        n_steps = -(-(n_q - first_q) // block_m) if first_q < n_q else 0
        diag_first = k0 + BLOCK_N - 1 - diag_offset
        for step in range(n_steps):
            q0 = first_q + step * block_m
            Q, dO = (f(x[q0:q0 + block_m], block_m) for x in (q, do))
            l2, dl = (f(x[q0:q0 + block_m], block_m) for x in (lse2, delta.float()))
            edge = q0 + block_m > n_q or (causal and diag_first > q0)
            t_p, t_ds = torch.zeros(BLOCK_N, block_m), torch.zeros(BLOCK_N, block_m)
            for w in range(WARPS):        # before the step's second barrier
                rows, cols = (list(r) for r in s_block(w, block_m))
                kr, dc = (list(r) for r in dkdv_block(w, D))
                p = torch.exp2(K[rows] @ Q[cols].T * scale_log2 - l2[cols][None, :])
                if edge:
                    qi = torch.tensor([q0 + c for c in cols])[None, :]
                    kj = torch.tensor([k0 + r - diag_offset for r in rows])[:, None]
                    p = torch.where((qi >= n_q) | (causal & (kj > qi)), torch.zeros(()), p)
                ds = p * (V[rows] @ dO[cols].T - dl[cols][None, :])
                t_p[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = rnd(p)
                t_ds[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = rnd(ds)
                acc_dv[kr[0]:kr[-1] + 1, dc[0]:dc[-1] + 1] += rnd(p) @ dO[cols][:, dc]
                acc_dk[kr[0]:kr[-1] + 1, dc[0]:dc[-1] + 1] += rnd(ds) @ Q[cols][:, dc]
            for w in range(WARPS):        # after it: the partner's half, and dQ
                kr, dc = (list(r) for r in dkdv_block(w, D))
                pc = list(s_block(partner(w), block_m)[1])
                acc_dv[kr[0]:kr[-1] + 1, dc[0]:dc[-1] + 1] += t_p[kr][:, pc] @ dO[pc][:, dc]
                acc_dk[kr[0]:kr[-1] + 1, dc[0]:dc[-1] + 1] += t_ds[kr][:, pc] @ Q[pc][:, dc]
                qr, qc = (list(r) for r in dq_block(w, block_m, D))
                tile = t_ds[:, qr].T @ K[:, qc]
                keep = [i for i, r in enumerate(qr) if q0 + r < n_q]
                for i in keep:
                    dq[q0 + qr[i], qc[0]:qc[-1] + 1] += tile[i]
        n = min(BLOCK_N, n_k - k0)
        dk[k0:k0 + n], dv[k0:k0 + n] = acc_dk[:n] * scale, acc_dv[:n]
    return dq * scale, dk, dv

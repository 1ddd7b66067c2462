"""Chapter 08 exercises (CUDA): what one thread computes, which lane holds which mma element,
a bank-conflict-free shared-memory layout, and the shared-memory budget of the fast kernel.

All four run on the CPU: they check the reasoning behind the kernels, not a GPU. Each
``check_*`` takes the reader's function and returns a :class:`CheckResult` that says what is
wrong and where; each ``solution_*`` is a worked answer.
"""
from __future__ import annotations

import math

import torch

from ..constants import LN2, LOG2E
from ..cuda.configs import v3_smem_bytes
from ..reference import naive_attention
from ..checks import check_count
from .checker import CheckResult, call_scalar, check_callable, run_trials


# --------------------------------------------------------------- 1. one thread of fwd_v1

def solution_one_thread_row(q_row, k, v, scale: float, block_n: int = 32):
    """What one thread of ``fwd_v1_rows.cu`` computes: the output row and natural-log
    lse of one query row ``q_row`` (D,) against ``k``, ``v`` (N, D), tile by tile,
    base 2 inside."""
    acc = torch.zeros_like(q_row)
    m, l = -math.inf, 0.0
    for n0 in range(0, k.shape[0], block_n):
        s = (k[n0:n0 + block_n] @ q_row) * (scale * LOG2E)   # scores in log2 units
        m_new = max(m, float(s.max()))
        alpha = 2.0 ** (m - m_new)  # rescale the past once per tile
        p = torch.pow(2.0, s - m_new)
        l = l * alpha + float(p.sum())
        acc = acc * alpha + p @ v[n0:n0 + block_n]
        m = m_new
    return acc / l, (m + math.log2(l)) * LN2


def _row_inputs(gen):
    N = int(torch.randint(1, 150, (1,), generator=gen))
    D = int(torch.randint(4, 40, (1,), generator=gen))
    q = 3.0 * torch.randn(D, generator=gen, dtype=torch.float64)  # large logits, on purpose
    k = torch.randn(N, D, generator=gen, dtype=torch.float64)
    v = torch.randn(N, D, generator=gen, dtype=torch.float64)
    return q, k, v, 1.0 / math.sqrt(D)


def _row_reference(q, k, v, scale):
    o = naive_attention(q[None, None, None], k[None, None], v[None, None], scale=scale)
    return o[0, 0, 0], torch.logsumexp((k @ q) * scale, 0)


def check_one_thread_row(fn, trials: int = 8) -> CheckResult:
    """``fn(q_row, k, v, scale) -> (o_row, lse)``: one query row, online softmax over tiles
    (``o_row`` a tensor, ``lse`` a tensor or a Python float)."""
    return run_trials(fn, _row_reference, _row_inputs, trials=trials, name="(o_row, lse)",
                      atol=1e-9, rtol=1e-9)


# --------------------------------------------------------------- 2. mma fragment owner

def solution_a_fragment_owner(row: int, col: int) -> tuple[int, int, int]:
    """For element ``A[row][col]`` of the 16x16 A operand of ``mma.m16n8k16``: the lane
    that holds it, which of its 4 registers, and which half (0 = low 16 bits) of that
    register."""
    g, t = row % 8, (col % 8) // 2
    reg = (row // 8) + 2 * (col // 8)
    return 4 * g + t, reg, col % 2


def check_a_fragment_owner(fn) -> CheckResult:
    """``fn(row, col) -> (lane, register, half)`` for all 256 elements of the A fragment."""
    check_callable("fn", fn)
    wrong = []
    for r in range(16):
        for c in range(16):
            want = solution_a_fragment_owner(r, c)
            got, error = call_scalar(fn, (r, c), count=3, integers=True)
            if error is not None:
                return error
            got = tuple(got)
            if got != want:
                wrong.append((r, c, got, want))
    if not wrong:
        return CheckResult(True, "✓ all 256 elements of A: right lane, register and half", 0.0, 0, 256)
    lines = [f"✗ {len(wrong)} of 256 elements wrong; first ones (row, col): got -> expected"]
    lines += [f"  A[{r}][{c}]: {g} -> {w}" for r, c, g, w in wrong[:5]]
    return CheckResult(False, "\n".join(lines), float(len(wrong)), len(wrong), 256,
                       [(r, c) for r, c, _, _ in wrong[:5]])


# --------------------------------------------------------------- 3. a conflict-free layout

def solution_swizzle(row: int, chunk: int) -> int:
    """Where 16-byte chunk ``chunk`` (0..7) of tile row ``row`` is stored: ``chunk ^ (row % 8)``."""
    return chunk ^ (row % 8)


def check_swizzle(fn, rows: int = 64, chunks: int = 8) -> CheckResult:
    """``fn(row, chunk) -> stored chunk``, for rows of 8 chunks of 16 bytes (64 16-bit values).

    Accepted: any layout where (1) each row keeps its 8 chunks (a permutation of 0..7), and
    (2) any 8 consecutive rows' copies of one logical chunk (what one ``ldmatrix`` 8x8
    matrix reads) sit in 8 different physical chunks, i.e. 8 different groups of 4 banks."""
    check_callable("fn", fn)
    rows, chunks = check_count("rows", rows, 8, 4096), check_count("chunks", chunks, 8, 64)
    problems, table = [], []
    for r in range(rows):
        phys = []
        for c in range(chunks):
            value, error = call_scalar(fn, (r, c), integers=True)
            if error is not None:
                return error
            phys.append(value)
        table.append(phys)
        if sorted(phys) != list(range(chunks)):
            problems.append(f"row {r}: chunks go to {phys}, not a permutation of 0..{chunks - 1}")
    for r0 in range(0, rows - 7):
        for c in range(chunks):
            where = [table[r0 + i][c] for i in range(8)]
            if len(set(where)) < 8:
                worst = max(where.count(x) for x in where)
                problems.append(f"rows {r0}..{r0 + 7}, chunk {c}: stored at {where}: a {worst}-way bank conflict")
                break
        if len(problems) > 5:
            break
    if problems:
        return CheckResult(False, "✗ " + "\n  ".join(problems[:6]), float(len(problems)), len(problems))
    return CheckResult(True, f"✓ every row is a permutation and every ldmatrix column is conflict-free "
                             f"({rows} rows checked)")


# --------------------------------------------------------------- 4. the shared-memory budget

def solution_v3_smem_bytes(head_dim: int, warps: int, stages: int, block_n: int = 64) -> int:
    """Q tile (16 rows per warp) plus ``stages`` K tiles and ``stages`` V tiles, 2 bytes each."""
    return (16 * warps * head_dim + 2 * stages * block_n * head_dim) * 2


def check_v3_smem_bytes(fn) -> CheckResult:
    """``fn(head_dim, warps, stages) -> bytes`` of dynamic shared memory of ``fwd_v3_fast.cu``."""
    check_callable("fn", fn)
    bad = []
    cases = [(d, w, s) for d in (64, 128) for w in (4, 8) for s in (1, 2)]
    for d, w, s in cases:
        want = v3_smem_bytes(d, w, s)
        got, error = call_scalar(fn, (d, w, s), integers=True)
        if error is not None:
            return error
        if got != want:
            bad.append(f"head_dim={d}, warps={w}, stages={s}: got {got} bytes, expected {want}")
    if bad:
        return CheckResult(False, "✗ " + "\n  ".join(bad), float(len(bad)), len(bad), len(cases))
    return CheckResult(True, f"✓ all {len(cases)} configurations: e.g. D=128, 8 warps, 2 stages = "
                             f"{v3_smem_bytes(128, 8, 2) // 1024} KB", 0.0, 0, len(cases))

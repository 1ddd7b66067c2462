"""The softmax's exponential on the float32 pipe: ``ft_exp2_poly`` of ``kernels/ft_common.cuh`` in numpy.

At head dim 64 the Hopper forward's special-function unit (one ``MUFU.EX2`` per score) is about as
busy as its tensor cores (chapter 11), while the float32 pipe, with 8 times the throughput, has room.
FlashAttention-4 computes a share of the exponentials there: ``x = j + f`` with ``j`` the nearest
integer and ``f`` in [-1/2, 1/2], ``2^f`` by a cubic, ``2^j`` written into a float's exponent field.

:func:`exp2_poly` repeats the kernel's float32 operations one by one (the tests compile the CUDA
function for the CPU with nvcc and compare every bit); :func:`minimax_cubic` computes the cubic's
coefficients that the header holds, rounded to float32; :func:`coefficients` reads them back from
the header, so that this module and the kernel cannot drift apart.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

HEADER = Path(__file__).resolve().parents[1] / "kernels" / "ft_common.cuh"
#: 1.5 * 2^23: adding it to a float in [-2^22, 2^22] rounds it to an integer held in the low mantissa bits
MAGIC = np.float32(12582912.0)
#: the interval of the fraction f the cubic approximates 2^f on
INTERVAL = (-0.5, 0.5)


def coefficients() -> np.ndarray:
    """The cubic's coefficients c0..c3 (float32) as ``ft_common.cuh`` defines them."""
    text = HEADER.read_text()
    found = dict(re.findall(r"#define FT_EXP2_P(\d) ([0-9.eE+-]+)f", text))
    if sorted(found) != ["0", "1", "2", "3"]:
        raise RuntimeError(f"{HEADER.name} does not define FT_EXP2_P0 to FT_EXP2_P3 (found {sorted(found)})")
    return np.array([float(found[str(i)]) for i in range(4)], dtype=np.float32)


def fma32(a, b, c) -> np.ndarray:
    """a * b + c rounded once to float32, as the GPU's fused multiply-add does (NumPy has none).

    a * b of two float32 is exact in float64 (48 significant bits); the sum is rounded once to float64
    and once to float32, which differs from one fused rounding only on a tie at float32's precision."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.float64(c)).astype(np.float32)


def exp2_poly(x) -> np.ndarray:
    """2^x for float32 ``x <= 0`` the way ``ft_exp2_poly`` computes it, operation by operation."""
    x = np.maximum(np.asarray(x, dtype=np.float32), np.float32(-127.0))
    t = x + MAGIC                       # round(x) + 1.5 * 2^23, exactly
    f = x - (t - MAGIC)                 # in [-1/2, 1/2], exactly
    c = coefficients()
    p = fma32(fma32(fma32(np.full_like(f, c[3]), f, c[2]), f, c[1]), f, c[0])
    with np.errstate(over="ignore"):
        scale_bits = (t.view(np.uint32) << np.uint32(23)) + np.uint32(127 << 23)   # (round(x) + 127) << 23
    return p * scale_bits.view(np.float32)


def relative_error(x) -> np.ndarray:
    """|exp2_poly(x) / 2^x - 1|, in float64, for ``x`` where 2^x is a normal float32 (x >= -126)."""
    x = np.asarray(x, dtype=np.float32)
    return np.abs(exp2_poly(x).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1.0)


def minimax_cubic(iterations: int = 30) -> np.ndarray:
    """The cubic with the smallest largest relative error |p(f) / 2^f - 1| on [-1/2, 1/2] (float64),
    by the Remez exchange: fit the error to equal and alternate on 5 points, move the points to the
    error's extrema, repeat."""
    a, b = INTERVAL
    n = 5                                                    # degree + 2 alternation points
    pts = (a + b) / 2 - (b - a) / 2 * np.cos(np.pi * np.arange(n) / (n - 1))
    grid = np.linspace(a, b, 100001)
    signs = (-1.0) ** np.arange(n)
    for _ in range(iterations):
        y = np.exp2(pts)
        # p(x_i) - (-1)^i E 2^{x_i} = 2^{x_i}: four coefficients and the level E
        system = np.hstack([np.vander(pts, 4, increasing=True), -(signs * y)[:, None]])
        c = np.linalg.solve(system, y)[:4]
        err = np.polynomial.polynomial.polyval(grid, c) / np.exp2(grid) - 1
        # the error's extrema, alternating in sign, the largest of each run
        turn = np.flatnonzero(np.diff(np.sign(np.diff(err))) != 0) + 1
        cand = np.concatenate([[0], turn, [len(grid) - 1]])
        chosen: list[int] = []
        for i in cand:
            if chosen and np.sign(err[i]) == np.sign(err[chosen[-1]]):
                if abs(err[i]) > abs(err[chosen[-1]]):
                    chosen[-1] = i
            else:
                chosen.append(i)
        while len(chosen) > n:
            chosen.pop(0 if abs(err[chosen[0]]) < abs(err[chosen[-1]]) else -1)
        pts = grid[chosen]
    return c


def cubic_error(c) -> float:
    """The largest relative error of the cubic ``c`` (c0..c3) against 2^f on :data:`INTERVAL`."""
    grid = np.linspace(*INTERVAL, 100001)
    return float(np.abs(np.polynomial.polynomial.polyval(grid, np.asarray(c, np.float64)) / np.exp2(grid) - 1).max())

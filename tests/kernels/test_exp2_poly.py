"""The softmax's exponential on the float32 pipe (``ft_exp2_poly``, ft_common.cuh) and its numpy model
(flashtut.cuda.models.exp2_poly), on the CPU: the CUDA function compiled for the host by nvcc gives the model's
bits on a million inputs; the error is the cubic's minimax error; masked scores give exactly 0."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from flashtut.cuda import compile as cc
from flashtut.cuda.models import exp2_poly as ep

NVCC = shutil.which("nvcc")


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    edges = np.array([0.0, -0.0, -0.5, -1.5, -2.5, -126.0, -126.5, -126.49, -126.51, -127.0, -127.5, -200.0,
                      -np.inf, -1e-30, -1e-7], dtype=np.float32)
    halves = np.arange(-126.5, 0.0, 1.0, dtype=np.float32)            # ties of round(x): round half to even
    near = np.concatenate([np.nextafter(halves, np.float32(0)), np.nextafter(halves, np.float32(-np.inf))])
    wide = rng.uniform(-130.0, 0.0, 1_000_000).astype(np.float32)
    small = -rng.exponential(2.0, 200_000).astype(np.float32)           # most softmax scores sit near the max
    return np.concatenate([edges, halves, near, wide, small])


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_the_cuda_function_gives_the_models_bits():
    x = _inputs()
    tmp = Path(tempfile.mkdtemp(prefix="flashtut_exp2_"))
    src = tmp / "exp2_host.cu"
    src.write_text(
        '#include "ft_common.cuh"\n#include <cstdio>\n#include <cstdlib>\n#include <vector>\n'
        "int main(int argc, char** argv) {\n"
        "  FILE* in = fopen(argv[1], \"rb\"); std::vector<float> x(atoi(argv[3]));\n"
        "  if (fread(x.data(), 4, x.size(), in) != x.size()) return 2;\n"
        "  for (auto& v : x) v = ft_exp2_poly(v);\n"
        "  FILE* out = fopen(argv[2], \"wb\"); fwrite(x.data(), 4, x.size(), out); fclose(out);\n"
        "}\n")
    exe = tmp / "exp2_host"
    # no contraction (and no fast math): the host compiler must not fuse what the function spells out
    res = subprocess.run([NVCC, "-std=c++17", "-O2", f"-I{cc.KERNEL_DIR}", "-Xcompiler", "-ffp-contract=off",
                          "-o", str(exe), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    x.tofile(tmp / "x.bin")
    subprocess.run([str(exe), str(tmp / "x.bin"), str(tmp / "y.bin"), str(x.size)], check=True)
    got = np.fromfile(tmp / "y.bin", dtype=np.float32)
    want = ep.exp2_poly(x)
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, [(float(x[i]), float(got[i]), float(want[i])) for i in diff[:5]]


def test_the_header_holds_the_minimax_cubic_in_float32():
    fit = ep.minimax_cubic()
    assert np.array_equal(ep.coefficients(), fit.astype(np.float32)), (ep.coefficients(), fit)
    # the Remez level: the error of the best cubic, equal at its 5 alternation points
    assert 7.4e-5 < ep.cubic_error(fit) < 7.5e-5
    # a plain least-squares cubic on the same interval is worse at its worst point
    grid = np.linspace(*ep.INTERVAL, 1001)
    lsq = np.polynomial.polynomial.polyfit(grid, np.exp2(grid), 3)
    assert ep.cubic_error(lsq) > 1.2 * ep.cubic_error(fit)


def test_error_is_the_cubics_and_far_below_a_16_bit_rounding():
    x = _inputs()
    x = x[np.isfinite(x) & (x >= -126.0)]
    err = ep.relative_error(x)
    # the cubic's 7.48e-5 and a few float32 roundings; float16 rounds P to 2^-11 = 4.9e-4, bfloat16 to 3.9e-3
    assert err.max() < 7.6e-5, float(err.max())
    assert err.max() < 2.0 ** -11 / 6


def test_masked_scores_give_zero_and_the_row_maximum_gives_one():
    got = ep.exp2_poly(np.array([-np.inf, -1e30, -127.0, -126.6], dtype=np.float32))
    assert (got == 0).all() and not np.signbit(got).any()
    one = ep.exp2_poly(np.array([0.0, -0.0], dtype=np.float32))
    assert np.allclose(one, 1.0, rtol=7.5e-5, atol=0)
    # every result is finite and non-negative over the whole range the softmax feeds it
    y = ep.exp2_poly(_inputs())
    assert np.isfinite(y).all() and (y >= 0).all()

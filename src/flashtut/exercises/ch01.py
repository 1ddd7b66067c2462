"""Chapter 01 exercises: the roofline and the arithmetic intensity of a matrix multiply.

Each ``check_*`` runs the reader's function on random inputs and returns a
:class:`~flashtut.exercises.checker.CheckResult` that says which inputs give a wrong answer and
by how much. The ``solution_*`` functions are the worked solutions the chapter reveals.
"""
from __future__ import annotations

import torch

from ..hardware import GPUS, attainable_tflops
from ..memory import matmul_traffic
from .checker import CheckResult, compare, run_trials

_DTYPE_OF_SIZE = {2: torch.float16, 4: torch.float32, 8: torch.float64}


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (1,), generator=gen))


# --- Exercise 1.1: the roofline ----------------------------------------------------------------

def _roofline_inputs(gen: torch.Generator):
    n = _randint(gen, 5, 40)
    # intensities from 0.01 to 10^4 FLOP/byte, log-uniform, so both sides of every ridge appear
    intensity = 10.0 ** (torch.rand(n, generator=gen, dtype=torch.float64) * 6 - 2)
    gpu = list(GPUS.values())[_randint(gen, 0, len(GPUS))]
    peak = gpu.fp16_tensor_tflops * float(0.5 + torch.rand(1, generator=gen))
    bandwidth = gpu.memory_bandwidth_gbps * float(0.5 + torch.rand(1, generator=gen))
    return intensity, peak, bandwidth


def check_roofline(fn, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``fn(intensity, peak_tflops, bandwidth_gbps) -> attainable TFLOP/s`` (a float64
    tensor of intensities in FLOP/byte, a peak in TFLOP/s, a bandwidth in GB/s) against
    ``flashtut.hardware.attainable_tflops``."""
    return run_trials(fn, attainable_tflops, _roofline_inputs, trials=trials, seed=seed,
                      name="attainable TFLOP/s", atol=1e-9, rtol=1e-9)


def solution_roofline(intensity, peak_tflops, bandwidth_gbps):
    """Worked solution of exercise 1.1: bandwidth (bytes/s) times intensity (FLOP/byte) is a
    FLOP/s rate; the kernel gets that or the peak, whichever is smaller."""
    memory_bound = bandwidth_gbps * 1e9 * intensity / 1e12
    return torch.clamp(memory_bound, max=peak_tflops)


# --- Exercise 1.2: intensity of a matrix multiply ------------------------------------------------

def _matmul_intensity(M, N, K, bytes_per_element):
    return matmul_traffic(M, N, K, _DTYPE_OF_SIZE[bytes_per_element]).intensity


def check_matmul_intensity(fn, cases: int = 40, seed: int = 0) -> CheckResult:
    """Check ``fn(M, N, K, bytes_per_element) -> FLOP per byte`` of ``C = A @ B`` with ``A`` of
    shape ``(M, K)``, ``B`` of ``(K, N)``, each read once and ``C`` written once, on ``cases``
    random shapes (from thin to square) and element sizes 2, 4 and 8."""
    gen = torch.Generator().manual_seed(seed)
    args = []
    for _ in range(cases):
        M, N, K = (2 ** _randint(gen, 0, 15) + _randint(gen, 0, 7) for _ in range(3))
        args.append((M, N, K, (2, 4, 8)[_randint(gen, 0, 3)]))
    got = []
    for a in args:
        try:
            got.append(float(fn(*a)))
        except Exception as exc:  # report the reader's error with the input that caused it
            return CheckResult(False, f"✗ fn{a} raised {type(exc).__name__}: {exc}")
    want = torch.tensor([_matmul_intensity(*a) for a in args], dtype=torch.float64)
    res = compare(torch.tensor(got, dtype=torch.float64), want, atol=1e-9, rtol=1e-9,
                  name="FLOP/byte")
    if not res.ok:
        res.message += "\n  the (M, N, K, bytes_per_element) of those positions: " + ", ".join(
            str(args[p[0]]) for p in res.bad_positions)
    return res


def solution_matmul_intensity(M, N, K, bytes_per_element):
    """Worked solution of exercise 1.2: ``2 M N K`` FLOPs (one multiply and one add per term)
    over the bytes of A, B and C."""
    return 2 * M * N * K / ((M * K + K * N + M * N) * bytes_per_element)

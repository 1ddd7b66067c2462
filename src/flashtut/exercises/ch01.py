"""Chapter 01 exercises: the roofline, the arithmetic intensity of a matrix multiply, and of
unfused attention's kernels when the scores are wider than the inputs.

Each ``check_*`` runs the reader's function on random inputs and returns a
:class:`~flashtut.exercises.checker.CheckResult` that says which inputs give a wrong answer and
by how much. The ``solution_*`` functions are the worked solutions the chapter reveals.
"""
from __future__ import annotations

import torch

from ..hardware import GPUS, attainable_tflops
from ..costs.memory import SOFTMAX_FLOPS_PER_ELEMENT, matmul_traffic, naive_attention_kernels
from .checker import MAX_TRIALS, CheckResult, call_scalar, check_callable, check_seed, compare, run_trials
from ..checks import check_count

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
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    args = []
    for _ in range(check_count("cases", cases, 1, MAX_TRIALS)):
        M, N, K = (2 ** _randint(gen, 0, 15) + _randint(gen, 0, 7) for _ in range(3))
        args.append((M, N, K, (2, 4, 8)[_randint(gen, 0, 3)]))
    got = []
    for a in args:
        value, error = call_scalar(fn, a)
        if error is not None:
            return error
        got.append(value)
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


# --- Exercise 1.3: where unfused attention sits when the scores are wider ------------------------

def _unfused_intensities_reference(N, D, in_bytes, score_bytes):
    kernels = naive_attention_kernels(1, 1, N, D, _DTYPE_OF_SIZE[in_bytes],
                                      score_dtype=_DTYPE_OF_SIZE[score_bytes])
    return [k.intensity for k in kernels]


def check_unfused_intensities(fn, cases: int = 30, seed: int = 0) -> CheckResult:
    """Check ``fn(N, D, in_bytes, score_bytes) -> (I_qk, I_softmax, I_pv)``: the FLOP per byte of
    ``S = Q K^T``, ``P = softmax(S)`` and ``O = P V`` for one batch entry and head, with Q, K, V, O
    of ``in_bytes`` per element and S, P of ``score_bytes``, each kernel reading its inputs once
    and writing its output once, and the softmax counted at
    ``flashtut.costs.memory.SOFTMAX_FLOPS_PER_ELEMENT`` operations per score. Random N and D; element
    sizes 2, 4 and 8, scores as wide as the inputs or wider."""
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    args = []
    for _ in range(check_count("cases", cases, 1, MAX_TRIALS)):
        in_bytes = (2, 4)[_randint(gen, 0, 2)]
        score_bytes = (2, 4, 8)[_randint(gen, 0, 3)]
        args.append((_randint(gen, 1, 20000), (16, 32, 64, 80, 128, 256)[_randint(gen, 0, 6)],
                     in_bytes, max(in_bytes, score_bytes)))
    got = []
    for a in args:
        values, error = call_scalar(fn, a, count=3)   # (QK^T, softmax, PV)
        if error is not None:
            return error
        got.append(values)
    want = torch.tensor([_unfused_intensities_reference(*a) for a in args], dtype=torch.float64)
    res = compare(torch.tensor(got, dtype=torch.float64), want, atol=1e-9, rtol=1e-9, name="FLOP/byte")
    if not res.ok:
        res.message += ("\n  positions are (case, kernel) with kernel 0 = QK^T, 1 = softmax, 2 = PV; "
                        "the (N, D, in_bytes, score_bytes) of those cases: "
                        + ", ".join(str(args[p[0]]) for p in res.bad_positions))
    return res


def solution_unfused_intensities(N, D, in_bytes, score_bytes):
    """Worked solution of exercise 1.3: the same FLOPs as before, but every byte of S and P now
    costs ``score_bytes``; Q, K, V and O keep ``in_bytes``."""
    nd, nn = N * D, N * N
    qk = 2 * nn * D / (2 * nd * in_bytes + nn * score_bytes)
    softmax = SOFTMAX_FLOPS_PER_ELEMENT * nn / (2 * nn * score_bytes)
    pv = 2 * nn * D / (nn * score_bytes + 2 * nd * in_bytes)
    return qk, softmax, pv

"""Chapter 02 exercises: naive attention of your own, where the score matrix stops fitting, and
the bytes the three unfused kernels move.

Each ``check_*`` runs the reader's function on random inputs and returns a
:class:`~flashtut.exercises.checker.CheckResult` that says which positions (or which inputs)
differ and by how much. The ``solution_*`` functions are the worked solutions the chapter reveals.
"""
from __future__ import annotations

import math

import torch

from ..costs.memory import max_seq_len, naive_attention_kernels
from ..reference import naive_attention
from ..checks import check_count
from .checker import MAX_TRIALS, CheckResult, call_scalar, check_callable, check_seed, compare, run_trials

_DTYPE_OF_SIZE = {2: torch.float16, 4: torch.float32, 8: torch.float64}


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (1,), generator=gen))


# --- Exercise 2.1: attention of your own -------------------------------------------------------

def _attention_inputs(gen: torch.Generator):
    B, H = _randint(gen, 1, 3), _randint(gen, 1, 4)
    Nq, Nk = _randint(gen, 1, 40), _randint(gen, 1, 40)     # odd sizes, Nq != Nk most of the time
    D = (8, 16, 24, 64)[_randint(gen, 0, 4)]
    q = 3.0 * torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64)   # large logits
    k = 3.0 * torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    causal = bool(_randint(gen, 0, 2))
    scale = None if _randint(gen, 0, 2) else float(0.05 + torch.rand(1, generator=gen))
    return q, k, v, causal, scale


def check_attention(fn, trials: int = 8, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, causal, scale) -> o`` against ``flashtut.naive_attention`` on float64
    inputs ``(B, H, Nq, D)``, ``(B, H, Nk, D)`` of odd sizes, causal or not (top-left aligned:
    query ``i`` sees keys ``0..i``), ``scale`` ``None`` (meaning ``1/sqrt(D)``) or a float."""
    return run_trials(fn, naive_attention, _attention_inputs, trials=trials, seed=seed,
                      name="o", atol=1e-10, rtol=1e-9)


def solution_attention(q, k, v, causal=False, scale=None):
    """Worked solution of exercise 2.1: scores, mask, a softmax that subtracts the row max, then
    the weighted sum of the values."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-2, -1) * scale
    if causal:
        i = torch.arange(q.shape[-2])[:, None]
        j = torch.arange(k.shape[-2])[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    s = s - s.amax(dim=-1, keepdim=True)
    p = torch.exp(s)
    p = p / p.sum(dim=-1, keepdim=True)
    return p @ v


# --- scalar exercises: run on many cases, report the cases that differ ----------------------------

def _check_cases(fn, reference, cases, name: str, atol: float = 0.0, rtol: float = 0.0) -> CheckResult:
    got = []
    for a in cases:
        value, error = call_scalar(fn, a)
        if error is not None:
            return error
        got.append(value)
    want = torch.tensor([float(reference(*a)) for a in cases], dtype=torch.float64)
    res = compare(torch.tensor(got, dtype=torch.float64), want, atol=atol, rtol=rtol, name=name)
    if not res.ok:
        res.message += "\n  the inputs at those positions: " + ", ".join(
            str(cases[p[0]]) for p in res.bad_positions)
    return res


# --- Exercise 2.2: the longest sequence whose scores fit ----------------------------------------

def _max_seq_len_reference(capacity_bytes, B, H, bytes_per_element, n_matrices):
    return max_seq_len(capacity_bytes, B, H, _DTYPE_OF_SIZE[bytes_per_element], n_matrices)


def check_max_seq_len(fn, cases: int = 40, seed: int = 0) -> CheckResult:
    """Check ``fn(capacity_bytes, B, H, bytes_per_element, n_matrices) -> N``, the largest ``N``
    with ``n_matrices * B * H * N * N * bytes_per_element <= capacity_bytes``, exactly, on random
    capacities from 1 GB to 200 GB (integers), batch, heads and element sizes 2, 4, 8."""
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    args = []
    for _ in range(check_count("cases", cases, 1, MAX_TRIALS)):
        cap = int(10 ** (9 + 2.3 * float(torch.rand(1, generator=gen))))
        args.append((cap, _randint(gen, 1, 9), _randint(gen, 1, 65), (2, 4, 8)[_randint(gen, 0, 3)],
                      _randint(gen, 1, 3)))
    # one case right at the boundary: capacity exactly fills N = 1000
    args.append((2 * 1 * 16 * 1000 * 1000 * 4, 1, 16, 4, 2))
    return _check_cases(fn, _max_seq_len_reference, args, name="N")


def solution_max_seq_len(capacity_bytes, B, H, bytes_per_element, n_matrices):
    """Worked solution of exercise 2.2: solve ``c N^2 <= capacity`` in integers, with the exact
    integer square root (a float ``sqrt`` can land one off at the boundary)."""
    per_square = n_matrices * B * H * bytes_per_element
    return math.isqrt(capacity_bytes // per_square)


# --- Exercise 2.3: bytes moved by the unfused kernels ------------------------------------------

def _traffic_reference(B, H, N, D, bytes_per_element):
    dtype = _DTYPE_OF_SIZE[bytes_per_element]
    return sum(k.bytes for k in naive_attention_kernels(B, H, N, D, dtype))


def check_unfused_traffic(fn, cases: int = 30, seed: int = 0) -> CheckResult:
    """Check ``fn(B, H, N, D, bytes_per_element) -> bytes`` read plus written by the three
    kernels of unfused attention (``S = Q K^T``, ``P = softmax(S)``, ``O = P V``; every tensor,
    S and P included, in the same dtype; each kernel reads its inputs once and writes its output
    once), exactly, on random shapes."""
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    args = [(_randint(gen, 1, 9), _randint(gen, 1, 33), _randint(gen, 1, 20000),
              (16, 32, 64, 80, 128, 256)[_randint(gen, 0, 6)], (2, 4, 8)[_randint(gen, 0, 3)])
            for _ in range(check_count("cases", cases, 1, MAX_TRIALS))]
    return _check_cases(fn, _traffic_reference, args, name="bytes")


def solution_unfused_traffic(B, H, N, D, bytes_per_element):
    """Worked solution of exercise 2.3: kernel 1 reads Q, K and writes S; kernel 2 reads S and
    writes P; kernel 3 reads P, V and writes O. Four N x N passes and four N x D passes."""
    nd = B * H * N * D * bytes_per_element
    nn = B * H * N * N * bytes_per_element
    return (2 * nd + nn) + (nn + nn) + (nn + nd + nd)


def naive_attention_lesson(q, k, v, causal=False, scale=None):
    """Chapter 2's attention with exactly what the chapter teaches: tensors
    ``(B, H, N, d)``, the scale (``None``: ``1/sqrt(d)``), the top-left causal mask
    (query ``i`` sees keys ``0..i``) and float32 scores (float64 for float64 inputs).
    ``flashtut.naive_attention`` is this plus input checks, grouped-query heads,
    bottom-right alignment and sliding windows (chapter 12), output 0 for a row that
    sees no key, and an overflow check."""
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q.to(acc_t) @ k.to(acc_t).transpose(-2, -1) * scale   # (B, H, Nq, Nk)
    if causal:                              # top-left: hide key j from query i if j > i
        i = torch.arange(q.shape[-2], device=q.device)[:, None]
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    p = torch.softmax(s, dim=-1)            # subtracts each row's maximum (chapter 3)
    return (p @ v.to(acc_t)).to(q.dtype)

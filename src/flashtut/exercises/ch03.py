"""Chapter 03 exercises: a safe softmax, a safe log-softmax, and where ``exp`` overflows.

Each ``check_*`` runs the reader's function on random inputs with large logits and returns a
:class:`~flashtut.exercises.checker.CheckResult` that says which positions differ and by how
much (NaN and Inf included). The ``solution_*`` functions are the worked solutions the chapter
reveals.
"""
from __future__ import annotations

import torch

from ..figures.softmax_plots import exp_overflow_threshold
from ..softmax import safe_softmax
from .checker import CheckResult, call_scalar, check_callable, compare, run_trials

# the error a correct float16 answer may have: its rounding (2**-11 relative) plus a float16 sum
_TOL = {torch.float32: {"atol": 1e-6, "rtol": 1e-5}, torch.float16: {"atol": 2e-3, "rtol": 1e-2},
        torch.float64: {"atol": 1e-12, "rtol": 1e-10}}


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (1,), generator=gen))


def _logits(gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Rows of odd length whose entries reach far past ``log(max)`` of ``dtype``: float16 up to
    about 20 (exp overflows above 11.09), float32 and float64 spread by hundreds."""
    rows, n = _randint(gen, 2, 7), _randint(gen, 3, 60)
    spread = {torch.float16: 6.0, torch.float32: 300.0, torch.float64: 300.0}[dtype]
    x = spread * torch.randn(rows, n, generator=gen, dtype=torch.float64)
    if dtype == torch.float16:
        x = x + 8.0
    return x.to(dtype)


def _by_dtype(fn, reference, dtypes, trials: int, seed: int, name: str) -> CheckResult:
    last = None
    for i, dt in enumerate(dtypes):
        res = run_trials(fn, reference, lambda g, dt=dt: (_logits(g, dt),), trials=trials,
                         seed=seed + i, name=f"{name} ({str(dt).replace('torch.', '')})", **_TOL[dt])
        if not res.ok:
            return res
        last = res
    return CheckResult(True, f"✓ passed {trials} random trials in each of "
                             f"{', '.join(str(d).replace('torch.', '') for d in dtypes)}", last.max_abs_err)


# --- Exercise 3.1: safe softmax --------------------------------------------------------------------

def check_softmax(fn, trials: int = 5, seed: int = 0) -> CheckResult:
    """Check ``fn(x) -> softmax along the last dimension`` (same dtype as ``x``) against
    ``flashtut.safe_softmax`` on float32 rows spread by hundreds and float16 rows reaching about
    20, where ``exp`` overflows without the max subtracted."""
    return _by_dtype(fn, safe_softmax, (torch.float32, torch.float16), trials, seed, "softmax")


def solution_softmax(x):
    """Worked solution of exercise 3.1: subtract the row max (exponents at most 0), sum in
    float32, normalise, cast back."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


# --- Exercise 3.2: safe log-softmax -----------------------------------------------------------------

def _log_softmax_reference(x):
    return torch.log_softmax(x, dim=-1)


def check_log_softmax(fn, trials: int = 5, seed: int = 0) -> CheckResult:
    """Check ``fn(x) -> log(softmax(x))`` along the last dimension against
    ``torch.log_softmax`` on float64 rows spread by hundreds, where many probabilities underflow
    to 0 and taking the log of a softmax gives ``-inf``."""
    return _by_dtype(fn, _log_softmax_reference, (torch.float64,), trials, seed, "log-softmax")


def solution_log_softmax(x):
    """Worked solution of exercise 3.2: ``log(exp(x - m) / d) = x - m - log(d)``; nothing is
    exponentiated that is not then summed, so no term underflows on its own."""
    m = x.amax(dim=-1, keepdim=True)
    return x - m - torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))


# --- Exercise 3.3: the last finite exp ------------------------------------------------------------

def check_exp_threshold(fn) -> CheckResult:
    """Check ``fn(dtype) -> the largest x of that dtype whose exp, computed in that dtype, is
    finite`` for float16, bfloat16 and float32 (the answer is a Python float)."""
    check_callable("fn", fn)
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    got = []
    for dt in dtypes:
        value, error = call_scalar(fn, (dt,))
        if error is not None:
            return error
        got.append(value)
    want = torch.tensor([exp_overflow_threshold(dt)["last_finite"] for dt in dtypes], dtype=torch.float64)
    res = compare(torch.tensor(got, dtype=torch.float64), want, atol=0.0, rtol=0.0, name="threshold")
    if not res.ok:
        res.message += "\n  positions are dtypes: 0 = float16, 1 = bfloat16, 2 = float32"
    return res


def solution_exp_threshold(dtype):
    """Worked solution of exercise 3.3: start at the representable number nearest ``log(max)``,
    then step with ``torch.nextafter`` until ``exp`` of x is finite and ``exp`` of the next is not."""
    import math

    up = torch.tensor(float("inf"), dtype=dtype)
    x = torch.tensor(math.log(torch.finfo(dtype).max), dtype=torch.float64).to(dtype)
    while not torch.isfinite(torch.exp(x)):
        x = torch.nextafter(x, -up)
    while torch.isfinite(torch.exp(torch.nextafter(x, up))):
        x = torch.nextafter(x, up)
    return float(x)

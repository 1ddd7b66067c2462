"""Chapter 09 exercises: turn a time into TFLOP/s with the protocol's FLOP count, and build the
table of ratios to a baseline. Each ``check_*`` runs the reader's function on random cases and
returns a :class:`~flashtut.exercises.checker.CheckResult` that says which cases are wrong and,
where the error has a recognisable cause, which one."""
from __future__ import annotations

import math
import random

from ..costs.flops import attention_flops
from ..bench.report import ratio_table
from ..checks import check_count
from .checker import MAX_TRIALS, CheckResult, call_scalar, check_callable

# a wrong answer off by one of these factors has a known cause (got / expected -> hint)
_FACTOR_HINTS = [
    (2.0, "twice too large: a causal mask halves the forward FLOPs"),
    (0.5, "half the expected value: two products of 2 FLOPs per multiply-add, and only causal attention is halved"),
    (0.25, "a quarter of the expected value: 4·B·H·N²·D counts two products of 2 FLOPs per multiply-add"),
    (2.5, "2.5 times too large: only the backward pass counts 2.5 times the forward"),
    (0.4, "2.5 times too small: the backward pass counts 2.5 times the forward's FLOPs"),
    (1e3, "1000 times too large: the time is in milliseconds"),
    (1e-3, "1000 times too small: the time is in milliseconds, not seconds"),
    (1e12, "10^12 times too large: report TFLOP/s, not FLOP/s"),
]


def _hint(ratio: float) -> str:
    for factor, hint in _FACTOR_HINTS:
        if math.isclose(ratio, factor, rel_tol=1e-6):
            return f" ({hint})"
    return ""


def _tflops_cases(rng: random.Random, n: int):
    # the protocol's shapes first, then odd ones: causal and not, both passes
    cases = [(16, 16, 1024, 128, False, "fwd", 1.37), (1, 16, 16384, 128, True, "bwd", 25.0)]
    while len(cases) < n:
        cases.append((rng.randint(1, 9), rng.randint(1, 40), rng.randint(17, 20000), rng.choice([16, 32, 64, 96, 128, 256]),
                      rng.random() < 0.5, rng.choice(["fwd", "bwd"]), round(rng.uniform(0.01, 80.0), 4)))
    return cases


def reference_tflops(B: int, H: int, N: int, D: int, causal: bool, mode: str, ms: float) -> float:
    """TFLOP/s of one attention call of the protocol's shape (``Nq = Nk = N``) that took ``ms``."""
    return attention_flops(B, H, N, N, D, causal, mode) / (ms * 1e-3) / 1e12


def check_tflops(tflops_fn, trials: int = 12, seed: int = 0) -> CheckResult:
    """Check ``tflops_fn(B, H, N, D, causal, mode, ms) -> TFLOP/s`` against the protocol's count
    (forward ``4·B·H·N²·D``, halved when causal; backward 2.5 times the forward) on ``trials``
    cases, to a relative error of 1e-9."""
    check_callable("tflops_fn", tflops_fn)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    cases = _tflops_cases(random.Random(seed), check_count("trials", trials, 1, MAX_TRIALS))
    wrong = []
    for case in cases:
        args = ", ".join(f"{k}={v!r}" for k, v in zip(("B", "H", "N", "D", "causal", "mode", "ms"), case))
        want = reference_tflops(*case)
        got, error = call_scalar(tflops_fn, case)
        if error is not None:
            return error
        if not math.isfinite(got):
            return CheckResult(False, f"✗ tflops_fn({args}) returned {got!r}; expected a finite number near {want:.6g}")
        if not math.isclose(got, want, rel_tol=1e-9):
            wrong.append(f"  tflops_fn({args}) = {got:.6g}, expected {want:.6g}{_hint(got / want) if want else ''}")
    if wrong:
        return CheckResult(False, f"✗ {len(wrong)} of {len(cases)} cases wrong:\n" + "\n".join(wrong[:5]),
                           n_bad=len(wrong), n_total=len(cases))
    return CheckResult(True, f"✓ all {len(cases)} cases match the protocol's count", n_total=len(cases))


_IMPLS = ["naive", "sdpa-flash", "sdpa-cudnn", "triton", "cuda"]


def synthetic_speed_rows(seed: int = 0) -> list[dict]:
    """Invented speed rows in ``flashtut.bench``'s layout (for the exercise, not measurements):
    several cases, failed rows without a time, a case the baseline did not run and one where the
    baseline failed its check."""
    rng = random.Random(seed)
    rows = []
    for mode in ("fwd", "bwd"):
        for dtype in ("float16", "bfloat16"):
            for causal in (False, True):
                for N in (1024, 4096):
                    for impl in _IMPLS:
                        if impl == "sdpa-flash" and N == 4096 and causal and dtype == "bfloat16":
                            continue                     # a case without the baseline: no ratios
                        ok = not (impl == "triton" and N == 1024 and mode == "bwd" and not causal)
                        if impl == "sdpa-flash" and N == 4096 and causal and dtype == "float16" and mode == "bwd":
                            ok = False                   # the baseline failed its check: no ratios either
                        if impl == "naive" and mode == "bwd" and dtype == "bfloat16":
                            ok = False
                        tf = round(rng.uniform(5.0, 600.0), 2) if ok else None
                        rows.append({"kind": "speed", "impl": impl, "mode": mode, "dtype": dtype,
                                     "B": 16384 // N, "H": 16, "N": N, "Nq": N, "Nk": N, "D": 128,
                                     "causal": causal, "tflops": tf, "status": "ok" if ok else "failed"})
    return rows


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _table_as_dict(table) -> dict:
    return {(e["mode"], e["dtype"], e["D"], e["N"], bool(e["causal"])): e["ratios"] for e in table}


def check_ratios(ratios_fn, rows: list[dict] | None = None, baseline: str = "sdpa-flash") -> CheckResult:
    """Check ``ratios_fn(rows, baseline) -> {(mode, dtype, D, N, causal): {impl: ratio}}``: for each
    case that ``baseline`` measured, every other implementation's TFLOP/s over the baseline's
    (implementations without a TFLOP/s left out). ``rows`` default to
    :func:`synthetic_speed_rows`; pass committed rows (one device) to check on them too."""
    check_callable("ratios_fn", ratios_fn)
    rows = synthetic_speed_rows() if rows is None else rows
    if not (isinstance(rows, (list, tuple)) and all(isinstance(r, dict) for r in rows)):
        raise TypeError(f"rows must be a list of dicts (result rows), got {type(rows).__name__}")
    want = _table_as_dict(ratio_table(rows, baseline))
    try:
        got = ratios_fn([dict(r) for r in rows], baseline)
    except Exception as exc:  # noqa: BLE001 - report, do not raise
        return CheckResult(False, f"✗ ratios_fn raised {type(exc).__name__}: {exc}")
    if not isinstance(got, dict):
        return CheckResult(False, f"✗ ratios_fn returned a {type(got).__name__}; expected a dict "
                                  "{(mode, dtype, D, N, causal): {impl: ratio}}")
    got = {tuple(k) if isinstance(k, tuple) else k: v for k, v in got.items()}
    problems = []
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing:
        problems.append(f"  {len(missing)} case(s) missing, e.g. {missing[0]}")
    if extra:
        problems.append(f"  {len(extra)} case(s) that should not be there, e.g. {extra[0]}"
                        f" (a case the baseline did not measure has no ratios)")
    n_values = 0
    for key in want:
        if key not in got:
            continue
        w, g = want[key], got[key]
        if not isinstance(g, dict):
            problems.append(f"  {key}: expected a dict {{impl: ratio}}, got {type(g).__name__}")
            continue
        for impl in sorted(set(w) | set(g), key=str):
            n_values += 1
            if impl not in g:
                problems.append(f"  {key}: no ratio for {impl!r}, expected {w[impl]:.4f}")
            elif impl not in w:
                why = " (the baseline itself is not listed)" if impl == baseline else \
                    " (it has no TFLOP/s in this case)"
                problems.append(f"  {key}: ratio for {impl!r} should not be there{why}")
            elif not (_is_number(g[impl]) and math.isclose(g[impl], w[impl], rel_tol=1e-9)):
                inv = (_is_number(g[impl]) and w[impl] and
                       math.isclose(g[impl] * w[impl], 1.0, rel_tol=1e-9))
                problems.append(f"  {key}: {impl} got {g[impl]!r}, expected {w[impl]:.4f}"
                                + (" (inverted: divide the implementation's TFLOP/s by the baseline's)" if inv else ""))
    if problems:
        return CheckResult(False, f"✗ {len(problems)} problem(s):\n" + "\n".join(problems[:6]),
                           n_bad=len(problems), n_total=len(want))
    return CheckResult(True, f"✓ all {len(want)} cases and {n_values} ratios match", n_total=len(want))


__all__ = ["check_tflops", "check_ratios", "reference_tflops", "synthetic_speed_rows"]

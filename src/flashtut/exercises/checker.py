"""Compare a reader's result with the library's and say exactly where they differ."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch


def wrap(text: str, width: int = 90) -> str:
    """Wrap every line of a checker message at ``width`` columns, keeping its indentation, so
    that it reads without scrolling on a narrow page."""
    out = []
    for line in text.splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        out.append(textwrap.fill(line, width, subsequent_indent=indent + "  ",
                                 break_long_words=False, break_on_hyphens=False) or line)
    return "\n".join(out)


@dataclass
class CheckResult:
    """Outcome of one comparison; ``bool(result)`` is ``result.ok``."""
    ok: bool
    message: str
    max_abs_err: float = 0.0
    n_bad: int = 0
    n_total: int = 0
    bad_positions: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return wrap(self.message)

    def _repr_pretty_(self, p, cycle):  # IPython shows the message, not the dataclass
        p.text(wrap(self.message))


def compare(actual, expected, atol: float = 1e-5, rtol: float = 1e-5, name: str = "output",
            max_report: int = 5) -> CheckResult:
    """Elementwise comparison in float64: ``|actual - expected| <= atol + rtol * |expected|``.

    The message names the shape mismatch, or how many positions differ, the worst ones with
    their indices and values, and whether any are NaN or Inf.
    """
    if not isinstance(actual, torch.Tensor):
        return CheckResult(False, f"✗ {name}: expected a torch.Tensor, got {type(actual).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        return CheckResult(False, f"✗ {name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    n = e.numel()
    diff = (a - e).abs()
    # NaN compares False, so NaN counts as bad; equal infinities (an empty state's -inf) match
    bad = ~((diff <= atol + rtol * e.abs()) | (a == e))
    n_bad = int(bad.sum())
    finite = torch.isfinite(diff)
    max_err = float(diff[finite].max()) if bool(finite.any()) else float("nan")
    if n_bad == 0:
        return CheckResult(True, f"✓ {name}: all {n} values match (max |error| {max_err:.2e}, "
                                 f"tolerance {atol:g} + {rtol:g}·|expected|)", max_err, 0, n)
    score = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, float("inf")))
    score = torch.where(bad, score, torch.full_like(score, -1.0))
    worst = torch.topk(score.flatten(), min(max_report, n_bad)).indices
    positions = [tuple(int(i) for i in torch.unravel_index(w, e.shape)) for w in worst]
    lines = [f"✗ {name}: {n_bad} of {n} values differ (max |error| {max_err:.3e}, "
             f"tolerance {atol:g} + {rtol:g}·|expected|)"]
    n_nonfinite = int((~torch.isfinite(a)).sum())
    if n_nonfinite:
        lines.append(f"  {n_nonfinite} values are NaN or Inf")
    for pos in positions:
        lines.append(f"  at {pos}: got {a[pos].item():.6g}, expected {e[pos].item():.6g}, "
                     f"|diff| {diff[pos].item():.3g}")
    return CheckResult(False, "\n".join(lines), max_err, n_bad, n, positions)


def run_trials(candidate: Callable, reference: Callable, make_inputs: Callable[[torch.Generator], Iterable],
               trials: int = 5, seed: int = 0, name: str = "output", **tol) -> CheckResult:
    """Call ``candidate`` and ``reference`` on ``trials`` fresh random input sets from
    ``make_inputs(generator)`` (a tuple of positional arguments) and compare the results.

    Stops at the first failing trial and reports it, with the shapes of that trial's inputs.
    """
    gen = torch.Generator().manual_seed(seed)
    last = None
    for t in range(trials):
        args = tuple(make_inputs(gen))
        shapes = ", ".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else repr(a) for a in args)
        try:
            got = candidate(*args)
        except Exception as exc:  # the reader's code raised: say so instead of a traceback wall
            return CheckResult(False, f"✗ trial {t + 1}: your function raised {type(exc).__name__}: {exc}\n"
                                      f"  inputs: {shapes}")
        want = reference(*args)
        got_t = got if isinstance(got, (tuple, list)) else (got,)
        want_t = want if isinstance(want, (tuple, list)) else (want,)
        if len(got_t) != len(want_t):
            return CheckResult(False, f"✗ trial {t + 1}: returned {len(got_t)} values, expected {len(want_t)}")
        for idx, (g, w) in enumerate(zip(got_t, want_t)):
            label = name if len(want_t) == 1 else f"{name}[{idx}]"
            res = compare(g, w, name=label, **tol)
            if not res.ok:
                res.message = f"trial {t + 1} of {trials} (inputs {shapes}):\n{res.message}"
                return res
            last = res
    msg = f"✓ passed {trials} random trials" + (f"; last: {last.message[2:]}" if last else "")
    return CheckResult(True, msg, last.max_abs_err if last else 0.0, 0, last.n_total if last else 0)

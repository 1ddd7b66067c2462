"""Compare a reader's result with the library's and say exactly where they differ."""
from __future__ import annotations

import math
import numbers
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from ..checks import check_count


#: the most trials (or cases) a checker takes: enough for any check, few enough to finish
MAX_TRIALS = 100_000


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


def _as_real_tensor(x, name: str):
    """``x`` as a float64 CPU tensor of values, or a message that says why it cannot be one.

    Accepted: a real (integer or floating) torch.Tensor with values, and a plain int or float
    (for a 0-d answer). Refused, with a message: None, strings, NumPy arrays (say how to convert),
    complex tensors (a complex answer to a real problem is wrong, not half right), bool tensors,
    and tensors without values (the meta device)."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and not isinstance(x, torch.Tensor):
        return torch.tensor(float(x), dtype=torch.float64), None
    if not isinstance(x, torch.Tensor):
        kind = type(x).__module__ + "." + type(x).__name__ if type(x).__module__ == "numpy" else type(x).__name__
        hint = " (convert it with torch.from_numpy)" if type(x).__module__ == "numpy" else ""
        return None, f"✗ {name}: expected a torch.Tensor, got {kind}{hint}"
    if x.is_meta:
        return None, f"✗ {name}: got a tensor on the meta device, which has a shape but no values"
    if x.is_complex():
        return None, f"✗ {name}: got a complex tensor ({str(x.dtype).replace('torch.', '')}); expected real values"
    if x.dtype == torch.bool:
        return None, f"✗ {name}: got a bool tensor; expected numbers"
    try:
        x = x.detach()
        if x.layout != torch.strided:
            x = x.to_dense()
        return x.to("cpu", torch.float64), None
    except Exception as exc:  # noqa: BLE001 - any tensor we cannot read is a wrong answer
        return None, f"✗ {name}: could not read the values of the tensor you returned ({type(exc).__name__}: {exc})"


def compare(actual, expected, atol: float = 1e-5, rtol: float = 1e-5, name: str = "output",
            max_report: int = 5) -> CheckResult:
    """Elementwise comparison in float64: ``|actual - expected| <= atol + rtol * |expected|``,
    and equal infinities are equal.

    ``actual`` is the reader's answer: anything that is not a real tensor (or a plain number for
    a 0-d ``expected``) is reported as wrong, never raised. ``expected`` must be a real tensor or
    number. The message names the shape mismatch, or how many positions differ, the worst ones
    with their indices and values, and whether any are NaN or Inf.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    for tol_name, tol in (("atol", atol), ("rtol", rtol)):
        if isinstance(tol, bool) or not isinstance(tol, numbers.Real):
            raise TypeError(f"{tol_name} must be a non-negative float, got {type(tol).__name__}")
        if not (tol >= 0 and math.isfinite(tol)):
            raise ValueError(f"{tol_name} must be a non-negative finite float, got {tol}")
    max_report = check_count("max_report", max_report)
    if isinstance(expected, torch.Tensor) and (expected.is_meta or expected.is_complex()
                                               or expected.dtype == torch.bool):
        raise ValueError(f"expected must hold real numbers, got a {expected.dtype} tensor on {expected.device}")
    e, problem = _as_real_tensor(expected, "expected")
    if problem:
        raise TypeError(f"expected must be a torch.Tensor or a real number, got {type(expected).__name__}")
    a, problem = _as_real_tensor(actual, name)
    if problem:
        return CheckResult(False, problem)
    if tuple(a.shape) != tuple(e.shape):
        return CheckResult(False, f"✗ {name}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
    n = e.numel()
    diff = (a - e).abs()
    # NaN compares False, so NaN counts as bad; an infinity matching its expected infinity is good
    bad = ~(((diff <= atol + rtol * e.abs()) & torch.isfinite(e)) | (a == e))
    diff = torch.where(a == e, torch.zeros_like(diff), diff)
    n_bad = int(bad.sum())
    finite = torch.isfinite(diff)
    max_err = float(diff[finite].max()) if bool(finite.any()) else (0.0 if n == 0 else float("nan"))
    if bool((bad & ~finite).any()):        # a NaN or a wrong infinity: no finite error says it
        max_err = float("nan")
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


def copy_inputs(args):
    """A deep copy of the tensors in ``args`` (tuples, lists and dicts walked), other values as
    they are: each side of a check gets its own, so neither can change what the other sees."""
    if isinstance(args, torch.Tensor):
        return args.detach().clone()
    if isinstance(args, tuple):
        return tuple(copy_inputs(a) for a in args)
    if isinstance(args, list):
        return [copy_inputs(a) for a in args]
    if isinstance(args, dict):
        return {k: copy_inputs(v) for k, v in args.items()}
    return args


def _changed(before, after, path: str) -> list[str]:
    """Paths of the tensors in ``after`` whose shape or values differ from ``before``."""
    if isinstance(before, torch.Tensor):
        if not isinstance(after, torch.Tensor) or after.shape != before.shape or after.dtype != before.dtype:
            return [path]
        same = (after == before) | (torch.isnan(after) & torch.isnan(before))
        return [] if bool(same.all()) else [path]
    if isinstance(before, (tuple, list)):
        return [p for i, (b, a) in enumerate(zip(before, after)) for p in _changed(b, a, f"{path}[{i}]")]
    if isinstance(before, dict):
        return [p for k in before for p in _changed(before[k], after.get(k), f"{path}[{k!r}]")]
    return []


def changed_inputs(before, after, names=None) -> list[str]:
    """Which of the positional arguments ``after`` (a copy the reader's function received) no
    longer equal ``before``: e.g. ``['argument 1 (q)']``."""
    out = []
    for i, (b, a) in enumerate(zip(before, after)):
        label = f"argument {i + 1}" + (f" ({names[i]})" if names and i < len(names) else "")
        out += [label + p[len("x"):] for p in _changed(b, a, "x")]
    return out


def mutation_note(changed: list[str]) -> str:
    return ("\n  note: your function changed its inputs in place: " + ", ".join(changed) +
            " (the check gave it its own copy, so the reference did not see the change)") if changed else ""


def call_candidate(candidate: Callable, args: tuple, label: str = "your function"):
    """Call the reader's function on its own copy of ``args``.

    Returns ``(result, error, changed)``: ``error`` is a failed CheckResult when it raised
    (never a traceback), ``changed`` lists the inputs it modified in place."""
    mine = copy_inputs(args)
    try:
        got = candidate(*mine)
    except Exception as exc:  # noqa: BLE001 - the reader's code raised: say so instead of a traceback wall
        return None, CheckResult(False, f"✗ {label} raised {type(exc).__name__}: {exc}"), []
    return got, None, changed_inputs(args, mine)


def describe(x) -> str:
    """A short account of a returned value: ``None``, ``a tuple of 3 values``, ``a numpy.ndarray
    of shape (2, 3)``, ``a tensor of shape (4,)``."""
    if x is None:
        return "None"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} values"
    module = type(x).__module__
    kind = type(x).__name__ if module in ("builtins", "torch") else f"{module.split('.')[0]}.{type(x).__name__}"
    shape = getattr(x, "shape", None)
    if isinstance(x, torch.Tensor):
        kind = "tensor"
    return f"a {kind}" + (f" of shape {tuple(shape)}" if shape is not None else "")


def _count_and_shapes(args) -> str:
    return ", ".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else repr(a) for a in args)


def run_trials(candidate: Callable, reference: Callable, make_inputs: Callable[[torch.Generator], Iterable],
               trials: int = 5, seed: int = 0, name: str = "output", **tol) -> CheckResult:
    """Call ``candidate`` and ``reference`` on ``trials`` fresh random input sets from
    ``make_inputs(generator)`` (a tuple of positional arguments) and compare the results.

    Each side gets its own copy of the inputs, so a function that changes its inputs cannot
    change what the reference sees (and a right answer computed in place is accepted, with a
    note). Stops at the first failing trial and reports it, with the shapes of that trial's inputs.
    """
    for fn_name, fn in (("candidate", candidate), ("reference", reference), ("make_inputs", make_inputs)):
        if not callable(fn):
            raise TypeError(f"{fn_name} must be callable, got {type(fn).__name__}")
    trials = check_count("trials", trials, 1, MAX_TRIALS)
    gen = torch.Generator().manual_seed(check_seed(seed))
    last, notes = None, []
    for t in range(trials):
        args = tuple(make_inputs(gen))
        shapes = _count_and_shapes(args)
        got, error, changed = call_candidate(candidate, args)
        if error is not None:
            error.message = f"✗ trial {t + 1}: {error.message[2:]}\n  inputs: {shapes}"
            return error
        want = reference(*copy_inputs(args))
        got_t = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        want_t = want if isinstance(want, (tuple, list)) else (want,)
        if len(got_t) != len(want_t):
            return CheckResult(False, f"✗ trial {t + 1}: returned {describe(got)}, expected "
                                      + ("one tensor" if len(want_t) == 1 and not isinstance(want, (tuple, list))
                                         else f"a tuple of {len(want_t)} values") + mutation_note(changed))
        for idx, (g, w) in enumerate(zip(got_t, want_t)):
            label = name if len(want_t) == 1 else f"{name}[{idx}]"
            res = compare(g, w, name=label, **tol)
            if not res.ok:
                res.message = f"trial {t + 1} of {trials} (inputs {shapes}):\n{res.message}" + mutation_note(changed)
                return res
            last = res
        if changed and not notes:
            notes.append(mutation_note(changed))
    msg = f"✓ passed {trials} random trials" + (f"; last: {last.message[2:]}" if last else "") + "".join(notes)
    return CheckResult(True, msg, last.max_abs_err if last else 0.0, 0, last.n_total if last else 0)


# --- answers that are numbers -----------------------------------------------------------------------

def as_number(value, what: str = "your function"):
    """A reader's scalar answer as a float, or ``(None, message)``: accepted are ints, floats,
    NumPy scalars and one-element real tensors; None, strings, bools, complex numbers and
    vectors are reported, not converted (``float('3')`` would turn a string into a number)."""
    if isinstance(value, torch.Tensor):
        t, problem = _as_real_tensor(value, what)
        if problem:
            return None, problem
        if t.numel() != 1:
            return None, f"✗ {what} returned a tensor of shape {tuple(value.shape)}; expected one number"
        return float(t.reshape(())), None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        shape = getattr(value, "shape", None)
        kind = type(value).__name__ + (f" of shape {tuple(shape)}" if shape is not None else "")
        return None, f"✗ {what} returned {kind} {_short(value)}; expected a number"
    return float(value), None


def as_integer(value, what: str = "your function"):
    """A reader's whole-number answer as an int, or ``(None, message)``: integers, and floats
    (or one-element tensors) whose value is integral. 24576.5 is refused, never rounded."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value), None
    x, problem = as_number(value, what)
    if problem:
        return None, problem
    if not (math.isfinite(x) and x.is_integer()):
        return None, f"✗ {what} returned {x!r}; expected a whole number"
    return int(x), None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_seed(seed) -> int:
    """A seed for ``torch.Generator.manual_seed``: an int in ``[0, 2**63)``."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < 2 ** 63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    return int(seed)


def check_callable(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a function, got {type(fn).__name__}")


def as_numbers(value, count: int, what: str = "your function", integers: bool = False):
    """``count`` numbers from a tuple, list or one-dimensional tensor, or ``(None, message)``."""
    convert = as_integer if integers else as_number
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            return None, f"✗ {what} returned a tensor of shape {tuple(value.shape)}; expected {count} numbers"
        value = list(value.unbind())
    if not isinstance(value, (tuple, list)):
        return None, f"✗ {what} returned {type(value).__name__} {_short(value)}; expected {count} numbers"
    if len(value) != count:
        return None, f"✗ {what} returned {len(value)} values; expected {count}"
    out = []
    for x in value:
        num, problem = convert(x, what)
        if problem:
            return None, problem
        out.append(num)
    return out, None


def call_scalar(fn: Callable, args: tuple, count: int | None = None, integers: bool = False):
    """Call the reader's ``fn(*args)`` for a number (``count=None``) or ``count`` numbers.

    Returns ``(value, None)`` or ``(None, failed CheckResult)`` saying the call raised or
    returned something that is not the number(s) asked for."""
    label = f"fn{args!r}" if len(args) != 1 else f"fn({args[0]!r})"
    got, error, _ = call_candidate(fn, args, label)
    if error is not None:
        return None, error
    if count is None:
        value, problem = (as_integer if integers else as_number)(got, label)
    else:
        value, problem = as_numbers(got, count, label, integers)
    return (None, CheckResult(False, problem)) if problem else (value, None)

"""Chapter 04 exercises: the merge of two softmax states, an online softmax of your own, and
combining many partial states at once. Each ``check_*`` runs the reader's function on random
float64 inputs of odd sizes with large logits and returns a
:class:`~flashtut.exercises.checker.CheckResult` that says which positions differ and by how much.
The ``solution_*`` functions are the worked solutions the chapter reveals."""
from __future__ import annotations

import torch

from ..softmax import merge_softmax_states, safe_softmax
from . import technique as tq
from .checker import CheckResult, check_seed, run_trials

_TOL = {"atol": 1e-12, "rtol": 1e-10}


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (1,), generator=gen))


def _rows(gen: torch.Generator, rows: int, n: int) -> torch.Tensor:
    """Rows of logits a few units apart around per-row offsets of hundreds to thousands (``exp``
    of them overflows even float64 without a max subtracted), some with the maximum in their last
    column."""
    offset = 1000.0 * torch.randn(rows, 1, generator=gen, dtype=torch.float64)
    x = offset + 4.0 * torch.randn(rows, n, generator=gen, dtype=torch.float64)
    late = torch.rand(rows, generator=gen) < 0.5
    x[late, -1] = x[late].amax(dim=-1) + 3.0
    return x


def _state(x: torch.Tensor):
    """The exact state ``(max, sum exp(x - max))`` of each row of ``x``; ``(-inf, 0)`` if empty."""
    if x.shape[-1] == 0:
        shape = x.shape[:-1]
        return (torch.full(shape, float("-inf"), dtype=x.dtype), torch.zeros(shape, dtype=x.dtype))
    m = x.amax(dim=-1)
    return m, torch.exp(x - m[..., None]).sum(dim=-1)


# --- Exercise 4.1: merge two states ------------------------------------------------------------

def _merge_inputs(gen: torch.Generator):
    rows, n = _randint(gen, 3, 12), _randint(gen, 5, 40)
    x = _rows(gen, rows, n)
    cut = _randint(gen, 1, n)                      # both parts non-empty
    m_a, d_a = _state(x[:, :cut])
    m_b, d_b = _state(x[:, cut:])
    # one row's first part is empty: the merge must return the other state unchanged
    m_a[0], d_a[0] = float("-inf"), 0.0
    # and one row is empty on both sides: the merge must return the empty state, not NaN
    m_a[1], d_a[1] = float("-inf"), 0.0
    m_b[1], d_b[1] = float("-inf"), 0.0
    return m_a, d_a, m_b, d_b


def check_merge(merge, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``merge(m_a, d_a, m_b, d_b) -> (m, d)`` against ``flashtut.merge_softmax_states``.

    Each ``(m, d)`` is a row's state (max, sum of ``exp(x - max)``) over a disjoint part of its
    columns; logits sit hundreds of units from zero, and in every trial row 0 of the first state is
    empty, ``(-inf, 0)``, and row 1 is empty in both states (its merge is the empty state)."""
    return run_trials(merge, merge_softmax_states, _merge_inputs, trials=trials, seed=seed,
                      name="(m, d)", **_TOL)


def solution_merge(m_a, d_a, m_b, d_b):
    """Worked solution of exercise 4.1: rescale each sum to the larger maximum, then add."""
    m = torch.maximum(m_a, m_b)
    # an empty state has m = -inf; where both are empty, exp(-inf - (-inf)) would be nan
    finite_m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m, d_a * torch.exp(m_a - finite_m) + d_b * torch.exp(m_b - finite_m)


def _verdict(res: CheckResult, problem: str | None, passed: str) -> CheckResult:
    """The numbers' verdict ``res`` (already passed) followed by the technique's: ``problem``
    (a failure, what was wrong) or, when it is None, the ``passed`` note."""
    if problem is not None:
        return CheckResult(False, tq.wrap(f"{res.message}\n✗ {problem}"))
    res.message += f"; {passed}"
    return res


# --- Exercise 4.2: an online softmax of your own ----------------------------------------------

def _softmax_inputs(gen: torch.Generator):
    return _rows(gen, _randint(gen, 2, 9), _randint(gen, 7, 70)), _randint(gen, 1, 9)


def check_online_softmax(fn, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``fn(x, block_size) -> softmax of each row of x`` (a 2-D float64 tensor, blocks of
    ``block_size`` columns, the last one shorter) against ``flashtut.safe_softmax``; then watch
    one call (``technique.watch``) on rows of 101 columns in blocks of 8: no maximum, sum or
    softmax may cover more than one block of a row's columns (``torch.softmax`` of the whole row
    is right but is not the online softmax), and nothing may leave torch for NumPy."""
    res = run_trials(fn, lambda x, bs: safe_softmax(x), _softmax_inputs, trials=trials, seed=seed,
                     name="softmax", **_TOL)
    if not res:
        return res
    gen = torch.Generator().manual_seed(check_seed(seed) + 1)
    x, bs = _rows(gen, 5, 101), 8
    (xg,), _ = tq.private_copies(x)
    got, trace, err = tq.run_watched(lambda: fn(xg, bs), {"x": xg}, reduce_rows={"x": bs},
                                     outside_limit=x.shape[0] * bs)
    head = f"watched on x {tuple(x.shape)}, block_size {bs}"
    problem = None if err is None else f"{head}: {err}"
    if err is None and (trace.foreign or trace.random):
        what = (f"read a tensor of shape {trace.foreign[0][1]} that it neither made nor was given (a global, a "
                f"cache, the caller's copy)" if trace.foreign else f"drew random numbers (aten.{trace.random[0]})")
        problem = f"{head}: your function {what}; compute the softmax from the x it is given"
    elif err is None and trace.wide_reductions:
        name, op, shape, n = trace.wide_reductions[0]
        problem = (f"{head}: the numbers are right, but a reduction (aten.{op} on a tensor of shape {shape}) "
                   f"covered {n} columns of a row at once. The online softmax reads a row one block of "
                   f"block_size columns at a time: take each block's max and sum of exp, fold them into the "
                   f"running state with the merge of exercise 4.1, then normalise")
    return _verdict(res, problem, f"{head}: every max and sum covers one block")


def solution_online_softmax(x, block_size):
    """Worked solution of exercise 4.2: pass 1 folds each block's state into the running one
    with the merge of exercise 4.1; pass 2 normalises every entry with the final state."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
    d = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        blk = x[..., start:start + block_size]
        m_blk = blk.amax(dim=-1)
        m, d = solution_merge(m, d, m_blk, torch.exp(blk - m_blk[..., None]).sum(dim=-1))
    return torch.exp(x - m[..., None]) / d[..., None]


# --- Exercise 4.3: combine P partial states ----------------------------------------------------

def _combine_reference(m, d):
    m_out, d_out = m[0], d[0]
    for p in range(1, m.shape[0]):
        m_out, d_out = merge_softmax_states(m_out, d_out, m[p], d[p])
    return m_out, d_out


def _combine_inputs(gen: torch.Generator):
    parts, rows = _randint(gen, 2, 9), _randint(gen, 2, 10)
    widths = [_randint(gen, 1, 13) for _ in range(parts)]
    x = _rows(gen, rows, sum(widths))
    states = [_state(chunk) for chunk in torch.split(x, widths, dim=-1)]
    m, d = torch.stack([s[0] for s in states]), torch.stack([s[1] for s in states])
    m[0, 0], d[0, 0] = float("-inf"), 0.0          # a worker that saw none of row 0's columns
    return m, d


def _ops(fn, parts: int, rows: int, gen):
    widths = [3] * parts
    x = _rows(gen, rows, sum(widths))
    states = [_state(chunk) for chunk in torch.split(x, widths, dim=-1)]
    m, d = torch.stack([s[0] for s in states]), torch.stack([s[1] for s in states])
    _, trace, err = tq.run_watched(lambda: fn(m, d), {"m": m, "d": d})
    return (None, err) if err is not None else (trace.n_ops, None)


def check_combine_states(fn, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``fn(m, d) -> (m_total, d_total)``: ``m`` and ``d`` have shape ``(P, rows)``, the
    states of ``P`` workers that each summarised a disjoint slice of every row; the answer is the
    state of the whole row (folding ``merge_softmax_states`` over the ``P`` states). Then the
    technique: the number of torch operators it runs must not grow with ``P`` or with the number
    of rows (no Python loop: the combination is a max and a sum over dim 0), and nothing may leave
    torch for NumPy."""
    res = run_trials(fn, _combine_reference, _combine_inputs, trials=trials, seed=seed,
                     name="(m_total, d_total)", **_TOL)
    if not res:
        return res
    gen = torch.Generator().manual_seed(check_seed(seed) + 1)
    counts = {}
    for parts, rows in ((3, 4), (11, 4), (3, 13)):
        n, err = _ops(fn, parts, rows, gen)
        if err is not None:
            return _verdict(res, f"watched with P = {parts}, {rows} rows: {err}", "")
        counts[parts, rows] = n
    base = counts[3, 4]
    grown = [(parts, rows, n) for (parts, rows), n in counts.items() if n > base]
    problem = None
    if grown:
        parts, rows, n = grown[0]
        loop = "states P" if parts != 3 else "rows"
        problem = " ".join([
            f"the numbers are right, but your function ran {base} torch operators for P = 3 states of 4 rows",
            f"and {n} for P = {parts} of {rows} rows: a Python loop over the {loop}. Combine all states at",
            "once: the maximum over dim 0, then each sum rescaled to it and summed over dim 0"])
    return _verdict(res, problem, f"no Python loop ({base} torch operators whatever P and the rows)")


def solution_combine_states(m, d):
    """Worked solution of exercise 4.3: no loop needed. The global max is the max of the maxima;
    each worker's sum is rescaled to it and the rescaled sums add up. As in exercise 4.1, a row
    that every worker saw empty keeps m = -inf and d = 0 instead of exp(-inf - (-inf)) = nan."""
    m_total = m.amax(dim=0)
    finite = torch.where(torch.isinf(m_total), torch.zeros_like(m_total), m_total)
    return m_total, (d * torch.exp(m - finite)).sum(dim=0)


__all__ = ["check_merge", "check_online_softmax", "check_combine_states",
           "solution_merge", "solution_online_softmax", "solution_combine_states"]

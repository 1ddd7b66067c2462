"""Chapter 10 exercises: merging partial attention states, split-KV attention, and choosing
the number of splits. Each ``check_*`` runs the reader's function and returns a
:class:`~flashtut.exercises.checker.CheckResult` that says what differs and where."""
from __future__ import annotations

import itertools
import math

import torch

from ..decode import merge_attention_states, suggest_num_splits
from ..tiled import tiled_attention
from .checker import CheckResult, call_candidate, call_scalar, check_callable, run_trials


def _random_state(gen: torch.Generator, shape, empty_share: float, offset: float = 0.0):
    """A partial state ``(o, lse)`` of float64 with an lse spread of tens of units around
    ``offset`` (at +-900 an unguarded ``exp(lse)`` overflows even float64, or underflows to 0),
    and some rows empty: ``(0, -inf)``."""
    o = torch.randn(shape, generator=gen, dtype=torch.float64)
    lse = offset + 40.0 * torch.randn(shape[:-1], generator=gen, dtype=torch.float64)
    empty = torch.rand(shape[:-1], generator=gen, dtype=torch.float64) < empty_share
    o[empty] = 0.0
    lse[empty] = float("-inf")
    return o, lse, empty


def _merge_inputs(gen: torch.Generator):
    B, H = (int(x) for x in torch.randint(1, 4, (2,), generator=gen))
    Nq = int(torch.randint(1, 9, (1,), generator=gen))
    D = int(torch.randint(3, 40, (1,), generator=gen))
    # log-sum-exps around +900 or -900: exp(lse) is inf or 0 in float64, so a merge that does not
    # subtract the larger lse first gives inf / inf or 0 / 0
    offset = 900.0 * (1 if bool(torch.rand(1, generator=gen) < 0.5) else -1)
    o_a, lse_a, _ = _random_state(gen, (B, H, Nq, D), 0.25, offset)
    o_b, lse_b, _ = _random_state(gen, (B, H, Nq, D), 0.25, offset)
    # some rows are empty on both sides: their merge is (0, -inf), and an lse of -inf matches
    # only -inf, so an unguarded merge that gives NaN there fails
    return o_a, lse_a, o_b, lse_b


def check_merge(merge, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``merge(o_a, lse_a, o_b, lse_b) -> (o, lse)``, the merge of two partial attention
    states over disjoint keys, against :func:`flashtut.decode.merge_attention_states`.

    Inputs are float64 with log-sum-exps tens of units apart around +900 or -900 (so
    ``exp(lse)`` without the larger one subtracted first overflows or underflows, even in
    float64), and some rows are the empty state ``(0, -inf)`` on one side. A last check merges two empty states: the answer must be
    ``(0, -inf)`` with no NaN.
    """
    res = run_trials(merge, merge_attention_states, _merge_inputs, trials=trials, seed=seed,
                     name="(o, lse)", atol=1e-10, rtol=1e-10)
    if not res:
        if "values differ" in res.message:
            res.message += ("\n  the log-sum-exps sit near +900 or -900, where exp(lse) is inf or 0 even in float64: "
                            "subtract the larger lse first, w_a = exp(lse_a - lse_max), as in the stable softmax")
        return res
    o0 = torch.zeros(1, 2, 3, 8, dtype=torch.float64)
    l0 = torch.full((1, 2, 3), float("-inf"), dtype=torch.float64)
    got, error, _ = call_candidate(merge, (o0, l0, o0, l0), "merging two empty states")
    if error is not None:
        return error
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return CheckResult(False, f"✗ merging two empty states returned {type(got).__name__}; expected (o, lse)")
    for part, want in zip(got, (o0, l0)):
        if not isinstance(part, torch.Tensor) or part.is_meta or part.is_complex() or part.shape != want.shape:
            return CheckResult(False, "✗ merging two empty states: expected real tensors of shapes "
                                      f"{tuple(o0.shape)} and {tuple(l0.shape)}, got {type(part).__name__}"
                                      + (f" of shape {tuple(part.shape)}" if isinstance(part, torch.Tensor) else ""))
    o, lse = (t.detach().to("cpu", torch.float64) for t in got)
    if torch.isnan(o).any() or torch.isnan(lse).any():
        return CheckResult(False, "✗ merging two empty states (o = 0, lse = -inf) gave NaN; "
                                  "guard the weights exp(lse_x - lse) where lse is -inf")
    if not (bool((o == 0).all()) and bool(torch.isneginf(lse).all())):
        return CheckResult(False, "✗ merging two empty states should give o = 0 and lse = -inf, got "
                                  f"max |o| = {o.abs().max().item():.3g}, lse = {lse.flatten()[0].item()}")
    res.message += "; two empty states merge to the empty state"
    return res


def _split_inputs(gen: torch.Generator):
    B, H = (int(x) for x in torch.randint(1, 3, (2,), generator=gen))
    Nq = int(torch.randint(1, 6, (1,), generator=gen))
    Nk = int(torch.randint(5, 120, (1,), generator=gen))
    D = int(torch.randint(4, 33, (1,), generator=gen))
    num_splits = [1, 2, 3, 7, Nk + 3][int(torch.randint(0, 5, (1,), generator=gen))]
    q = 2.0 * torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64)
    k = 2.0 * torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    return q, k, v, num_splits


def check_split_kv(split_attention, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``split_attention(q, k, v, num_splits) -> o`` (not causal, default scale) against
    :func:`flashtut.tiled_attention` on float64 inputs of odd sizes, with ``num_splits`` among
    1, 2, 3, 7 and more than the number of keys."""
    return run_trials(split_attention, lambda q, k, v, s: tiled_attention(q, k, v), _split_inputs,
                      trials=trials, seed=seed, name="o", atol=1e-10, rtol=1e-10)


#: the cases :func:`check_num_splits` tries: (batch, heads, n_queries, n_keys, num_sms)
NUM_SPLITS_CASES = [
    (b, h, nq, nk, sms)
    for b, h, nq, nk, sms in itertools.product((1, 4, 16), (8, 32), (1, 7, 4096),
                                               (100, 2048, 32768), (40, 132))
]


def check_num_splits(choose, cases=None) -> CheckResult:
    """Check ``choose(batch, heads, n_queries, n_keys, num_sms) -> int`` against the rule of
    :func:`flashtut.decode.suggest_num_splits` (``block_m = 64``, at least 256 keys per split)
    on a grid of decoding and prefill cases for a 40-SM GPU (a T4) and a 132-SM one (H200)."""
    check_callable("choose", choose)
    cases = NUM_SPLITS_CASES if cases is None else [tuple(c) for c in cases]
    if not cases:
        raise ValueError("cases must hold at least one (batch, heads, n_queries, n_keys, num_sms) case")
    wrong = []
    for case in cases:
        want = suggest_num_splits(*case)
        got, error = call_scalar(choose, case, integers=True)
        if error is not None:
            return error
        if got != want:
            wrong.append((case, got, want))
    if not wrong:
        return CheckResult(True, f"✓ all {len(cases)} cases give the expected number of splits",
                           0.0, 0, len(cases))
    lines = [f"✗ {len(wrong)} of {len(cases)} cases differ (batch, heads, n_queries, n_keys, num_sms):"]
    for case, got, want in wrong[:5]:
        b, h, nq, nk, sms = case
        blocks = b * h * math.ceil(nq / 64)
        lines.append(f"  {case}: got {got!r}, expected {want} "
                     f"({blocks} blocks without splitting, cap {max(1, nk // 256)} splits)")
    return CheckResult(False, "\n".join(lines), 0.0, len(wrong), len(cases))


__all__ = ["check_merge", "check_split_kv", "check_num_splits", "NUM_SPLITS_CASES"]

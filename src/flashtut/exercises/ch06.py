"""Chapter 06 exercises: the ``Delta = rowsum(dO * O)`` preprocessing, ``dV`` of one key tile
with the probabilities recomputed from the log-sum-exp, and the whole backward from the
formulas. References come from PyTorch autograd through ``flashtut.naive_attention`` in float64,
so a checker never trusts the library's own backward to grade the reader."""
from __future__ import annotations

import math

import torch

from ..reference import attention_lse, causal_mask, naive_attention
from ..checks import check_count
from .checker import (MAX_TRIALS, CheckResult, call_candidate, check_callable, check_seed,
                      compare, mutation_note, run_trials)

_TOL = {"atol": 1e-10, "rtol": 1e-8}


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (1,), generator=gen))


def _qkv_do(gen: torch.Generator):
    """float64 inputs of odd sizes (``Nq != Nk`` mostly); with the default scale the scores have
    a standard deviation of 3, so the softmax is far from uniform."""
    B, H = _randint(gen, 1, 3), _randint(gen, 1, 3)
    Nq, Nk, D = _randint(gen, 5, 40), _randint(gen, 5, 40), _randint(gen, 3, 33)
    f64 = {"generator": gen, "dtype": torch.float64}
    q = 3 ** 0.5 * torch.randn(B, H, Nq, D, **f64)
    k = 3 ** 0.5 * torch.randn(B, H, Nk, D, **f64)
    v = torch.randn(B, H, Nk, D, **f64)
    do = torch.randn(B, H, Nq, D, **f64)
    return q, k, v, do


def autograd_grads(q, k, v, do, causal: bool = False, scale: float | None = None):
    """``(dq, dk, dv)`` of ``naive_attention`` by PyTorch autograd: the reference of this chapter."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = naive_attention(q, k, v, causal=causal, scale=scale)
    return torch.autograd.grad(o, (q, k, v), do)


# --- Exercise 6.1: Delta --------------------------------------------------------------------------

def _delta_inputs(gen: torch.Generator):
    q, k, v, do = _qkv_do(gen)
    return naive_attention(q, k, v), do


def check_delta(fn, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``fn(o, do) -> delta`` of shape ``(B, H, Nq)``, ``delta = rowsum(dO * O)``, on the
    output of a real attention call and a random output gradient (float64)."""
    return run_trials(fn, lambda o, do: (o * do).sum(dim=-1), _delta_inputs, trials=trials, seed=seed,
                      name="delta", **_TOL)


def solution_delta(o, do):
    """Worked solution of exercise 6.1: one multiply and one sum per row, read O and dO once."""
    return (do * o).sum(dim=-1)


# --- Exercise 6.2: dV for one key tile --------------------------------------------------------------

def check_dv_tile(fn, trials: int = 6, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k_tile, do, lse, scale) -> dv_tile``: the gradient of the value rows that
    belong to one key tile (a slice ``k[:, :, k0:k1]`` of the keys, non-causal), given all
    queries, the output gradient and the log-sum-exp of every query row over *all* keys."""
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    trials = check_count("trials", trials, 1, MAX_TRIALS)
    last, note = None, ""
    for t in range(trials):
        q, k, v, do = _qkv_do(gen)
        Nk = k.shape[2]
        k0 = _randint(gen, 0, Nk)
        k1 = _randint(gen, k0 + 1, Nk + 1)
        scale = float(torch.empty(1, dtype=torch.float64).uniform_(0.05, 0.6, generator=gen))
        lse = attention_lse(q, k, scale=scale)
        where = (f"trial {t + 1} of {trials} (q {tuple(q.shape)}, keys {k0}:{k1} of {Nk}, "
                 f"scale {scale:.3g})")
        got, error, changed = call_candidate(fn, (q, k[:, :, k0:k1], do, lse, scale))
        if error is not None:
            return CheckResult(False, f"✗ {where}: {error.message[2:]}")
        want = autograd_grads(q, k, v, do, scale=scale)[2][:, :, k0:k1]
        res = compare(got, want, name="dv_tile", **_TOL)
        if not res:
            res.message = f"{where}:\n{res.message}" + mutation_note(changed)
            return res
        last, note = res, note or mutation_note(changed)
    return CheckResult(True, f"✓ passed {trials} random trials; last: {last.message[2:]}{note}",
                       last.max_abs_err, 0, last.n_total)


def solution_dv_tile(q, k_tile, do, lse, scale):
    """Worked solution of exercise 6.2: recompute the tile's probabilities with the saved
    log-sum-exp, which normalises them over all keys (a softmax over the tile alone would
    normalise over the wrong set), then ``dV_tile = P_tile^T dO``."""
    p = torch.exp(q @ k_tile.transpose(-2, -1) * scale - lse[..., None])
    return p.transpose(-2, -1) @ do


# --- Exercise 6.3: the whole backward from the formulas -------------------------------------------

def _backward_inputs(gen: torch.Generator):
    q, k, v, do = _qkv_do(gen)
    causal = bool(_randint(gen, 0, 2))
    scale = float(torch.empty(1, dtype=torch.float64).uniform_(0.05, 0.6, generator=gen))
    return q, k, v, do, causal, scale


def check_attention_backward(fn, trials: int = 8, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, do, causal, scale) -> (dq, dk, dv)`` against autograd through naive
    attention, float64, causal or not, custom scale, ``Nq != Nk``."""
    return run_trials(fn, autograd_grads, _backward_inputs, trials=trials, seed=seed,
                      name="(dq, dk, dv)", **_TOL)


def solution_attention_backward(q, k, v, do, causal=False, scale=None):
    """Worked solution of exercise 6.3: the five formulas of the chapter on whole matrices."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if causal:
        s = s.masked_fill(causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = p @ v
    dv = p.transpose(-2, -1) @ do
    dp = do @ v.transpose(-2, -1)
    ds = p * (dp - (do * o).sum(dim=-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


__all__ = ["autograd_grads", "check_delta", "solution_delta", "check_dv_tile", "solution_dv_tile",
           "check_attention_backward", "solution_attention_backward"]

"""Chapter 05 exercises: find and fix the bug of a tiled attention loop, and count the HBM
traffic of the FlashAttention-1 loop order with a formula.

``buggy_tiled_attention`` is the "simplified Flash Attention" loop that circulates in blog posts
(and in this book's source documents), rewritten: it keeps a running maximum per query row but
never rescales what it has already summed under an older, smaller maximum. It is right whenever
each row's maximum score sits in the first key block and wrong as soon as a later block raises it.
"""
from __future__ import annotations

import math

import torch

from ..costs import io_complexity as io
from ..checks import accum_dtype, check_block, check_qkv, check_scale
from ..reference import naive_attention
from ..checks import check_count
from .checker import (MAX_TRIALS, CheckResult, call_candidate, call_scalar, check_callable,
                      check_seed, compare, mutation_note)


def buggy_tiled_attention(q, k, v, block_size: int = 128):
    """Tiled attention with the classic bug (non-causal, scale ``1/sqrt(D)``). Do not use it:
    it is here to be found out.

    For each query block it streams the key/value blocks, raises the running max ``m`` and adds
    ``exp(s - m)`` to the running sum and ``exp(s - m) @ v`` to the output, but what was added
    before under a smaller ``m`` is never multiplied by ``exp(m_old - m_new)``.
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    block_size = check_block("block_size", block_size)
    acc_t = accum_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D)
    out = torch.empty_like(q)
    for q0 in range(0, Nq, block_size):
        qi = q[:, :, q0:q0 + block_size].to(acc_t)
        rows = qi.shape[2]
        m = torch.full((B, H, rows), float("-inf"), dtype=acc_t, device=q.device)
        row_sum = torch.zeros((B, H, rows), dtype=acc_t, device=q.device)
        acc = torch.zeros((B, H, rows, D), dtype=acc_t, device=q.device)
        for k0 in range(0, Nk, block_size):
            s = qi @ k[:, :, k0:k0 + block_size].to(acc_t).transpose(-2, -1) * scale
            m = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m[..., None])
            row_sum = row_sum + p.sum(dim=-1)                      # BUG: old sum not rescaled
            acc = acc + p @ v[:, :, k0:k0 + block_size].to(acc_t)  # BUG: old output not rescaled
        out[:, :, q0:q0 + block_size] = (acc / row_sum[..., None]).to(q.dtype)
    return out


def max_rise_after_first_block(q, k, block_size: int = 128, scale: float | None = None) -> torch.Tensor:
    """For each query row, how far its running maximum score rises after the first key block,
    ``(B, H, Nq)``: zero exactly when the row's maximum is already in keys ``0..block_size-1``.
    These are the rows the buggy loop gets wrong."""
    _, _, _, Nk, D = check_qkv(q, k, k)
    block_size = check_block("block_size", block_size)
    acc_t = accum_dtype(q.dtype)
    s = (q.to(acc_t) @ k.to(acc_t).transpose(-2, -1)) * check_scale(scale, D)
    return s.amax(dim=-1) - s[..., :min(block_size, Nk)].amax(dim=-1)


def inputs_max_in_first_block(gen: torch.Generator, B=1, H=2, Nq=37, Nk=53, D=16, block_size=16):
    """float64 ``q, k, v`` whose every score row peaks in the first key block: ``q`` has positive
    entries, the first block's keys large positive ones, the later keys small ones."""
    q = torch.rand(B, H, Nq, D, generator=gen, dtype=torch.float64) + 0.5
    k = 0.2 * torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    nb = min(block_size, Nk)
    k[:, :, :nb] = 1.0 + torch.rand(B, H, nb, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    return q, k, v


def inputs_random(gen: torch.Generator, B=1, H=2, Nq=37, Nk=53, D=16, block_size=16):
    """Plain random float64 ``q, k, v`` (scores of standard deviation about 2): most rows meet
    their maximum in a later key block, some in the first."""
    q = torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64)
    k = 2.0 * torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    return q, k, v


def _wrong_rows(fn, q, k, v, block_size, tol):
    """Run ``fn`` and return (its CheckResult against float64 naive attention, bool (B, H, Nq)
    of rows with any entry out of tolerance), or a failed CheckResult and None if it raised."""
    got, error, changed = call_candidate(fn, (q, k, v, block_size))   # on its own copy
    if error is not None:
        return error, None
    want = naive_attention(q, k, v)
    res = compare(got, want, name="o", **tol)
    res.message += mutation_note(changed)
    if res.ok or res.n_total == 0:          # right, or not a comparable tensor at all
        return res, None
    diff = (got.detach().to("cpu", torch.float64) - want).abs()
    bad = ~(diff <= tol["atol"] + tol["rtol"] * want.abs())
    return res, bad.any(dim=-1)


def check_tiled_attention(fn, block_size: int = 16, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, block_size) -> o`` (non-causal, scale ``1/sqrt(D)``) against float64
    naive attention on two kinds of input of odd sizes (``Nq != Nk``, neither a multiple of the
    block): (A) every row's maximum score in the first key block, (B) plain random inputs, where
    later blocks raise the maximum of most rows but not all. For a wrong answer it says which rows differ and whether they are the
    rows whose maximum rose after the first block."""
    check_callable("fn", fn)
    block_size = check_block("block_size", block_size)
    gen = torch.Generator().manual_seed(check_seed(seed))
    tol = {"atol": 1e-9, "rtol": 1e-9}
    lines, ok = [], True
    sizes = [dict(B=1, H=2, Nq=37, Nk=53, D=16), dict(B=2, H=1, Nq=29, Nk=70, D=24)]
    for case, make in (("A: each row's max in the first key block", inputs_max_in_first_block),
                       ("B: random, most rows' max rises in a later block", inputs_random)):
        for size in sizes:
            q, k, v = make(gen, block_size=block_size, **size)
            rise = max_rise_after_first_block(q, k, block_size)
            res, bad_rows = _wrong_rows(fn, q, k, v, block_size, tol)
            n_rise = int((rise > 0).sum())
            head = (f"case {case}, q {tuple(q.shape)}, k {tuple(k.shape)}, block {block_size}; "
                    f"{n_rise} of {rise.numel()} rows have their max raised by a later block")
            if res:
                lines.append(f"✓ {head}: output matches")
                continue
            ok = False
            lines.append(f"✗ {head}:")
            lines.append("  " + res.message.replace("\n", "\n  "))
            if bad_rows is not None:
                rose = rise > 0
                n_bad, inside = int(bad_rows.sum()), int((bad_rows & rose).sum())
                lines.append(f"  {n_bad} rows are wrong: {inside} of the {n_rise} rows whose max rose after the "
                             f"first block, {n_bad - inside} of the {rise.numel() - n_rise} rows whose max did not")
                if n_bad == inside == n_rise:
                    lines.append("  exactly the rows whose max rose: look at what happens to the running sum "
                                 "and the output accumulator when the max grows")
    return CheckResult(ok, "\n".join(lines))


def solution_fixed_tiled_attention(q, k, v, block_size: int = 128):
    """Worked solution of exercise 5.1: before adding a block, multiply the running sum and the
    output accumulator by ``exp(m_old - m_new)``, which moves them to the new maximum."""
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    acc_t = accum_dtype(q.dtype)
    scale = 1.0 / math.sqrt(D)
    out = torch.empty_like(q)
    for q0 in range(0, Nq, block_size):
        qi = q[:, :, q0:q0 + block_size].to(acc_t)
        rows = qi.shape[2]
        m = torch.full((B, H, rows), float("-inf"), dtype=acc_t, device=q.device)
        row_sum = torch.zeros((B, H, rows), dtype=acc_t, device=q.device)
        acc = torch.zeros((B, H, rows, D), dtype=acc_t, device=q.device)
        for k0 in range(0, Nk, block_size):
            s = qi @ k[:, :, k0:k0 + block_size].to(acc_t).transpose(-2, -1) * scale
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp(m - m_new)          # the fix: exp(-inf) = 0 on the first block
            p = torch.exp(s - m_new[..., None])
            row_sum = alpha * row_sum + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, k0:k0 + block_size].to(acc_t)
            m = m_new
        out[:, :, q0:q0 + block_size] = (acc / row_sum[..., None]).to(q.dtype)
    return out


# --- Exercise 5.2: the FlashAttention-1 traffic as a formula -----------------------------------

def check_fa1_traffic(fn, trials: int = 40, seed: int = 0) -> CheckResult:
    """Check ``fn(n, d, block_m, block_n) -> elements`` (an int: elements read plus written in
    HBM by one head of the FlashAttention-1 loop order, non-causal, ``Nq = Nk = n``, ``O``, ``l``
    and ``m`` initialised in HBM) against the count of ``flashtut.costs.io_complexity``'s schedule,
    on sizes that are and are not multiples of the blocks."""
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    for t in range(check_count("trials", trials, 1, MAX_TRIALS)):
        n = int(torch.randint(1, 700, (1,), generator=gen))
        d = int(torch.randint(1, 129, (1,), generator=gen))
        bm = int(torch.randint(1, 129, (1,), generator=gen))
        bn = bm * int(torch.randint(1, 4, (1,), generator=gen)) if t % 2 else int(torch.randint(1, 200, (1,), generator=gen))
        if t % 3 == 0:
            n = bn * int(torch.randint(1, 8, (1,), generator=gen))       # a multiple of block_n
        want = io.count(io.flash1_schedule(n, n, d, bm, bn)).elements
        got, error = call_scalar(fn, (n, d, bm, bn), integers=True)
        if error is not None:
            return error
        if got != want:
            return CheckResult(False, f"✗ trial {t + 1}: fn(n={n}, d={d}, block_m={bm}, block_n={bn}) = {got}, "
                                      f"the schedule moves {want} elements (difference {want - got:+})")
    return CheckResult(True, f"✓ your formula matches the counted schedule on {trials} random sizes")


def solution_fa1_traffic(n, d, block_m, block_n):
    """Worked solution of exercise 5.2. Initialising ``O, l, m`` writes ``n d + 2 n``; ``K`` and
    ``V`` are read once, ``2 n d``; for each of the ``ceil(n / block_n)`` key blocks the inner loop
    reads all of ``Q, O, l, m`` (``2 n d + 2 n``) and writes back ``O, l, m`` (``n d + 2 n``).
    ``block_m`` drops out: the inner loop covers all ``n`` query rows whatever its tiles."""
    t_c = -(-n // block_n)
    return n * d + 2 * n + 2 * n * d + t_c * (3 * n * d + 4 * n)


__all__ = ["buggy_tiled_attention", "max_rise_after_first_block", "inputs_max_in_first_block",
           "inputs_random", "check_tiled_attention", "solution_fixed_tiled_attention",
           "check_fa1_traffic", "solution_fa1_traffic"]

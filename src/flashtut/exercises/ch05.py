"""Chapter 05 exercises: find and fix the bug of a tiled attention loop, and count the HBM
traffic of the FlashAttention-1 loop order with a formula.

``buggy_tiled_attention`` is the "simplified Flash Attention" loop that circulates in blog posts
(and in this book's source documents), rewritten: it keeps a running maximum per query row but
never rescales what it has already summed under an older, smaller maximum. It is right whenever
each row's maximum score sits in the first key block and wrong as soon as a later block raises it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..costs import io_complexity as io
from ..checks import accum_dtype, check_block, check_qkv, check_scale
from ..reference import attention_lse, naive_attention
from ..checks import check_count
from . import technique as tq
from .checker import (MAX_TRIALS, CheckResult, call_candidate, call_scalar, check_callable, describe,
                      check_seed, compare, mutation_note)


def buggy_loop(q, k, v, block_size=128):
    """The "simplified Flash Attention" loop of the errata, in plain tensors (non-causal,
    scale ``1/sqrt(D)``). It passes some tests and fails others: find out which, and why."""
    B, H, Nq, D = q.shape
    scale = 1.0 / math.sqrt(D)
    out = torch.empty_like(q)
    for q0 in range(0, Nq, block_size):
        qi = q[:, :, q0:q0 + block_size]
        m = torch.full(qi.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
        row_sum = torch.zeros_like(m)
        acc = torch.zeros_like(qi)
        for k0 in range(0, k.shape[2], block_size):
            s = qi @ k[:, :, k0:k0 + block_size].transpose(-2, -1) * scale
            m = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m[..., None])
            row_sum = row_sum + p.sum(dim=-1)
            acc = acc + p @ v[:, :, k0:k0 + block_size]
        out[:, :, q0:q0 + block_size] = acc / row_sum[..., None]
    return out


def buggy_tiled_attention(q, k, v, block_size: int = 128):
    """``buggy_loop`` behind the library's input checks, on any float dtype (it computes in the
    accumulation dtype). Do not use it: it never multiplies the running sum and the output
    accumulated under an older, smaller maximum by ``exp(m_old - m_new)``."""
    check_qkv(q, k, v)
    block_size = check_block("block_size", block_size)
    acc_t = accum_dtype(q.dtype)
    return buggy_loop(q.to(acc_t), k.to(acc_t), v.to(acc_t), block_size).to(q.dtype)


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


def _wrong_rows(got, want, tol):
    """Compare ``got`` with ``want``: (CheckResult, bool (B, H, Nq) of rows with any entry out of
    tolerance, or None when the answer is right or not a comparable tensor)."""
    res = compare(got, want, name="o", **tol)
    if res.ok or res.n_total == 0:          # right, or not a comparable tensor at all
        return res, None
    diff = (got.detach().to("cpu", torch.float64) - want).abs()
    bad = ~(diff <= tol["atol"] + tol["rtol"] * want.abs())
    return res, bad.any(dim=-1)


def check_tiled_attention(fn, block_size: int = 16, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, block_size) -> o`` (non-causal, scale ``1/sqrt(D)``) against float64
    naive attention on two kinds of input of odd sizes (``Nq != Nk``, neither a multiple of the
    block, D of 16 and 128): (A) every row's maximum score in the first key block, (B) plain
    random inputs, where later blocks raise the maximum of most rows but not all. For a wrong
    answer it says which rows differ and whether they are the rows whose maximum rose after the
    first block. The loop is watched too (``technique.watch``): q, k and v read one block of
    ``block_size`` rows at a time and scores made one tile at a time, so naive attention, right
    as its numbers are, is not the tiled loop this exercise fixes."""
    check_callable("fn", fn)
    block_size = check_block("block_size", block_size)
    gen = torch.Generator().manual_seed(check_seed(seed))
    tol = {"atol": 1e-9, "rtol": 1e-9}
    lines, ok = [], True
    sizes = [dict(B=1, H=2, Nq=37, Nk=53, D=16), dict(B=2, H=1, Nq=29, Nk=70, D=128)]
    for case, make in (("A: each row's max in the first key block", inputs_max_in_first_block),
                       ("B: random, most rows' max rises in a later block", inputs_random)):
        for size in sizes:
            q, k, v = make(gen, block_size=block_size, **size)
            rise = max_rise_after_first_block(q, k, block_size)
            n_rise = int((rise > 0).sum())
            head = (f"case {case}, q {tuple(q.shape)}, k {tuple(k.shape)}, block {block_size}; "
                    f"{n_rise} of {rise.numel()} rows have their max raised by a later block")
            (qg, kg, vg), kept = tq.private_copies(q, k, v)
            limits = forward_limits(size["B"], size["H"], size["Nq"], size["Nk"], size["D"],
                                    block_size, block_size)
            got, trace, err = watch_case(lambda: fn(qg, kg, vg, block_size), dict(q=qg, k=kg, v=vg),
                                         limits, False)
            if err is not None:
                ok = False
                lines.append(f"✗ {head}: {err}")
                continue
            res, bad_rows = _wrong_rows(got, naive_attention(q, k, v), tol)
            res.message += mutation_note(tq.mutated("qkv", (qg, kg, vg), kept))
            problems = technique_report(trace, limits)
            if res and not problems:
                lines.append(f"✓ {head}: output matches, read block by block")
                continue
            ok = False
            lines.append(f"✗ {head}:")
            if res:
                lines.append("  the output matches, but this is not the tiled loop:")
            else:
                lines.append("  " + res.message.replace("\n", "\n  "))
            if bad_rows is not None:
                rose = rise > 0
                n_bad, inside = int(bad_rows.sum()), int((bad_rows & rose).sum())
                lines.append(f"  {n_bad} rows are wrong: {inside} of the {n_rise} rows whose max rose after the "
                             f"first block, {n_bad - inside} of the {rise.numel() - n_rise} rows whose max did not")
                if n_bad == inside == n_rise:
                    lines.append("  exactly the rows whose max rose: look at what happens to the running sum "
                                 "and the output accumulator when the max grows")
            lines += ["  " + p for p in problems]
    return CheckResult(ok, tq.wrap("\n".join(lines)))


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




# --- Exercise 5.3 (headline): the tiled forward with log-sum-exp and causal block skipping -------

def solution_flash_forward(q, k, v, causal=False, block_m=64, block_n=64):
    """Chapter 5's tiled forward (and the worked solution of exercise 5.3), in plain
    tensors: returns ``(o, lse)``, scale ``1/sqrt(D)``, top-left causal mask.
    ``flashtut.tiled_attention`` is this loop plus input checks, any scale,
    grouped-query heads, bottom-right alignment and windows (chapter 12) and an
    overflow check."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=acc_t, device=q.device)
    for q0 in range(0, Nq, block_m):
        q1 = min(q0 + block_m, Nq)
        qi = q[:, :, q0:q1].to(acc_t) * D ** -0.5
        m = torch.full(qi.shape[:3], float("-inf"), dtype=acc_t, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qi)
        # causal: key blocks from q1 on are hidden from every row of this block
        k_end = min(q1, Nk) if causal else Nk
        for k0 in range(0, k_end, block_n):
            k1 = min(k0 + block_n, Nk)
            s = qi @ k[:, :, k0:k1].to(acc_t).transpose(-2, -1)
            if causal:
                rows = torch.arange(q0, q1, device=q.device)[:, None]
                cols = torch.arange(k0, k1, device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, k0:k1].to(acc_t)
            m = m_new
        o[:, :, q0:q1] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, q0:q1] = m + torch.log(l)
    return o, lse


@dataclass
class Limits:
    """What one watched case allows: ``rows[name]`` rows of an input per tensor, score tensors of
    ``bm`` query by ``bn`` key rows, no tensor over ``largest`` elements, ``live`` elements alive
    at once, and with causal masking only the pairs of ``allowed`` above the diagonal."""
    rows: dict
    bm: int
    bn: int
    largest: int
    live: int
    scores: int
    allowed: torch.Tensor | None = None
    what: str = "score tile"


#: score tiles a tiled loop may keep alive at once (a tile, its masked copy, P, a temporary)
SCORE_TILES = 5


def forward_limits(B, H, Nq, Nk, D, bm, bn, causal=False):
    """Limits of a tiled forward: one block of rows per read; no tensor larger than a score tile
    or the output; alive at once: the output, its log-sum-exp and, per query block, a few tiles
    and blocks, ``O(bm*bn + (bm + bn)*D)``, never a whole ``Nk x D`` copy of the keys."""
    bh = B * H
    return Limits(rows={"q": bm, "k": bn, "v": bn}, bm=bm, bn=bn,
                  largest=bh * max(bm * bn, Nq * D),
                  live=bh * (3 * Nq * D + 4 * Nq + 8 * bm * bn + 8 * (bm + bn) * D),
                  scores=bh * SCORE_TILES * bm * bn,
                  allowed=tq.causal_allowed(Nq, Nk, bm, bn) if causal else None)


def _pair(got):
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return None, f"expected (o, lse), got {describe(got)}"
    return got, None


def _example(mask: torch.Tensor) -> tuple:
    i, j = (int(x) for x in mask.nonzero()[0])
    return i, j


def technique_report(trace, limits: Limits):
    """Messages for what a ``technique.watch`` trace shows wrong (empty when nothing is)."""
    problems = []
    if trace.whole_reads:
        name, op, shape, n = trace.whole_reads[0]
        problems.append(f"read or held {n} rows of {name} at once, in one tensor of shape {shape} (aten.{op}); "
                        f"load one block of at most {limits.rows[name]} rows at a time, as a kernel loads a "
                        f"tile into SRAM (a copy, cat or clone of more rows counts as reading them all)")
    if trace.wide_scores:
        side, op, shape, n = trace.wide_scores[0]
        if side == "k":
            problems.append(f"made scores against {n} key rows in one tensor of shape {shape} (aten.{op}): "
                            f"a whole row of the score matrix. Compute one {limits.bm} x {limits.bn} tile "
                            f"at a time and fold it into the running max and sum (the online softmax)")
        else:
            problems.append(f"made scores of {n} query rows in one tensor of shape {shape} (aten.{op}): "
                            f"a whole column of the score matrix. Compute one {limits.bm} x {limits.bn} "
                            f"tile at a time")
    if trace.largest[0] > limits.largest:
        n, op, shape = trace.largest
        problems.append(f"made a tensor of shape {shape} ({n:,} elements, aten.{op}); the largest "
                        f"allowed is {limits.largest:,}: one {limits.what} or one whole output. An Nq x Nk "
                        f"matrix, or a whole row or column of tiles, is what tiling avoids")
    elif trace.peak_scores > limits.scores:
        tiles = trace.peak_scores / limits.bm / limits.bn
        problems.append(f"kept {trace.peak_scores:,} scores alive at once ({tiles:.0f} "
                        f"tiles of {limits.bm} x {limits.bn}); a tiled loop needs a few tiles at a time: fold "
                        f"each tile into the running max, sum and output, then drop it")
    elif trace.peak_live > limits.live:
        problems.append(f"kept {trace.peak_live:,} elements alive at once (the budget is {limits.live:,}: "
                        f"the outputs and a few tiles): do not keep every tile or a copy of the inputs; "
                        f"fold each tile into running statistics and drop it")
    if trace.foreign:
        op, shape = trace.foreign[0]
        how = "returned" if op == "returned" else f"read (aten.{op})"
        problems.append(f"{how} a tensor of shape {shape} that it neither made nor was given: a global, a "
                        f"cache kept from an earlier call or a copy made elsewhere. Compute everything from "
                        f"the arguments, in this call")
    if trace.random:
        problems.append(f"drew random numbers (aten.{trace.random[0]}): attention is deterministic; "
                        f"regenerating the checker's inputs is not reading them")
    if trace.input_writes:
        name, op = trace.input_writes[0]
        problems.append(f"wrote into its input {name} (aten.{op}); work on copies of the blocks")
    if trace.hidden is not None and limits.allowed is not None:
        extra = trace.hidden & ~limits.allowed
        if bool(extra.any()):
            i, j = _example(extra)
            problems.append(f"computed {int(extra.sum()):,} scores above the causal diagonal outside the "
                            f"diagonal tiles (e.g. query row {i} with key row {j}): every one of those keys "
                            f"is hidden from its row, so the work contributes nothing; skip those tiles "
                            f"(stop the key loop at the query block's last row)")
    return problems


def add_verdict(lines: list, head: str, problems: list, passed: str) -> bool:
    """Append one case's verdict to ``lines``; return whether it passed."""
    if problems:
        lines.append(f"✗ {head}:")
        lines += ["  " + p.replace("\n", "\n  ") for p in problems]
        return False
    lines.append(f"✓ {head}: {passed}")
    return True


def watch_case(call, inputs: dict, limits: Limits, causal: bool):
    """Run ``call()`` under ``technique.watch`` with ``limits``: ``(result, trace, error)``."""
    return tq.run_watched(call, inputs, causal=causal, block_rows=limits.rows,
                          pair_rows=(limits.bm, limits.bn), blocks=(limits.bm, limits.bn))


def _fp16_inputs(gen):
    """Long float16 rows (3000 keys, near-uniform scores, values around 1): the running sum
    reaches thousands, where float16's spacing is 2 to 4, so a float16 accumulator drifts."""
    B, H, Nq, Nk, D = 1, 2, 37, 3000, 16
    q = (0.3 * torch.randn(B, H, Nq, D, generator=gen)).half()
    k = torch.randn(B, H, Nk, D, generator=gen).half()
    v = (1 + 0.5 * torch.randn(B, H, Nk, D, generator=gen)).half()
    return q, k, v


#: the tiles of the float16 case (one query block of 37 rows, 47 key blocks)
FP16_BLOCKS = (64, 64)

#: the float64 cases of :func:`check_flash_forward`: (B, H, Nq, Nk, D, block_m, block_n), causal
FORWARD_CASES = (((1, 2, 45, 173, 128, 16, 16), False), ((2, 1, 83, 70, 24, 16, 16), True),
                 ((1, 1, 37, 61, 8, 8, 16), True))


def check_flash_forward(fn, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, causal, block_m, block_n) -> (o, lse)`` (scale ``1/sqrt(D)``): the
    numbers, in float64 against naive attention, causal or not, ``Nq != Nk``, sizes no block
    divides, D up to 128; the technique, by watching every operator it runs
    (``technique.watch``): blocks read one at a time (a copy of more rows, by ``cat``,
    ``clone``, indexing or ``.to``, counts as a read of them all), scores made one tile at a
    time (never a whole row), each key block loaded once per query block (one pass), few tensors
    alive at once, with ``causal`` no tile above the diagonal computed, inputs left unchanged,
    nothing taken out to NumPy, nothing read from outside its arguments (globals, caches), no
    random numbers; and float16 rows long enough that a float16 accumulator fails, watched the
    same way."""
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    lines, ok = [], True
    f64 = {"generator": gen, "dtype": torch.float64}
    for (B, H, Nq, Nk, D, bm, bn), causal in FORWARD_CASES:
        q = 2 * torch.randn(B, H, Nq, D, **f64) * D ** -0.25
        k = torch.randn(B, H, Nk, D, **f64) * torch.linspace(0.5, 2.5, Nk, dtype=torch.float64)[:, None] * D ** -0.25
        v = torch.randn(B, H, Nk, D, **f64)
        (qg, kg, vg), kept = tq.private_copies(q, k, v)
        head = f"causal={causal}, q {tuple(q.shape)}, k {tuple(k.shape)}, blocks {bm}x{bn}"
        limits = forward_limits(B, H, Nq, Nk, D, bm, bn, causal)
        got, trace, err = watch_case(lambda: fn(qg, kg, vg, causal, bm, bn), dict(q=qg, k=kg, v=vg),
                                     limits, causal)
        if err is None:
            got, err = _pair(got)
        if err:
            lines.append(f"✗ {head}: {err}")
            ok = False
            continue
        problems = []
        for name, res in (("o", compare(got[0], naive_attention(q, k, v, causal=causal), name="o",
                                        atol=1e-9, rtol=1e-9)),
                          ("lse", compare(got[1], attention_lse(q, k, causal=causal), name="lse", atol=1e-9, rtol=1e-9))):
            if not res:
                problems.append(res.message)
        changed = tq.mutated("qkv", (qg, kg, vg), kept)
        if changed:
            problems.append(f"changed its input {', '.join(changed)}: a kernel reads q, k and v and "
                            f"writes only o and lse")
        problems += technique_report(trace, limits)
        once = io.count(io.flash2_schedule(Nq, Nk, D, bm, bn, causal)).reads
        for name, key in (("k", "K"), ("v", "V")):
            n_read, n_once = trace.read_elements(name), B * H * once[key]
            if n_read < n_once and not trace.stopped and not trace.foreign:
                problems.append(f"read only {n_read:,} elements of {name}; each key block a query block "
                                f"sees must be loaded once, {n_once:,} in all: the output cannot come from "
                                f"the {name} it was given")
            if n_read > n_once:
                why = ("the key blocks after a query block's last row are hidden from all of it: "
                       "stop the inner loop before them" if trace.masked_products else
                       "each block should be loaded once per query block: one pass, the online "
                       "softmax, not one pass for the max and another for the sum")
                problems.append(f"read {n_read:,} elements of {name}; loading each visible key block "
                                f"once per query block reads {n_once:,}: {why}")
        ok &= add_verdict(lines, head, problems, "o and lse match, read block by block, no Nq x Nk "
                          "tensor" + (", masked tiles skipped" if causal else ", one pass"))
    if not ok:
        lines.append("(the float16 case runs once the float64 cases pass)")
        return CheckResult(False, tq.wrap("\n".join(lines)))
    q, k, v = _fp16_inputs(gen)
    (qg, kg, vg), kept = tq.private_copies(q, k, v)
    bm, bn = FP16_BLOCKS
    limits = forward_limits(*q.shape[:3], k.shape[2], q.shape[3], bm, bn)
    got, trace, err = watch_case(lambda: fn(qg, kg, vg, False, bm, bn), dict(q=qg, k=kg, v=vg), limits, False)
    if err is None:
        got, err = _pair(got)
    head = f"float16, q {tuple(q.shape)}, k {tuple(k.shape)}, blocks {bm}x{bn}"
    problems = [] if err else technique_report(trace, limits)
    if err:
        ok = False
        lines.append(f"✗ {head}: {err}")
    elif problems:
        ok = add_verdict(lines, head, problems, "")
    else:
        exact = naive_attention(q.double(), k.double(), v.double())
        p16 = torch.softmax((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5, dim=-1) @ v
        bound = 2 * float((p16.double() - exact).abs().max())
        res = compare(got[0], exact, name="o", atol=bound, rtol=0.0)
        if res:
            lines.append(f"✓ {head}: max error {res.max_abs_err:.1e}, within twice PyTorch's own "
                         f"float16 error ({bound:.1e})")
        elif res.n_total == 0:
            ok = False
            lines.append(f"✗ {head}: {res.message[2:]}")
        else:
            ok = False
            lines.append(f"✗ {head}: max error {res.max_abs_err:.1e} against float64, more than twice "
                         f"PyTorch's own float16 error ({bound:.1e}); the running sum reaches about "
                         f"3000, where float16 cannot add 1: keep m, l and the accumulator in float32")
    return CheckResult(ok, tq.wrap("\n".join(lines)))


__all__ = ["buggy_loop", "buggy_tiled_attention", "max_rise_after_first_block", "inputs_max_in_first_block",
           "solution_flash_forward", "check_flash_forward", "technique_report", "add_verdict",
           "Limits", "forward_limits", "watch_case", "FORWARD_CASES",
           "inputs_random", "check_tiled_attention", "solution_fixed_tiled_attention",
           "check_fa1_traffic", "solution_fa1_traffic"]

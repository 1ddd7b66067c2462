"""Chapter 06 exercises: the ``Delta = rowsum(dO * O)`` preprocessing, ``dV`` of one key tile
with the probabilities recomputed from the log-sum-exp, and the whole backward from the
formulas. References come from PyTorch autograd through ``flashtut.naive_attention`` in float64,
so a checker never trusts the library's own backward to grade the reader."""
from __future__ import annotations

import math

import torch

from ..reference import attention_lse, causal_mask, naive_attention
from ..checks import check_count
from . import technique as tq
from .ch05 import (FORWARD_CASES, Limits, add_verdict, solution_flash_forward, technique_report,
                   watch_case)
from .checker import (MAX_TRIALS, CheckResult, call_candidate, check_callable, check_seed, describe,
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
    """Worked solution of exercise 6.2: recompute the tile's probabilities with the
    saved log-sum-exp, which normalises them over all keys (a softmax over the tile
    alone would normalise over the wrong set), then ``dV_tile = P_tile^T dO``."""
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


# --- Exercise 6.4 (headline): the tiled backward --------------------------------------------------

def solution_flash_backward(q, k, v, o, lse, do, causal=False, block_m=64, block_n=64):
    """Chapter 6's tiled backward (and the worked solution of exercise 6.4), in plain
    tensors: ``(dq, dk, dv)``, scale ``1/sqrt(D)``, top-left causal mask.
    ``flashtut.tiled_attention_backward`` is this loop plus input checks, any scale,
    grouped-query heads, bottom-right alignment and windows (chapter 12) and an
    overflow check."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = D ** -0.5
    delta = (do.to(acc_t) * o.to(acc_t)).sum(dim=-1)       # one number per query row
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for k0 in range(0, Nk, block_n):                       # dK_j, dV_j stay on chip
        k1 = min(k0 + block_n, Nk)
        kj, vj = k[:, :, k0:k1].to(acc_t), v[:, :, k0:k1].to(acc_t)
        dk_j, dv_j = torch.zeros_like(kj), torch.zeros_like(vj)
        # earlier query blocks see none of it
        first = (k0 // block_m) * block_m if causal else 0
        for q0 in range(first, Nq, block_m):
            q1 = min(q0 + block_m, Nq)
            qi, doi = q[:, :, q0:q1].to(acc_t), do[:, :, q0:q1].to(acc_t)
            s = qi @ kj.transpose(-2, -1) * scale
            if causal:
                rows = torch.arange(q0, q1, device=q.device)[:, None]
                cols = torch.arange(k0, k1, device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            p = torch.exp(s - lse[:, :, q0:q1, None])  # recomputed, already normalised
            dv_j += p.transpose(-2, -1) @ doi
            ds = p * (doi @ vj.transpose(-2, -1) - delta[:, :, q0:q1, None])
            dq[:, :, q0:q1] += ds @ kj * scale
            dk_j += ds.transpose(-2, -1) @ qi * scale
        dk[:, :, k0:k1], dv[:, :, k0:k1] = dk_j.to(k.dtype), dv_j.to(v.dtype)
    return dq.to(q.dtype), dk, dv


def backward_limits(B, H, Nq, Nk, D, bm, bn, causal=False):
    """Limits of a tiled backward: ``q``, ``k``, ``v`` read a block at a time (``o``, ``do``
    and ``lse`` may be read whole, for Delta); scores one tile at a time; no tensor larger than
    a tile or a whole gradient; alive at once: the gradients, Delta and a handful of tiles."""
    bh = B * H
    return Limits(rows={"q": bm, "k": bn, "v": bn}, bm=bm, bn=bn,
                  largest=bh * max(bm * bn, Nq * D, Nk * D),
                  live=bh * (3 * (Nq + Nk) * D + 4 * Nq + 12 * bm * bn + 8 * (bm + bn) * D),
                  scores=bh * BACKWARD_SCORE_TILES * bm * bn,
                  allowed=tq.causal_allowed(Nq, Nk, bm, bn) if causal else None, what="tile")


#: score-sized tiles a tiled backward may keep alive at once (S, P, dP, dS and temporaries)
BACKWARD_SCORE_TILES = 8


def _f64_inputs(gen, B, H, Nq, Nk, D):
    f64 = {"generator": gen, "dtype": torch.float64}
    q = 2 * torch.randn(B, H, Nq, D, **f64) * D ** -0.25
    k = torch.randn(B, H, Nk, D, **f64) * D ** -0.25
    v, do = torch.randn(B, H, Nk, D, **f64), torch.randn(B, H, Nq, D, **f64)
    return q, k, v, do


def _grads_report(got, want, tol=None):
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        return [f"expected (dq, dk, dv), got {describe(got)}"]
    out = []
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        res = compare(g, w, name=name, **(tol or _TOL))
        if not res:
            out.append(res.message)
    return out


def backward_technique(trace, limits, names=("lse", "o")) -> list:
    """What a watched backward did wrong beyond ``technique_report``: recomputing the softmax
    instead of using lse, not using Delta."""
    problems = technique_report(trace, limits)
    if trace.key_reductions:
        op, shape = trace.key_reductions[0]
        problems.append(f"reduced scores over key rows (aten.{op} on a tensor of shape {shape}): a softmax, "
                        f"row max or row sum over keys again. The backward needs none: P = exp(S * scale - "
                        f"lse) is already normalised by the forward's log-sum-exp, and Delta = rowsum(dO * O) "
                        f"replaces the sum over keys in dS = P * (dP - Delta)")
    if "lse" in names and not trace.reads.get("lse") and not trace.stopped:
        problems.append("never used lse: recompute each tile's probabilities as exp(S * scale - lse), with "
                        "the log-sum-exp the forward saved")
    if "o" in names and not trace.reads.get("o") and not trace.stopped:
        problems.append("never read o: Delta = rowsum(dO * O), one number per query row, is what dS = P * "
                        "(dP - Delta) needs")
    return problems


def _reads_everything(trace, per_row: int, q_rows: int, k_rows: int) -> list:
    """A backward must read every query row and every key row some query sees at least once:
    fewer reads mean the gradients came from somewhere the watch does not see."""
    if trace.stopped or trace.foreign:
        return []
    problems = []
    for name, rows in (("q", q_rows), ("k", k_rows), ("v", k_rows)):
        if trace.read_elements(name) < per_row * rows:
            problems.append(f"read only {trace.read_elements(name):,} elements of {name}; the {rows} rows that "
                            f"take part need {per_row * rows:,}: the gradients cannot come from the {name} "
                            f"it was given")
    return problems


def _fp16_backward_inputs(gen):
    """float16 inputs with many query rows (700) over few keys: each dK and dV row sums 700
    terms, so a float16 accumulator drifts while float32 stays within float16 rounding."""
    B, H, Nq, Nk, D = 1, 2, 700, 45, 16
    q = (0.3 * torch.randn(B, H, Nq, D, generator=gen)).half()
    k = torch.randn(B, H, Nk, D, generator=gen).half()
    v = torch.randn(B, H, Nk, D, generator=gen).half()
    do = (1 + 0.5 * torch.randn(B, H, Nq, D, generator=gen)).half()
    return q, k, v, do


def _fp16_backward_case(fn, gen, lines) -> bool:
    q, k, v, do = _fp16_backward_inputs(gen)
    Q, K, V, DO = (t.double() for t in (q, k, v, do))
    o, lse = naive_attention(Q, K, V).half(), attention_lse(Q, K).float()
    bm, bn = 64, 32
    head = f"float16, q {tuple(q.shape)}, k {tuple(k.shape)}, blocks {bm}x{bn}"
    names = ("q", "k", "v", "o", "lse", "do")
    given, _ = tq.private_copies(q, k, v, o, lse, do)
    limits = backward_limits(*q.shape[:3], k.shape[2], q.shape[3], bm, bn)
    got, trace, error = watch_case(lambda: fn(*given, False, bm, bn), dict(zip(names, given)), limits, False)
    if error is not None:
        lines.append(f"✗ {head}: {error}")
        return False
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        lines.append(f"✗ {head}: expected (dq, dk, dv), got {describe(got)}")
        return False
    problems = backward_technique(trace, limits)
    if problems:
        return add_verdict(lines, head, problems, "")
    want = autograd_grads(Q, K, V, DO)
    torch16 = autograd_grads(q, k, v, do)
    bad = []
    for name, g, w, t in zip(("dq", "dk", "dv"), got, want, torch16):
        bound = 2 * float((t.double() - w).abs().max())
        res = compare(g, w, name=name, atol=bound, rtol=0.0)
        if not res:
            bad.append(res.message if res.n_total == 0 else
                       f"{name}: max error {res.max_abs_err:.1e} against float64, more than twice PyTorch's "
                       f"own float16 error ({bound:.1e})")
    if bad:
        lines.append(f"✗ {head}:")
        lines += ["  " + b for b in bad]
        lines.append("  each dK and dV row sums 700 query rows: accumulate dq, dk and dv (and compute "
                     "P, dP, dS) in float32, and cast to float16 only at the end")
        return False
    lines.append(f"✓ {head}: dq, dk, dv within twice PyTorch's own float16 error")
    return True


def check_flash_backward(fn, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, o, lse, do, causal, block_m, block_n) -> (dq, dk, dv)`` (scale
    ``1/sqrt(D)``) against autograd through naive attention in float64, causal or not,
    ``Nq != Nk``, sizes no block divides, D up to 128; its technique, by watching every
    operator it runs: ``q``, ``k``, ``v`` read a block at a time (copies count), scores made one
    tile at a time, the probabilities recomputed from ``lse`` (no softmax, row max or row sum
    over keys) and Delta from ``o``, with ``causal`` no tile above the diagonal computed, no
    input changed, nothing taken out to NumPy; and a float16 case long enough that float16
    accumulation fails."""
    check_callable("fn", fn)
    gen = torch.Generator().manual_seed(check_seed(seed))
    lines, ok = [], True
    for (B, H, Nq, Nk, D, bm, bn), causal in FORWARD_CASES:
        q, k, v, do = _f64_inputs(gen, B, H, Nq, Nk, D)
        o = naive_attention(q, k, v, causal=causal)
        lse = attention_lse(q, k, causal=causal)
        names = ("q", "k", "v", "o", "lse", "do")
        given, kept = tq.private_copies(q, k, v, o, lse, do)
        limits = backward_limits(B, H, Nq, Nk, D, bm, bn, causal)
        head = f"causal={causal}, q {tuple(q.shape)}, k {tuple(k.shape)}, blocks {bm}x{bn}"
        got, trace, err = watch_case(lambda: fn(*given, causal, bm, bn), dict(zip(names, given)),
                                     limits, causal)
        if err is not None:
            lines.append(f"✗ {head}: {err}")
            ok = False
            continue
        problems = _grads_report(got, autograd_grads(q, k, v, do, causal=causal))
        changed = tq.mutated(names, given, kept)
        if changed:
            problems.append(f"changed its input {', '.join(changed)}: a backward reads them and "
                            f"writes only dq, dk and dv")
        problems += backward_technique(trace, limits)
        problems += _reads_everything(trace, B * H * D, Nq, min(Nk, Nq) if causal else Nk)
        ok &= add_verdict(lines, head, problems, "dq, dk, dv match autograd; tiles recomputed block "
                          "by block from lse and Delta" + (", masked tiles skipped" if causal else ""))
    if ok:
        ok &= _fp16_backward_case(fn, gen, lines)
    else:
        lines.append("(the float16 case runs once the float64 cases pass)")
    return CheckResult(ok, tq.wrap("\n".join(lines)))


# --- Exercise 6.5 (headline): forward and backward as one autograd.Function ---------------------

class SolutionFlashAttention(torch.autograd.Function):
    """Worked solution of exercise 6.5: ``SolutionFlashAttention.apply(q, k, v, causal, block_m,
    block_n)``. The forward saves ``q, k, v, o`` and the log-sum-exp, nothing of size
    ``Nq x Nk``; the backward recomputes the probabilities from them."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_m=64, block_n=64):
        o, lse = solution_flash_forward(q, k, v, causal, block_m, block_n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.blocks = causal, (block_m, block_n)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = solution_flash_backward(q, k, v, o, lse, do, ctx.causal, *ctx.blocks)
        return dq, dk, dv, None, None, None    # one gradient per input of forward


def _saved_sizes(run):
    sizes = []

    def pack(t):
        sizes.append((t.numel(), tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sizes


def _ctx_tensors(node, depth: int = 0) -> list:
    """``(attribute, tensor)`` for the tensors a Function's forward kept on ``ctx`` as attributes
    (``ctx.p = p``), in lists, tuples and dicts too: saved for the backward all the same."""
    found = []

    def walk(name, x, depth):
        if isinstance(x, torch.Tensor):
            found.append((name, x))
        elif depth < 3 and isinstance(x, (list, tuple)):
            for i, y in enumerate(x):
                walk(f"{name}[{i}]", y, depth + 1)
        elif depth < 3 and isinstance(x, dict):
            for key, y in x.items():
                walk(f"{name}[{key!r}]", y, depth + 1)

    for name, x in vars(node).items() if hasattr(node, "__dict__") else ():
        walk(f"ctx.{name}", x, depth)
    return found


def check_flash_function(fn_class, seed: int = 0) -> CheckResult:
    """Check a ``torch.autograd.Function`` subclass used as ``fn_class.apply(q, k, v, causal,
    block_m, block_n) -> o``: ``torch.autograd.gradcheck`` on tiny float64 inputs (causal and
    not); the output and the gradients at larger sizes against naive attention and autograd;
    only ``q, k, v, o`` and the log-sum-exp saved for the backward (nothing of size ``Nq x Nk``);
    forward and backward watched as in ``check_flash_backward`` (blocks read one at a time,
    scores one tile at a time, no softmax over keys in the backward, masked tiles skipped,
    nothing taken out to NumPy); nothing kept elsewhere (tensors on ``ctx`` attributes, globals,
    caches: what the forward leaves alive is ``o`` and the log-sum-exp); inputs left unchanged."""
    if not (isinstance(fn_class, type) and issubclass(fn_class, torch.autograd.Function)):
        return CheckResult(False, tq.wrap(f"✗ expected a subclass of torch.autograd.Function, got "
                                          f"{fn_class!r}: write class MyFlash(torch.autograd.Function)"))
    gen = torch.Generator().manual_seed(check_seed(seed))
    lines, ok = [], True
    for causal in (False, True):
        q, k, v, _ = _f64_inputs(gen, 1, 2, 5, 7, 3)
        inputs = tuple(t.requires_grad_(True) for t in (q, k, v))
        head = f"gradcheck, causal={causal}, q {tuple(q.shape)}, k {tuple(k.shape)}, blocks 2x3"
        try:
            torch.autograd.gradcheck(lambda q, k, v: fn_class.apply(q, k, v, causal, 2, 3), inputs,
                                     eps=1e-6, atol=1e-5, rtol=1e-4)
            lines.append(f"✓ {head}: passed")
        except Exception as exc:  # GradcheckError or the reader's own error: show its first lines
            ok = False
            first = (str(exc).strip().splitlines() or [""])[0]
            for i, name in enumerate("qkv"):
                first = first.replace(f"input {i}", f"input {i} ({name})")
            lines.append(f"✗ {head}: {type(exc).__name__}: {first}")
    for (B, H, Nq, Nk, D, bm, bn), causal in FORWARD_CASES[1:] + FORWARD_CASES[:1]:
        q, k, v, do = _f64_inputs(gen, B, H, Nq, Nk, D)
        names = ("q", "k", "v", "do")
        given, kept = tq.private_copies(q, k, v, do)
        qg, kg, vg, dog = given
        for t in (qg, kg, vg):
            t.requires_grad_(True)
        limits = backward_limits(B, H, Nq, Nk, D, bm, bn, causal)
        head = f"causal={causal}, q {tuple(q.shape)}, k {tuple(k.shape)}, blocks {bm}x{bn}"
        out = {}

        def forward():
            out["o"] = fn_class.apply(qg, kg, vg, causal, bm, bn)

        def backward():
            out["grads"] = torch.autograd.grad(out["o"], (qg, kg, vg), dog)

        saved, trace, err = watch_case(lambda: _saved_sizes(forward), dict(zip(names, given)), limits, causal)
        where = "forward"
        if err is None and not isinstance(out.get("o"), torch.Tensor):
            err = f"returned {describe(out.get('o'))}, not the output tensor o"
        if err is None:
            where = "backward"
            node = out["o"].grad_fn
            on_ctx = _ctx_tensors(node)
            try:
                saved_now = list(node.saved_tensors)
            except Exception:  # noqa: BLE001 - not a custom Function's node: nothing saved to allow
                saved_now = []
            _, trace_b, err = tq.run_watched(backward, dict(zip(names, given)), causal=causal,
                                             block_rows=limits.rows, pair_rows=(limits.bm, limits.bn),
                                             blocks=(limits.bm, limits.bn), known=saved_now)
        if err is not None:
            lines.append(f"✗ {head}: the {where} {err.removeprefix('your function ')}")
            ok = False
            continue
        problems = []
        res = compare(out["o"], naive_attention(q, k, v, causal=causal), name="o", **_TOL)
        if not res:
            problems.append(res.message)
        problems += _grads_report(out["grads"], autograd_grads(q, k, v, do, causal=causal))
        changed = tq.mutated(names, [t.detach() for t in given], kept)
        if changed:
            problems.append(f"changed its input {', '.join(changed)}")
        saved += [(t.numel(), tuple(t.shape)) for _, t in on_ctx]
        big = [shape for n, shape in saved if n > B * H * max(Nq, Nk) * D]
        kept_alive = B * H * (Nq * D + 2 * Nq)             # o and its log-sum-exp
        if on_ctx:
            problems.append(f"kept {len(on_ctx)} tensor(s) on ctx as attributes ({on_ctx[0][0]}, shape "
                            f"{tuple(on_ctx[0][1].shape)}): tensors for the backward go through "
                            f"ctx.save_for_backward (autograd checks them for in-place changes and frees "
                            f"them after the backward); save only q, k, v, o and the log-sum-exp")
        if trace.live_after > kept_alive:
            problems.append(f"left {trace.live_after:,} elements alive after the forward returned; o and "
                            f"the log-sum-exp are {kept_alive:,}: the forward keeps more (a global, a cache, "
                            f"a class attribute). The backward must recompute from q, k, v, o and lse")
        if big:
            problems.append(f"saved a tensor of shape {big[0]} for the backward: save q, k, v, o "
                            f"and the log-sum-exp, and recompute the probabilities")
        elif len(saved) > 5:
            problems.append(f"saved {len(saved)} tensors for the backward (shapes "
                            f"{', '.join(str(shape) for _, shape in saved)}): save only q, k, v, o and the "
                            f"log-sum-exp (one number per query row, not the max and the sum apart)")
        problems += ["forward: " + p for p in technique_report(trace, limits)]
        problems += ["backward: " + p for p in backward_technique(trace_b, limits, names=())]
        ok &= add_verdict(lines, head, problems, f"o and gradients match, {len(saved)} tensors "
                          f"saved, none Nq x Nk, tiled forward and backward")
    return CheckResult(ok, tq.wrap("\n".join(lines)))


__all__ = ["autograd_grads", "check_delta", "solution_delta", "check_dv_tile", "solution_dv_tile",
           "check_attention_backward", "solution_attention_backward",
           "solution_flash_backward", "check_flash_backward", "SolutionFlashAttention",
           "check_flash_function"]

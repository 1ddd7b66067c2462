"""Chapter 12 exercises: your own attention inside the GPT, and a sliding window.

Each checker first compares the reader's function with a float64 reference on random inputs of
odd sizes (each side gets its own copy), then puts it into the chapter's tiny model and trains it
next to a built-in backend on the same batches, to show that the model learns the same thing."""
from __future__ import annotations

import torch

from ..model import GPT, GPTConfig, load_corpus, random_windows, train
from ..reference import naive_attention
from .checker import CheckResult, compare

#: the tiny model of the checks: 2 layers, 4 query heads over 2 key/value heads of dim 16
CONFIG = GPTConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2)


def windowed_reference(q, k, v, window: int):
    """Causal sliding-window attention computed row by row: query ``i`` attends, without a mask,
    to exactly the keys ``max(0, i - window + 1) .. i`` (``Nq == Nk``)."""
    out = torch.empty_like(q)
    for i in range(q.shape[2]):
        lo = max(0, i - window + 1)
        out[:, :, i:i + 1] = naive_attention(q[:, :, i:i + 1], k[:, :, lo:i + 1], v[:, :, lo:i + 1])
    return out


def _inputs(gen, B, H, N, D):
    return tuple(torch.randn(B, H, N, D, generator=gen, dtype=torch.float64) for _ in range(3))


def _call(fn, args, kwargs):
    try:
        return fn(*[a.clone() for a in args], **kwargs), None
    except Exception as exc:  # the reader's code raised: say so instead of a traceback wall
        return None, CheckResult(False, f"✗ your function raised {type(exc).__name__}: {exc}")


def _train_side_by_side(fn, builtin: str, steps: int, window: int | None, seed: int):
    config = GPTConfig(**{**CONFIG.__dict__, "window": window})
    batches = random_windows(load_corpus().tokens(), batch=4, context=32, steps=steps, seed=seed)
    curves = {}
    for label, backend in (("yours", fn), (builtin, builtin)):
        curves[label] = train(GPT(config, attention_backend=backend, seed=seed), batches)
    return curves


def _trained(fn, builtin: str, steps: int, window: int | None, seed: int):
    """``_train_side_by_side`` that answers instead of raising: ``(curves, None)`` or ``(None,
    message)`` when the reader's function failed inside the model (its inputs there are float32
    batches of the model's heads, not the float64 tensors of the first checks)."""
    try:
        curves = _train_side_by_side(fn, builtin, steps, window, seed)
    except Exception as exc:  # noqa: BLE001 - the reader's function failed inside the model: say so
        return None, (f"✗ inside the model your function raised {type(exc).__name__}: {exc}\n"
                      f"  the model calls it on float32 (B, heads, context, head_dim) tensors, with "
                      f"requires_grad set for training; it must work there too and keep autograd's graph")
    bad = [v for c in curves.values() for v in c if not isinstance(v, float)]
    if bad:
        return None, f"✗ training gave a loss that is not a number: {bad[0]!r}"
    return curves, None


def _curve_lines(curves, builtin):
    worst = max(abs(a - b) for a, b in zip(curves["yours"], curves[builtin]))
    ok = worst < 1e-3               # False for NaN too
    head = (f"{'✓' if ok else '✗'} trained {len(curves['yours'])} steps next to '{builtin}': "
            f"loss {curves['yours'][0]:.3f} -> {curves['yours'][-1]:.3f} (yours), "
            f"{curves[builtin][0]:.3f} -> {curves[builtin][-1]:.3f} ({builtin}); largest difference {worst:.1e}")
    return ok, head


def check_attention_backend(fn, steps: int = 6, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v) -> o``, causal attention on ``(B, H, N, D)`` tensors (scale
    ``1/sqrt(D)``), against float64 naive attention, then train the tiny GPT with it and with
    ``"naive"`` on the same batches: the losses must agree step by step."""
    gen = torch.Generator().manual_seed(seed)
    lines, ok = [], True
    for B, H, N, D in ((1, 2, 37, 16), (2, 3, 70, 24)):
        args = _inputs(gen, B, H, N, D)
        got, err = _call(fn, args, {})
        if err is not None:
            return err
        res = compare(got, naive_attention(*args, causal=True), atol=1e-9, rtol=1e-9,
                      name=f"o, causal, q {tuple(args[0].shape)}")
        ok &= bool(res)
        lines.append(str(res))
    if not ok:
        return CheckResult(False, "\n".join(lines + ["(fix the numbers before plugging it into the model)"]))
    curves, err = _trained(fn, "naive", steps, None, seed)
    if err is not None:
        return CheckResult(False, "\n".join(lines + [err]))
    good, line = _curve_lines(curves, "naive")
    return CheckResult(good, "\n".join(lines + [line]))


def check_window_attention(fn, window: int = 5, steps: int = 6, seed: int = 0) -> CheckResult:
    """Check ``fn(q, k, v, window) -> o``, causal sliding-window attention (query ``i`` sees keys
    ``i - window < j <= i``), against :func:`windowed_reference`, then train the tiny GPT with
    ``GPTConfig(window=...)`` through it and through ``"sdpa"`` on the same batches."""
    gen = torch.Generator().manual_seed(seed)
    lines, ok = [], True
    for (B, H, N, D), w in (((1, 2, 37, 16), window), ((2, 1, 29, 8), 1), ((1, 2, 23, 16), 40)):
        args = _inputs(gen, B, H, N, D)
        got, err = _call(fn, args, {"window": w})
        if err is not None:
            return err
        res = compare(got, windowed_reference(*args, w), atol=1e-9, rtol=1e-9,
                      name=f"o, window {w}, q {tuple(args[0].shape)}")
        ok &= bool(res)
        lines.append(str(res))
    if not ok:
        return CheckResult(False, "\n".join(lines + ["(fix the numbers before plugging it into the model)"]))

    def in_model(q, k, v, window):
        return fn(q, k, v, window)

    in_model.__name__ = getattr(fn, "__name__", "yours")
    curves, err = _trained(in_model, "sdpa", steps, window, seed)
    if err is not None:
        return CheckResult(False, "\n".join(lines + [err]))
    good, line = _curve_lines(curves, "sdpa")
    return CheckResult(good, "\n".join(lines + [line]))


__all__ = ["CONFIG", "check_attention_backend", "check_window_attention", "windowed_reference"]

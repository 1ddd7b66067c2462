"""Attention for real models, measured: grouped-query heads, a sliding window, packed batches.

The performance check of the "attention for real models" work, on one GPU (``python -m
flashtut.bench real-models``):

* grouped-query heads: 32 query heads over 8 key/value heads, D = 128, N = 16384, causal and
  not: the Triton kernels against SDPA's flash backend on the same work (``enable_gqa=True``);
* a sliding window of 4096 at N = 16384 (causal, 16 heads, D = 128): SDPA's flash backend has
  no window, so it runs the full causal attention; each side is credited the FLOPs of the keys
  its mask leaves visible (:func:`flashtut.costs.flops.visible_attention_flops`), and the
  comparison is TFLOP/s on visible keys, not time;
* packed against padded: four causal sequences of 16384 tokens in all, packed without padding
  (``varlen_attention``) against the same tokens padded to the longest one (Triton and SDPA
  flash on the padded batch); every row is credited the same FLOPs, those of the real tokens,
  so TFLOP/s compares time.

Every implementation is checked before it is timed: against a float32 reference on a slice of
whole head groups with the FlashAttention criterion (at most twice PyTorch's own low-precision
error, :class:`flashtut.bench.accuracy.Reference`); packed results against the reference run
sequence by sequence. Backward rows time the backward alone (the forward graph is kept and
replayed, as the protocol does). ``small=True`` shrinks every case for a CPU (Triton through its
interpreter), to test the machinery.
"""
from __future__ import annotations

import torch

from ..costs.flops import tflops, visible_attention_flops
from ..reference import naive_varlen_attention
from .accuracy import Reference, max_abs_err
from .memory import is_oom, release_cached
from .timing import time_fn, timer_name


def _cases(small: bool) -> list[dict]:
    """What is measured: ``group`` names the comparison a row belongs to."""
    if small:
        return [dict(group="gqa", B=1, H=4, Hkv=2, N=40, D=16, causal=True, window=None),
                dict(group="window", B=1, H=2, Hkv=2, N=48, D=16, causal=True, window=12),
                dict(group="varlen", lens=(5, 17, 9, 20), H=2, Hkv=1, D=16, causal=True, window=None)]
    return [dict(group="gqa", B=1, H=32, Hkv=8, N=16384, D=128, causal=c, window=None) for c in (False, True)] + [
        dict(group="window", B=1, H=16, Hkv=16, N=16384, D=128, causal=True, window=4096),
        dict(group="varlen", lens=(1000, 3000, 5000, 7384), H=16, Hkv=16, D=128, causal=True, window=None)]


def _sdpa(device):
    """SDPA on its flash backend on a GPU (the math backend on the CPU, to test the machinery)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name = "sdpa-flash" if device.type == "cuda" else "sdpa-math"
    backend = SDPBackend.FLASH_ATTENTION if device.type == "cuda" else SDPBackend.MATH

    def fn(q, k, v, causal, window):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                                                    enable_gqa=k.shape[1] != q.shape[1])
    return name, fn


def _triton(q, k, v, causal, window):
    from ..triton.attention import triton_attention
    return triton_attention(q, k, v, causal=causal, window=window)


def _check_then_time(fn, inputs, do, device, warmup_ms, rep_ms, check):
    """Forward, then the backward alone: each checked (``check(mode, o, grads)``), then timed
    (median ms) if it passed. Yields ``(mode, verdict, ms or None)``."""
    with torch.no_grad():
        verdict = check("fwd", fn(*inputs), None)
        ms = time_fn(lambda: fn(*inputs), device, warmup_ms, rep_ms) if verdict["passed"] else None
    yield "fwd", verdict, ms
    leaves = [t.detach().requires_grad_() for t in inputs[:3]]
    with torch.enable_grad():
        o = fn(*leaves, *inputs[3:])

    def step():
        for t in leaves:
            t.grad = None
        o.backward(do, retain_graph=True)
    step()
    verdict = check("bwd", o.detach(), [t.grad for t in leaves])
    ms = time_fn(step, device, warmup_ms, rep_ms, grad_to_none=leaves) if verdict["passed"] else None
    yield "bwd", verdict, ms


def _rand(gen, shape, device, dtype):
    return torch.randn(shape, generator=gen, device=device, dtype=dtype)


def run_real_models(device=None, warmup_ms: float = 25, rep_ms: float = 100, seed: int = 0,
                    small: bool = False, dtype=torch.float16, ref_budget_bytes: int = 8 * 2**30,
                    on_row=None) -> list[dict]:
    """Check and time the cases of the module docstring; returns ``speed`` rows (with ``group``,
    ``Hkv``, ``window`` and ``layout`` added, and ``flops`` counting visible keys only)."""
    from ..devices import default_device

    device = torch.device(device) if device is not None else default_device()
    if small and device.type == "cpu":
        dtype = torch.float32
    sdpa_name, sdpa = _sdpa(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []

    def emit(row):
        rows.append(row)
        if on_row is not None:
            on_row(row)

    for case in _cases(small):
        if case["group"] == "varlen":
            emit_rows = _varlen_rows(case, device, dtype, gen, sdpa_name, sdpa, warmup_ms, rep_ms, seed)
        else:
            emit_rows = _dense_rows(case, device, dtype, gen, sdpa_name, sdpa, warmup_ms, rep_ms, seed,
                                    ref_budget_bytes)
        for row in emit_rows:
            emit(row)
        release_cached(device)
    return rows


def _row(case, impl, mode, shape, causal, window, layout, flops, device, seed, dtype):
    B, H, Hkv, N, D = shape
    return {"kind": "speed", "group": case["group"], "impl": impl, "mode": mode, "layout": layout,
            "B": B, "H": H, "Hkv": Hkv, "Nq": N, "Nk": N, "N": N, "D": D,
            "dtype": str(dtype).replace("torch.", ""), "causal": causal, "window": window, "scale": None,
            "flops": flops, "ms": None, "tflops": None, "status": None, "reason": None,
            "timer": timer_name(device), "seed": seed}


def _run_impl(rows_out, make_row, fn, inputs, do, device, warmup_ms, rep_ms, check):
    """Check and time ``fn`` in both modes; one row per mode, whatever happens."""
    done = set()
    try:
        for mode, verdict, ms in _check_then_time(fn, inputs, do, device, warmup_ms, rep_ms, check):
            row = make_row(mode)
            row.update(verdict)
            if ms is None:
                row["status"], row["reason"] = "failed", "result differs from the reference beyond tolerance"
            else:
                row["ms"], row["tflops"], row["status"] = ms, tflops(row["flops"], ms), "ok"
            rows_out.append(row)
            done.add(mode)
    except Exception as e:  # noqa: BLE001 - a row says what went wrong
        for mode in ("fwd", "bwd"):
            if mode not in done:
                row = make_row(mode)
                row["status"] = "oom" if is_oom(e) else "error"
                row["reason"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                rows_out.append(row)
        release_cached(device)


def _dense_rows(case, device, dtype, gen, sdpa_name, sdpa, warmup_ms, rep_ms, seed, budget):
    B, H, Hkv, N, D = case["B"], case["H"], case["Hkv"], case["N"], case["D"]
    causal, window = case["causal"], case["window"]
    q = _rand(gen, (B, H, N, D), device, dtype)
    k, v = (_rand(gen, (B, Hkv, N, D), device, dtype) for _ in range(2))
    do = _rand(gen, (B, H, N, D), device, dtype)
    rows = []
    # SDPA has no window: it does (and is credited) the full causal attention
    for name, fn, win in ((("triton", _triton, window)), (sdpa_name, sdpa, None)):
        ref = Reference(q, k, v, do, causal, None, budget, window=win)

        def check(mode, o, grads, ref=ref):
            return ref.check_forward(o) if mode == "fwd" else ref.check_backward(grads, o)

        def make_row(mode, name=name, win=win):
            flops = visible_attention_flops(B, H, N, N, D, causal, win, mode)
            return _row(case, name, mode, (B, H, Hkv, N, D), causal, win, "dense", flops, device, seed, dtype)
        _run_impl(rows, make_row, fn, (q, k, v, causal, win), do, device, warmup_ms, rep_ms, check)
        del ref
        release_cached(device)
    return rows


def _varlen_rows(case, device, dtype, gen, sdpa_name, sdpa, warmup_ms, rep_ms, seed):
    from ..triton.attention import varlen_attention

    lens, H, Hkv, D, causal = case["lens"], case["H"], case["Hkv"], case["D"], case["causal"]
    total, n_max = sum(lens), max(lens)
    bounds = [0]
    for n in lens:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    q = _rand(gen, (total, H, D), device, dtype)
    k, v = (_rand(gen, (total, Hkv, D), device, dtype) for _ in range(2))
    do = _rand(gen, (total, H, D), device, dtype)
    # the same tokens padded to the longest sequence, (B, H, n_max, D); padding rows are zeros
    # (their outputs are discarded; a padded batch computes them anyway, which is the point)
    def pad(t):
        out = t.new_zeros((len(lens), n_max) + tuple(t.shape[1:]))
        for b, n in enumerate(lens):
            out[b, :n] = t[bounds[b]:bounds[b + 1]]
        return out.transpose(1, 2).contiguous()

    qp, kp, vp, dop = (pad(t) for t in (q, k, v, do))
    acc_t = torch.float64 if device.type == "cpu" else torch.float32
    with torch.enable_grad():
        leaves = [t.detach().to(acc_t).requires_grad_() for t in (q, k, v)]
        o_ref = naive_varlen_attention(*leaves, bounds, bounds, causal)
        g_ref = torch.autograd.grad(o_ref, leaves, do.to(acc_t))
    o_ref = o_ref.detach()

    def unpad(t):     # (B, H, n_max, D) -> packed (total, H, D), the real tokens only
        t = t.transpose(1, 2)
        return torch.cat([t[b, :n] for b, n in enumerate(lens)])

    def check(mode, o, grads, packed):
        got_o = o if packed else unpad(o)
        errs = {"o": max_abs_err(got_o, o_ref)}
        if mode == "bwd":
            for name, g, want in zip(("dq", "dk", "dv"), grads, g_ref):
                errs[name] = max_abs_err(g if packed else unpad(g), want)
        refs = {"o": o_ref, **dict(zip(("dq", "dk", "dv"), g_ref))}
        tol = {n: 2e-2 * max(1.0, float(refs[n].abs().max())) if dtype != torch.float32 else
               1e-4 * max(1.0, float(refs[n].abs().max())) for n in errs}
        return {"err": errs, "tol": tol, "passed": all(errs[n] <= tol[n] for n in errs)}

    flops = {m: sum(visible_attention_flops(1, H, n, n, D, causal, None, m) for n in lens) for m in ("fwd", "bwd")}
    rows = []

    def packed_fn(q_, k_, v_, causal_, window_):
        return varlen_attention(q_, k_, v_, cu, cu, causal=causal_, window=window_)

    runs = (("triton", packed_fn, (q, k, v, causal, None), do, "packed", True),
            ("triton", _triton, (qp, kp, vp, causal, None), dop, "padded", False),
            (sdpa_name, sdpa, (qp, kp, vp, causal, None), dop, "padded", False))
    for name, fn, inputs, grad_out, layout, packed in runs:
        def make_row(mode, name=name, layout=layout):
            row = _row(case, name, mode, (len(lens), H, Hkv, n_max, D), causal, None, layout, flops[mode],
                       device, seed, dtype)
            row["lens"] = list(lens)
            return row
        _run_impl(rows, make_row, fn, inputs, grad_out, device, warmup_ms, rep_ms,
                  lambda mode, o, grads, packed=packed: check(mode, o, grads, packed))
    return rows


def _baseline(rows: list[dict], r: dict) -> dict | None:
    """The SDPA row ``r`` is compared with: same group, pass and causal setting."""
    return next((b for b in rows if b["group"] == r["group"] and b["mode"] == r["mode"] and b["status"] == "ok"
                 and b["impl"].startswith("sdpa") and b["causal"] == r["causal"]), None)


def summary(rows: list[dict]) -> list[str]:
    """Lines of the comparison: per group and mode, each row's TFLOP/s on visible keys and its
    ratio to the SDPA row of the same group, mode (and, for the dense groups, causal setting)."""
    out = []
    for r in rows:
        if r["status"] != "ok":
            out.append(f"{r['group']:7s} {r['impl']:10s} {r['layout']:7s} {r['mode']} causal={r['causal']} "
                       f"window={r['window']}: {r['status']} ({r['reason']})")
            continue
        base = _baseline(rows, r)
        ratio = f"{r['tflops'] / base['tflops']:.2f}x sdpa" if base else ""
        out.append(f"{r['group']:7s} {r['impl']:10s} {r['layout']:7s} {r['mode']} causal={r['causal']!s:5s} "
                   f"window={r['window']!s:5s} H={r['H']}/{r['Hkv']}: {r['ms']:.3f} ms, "
                   f"{r['tflops']:.1f} TFLOP/s (visible keys) {ratio}")
    return out


def summary_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The comparison as ``(header, body)`` for a table (``flashtut.notebook.show_table``): one line
    per measured row that is not SDPA itself, beside the SDPA row it is compared with (TFLOP/s on
    visible keys; for packed and padded batches the FLOPs are the same, so the ratio is of time)."""
    header = ["case", "pass", "heads (q/kv)", "ours", "ms", "TFLOP/s", "SDPA flash ms", "SDPA TFLOP/s",
              "ratio"]
    body = []
    for r in rows:
        if r["impl"].startswith("sdpa"):
            continue
        case = {"gqa": "grouped heads" + (", causal" if r["causal"] else ""),
                "window": f"window {r['window']}, causal", "varlen": f"{r['layout']} batch, causal"}[r["group"]]
        base = _baseline(rows, r)
        first = [case, r["mode"], f"{r['H']}/{r['Hkv']}", r["impl"]]
        if r["status"] != "ok" or base is None:
            body.append(first + [r["status"], "-", "-", "-", "-"])
            continue
        body.append(first + [f"{r['ms']:.2f}", f"{r['tflops']:.0f}", f"{base['ms']:.2f}",
                             f"{base['tflops']:.0f}", f"{r['tflops'] / base['tflops']:.2f}"])
    return header, body


__all__ = ["run_real_models", "summary", "summary_rows"]

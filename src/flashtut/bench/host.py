"""Host time per call of each fused attention entry point, at a size where the GPU work is tiny.

The time of many back-to-back calls on a problem that takes the GPU a few microseconds is the
time the host needs to issue one call (checks, planning, allocation, the launch itself): the
per-call cost that decides a kernel's speed at short sequences (chapter 09). The ``host``
subcommand of ``python -m flashtut.bench`` writes these rows (kind ``host``); run it with
``PYTHONPATH`` pointing at another checkout's ``src`` and another ``--label`` to compare versions.
"""
from __future__ import annotations

import time

import torch

from . import registry
from .sweeps import Case, make_inputs

#: the entries timed by default: registry names, each forward and forward + backward
HOST_IMPLS = ("cuda", "triton", "sdpa-flash")
HOST_CASE = Case(1, 1, 128, 128, 64, torch.float16)


def per_call_us(fn, calls: int, warmup: int = 20, repeats: int = 5) -> float:
    """Best of ``repeats`` runs of ``calls`` back-to-back calls of ``fn``, microseconds per call
    (the host's quietest stretch); ``warmup`` calls first (builds, caches, autotuning)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def run_host(impls=HOST_IMPLS, calls: int = 1000, label: str = "this checkout", device="cuda",
             case: Case = HOST_CASE, seed: int = 0, on_row=None) -> list[dict]:
    """One ``host`` row per implementation and pass (``fwd``, ``fwd+bwd``): ``us_per_call``, or
    ``status`` and ``reason`` when it cannot run here."""
    device = torch.device(device)
    rows = []
    for impl in registry.expand(list(impls)):
        base = {"kind": "host", "impl": impl.name, "version": label, "B": case.B, "H": case.H, "N": case.Nq,
                "D": case.D, "dtype": str(case.dtype).replace("torch.", ""), "calls": calls}
        reason = impl.check(device, case.dtype, case.D)
        passes = ("fwd", "fwd+bwd") if impl.backward == registry.AUTOGRAD else ("fwd",)
        for what in passes:
            row = dict(base, entry=f"{impl.name} {what}", us_per_call=None, status="ok", reason=None)
            if reason is not None:
                row.update(status="unavailable", reason=reason)
            else:
                q, k, v, do = make_inputs(case, device, seed)
                if what == "fwd":
                    def fn(q=q, k=k, v=v):
                        with impl.context():
                            return impl.forward(q, k, v, case.causal, case.scale)
                else:
                    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

                    def fn(qg=qg, kg=kg, vg=vg, do=do):
                        with impl.context():
                            o = impl.forward(qg, kg, vg, case.causal, case.scale)
                        (o[0] if isinstance(o, tuple) else o).backward(do)
                try:
                    row["us_per_call"] = per_call_us(fn, calls)
                except Exception as e:  # noqa: BLE001 - one failing entry must not lose the others
                    row.update(status="error", reason=f"{type(e).__name__}: {e}"[:300])
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


__all__ = ["run_host", "per_call_us", "HOST_IMPLS", "HOST_CASE"]

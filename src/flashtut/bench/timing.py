"""Timing one callable: the median of many runs, warm-up excluded.

On a GPU the work is asynchronous, so the host clock would time the launch, not the kernel:
``triton.testing.do_bench`` records CUDA events around each run, flushes the L2 cache between
runs (so a small problem does not time the cache) and returns the median. Without triton the
same is done here with ``torch.cuda.Event``. On the CPU the wall clock (``perf_counter``) is
the right clock. ``warmup_ms`` and ``rep_ms`` are time budgets, as in ``do_bench``: at least one
warm-up run and at least ``min_runs`` timed runs whatever they say.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable

import torch

_L2_FLUSH_BYTES = 256 * 2**20   # larger than any current GPU's L2 cache (H200: 50 MiB)


def _have_triton_bench() -> bool:
    try:
        import triton.testing  # noqa: F401
    except Exception:         # triton missing, or broken for this driver: fall back to events
        return False
    return True


def _reset(grad_to_none):
    for t in grad_to_none or ():
        t.grad = None


def time_cpu(fn: Callable, warmup_ms: float = 25, rep_ms: float = 100, grad_to_none: Iterable | None = None,
             min_runs: int = 3, max_runs: int = 1000) -> float:
    """Median wall-clock milliseconds of ``fn()`` after warm-up (``perf_counter``)."""
    grad_to_none = list(grad_to_none or ())
    start = time.perf_counter()
    while True:                                    # warm-up: at least one run, then the budget
        _reset(grad_to_none)
        fn()
        if (time.perf_counter() - start) * 1e3 >= warmup_ms:
            break
    times = []
    budget_start = time.perf_counter()
    while len(times) < max_runs:
        _reset(grad_to_none)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= min_runs and (time.perf_counter() - budget_start) * 1e3 >= rep_ms:
            break
    return statistics.median(times)


def time_cuda_events(fn: Callable, warmup_ms: float = 25, rep_ms: float = 100,
                     grad_to_none: Iterable | None = None, min_runs: int = 3) -> float:
    """Median milliseconds of ``fn()`` by CUDA events, with the L2 flushed before each run."""
    grad_to_none = list(grad_to_none or ())
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(3):
        fn()
    e.record()
    torch.cuda.synchronize()
    estimate = max(s.elapsed_time(e) / 3, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    n = max(min_runs, int(rep_ms / estimate))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        _reset(grad_to_none)
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))


def time_fn(fn: Callable, device, warmup_ms: float = 25, rep_ms: float = 100,
            grad_to_none: Iterable | None = None) -> float:
    """Median milliseconds of ``fn()`` on ``device`` (see the module docstring for how)."""
    device = torch.device(device)
    if device.type == "cuda":
        if _have_triton_bench():
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                  grad_to_none=list(grad_to_none) if grad_to_none else None,
                                  return_mode="median"))
        return time_cuda_events(fn, warmup_ms, rep_ms, grad_to_none)
    return time_cpu(fn, warmup_ms, rep_ms, grad_to_none)


def timer_name(device) -> str:
    """Which clock ``time_fn`` uses on ``device`` (recorded in each row)."""
    if torch.device(device).type == "cuda":
        return "triton.testing.do_bench(median)" if _have_triton_bench() else "cuda-events(median)"
    return "perf_counter(median)"


def time_wall(fn: Callable, device, runs: int = 3, warmup: int = 1) -> float:
    """Median wall-clock milliseconds of ``fn()`` over ``runs`` calls after ``warmup`` calls, the
    GPU synchronised before and after each: for end-to-end loops (a training step with its
    optimiser, a whole generation) whose host-side work is part of what is measured, and which are
    too long to repeat for ``do_bench``'s budget."""
    device = torch.device(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, runs)):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)

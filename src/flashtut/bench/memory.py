"""Peak extra memory of one call: how much more memory ``fn()`` needed than was already in use.

GPU: PyTorch's caching allocator keeps exact counters. ``reset_peak_memory_stats`` then
``max_memory_allocated`` minus what was allocated before the call is the call's extra peak
(the inputs, allocated before, are not counted; the output and every temporary are). It counts
memory allocated through PyTorch, which is where the library's kernels allocate their outputs
and scratch; memory a kernel took from CuPy's own pool would not show.

CPU: the operating system's resident-set high-water mark. On Linux the peak (``VmHWM``) can be
reset to the current size by writing ``5`` to ``/proc/self/clear_refs``, so the measurement
is exact and in-process; memory the C allocator kept from earlier calls is handed back first
(``malloc_trim``) so that reused pages count again. Elsewhere a thread samples the resident
set with psutil every 0.2 ms, which can miss a very short spike.

Out of memory is an answer, not a crash: ``peak_extra_memory`` returns ``None``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from typing import Callable

import torch

_OOM_TEXT = ("out of memory", "can't allocate memory", "not enough memory", "failed to allocate")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means the device (or host) ran out of memory."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def release_cached(device) -> None:
    """Return cached blocks after an out-of-memory error, so later measurements start clean."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------- CPU
def _read_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _hwm_resettable() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _read_status_kib("VmHWM") is not None


_libc = None


def _trim_malloc() -> None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)


def _cpu_peak_hwm(fn):
    gc.collect()
    _trim_malloc()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                      # VmHWM := current VmRSS
    before = _read_status_kib("VmRSS")
    out = fn()
    peak = _read_status_kib("VmHWM")
    del out
    return max(0, (peak - before) * 1024)


def _cpu_peak_sampled(fn, interval_s: float = 2e-4):
    import psutil

    proc = psutil.Process()
    gc.collect()
    _trim_malloc()
    before = proc.memory_info().rss
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            stop.wait(interval_s)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out = fn()
        peak[0] = max(peak[0], proc.memory_info().rss)
    finally:
        stop.set()
        t.join()
    del out
    return max(0, peak[0] - before)


# ---------------------------------------------------------------------------------- GPU
def _cuda_peak(fn, device):
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return max(0, peak - before)


def cpu_method() -> str:
    """How CPU memory is measured here (recorded in each memory row)."""
    return "rss-hwm(/proc/self/clear_refs)" if _hwm_resettable() else "rss-sampled(psutil)"


def peak_extra_memory(fn: Callable[[], object], device) -> int | None:
    """Bytes of memory ``fn()`` needed on top of what was allocated before it, at its peak.

    ``device`` is where ``fn`` allocates (``"cuda"``, ``"cpu"`` or a ``torch.device``).
    Returns ``None`` when ``fn`` runs out of memory; any other exception propagates.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    try:
        if device.type == "cuda":
            return int(_cuda_peak(fn, device))
        if device.type != "cpu":
            raise ValueError(f"device must be cpu or cuda, got {device}")
        return int(_cpu_peak_hwm(fn) if _hwm_resettable() else _cpu_peak_sampled(fn))
    except Exception as e:  # noqa: BLE001 - only out-of-memory is swallowed
        if is_oom(e):
            del e
            release_cached(device)
            return None
        raise

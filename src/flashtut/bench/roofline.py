"""The two ceilings of the roofline model, measured on this machine.

Memory: a device-to-device copy of a large random tensor; its bandwidth counts the bytes read
plus the bytes written. Arithmetic: a large square matrix product, ``2 n^3`` FLOPs, in float16,
bfloat16, float32 (tf32 off: true float32) and, if asked, tf32. Their ratio is the ridge point:
kernels with fewer FLOPs per byte than that are memory-bound here (Williams et al., 2009).
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..devices import default_device
from .memory import is_oom, release_cached
from .timing import time_fn, timer_name

MATMUL_DTYPES = ("float16", "bfloat16", "float32", "tf32")


def _defaults(device):
    if torch.device(device).type == "cuda":
        return {"copy_bytes": 2 * 2**30, "matmul_n": 8192}
    return {"copy_bytes": 256 * 2**20, "matmul_n": 1024}


def copy_bandwidth(device, nbytes: int | None = None, warmup_ms: float = 25, rep_ms: float = 100,
                   seed: int = 0) -> dict:
    """Row with the measured copy bandwidth (``GB/s`` = 1e9 bytes per second, read + written)."""
    device = torch.device(device)
    nbytes = int(nbytes or _defaults(device)["copy_bytes"])
    g = torch.Generator(device=device).manual_seed(seed)
    src = torch.randn(nbytes // 4, generator=g, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = time_fn(lambda: dst.copy_(src), device, warmup_ms, rep_ms)
    moved = 2 * src.numel() * 4
    return {"kind": "roofline", "what": "copy", "bytes": moved, "ms": ms,
            "gb_per_s": moved / (ms * 1e-3) / 1e9, "timer": timer_name(device), "status": "ok"}


@contextlib.contextmanager
def _tf32(enabled: bool):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def matmul_rate(device, dtype: str, n: int | None = None, warmup_ms: float = 25, rep_ms: float = 100,
                seed: int = 0) -> dict:
    """Row with the measured TFLOP/s of an ``n x n`` by ``n x n`` product in ``dtype``."""
    device = torch.device(device)
    if dtype not in MATMUL_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(MATMUL_DTYPES)}, got {dtype!r}")
    n = int(n or _defaults(device)["matmul_n"])
    row = {"kind": "roofline", "what": "matmul", "dtype": dtype, "n": n, "flops": 2.0 * n**3,
           "ms": None, "tflops": None, "timer": timer_name(device), "status": None, "reason": None}
    if dtype == "tf32" and device.type != "cuda":
        row["status"], row["reason"] = "unavailable", "tf32 is a GPU matrix-unit mode"
        return row
    torch_dtype = torch.float32 if dtype == "tf32" else getattr(torch, dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    try:
        a = torch.randn((n, n), generator=g, device=device, dtype=torch_dtype)
        b = torch.randn((n, n), generator=g, device=device, dtype=torch_dtype)
        out = torch.empty((n, n), device=device, dtype=torch_dtype)
        with _tf32(dtype == "tf32"):
            ms = time_fn(lambda: torch.matmul(a, b, out=out), device, warmup_ms, rep_ms)
    except Exception as e:  # noqa: BLE001 - a dtype the device lacks is a row, not a crash
        row["status"] = "oom" if is_oom(e) else "error"
        row["reason"] = f"{type(e).__name__}: {e}"[:300]
        release_cached(device)
        return row
    row.update(ms=ms, tflops=row["flops"] / (ms * 1e-3) / 1e12, status="ok")
    return row


def run_roofline(device=None, dtypes=("float16", "bfloat16", "float32"), copy_bytes: int | None = None,
                 matmul_n: int | None = None, warmup_ms: float = 25, rep_ms: float = 100,
                 seed: int = 0) -> list[dict]:
    """Copy bandwidth and matrix-multiply rates: the roofline's two ceilings."""
    device = torch.device(device) if device is not None else default_device()
    rows = [copy_bandwidth(device, copy_bytes, warmup_ms, rep_ms, seed)]
    rows += [matmul_rate(device, d, matmul_n, warmup_ms, rep_ms, seed) for d in dtypes]
    return rows


def ceilings_from_rows(rows: list[dict], device_name: str, note: str) -> dict:
    """The roofline's two ceilings from rows of :func:`run_roofline`: ``{"provenance": {...},
    "copy_bandwidth_GBps": float, "matmul_tflops": {dtype: float}}``; matrix rates that did not
    run (``status`` not ``ok``) are left out."""
    copies = [r for r in rows if r.get("what") == "copy" and r.get("status") == "ok"]
    if not copies:
        raise ValueError(f"rows: no successful copy measurement among {len(rows)} rows")
    rates = {r["dtype"]: round(r["tflops"], 1) for r in rows
             if r.get("what") == "matmul" and r.get("status") == "ok"}
    return {"provenance": {"provisional": False, "device": device_name, "note": note},
            "copy_bandwidth_GBps": round(copies[0]["gb_per_s"], 1),
            "matmul_tflops": rates}


def measure_roofline(device=None) -> dict:
    """The reader's GPU: copy bandwidth and matrix-multiply rates, as :func:`ceilings_from_rows`."""
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("this measurement needs a CUDA GPU; without one, load the committed H200 "
                           "figures with flashtut.results_data.load_roofline_data()")
    major, minor = torch.cuda.get_device_capability(device)
    dtypes = ("float16", "bfloat16", "float32") if major >= 8 else ("float16", "float32")
    note = (f"measured live with flashtut.bench.roofline (sm_{major}{minor}, torch {torch.__version__}) "
            f"on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return ceilings_from_rows(run_roofline(device, dtypes=dtypes), torch.cuda.get_device_name(device), note)

"""The two ceilings of the roofline model, measured on this machine.

Memory: a device-to-device copy of a large random tensor; its bandwidth counts the bytes read
plus the bytes written. Arithmetic: a large square matrix product, ``2 n^3`` FLOPs, in float16,
bfloat16, float32 (tf32 off: true float32) and, if asked, tf32. Their ratio is the ridge point:
kernels with fewer FLOPs per byte than that are memory-bound here (Williams et al., 2009).

A third kind of row measures the ceiling of one tensor-core *instruction* on its own
(:func:`instruction_peak`): ``mma.sync`` (the warp-level MMA of Ampere, which FlashAttention-2 and
our CUDA kernels use) and, on sm_90, ``wgmma`` (Hopper's warpgroup MMA, which cuBLAS, cuDNN and
Triton use there), each issued back to back on operands already in place. The matrix product's
rate is the ceiling of the best instruction; each instruction's rate is the ceiling of the
kernels built on it.
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..devices import default_device
from .memory import is_oom, release_cached
from .timing import time_fn, timer_name

MATMUL_DTYPES = ("float16", "bfloat16", "float32", "tf32")
#: instruction -> (kernel in cuda/kernels/peak_mma.cu, FLOPs of one instruction, the unit that
#: issues it, threads per unit, the oldest compute capability that has it)
INSTRUCTIONS = {
    "mma.sync": ("peak_mma_sync_loop", 2 * 16 * 8 * 16, "warp", 32, (7, 5)),
    "wgmma": ("peak_wgmma_loop", 2 * 64 * 128 * 16, "warpgroup", 128, (9, 0)),
}


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


def instruction_peak(device, instruction: str, dtype: str = "float16", warmup_ms: float = 25,
                     rep_ms: float = 100, target_ms: float = 2.0) -> dict:
    """Row with the TFLOP/s that ``instruction`` (``"mma.sync"`` or ``"wgmma"``) reaches on its own on
    this GPU in ``dtype`` (``float16`` or ``bfloat16``): every SM full of warps (warpgroups) that issue
    it back to back on operands in registers (shared memory for wgmma) and do nothing else.

    mma.sync: 8 warps per block, 4 blocks per SM, 8 independent accumulators per warp (m16n8k16;
    two m16n8k8 on sm_75). wgmma: 2 warpgroups per block, one block per SM, m64n128k16 with A and B
    from shared memory, two accumulators alternated so one group runs while the next is issued.
    FLOPs count 2 m n k per instruction; the loop runs long enough (``target_ms``) that the
    launch is noise."""
    if instruction not in INSTRUCTIONS:
        raise ValueError(f"instruction must be one of {', '.join(INSTRUCTIONS)}, got {instruction!r}")
    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"dtype must be float16 or bfloat16 (the tensor-core inputs), got {dtype!r}")
    device = torch.device(device)
    kernel, flops_each, unit, unit_threads, oldest = INSTRUCTIONS[instruction]
    row = {"kind": "roofline", "what": "instruction", "instruction": instruction, "dtype": dtype,
           "flops": None, "ms": None, "tflops": None, "timer": timer_name(device), "status": None,
           "reason": None}
    if device.type != "cuda" or not torch.cuda.is_available():
        row["status"], row["reason"] = "unavailable", "a tensor-core instruction needs a CUDA GPU"
        return row
    cap = torch.cuda.get_device_capability(device)
    if cap < oldest or (dtype == "bfloat16" and cap < (8, 0)) or (instruction == "wgmma" and cap[0] != 9):
        row["status"], row["reason"] = "unavailable", f"{instruction} in {dtype} does not run on sm_{cap[0]}{cap[1]}"
        return row
    from ..cuda import compile as cc          # CuPy: only when a GPU measurement is asked for

    wgmma = instruction == "wgmma"
    defines = {"FT_BF16": int(dtype == "bfloat16")}
    fn = cc.get_function("peak_mma.cu", kernel, defines, arch="90a" if wgmma else None)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if wgmma:
        threads, grid, smem, per_step = 2 * 128, sms, 8192 + 16384, 8
        cc.set_max_dynamic_smem(fn, smem)
    else:
        threads, grid, smem, per_step = 8 * 32, 4 * sms, 0, 8
    out = torch.empty(grid * threads, device=device, dtype=torch.float32)
    units = grid * threads // unit_threads

    def launch(steps):
        with torch.cuda.device(device):
            cc.launch(fn, (grid, 1, 1), (threads, 1, 1), (out, int(steps)), smem)

    steps = 256                                   # grow the loop until one launch takes target_ms
    while True:
        ms = time_fn(lambda: launch(steps), device, 1, 5)
        if ms >= target_ms or steps >= 1 << 22:
            break
        steps = int(steps * min(64.0, max(2.0, 1.2 * target_ms / max(ms, 1e-3))))
    ms = time_fn(lambda: launch(steps), device, warmup_ms, rep_ms)
    flops = float(units) * steps * per_step * flops_each
    row.update(flops=flops, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, status="ok", steps=steps,
               grid=grid, threads=threads, unit=unit)
    if not bool(torch.isfinite(out).all()):
        row.update(status="error", reason="non-finite accumulators: the operands are not what the kernel meant")
    return row

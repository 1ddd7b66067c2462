"""Decoding over a KV cache in Triton: the launches of the split-KV kernels.

``triton_decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None,
num_splits=None)`` is ``flashtut.decode_attention(..., backend="triton")``: the checks of the API
reference, then :func:`decode_launch`, which only launches (no check, no host synchronisation),
so that a decode step can be captured in a CUDA graph. The kernels are in
``flashtut.triton.decode_kernels``.

The split count: :func:`flashtut.decode.decode_num_splits` from the batch, the key/value heads,
the longest cache and the GPU's SM count (one split in the interpreter unless asked).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import raise_if_overflowed
from ..constants import LOG2E
from ..decode import check_decode_inputs, decode_num_splits
from .attention import _require_runtime, interpreting

try:
    import triton

    from . import decode_kernels
except ImportError:  # pragma: no cover - the facade reports the missing package
    triton = None

#: the head dims the decode kernel's tiles are built for (its (m, l, o) partial states keep one
#: D-wide row per query in registers)
DECODE_MAX_HEAD_DIM = 128
#: dtypes of the decode kernel (float64: use backend="reference")
DECODE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: most rows (query heads of a group times new queries) per program; more rows take more programs
MAX_ROWS = 64
#: the most splits one launch takes (bounds the partial-state buffer)
MAX_SPLITS = 64


def num_sms(device) -> int:
    """The SM count of ``device`` (a CPU under the interpreter counts as one)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(batch: int, kv_heads: int, max_len: int, device) -> int:
    """The launch's split count on ``device`` for caches of up to ``max_len`` positions:
    :func:`flashtut.decode.decode_num_splits`; one on the CPU interpreter."""
    return decode_num_splits(batch, kv_heads, max(1, max_len), num_sms(device), max_splits=MAX_SPLITS)


def _block_rows(rows: int) -> int:
    return min(MAX_ROWS, max(16, triton.next_power_of_2(rows)))


@dataclass(frozen=True)
class DecodeTuning:
    """How :func:`decode_launch` runs the kernel, the split count aside: ``block_n`` keys per
    tile (a power of two, at least 16), ``num_warps`` and ``num_stages`` per program (float32
    takes at most 2 stages), ``fused_merge`` (the last split of each row block merges, in the
    same launch, instead of a second kernel) and ``page_ahead`` (a paged read fetches the next
    tile's table entries one iteration ahead)."""
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    fused_merge: bool = False
    page_ahead: bool = False

    def __post_init__(self):
        for name in ("block_n", "num_warps", "num_stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"DecodeTuning.{name} must be a positive integer, got {v!r}")
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"DecodeTuning.block_n must be a power of two of at least 16, got {self.block_n}")
        if self.num_warps & (self.num_warps - 1):
            raise ValueError(f"DecodeTuning.num_warps must be a power of two, got {self.num_warps}")


#: the launch every caller gets
SHIPPED = DecodeTuning()

#: the fused merge's int32 counters per device, zeroed when made and left at zero by every launch;
#: the last is handed out, and none is freed (a captured CUDA graph keeps the address it was given).
#: Calls on one device share them: run its decode steps in one stream order, as a model's layers run.
_COUNTERS: dict = {}


def _merge_counters(device, n: int):
    """At least ``n`` zeroed int32 counters on ``device``. Made on an eager call (the first call
    compiles the kernel, so it is eager); a call inside a CUDA-graph capture that finds too few
    gets counters of its own, zeroed by the graph on each replay and handed to no other call."""
    kept = _COUNTERS.setdefault(str(device), [])
    if kept and kept[-1].numel() >= n:
        return kept[-1]
    made = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        _COUNTERS.setdefault("captured", []).append(made)
    else:
        kept.append(made)
    return made


def decode_launch(q, k_cache, v_cache, cache_seqlens, block_table, scale: float,
                  num_splits: int, out=None, return_lse: bool = False,
                  tuning: DecodeTuning = SHIPPED):
    """Launch the split kernel (and the merge when ``num_splits > 1``, unless the split
    kernel merges: ``tuning.fused_merge``) on checked inputs.

    No checks and no host synchronisation: the grid depends on the shapes and
    ``num_splits`` only, so a CUDA graph can capture this call and replay it as the
    lengths grow. ``out`` (optional) receives the output. Returns ``o``, or
    ``(o, lse)`` with ``lse`` ``(B, H, Nq)`` float32, natural log."""
    B, H, Nq, D = q.shape
    Hkv, page = k_cache.shape[1], k_cache.shape[2]
    group = H // Hkv
    paged = block_table is not None
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must have unit stride along D "
                         "(the kernel reads rows of D contiguous values)")
    q = q if q.stride(-1) == 1 else q.contiguous()
    o = torch.empty_like(q) if out is None else out
    block_m = _block_rows(group * Nq)
    block_d = max(16, triton.next_power_of_2(D))
    block_s = max(2, triton.next_power_of_2(num_splits))
    f32 = dict(device=q.device, dtype=torch.float32)
    lse = torch.empty((B, H, Nq), **f32)
    if num_splits > 1:
        o_part = torch.empty((B, H, Nq, num_splits, D), **f32)
        l_part = torch.empty((B, H, Nq, num_splits), **f32)
    else:
        o_part, l_part = lse, lse                       # unused
    table = block_table if paged else cache_seqlens    # any int32 pointer when unused
    grid = (num_splits, B * Hkv, triton.cdiv(group * Nq, block_m))
    fused = tuning.fused_merge and num_splits > 1
    counters = _merge_counters(q.device, grid[1] * grid[2]) if fused else cache_seqlens
    big = not interpreting() and q.device.type == "cuda"
    # tiles of K and V in flight per program (float32's are twice as large: 2 at most)
    stages = min(tuning.num_stages, 2 if q.dtype == torch.float32 else 8) if big else 1
    decode_kernels.decode_split_kernel[grid](
        q, k_cache, v_cache, cache_seqlens, table, o, lse, o_part, l_part, counters,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        table.stride(0),
        o.stride(0), o.stride(1), o.stride(2),
        Hkv, group, Nq, D, scale * LOG2E, num_splits,
        SINGLE=num_splits == 1, PAGED=paged, PAGE=page if paged else 1,
        TILE_IN_PAGE=paged and page % tuning.block_n == 0,
        PAGE_AHEAD=paged and tuning.page_ahead,
        FUSED_MERGE=fused, BLOCK_M=block_m, BLOCK_N=tuning.block_n, BLOCK_D=block_d,
        # the fused merge's width; without it one compiled kernel serves any split count
        BLOCK_S=block_s if fused else 2, EVEN_D=block_d == D,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=tuning.num_warps if big else 1, num_stages=stages)
    if num_splits > 1 and not fused:
        decode_kernels.decode_merge_kernel[(B * H * Nq,)](
            o_part, l_part, o, lse, o.stride(0), o.stride(1), o.stride(2),
            H, Nq, D, num_splits, BLOCK_S=block_s, BLOCK_D=block_d,
            num_warps=4 if big else 1)
    return (o, lse) if return_lse else o


def check_kernel_inputs(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None):
    """The API's checks, then what this kernel accepts and whether it can run here. Returns
    ``(lengths, scale)``."""
    lengths, scale = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, scale)
    if q.dtype not in DECODE_DTYPES:
        raise ValueError(f"q has dtype {str(q.dtype).replace('torch.', '')}; the Triton decode kernel accepts "
                         "float16, bfloat16 or float32 (for float64 use backend='reference')")
    if q.shape[-1] > DECODE_MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {q.shape[-1]} is not supported by the Triton decode kernel; "
                         f"accepted: 1 to {DECODE_MAX_HEAD_DIM}")
    if q.device.type == "cpu" and triton is not None and not interpreting():
        raise RuntimeError(
            "decode_attention(backend='triton') got CPU tensors, but Triton compiles for GPUs: run "
            "on a CUDA GPU, set TRITON_INTERPRET=1 before importing (before the first `import "
            "flashtut` / `import triton`) to use Triton's CPU interpreter, or pass "
            "backend='reference'")
    _require_runtime(q)
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        raise ValueError("q has dtype bfloat16, which the Triton CPU interpreter does not support; "
                         "accepted on CPU: float16 or float32 (bfloat16 runs on the GPU)")
    return lengths, scale


def triton_decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None, scale=None,
                            num_splits: int | None = None, return_lse: bool = False,
                            tuning: DecodeTuning = SHIPPED):
    """``flashtut.decode_attention(..., backend="triton")``; ``num_splits`` None chooses it by
    :func:`choose_num_splits`; ``tuning`` (a :class:`DecodeTuning`) how the kernel runs.
    Returns ``o`` ``(B, H, Nq, D)`` (and the natural-log ``lse`` with ``return_lse=True``)."""
    if not isinstance(tuning, DecodeTuning):
        raise TypeError(f"tuning must be a DecodeTuning, got {type(tuning).__name__}")
    _, scale = check_kernel_inputs(q, k_cache, v_cache, cache_seqlens, block_table, scale)
    if num_splits is None:
        # from the cache's capacity, a shape, so that the launch needs no value read back: splits
        # past a sequence's length exit at once
        capacity = k_cache.shape[2] * (block_table.shape[1] if block_table is not None else 1)
        num_splits = 1 if interpreting() else choose_num_splits(q.shape[0], k_cache.shape[1], capacity,
                                                                q.device)
    elif isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= 256:
        raise ValueError(f"num_splits must be an integer from 1 to 256, got {num_splits!r}")
    # the kernel reads the lengths and each table row with unit stride
    cache_seqlens = cache_seqlens.contiguous()
    if block_table is not None:
        block_table = block_table.contiguous()
    o, lse = decode_launch(q, _unit_d(k_cache), _unit_d(v_cache), cache_seqlens, block_table, scale,
                           num_splits, return_lse=True, tuning=tuning)
    # the guard of every attention path: every row sees key 0, so every lse must be finite
    raise_if_overflowed(lse, q.dtype, scale, q.shape[-1], seen=(0, q.shape[2]), output=o,
                        inputs=(("q", q), ("k_cache", k_cache), ("v_cache", v_cache)))
    return (o, lse) if return_lse else o


def _unit_d(t):
    return t if t.stride(-1) == 1 else t.contiguous()


__all__ = ["triton_decode_attention", "decode_launch", "check_kernel_inputs", "choose_num_splits", "num_sms",
           "DECODE_DTYPES", "DecodeTuning", "SHIPPED", "MAX_SPLITS"]

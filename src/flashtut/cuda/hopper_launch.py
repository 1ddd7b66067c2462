"""The Hopper forward's build and launch without input checks: ``run_hopper`` on checked tensors.

Rung W2 reads its tiles with TMA, which needs a tensor map per operand: a 128-byte descriptor of
the tensor (base address, sizes, strides, the box one copy moves, the shared-memory swizzle) that
only the driver can encode, with ``cuTensorMapEncodeTiled``. :func:`tensor_maps` calls it through
ctypes on the driver library and hands the kernel the three maps in one small GPU buffer.

Two callers share it: ``hopper.forward_hopper`` (chapter 11's entry point, which checks its inputs
first) and ``attention.CudaAttention``, whose forward on an sm_90 GPU is rung W3
(``configs.HOPPER_DEFAULT``, see ``configs.choose_forward``). It sits below both so that neither imports the other in a loop.
"""
from __future__ import annotations

import ctypes
import functools
import math

import torch

from ..constants import LOG2E
from .compile import get_function, launch, max_smem_per_block, set_max_dynamic_smem
from .configs import HOPPER_ARCH, hopper_config


#: CUtensorMapDataType of each element type, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B
#: (cuda.h); interleave none and out-of-bounds fill with zeros are both 0
_TMA_DTYPE = {torch.float16: 6, torch.bfloat16: 9}
_TMA_SWIZZLE_128B, _TMA_L2_128B = 3, 2
TENSOR_MAP_BYTES = 128


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeError(f"the TMA rung needs the CUDA driver library libcuda.so.1 ({exc})") from exc
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def tensor_map(t: torch.Tensor, box_rows: int) -> bytes:
    """The TMA descriptor of a contiguous ``(B, H, N, D)`` 16-bit tensor seen as the 3-D array
    ``(D, N, B * H)`` (fastest first), copied in boxes of 64 columns (128 bytes, the swizzle's span) x
    ``box_rows`` rows x 1 head, 128-byte swizzled; rows past ``N`` arrive as zeros."""
    B, H, N, D = t.shape
    dims = (ctypes.c_uint64 * 3)(D, N, B * H)
    strides = (ctypes.c_uint64 * 2)(D * t.element_size(), N * D * t.element_size())   # of dims 1 and 2, bytes
    box = (ctypes.c_uint32 * 3)(64, box_rows, 1)
    step = (ctypes.c_uint32 * 3)(1, 1, 1)
    raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
    addr = (ctypes.addressof(raw) + 63) // 64 * 64        # CUtensorMap is 64-byte aligned
    rc = _encode_tiled()(addr, _TMA_DTYPE[t.dtype], 3, t.data_ptr(), dims, strides, box, step, 0,
                         _TMA_SWIZZLE_128B, _TMA_L2_128B, 0)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {rc} for a tensor of shape "
                           f"{tuple(t.shape)}, {t.dtype}, box (64, {box_rows}, 1)")
    return ctypes.string_at(addr, TENSOR_MAP_BYTES)


def tensor_map_bytes(q, k, v, block_m: int, block_n: int, counter: bool = False, o=None) -> bytes:
    """The Q, K and V tensor maps back to back (``counter``: and W4's scheduler counter after them,
    a zero int32 its blocks count up with atomicAdd, padded to 16 bytes; ``o``: and the map through
    which W3's ``tma_store`` build stores the output, a consumer warpgroup's 64 rows per copy)."""
    blob = tensor_map(q, block_m) + tensor_map(k, block_n) + tensor_map(v, block_n)
    if o is not None:
        blob += tensor_map(o, 64)
    return blob + bytes(16) if counter else blob


def tensor_maps(q, k, v, block_m: int, block_n: int, counter: bool = False, o=None) -> torch.Tensor:
    """:func:`tensor_map_bytes` in a uint8 buffer on their GPU (what W2, W3 and W4 take).

    The 384 bytes (400 for W4, with its counter; 512 with the output's map) travel from pinned memory without blocking: a copy
    from pageable memory makes torch wait for the stream to drain, so every call would leave the GPU
    idle while the host prepares the next one (book/perflog_hopper.md measures what that cost).
    torch's pinned-memory allocator keeps the host buffer until the copy has run."""
    blob = tensor_map_bytes(q, k, v, block_m, block_n, counter, o)
    host = torch.frombuffer(bytearray(blob), dtype=torch.uint8).pin_memory()
    return host.to(q.device, non_blocking=True)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _plan(variant: str, dtype: torch.dtype, head_dim: int, device_index: int, block_n: int, pv_split: bool,
          stages: int = 2, consumers: int = 2, options: tuple = ()):
    cfg = hopper_config(variant, dtype, head_dim, block_n, pv_split, stages, consumers, **dict(options))
    if cfg.dynamic_smem > max_smem_per_block(device_index):
        raise RuntimeError(f"{cfg.source} needs {cfg.dynamic_smem} bytes of shared memory per block; this GPU "
                           f"allows {max_smem_per_block(device_index)}")
    with torch.cuda.device(device_index):
        fn = get_function(cfg.source, cfg.kernel, cfg.define_dict, arch=HOPPER_ARCH)
    set_max_dynamic_smem(fn, cfg.dynamic_smem)
    return cfg, fn


def run_hopper(q, k, v, causal: bool, scale: float, variant: str = "w1", diag_offset: int = 0,
               block_n: int = 128, pv_split: bool = True, stages: int = 2, consumers: int = 2,
               ctas: int | None = None, **options):
    """``hopper.forward_hopper`` without its checks: ``q, k, v`` checked, contiguous and 16-byte aligned,
    ``causal`` a bool and ``diag_offset`` its alignment (query i sees key j iff j <= i + diag_offset);
    ``ctas``: W4's persistent blocks (default the SM count); ``options``: ``configs.W3_OPTIONS``."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    with torch.cuda.device(q.device):
        cfg, fn = _plan(variant, q.dtype, D, q.device.index, block_n, pv_split, stages, consumers,
                        tuple(sorted(options.items())))
        o = torch.empty_like(q)
        lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
        blocks = math.ceil(Nq / cfg.block_m)
        grid, extra = (blocks, B * H, 1), ()
        if cfg.persistent:   # blocks take the query blocks of all B * H heads from a counter
            grid, extra = (min(blocks * B * H, ctas or _sm_count(q.device.index)), 1, 1), (B * H,)
        # the TMA rungs read q, k and v through their tensor maps; the buffer lives until the launch is
        # queued, and torch's caching allocator keeps its memory from reuse until the stream has passed it
        inputs = ((q, k, v) if variant == "w1" else
                  (tensor_maps(q, k, v, cfg.block_m, cfg.block_n, counter=cfg.persistent,
                               o=o if cfg.o_map else None),))
        launch(fn, grid, (cfg.threads, 1, 1),
               (*inputs, o, lse, Nq, Nk, scale * LOG2E, int(causal), H // Hkv, int(diag_offset), *extra),
               cfg.dynamic_smem)
    return o, lse

"""The Hopper forward ladder (chapter 11): ``forward_hopper(q, k, v)`` runs rung W1 on an sm_90 GPU.

Rung W1 (``fwd_w1_wgmma.cu``) computes both products with warpgroup MMA (``wgmma.mma_async``),
which exists only on the ``sm_90a`` target: NVRTC must be told ``-arch=sm_90a``, not the plain
``sm_90`` that a build for the current device gets. The kernel file still compiles for every
other target (its body is empty there), so the CI compile checks cover it like the rest.
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch

from ..checks import check_scale
from ..constants import LOG2E
from .compile import (DTYPE_DEFINES, HEAD_DIMS, _cupy, _runtime_options, capability, get_function, launch,
                      load_source, max_smem_per_block, nvrtc_options, set_max_dynamic_smem)
from .forward import check_cuda_inputs, check_gpu_support, prepare

#: the rungs of the Hopper ladder that exist, name -> what the rung adds
HOPPER_VARIANTS = {
    "w1": "wgmma for S = Q K^T (both operands from shared memory) and O += P V (P from registers), "
          "two consumer warpgroups of 64 rows, 128-byte swizzled tiles, cp.async double buffer",
}

#: the architecture string wgmma needs (the "a" suffix: features of this chip that later ones may lack)
ARCH = "90a"


@dataclass(frozen=True)
class HopperConfig:
    """How one rung is built and launched for one (dtype, head dim)."""
    source: str
    kernel: str
    defines: tuple      # sorted (name, value) pairs passed as -D
    block_m: int        # query rows per block
    block_n: int        # keys per K/V tile
    threads: int
    dynamic_smem: int   # bytes

    @property
    def define_dict(self) -> dict:
        return dict(self.defines)


def w1_smem_bytes(head_dim: int, block_n: int = 128, block_m: int = 128) -> int:
    """Q tile + two K tiles + two V tiles of 16-bit values, plus 1024 bytes of slack so that the
    tiles can start on the 1024-byte boundary the 128-byte swizzle repeats on."""
    return (block_m + 4 * block_n) * head_dim * 2 + 1024


def hopper_config(variant: str, dtype: torch.dtype, head_dim: int, block_n: int = 128,
                  pv_split: bool = True) -> HopperConfig:
    """Build and launch parameters of Hopper rung ``variant``. ``block_n`` (64 or 128): keys per tile,
    the N of the S = Q K^T wgmma. ``pv_split`` (D = 128 only): O += P V as two 64-column wgmma per
    16 keys instead of one 128-column wgmma (whose descriptor needs the leading-dimension offset)."""
    if variant not in HOPPER_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(HOPPER_VARIANTS)}, got {variant!r}")
    if dtype not in DTYPE_DEFINES:
        raise ValueError(f"dtype must be float16 or bfloat16, got {dtype}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim D = {head_dim} is not supported; accepted: {', '.join(map(str, HEAD_DIMS))}")
    if block_n not in (64, 128):
        raise ValueError(f"block_n must be 64 or 128, got {block_n!r}")
    d = {**DTYPE_DEFINES[dtype], "HEAD_DIM": head_dim, "W1_BLOCK_N": block_n, "W1_PV_SPLIT": int(bool(pv_split))}
    return HopperConfig("fwd_w1_wgmma.cu", "flash_fwd_w1", tuple(sorted(d.items())), 128, block_n, 256,
                        w1_smem_bytes(head_dim, block_n))


def runtime_builds() -> list[HopperConfig]:
    """Every build ``forward_hopper`` makes (the CPU tests compile exactly these)."""
    return [hopper_config(v, dt, d) for v in HOPPER_VARIANTS for dt in DTYPE_DEFINES for d in HEAD_DIMS]


def nvrtc_options_90a(defines: dict | None = None) -> list[str]:
    """The NVRTC options of a build for sm_90a: :func:`flashtut.cuda.compile.nvrtc_options` with the
    ``-arch`` switched to ``sm_90a``."""
    try:
        return nvrtc_options(ARCH, defines)
    except ValueError:  # a compile helper that knows only numeric archs
        return [o if not o.startswith("-arch=") else f"-arch=sm_{ARCH}" for o in nvrtc_options("90", defines)]


@functools.lru_cache(maxsize=None)
def _function_90a(source: str, kernel: str, defines: tuple):
    # local build for compile helpers whose get_function has no arch argument: the same options plus
    # -arch=sm_90a (NVRTC takes the last -arch it is given; the option text is part of CuPy's cache key)
    cupy = _cupy()
    options = _runtime_options(dict(defines)) + (f"-arch=sm_{ARCH}",)
    module = cupy.RawModule(code=load_source(source), options=options, backend="nvrtc")
    return module.get_function(kernel)


def get_function_90a(source: str, kernel: str, defines: dict):
    """``source``'s ``kernel`` compiled for sm_90a, through the compile helper when it takes ``arch``."""
    if "arch" in inspect.signature(get_function).parameters:
        return get_function(source, kernel, defines, arch=ARCH)
    _cupy()
    return _function_90a(source, kernel, tuple(sorted(defines.items())))


def check_hopper(x: torch.Tensor) -> None:
    """RuntimeError unless ``x`` is on an sm_90 GPU (H100, H200, GH200): wgmma exists nowhere else."""
    check_gpu_support(x, "the Hopper forward kernels")
    major, minor = capability(x.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"the Hopper forward kernels use wgmma, which only sm_90 GPUs (H100, H200) have; "
                           f"this GPU is sm_{major}{minor}: use flashtut.cuda_attention (mma.sync) instead")


def _causal_offset(causal, Nq: int, Nk: int) -> tuple[bool, int]:
    # (causal, diag_offset): query i sees key j iff j <= i + diag_offset
    if isinstance(causal, str):
        if causal == "top-left":
            return True, 0
        if causal == "bottom-right":
            return True, Nk - Nq
        raise ValueError(f"causal must be False, True, 'top-left' or 'bottom-right', got {causal!r}")
    if isinstance(causal, (bool, int)):
        return bool(causal), 0
    raise TypeError(f"causal must be a bool, 'top-left' or 'bottom-right', got {type(causal).__name__}")


@functools.lru_cache(maxsize=None)
def _plan(variant: str, dtype: torch.dtype, head_dim: int, device_index: int, block_n: int, pv_split: bool):
    cfg = hopper_config(variant, dtype, head_dim, block_n, pv_split)
    if cfg.dynamic_smem > max_smem_per_block(device_index):
        raise RuntimeError(f"{cfg.source} needs {cfg.dynamic_smem} bytes of shared memory per block; this GPU "
                           f"allows {max_smem_per_block(device_index)}")
    with torch.cuda.device(device_index):
        fn = get_function_90a(cfg.source, cfg.kernel, cfg.define_dict)
    set_max_dynamic_smem(fn, cfg.dynamic_smem)
    return cfg, fn


def forward_hopper(q, k, v, causal=False, scale: float | None = None, variant: str = "w1", *,
                   block_n: int = 128, pv_split: bool = True):
    """Hopper rung ``variant`` on CUDA float16/bfloat16 tensors of an sm_90 GPU, D in {64, 128}.

    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention: query head ``h`` uses
    key/value head ``h // (H // Hkv)``); ``causal`` is ``False``, ``True`` / ``"top-left"`` or
    ``"bottom-right"``. Returns ``(o, lse)``: ``o`` like ``q``, ``lse`` the natural-log log-sum-exp,
    float32, ``(B, H, Nq)`` (``-inf`` for a row that sees no key, whose ``o`` is 0).
    """
    if variant not in HOPPER_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(HOPPER_VARIANTS)}, got {variant!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() == 4 and k.dim() == 4 and v.dim() == 4:
        H, Hkv = q.shape[1], k.shape[1]
        if v.shape[1] != Hkv:
            raise ValueError(f"k and v must have the same number of heads, got k: {Hkv}, v: {v.shape[1]}")
        if Hkv < 1 or H % Hkv:
            raise ValueError(f"the query heads H = {H} must be a multiple of the key/value heads Hkv = {Hkv}")
    B, H, Nq, Nk, D = check_cuda_inputs(q, _heads_like(k, q), _heads_like(v, q))
    check_hopper(q)
    causal, diag = _causal_offset(causal, Nq, Nk)
    scale = check_scale(scale, D)
    return run_hopper(prepare(q), prepare(k), prepare(v), causal, scale, variant, diag, block_n, pv_split)


def _heads_like(t: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # a view of grouped k / v with q's head count, for the shared shape checks only (no copy)
    if t.dim() == 4 and q.dim() == 4 and t.shape[1] != q.shape[1]:
        return t[:, :1].expand(-1, q.shape[1], -1, -1)
    return t


def run_hopper(q, k, v, causal: bool, scale: float, variant: str = "w1", diag_offset: int = 0,
               block_n: int = 128, pv_split: bool = True):
    """:func:`forward_hopper` without its checks: ``q, k, v`` checked and prepared, ``causal`` a bool."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    with torch.cuda.device(q.device):
        cfg, fn = _plan(variant, q.dtype, D, q.device.index, block_n, pv_split)
        o = torch.empty_like(q)
        lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
        grid = (math.ceil(Nq / cfg.block_m), B * H, 1)
        launch(fn, grid, (cfg.threads, 1, 1),
               (q, k, v, o, lse, Nq, Nk, scale * LOG2E, int(causal), H // Hkv, int(diag_offset)),
               cfg.dynamic_smem)
    return o, lse

"""The Hopper backward's builds and launch without input checks: ``run_hopper_backward`` on checked tensors.

Two callers share it: ``hopper_backward.hopper_backward`` (which checks its inputs first) and
``attention.CudaAttention``, whose backward on an sm_90 GPU it is wherever ``configs.kernel_plan`` names a
rung and :func:`fits` says so. It sits below both so that neither imports the other in a loop (as
``hopper_launch`` does for the forward).
``flashtut.cuda.hopper_backward`` describes the kernel and its rungs.
"""
from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..constants import LOG2E
from .compile import get_function, launch, max_smem_per_block, set_max_dynamic_smem
from .configs import (CONVERT_THREADS, HOPPER_ARCH, HOPPER_BACKWARD_RUNG, HOPPER_DETERMINISTIC_RUNG, PRE_WARPS,
                      kernel_builds, pick_config)
from .hopper_launch import _TMA_L2_128B, _TMA_SWIZZLE_128B, TENSOR_MAP_BYTES, _encode_tiled, tensor_map

#: CU_TENSOR_MAP_DATA_TYPE_FLOAT32 (cuda.h)
_TMA_FLOAT32 = 7

#: the rungs of the backward ladder and what each builds (BWDH_TMA, BWDH_DQ_TMA, BWDH_DQ_FIRST)
RUNGS = {"b1": (0, 0, 0), "b2": (1, 0, 0), "b3": (1, 1, 0), "b4": (1, 1, 1)}
#: head dims the kernel is built for
HEAD_DIMS = (64, 128)
SOURCE = "bwd_hopper.cu"
BLOCK_N = 128
#: the default rung per head dim, the one ``cuda_attention`` runs (configs.HOPPER_BACKWARD_RUNG)
DEFAULT_RUNG = HOPPER_BACKWARD_RUNG
#: the rung whose dK/dV-only build the deterministic mode runs (configs.HOPPER_DETERMINISTIC_RUNG)
DETERMINISTIC_RUNG = HOPPER_DETERMINISTIC_RUNG
DTYPE_BF16 = {torch.float16: 0, torch.bfloat16: 1}


@dataclass(frozen=True)
class HopperBackwardConfig:
    """One build of ``bwd_hopper.cu``: the rung, element type, head dim, stages of the TMA ring, and
    whether the kernel computes dQ (``dq=False``: the deterministic mode's dK/dV-only build)."""
    rung: str = "b3"
    bf16: bool = False
    head_dim: int = 128
    stages: int = 2
    dq: bool = True

    @property
    def block_m(self) -> int:
        # each consumer's dQ product is 64 x 64: BM * D = 8192
        return 8192 // self.head_dim

    @property
    def threads(self) -> int:
        return 256 + 128 * RUNGS[self.rung][0]

    @property
    def nstage(self) -> int:
        return 2 if self.rung == "b1" else self.stages

    @property
    def dynamic_smem(self) -> int:
        tile_m, tile_n = self.block_m * self.head_dim * 2, BLOCK_N * self.head_dim * 2
        stage = 2 * tile_m + 2 * self.block_m * 4
        dq_stage = 2 * 64 * 64 * 4 if self.dq_tma else 0
        return (2 * tile_n + self.nstage * stage + 2 * BLOCK_N * self.block_m * 2 + dq_stage
                + 8 * (1 + 2 * self.nstage) + 1024)

    @property
    def dq_tma(self) -> bool:
        return bool(RUNGS[self.rung][1]) and self.dq

    @property
    def define_dict(self) -> dict:
        return {"FT_BF16": int(self.bf16), "HEAD_DIM": self.head_dim, "BWDH_TMA": RUNGS[self.rung][0],
                "BWDH_DQ_TMA": int(self.dq_tma), "BWDH_DQ_FIRST": RUNGS[self.rung][2] * int(self.dq),
                "BWDH_STAGES": self.stages, "BWDH_DQ": int(self.dq), "FT_DESC_STEP": 1}


def check_config(rung: str, stages: int) -> None:
    if rung not in RUNGS:
        raise ValueError(f"rung must be one of {sorted(RUNGS)}, got {rung!r}")
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= 4:
        raise ValueError(f"stages must be an int from 1 to 4, got {stages!r}")
    if rung == "b1" and stages != 2:
        raise ValueError(f"stages applies to the TMA rungs 'b2' and 'b3' (rung 'b1' double-buffers), got "
                         f"stages={stages}")


def builds() -> list[HopperBackwardConfig]:
    """Every build the runtime makes (the CPU compile tests check each one)."""
    return [HopperBackwardConfig(r, bf, d, 2, dq) for r in RUNGS for bf in (False, True) for d in HEAD_DIMS
            for dq in ((True, False) if r == DETERMINISTIC_RUNG else (True,))]


@functools.lru_cache(maxsize=None)
def _plan(cfg: HopperBackwardConfig, device_index: int):
    if cfg.dynamic_smem > max_smem_per_block(device_index):
        raise RuntimeError(f"{SOURCE} needs {cfg.dynamic_smem} bytes of shared memory per block "
                           f"(rung {cfg.rung}, D = {cfg.head_dim}, {cfg.stages} stages); this GPU allows "
                           f"{max_smem_per_block(device_index)}")
    with torch.cuda.device(device_index):
        fn = get_function(SOURCE, "bwd_hopper", cfg.define_dict, arch=HOPPER_ARCH)
        pre = get_function(SOURCE, "bwdh_preprocess", cfg.define_dict, arch=HOPPER_ARCH)
        conv = get_function("bwd_dq_convert.cu", "attn_bwd_dq_convert",
                            {"FT_BF16": int(cfg.bf16), "HEAD_DIM": cfg.head_dim})
    set_max_dynamic_smem(fn, cfg.dynamic_smem)
    return fn, pre, conv


def dq_tensor_map(dq_acc: torch.Tensor) -> bytes:
    """The TMA descriptor through which rung b3 adds dQ tiles into the float32 ``(B, H, Nq, D)`` buffer,
    seen as ``(D, Nq, B * H)``: boxes of 32 columns (128 bytes, the swizzle's span) x 64 rows x 1 head,
    128-byte swizzled; rows past ``Nq`` are dropped by the copy engine."""
    B, H, N, D = dq_acc.shape
    dims = (ctypes.c_uint64 * 3)(D, N, B * H)
    strides = (ctypes.c_uint64 * 2)(D * 4, N * D * 4)
    box = (ctypes.c_uint32 * 3)(32, 64, 1)
    step = (ctypes.c_uint32 * 3)(1, 1, 1)
    raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
    addr = (ctypes.addressof(raw) + 63) // 64 * 64
    rc = _encode_tiled()(addr, _TMA_FLOAT32, 3, dq_acc.data_ptr(), dims, strides, box, step, 0,
                         _TMA_SWIZZLE_128B, _TMA_L2_128B, 0)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {rc} for the dQ buffer {tuple(dq_acc.shape)}")
    return ctypes.string_at(addr, TENSOR_MAP_BYTES)


def _tensor_maps(q, k, v, do, block_m: int, dq_acc=None) -> torch.Tensor:
    # Q, K, V, dO maps back to back (and b3's dQ map), from pinned memory without blocking (see
    # hopper_launch.tensor_maps)
    blob = tensor_map(q, block_m) + tensor_map(k, BLOCK_N) + tensor_map(v, BLOCK_N) + tensor_map(do, block_m)
    if dq_acc is not None:
        blob += dq_tensor_map(dq_acc)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).pin_memory().to(q.device, non_blocking=True)


def run_hopper_backward(q, k, v, o, lse, do, causal: bool, scale: float, diag_offset: int = 0,
                        window: int | None = None, rung: str | None = None, stages: int = 2,
                        deterministic: bool = False):
    """``hopper_backward.hopper_backward`` without its checks: ``q, k, v, o, do`` checked, contiguous and
    16-byte aligned (k, v with ``H / kv_group`` heads), ``lse`` float32 contiguous, ``causal`` a bool with
    its ``diag_offset`` (query i sees key j iff j <= i + diag_offset), ``window`` None or positive."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    rung = DEFAULT_RUNG[D] if rung is None else rung
    check_config(rung, stages)
    cfg = HopperBackwardConfig(DETERMINISTIC_RUNG if deterministic else rung, q.dtype == torch.bfloat16, D,
                               stages, not deterministic)
    with torch.cuda.device(q.device):
        fn, pre, conv = _plan(cfg, q.device.index)
        BM = cfg.block_m
        nq_pad = math.ceil(Nq / BM) * BM
        rows = B * H * nq_pad
        delta = torch.empty(rows, dtype=torch.float32, device=q.device)
        lse2 = torch.empty_like(delta)
        launch(pre, (math.ceil(rows / 4),), (128,), (o, do, lse, delta, lse2, Nq, nq_pad, rows))
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if cfg.dq else None
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        tmaps = None if cfg.rung == "b1" else _tensor_maps(q, k, v, do, BM, dq_acc if cfg.dq_tma else None)
        null = np.uint64(0)   # a null pointer for the buffers a build does not read
        launch(fn, (math.ceil(Nk / BLOCK_N), B * Hkv, 1), (cfg.threads, 1, 1),
               (tmaps if tmaps is not None else null, q, k, v, do, lse2, delta,
                dq_acc if dq_acc is not None else null, dk, dv, Nq, nq_pad, Nk, scale, scale * LOG2E,
                int(causal), H // Hkv, diag_offset, window or 0), cfg.dynamic_smem)
        if cfg.dq:
            dq = torch.empty_like(q)
            n = dq_acc.numel()
            launch(conv, (math.ceil(n / (4 * CONVERT_THREADS)),), (CONVERT_THREADS,), (dq_acc, dq, scale, n))
        else:
            dq = _dq_pass(q, k, v, o, lse, do, causal, scale, diag_offset, window)
    return dq, dk, dv


def fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether this kernel's indexing takes ``q`` and ``k`` (checked, head-dim padded): dQ's float32 rows
    within 32-bit offsets and one block row per (batch, KV head) within the grid's y limit.
    ``cuda_attention``'s backward runs this kernel where ``configs.kernel_plan`` names a rung and the
    sizes fit; elsewhere it keeps the mma.sync backward."""
    B, H, Nq, D = q.shape
    return B * H * Nq * D < 2**31 and B * k.shape[1] <= 65535


def _dq_pass(q, k, v, o, lse, do, causal: bool, scale: float, diag_offset: int, window):
    # the deterministic dQ: the mma.sync backward's separate pass (bwd_dq.cu), no window there
    if window is not None:
        raise ValueError("deterministic=True takes no window (the separate dQ pass has none); accepted: "
                         "window=None, or deterministic=False")
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    cfg = pick_config(D, 90, max_smem_per_block(q.device), deterministic=True)
    fns = {step: get_function(src, kernel, defines) for step, (src, kernel, defines) in kernel_builds(cfg, q.dtype).items()}
    delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    rows = B * H * Nq
    launch(fns["preprocess"], (math.ceil(rows / PRE_WARPS),), (32 * PRE_WARPS,), (o, do, lse, delta, lse2, rows))
    dq = torch.empty_like(q)
    set_max_dynamic_smem(fns["dq"], cfg.dq_smem)
    launch(fns["dq"], (math.ceil(Nq / (16 * cfg.warps)), B * H), (32 * cfg.warps,),
           (q, k, v, do, lse2, delta, dq, Nq, Nk, scale, scale * LOG2E, int(causal), H // k.shape[1],
            diag_offset), shared_mem=cfg.dq_smem)
    return dq

"""The Hopper forward's build and launch without input checks: ``run_hopper`` on checked tensors.

Two callers share it: ``hopper.forward_hopper`` (chapter 11's entry point, which checks its inputs
first) and ``attention.CudaAttention``, whose forward on an sm_90 GPU is rung W1 (see
``configs.choose_forward``). It sits below both so that neither imports the other in a loop.
"""
from __future__ import annotations

import functools
import math

import torch

from ..constants import LOG2E
from .compile import get_function, launch, max_smem_per_block, set_max_dynamic_smem
from .configs import HOPPER_ARCH, hopper_config


@functools.lru_cache(maxsize=None)
def _plan(variant: str, dtype: torch.dtype, head_dim: int, device_index: int, block_n: int, pv_split: bool):
    cfg = hopper_config(variant, dtype, head_dim, block_n, pv_split)
    if cfg.dynamic_smem > max_smem_per_block(device_index):
        raise RuntimeError(f"{cfg.source} needs {cfg.dynamic_smem} bytes of shared memory per block; this GPU "
                           f"allows {max_smem_per_block(device_index)}")
    with torch.cuda.device(device_index):
        fn = get_function(cfg.source, cfg.kernel, cfg.define_dict, arch=HOPPER_ARCH)
    set_max_dynamic_smem(fn, cfg.dynamic_smem)
    return cfg, fn


def run_hopper(q, k, v, causal: bool, scale: float, variant: str = "w1", diag_offset: int = 0,
               block_n: int = 128, pv_split: bool = True):
    """``hopper.forward_hopper`` without its checks: ``q, k, v`` checked, contiguous and 16-byte aligned,
    ``causal`` a bool and ``diag_offset`` its alignment (query i sees key j iff j <= i + diag_offset)."""
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

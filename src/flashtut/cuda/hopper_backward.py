"""The attention backward on Hopper (sm_90a): ``hopper_backward(q, k, v, o, lse, do, ...)``.

``kernels/bwd_hopper.cu`` computes the five products of the backward with warpgroup MMA: one block per
(128 keys, K/V head, batch) keeps dK and dV of its keys in registers while it walks the query blocks of
every query head of its group (so grouped heads are summed in registers), recomputes ``S^T = K Q^T`` and
``dP^T = V dO^T`` with the keys as the wgmma rows (so ``P^T`` and ``dS^T`` come out of the accumulators in
the register layout the ``dV`` and ``dK`` products take as their A operand), and adds ``dQ = dS K`` of
each query block into a float32 buffer. Four rungs (``RUNGS``), each one change on the last:

* ``"b1"``: two consumer warpgroups that also load (cp.async into a double buffer); dQ by 8-byte
  float32 reductions (``red.global.add.v2.f32``) from every consumer thread;
* ``"b2"``: a producer warpgroup issues TMA copies into a ring of ``stages`` stages guarded by
  mbarriers and hands its registers to the consumers (``setmaxnreg``);
* ``"b3"`` (the default): each consumer stages its 64 x 64 dQ tile in shared memory and one thread adds
  it into the buffer with a TMA reduce-add (``cp.reduce.async.bulk.tensor``), as FlashAttention-3 does;
* ``"b4"``: the dQ product issued before dV and dK, so that its store overlaps them.

Passes: ``bwdh_preprocess`` (Delta = rowsum(dO O) and lse in base 2, rows padded per head to the query
block), the main kernel, then ``bwd_dq_convert.cu`` (dQ times the scale, to the input type).
``deterministic=True`` keeps the Hopper kernel for dK and dV (rung b2 built without dQ) and takes dQ from the
mma.sync backward's separate dQ pass (``bwd_dq.cu``), which adds in a fixed order.
Head dims 64 and 128, float16 and bfloat16, causal (both alignments), sliding windows, grouped-query heads.
"""
from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_mask
from ..constants import LOG2E
from .attention import prepare_inputs
from .compile import capability, get_function, launch, max_smem_per_block, set_max_dynamic_smem
from .configs import CONVERT_THREADS, HOPPER_ARCH, PRE_WARPS, kernel_builds, pick_config
from .hopper_launch import _TMA_L2_128B, _TMA_SWIZZLE_128B, TENSOR_MAP_BYTES, _encode_tiled, tensor_map

#: CU_TENSOR_MAP_DATA_TYPE_FLOAT32 (cuda.h)
_TMA_FLOAT32 = 7

#: the rungs of the backward ladder and what each builds (BWDH_TMA, BWDH_DQ_TMA, BWDH_DQ_FIRST)
RUNGS = {"b1": (0, 0, 0), "b2": (1, 0, 0), "b3": (1, 1, 0), "b4": (1, 1, 1)}
#: head dims the kernel is built for
HEAD_DIMS = (64, 128)
SOURCE = "bwd_hopper.cu"
BLOCK_N = 128
#: the rung whose dK/dV-only build the deterministic mode runs
DETERMINISTIC_RUNG = "b2"
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
                "BWDH_DQ_TMA": int(self.dq_tma), "BWDH_DQ_FIRST": RUNGS[self.rung][2] * int(self.dq), "BWDH_STAGES": self.stages, "BWDH_DQ": int(self.dq),
                "FT_DESC_STEP": 1}


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


def hopper_backward(q, k, v, o, lse, do, causal=False, scale: float | None = None, window: int | None = None,
                    *, rung: str = "b3", stages: int = 2, deterministic: bool = False):
    """``(dq, dk, dv)`` of ``o = softmax(q k^T * scale) v`` on an sm_90 GPU (H100, H200) with wgmma.

    ``q``, ``o``, ``do``: ``(B, H, Nq, D)``; ``k``, ``v``: ``(B, Hkv, Nk, D)`` with ``H % Hkv == 0``; CUDA
    float16 or bfloat16, D 64 or 128; ``lse``: the forward's natural-log log-sum-exp ``(B, H, Nq)``.
    ``causal``: ``False``, ``True``/``"top-left"`` or ``"bottom-right"``; ``window`` (with causal): query
    ``i`` sees key ``j`` iff ``i + off - window < j <= i + off``. ``rung``: ``"b1"`` to ``"b4"``
    (module doc); ``stages``: the TMA rungs' ring. ``deterministic``: dQ from the separate mma.sync pass (the same bits
    every run) instead of float32 atomics. Returns gradients in the input dtype, shaped like the inputs.
    """
    check_config(rung, stages)
    alignment, window = check_mask(causal, window)
    p = prepare_inputs(q, k, v, alignment or False, scale, o=o, lse=lse, do=do, what="the Hopper backward")
    q, k, v, o, do = p.tensors
    B, H, Nq, Nk, D = p.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim D = {D} is not built for the Hopper backward; accepted: "
                         f"{', '.join(map(str, HEAD_DIMS))} (flashtut.cuda.cuda_backward takes the others)")
    major, minor = capability(q.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"the Hopper backward uses wgmma, which only sm_90 GPUs (H100, H200) have; this GPU "
                           f"is sm_{major}{minor}: use flashtut.cuda.cuda_backward")
    if B * H * Nq * D >= 2**31:
        raise ValueError(f"the Hopper backward indexes dQ with 32-bit rows: B*H*Nq*D = {B * H * Nq * D}; "
                         f"accepted: below 2**31")
    Hkv, G = k.shape[1], p.kv_group
    if B * Hkv > 65535:
        raise ValueError(f"B * Hkv = {B * Hkv} exceeds the 65535 blocks of grid.y; accepted: at most 65535")
    cfg = HopperBackwardConfig(DETERMINISTIC_RUNG if deterministic else rung, q.dtype == torch.bfloat16, D,
                               stages, not deterministic)
    with torch.cuda.device(q.device):
        fn, pre, conv = _plan(cfg, q.device.index)
        BM = cfg.block_m
        nq_pad = math.ceil(Nq / BM) * BM
        rows = B * H * nq_pad
        delta = torch.empty(rows, dtype=torch.float32, device=q.device)
        lse2 = torch.empty_like(delta)
        launch(pre, (math.ceil(rows / 4),), (128,), (o, do, p.lse, delta, lse2, Nq, nq_pad, rows))
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if cfg.dq else None
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        tmaps = None if cfg.rung == "b1" else _tensor_maps(q, k, v, do, BM, dq_acc if cfg.dq_tma else None)
        null = np.uint64(0)   # a null pointer for the buffers a build does not read
        launch(fn, (math.ceil(Nk / BLOCK_N), B * Hkv, 1), (cfg.threads, 1, 1),
               (tmaps if tmaps is not None else null, q, k, v, do, lse2, delta,
                dq_acc if dq_acc is not None else null, dk, dv, Nq, nq_pad, Nk, p.scale, p.scale * LOG2E,
                int(p.causal), G, p.diag_offset, window or 0), cfg.dynamic_smem)
        if cfg.dq:
            dq = torch.empty_like(q)
            n = dq_acc.numel()
            launch(conv, (math.ceil(n / (4 * CONVERT_THREADS)),), (CONVERT_THREADS,), (dq_acc, dq, p.scale, n))
        else:
            dq = _dq_pass(q, k, v, do, p, window)
    return dq, dk, dv


def _dq_pass(q, k, v, do, p, window):
    # the deterministic dQ: the mma.sync backward's separate pass (bwd_dq.cu), no window there
    if window is not None:
        raise ValueError("deterministic=True takes no window (the separate dQ pass has none); accepted: "
                         "window=None, or deterministic=False")
    B, H, Nq, Nk, D = p.shape
    cfg = pick_config(D, 90, max_smem_per_block(q.device), deterministic=True)
    fns = {step: get_function(src, kernel, defines) for step, (src, kernel, defines) in kernel_builds(cfg, q.dtype).items()}
    delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    rows = B * H * Nq
    launch(fns["preprocess"], (math.ceil(rows / PRE_WARPS),), (32 * PRE_WARPS,), (p.tensors[3], do, p.lse, delta, lse2, rows))
    dq = torch.empty_like(q)
    set_max_dynamic_smem(fns["dq"], cfg.dq_smem)
    launch(fns["dq"], (math.ceil(Nq / (16 * cfg.warps)), B * H), (32 * cfg.warps,),
           (q, k, v, do, lse2, delta, dq, Nq, Nk, p.scale, p.scale * LOG2E, int(p.causal), p.kv_group,
            p.diag_offset), shared_mem=cfg.dq_smem)
    return dq

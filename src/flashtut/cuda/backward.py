"""The CUDA backward pass with recomputation: three kernels, launched on torch's current stream.

1. ``bwd_preprocess.cu``: ``Delta = rowsum(dO * O)`` and ``lse2 = lse * log2(e)`` per query row;
2. ``bwd_dkdv.cu``: one thread block per key block; ``dK`` and ``dV`` accumulate in registers
   while the block walks the query blocks, recomputing ``P`` from ``Q``, ``K`` and ``lse2``;
3. ``bwd_dq.cu``: one thread block per query block; ``dQ`` in a separate pass that recomputes
   ``S`` and ``dP`` once more. The alternative, ``BackwardConfig(dq_atomic=True)``, has the
   dK/dV kernel add ``dQ`` into a float32 buffer with atomics instead (then
   ``bwd_dq_convert.cu`` scales and converts it); ``bwd_dq.cu``'s header comment and
   ``book/perflog_cuda_bwd.md`` weigh the two.

Tile sizes follow the GPU's shared memory: 64 x 64 tiles double-buffered with ``cp.async`` on
sm_80 and newer, single-buffered (and 32-row query/key steps at D = 128) within a T4's 64 KB.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..checks import check_like, check_lse, check_qkv, check_scale
from . import compile as cc
from .forward import check_gpu_support, check_mask_support

#: head dims the kernels are built for
HEAD_DIMS = (64, 128)
#: dtypes the kernels take (bfloat16 needs sm_80 or newer)
DTYPES = (torch.float16, torch.bfloat16)

_PRE_WARPS = 4             # rows per block of the preprocessing kernel
_CONVERT_THREADS = 256     # atomic variant: threads per block of the float32 -> 16-bit dQ copy


@dataclass(frozen=True)
class BackwardConfig:
    """Tile sizes and dQ strategy of one build: the defines of ``bwd_dkdv.cu`` and ``bwd_dq.cu``."""

    head_dim: int
    stages: int            # 2: prefetch the next tile with cp.async (sm_80+), 1: load, then compute
    dkdv_block_m: int      # queries per step of the dK/dV kernel (its key block is 16 * warps)
    dq_block_n: int        # keys per step of the dQ kernel (its query block is 16 * warps)
    warps: int = 4         # per block, in both main kernels; each warp owns 16 rows
    dq_atomic: bool = False  # True: dK/dV kernel adds dQ into float32 with atomics, no dQ pass

    @property
    def row_bytes(self) -> int:      # one padded shared-memory row of 16-bit elements
        return (self.head_dim + 8) * 2

    @property
    def dkdv_smem(self) -> int:
        keys = 16 * self.warps
        kv = 2 * keys * self.row_bytes
        ds = keys * (self.dkdv_block_m + 8) * 2 if self.dq_atomic else 0
        stage = 2 * self.dkdv_block_m * self.row_bytes + 2 * self.dkdv_block_m * 4
        return kv + ds + self.stages * stage

    @property
    def dq_smem(self) -> int:        # 0 in the atomic variant: there is no dQ kernel
        if self.dq_atomic:
            return 0
        qdo = 2 * 16 * self.warps * self.row_bytes
        return qdo + self.stages * 2 * self.dq_block_n * self.row_bytes


def pick_config(head_dim: int, arch: int, smem_limit: int) -> BackwardConfig:
    """The largest tiles that fit ``smem_limit`` bytes per block on compute capability ``arch``
    (e.g. 90): D = 128 needs 103 KB on an H200 (two blocks per SM), 51 KB on a T4 (64 KB max)."""
    stages = 2 if arch >= 80 else 1            # no cp.async before sm_80: nothing to overlap
    for block in (64, 32, 16):
        for st in sorted({stages, 1}, reverse=True):
            cfg = BackwardConfig(head_dim, st, block, block)
            if max(cfg.dkdv_smem, cfg.dq_smem) <= smem_limit:
                return cfg
    raise RuntimeError(f"no backward tile configuration for head dim {head_dim} fits "
                       f"{smem_limit} bytes of shared memory per block")


def kernel_builds(cfg: BackwardConfig, dtype: torch.dtype) -> dict[str, tuple[str, str, dict]]:
    """What one backward with ``cfg`` compiles and launches: step name -> (source file in
    :data:`flashtut.cuda.compile.CUDA_DIR`, kernel name, defines)."""
    base = {"HEAD_DIM": cfg.head_dim, **cc.DTYPE_DEFINES[dtype]}
    builds = {
        "preprocess": ("bwd_preprocess.cu", "attn_bwd_preprocess", {**base, "PRE_WARPS": _PRE_WARPS}),
        "dkdv": ("bwd_dkdv.cu", "attn_bwd_dkdv",
                 {**base, "DKDV_WARPS": cfg.warps, "DKDV_BLOCK_M": cfg.dkdv_block_m,
                  "DKDV_STAGES": cfg.stages, "DKDV_DQ_ATOMIC": int(cfg.dq_atomic)}),
    }
    if cfg.dq_atomic:
        builds["dq_convert"] = ("bwd_dq_convert.cu", "attn_bwd_dq_convert", base)
    else:
        builds["dq"] = ("bwd_dq.cu", "attn_bwd_dq",
                        {**base, "DQ_WARPS": cfg.warps, "DQ_BLOCK_N": cfg.dq_block_n,
                         "DQ_STAGES": cfg.stages})
    return builds


SMEM_PER_BLOCK = cc.SMEM_PER_BLOCK   # opt-in shared memory per block by architecture (compile.py)


def runtime_builds(arch: int) -> list[tuple[str, dict]]:
    """Every (source, defines) the backward compiles on an sm_``arch`` GPU with the default tiles,
    for both dQ strategies: the CI compile test (tests/test_cuda_compile.py) builds exactly these."""
    if arch not in SMEM_PER_BLOCK:
        raise ValueError(f"arch must be one of {sorted(SMEM_PER_BLOCK)}, got {arch!r}")
    out: list[tuple[str, dict]] = []
    for dtype in (DTYPES if arch >= 80 else (torch.float16,)):
        for d in HEAD_DIMS:
            cfg = pick_config(d, arch, SMEM_PER_BLOCK[arch])
            for atomic in (False, True):
                for source, _, defines in kernel_builds(replace(cfg, dq_atomic=atomic), dtype).values():
                    if (source, defines) not in out:
                        out.append((source, defines))
    return out


def _check(q, k, v, o, lse, do, causal, scale):
    dtype_names = "float16 or bfloat16 (the CUDA kernels' element types)"
    B, H, Nq, Nk, D = check_qkv(q, k, v, dtypes=DTYPES, dtype_names=dtype_names, gqa=True)
    check_like("o", o, q)
    check_like("do", do, q)
    for name, t in (("o", o), ("do", do)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
    check_lse(lse, B, H, Nq, q.device)
    kv_group, off, causal = check_mask_support(q, k, causal, None)
    scale = check_scale(scale, D)
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim D = {D} is not built for the CUDA backward; accepted: "
                         f"{', '.join(map(str, HEAD_DIMS))}")
    if B * H > 65535:
        raise ValueError(f"B * H = {B * H} exceeds the grid's y limit; accepted: at most 65535")
    arch = check_gpu_support(q, "the CUDA backward")
    return B, H, Nq, Nk, D, (causal, kv_group, off), scale, arch


def _ready(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned (cp.async and the vector loads move 16 bytes at a time)."""
    t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


def backward(q, k, v, o, lse, do, causal=False, scale: float | None = None, *,
             out=None, config: BackwardConfig | None = None):
    """``(dq, dk, dv)`` of ``o = softmax(q k^T * scale) v`` given the upstream gradient ``do``.

    ``q``: ``(B, H, Nq, D)``, ``k``, ``v``: ``(B, Hkv, Nk, D)`` with ``H % Hkv == 0`` (``dk``, ``dv``
    sum their group's gradients), CUDA, float16 or bfloat16 (bf16 from sm_80), D in {64, 128};
    ``causal``: ``False``, ``True``/``"top-left"`` or ``"bottom-right"``; ``o`` and ``do`` like ``q``; ``lse``: the forward's natural-log
    log-sum-exp, ``(B, H, Nq)``. The probabilities are recomputed from ``q``, ``k`` and ``lse``;
    nothing of size ``Nq x Nk`` is stored. ``out``: optional preallocated ``(dq, dk, dv)``,
    contiguous, with the shapes and dtype of ``q, k, v`` (the tests poison them with NaN to
    prove every element is written). ``config``: tile sizes (default :func:`pick_config` for this
    GPU), to compare configurations or run a T4's on a bigger GPU. Outputs are in the input dtype.
    """
    B, H, Nq, Nk, D, (causal, kv_group, off), scale, arch = _check(q, k, v, o, lse, do, causal, scale)
    Hkv = H // kv_group
    q, k, v, o, do = (_ready(t) for t in (q, k, v, o, do))
    lse = lse.to(torch.float32).contiguous()
    if out is None:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    else:
        dq, dk, dv = out
        for name, t, ref in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if not (isinstance(t, torch.Tensor) and t.shape == ref.shape and t.dtype == ref.dtype
                    and t.device == ref.device and t.is_contiguous() and t.data_ptr() % 16 == 0):
                raise ValueError(f"out {name} must be a contiguous, 16-byte aligned tensor of shape "
                                 f"{tuple(ref.shape)}, dtype {ref.dtype} on {ref.device}")

    smem_limit = cc.max_smem_per_block(q.device)
    cfg = pick_config(D, arch, smem_limit) if config is None else config
    if not isinstance(cfg, BackwardConfig) or cfg.head_dim != D or cfg.stages not in (1, 2) \
            or cfg.dkdv_block_m % 16 or cfg.dq_block_n % 16 or cfg.dkdv_block_m <= 0 \
            or cfg.dq_block_n <= 0 or cfg.warps not in (1, 2, 4, 8) \
            or max(cfg.dkdv_smem, cfg.dq_smem) > smem_limit:
        raise ValueError(f"config must be a BackwardConfig with head_dim {D}, stages 1 or 2, "
                         f"block sizes positive multiples of 16, warps 1, 2, 4 or 8, and at most "
                         f"{smem_limit} bytes of shared memory per kernel, got {cfg!r}")
    if cfg.dq_atomic and B * H * Nq * D >= 2**31:
        raise ValueError(f"the atomic-dQ variant indexes with 32-bit ints: B*H*Nq*D = "
                         f"{B * H * Nq * D}; accepted: below 2**31")
    threads = 32 * cfg.warps
    with torch.cuda.device(q.device):   # builds for, and launches on, q's GPU
        fns = {step: cc.get_function(src, kernel, defines)
               for step, (src, kernel, defines) in kernel_builds(cfg, q.dtype).items()}
        delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
        lse2 = torch.empty_like(delta)
        rows = B * H * Nq
        cc.launch(fns["preprocess"], (math.ceil(rows / _PRE_WARPS),), (32 * _PRE_WARPS,),
                  (o, do, lse, delta, lse2, rows))

        scale_log2 = scale * math.log2(math.e)
        # the atomic variant adds into a zeroed float32 buffer; the other passes a null pointer
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if cfg.dq_atomic \
            else np.uint64(0)
        cc.set_max_dynamic_smem(fns["dkdv"], cfg.dkdv_smem)
        # grouped-query heads: each query head writes its share of dK/dV, summed below in float32
        dk_h, dv_h = (dk, dv) if kv_group == 1 else \
            (torch.empty((B, H, Nk, D), dtype=q.dtype, device=q.device) for _ in range(2))
        cc.launch(fns["dkdv"], (math.ceil(Nk / (16 * cfg.warps)), B * H), (threads,),
                  (q, k, v, do, lse2, delta, dk_h, dv_h, Nq, Nk, scale, scale_log2, int(causal), dq_acc,
                   kv_group, off), shared_mem=cfg.dkdv_smem)
        if kv_group > 1:
            for share, total in ((dk_h, dk), (dv_h, dv)):
                total.copy_(share.view(B, Hkv, kv_group, Nk, D).sum(2, dtype=torch.float32))

        if cfg.dq_atomic:
            n = dq_acc.numel()
            cc.launch(fns["dq_convert"], (math.ceil(n / (4 * _CONVERT_THREADS)),), (_CONVERT_THREADS,),
                      (dq_acc, dq, scale, n))
        else:
            cc.set_max_dynamic_smem(fns["dq"], cfg.dq_smem)
            cc.launch(fns["dq"], (math.ceil(Nq / (16 * cfg.warps)), B * H), (threads,),
                      (q, k, v, do, lse2, delta, dq, Nq, Nk, scale, scale_log2, int(causal),
                       kv_group, off), shared_mem=cfg.dq_smem)
    return dq, dk, dv

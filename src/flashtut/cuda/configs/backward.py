"""The CUDA backward (chapter 08): :class:`BackwardConfig`, the tiles and dQ strategy of one build,
chosen per GPU by :func:`pick_config`; :func:`kernel_builds` lists the kernels one backward compiles."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .limits import DTYPE_DEFINES, DTYPES, EXPERIMENT_DIMS, HEAD_DIMS, SMEM_PER_BLOCK, WIDE_DIMS

__all__ = ["PRE_WARPS", "CONVERT_THREADS", "BackwardConfig", "WARP_GRID", "atomic_candidates", "pick_config",
           "kernel_builds", "backward_builds", "experiment_configs", "check_backward_config"]


#: rows per block of the preprocessing kernel (one warp per row)
PRE_WARPS = 4
#: atomic-dQ variant: threads per block of the float32 -> 16-bit dQ copy
CONVERT_THREADS = 256


@dataclass(frozen=True)
class BackwardConfig:
    """Tile sizes and dQ strategy of one build: the defines of ``bwd_dkdv.cu`` and ``bwd_dq.cu``."""

    head_dim: int
    stages: int            # 2: prefetch the next tile with cp.async (sm_80+), 1: load, then compute
    dkdv_block_m: int      # queries per step of the dK/dV kernel (its key block is 16 * warps)
    dq_block_n: int        # keys per step of the dQ kernel (its query block is 16 * warps)
    warps: int = 4         # per block, in both main kernels; each warp owns 16 rows
    dq_atomic: bool = False  # True: dK/dV kernel adds dQ into float32 with atomics, no dQ pass
    one_barrier: bool = False  # True (2 stages): prefetch after the step's barrier, none at its end
    dq_stage: bool = False   # True (atomic): dQ staged in shared memory, added 16 bytes at a time
    warp_grid: bool = False  # True (8 warps, atomic, D 64/128): FlashAttention-2's warp grid (see WARP_GRID)

    @property
    def row_bytes(self) -> int:      # one padded shared-memory row of 16-bit elements
        return (self.head_dim + 8) * 2

    @property
    def split(self) -> bool:         # dK and dV in separate blocks (grid z = 2): D = 256
        return self.head_dim > max(HEAD_DIMS)

    @property
    def dq_cols(self) -> int:        # columns per pass of the atomic dQ product (warp grid: per warp)
        if self.warp_grid:
            return self.head_dim * self.dkdv_block_m // 256
        return 64 if self.head_dim % 64 == 0 else 32

    @property
    def dkdv_smem(self) -> int:
        keys = 16 * self.warps
        kv = 2 * keys * self.row_bytes
        # dS^T (keys x queries, rows padded by 8), and on the warp grid P^T beside it
        ds = (2 if self.warp_grid else 1) * keys * (self.dkdv_block_m + 8) * 2 if self.dq_atomic else 0
        dq_stage = self.warps * 16 * (self.dq_cols + 8) * 4 if self.dq_atomic and self.dq_stage else 0
        stage = 2 * self.dkdv_block_m * self.row_bytes + 2 * self.dkdv_block_m * 4
        return kv + ds + dq_stage + self.stages * stage

    @property
    def dq_smem(self) -> int:        # 0 in the atomic variant: there is no dQ kernel
        if self.dq_atomic:
            return 0
        qdo = 2 * 16 * self.warps * self.row_bytes
        return qdo + self.stages * 2 * self.dq_block_n * self.row_bytes


#: what the warp grid of ``BackwardConfig(warp_grid=True)`` (bwd_dkdv.cu, DKDV_WARP_GRID) asks of
#: a configuration; :mod:`flashtut.cuda.models.warp_grid` models which warp owns which tile elements
WARP_GRID = {"warps": 8, "head_dims": (64, 128), "block_m": (64, 128), "min_arch": 80}


def atomic_candidates(head_dim: int) -> list[BackwardConfig]:
    """The atomic-dQ configurations in order of preference, as measured on an H200
    (book/perflog_cuda_bwd.md, "dQ by atomics, made cheap" and "FlashAttention-2's warp grid"):
    at D = 64 and 128 FlashAttention-2's 2 x 4 warp grid over 128-key blocks (dQ staged in shared
    memory, added 16 bytes at a time), with 128 queries per step at D = 64 where it fits (198 KB:
    an H100/H200); then 128-key blocks of 8 warps, one barrier per step, one warp per 16 keys (at
    D = 128 also with the staged dQ). D = 256: 64-key blocks (two 128-key tiles of K and V alone
    would take 270 KB), 64 queries per step where shared memory allows (213 KB: an H100/H200),
    else 32 (141 KB: an A100)."""
    base = BackwardConfig(head_dim, 2, 64, 64, dq_atomic=True)
    if head_dim > max(HEAD_DIMS):
        return [base, replace(base, dkdv_block_m=32)]
    w8 = replace(base, warps=8, one_barrier=True)
    staged = replace(w8, dq_stage=True)
    grid = []
    if head_dim in WARP_GRID["head_dims"]:
        grid = [replace(staged, warp_grid=True)]
        if head_dim == 64:
            grid.insert(0, replace(grid[0], dkdv_block_m=128))
    return grid + ([staged] if head_dim >= 128 else []) + [w8, base]


def pick_config(head_dim: int, arch: int, smem_limit: int, deterministic: bool = False) -> BackwardConfig:
    """The backward's configuration for compute capability ``arch`` (e.g. 90) with ``smem_limit``
    bytes of shared memory per block.

    From sm_80, unless ``deterministic``: dQ added with float32 atomics by the dK/dV kernel (five
    matrix products per tile pair instead of seven), the first of :func:`atomic_candidates` that
    fits. Otherwise (and on a T4): the separate dQ pass, deterministic, with the largest tiles that
    fit: D = 128 needs 103 KB on an H200 (two blocks per SM), 51 KB on a T4 (64 KB max); D = 256
    (sm_80+) 204 KB on an H200, 136 KB on an A100 (single-buffered)."""
    if not deterministic and arch >= 80:
        for cfg in atomic_candidates(head_dim):
            if cfg.dkdv_smem <= smem_limit:
                return cfg
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
    ``flashtut/cuda/kernels``, kernel name, defines)."""
    base = {"HEAD_DIM": cfg.head_dim, **DTYPE_DEFINES[dtype]}
    builds = {
        "preprocess": ("bwd_preprocess.cu", "attn_bwd_preprocess", {**base, "PRE_WARPS": PRE_WARPS}),
        "dkdv": ("bwd_dkdv.cu", "attn_bwd_dkdv",
                 {**base, "DKDV_WARPS": cfg.warps, "DKDV_BLOCK_M": cfg.dkdv_block_m,
                  "DKDV_STAGES": cfg.stages, "DKDV_DQ_ATOMIC": int(cfg.dq_atomic)}),
    }
    if cfg.one_barrier:
        builds["dkdv"][2]["DKDV_ONE_BARRIER"] = 1
    if cfg.dq_stage:
        builds["dkdv"][2]["DKDV_DQ_STAGE"] = 1
    if cfg.split:
        builds["dkdv"][2]["DKDV_SPLIT"] = 1
    if cfg.warp_grid:
        builds["dkdv"][2]["DKDV_WARP_GRID"] = 1
    if cfg.dq_atomic:
        builds["dq_convert"] = ("bwd_dq_convert.cu", "attn_bwd_dq_convert", base)
    else:
        builds["dq"] = ("bwd_dq.cu", "attn_bwd_dq",
                        {**base, "DQ_WARPS": cfg.warps, "DQ_BLOCK_N": cfg.dq_block_n,
                         "DQ_STAGES": cfg.stages})
    return builds


def backward_builds(arch: int) -> list[tuple[str, dict]]:
    """Every (source, defines) the backward compiles on an sm_``arch`` GPU: the default and the
    deterministic configuration, the atomic variant of the latter, and from sm_80 D = 256 and the
    measured alternatives (:func:`experiment_configs`, at :data:`EXPERIMENT_DIMS`); the CI compile
    test builds exactly these."""
    if arch not in SMEM_PER_BLOCK:
        raise ValueError(f"arch must be one of {sorted(SMEM_PER_BLOCK)}, got {arch!r}")
    out: list[tuple[str, dict]] = []
    limit = SMEM_PER_BLOCK[arch]
    for dtype in (DTYPES if arch >= 80 else (torch.float16,)):
        for d in HEAD_DIMS + (WIDE_DIMS if arch >= 80 else ()):
            det = pick_config(d, arch, limit, deterministic=True)
            variants = [det, pick_config(d, arch, limit)]
            atomic_det = replace(det, dq_atomic=True)
            if atomic_det.dkdv_smem <= limit:
                variants.insert(1, atomic_det)
            if arch >= 80 and d in EXPERIMENT_DIMS:
                variants += [v for v in experiment_configs(d).values() if max(v.dkdv_smem, v.dq_smem) <= limit]
            for v in variants:
                for source, _, defines in kernel_builds(v, dtype).values():
                    if (source, defines) not in out:
                        out.append((source, defines))
    return out


def experiment_configs(head_dim: int) -> dict[str, BackwardConfig]:
    """The backward's dQ strategies measured against each other (flashtut.bench.cuda_ladder): name ->
    config, on the sm_80+ tiles (64 queries per step, two stages)."""
    base = BackwardConfig(head_dim, 2, 64, 64)
    return {
        "separate-dq": base,
        "atomic-dq-w4": replace(base, dq_atomic=True),
        "atomic-dq-w8": replace(base, dq_atomic=True, warps=8),
        "atomic-dq-w8-1bar": replace(base, dq_atomic=True, warps=8, one_barrier=True),
        "atomic-dq-w8-1bar-v4": replace(base, dq_atomic=True, warps=8, one_barrier=True, dq_stage=True),
        "separate-dq-1bar": replace(base, one_barrier=True),
        # 128 queries per step: half the barriers and dK/dV loop trips (fits at D = 64 only)
        "atomic-dq-w8-1bar-m128": replace(base, dkdv_block_m=128, dq_atomic=True, warps=8, one_barrier=True),
        "atomic-dq-w8-1bar-v4-m128": replace(base, dkdv_block_m=128, dq_atomic=True, warps=8, one_barrier=True,
                                             dq_stage=True),
        # FlashAttention-2's warp grid (WARP_GRID) on top of atomic-dq-w8-1bar-v4; 128 queries per
        # step fit at D = 64 only (198 KB: an H100/H200)
        "atomic-dq-w8-split2x4": replace(base, dq_atomic=True, warps=8, one_barrier=True, dq_stage=True,
                                         warp_grid=True),
        "atomic-dq-w8-split2x4-m128": replace(base, dkdv_block_m=128, dq_atomic=True, warps=8, one_barrier=True,
                                              dq_stage=True, warp_grid=True),
    }


def check_backward_config(cfg, head_dim: int, arch: int, smem_limit: int) -> BackwardConfig:
    """``cfg`` itself if the backward can run it at ``head_dim`` on an sm_``arch`` GPU with
    ``smem_limit`` bytes of shared memory per block, else the ValueError that says why."""
    if not isinstance(cfg, BackwardConfig) or cfg.head_dim != head_dim or cfg.stages not in (1, 2) \
            or cfg.dkdv_block_m % 16 or cfg.dq_block_n % 16 or cfg.dkdv_block_m <= 0 \
            or cfg.dq_block_n <= 0 or cfg.warps not in (1, 2, 4, 8) \
            or (cfg.one_barrier and cfg.stages != 2) or (cfg.dq_stage and not cfg.dq_atomic) \
            or max(cfg.dkdv_smem, cfg.dq_smem) > smem_limit:
        raise ValueError(f"config must be a BackwardConfig with head_dim {head_dim}, stages 1 or 2, "
                         f"block sizes positive multiples of 16, warps 1, 2, 4 or 8, one_barrier only "
                         f"with 2 stages, dq_stage only with dq_atomic, and at most "
                         f"{smem_limit} bytes of shared memory per kernel, got {cfg!r}")
    if cfg.warp_grid:
        g = WARP_GRID
        if not (cfg.dq_atomic and cfg.warps == g["warps"] and head_dim in g["head_dims"]
                and cfg.dkdv_block_m in g["block_m"]):
            raise ValueError(f"warp_grid=True needs dq_atomic=True, warps={g['warps']}, head_dim in "
                             f"{g['head_dims']} and dkdv_block_m in {g['block_m']}, got {cfg!r}")
        if arch < g["min_arch"]:
            raise ValueError(f"warp_grid=True is built for sm_{g['min_arch']} and newer; this GPU is sm_{arch}")
    return cfg

"""Launch configurations and budgets of the CUDA kernels, for every GPU architecture.

Everything here is arithmetic on the kernels' tile shapes and the GPUs' published limits: no GPU,
no CuPy. The runtime (``flashtut.cuda.attention``) asks these functions what to build and launch
on the GPU it runs on; the CI compile test asks them what the runtime would build on a T4 (sm_75),
an A100 (sm_80) and an H100/H200 (sm_90), and compiles exactly that; chapter 08 does its register
and shared-memory budgets with them.

Forward: :class:`LaunchConfig` per ladder step (:data:`VARIANTS`), chosen by :func:`launch_config`;
the fast step's measured tile shapes are :data:`V3_TILES`. Backward: :class:`BackwardConfig`,
chosen by :func:`pick_config`; :func:`kernel_builds` lists its kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from ..hardware import GPUS

#: the forward ladder, in order: variant name -> what that step adds (the benchmark discovers
#: the ladder from this dict; ``flashtut.cuda.attention.cuda_forward(..., variant=name)`` runs a step)
VARIANTS = {
    "v1": "one thread per query row, K/V tiles in shared memory, float32 CUDA-core math",
    "v2": "a warp per 16 query rows, both products on tensor cores (mma.sync), P kept in registers",
    "v3": "cp.async double buffering, ldmatrix, swizzled shared memory, exp2, causal tile skipping, "
          "tile shapes chosen per head dim by measurement",
    "v4": "FlashAttention-2's tiling: 4 warps of 32 rows, Q re-read from shared memory per k-step, "
          "two blocks per SM, no spill",
    "v5": "FlashAttention-2's pipeline: single K and V buffers in separate cp.async groups "
          "(V lands while S is computed, the next K while P V is)",
    "v6": "K and V each double buffered in their own cp.async groups: each warp waits only for the "
          "operand it needs next",
    "v7": "the accumulator's rescale skipped when no row maximum of the warp changed",
}

#: the variant ``cuda_attention`` uses, per (padded) head dim, from sm_80 (measured on an H200,
#: book/perflog_cuda.md, "Steps 4 to 7" and "Head dims 32, 96 and 256"); before sm_80 (a T4) step 3
#: everywhere. D = 96: step 5 0.87-0.92x SDPA flash against step 3's 0.73-0.85x (bf16, N 4096 and
#: 16384, causal and not). D = 32 is not measured and takes step 3 with its default tiles
FAST_VARIANTS = {64: "v3", 96: "v5", 128: "v5", 256: "v3"}


def fast_variant(head_dim: int, arch: int) -> str:
    """The forward ``cuda_attention`` runs at this padded head dim on a GPU of ``arch`` (75, 90 ...)."""
    return FAST_VARIANTS.get(head_dim, "v3") if arch >= 80 else "v3"

#: element type -> the defines that select it in every kernel file (bfloat16 needs sm_80 or newer)
DTYPE_DEFINES = {torch.float16: {"FT_BF16": 0}, torch.bfloat16: {"FT_BF16": 1}}
#: dtypes the kernels take
DTYPES = tuple(DTYPE_DEFINES)
#: head dims the backward and the fast forward steps (:data:`FAST_STEPS`) are built for, on every
#: GPU; every other multiple of 8 up to 128 is zero-padded to the next of these (zero columns of Q and K add nothing to a
#: score, zero columns of V give output columns that are cut off again), so it costs the larger
#: dim's time. Multiples of 32: the fast forward's swizzle (ft_swizzle.cuh) works on groups of 4
#: or 8 16-byte chunks, and the atomic dQ on 32- or 64-column chunks
HEAD_DIMS = (32, 64, 96, 128)
#: built from sm_80 only, for step 3 of the forward and for the backward (whose dK/dV kernel then
#: splits dK and dV over two blocks, bwd_dkdv.cu's DKDV_SPLIT): on a T4 the 256-wide tiles do not
#: fit its 64 KB next to useful tile sizes, and its fp16-only tensor cores would spill
WIDE_DIMS = (256,)
#: the head dims the backward's measured alternatives (:func:`experiment_configs`) are built at
EXPERIMENT_DIMS = (64, 128)


#: the forward steps built at every one of :data:`HEAD_DIMS`: the ones ``cuda_attention`` runs
FAST_STEPS = tuple(sorted({"v3", *FAST_VARIANTS.values()}))
#: the other (teaching) steps of the ladder are built at 64 and 128 only, to keep the number of
#: builds (and CI's compile test) down; D = 32 and 96 run there padded to 64 and 128
LADDER_DIMS = (64, 128)


def built_dims(variant: str | None = None) -> tuple:
    """The head dims up to 128 that forward step ``variant`` (None: the backward, or
    ``cuda_attention``) is built for."""
    return HEAD_DIMS if variant is None or variant in FAST_STEPS else LADDER_DIMS


def padded_dim(head_dim: int, variant: str | None = None) -> int:
    """The built head dim that ``head_dim`` runs at: the next of :func:`built_dims` up to 128
    (32, 64, 96 or 128 for the backward and the fast steps), else itself (256)."""
    return next((d for d in built_dims(variant) if head_dim <= d), head_dim)


def _smem_by_arch() -> tuple[dict, dict]:
    # the book's reference GPUs (flashtut.hardware: T4, A100, H100/H200), plus sm_86/89 (A10, L4:
    # 99 KB per block, 100 KB per SM, from the CUDA guide's compute-capability table)
    per_block, per_sm = {86: 99 * 1024, 89: 99 * 1024}, {86: 100 * 1024, 89: 100 * 1024}
    for gpu in GPUS.values():
        arch = 10 * gpu.compute_capability[0] + gpu.compute_capability[1]
        per_block.setdefault(arch, gpu.smem_per_block_kib * 1024)
        per_sm.setdefault(arch, gpu.smem_per_sm_kib * 1024)
    return dict(sorted(per_block.items())), dict(sorted(per_sm.items()))


#: opt-in shared memory per block, and shared memory per SM, of a typical GPU of each architecture
#: (75, 80, 86, 89, 90): lets CI build exactly the configurations those GPUs would run, without them
SMEM_PER_BLOCK, SMEM_PER_SM = _smem_by_arch()


# -- forward ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchConfig:
    """How one ladder step is built and launched for one (GPU, dtype, head dim)."""
    source: str          # .cu file in flashtut/cuda/kernels
    kernel: str          # extern "C" name
    defines: tuple       # sorted (name, value) pairs passed as -D
    block_m: int         # query rows per block
    threads: int         # threads per block
    dynamic_smem: int    # bytes of dynamic shared memory (0: static only)

    @property
    def define_dict(self) -> dict:
        return dict(self.defines)


#: the fast kernel's tile shapes, (warps, keys per K/V tile, 16-row m-tiles per warp), fastest
#: first, as measured on an H200 (book/data/cuda_tiles_h200.json, book/perflog_cuda.md): at D = 128
#: 8 warps of 16 rows with 128-key tiles; at D = 64, 4 warps of 32 rows, so that every K and V
#: fragment read from shared memory feeds two MMAs
V3_TILES = {128: [(8, 128, 1), (8, 64, 1), (4, 64, 1)], 64: [(4, 64, 2), (8, 64, 1), (4, 64, 1)],
            256: [(8, 64, 1), (4, 64, 1)]}

#: steps 4 to 7 are one kernel file, fwd_v4_fa2.cu, built with one more switch per step:
#: variant -> (V4_PIPE, V4_SKIP_RESCALE); see the file's header for what each switch changes
V4_STEPS = {"v4": (0, 0), "v5": (1, 0), "v6": (2, 0), "v7": (2, 1)}
#: FlashAttention-2's shape at every head dim: 4 warps of 32 query rows, 64-key tiles (32-key
#: tiles where 64 do not fit the GPU's shared memory, and before sm_80, where ptxas spills the
#: 64-key tile at D = 128)
V4_WARPS, V4_MT, V4_BLOCK_N = 4, 2, (64, 32)


def v4_smem_bytes(head_dim: int, pipe: int, block_n: int = 64, elem: int = 2) -> int:
    """Q tile (128 rows) + K and V tiles: one of each (``pipe`` 1) or two of each (0 and 2)."""
    bufs = 1 if pipe == 1 else 2
    return (16 * V4_MT * V4_WARPS + 2 * bufs * block_n) * head_dim * elem


def v3_candidates(head_dim: int, arch: int):
    """(warps, block_n, m_tiles, stages) in order of preference: every measured tile shape
    double-buffered first, then single-buffered; before sm_80 there is no cp.async, so a second
    buffer would buy nothing and only single buffers are tried."""
    tiles = V3_TILES.get(head_dim, [(8, 64, 1), (4, 64, 1)])
    stages = (2, 1) if arch >= 80 else (1,)
    return [(w, n, mt, st) for st in stages for (w, n, mt) in tiles]


def v3_smem_bytes(head_dim: int, warps: int, stages: int, block_n: int = 64, elem: int = 2,
                  m_tiles: int = 1) -> int:
    """Q tile (16 rows per m-tile per warp) + ``stages`` K tiles + ``stages`` V tiles, each row
    ``head_dim`` 16-bit values."""
    return (16 * m_tiles * warps + 2 * stages * block_n) * head_dim * elem


def launch_config(variant: str, dtype: torch.dtype, head_dim: int, arch: int, smem_limit: int,
                  warps: int | None = None, block_n: int | None = None,
                  m_tiles: int | None = None) -> LaunchConfig:
    """The build and launch parameters of ``variant`` for this GPU (``arch`` = 75, 80, 90 ...).

    For ``v3``, ``warps``, ``block_n`` (keys per K/V tile) and ``m_tiles`` (16-row tiles per warp)
    override the defaults (8 warps, 64 keys, one m-tile; warps shrunk until the tiles fit
    ``smem_limit``)."""
    base = {**DTYPE_DEFINES[dtype], "HEAD_DIM": head_dim}
    if (warps is not None or block_n is not None or m_tiles is not None) and variant != "v3":
        raise ValueError(f"warps, block_n and m_tiles apply to variant 'v3' only, got variant {variant!r}")
    if variant == "v1":
        return LaunchConfig("fwd_v1_rows.cu", "flash_fwd_v1", tuple(sorted(base.items())), 64, 64, 0)
    if variant == "v2":
        return LaunchConfig("fwd_v2_mma.cu", "flash_fwd_v2", tuple(sorted({**base, "V2_WARPS": 4}.items())),
                            64, 128, 0)
    if variant == "v3":
        if warps is not None and warps not in (1, 2, 4, 8):
            raise ValueError(f"warps must be 1, 2, 4 or 8, got {warps!r}")
        if block_n is not None and block_n not in (16, 32, 64, 128):
            raise ValueError(f"block_n must be 16, 32, 64 or 128, got {block_n!r}")
        if m_tiles is not None and m_tiles not in (1, 2):
            raise ValueError(f"m_tiles must be 1 or 2, got {m_tiles!r}")
        stages = (2, 1) if arch >= 80 else (1,)
        if warps is None and block_n is None and m_tiles is None:
            candidates = v3_candidates(head_dim, arch)
        else:  # an experiment: what is not given keeps the plain defaults (8 or 4 warps, 64 keys, 1 m-tile)
            candidates = [(w, block_n or 64, m_tiles or 1, st) for st in stages
                          for w in ((8, 4) if warps is None else (warps,))]
        for w, bn, mt, st in candidates:
            smem = v3_smem_bytes(head_dim, w, st, bn, m_tiles=mt)
            if smem <= smem_limit:
                d = {**base, "V3_WARPS": w, "V3_STAGES": st, "V3_BLOCK_N": bn}
                if mt != 1:
                    d["V3_MT"] = mt
                return LaunchConfig("fwd_v3_fast.cu", "flash_fwd_v3", tuple(sorted(d.items())),
                                    16 * mt * w, 32 * w, smem)
        raise RuntimeError(f"fwd_v3 with warps={warps}, block_n={block_n}, m_tiles={m_tiles} needs more than "
                           f"the {smem_limit} bytes of shared memory per block this GPU allows at head dim {head_dim}")
    if variant in V4_STEPS:
        pipe, skip = V4_STEPS[variant]
        for bn in (V4_BLOCK_N if arch >= 80 else V4_BLOCK_N[1:]):
            smem = v4_smem_bytes(head_dim, pipe, bn)
            if smem <= smem_limit:
                d = {**base, "V4_PIPE": pipe, "V4_SKIP_RESCALE": skip, "V4_BLOCK_N": bn}
                return LaunchConfig("fwd_v4_fa2.cu", "flash_fwd_v4", tuple(sorted(d.items())),
                                    16 * V4_MT * V4_WARPS, 32 * V4_WARPS, smem)
        raise RuntimeError(f"fwd_v4 ({variant}) needs more than the {smem_limit} bytes of shared memory "
                           f"per block this GPU allows at head dim {head_dim}")
    raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")


def forward_builds(arch: int, smem_limit: int | None = None) -> list[LaunchConfig]:
    """Every (variant, dtype, head dim) build the runtime makes on a GPU of ``arch``."""
    limit = SMEM_PER_BLOCK.get(arch, 48 * 1024) if smem_limit is None else smem_limit
    dtypes = [torch.float16] + ([torch.bfloat16] if arch >= 80 else [])
    return [launch_config(variant, dt, d, arch, limit)
            for variant in VARIANTS for dt in dtypes
            for d in built_dims(variant) + (WIDE_DIMS if variant == "v3" and arch >= 80 else ())]


def register_budget(variant: str, head_dim: int, block_n: int = 64, m_tiles: int = 1) -> dict:
    """32-bit registers per thread that each step's arrays need (what ptxas reports adds
    addresses, loop counters and temporaries on top). The hardware allows 255 per thread.
    ``m_tiles`` (v3): 16-row tiles per warp; every array but the K/V fragments grows with it."""
    if variant == "v1":
        return {"o row (float32)": head_dim, "m, l": 2}
    if variant in ("v2", "v3") or variant in V4_STEPS:
        mt = {"v2": 1, "v3": m_tiles}.get(variant, V4_MT)
        q = ({"Q fragments (2 x 16-bit each)": mt * head_dim // 16 * 4} if mt * head_dim <= 128 and variant not in V4_STEPS
             else {"Q fragments of one k-step (re-read from shared memory)": mt * 4})
        return {
            **q,
            "S accumulators (float32)": mt * block_n // 8 * 4,
            "P fragments (2 x 16-bit each)": mt * block_n // 16 * 4,
            "O accumulators (float32)": mt * head_dim // 8 * 4,
            "m, l for 2 rows": mt * 4,
        }
    raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")


def shared_memory_budget(variant: str, head_dim: int, arch: int, smem_limit: int | None = None) -> dict:
    """Bytes of shared memory per block of ``variant`` on a GPU of ``arch`` and how many blocks
    of it fit on one SM by shared memory alone."""
    limit = SMEM_PER_BLOCK.get(arch, 48 * 1024) if smem_limit is None else smem_limit
    cfg = launch_config(variant, torch.float16, head_dim, arch, limit)
    if variant == "v1":
        bn = 32
        smem = 2 * bn * head_dim * 2 + head_dim * 64 * 2 + bn * 64 * 4
    elif variant == "v2":
        smem = 2 * 64 * head_dim * 2
    else:
        smem = cfg.dynamic_smem
    per_sm = SMEM_PER_SM.get(arch, limit)
    return {"variant": variant, "arch": f"sm_{arch}", "head_dim": head_dim, "threads": cfg.threads,
            "block_m": cfg.block_m, "smem_bytes": smem, "blocks_per_sm_by_smem": per_sm // smem,
            "defines": cfg.define_dict}


# -- backward ---------------------------------------------------------------------------------

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
#: a configuration; :mod:`flashtut.cuda.warp_grid` models which warp owns which tile elements
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


def attention_builds(dtype: torch.dtype, head_dim: int, arch: int, smem_limit: int,
                     deterministic: bool = False) -> dict[str, tuple[str, str, dict]]:
    """What the first ``cuda_attention`` forward and backward compile on an sm_``arch`` GPU with
    ``smem_limit`` bytes per block, at (unpadded) ``head_dim``: step name -> (source, kernel,
    defines); ``"forward"`` then the backward's steps (:func:`kernel_builds`)."""
    d = padded_dim(head_dim)
    fwd = launch_config(fast_variant(d, arch), dtype, d, arch, smem_limit)
    return {"forward": (fwd.source, fwd.kernel, fwd.define_dict),
            **kernel_builds(pick_config(d, arch, smem_limit, deterministic), dtype)}


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


# -- the Hopper forward (chapter 11) ------------------------------------------------------------

#: the rungs of the Hopper ladder that exist, name -> what the rung adds
HOPPER_VARIANTS = {
    "w1": "wgmma for S = Q K^T (both operands from shared memory) and O += P V (P from registers), "
          "two consumer warpgroups of 64 rows, 128-byte swizzled tiles, cp.async double buffer",
    "w2": "W1 fed by TMA (cp.async.bulk.tensor) into a ring of shared-memory stages guarded by mbarriers, "
          "from a producer warpgroup that hands its registers to the consumers (setmaxnreg)",
    "w3": "W2 with the softmax overlapped with the tensor cores: each consumer issues the next tile's Q K^T "
          "before its softmax and P V (two wgmma groups in flight), and the two consumers take turns on the "
          "tensor cores through named barriers (ping-pong)",
    "w4": "W3 made persistent: one block per SM takes query blocks from a counter (causal: the heaviest "
          "first), loading the next one's Q and K/V while its consumers finish the last one",
}
#: W2's (and W3's) register split per thread after setmaxnreg: producer warpgroup, each consumer warpgroup
#: (128 * 24 + 256 * 240 = 64512 of an SM's 65536 32-bit registers)
W2_REGS = {"producer": 24, "consumer": 240}

#: W3 with three consumer warpgroups (``hopper_config(..., consumers=3)``): 192-row blocks of 512
#: threads, no ping-pong (turns in a ring with the c3_turns option), each consumer's registers after
#: setmaxnreg ((65536 - 128 * 24) / 384, rounded down to 8), built for D = 64 only (at D = 128 ptxas
#: spills and serialises the wgmma)
W3_WIDE = {"head_dims": (64,), "regs": 160}

#: head dims the Hopper forward is built for (its tiles are 64-column swizzled blocks)
HOPPER_HEAD_DIMS = (64, 128)

#: the target wgmma needs: the "a" suffix names features of this chip that later ones may lack
HOPPER_ARCH = "90a"


@dataclass(frozen=True)
class HopperConfig:
    """How one Hopper rung is built and launched for one (dtype, head dim)."""
    source: str
    kernel: str
    defines: tuple      # sorted (name, value) pairs passed as -D
    block_m: int        # query rows per block: a consumer warpgroup has 64
    block_n: int        # keys per K/V tile
    threads: int
    dynamic_smem: int   # bytes
    persistent: bool = False   # a rung of PERSISTENT_RUNGS

    @property
    def define_dict(self) -> dict:
        return dict(self.defines)

    @property
    def o_map(self) -> bool:
        """Stores its output with TMA (W3_OPTIONS' tma_store): the launch adds a tensor map of o after V's."""
        return bool(self.define_dict.get(W3_OPTIONS["tma_store"][0]))

    @property
    def heads_first(self) -> bool:
        """Its grid is (B * H, query blocks) instead of (query blocks, B * H) (W3_OPTIONS' heads_first)."""
        return bool(self.define_dict.get(W3_OPTIONS["heads_first"][0]))


def w1_smem_bytes(head_dim: int, block_n: int = 128, block_m: int = 128) -> int:
    """Q tile + two K tiles + two V tiles of 16-bit values, plus 1024 bytes of slack so that the
    tiles can start on the 1024-byte boundary the 128-byte swizzle repeats on."""
    return (block_m + 4 * block_n) * head_dim * 2 + 1024


def w2_smem_bytes(head_dim: int, block_n: int = 128, stages: int = 2, block_m: int = 128) -> int:
    """Q tile + ``stages`` K and V tiles, 1024 bytes of alignment slack and the mbarriers (8 bytes
    each: Q full, and per stage K full, V full and K/V empty)."""
    return (block_m + 2 * stages * block_n) * head_dim * 2 + 1024 + 8 * (1 + 3 * stages)


def w3_smem_bytes(head_dim: int, block_n: int = 128, stages: int = 2, block_m: int = 128) -> int:
    """W2's tiles and alignment slack, and one more mbarrier per stage: W3 releases K and V separately
    (Q full, and per stage K full, V full, K empty, V empty)."""
    return (block_m + 2 * stages * block_n) * head_dim * 2 + 1024 + 8 * (1 + 4 * stages)


#: where pin_anchor's mbarrier ends, in bytes from the first mbarrier at ``stages``: after W4's q_empty and two
#: slots, whichever the rung (W3 leaves those 16 bytes unused), 8 bytes long
def w3_anchor_end(stages: int) -> int:
    return 8 * (3 + 4 * stages) + 8


def w4_smem_bytes(head_dim: int, block_n: int = 128, stages: int = 2, block_m: int = 128) -> int:
    """W3's, one more mbarrier (W4 refills Q for each query block once the consumers release it) and
    two 4-byte slots in which the producer hands the consumers the number of their next query block."""
    return w3_smem_bytes(head_dim, block_n, stages, block_m) + 8 + 8


#: the TMA rungs: variant -> (source, kernel, the prefix of its -D macros, its shared-memory size)
_TMA_RUNGS = {"w2": ("fwd_w2_tma.cu", "flash_fwd_w2", "W2", w2_smem_bytes),
              "w3": ("fwd_w3_pingpong.cu", "flash_fwd_w3", "W3", w3_smem_bytes),
              "w4": ("fwd_w4_persistent.cu", "flash_fwd_w4", "W3", w4_smem_bytes)}
#: the rungs built on W3's consumers, which may have three consumer warpgroups at D = 64
W3_FAMILY = ("w3", "w4")
#: the rungs whose blocks stay resident and take query blocks from a scheduler (grid: at most one block
#: per SM; the launch adds the head count and a counter after the tensor maps)
PERSISTENT_RUNGS = ("w4",)


def check_consumers(variant: str, consumers, head_dim: int | None = None) -> None:
    """ValueError unless rung ``variant`` is built with ``consumers`` consumer warpgroups (at
    ``head_dim``, where given): 2, or 3 for W3 and W4 at the head dims of :data:`W3_WIDE`."""
    if consumers not in (2, 3) or (consumers == 3 and variant not in W3_FAMILY):
        raise ValueError(f"consumers must be 2, or 3 with variant 'w3' or 'w4', got {consumers!r} with {variant!r}")
    if consumers == 3 and head_dim is not None and head_dim not in W3_WIDE["head_dims"]:
        raise ValueError(f"consumers=3 is built for head dim {W3_WIDE['head_dims'][0]} only (at D = 128 "
                         f"each consumer's {W3_WIDE['regs']} registers spill), got D = {head_dim}")


#: the W3 family's build options past its consumers, each measured as one step against W3 (book/perflog_hopper.md):
#: name -> (the -D macro, the accepted values, the first of them the default, the rungs that take it, what it does)
W3_OPTIONS = {
    "exp2_poly": ("FT_EXP2_POLY", tuple(range(9)), W3_FAMILY,
                  "of every 8 exponentials of S, how many a cubic computes on the float32 pipe (ft_exp2_poly) "
                  "instead of the special-function unit"),
    "row_tree": ("FT_ROW_TREE", (False, True), W3_FAMILY,
                 "each tile's row maxima and row sums as trees of pairs instead of chains"),
    "section_order": ("W3_SECTION_ORDER", (False, True), ("w3",),
                      "causal: blocks take query blocks heaviest first across sections of 8 heads (W4's order) "
                      "instead of head by head"),
    "heads_first": ("W3_HEADS_FIRST", (False, True), ("w3",),
                    "the grid is (heads, query blocks), not (query blocks, heads): blocks start in the order "
                    "heaviest query block of every head first (causal), at the cost of L2 reuse of K and V"),
    "tma_store": ("W3_TMA_STORE", (False, True), ("w3",),
                  "each consumer warpgroup writes its output tile into its rows of the Q tile and one TMA copy "
                  "stores it, instead of 4-byte stores from registers"),
    "static_schedule": ("W4_STATIC", (False, True), ("w4",),
                        "persistent block b takes query blocks b, b + grid, ... in the same order, instead of the "
                        "next number of a global counter handed to the consumers through shared memory"),
    "named_handover": ("W4_NAMED_HANDOVER", (False, True), ("w4",),
                       "the counter's number reaches the consumers on two named barriers (the producer warp "
                       "stores it and arrives, the consumers sync, load it and arrive back) instead of with "
                       "q_full's arrival (FlashAttention-3's handshake)"),
    "c3_turns": ("W3_C3_TURNS", (False, True), W3_FAMILY,
                 "three consumers take turns on the tensor cores in a ring 0, 1, 2 (named barriers, as two "
                 "do in ping-pong) instead of issuing whenever ready"),
    "pin_overlap": ("W3_PIN_OVERLAP", (False, True), W3_FAMILY,
                    "the release of K_j's stage moves below the softmax of S_j and reads its row sums, which "
                    "keeps ptxas from placing the wait for the P V in flight above the softmax (without it the "
                    "exponentials run after the P V, not under it)"),
    "pin_anchor": ("W3_PIN_ANCHOR", (False, True), W3_FAMILY,
                   "pin_overlap's pin on an mbarrier of its own that no one waits for, so that K_j's release "
                   "stays right after S_j's wait (24 more bytes of shared memory; synccheck reports its phases, "
                   "which by construction no thread waits for, as a missing wait)"),
    "desc_step": ("FT_DESC_STEP", (False, True), W3_FAMILY,
                  "each tile's wgmma descriptor is built once per product and stepped by adding offsets to "
                  "its address field, instead of masking and shifting every operand's address"),
    "lazy_rescale": ("FT_LAZY_RESCALE", (False, True), W3_FAMILY,
                     "a warp moves its running maxima, and rescales O and l, only when some row's maximum "
                     "grew by more than 8 in log2 units (P stays at most 2^8), instead of at every new maximum"),
    "uniform_wg": ("FT_WG_UNIFORM", (False, True), W3_FAMILY,
                   "the warpgroup index is lane 0's, broadcast by a warp shuffle, which ptxas then knows to be "
                   "the same in every lane: the wgmma descriptors stay in uniform registers instead of being "
                   "moved there (R2UR) before every wgmma"),
    "tail_first": ("FT_TAIL_FIRST", (False, True), ("w3",),
                   "causal: the query block short of rows (Nq not a multiple of the block's rows) is the "
                   "first, rows 0 .. Nq mod rows, instead of the last, so that it reads one key tile, not "
                   "every one with some consumers idle (without a mask nothing changes)"),
}


#: the options of :data:`W3_OPTIONS` for W3 that change only the order of a warpgroup's instructions (or how
#: it computes its wgmma descriptors, or which block computes a query row), not its arithmetic: a build with
#: them gives the same bits as without (the gpu tests check it with torch.equal). W4's schedules and
#: handovers, for W4 alone, do the same.
W3_ORDER_ONLY = ("c3_turns", "pin_overlap", "pin_anchor", "desc_step", "tail_first", "uniform_wg")


def check_w3_options(variant: str, options: dict) -> dict:
    """``options`` (:data:`W3_OPTIONS` names -> values) as -D macros for ``variant``; ValueError naming the
    first unknown option, value of the wrong type or value, or option the rung does not take."""
    defines = {}
    for name, value in options.items():
        if name not in W3_OPTIONS:
            raise ValueError(f"unknown Hopper build option {name!r}; accepted: {', '.join(W3_OPTIONS)}")
        macro, values, rungs, what = W3_OPTIONS[name]
        kind = type(values[-1])
        if type(value) is not kind or value not in values:
            raise ValueError(f"{name} ({what}) takes {'an int from 0 to 8' if kind is int else 'a bool'}, "
                             f"got {value!r}")
        if value != values[0]:
            if variant not in rungs:
                raise ValueError(f"{name} is built for variant {' or '.join(map(repr, rungs))} only, got {variant!r}")
            defines[macro] = int(value)
    return defines


def hopper_config(variant: str, dtype: torch.dtype, head_dim: int, block_n: int = 128,
                  pv_split: bool = True, stages: int = 2, consumers: int = 2, **options) -> HopperConfig:
    """Build and launch parameters of Hopper rung ``variant``. ``block_n`` (64 or 128): keys per tile,
    the N of the S = Q K^T wgmma. ``pv_split`` (D = 128 only): O += P V as two 64-column wgmma per
    16 keys instead of one 128-column wgmma (whose descriptor needs the leading-dimension offset);
    W2 and W3 always split. ``stages`` (W2 and W3, 2 to 4): K/V stages in their ring.
    ``consumers`` (W3 and W4): consumer warpgroups of 64 rows, 2 (ping-pong) or 3 (192-row blocks,
    FlashAttention-3's shape at head dim 64: :data:`W3_WIDE`; turns in a ring only with ``c3_turns``).
    ``options``: the W3 family's further build options, :data:`W3_OPTIONS` (``exp2_poly``, ``row_tree``,
    ``section_order``, ``heads_first``, ``tma_store``, ``static_schedule``, ``named_handover``, ``c3_turns``,
    ``pin_overlap``, ``pin_anchor``, ``desc_step``, ``lazy_rescale``, ``uniform_wg``, ``tail_first``), each off
    by default."""
    if variant not in HOPPER_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(HOPPER_VARIANTS)}, got {variant!r}")
    if dtype not in DTYPE_DEFINES:
        raise ValueError(f"dtype must be float16 or bfloat16, got {dtype}")
    if head_dim not in HOPPER_HEAD_DIMS:
        raise ValueError(f"head dim D = {head_dim} is not supported; accepted: {', '.join(map(str, HOPPER_HEAD_DIMS))}")
    if block_n not in (64, 128):
        raise ValueError(f"block_n must be 64 or 128, got {block_n!r}")
    check_consumers(variant, consumers, head_dim)
    extra = check_w3_options(variant, options)
    if options.get("pin_overlap") and options.get("pin_anchor"):
        raise ValueError("pin_overlap and pin_anchor are two pins of the same softmax; choose one")
    if options.get("named_handover") and options.get("static_schedule"):
        raise ValueError("named_handover hands over the counter's number, which static_schedule does not have; "
                         "choose one")
    if options.get("tail_first") and options.get("tma_store"):
        raise ValueError("tail_first's first query block may end inside a consumer's 64 rows, which tma_store "
                         "writes as one box over the next block's rows; choose one")
    if options.get("c3_turns") and consumers != 3:
        raise ValueError(f"c3_turns ({W3_OPTIONS['c3_turns'][3]}) needs consumers=3; two consumers always "
                         f"take turns, got consumers={consumers}")
    if variant in _TMA_RUNGS:
        source, kernel, prefix, smem = _TMA_RUNGS[variant]
        if not pv_split:
            raise ValueError(f"pv_split=False is a W1 variant; {prefix} always splits P V into 64-column wgmma")
        if stages not in (2, 3, 4):
            raise ValueError(f"stages must be 2, 3 or 4, got {stages!r}")
        d = {**DTYPE_DEFINES[dtype], "HEAD_DIM": head_dim, f"{prefix}_BLOCK_N": block_n, f"{prefix}_STAGES": stages}
        if consumers != 2:
            d["W3_CONSUMERS"] = consumers
        d.update(extra)
        size = smem(head_dim, block_n, stages, block_m=64 * consumers)
        if options.get("pin_anchor"):   # room up to the anchor's end: 24 bytes more for W3, 8 for W4
            from_first_barrier = size - w3_smem_bytes(head_dim, block_n, stages, 64 * consumers) + 8 * (1 + 4 * stages)
            size += w3_anchor_end(stages) - from_first_barrier
        return HopperConfig(source, kernel, tuple(sorted(d.items())), 64 * consumers, block_n,
                            128 * (1 + consumers), size, variant in PERSISTENT_RUNGS)
    if stages != 2:
        raise ValueError(f"stages applies to W2 and W3 only (W1 double-buffers), got {stages!r}")
    d = {**DTYPE_DEFINES[dtype], "HEAD_DIM": head_dim, "W1_BLOCK_N": block_n, "W1_PV_SPLIT": int(bool(pv_split))}
    return HopperConfig("fwd_w1_wgmma.cu", "flash_fwd_w1", tuple(sorted(d.items())), 128, block_n, 256,
                        w1_smem_bytes(head_dim, block_n))


def hopper_builds() -> list[HopperConfig]:
    """Every build the Hopper forward makes at its defaults (the CPU tests compile exactly these)."""
    return ([hopper_config(v, dt, d) for v in HOPPER_VARIANTS for dt in DTYPES for d in HOPPER_HEAD_DIMS]
            + [hopper_config(v, dt, d, consumers=3) for v in W3_FAMILY for dt in DTYPES for d in W3_WIDE["head_dims"]])


# -- which forward cuda_attention runs ------------------------------------------------------------

#: the Hopper rung ``cuda_attention`` runs on sm_90: W3, the fastest measured at every protocol case
#: (book/perflog_hopper.md). W4, W3 with persistent blocks, is faster at N = 4096 without a causal mask
#: and slower at N = 16384 (hopper_w4_h200.json), so it is not the default.
HOPPER_DEFAULT = "w3"
#: its consumer warpgroups per head dim, the faster measured: at D = 64 three (without turns 1.45-1.64x SDPA
#: flash, two-consumer W3 1.33-1.44x in the same run), at D = 128 two with ping-pong
HOPPER_CONSUMERS = {64: 3, 128: 2}
#: its further build options per head dim (:data:`W3_OPTIONS`), those measured faster than W3 without them
#: in every case of the same process: at D = 128 the TMA store of the output (+0.6 to +5.2% over W3 in the
#: 8 protocol cases, book/data/hopper_options_h200.json; at D = 64 with three consumers it lost in all 8,
#: -0.6 to -10%); at D = 64 the three consumers' turns (+1.0 to +7.7%, hopper_turns_h200.json); W4's
#: causal order, the exponentials on the float32 pipe, the row trees (hopper_softmax_h200.json) and the
#: grid with heads first (hopper_heads_h200.json) lost at both head dims. Options worth a percent or two,
#: less than one timing moves between runs, are timed in alternated rounds (bench.hopper_ab --pair) and
#: kept where no case's median falls below -1.5%, the spread that method measures between two builds
#: doing the same work, and some case's rises above +1.5%: at D = 64 the warpgroup index known uniform
#: (-0.6 to +1.8%, hopper_pair_uni_d64_h200.json) and the short query block first (-0.7 to +2.6%, +2.2
#: and +2.6% at N = 4096 causal, hopper_pair_tail_d64_h200.json); at D = 128 the uniform index fell to
#: -2.1% (hopper_pair_uni_d128_h200.json)
HOPPER_OPTIONS = {64: {"c3_turns": True, "tail_first": True, "uniform_wg": True}, 128: {"tma_store": True}}

#: the forward kernels ``cuda_attention(..., forward_kernel=...)`` chooses between, name -> what it runs
FORWARD_KERNELS = {
    "auto": "wgmma where it runs (sm_90, a head dim that pads to 64 or 128, an NVRTC that targets sm_90a), "
            "mma.sync everywhere else",
    "mma": "the mma.sync ladder's fast step (fast_variant), on every GPU from sm_75",
    "wgmma": f"the Hopper forward, rung {HOPPER_DEFAULT.upper()} of chapter 11 (sm_90 only; an error "
             "anywhere else)",
}
#: the first NVRTC release that compiles for the sm_90a target (wgmma)
HOPPER_NVRTC = (12, 0)


class ForwardChoice(NamedTuple):
    """The forward one ``cuda_attention`` call runs: ``kernel`` ``"mma"`` or ``"wgmma"``, ``variant``
    the ladder step (a :data:`VARIANTS` or :data:`HOPPER_VARIANTS` key), ``reason`` why, and for
    wgmma its ``consumers`` (consumer warpgroups, :data:`HOPPER_CONSUMERS`) and ``options``, the sorted
    (name, value) pairs of :data:`HOPPER_OPTIONS`."""
    kernel: str
    variant: str
    reason: str
    consumers: int = 2
    options: tuple = ()


def check_forward_kernel(forward_kernel) -> str:
    """``forward_kernel`` itself, or the ValueError (TypeError for a non-string) that names it."""
    if not isinstance(forward_kernel, str):
        raise TypeError(f"forward_kernel must be a str, one of {', '.join(map(repr, FORWARD_KERNELS))}; "
                        f"got {type(forward_kernel).__name__}")
    if forward_kernel not in FORWARD_KERNELS:
        raise ValueError(f"forward_kernel must be one of {', '.join(map(repr, FORWARD_KERNELS))}, "
                         f"got {forward_kernel!r}")
    return forward_kernel


def choose_forward(forward_kernel: str, arch: int, dtype: torch.dtype, head_dim: int,
                   nvrtc_version: tuple[int, int] | None) -> ForwardChoice:
    """Which forward runs for a (padded) ``head_dim`` and ``dtype`` on a GPU of ``arch`` (75, 90 ...)
    whose NVRTC is ``nvrtc_version`` (``(major, minor)``; None: unknown, as good as too old).

    ``"auto"`` takes wgmma (rung :data:`HOPPER_DEFAULT` with :data:`HOPPER_CONSUMERS`) wherever it supports the case and falls
    back to mma.sync otherwise; ``"wgmma"`` raises where it cannot run: ``ValueError`` for a head
    dim or dtype the Hopper rungs are not built for, ``RuntimeError`` for a GPU other than sm_90 or an NVRTC too old for sm_90a."""
    check_forward_kernel(forward_kernel)
    mma = ForwardChoice("mma", fast_variant(head_dim, arch), "")
    if forward_kernel == "mma":
        return mma._replace(reason="asked for")
    why_not = None
    if arch != 90:
        why_not = (RuntimeError, f"wgmma exists on sm_90 GPUs only (H100, H200); this GPU is sm_{arch}")
    elif dtype not in DTYPE_DEFINES:
        why_not = (ValueError, f"the wgmma forward is built for float16 and bfloat16, got {dtype}")
    elif head_dim not in HOPPER_HEAD_DIMS:
        why_not = (ValueError, f"the wgmma forward is built for head dims {' and '.join(map(str, HOPPER_HEAD_DIMS))} "
                               f"(the mma.sync path pads this one to D = {head_dim})")
    elif nvrtc_version is None or tuple(nvrtc_version) < HOPPER_NVRTC:
        why_not = (RuntimeError, f"NVRTC {nvrtc_version or 'of unknown version'} cannot target sm_90a (wgmma) "
                                 f"before {HOPPER_NVRTC[0]}.{HOPPER_NVRTC[1]}; install a CuPy for CUDA 12 or 13 "
                                 "(pip install cupy-cuda12x)")
    if why_not is None:
        return ForwardChoice("wgmma", HOPPER_DEFAULT, "sm_90 with an NVRTC that targets sm_90a",
                             HOPPER_CONSUMERS[head_dim], tuple(sorted(HOPPER_OPTIONS[head_dim].items())))
    if forward_kernel == "wgmma":
        error, message = why_not
        raise error(f"forward_kernel='wgmma': {message}; accepted elsewhere: forward_kernel='mma' or 'auto'")
    return mma._replace(reason=why_not[1])

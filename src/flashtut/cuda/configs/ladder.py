"""The mma.sync forward ladder (chapter 08): its steps, the step ``cuda_attention`` runs per head dim,
and each step's build and launch (:func:`launch_config`), register and shared-memory budgets."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .limits import DTYPE_DEFINES, HEAD_DIMS, SMEM_PER_BLOCK, SMEM_PER_SM, WIDE_DIMS

__all__ = ["VARIANTS", "FAST_VARIANTS", "fast_variant", "FAST_STEPS", "LADDER_DIMS", "built_dims",
           "padded_dim", "LaunchConfig", "V3_TILES", "V4_STEPS", "v4_smem_bytes", "v3_candidates",
           "v3_smem_bytes", "launch_config", "forward_builds", "register_budget", "shared_memory_budget"]


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

#: the variant ``cuda_attention`` uses, per (padded) head dim, from sm_80 (the fastest step at each head dim
#: in book/perflog_cuda.md); before sm_80 (a T4) step 3 everywhere; D = 32, not measured, takes step 3
FAST_VARIANTS = {64: "v3", 96: "v5", 128: "v5", 256: "v3"}


def fast_variant(head_dim: int, arch: int) -> str:
    """The forward ``cuda_attention`` runs at this padded head dim on a GPU of ``arch`` (75, 90 ...)."""
    return FAST_VARIANTS.get(head_dim, "v3") if arch >= 80 else "v3"

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
#: first, as measured on an H200 (experiments/cuda_ladder/data/cuda_tiles_h200.json, book/perflog_cuda.md):
#: at D = 128 8 warps of 16 rows with 128-key tiles; at D = 64, 4 warps of 32 rows, so that every K
#: and V fragment read from shared memory feeds two MMAs
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

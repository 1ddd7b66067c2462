"""Run any step of the CUDA forward ladder on torch tensors: ``forward(q, k, v, variant="v3")``.

Each step is one ``.cu`` file; this module picks its launch configuration (tile sizes that
fit the GPU's shared memory), checks the inputs and launches it on torch's current stream.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..checks import check_mask, check_qkv, check_scale, diag_offset
from . import VARIANTS
from .compile import (DTYPE_DEFINES, HEAD_DIMS, SMEM_PER_BLOCK, SMEM_PER_SM, capability, get_function,
                      launch, max_smem_per_block, set_max_dynamic_smem)

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class LaunchConfig:
    """How one ladder step is built and launched for one (GPU, dtype, head dim)."""
    source: str          # .cu file in flashtut/cuda
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
V3_TILES = {128: [(8, 128, 1), (8, 64, 1), (4, 64, 1)], 64: [(4, 64, 2), (8, 64, 1), (4, 64, 1)]}


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
    raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")


def check_gpu_support(x: torch.Tensor, what: str) -> int:
    """The device checks every CUDA entry point shares (forward and backward): a GPU, ``x`` on it,
    sm_75 or newer (tensor-core mma and ldmatrix), bfloat16 only from sm_80. Returns the GPU's
    architecture as an int (75, 80, 90, ...)."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU and torch sees none; run on a GPU machine "
                           "(Colab: Runtime > Change runtime type > GPU), or use "
                           "flashtut.tiled_attention on the CPU")
    if not x.is_cuda:
        raise ValueError(f"the tensors must be CUDA tensors for {what}, got device {x.device}; "
                         f"accepted: a cuda device (move them with .cuda())")
    major, minor = capability(x.device)
    if major < 7 or (major == 7 and minor < 5):
        raise RuntimeError(f"{what} needs sm_75 or newer (tensor-core mma and ldmatrix); "
                           f"this GPU is sm_{major}{minor}")
    if x.dtype == torch.bfloat16 and major < 8:
        raise RuntimeError(f"bfloat16 needs sm_80 or newer (A100, L4, H100 ...); this GPU is "
                           f"sm_{major}{minor} (a T4 is sm_75): use float16")
    return major * 10 + minor


def check_cuda_inputs(q, k, v):
    """The checks every CUDA kernel entry shares; returns ``(B, H, Nq, Nk, D)``. ``k`` and ``v``
    may have fewer heads than ``q`` (grouped-query: ``H % Hkv == 0``)."""
    B, H, Nq, Nk, D = check_qkv(q, k, v, gqa=True)
    # what is missing from the environment is said first (a CPU-only reader learns that a GPU is
    # needed before being told about head dims)
    check_gpu_support(q, "the CUDA forward kernels")
    if q.dtype not in DTYPE_DEFINES:
        raise ValueError(f"q has dtype {str(q.dtype).replace('torch.', '')}; the CUDA kernels accept "
                         f"float16 or bfloat16")
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim D = {D} is not supported by the CUDA kernels; accepted: "
                         f"{', '.join(map(str, HEAD_DIMS))}")
    if B * H > 65535:
        raise ValueError(f"B * H = {B * H} exceeds the 65535 blocks of grid.y; accepted: B * H <= 65535")
    return B, H, Nq, Nk, D


def prepare(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, with a 16-byte aligned start (the kernels load 16-byte vectors)."""
    t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


#: the ladder step that takes grouped-query heads and the bottom-right alignment
REAL_MODEL_VARIANTS = ("v3",)


def check_mask_support(q, k, causal, window, variant: str = "v3"):
    """``(kv_group, diag_offset, causal)`` for the kernels: ``causal`` as an int, the query heads
    per K/V head and the diagonal offset (query ``i`` sees key ``j <= i + diag_offset``)."""
    alignment, window = check_mask(causal, window)
    if window is not None:
        raise ValueError(f"window={window} is not supported by the CUDA kernels; accepted: None "
                         "(flashtut.triton_attention and tiled_attention take windows)")
    kv_group = q.shape[1] // k.shape[1]
    off = diag_offset(alignment, q.shape[2], k.shape[2])
    if (kv_group != 1 or off != 0) and variant not in REAL_MODEL_VARIANTS:
        raise ValueError(f"variant {variant!r} takes k and v with q's heads and top-left causal only; "
                         f"accepted for grouped-query heads or causal='bottom-right': {REAL_MODEL_VARIANTS}")
    return kv_group, off, alignment is not None


def forward(q, k, v, causal=False, scale: float | None = None, variant: str = "v3", *,
            warps: int | None = None, block_n: int | None = None, m_tiles: int | None = None):
    """Run ladder step ``variant`` (see ``flashtut.cuda.VARIANTS``); returns ``(o, lse)`` with
    ``lse`` the natural-log log-sum-exp, float32, shape ``(B, H, Nq)``. ``warps``, ``block_n``
    and ``m_tiles`` override the fast kernel's tile sizes (see :func:`launch_config`), for
    experiments. The fast step (``v3``) also takes grouped-query heads and
    ``causal="bottom-right"``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    D = check_cuda_inputs(q, k, v)[-1]
    kv_group, off, causal = check_mask_support(q, k, causal, None, variant)
    scale = check_scale(scale, D)
    return run(prepare(q), prepare(k), prepare(v), causal, scale, variant, warps, block_n, m_tiles,
               kv_group=kv_group, diag_offset=off)


@functools.lru_cache(maxsize=None)
def _plan(variant: str, dtype: torch.dtype, head_dim: int, device_index: int, warps, block_n, m_tiles):
    # the launch configuration and the compiled kernel of one (step, dtype, D, GPU): worked out on
    # the first call and reused, so a call costs the launch and not the planning
    major, minor = capability(device_index)
    cfg = launch_config(variant, dtype, head_dim, 10 * major + minor, max_smem_per_block(device_index),
                        warps=warps, block_n=block_n, m_tiles=m_tiles)
    fn = get_function(cfg.source, cfg.kernel, cfg.define_dict)
    if cfg.dynamic_smem:
        set_max_dynamic_smem(fn, cfg.dynamic_smem)
    return cfg, fn


def run(q, k, v, causal: bool, scale: float, variant: str = "v3", warps: int | None = None,
        block_n: int | None = None, m_tiles: int | None = None, *, kv_group: int = 1,
        diag_offset: int = 0):
    """:func:`forward` without its checks, for callers that made them already (``cuda_attention``):
    ``q, k, v`` checked and :func:`prepare`-d, ``causal`` a bool, ``scale`` a float; ``kv_group``
    and ``diag_offset`` as :func:`check_mask_support` returns them (``v3`` only)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    with torch.cuda.device(q.device):
        cfg, fn = _plan(variant, q.dtype, D, q.device.index, warps, block_n, m_tiles)
        o = torch.empty_like(q)
        lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
        grid = (math.ceil(Nq / cfg.block_m), B * H, 1)
        args = (q, k, v, o, lse, Nq, Nk, scale * LOG2E, int(causal))
        if variant in REAL_MODEL_VARIANTS:
            args += (kv_group, diag_offset)
        launch(fn, grid, (cfg.threads, 1, 1), args, cfg.dynamic_smem)
    return o, lse


def attention_flops(B: int, H: int, Nq: int, Nk: int, D: int, causal: bool) -> float:
    """Forward FLOPs as the book counts them: 4 B H Nq Nk D, halved when causal (Nq = Nk)."""
    f = 4.0 * B * H * Nq * Nk * D
    return f / 2 if causal else f


#: opt-in shared memory per block of a typical GPU of each architecture (``compile.SMEM_PER_BLOCK``)
REFERENCE_SMEM = SMEM_PER_BLOCK


def runtime_builds(arch: int, smem_limit: int | None = None) -> list[LaunchConfig]:
    """Every (variant, dtype, head dim) build the runtime makes on a GPU of ``arch``."""
    limit = REFERENCE_SMEM.get(arch, 48 * 1024) if smem_limit is None else smem_limit
    dtypes = [torch.float16] + ([torch.bfloat16] if arch >= 80 else [])
    return [launch_config(variant, dt, d, arch, limit)
            for variant in VARIANTS for dt in dtypes for d in HEAD_DIMS]


def time_ms(fn) -> float:
    """Median milliseconds of ``fn()`` on the GPU, with the benchmark's timer
    (``flashtut.bench.timing.time_fn``: ``triton.testing.do_bench``, else CUDA events)."""
    from ..bench.timing import time_fn

    return time_fn(fn, "cuda")


def ladder_tflops(N: int = 2048, D: int = 128, H: int = 16, B: int = 1, dtype=torch.float16,
                  causal: bool = False, variants=None) -> dict:
    """Forward TFLOP/s of each ladder step (and naive attention) on this GPU, on random inputs,
    each checked against naive attention first. Returns ``{name: TFLOP/s}``."""
    from ..reference import naive_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    flops = attention_flops(B, H, N, N, D, causal)
    ref = naive_attention(q, k, v, causal=causal)
    out = {"naive": flops / time_ms(lambda: naive_attention(q, k, v, causal=causal)) / 1e9}
    for name in variants or VARIANTS:
        o, _ = forward(q, k, v, causal=causal, variant=name)
        err = (o.float() - ref.float()).abs().max().item()
        if not err < 0.05:
            raise RuntimeError(f"cuda {name} differs from naive attention by {err:.3g}; not timing it")
        out[f"cuda-{name}"] = flops / time_ms(lambda: forward(q, k, v, causal=causal, variant=name)) / 1e9
    return out


def register_budget(variant: str, head_dim: int, block_n: int = 64, m_tiles: int = 1) -> dict:
    """32-bit registers per thread that each step's arrays need (what ptxas reports adds
    addresses, loop counters and temporaries on top). The hardware allows 255 per thread.
    ``m_tiles`` (v3): 16-row tiles per warp; every array but the K/V fragments grows with it."""
    if variant == "v1":
        return {"o row (float32)": head_dim, "m, l": 2}
    if variant in ("v2", "v3"):
        mt = m_tiles if variant == "v3" else 1
        q = ({"Q fragments (2 x 16-bit each)": mt * head_dim // 16 * 4} if mt * head_dim <= 128
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
    limit = REFERENCE_SMEM.get(arch, 48 * 1024) if smem_limit is None else smem_limit
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

"""Attention in CUDA C, compiled at run time with NVRTC through CuPy and launched on torch's stream.

The kernels are ``.cu`` files in this folder, one readable kernel per step of the forward
ladder (:data:`VARIANTS`), plus the backward kernel. ``compile`` builds and launches them,
``forward`` runs any ladder step, ``attention.cuda_attention`` is the autograd entry point
(fast forward, backward with recomputation). Importing this package needs neither a GPU nor
CuPy; calling a kernel needs both.
"""
from __future__ import annotations

#: the forward ladder, in order: variant name -> what that step adds (the benchmark discovers
#: the ladder from this dict; ``flashtut.cuda.forward.forward(..., variant=name)`` runs a step)
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
#: book/perflog_cuda.md, "Steps 4 to 7"); before sm_80 (a T4) step 3 everywhere
FAST_VARIANTS = {64: "v3", 128: "v5", 256: "v3"}


def fast_variant(head_dim: int, arch: int) -> str:
    """The forward ``cuda_attention`` runs at this padded head dim on a GPU of ``arch`` (75, 90 ...)."""
    return FAST_VARIANTS.get(head_dim, "v3") if arch >= 80 else "v3"


__all__ = ["VARIANTS", "FAST_VARIANTS", "fast_variant"]

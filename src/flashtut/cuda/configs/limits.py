"""What every CUDA kernel shares: its element types, the head dims it is built for, and the shared memory
of the GPUs it is built for (no GPU needed)."""
from __future__ import annotations

import torch

from ...hardware import GPUS

__all__ = ["DTYPE_DEFINES", "DTYPES", "HEAD_DIMS", "WIDE_DIMS", "EXPERIMENT_DIMS", "SMEM_PER_BLOCK",
           "SMEM_PER_SM"]


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

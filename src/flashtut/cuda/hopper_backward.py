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
* ``"b3"``: each consumer stages its 64 x 64 dQ tile in shared memory and one thread adds
  it into the buffer with a TMA reduce-add (``cp.reduce.async.bulk.tensor``), as FlashAttention-3 does;
* ``"b4"``: the dQ product issued before dV and dK, so that its store overlaps them.

The default (``DEFAULT_RUNG``) is the fastest measured per head dim: b4 at D = 128, b3 at D = 64 (where b4
measured the same or up to 3% slower; experiments/hopper_backward/README.md). ``cuda_attention`` takes this
backward on sm_90 wherever ``configs.kernel_plan`` names a rung and :func:`fits` takes the sizes.

Passes: ``bwdh_preprocess`` (Delta = rowsum(dO O) and lse in base 2, rows padded per head to the query
block), the main kernel, then ``bwd_dq_convert.cu`` (dQ times the scale, to the input type).
``deterministic=True`` keeps the Hopper kernel for dK and dV (rung b2 built without dQ) and takes dQ from the
mma.sync backward's separate dQ pass (``bwd_dq.cu``), which adds in a fixed order.
Head dims 64 and 128, float16 and bfloat16, causal (both alignments), sliding windows, grouped-query heads.
"""
from __future__ import annotations

import torch

from ..checks import check_mask
from .attention import prepare_inputs
from .compile import capability
from .hopper_backward_launch import (BLOCK_N, DEFAULT_RUNG, DETERMINISTIC_RUNG, HEAD_DIMS, RUNGS, SOURCE,
                                     HopperBackwardConfig, builds, check_config, dq_tensor_map,
                                     fits, run_hopper_backward)

__all__ = ["BLOCK_N", "DEFAULT_RUNG", "DETERMINISTIC_RUNG", "HEAD_DIMS", "RUNGS", "SOURCE", "HopperBackwardConfig",
           "builds", "check_config", "dq_tensor_map", "fits", "hopper_backward", "run_hopper_backward"]


def hopper_backward(q, k, v, o, lse, do, causal=False, scale: float | None = None, window: int | None = None,
                    *, rung: str | None = None, stages: int = 2, deterministic: bool = False):
    """``(dq, dk, dv)`` of ``o = softmax(q k^T * scale) v`` on an sm_90 GPU (H100, H200) with wgmma.

    ``q``, ``o``, ``do``: ``(B, H, Nq, D)``; ``k``, ``v``: ``(B, Hkv, Nk, D)`` with ``H % Hkv == 0``; CUDA
    float16 or bfloat16, D 64 or 128; ``lse``: the forward's natural-log log-sum-exp ``(B, H, Nq)``.
    ``causal``: ``False``, ``True``/``"top-left"`` or ``"bottom-right"``; ``window`` (with causal): query
    ``i`` sees key ``j`` iff ``i + off - window < j <= i + off``. ``rung``: ``"b1"`` to ``"b4"``
    (module doc), None for ``DEFAULT_RUNG``; ``stages``: the TMA rungs' ring. ``deterministic``: dQ from the separate mma.sync pass (the same bits
    every run) instead of float32 atomics. Returns gradients in the input dtype, shaped like the inputs.
    """
    check_config(DETERMINISTIC_RUNG if rung is None else rung, stages)   # the default rungs take any stages
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
    Hkv = k.shape[1]
    if B * Hkv > 65535:
        raise ValueError(f"B * Hkv = {B * Hkv} exceeds the 65535 blocks of grid.y; accepted: at most 65535")
    return run_hopper_backward(q, k, v, o, do=do, lse=p.lse, causal=p.causal, scale=p.scale,
                               diag_offset=p.diag_offset, window=window, rung=rung, stages=stages,
                               deterministic=deterministic)

"""``cuda_attention``: the fast CUDA forward and the CUDA backward behind one autograd Function.

The forward saves only ``q, k, v, o`` and the log-sum-exp ``lse`` (B*H*Nq floats); the
backward (``flashtut.cuda.backward``) recomputes the probabilities from them instead of
storing the Nq x Nk matrix.
"""
from __future__ import annotations

import torch

from ..checks import check_mask, check_scale
from . import FAST_VARIANT
from .forward import check_cuda_inputs, check_mask_support, prepare, run


def _backward_module():
    try:
        from . import backward
    except ImportError as exc:
        raise RuntimeError("the CUDA backward kernel (flashtut.cuda.backward) is not available in this "
                           f"installation: {exc}") from exc
    return backward


class CudaAttention(torch.autograd.Function):
    """Autograd wrapper: ``forward`` runs ``fwd_v3_fast.cu``, ``backward`` the CUDA backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale: float):
        # checked once, in cuda_attention; causal is "top-left", "bottom-right" or False here
        kv_group, off, is_causal = check_mask_support(q, k, causal, None)
        o, lse = run(q, k, v, is_causal, scale, FAST_VARIANT, kv_group=kv_group, diag_offset=off)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward_module().backward(q, k, v, o, lse, prepare(do), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def cuda_attention(q, k, v, causal=False, scale: float | None = None, window: int | None = None):
    """Fused CUDA attention; CUDA float16 tensors, bfloat16 from sm_80, D in {64, 128}.

    Returns ``o`` with the shape and dtype of ``q``; ``o.backward(...)`` runs the CUDA backward.
    ``k``/``v`` may have fewer heads than ``q`` (grouped-query); ``causal`` is ``False``,
    ``True``/``"top-left"`` or ``"bottom-right"``. ``window`` is not supported here (a
    ``ValueError``; the Triton kernels have it).
    """
    alignment = check_mask(causal, window)[0] or False     # argument errors before the GPU check
    D = check_cuda_inputs(q, k, v)[-1]
    check_mask_support(q, k, causal, window)
    scale = check_scale(scale, D)
    return CudaAttention.apply(prepare(q), prepare(k), prepare(v), alignment, scale)

"""``cuda_attention``: the fast CUDA forward and the CUDA backward behind one autograd Function.

The forward saves only ``q, k, v, o`` and the log-sum-exp ``lse`` (B*H*Nq floats); the
backward (``flashtut.cuda.backward``) recomputes the probabilities from them instead of
storing the Nq x Nk matrix.
"""
from __future__ import annotations

import torch

from ..checks import check_causal, check_scale
from . import FAST_VARIANT
from .forward import check_cuda_inputs, prepare, run


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
    def forward(ctx, q, k, v, causal: bool, scale: float):
        o, lse = run(q, k, v, causal, scale, FAST_VARIANT)     # checked once, in cuda_attention
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward_module().backward(q, k, v, o, lse, prepare(do), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def cuda_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """Fused CUDA attention (see API.md); CUDA float16 tensors, bfloat16 from sm_80, D in {64, 128}.

    Returns ``o`` with the shape and dtype of ``q``; ``o.backward(...)`` runs the CUDA backward.
    """
    causal = check_causal(causal)
    D = check_cuda_inputs(q, k, v)[-1]
    scale = check_scale(scale, D)
    return CudaAttention.apply(prepare(q), prepare(k), prepare(v), causal, scale)

"""``cuda_attention``: the fast CUDA forward and the CUDA backward behind one autograd Function.

The forward saves only ``q, k, v, o`` and the log-sum-exp ``lse`` (B*H*Nq floats); the
backward (``flashtut.cuda.backward``) recomputes the probabilities from them instead of
storing the Nq x Nk matrix.
"""
from __future__ import annotations

import torch

from ..checks import check_causal, check_scale
from . import fast_variant
from .compile import capability
from .forward import check_cuda_inputs, pad_head_dim, padded_dim, prepare, run


def _backward_module():
    try:
        from . import backward
    except ImportError as exc:
        raise RuntimeError("the CUDA backward kernel (flashtut.cuda.backward) is not available in this "
                           f"installation: {exc}") from exc
    return backward


class CudaAttention(torch.autograd.Function):
    """Autograd wrapper: ``forward`` runs the fast forward (:func:`flashtut.cuda.fast_variant`),
    ``backward`` the CUDA backward. Head dims that are not built are zero-padded on the way in and
    cut on the way out; what is saved is the padded tensors."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, deterministic: bool):
        D = q.shape[-1]
        pd = padded_dim(D)
        if pd != D:
            q, k, v = (prepare(pad_head_dim(x, pd)) for x in (q, k, v))
        major, minor = capability(q.device)
        o, lse = run(q, k, v, causal, scale, fast_variant(pd, 10 * major + minor))  # checked in cuda_attention
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.deterministic, ctx.head_dim = causal, scale, deterministic, D
        return o if pd == D else o[..., :D].contiguous()

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        D = ctx.head_dim
        dq, dk, dv = _backward_module().backward(q, k, v, o, lse, prepare(pad_head_dim(do, q.shape[-1])),
                                                 ctx.causal, ctx.scale, deterministic=ctx.deterministic)
        if q.shape[-1] != D:
            dq, dk, dv = (g[..., :D] for g in (dq, dk, dv))
        return dq, dk, dv, None, None, None


def cuda_attention(q, k, v, causal: bool = False, scale: float | None = None, *, deterministic: bool = False):
    """Fused CUDA attention (see API.md); CUDA float16 tensors, bfloat16 from sm_80; D any multiple
    of 8 up to 128 (padded to 64 or 128 inside), or 256 (forward only).

    Returns ``o`` with the shape and dtype of ``q``; ``o.backward(...)`` runs the CUDA backward, which
    adds dQ with float32 atomics from sm_80 (the order of the additions varies, so the last bits of
    dQ may differ between runs); ``deterministic=True`` takes the separate dQ pass instead
    (bit-identical every run; on an H200 the backward takes 14% (D = 64) to 26% (D = 128) longer).
    """
    causal = check_causal(causal)
    D = check_cuda_inputs(q, k, v)[-1]
    scale = check_scale(scale, D)
    return CudaAttention.apply(prepare(q), prepare(k), prepare(v), causal, scale, bool(deterministic))

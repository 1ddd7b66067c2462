"""FlexAttention's semantics on the dense score matrix: the reference, and the CPU fallback.

``flex_reference(q, k, v, score_mod, block_mask)`` computes what ``flashtut.flex_attention`` (and
PyTorch's ``torch.nn.attention.flex_attention``) computes, with the ``(B, H, Nq, Nk)`` matrices
in memory: scores ``scale * q k^T`` in float32 (float64 for float64 inputs), ``score_mod`` applied
to every score, the block mask's ``mask_mod`` evaluated at every position (hidden scores become
``-inf``), the softmax, ``P @ V``. A query row that sees no key has output 0 and log-sum-exp
``-inf``, and its gradients are finite (zeros). Autograd works through it, into tensors the mods
capture too (a learned bias gets its gradient).
"""
from __future__ import annotations

import torch

from .block_mask import (BlockMask, check_mod_requirements, check_score_mod, evaluate_mask, index_grids)
from .checks import accum_dtype, check_qkv, check_scale


def check_flex_inputs(q, k, v, score_mod, block_mask, scale):
    """Shapes (grouped-query heads allowed), the mod's signature and sizes, the block mask's sizes
    (its lists move to q's device where they are used). Returns ``(B, H, Nq, Nk, D, scale)``."""
    B, H, Nq, Nk, D = check_qkv(q, k, v, gqa=True)
    scale = check_scale(scale, D)
    if score_mod is not None:
        check_score_mod(score_mod)
        check_mod_requirements(score_mod, B, H, Nq, Nk, "score_mod")
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise TypeError(f"block_mask must be a BlockMask from flashtut.create_block_mask, or None; got "
                            f"{type(block_mask).__name__}")
        block_mask.check_for(B, H, Nq, Nk)
    return B, H, Nq, Nk, D, scale


def modified_scores(q, k, score_mod, scale: float) -> torch.Tensor:
    """``score_mod(scale * q k^T, b, h, q_idx, kv_idx)``, ``(B, H, Nq, Nk)`` in the accumulation
    dtype (query head ``h`` uses key head ``h // (H / Hkv)``)."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    acc = accum_dtype(q.dtype)
    kx = k.to(acc).repeat_interleave(H // k.shape[1], dim=1)
    s = torch.matmul(q.to(acc), kx.transpose(-2, -1)) * scale
    if score_mod is None:
        return s
    try:
        out = score_mod(s, *index_grids(B, H, Nq, Nk, q.device))
    except (IndexError, RuntimeError) as exc:
        raise ValueError(f"score_mod failed on B = {B}, H = {H}, Nq = {Nq}, Nk = {Nk} "
                         f"({type(exc).__name__}: {exc}); does a tensor it indexes cover every head and position?") from None
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        raise TypeError(f"score_mod must return a float tensor (the new score), got "
                        f"{type(out).__name__ if not isinstance(out, torch.Tensor) else out.dtype}")
    if out.shape != s.shape:
        try:
            out = out.expand(s.shape)
        except RuntimeError:
            raise ValueError(f"score_mod returned shape {tuple(out.shape)}, not the scores' shape {tuple(s.shape)}: "
                             "it must combine its arguments elementwise") from None
    return out.to(acc)


def flex_reference(q, k, v, score_mod=None, block_mask: BlockMask | None = None, scale: float | None = None,
                   return_lse: bool = False):
    """Dense FlexAttention: returns ``o`` (like ``q``), or ``(o, lse)`` with ``return_lse=True``
    (``lse`` ``(B, H, Nq)`` float32, float64 for float64 inputs, natural log, ``-inf`` for a row
    that sees no key)."""
    B, H, Nq, Nk, D, scale = check_flex_inputs(q, k, v, score_mod, block_mask, scale)
    s = modified_scores(q, k, score_mod, scale)
    if block_mask is not None and block_mask.mask_mod is not None:
        keep = evaluate_mask(block_mask.mask_mod, block_mask.B or 1, block_mask.H or 1, Nq, Nk, q.device)
        s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()   # a row of -inf: no NaN
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(l > 0, l, torch.ones_like(l))
    vx = v.to(s.dtype).repeat_interleave(H // v.shape[1], dim=1)
    o = torch.matmul(p, vx).to(q.dtype)
    if not return_lse:
        return o
    lse = (m + torch.log(l)).squeeze(-1)
    return o, lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


__all__ = ["flex_reference", "modified_scores", "check_flex_inputs"]

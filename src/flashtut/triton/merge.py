"""One partial attention state merged into a running one, in place, in one launch: the step that
follows every kernel call of the ring (chapter 14).

A state is ``(o, lse)``: the output normalised over the keys it saw, ``(B, H, N, D)``, and the
log-sum-exp of its scores, ``(B, H, N)``. The rule is :func:`flashtut.merge_attention_states`'
(chapter 04's merge of the softmax states ``(lse, 1)``): with ``m = max(lse, lse_p)``, weights
``w = exp(lse - m)`` and ``w_p = exp(lse_p - m)``, the merged output is ``(w o + w_p o_p) / (w +
w_p)`` and the merged log-sum-exp ``m + log(w + w_p)``. In PyTorch that takes several launches and
reads and writes ``o`` twice; this kernel reads each of ``o``, ``o_p`` once and writes ``o`` once.
"""
from __future__ import annotations

import contextlib

import torch

try:  # the kernel needs triton; importing flashtut does not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised by a test that hides triton
    triton = None

from .attention import interpreting

if triton is not None:
    @triton.jit
    def merge_state_kernel(O, LSE, OP, LSEP, stride_ob, stride_oh, stride_on, stride_lb, stride_lh,
                           stride_pb, stride_ph, stride_pn, stride_qb, stride_qh, n_heads, n_rows, head_dim,
                           BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        """Grid ``(cdiv(N, BLOCK_R), B * H)``: rows ``[r0, r0 + BLOCK_R)`` of one (batch, head).
        ``O`` and ``LSE`` (float32) are read and overwritten; ``OP`` may be narrower (float16,
        bfloat16). Every tensor has unit stride along its last dimension."""
        bh = tl.program_id(1)
        b = (bh // n_heads).to(tl.int64)
        h = (bh % n_heads).to(tl.int64)
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_D)
        row_ok = rows < n_rows
        lse_ptrs = LSE + b * stride_lb + h * stride_lh + rows
        lse = tl.load(lse_ptrs, mask=row_ok, other=float("-inf"))
        lse_p = tl.load(LSEP + b * stride_qb + h * stride_qh + rows, mask=row_ok, other=float("-inf"))
        m = tl.maximum(lse, lse_p)
        m = tl.where(m == float("-inf"), 0.0, m)      # two empty states: weights exp(-inf) = 0, not NaN
        w = tl.exp(lse - m)
        w_p = tl.exp(lse_p - m)
        total = w + w_p
        safe = tl.where(total > 0, total, 1.0)
        ok = row_ok[:, None] & (cols[None, :] < head_dim)
        o_ptrs = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + cols[None, :]
        o = tl.load(o_ptrs, mask=ok, other=0.0)
        o_p = tl.load(OP + b * stride_pb + h * stride_ph + rows[:, None] * stride_pn + cols[None, :],
                      mask=ok, other=0.0).to(o.dtype)
        o = o * (w / safe)[:, None] + o_p * (w_p / safe)[:, None]
        tl.store(o_ptrs, o, mask=ok)
        tl.store(lse_ptrs, m + tl.log(total), mask=row_ok)   # log(0) = -inf: still empty


def merge_state_(o: torch.Tensor, lse: torch.Tensor, o_p: torch.Tensor, lse_p: torch.Tensor) -> None:
    """Merge ``(o_p, lse_p)`` into ``(o, lse)`` in place (one launch). Unchecked, for the ring's
    steps: ``o`` float32 ``(B, H, N, D)`` and ``lse`` float32 ``(B, H, N)`` (views are fine),
    ``o_p`` and ``lse_p`` of the same shapes, all on one device, each with unit stride along its
    last dimension."""
    B, H, N, D = o.shape
    block_d = max(16, triton.next_power_of_2(D))
    block_r = 16 if interpreting() else max(1, 4096 // block_d)
    ctx = torch.cuda.device(o.device) if o.is_cuda else contextlib.nullcontext()
    with ctx:
        merge_state_kernel[(triton.cdiv(N, block_r), B * H)](
            o, lse, o_p, lse_p, *o.stride()[:3], *lse.stride()[:2], *o_p.stride()[:3], *lse_p.stride()[:2],
            H, N, D, BLOCK_R=block_r, BLOCK_D=block_d, **({} if interpreting() else {"num_warps": 4}))


__all__ = ["merge_state_"]

"""``flex_attention`` on the Triton kernels of ``flex.py``: launches and autograd.

``triton_flex_attention(q, k, v, score_mod=None, block_mask=None, scale=None) -> o`` is
differentiable: the backward returns ``dq, dk, dv`` and the gradients of the float tensors the
score mod captures that require grad (a learned bias). It saves ``q, k, v, o`` and the
log-sum-exp, as the plain kernels do; the block mask is the caller's, reused as it is.
``triton_flex_forward`` returns ``(o, lse)``.

Tiles: ``HOPPER_TILES`` on sm_90, elsewhere the first configuration of each kernel's search space
in ``configs`` (the plain kernels' measured first choices), made no larger than the block mask's
blocks, which they must divide.
Under the interpreter, the interpreter's tiny tiles.
"""
from __future__ import annotations

import contextlib

import torch

from ..block_mask import BlockMask, dense_block_mask
from ..flex_reference import check_flex_inputs
from . import attention, configs
from .configs import TileConfig

try:
    import triton

    from . import backward, flex, mods
    _IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - the facade falls back to the dense reference
    triton = None
    _IMPORT_ERROR = exc


def check_kernel_inputs(q, k, v, score_mod, block_mask, scale):
    """The flex checks, then what the kernels accept here. Returns ``(B, H, Nq, Nk, D, scale)``."""
    B, H, Nq, Nk, D, scale = check_flex_inputs(q, k, v, score_mod, block_mask, scale)
    if q.dtype not in attention.KERNEL_DTYPES:
        raise ValueError(f"q, k and v have dtype {str(q.dtype).replace('torch.', '')}; the Triton kernels accept "
                         "float16, bfloat16 or float32 (flashtut.flex_attention runs float64 densely)")
    if D > attention.MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {D} is not supported by the Triton kernels; accepted: 1 to "
                         f"{attention.MAX_HEAD_DIM}")
    attention._require_runtime(q)
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        raise ValueError("q has dtype bfloat16, which the Triton CPU interpreter does not support; "
                         "accepted on CPU: float16 or float32 (bfloat16 runs on the GPU)")
    return B, H, Nq, Nk, D, scale


#: Hopper tiles ``(kernel, head-dim class)`` -> TileConfig, chosen where ``ptxas -v`` (sm_90a) reports no
#: register spill with the mods of the benchmark (ALiBi, soft-capping, a document mask): the plain
#: kernels' first choices where they fit; the forward at D <= 64 takes 8 warps with a score mod (4
#: spilled), and the dK/dV kernel at D = 128 streams 32 query rows (64 spilled, 296-360 bytes, with a mod).
HOPPER_TILES = {
    ("fwd", "small"): TileConfig(128, 64, 4, 3), ("fwd+mod", "small"): TileConfig(128, 64, 8, 3),
    ("fwd", "large"): TileConfig(128, 64, 8, 3), ("fwd+mod", "large"): TileConfig(128, 64, 8, 3),
    ("dkdv", "small"): TileConfig(64, 128, 8, 3), ("dkdv", "large"): TileConfig(32, 128, 8, 3),
    ("dq", "small"): TileConfig(128, 64, 8, 3), ("dq", "large"): TileConfig(128, 64, 8, 3),
    # a score mod whose captured tensor gets its gradient element by element (atomics on a gathered
    # index, e.g. masks.relative_bias): its layout conversions took 256 KB of shared memory at
    # 128 x 64, more than an SM has; 64 x 64 takes 176 KB and spills nothing
    ("dq+scatter", "small"): TileConfig(64, 64, 8, 3), ("dq+scatter", "large"): TileConfig(64, 64, 8, 3),
}


def _tile(kernel: str, dtype, device, block_d: int, block: tuple[int, int], score_mod: bool = False,
          scatter: bool = False) -> TileConfig:
    """The kernel's tile (``HOPPER_TILES`` on sm_90 at D <= 128, else the plain kernels' first
    choice), shrunk to divide the mask's ``(query block, key block)``."""
    if attention.interpreting():
        c = configs.INTERPRETER[kernel]
    else:
        cap = torch.cuda.get_device_capability(device)
        size = "small" if block_d <= 64 else "large"
        key = ("fwd+mod" if kernel == "fwd" and score_mod else "dq+scatter" if kernel == "dq" and scatter
               else kernel, size)
        c = HOPPER_TILES.get(key) if cap[0] >= 9 and block_d <= 128 and dtype != torch.float32 else None
        if c is None:
            c = configs.search_space(kernel, cap, dtype == torch.float32, block_d)[0]
    return TileConfig(min(c.block_m, block[0]), min(c.block_n, block[1]), c.num_warps, c.num_stages)


def _launch_opts(c: TileConfig) -> dict:
    return {} if attention.interpreting() else dict(num_warps=c.num_warps, num_stages=c.num_stages)


def _list_strides(block_mask: BlockMask, num: torch.Tensor):
    """Batch and head strides of a ``(B', H', rows)`` list, 0 where it is shared."""
    Bm, Hm, rows = num.shape
    return (Hm * rows if Bm > 1 else 0), (rows if Hm > 1 else 0)


class _Plan:
    """Everything one call's kernels need besides q, k, v: the block mask, the compiled mods,
    their captured tensors, the tiles."""

    def __init__(self, q, k, score_mod, block_mask: BlockMask | None, scale: float):
        B, H, Nq, D = q.shape
        self.Nk, self.Hkv = k.shape[2], k.shape[1]
        self.scale = scale
        self.bm = block_mask if block_mask is not None else dense_block_mask(Nq, self.Nk, q.device)
        self.score = mods.compile_score(score_mod) if score_mod is not None else None
        mask_mod = self.bm.mask_mod
        self.mask = mods.compile_mask(mask_mod) if mask_mod is not None else None
        for which, name in ((self.score, "score_mod"), (self.mask, "mask_mod")):
            for t in (which.captured if which is not None else ()):
                if t.device != q.device:
                    raise ValueError(f"{name} captures a tensor of shape {tuple(t.shape)} on {t.device}, but q is "
                                     f"on {q.device}: create it on q's device")
        self.block_d = attention._block_d(D)
        self.meta = dict(HAS_SCORE=self.score is not None, HAS_MASK=self.mask is not None,
                         BLOCK_D=self.block_d, PAD_D=self.block_d != D, DOT_PREC=attention._dot_precision(q.dtype),
                         Q_BLOCK=self.bm.block_size[0], KV_BLOCK=self.bm.block_size[1])
        self.fns = dict(SCORE_MOD=self.score.value if self.score else flex.no_score_mod,
                        MASK_MOD=self.mask.value if self.mask else flex.no_mask_mod)

    def captured(self, which, dummy: torch.Tensor) -> list:
        ts = [t.detach().contiguous() for t in which.captured] if which is not None else []
        return ts + [dummy] * (mods.MAX_CAPTURED - len(ts))

    def score_tensors(self):
        return list(self.score.captured) if self.score is not None else []


def _ctx(t):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _flex_forward(q, k, v, plan: _Plan):
    B, H, Nq, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device)
    bm = plan.bm.to(q.device) if plan.bm.device != q.device else plan.bm
    c = _tile("fwd", q.dtype, q.device, plan.block_d, bm.block_size, plan.score is not None)
    sb, sh = _list_strides(bm, bm.kv_num_blocks)
    xs, ms = plan.captured(plan.score, q), plan.captured(plan.mask, q)
    grid = (triton.cdiv(Nq, c.block_m), B * H)
    with _ctx(q):
        flex.flex_fwd_kernel[grid](
            q, k, v, o, lse, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices,
            *xs, *ms, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            sb, sh, bm.kv_indices.shape[-1], H, H // plan.Hkv, Nq, plan.Nk, D, plan.scale,
            plan.scale * attention.LOG2E, SCORE_MOD=plan.fns["SCORE_MOD"], MASK_MOD=plan.fns["MASK_MOD"],
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, **plan.meta, **_launch_opts(c))
    return o, lse


def _flex_backward(q, k, v, o, lse, do, plan: _Plan):
    B, H, Nq, D = q.shape
    bm = plan.bm.to(q.device) if plan.bm.device != q.device else plan.bm
    do = do.contiguous()
    delta = torch.empty_like(lse)
    pre = 16 if attention.interpreting() else 128
    with _ctx(q):
        backward.bwd_preprocess_kernel[(triton.cdiv(Nq, pre), B * H)](
            o, do, delta, *o.stride()[:3], *do.stride()[:3], H, Nq, D, BLOCK_M=pre, BLOCK_D=plan.block_d)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    xs, ms = plan.captured(plan.score, q), plan.captured(plan.mask, q)
    score = plan.score
    grads = [torch.zeros(t.shape, dtype=torch.float32, device=q.device) if w else None
             for t, w in zip(score.captured, score.wants_grad)] if score is not None else []
    gs = [g if g is not None else lse for g in grads] + [lse] * (mods.MAX_CAPTURED - len(grads))
    fns = dict(SCORE_MOD=plan.fns["SCORE_MOD"], MASK_MOD=plan.fns["MASK_MOD"])
    common = [H // plan.Hkv, Nq, plan.Nk, D, plan.scale, plan.scale * attention.LOG2E]

    c = _tile("dkdv", q.dtype, q.device, plan.block_d, bm.block_size)
    sb, sh = _list_strides(bm, bm.q_num_blocks)
    with _ctx(q):
        flex.flex_dkdv_kernel[(triton.cdiv(plan.Nk, c.block_n), B * plan.Hkv)](
            q, k, v, do, dk, dv, lse, delta, bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks,
            bm.full_q_indices, *xs, *ms, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
            *dk.stride()[:3], *dv.stride()[:3], sb, sh, bm.q_indices.shape[-1], H, plan.Hkv, *common,
            SCORE_GRAD=score.grad if score else flex.no_score_grad, GROUPED=plan.Hkv != H, **fns,
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, **plan.meta, **_launch_opts(c))
    c = _tile("dq", q.dtype, q.device, plan.block_d, bm.block_size, scatter=score is not None and score.scatters)
    sb, sh = _list_strides(bm, bm.kv_num_blocks)
    with _ctx(q):
        flex.flex_dq_kernel[(triton.cdiv(Nq, c.block_m), B * H)](
            q, k, v, do, dq, lse, delta, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
            bm.full_kv_indices, *xs, *ms, *gs, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *do.stride()[:3], *dq.stride()[:3], sb, sh, bm.kv_indices.shape[-1], H, *common,
            SCORE_GRAD_PARAMS=score.grad_params if score else flex.no_score_grad_params, **fns,
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, **plan.meta, **_launch_opts(c))
    return dq, dk, dv, grads


class FlexAttention(torch.autograd.Function):
    """``o = softmax(score_mod(scale q k^T) masked) v``; the captured tensors ride along as inputs
    so that autograd hands their gradients back."""

    @staticmethod
    def forward(ctx, q, k, v, plan, *captured):
        o, lse = _flex_forward(q, k, v, plan)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan = plan
        ctx.n_captured = len(captured)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv, grads = _flex_backward(q, k, v, o, lse, do.to(q.dtype), ctx.plan)
        out = [None if g is None else g.to(t.dtype) for g, t in zip(grads, ctx.plan.score_tensors())]
        out += [None] * (ctx.n_captured - len(out))
        return (dq, dk, dv, None, *out)


def _contiguous(*ts):
    return [t if t.is_contiguous() else t.contiguous() for t in ts]


def triton_flex_forward(q, k, v, score_mod=None, block_mask=None, scale=None):
    """The fused forward alone: ``(o, lse)``, ``lse`` ``(B, H, Nq)`` float32, natural log."""
    *_, scale = check_kernel_inputs(q, k, v, score_mod, block_mask, scale)
    q, k, v = _contiguous(q, k, v)
    return _flex_forward(q, k, v, _Plan(q, k, score_mod, block_mask, scale))


def triton_flex_attention(q, k, v, score_mod=None, block_mask=None, scale=None):
    """FlexAttention on the fused Triton kernels, with autograd (see the module's docstring)."""
    *_, scale = check_kernel_inputs(q, k, v, score_mod, block_mask, scale)
    q, k, v = _contiguous(q, k, v)
    plan = _Plan(q, k, score_mod, block_mask, scale)
    return FlexAttention.apply(q, k, v, plan, *plan.score_tensors())


__all__ = ["triton_flex_attention", "triton_flex_forward", "FlexAttention", "check_kernel_inputs"]

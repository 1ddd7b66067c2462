"""The CUDA kernels on torch tensors: input checks, launches, and the autograd entry point.

* ``cuda_forward(q, k, v, causal, scale, variant="v3")`` runs any step of the forward ladder
  (``flashtut.cuda.VARIANTS``) and returns ``(o, lse)``; head dims other than 32, 64, 96 and 128
  (any multiple of 8 up to 128) are zero-padded to the next of them (of 64 and 128 for the
  teaching steps, ``configs.built_dims``), and step 3 also runs D = 256 (sm_80+);
* ``cuda_backward(q, k, v, o, lse, do, causal, scale)`` runs the backward with recomputation:
  ``bwd_preprocess.cu`` (``Delta = rowsum(dO * O)`` and ``lse2 = lse * log2(e)`` per query row),
  ``bwd_dkdv.cu`` (one thread block per key block; ``dK`` and ``dV`` accumulate in registers
  while it walks the query blocks, recomputing ``P`` from ``Q``, ``K`` and ``lse2``), then
  ``bwd_dq.cu`` (one thread block per query block: ``dQ`` in a separate pass that recomputes
  ``S`` and ``dP`` once more): seven matrix products per tile pair, no atomics, the same bits
  every run; ``deterministic=True`` (and a T4) take it. The default from sm_80,
  ``BackwardConfig(dq_atomic=True)`` as ``configs.pick_config`` chooses it, has the dK/dV kernel
  add ``dQ += dS K`` into a float32 buffer with vector reductions instead (then
  ``bwd_dq_convert.cu`` scales and converts it): five products, as FlashAttention-2;
  ``book/perflog_cuda_bwd.md`` weighs the two. At D = 256 (sm_80+) the dK/dV kernel runs dK and
  dV in separate blocks (grid z = 2) so that each keeps one 128-register accumulator;
* ``cuda_attention(q, k, v, causal, scale, deterministic=False, forward_kernel="auto")``: a fast
  forward and the backward behind one autograd Function, which saves only ``q, k, v, o`` and the
  log-sum-exp ``lse`` (B*H*Nq floats). The forward is chosen by ``configs.choose_forward``: on an
  sm_90 GPU (H100, H200) the Hopper forward with warpgroup MMA (``hopper_launch.run_hopper``, rung
  W3 of chapter 11, ``configs.HOPPER_DEFAULT``, with three consumer warpgroups at D = 64:
  ``configs.HOPPER_CONSUMERS``, and the TMA store of the output at D = 128: ``configs.HOPPER_OPTIONS``)
  wherever it supports the case, elsewhere the mma.sync ladder's
  fast step (``configs.fast_variant``); :func:`forward_kernel_for` says which one a call would run. The
  backward needs only ``lse``, which both forwards write: on sm_90 at (padded) D = 64 and 128 it is the
  wgmma + TMA backward of ``hopper_backward`` (``configs.HOPPER_BACKWARD_RUNG``; :func:`plan_for` names it
  in ``backward_rung``), elsewhere and with ``deterministic=True`` the mma.sync one.

Real models: ``k``/``v`` may have ``Hkv`` heads dividing ``H`` (the kernels read K/V head
``h / kv_group``), and ``causal`` may be ``"bottom-right"`` (the kernels see query ``i`` and key
``j`` when ``j <= i + diag_offset``); both in forward steps v3 to v7 and in the backward. The
backward's dK/dV kernel writes each query head's share and the shares of a group are summed in
float32 afterwards (a loop over the group inside that kernel made it spill registers at D = 128).

Every entry point goes through :func:`prepare_inputs`: the arguments first, then the machine.
Tile sizes and launch shapes come from ``flashtut.cuda.configs``.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

from ..checks import check_bool, check_like, check_lse, check_mask, check_qkv, check_scale, diag_offset
from ..constants import LOG2E
from .compile import (capability, get_function, launch, max_smem_per_block, nvrtc_version,
                      set_max_dynamic_smem)
from .configs import (CONVERT_THREADS, DTYPES, HEAD_DIMS, PRE_WARPS, V4_STEPS, VARIANTS, WIDE_DIMS,
                      BackwardConfig, ForwardChoice, KernelPlan, check_backward_config, check_backward_kernel,
                      check_forward_kernel, kernel_builds, kernel_plan, launch_config, padded_dim, pick_config)
from .hopper_backward_launch import fits, run_hopper_backward
from .hopper_launch import run_hopper


class Prepared(NamedTuple):
    """Checked inputs, ready for the kernels: tensors contiguous with a 16-byte aligned start."""
    tensors: tuple          # (q, k, v), or (q, k, v, o, do) for the backward
    lse: torch.Tensor | None  # float32, contiguous (backward only)
    shape: tuple            # (B, H, Nq, Nk, D)
    causal: bool
    scale: float
    arch: int               # the GPU's compute capability as an int: 75, 80, 90 ...
    kv_group: int = 1       # query heads per K/V head
    diag_offset: int = 0    # causal: query i sees key j iff j <= i + diag_offset
    alignment: str | None = None   # None, "top-left" or "bottom-right"


def _ready(t: torch.Tensor) -> torch.Tensor:
    # cp.async and the vector loads move 16 bytes at a time
    t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t


def _check_gpu(x: torch.Tensor, what: str) -> int:
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


#: the forward ladder steps that take grouped-query heads and the bottom-right alignment
REAL_MODEL_VARIANTS = ("v3", *V4_STEPS)


def prepare_inputs(q, k, v, causal=False, scale=None, *, o=None, lse=None, do=None,
                   what: str = "the CUDA kernels", window=None, variant: str | None = None) -> Prepared:
    """The checks every CUDA entry point shares, in one order: every argument first (TypeError
    for a non-tensor, ValueError naming the argument), then the machine (RuntimeError: no GPU,
    a GPU older than sm_75, bfloat16 before sm_80). Pass ``o``, ``lse`` and ``do`` for the
    backward. Returns the tensors contiguous and 16-byte aligned, ``causal`` as a bool, the
    scale as a float and the GPU's architecture. Head dims: the forward takes every multiple of 8
    up to 128 (padded, see ``configs.padded_dim``) and 256 for step 3 (``variant`` ``"v3"`` or
    None, the fast forward, from sm_80); the backward the built dims 32, 64, 96, 128 and 256
    (sm_80+)."""
    B, H, Nq, Nk, D = check_qkv(q, k, v, dtypes=DTYPES,
                                dtype_names="float16 or bfloat16 (the CUDA kernels' element types)",
                                gqa=True)
    alignment, window = check_mask(causal, window)
    if window is not None:
        raise ValueError(f"window={window} is not supported by the CUDA kernels; accepted: None "
                         "(flashtut.triton_attention and tiled_attention take windows)")
    scale = check_scale(scale, D)
    backward = o is not None or lse is not None or do is not None
    if backward and D not in HEAD_DIMS + WIDE_DIMS:
        raise ValueError(f"head dim D = {D} is not built for the CUDA backward; accepted: "
                         f"{', '.join(map(str, HEAD_DIMS + WIDE_DIMS))} (cuda_attention pads other "
                         f"multiples of 8 up to 128)")
    if not ((D % 8 == 0 and 8 <= D <= max(HEAD_DIMS)) or (D in WIDE_DIMS and variant in (None, "v3"))):
        raise ValueError(f"head dim D = {D} is not supported by the CUDA kernels"
                         f"{'' if variant is None else f' (variant {variant!r})'}; accepted: a multiple of 8 "
                         f"from 8 to {max(HEAD_DIMS)}, or {', '.join(map(str, WIDE_DIMS))} (forward step v3 "
                         f"and the backward, sm_80+)")
    if B * H > 65535:
        raise ValueError(f"B * H = {B * H} exceeds the 65535 blocks of grid.y; accepted: B * H <= 65535")
    if backward:
        check_like("o", o, q)
        check_like("do", do, q)
        for name, t in (("o", o), ("do", do)):
            if t.dtype != q.dtype:
                raise ValueError(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
        check_lse(lse, B, H, Nq, q.device)
    arch = _check_gpu(q, what)
    if D in WIDE_DIMS and arch < 80:
        raise ValueError(f"head dim D = {D} needs sm_80 or newer for the CUDA kernels (this GPU is sm_{arch}); "
                         f"accepted here: a multiple of 8 from 8 to {max(HEAD_DIMS)}")
    tensors = (q, k, v, o, do) if backward else (q, k, v)
    return Prepared(tuple(_ready(t) for t in tensors),
                    lse.to(torch.float32).contiguous() if backward else None,
                    (B, H, Nq, Nk, D), alignment is not None, scale, arch, H // k.shape[1],
                    diag_offset(alignment, Nq, Nk), alignment)


# -- forward ----------------------------------------------------------------------------------

def cuda_forward(q, k, v, causal: bool = False, scale: float | None = None, variant: str = "v3", *,
                 warps: int | None = None, block_n: int | None = None, m_tiles: int | None = None):
    """Run ladder step ``variant`` (see ``flashtut.cuda.VARIANTS``); returns ``(o, lse)`` with
    ``lse`` the natural-log log-sum-exp, float32, shape ``(B, H, Nq)``. CUDA float16 tensors,
    bfloat16 from sm_80, D any multiple of 8 up to 128 (zero-padded inside to 32, 64, 96 or 128
    for the fast steps v3 and v5, to 64 or 128 for the others), or 256 for step v3 (sm_80+). ``warps``, ``block_n`` and ``m_tiles`` override the fast kernel's tile sizes (see
    ``flashtut.cuda.configs.launch_config``), for experiments."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    p = prepare_inputs(q, k, v, causal, scale, what="the CUDA forward kernels", variant=variant)
    if (p.kv_group != 1 or p.diag_offset != 0) and variant not in REAL_MODEL_VARIANTS:
        raise ValueError(f"variant {variant!r} takes k and v with q's heads and top-left causal only; "
                         f"accepted for grouped-query heads or causal='bottom-right': {REAL_MODEL_VARIANTS}")
    D = p.shape[-1]
    pd = padded_dim(D, variant)
    o, lse = _forward(*(pad_head_dim(t, pd) for t in p.tensors), p.causal, p.scale, variant, warps,
                      block_n, m_tiles, kv_group=p.kv_group, diag_offset=p.diag_offset)
    return (o if pd == D else o[..., :D].contiguous()), lse


def pad_head_dim(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``t`` with zero columns appended up to ``head_dim`` (itself when it has that many)."""
    extra = head_dim - t.shape[-1]
    return t if extra == 0 else _ready(torch.nn.functional.pad(t, (0, extra)))


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


def _forward(q, k, v, causal: bool, scale: float, variant: str = "v3", warps: int | None = None,
             block_n: int | None = None, m_tiles: int | None = None, *, kv_group: int | None = None,
             diag_offset: int = 0):
    # inputs already through prepare_inputs. The real-model steps (REAL_MODEL_VARIANTS) also take
    # grouped-query heads (k, v with H / kv_group heads; None: read off the shapes) and
    # diag_offset (causal: query i sees key j iff j <= i + diag_offset; Nk - Nq is the
    # bottom-right alignment); the others need equal heads and offset 0
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    with torch.cuda.device(q.device):
        cfg, fn = _plan(variant, q.dtype, D, q.device.index, warps, block_n, m_tiles)
        o = torch.empty_like(q)
        lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
        grid = (math.ceil(Nq / cfg.block_m), B * H, 1)
        args = (q, k, v, o, lse, Nq, Nk, scale * LOG2E, int(causal))
        kv_group = q.shape[1] // k.shape[1] if kv_group is None else kv_group
        if variant in REAL_MODEL_VARIANTS:
            args += (kv_group, int(diag_offset))
        elif diag_offset or kv_group != 1:
            raise ValueError(f"variant {variant!r} takes neither grouped K/V heads nor a diag_offset; "
                             f"accepted: variants {list(REAL_MODEL_VARIANTS)}")
        launch(fn, grid, (cfg.threads, 1, 1), args, cfg.dynamic_smem)
    return o, lse


# -- backward ---------------------------------------------------------------------------------

def cuda_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None, *,
                  out=None, config: BackwardConfig | None = None, deterministic: bool = False):
    """``(dq, dk, dv)`` of ``o = softmax(q k^T * scale) v`` given the upstream gradient ``do``.

    ``q``: ``(B, H, Nq, D)``, ``k``, ``v``: ``(B, Hkv, Nk, D)`` with ``H % Hkv == 0`` (``dk``, ``dv``
    sum their group's gradients), CUDA, float16 or bfloat16 (bf16 from sm_80), D in {32, 64, 96,
    128}, or 256 from sm_80;
    ``causal``: ``False``, ``True``/``"top-left"`` or ``"bottom-right"``; ``o`` and ``do`` like ``q``; ``lse``: the forward's natural-log
    log-sum-exp, ``(B, H, Nq)``. The probabilities are recomputed from ``q``, ``k`` and ``lse``;
    nothing of size ``Nq x Nk`` is stored. ``out``: optional preallocated ``(dq, dk, dv)``,
    contiguous, with the shapes and dtype of ``q, k, v`` (the tests poison them with NaN to
    prove every element is written). ``config``: tile sizes (default ``configs.pick_config`` for
    this GPU), to compare configurations or run a T4's on a bigger GPU. ``deterministic``: the
    separate dQ pass instead of atomics (bit-identical results run to run; 38 to 50% slower on an
    H200, see book/perflog_cuda_bwd.md); inputs too large for the atomic variant's 32-bit indexing
    take it too. Outputs are in the input dtype.
    """
    p = prepare_inputs(q, k, v, causal, scale, o=o, lse=lse, do=do, what="the CUDA backward")
    q, k, v, o, do = p.tensors
    lse, (B, H, Nq, Nk, D), causal, scale = p.lse, p.shape, p.causal, p.scale
    if out is None:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    else:
        dq, dk, dv = out
        for name, t, ref in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if not (isinstance(t, torch.Tensor) and t.shape == ref.shape and t.dtype == ref.dtype
                    and t.device == ref.device and t.is_contiguous() and t.data_ptr() % 16 == 0):
                raise ValueError(f"out {name} must be a contiguous, 16-byte aligned tensor of shape "
                                 f"{tuple(ref.shape)}, dtype {ref.dtype} on {ref.device}")

    smem_limit = max_smem_per_block(q.device)
    cfg = pick_config(D, p.arch, smem_limit, deterministic) if config is None else config
    if config is None and cfg.dq_atomic and B * H * Nq * D >= 2**31:
        cfg = pick_config(D, p.arch, smem_limit, deterministic=True)
    check_backward_config(cfg, D, p.arch, smem_limit)
    if cfg.dq_atomic and B * H * Nq * D >= 2**31:
        raise ValueError(f"the atomic-dQ variant indexes with 32-bit ints: B*H*Nq*D = "
                         f"{B * H * Nq * D}; accepted: below 2**31")
    threads = 32 * cfg.warps
    with torch.cuda.device(q.device):   # builds for, and launches on, q's GPU
        fns = {step: get_function(src, kernel, defines)
               for step, (src, kernel, defines) in kernel_builds(cfg, q.dtype).items()}
        delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
        lse2 = torch.empty_like(delta)
        rows = B * H * Nq
        launch(fns["preprocess"], (math.ceil(rows / PRE_WARPS),), (32 * PRE_WARPS,),
               (o, do, lse, delta, lse2, rows))

        scale_log2 = scale * LOG2E
        # the atomic variant adds into a zeroed float32 buffer; the other passes a null pointer
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if cfg.dq_atomic \
            else np.uint64(0)
        set_max_dynamic_smem(fns["dkdv"], cfg.dkdv_smem)
        # grouped-query heads: each query head writes its share of dK/dV, summed below in float32
        G, off = p.kv_group, p.diag_offset
        dk_h, dv_h = (dk, dv) if G == 1 else \
            (torch.empty((B, H, Nk, D), dtype=q.dtype, device=q.device) for _ in range(2))
        launch(fns["dkdv"], (math.ceil(Nk / (16 * cfg.warps)), B * H, 2 if cfg.split else 1), (threads,),
               (q, k, v, do, lse2, delta, dk_h, dv_h, Nq, Nk, scale, scale_log2, int(causal), dq_acc,
                G, off), shared_mem=cfg.dkdv_smem)
        if G > 1:
            for share, total in ((dk_h, dk), (dv_h, dv)):
                total.copy_(share.view(B, H // G, G, Nk, D).sum(2, dtype=torch.float32))

        if cfg.dq_atomic:
            n = dq_acc.numel()
            launch(fns["dq_convert"], (math.ceil(n / (4 * CONVERT_THREADS)),), (CONVERT_THREADS,),
                   (dq_acc, dq, scale, n))
        else:
            set_max_dynamic_smem(fns["dq"], cfg.dq_smem)
            launch(fns["dq"], (math.ceil(Nq / (16 * cfg.warps)), B * H), (threads,),
                   (q, k, v, do, lse2, delta, dq, Nq, Nk, scale, scale_log2, int(causal), G, off),
                   shared_mem=cfg.dq_smem)
    return dq, dk, dv


# -- autograd ---------------------------------------------------------------------------------

def plan_for(q: torch.Tensor, forward_kernel: str = "auto", deterministic: bool = False,
             backward_kernel: str = "auto") -> KernelPlan:
    """What ``cuda_attention(q, ..., forward_kernel=..., deterministic=..., backward_kernel=...)`` runs on
    ``q``'s GPU, dtype and head dim: ``configs.kernel_plan`` for this GPU's compute capability, shared
    memory and NVRTC."""
    check_forward_kernel(forward_kernel)
    check_backward_kernel(backward_kernel)
    major, minor = capability(q.device)
    # the NVRTC version matters only where wgmma could run; elsewhere CuPy need not be asked
    return kernel_plan((major, minor), q.dtype, q.shape[-1], deterministic, forward_kernel,
                       nvrtc_version() if (major, minor) == (9, 0) else None, max_smem_per_block(q.device),
                       backward_kernel)


def forward_kernel_for(q: torch.Tensor, forward_kernel: str = "auto") -> ForwardChoice:
    """The forward ``cuda_attention(q, ..., forward_kernel=forward_kernel)`` runs on ``q``'s GPU,
    dtype and (padded) head dim, with the reason (``configs.choose_forward``, through :func:`plan_for`);
    raises what that call would raise for ``forward_kernel="wgmma"`` where wgmma cannot run."""
    return plan_for(q, forward_kernel).choice


class CudaAttention(torch.autograd.Function):
    """Autograd wrapper: ``forward`` runs the forward :func:`plan_for` picks (wgmma on
    sm_90, mma.sync elsewhere), ``backward`` the CUDA backward. Head dims that are not built are
    zero-padded on the way in and cut on the way out; what is saved is the padded tensors."""

    @staticmethod
    def forward(ctx, q, k, v, alignment, scale: float, deterministic: bool, forward_kernel: str = "auto",
                backward_kernel: str = "auto"):
        # checked once, in cuda_attention; alignment is None, "top-left" or "bottom-right"
        D = q.shape[-1]
        pd = padded_dim(D)
        q, k, v = (pad_head_dim(t, pd) for t in (q, k, v))
        plan = plan_for(q, forward_kernel, deterministic, backward_kernel)
        choice, rung = plan.choice, plan.backward_rung
        if rung is not None and not fits(q, k):
            if backward_kernel == "wgmma":
                raise ValueError(f"backward_kernel='wgmma': the Hopper backward indexes dQ with 32-bit offsets and "
                                 f"one grid row per batch and KV head; q {tuple(q.shape)} with k {tuple(k.shape)} is "
                                 "past that; accepted: backward_kernel='mma' or 'auto'")
            rung = None
        offset = diag_offset(alignment, q.shape[2], k.shape[2])
        if choice.kernel == "wgmma":
            o, lse = run_hopper(q, k, v, alignment is not None, scale, choice.variant, offset,
                                consumers=choice.consumers, **dict(choice.options))
        else:
            o, lse = _forward(q, k, v, alignment is not None, scale, choice.variant,
                              kv_group=q.shape[1] // k.shape[1], diag_offset=offset)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.deterministic, ctx.head_dim = alignment or False, scale, deterministic, D
        ctx.diag_offset, ctx.backward_rung = offset, rung
        return o if pd == D else o[..., :D].contiguous()

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        D = ctx.head_dim
        do = _ready(pad_head_dim(do, q.shape[-1]))
        if ctx.backward_rung is not None:
            # sm_90: the wgmma + TMA backward (flashtut.cuda.hopper_backward)
            dq, dk, dv = run_hopper_backward(q, k, v, o, lse, do, ctx.causal is not False, ctx.scale,
                                             ctx.diag_offset, rung=ctx.backward_rung,
                                             deterministic=ctx.deterministic)
        else:
            dq, dk, dv = cuda_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale,
                                       deterministic=ctx.deterministic)
        if q.shape[-1] != D:
            dq, dk, dv = (g[..., :D] for g in (dq, dk, dv))
        return dq, dk, dv, None, None, None, None, None


def cuda_attention(q, k, v, causal=False, scale: float | None = None, window: int | None = None, *,
                   deterministic: bool = False, forward_kernel: str = "auto", backward_kernel: str = "auto"):
    """Fused CUDA attention; CUDA float16 tensors, bfloat16 from sm_80; D any multiple of 8 up to
    128 (padded to 32, 64, 96 or 128 inside), or 256 (sm_80 and newer).

    Returns ``o`` with the shape and dtype of ``q``; ``o.backward(...)`` runs the CUDA backward (on sm_90 at
    D = 64 and 128 the Hopper backward, ``flashtut.cuda.hopper_backward``), which adds dQ in float32 by
    atomics or TMA reduce-adds from sm_80 (the order of the additions varies, so the last bits of dQ may
    differ between runs); ``deterministic=True`` takes the mma.sync backward's separate dQ pass instead
    (bit-identical every run; on an H200 the mma.sync backward takes 38% (D = 64) to 50% (D = 128) longer
    that way).
    ``k``/``v`` may have fewer heads than ``q`` (grouped-query); ``causal`` is ``False``,
    ``True``/``"top-left"`` or ``"bottom-right"``. ``window`` is refused with a ``ValueError``
    (the Triton kernels have it).

    ``forward_kernel``: ``"auto"`` (the default) runs the Hopper forward with warpgroup MMA on an
    sm_90 GPU wherever it supports the case (float16/bfloat16, D up to 128, every mask alignment and
    grouped heads) and the mma.sync forward everywhere else; ``"mma"`` always the mma.sync forward;
    ``"wgmma"`` the Hopper forward or an error saying why it cannot run (``configs.FORWARD_KERNELS``).
    ``backward_kernel`` likewise for the backward: ``"auto"`` the Hopper backward on sm_90 at (padded) D = 64
    and 128 unless ``deterministic``, the mma.sync backward elsewhere; ``"mma"`` always the mma.sync one;
    ``"wgmma"`` the Hopper one (with ``deterministic``: its dK/dV kernel and the separate dQ pass) or an
    error (``configs.BACKWARD_KERNELS``).
    """
    check_forward_kernel(forward_kernel)
    check_backward_kernel(backward_kernel)
    deterministic = check_bool("deterministic", deterministic)   # "no" must not mean True
    p = prepare_inputs(q, k, v, causal, scale, what="cuda_attention", window=window)
    return CudaAttention.apply(*p.tensors, p.alignment, p.scale, deterministic, forward_kernel, backward_kernel)

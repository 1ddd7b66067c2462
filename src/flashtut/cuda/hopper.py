"""The Hopper forward ladder (chapter 11): ``forward_hopper(q, k, v, variant=...)`` runs a rung on an sm_90 GPU.

Rung W4 (``kernels/fwd_w4_persistent.cu``, ``variant="w4"``) is W3 made persistent: a grid of at most
one block per SM, each walking query blocks (causal: the heaviest of every head first), so that the
next block's Q and K/V load while the consumers finish the last one.

Rung W3 (``kernels/fwd_w3_pingpong.cu``, ``variant="w3"``) keeps W2's loads and overlaps the softmax
with the tensor cores: each consumer warpgroup issues the next tile's ``Q K^T`` before its softmax, and
the two consumers take turns on the tensor cores (ping-pong, ordered by named barriers); at D = 64 it
may have three consumers instead, which take turns in a ring with the ``c3_turns`` option.
``cuda_attention`` runs it on sm_90 with build options per head dim (``configs.HOPPER_OPTIONS``: at
D = 128 its output stored by TMA, at D = 64 three consumers taking turns).

Rung W2 (``kernels/fwd_w2_tma.cu``, ``variant="w2"``) keeps W1's math and replaces its loads: a
producer warpgroup issues TMA copies into a ring of shared-memory stages guarded by mbarriers, and
hands its registers to the two consumer warpgroups with ``setmaxnreg``.

Rung W1 (``kernels/fwd_w1_wgmma.cu``) computes both products with warpgroup MMA
(``wgmma.mma_async``), which exists only on the ``sm_90a`` target: it is built with
``get_function(..., arch="90a")``, not for the plain ``sm_90`` a build for the current device
gets. The kernel file still compiles for every other target (its body is a trap there), so the CI
compile checks cover it like the rest. What to build and launch: ``configs.hopper_config``; the
launch itself, :func:`run_hopper`, lives in ``hopper_launch`` because ``cuda_attention`` runs it too.
"""
from __future__ import annotations

import torch

from .attention import _ready, prepare_inputs
from .compile import capability
from .configs import HOPPER_VARIANTS, PERSISTENT_RUNGS, check_consumers, check_w3_options
from .hopper_launch import run_hopper


def check_hopper(x: torch.Tensor) -> None:
    """RuntimeError unless ``x`` (a CUDA tensor) is on an sm_90 GPU (H100, H200, GH200): wgmma
    exists nowhere else."""
    major, minor = capability(x.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"the Hopper forward kernels use wgmma, which only sm_90 GPUs (H100, H200) have; "
                           f"this GPU is sm_{major}{minor}: use flashtut.cuda_attention (mma.sync) instead")


def _causal_offset(causal, Nq: int, Nk: int) -> tuple[bool, int]:
    # (causal, diag_offset): query i sees key j iff j <= i + diag_offset
    if isinstance(causal, str):
        if causal == "top-left":
            return True, 0
        if causal == "bottom-right":
            return True, Nk - Nq
        raise ValueError(f"causal must be False, True, 'top-left' or 'bottom-right', got {causal!r}")
    if isinstance(causal, (bool, int)):
        return bool(causal), 0
    raise TypeError(f"causal must be a bool, 'top-left' or 'bottom-right', got {type(causal).__name__}")


def _heads_like(t, q):
    # grouped k / v seen with q's head count (a stride-0 view), for the shared checks of equal heads
    if isinstance(t, torch.Tensor) and isinstance(q, torch.Tensor) and t.dim() == 4 and q.dim() == 4 \
            and t.shape[1] != q.shape[1]:
        return t[:, :1].expand(-1, q.shape[1], -1, -1)
    return t


def forward_hopper(q, k, v, causal=False, scale: float | None = None, variant: str = "w1", *,
                   block_n: int = 128, pv_split: bool = True, stages: int = 2, consumers: int = 2,
                   ctas: int | None = None, **options):
    """Hopper rung ``variant`` on CUDA float16/bfloat16 tensors of an sm_90 GPU, D in {64, 128}.

    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention: query head ``h`` uses
    key/value head ``h // (H // Hkv)``); ``causal`` is ``False``, ``True`` / ``"top-left"`` or
    ``"bottom-right"``. ``block_n``, ``pv_split``, ``stages`` (the TMA rungs' ring) and ``consumers``
    (W3's and W4's consumer warpgroups: 2, or 3 at D = 64): see ``flashtut.cuda.configs.hopper_config``.
    ``ctas`` (W4 only): how many persistent blocks to launch, at most one per query block; default
    the GPU's SM count (fewer make each block walk more query blocks, which the tests use).
    ``options``: the W3 family's build options, bools, each off by default (``configs.W3_OPTIONS``):
    ``tma_store``, ``c3_turns``, ``uniform_wg`` and ``tail_first``.
    Returns ``(o, lse)``: ``o`` like ``q``, ``lse`` the natural-log log-sum-exp, float32,
    ``(B, H, Nq)`` (``-inf`` for a row that sees no key, whose ``o`` is 0).
    """
    if variant not in HOPPER_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(HOPPER_VARIANTS)}, got {variant!r}")
    check_consumers(variant, consumers)   # the head dim is checked with the build, once D is known
    check_w3_options(variant, options)
    if ctas is not None and (variant not in PERSISTENT_RUNGS or isinstance(ctas, bool) or not isinstance(ctas, int)
                             or ctas < 1):
        raise ValueError(f"ctas (the persistent blocks) takes a positive int with variant 'w4', got {ctas!r} "
                         f"with {variant!r}")
    grouped = all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)) and k.shape[1] != q.shape[1]
    if grouped:
        H, Hkv = q.shape[1], k.shape[1]
        if v.shape[1] != Hkv:
            raise ValueError(f"k and v must have the same number of heads, got k: {Hkv}, v: {v.shape[1]}")
        if Hkv < 1 or H % Hkv:
            raise ValueError(f"the query heads H = {H} must be a multiple of the key/value heads Hkv = {Hkv}")
    if isinstance(causal, str) and causal not in ("top-left", "bottom-right"):
        _causal_offset(causal, 0, 0)  # the ValueError naming causal, before the machine is looked at
    p = prepare_inputs(q, _heads_like(k, q), _heads_like(v, q), causal not in (False, 0), scale,
                       what="the Hopper forward kernels")
    check_hopper(p.tensors[0])
    _, _, Nq, Nk, _ = p.shape
    causal, diag = _causal_offset(causal, Nq, Nk)
    # grouped k / v go to the kernel as they are; prepare_inputs checked (and copied) stride-0 views of
    # them with H heads, a copy to drop once the shared checks take Hkv heads
    q, k, v = p.tensors if not grouped else (p.tensors[0], _ready(k), _ready(v))
    return run_hopper(q, k, v, causal, p.scale, variant, diag, block_n, pv_split, stages, consumers, ctas,
                      **options)

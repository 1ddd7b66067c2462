"""Which kernels run: :func:`kernel_plan` answers, for a GPU (compute capability), dtype and head dim, which
forward and backward kernels ``cuda_attention`` builds and with which tiles; ``cuda_attention`` asks it
itself, so the answer cannot drift from what runs. :func:`plan_table` writes the answer for the book's
GPUs as a Markdown table (book/code_layout.md holds it; a test keeps the two equal)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ...checks import check_bool, check_choice, check_count
from .backward import BackwardConfig, kernel_builds, pick_config
from .hopper import (HOPPER_BACKWARD_RUNG, HOPPER_CONSUMERS, HOPPER_DEFAULT, HOPPER_DETERMINISTIC_RUNG,
                     HOPPER_HEAD_DIMS, HOPPER_OPTIONS, HopperConfig, hopper_config)
from .ladder import LaunchConfig, fast_variant, launch_config, padded_dim
from .limits import DTYPE_DEFINES, HEAD_DIMS, SMEM_PER_BLOCK, WIDE_DIMS

__all__ = ["FORWARD_KERNELS", "HOPPER_NVRTC", "ForwardChoice", "check_forward_kernel", "choose_forward",
           "BACKWARD_KERNELS", "check_backward_kernel", "choose_backward_rung",
           "KernelPlan", "kernel_plan", "attention_builds", "PLAN_GPUS", "plan_table"]

#: the forward kernels ``cuda_attention(..., forward_kernel=...)`` chooses between, name -> what it runs
FORWARD_KERNELS = {
    "auto": "wgmma where it runs (sm_90, a head dim that pads to 64 or 128, an NVRTC that targets sm_90a), "
            "mma.sync everywhere else",
    "mma": "the mma.sync ladder's fast step (fast_variant), on every GPU from sm_75",
    "wgmma": f"the Hopper forward, rung {HOPPER_DEFAULT.upper()} of chapter 11 (sm_90 only; an error "
             "anywhere else)",
}
#: the first NVRTC release that compiles for the sm_90a target (wgmma)
HOPPER_NVRTC = (12, 0)


class ForwardChoice(NamedTuple):
    """The forward one ``cuda_attention`` call runs: ``kernel`` ``"mma"`` or ``"wgmma"``, ``variant``
    the ladder step (a ``VARIANTS`` or ``HOPPER_VARIANTS`` key), ``reason`` why, and for
    wgmma its ``consumers`` (consumer warpgroups, :data:`HOPPER_CONSUMERS`) and ``options``, the sorted
    (name, value) pairs of :data:`HOPPER_OPTIONS`."""
    kernel: str
    variant: str
    reason: str
    consumers: int = 2
    options: tuple = ()


def check_forward_kernel(forward_kernel) -> str:
    """``forward_kernel`` itself, or the ValueError (TypeError for a non-string) that names it."""
    return check_choice("forward_kernel", forward_kernel, FORWARD_KERNELS)


def choose_forward(forward_kernel: str, arch: int, dtype: torch.dtype, head_dim: int,
                   nvrtc_version: tuple[int, int] | None) -> ForwardChoice:
    """Which forward runs for a (padded) ``head_dim`` and ``dtype`` on a GPU of ``arch`` (75, 90 ...)
    whose NVRTC is ``nvrtc_version`` (``(major, minor)``; None: unknown, as good as too old).

    ``"auto"`` takes wgmma (rung :data:`HOPPER_DEFAULT` with :data:`HOPPER_CONSUMERS`) wherever it supports the case and falls
    back to mma.sync otherwise; ``"wgmma"`` raises where it cannot run: ``ValueError`` for a head
    dim or dtype the Hopper rungs are not built for, ``RuntimeError`` for a GPU other than sm_90 or an NVRTC too old for sm_90a."""
    check_forward_kernel(forward_kernel)
    mma = ForwardChoice("mma", fast_variant(head_dim, arch), "")
    if forward_kernel == "mma":
        return mma._replace(reason="asked for")
    why_not = None
    if arch != 90:
        why_not = (RuntimeError, f"wgmma exists on sm_90 GPUs only (H100, H200); this GPU is sm_{arch}")
    elif dtype not in DTYPE_DEFINES:
        why_not = (ValueError, f"the wgmma forward is built for float16 and bfloat16, got {dtype}")
    elif head_dim not in HOPPER_HEAD_DIMS:
        why_not = (ValueError, f"the wgmma forward is built for head dims {' and '.join(map(str, HOPPER_HEAD_DIMS))} "
                               f"(the mma.sync path pads this one to D = {head_dim})")
    elif nvrtc_version is None or tuple(nvrtc_version) < HOPPER_NVRTC:
        why_not = (RuntimeError, f"NVRTC {nvrtc_version or 'of unknown version'} cannot target sm_90a (wgmma) "
                                 f"before {HOPPER_NVRTC[0]}.{HOPPER_NVRTC[1]}; install a CuPy for CUDA 12 or 13 "
                                 "(pip install cupy-cuda12x)")
    if why_not is None:
        return ForwardChoice("wgmma", HOPPER_DEFAULT, "sm_90 with an NVRTC that targets sm_90a",
                             HOPPER_CONSUMERS[head_dim], tuple(sorted(HOPPER_OPTIONS[head_dim].items())))
    if forward_kernel == "wgmma":
        error, message = why_not
        raise error(f"forward_kernel='wgmma': {message}; accepted elsewhere: forward_kernel='mma' or 'auto'")
    return mma._replace(reason=why_not[1])


#: the backward kernels ``cuda_attention(..., backward_kernel=...)`` chooses between, name -> what it runs
BACKWARD_KERNELS = {
    "auto": "the Hopper backward where it runs (sm_90, a head dim that pads to 64 or 128, not deterministic, "
            "an NVRTC that targets sm_90a), the mma.sync backward everywhere else",
    "mma": "the mma.sync backward of chapter 08 (configs.pick_config), on every GPU from sm_75",
    "wgmma": "the Hopper backward (bwd_hopper.cu, configs.HOPPER_BACKWARD_RUNG; sm_90 only; an error anywhere else)",
}


def check_backward_kernel(backward_kernel) -> str:
    """``backward_kernel`` itself, or the ValueError (TypeError for a non-string) that names it."""
    return check_choice("backward_kernel", backward_kernel, BACKWARD_KERNELS)


def choose_backward_rung(backward_kernel: str, arch: int, head_dim: int, deterministic: bool,
                         nvrtc_version: tuple[int, int] | None) -> str | None:
    """The Hopper backward's rung (:data:`HOPPER_BACKWARD_RUNG`) where the backward is the Hopper one, None
    where it is the mma.sync one. ``"auto"`` takes the Hopper backward on sm_90 at a (padded) ``head_dim`` of
    64 or 128, not ``deterministic`` (that keeps the mma.sync backward), with an NVRTC that targets sm_90a;
    ``"wgmma"`` raises where it cannot run (``ValueError`` for the head dim, ``RuntimeError`` for the GPU or
    the NVRTC), and with ``deterministic`` names :data:`HOPPER_DETERMINISTIC_RUNG` (dK and dV from the Hopper
    kernel, dQ from the mma.sync backward's separate pass)."""
    check_backward_kernel(backward_kernel)
    if backward_kernel == "mma":
        return None
    why_not = None
    if arch != 90:
        why_not = (RuntimeError, f"the Hopper backward runs on sm_90 GPUs only (H100, H200); this GPU is sm_{arch}")
    elif head_dim not in HOPPER_BACKWARD_RUNG:
        why_not = (ValueError, f"the Hopper backward is built for head dims "
                               f"{' and '.join(map(str, HOPPER_BACKWARD_RUNG))}, got {head_dim} after padding")
    elif deterministic and backward_kernel == "auto":
        why_not = (ValueError, "deterministic=True runs the mma.sync backward unless backward_kernel='wgmma'")
    elif nvrtc_version is None or tuple(nvrtc_version) < HOPPER_NVRTC:
        why_not = (RuntimeError, f"NVRTC {nvrtc_version or 'of unknown version'} cannot target sm_90a (wgmma) "
                                 f"before {HOPPER_NVRTC[0]}.{HOPPER_NVRTC[1]}")
    if why_not is None:
        return HOPPER_DETERMINISTIC_RUNG if deterministic else HOPPER_BACKWARD_RUNG[head_dim]
    if backward_kernel == "wgmma":
        error, message = why_not
        raise error(f"backward_kernel='wgmma': {message}; accepted elsewhere: backward_kernel='mma' or 'auto'")
    return None


@dataclass(frozen=True)
class KernelPlan:
    """What ``cuda_attention`` runs for one (GPU, dtype, head dim): the forward it chose (``choice``: mma.sync
    or wgmma, the rung and why) and that forward's build (``forward``: kernel file, function, tiles, threads,
    defines), and the backward's configuration (``backward``) with the kernels it compiles
    (``backward_kernels``: step -> (kernel file, function, defines)); on sm_90 ``backward_rung`` names the
    Hopper backward's rung (``bwd_hopper.cu``) that runs instead of them (None: the mma.sync backward)."""
    capability: tuple
    dtype: torch.dtype
    head_dim: int          # as asked
    padded_dim: int        # what the kernels are built for
    choice: ForwardChoice
    forward: LaunchConfig | HopperConfig
    backward: BackwardConfig
    backward_kernels: dict
    backward_rung: str | None = None


def kernel_plan(capability, dtype: torch.dtype, head_dim: int, deterministic: bool = False,
                forward_kernel: str = "auto", nvrtc_version: tuple | None = HOPPER_NVRTC,
                smem_limit: int | None = None, backward_kernel: str = "auto") -> KernelPlan:
    """Which kernels and tiles ``cuda_attention`` runs on a GPU of compute capability ``capability``
    (``(9, 0)`` for an H100) for ``dtype`` and ``head_dim`` (any multiple of 8 up to 128, or 256 from sm_80):
    the forward (``forward_kernel`` as in ``cuda_attention``) and the backward (``deterministic``: the
    separate dQ pass; ``backward_kernel`` as in ``cuda_attention``). ``nvrtc_version``: the NVRTC that
    compiles them (wgmma needs 12.0 or later; the default assumes one); ``smem_limit``: shared memory per block (default: a typical GPU of that
    capability, :data:`SMEM_PER_BLOCK`). The causal mask changes no choice. ValueError (TypeError) naming the
    argument that is wrong. Cached: ``cuda_attention`` asks on every call."""
    if not (isinstance(capability, tuple) and len(capability) == 2 and all(type(c) is int for c in capability)):
        raise TypeError(f"capability must be a (major, minor) tuple of ints such as (9, 0), got {capability!r}")
    check_forward_kernel(forward_kernel)
    check_backward_kernel(backward_kernel)
    deterministic = check_bool("deterministic", deterministic)
    if not any(dtype is d for d in DTYPE_DEFINES):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    if type(head_dim) is not int:
        raise TypeError(f"head_dim must be an int, got {type(head_dim).__name__}")
    if smem_limit is not None:
        smem_limit = check_count("smem_limit", smem_limit)     # bytes per block
    return _kernel_plan(capability, dtype, head_dim, deterministic, forward_kernel,
                        None if nvrtc_version is None else tuple(nvrtc_version), smem_limit, backward_kernel)


@functools.lru_cache(maxsize=None)
def _kernel_plan(capability, dtype, head_dim, deterministic, forward_kernel, nvrtc_version, smem_limit,
                 backward_kernel):
    arch = 10 * capability[0] + capability[1]
    if smem_limit is None:
        if arch not in SMEM_PER_BLOCK:
            raise ValueError(f"capability {capability} has no shared-memory entry; accepted: "
                             f"{', '.join(f'({a // 10}, {a % 10})' for a in SMEM_PER_BLOCK)}, or pass smem_limit")
        smem_limit = SMEM_PER_BLOCK[arch]
    if arch < 75:
        raise ValueError(f"capability must be (7, 5) or newer (the kernels use mma.sync for sm_75), got {capability}")
    if dtype == torch.bfloat16 and arch < 80:
        raise ValueError(f"dtype bfloat16 needs capability (8, 0) or newer, got {capability}")
    wide = WIDE_DIMS if arch >= 80 else ()
    if head_dim <= 0 or head_dim % 8 or (head_dim > max(HEAD_DIMS) and head_dim not in wide):
        raise ValueError(f"head_dim must be a positive multiple of 8 up to {max(HEAD_DIMS)}"
                         f"{' or 256' if wide else ''} on capability {capability}, got {head_dim!r}")
    d = padded_dim(head_dim)
    choice = choose_forward(forward_kernel, arch, dtype, d, nvrtc_version)
    if choice.kernel == "wgmma":
        fwd = hopper_config(choice.variant, dtype, d, consumers=choice.consumers, **dict(choice.options))
    else:
        fwd = launch_config(choice.variant, dtype, d, arch, smem_limit)
    bwd = pick_config(d, arch, smem_limit, deterministic)
    return KernelPlan(capability, dtype, head_dim, d, choice, fwd, bwd, kernel_builds(bwd, dtype),
                      choose_backward_rung(backward_kernel, arch, d, deterministic, nvrtc_version))


def attention_builds(dtype: torch.dtype, head_dim: int, arch: int, smem_limit: int,
                     deterministic: bool = False) -> dict[str, tuple[str, str, dict]]:
    """What the first ``cuda_attention`` forward and backward compile on an sm_``arch`` GPU with
    ``smem_limit`` bytes per block, at (unpadded) ``head_dim``: step name -> (source, kernel,
    defines); ``"forward"`` then the backward's steps (:func:`kernel_builds`)."""
    d = padded_dim(head_dim)
    fwd = launch_config(fast_variant(d, arch), dtype, d, arch, smem_limit)
    return {"forward": (fwd.source, fwd.kernel, fwd.define_dict),
            **kernel_builds(pick_config(d, arch, smem_limit, deterministic), dtype)}


#: the GPUs of :func:`plan_table`: the book's reference GPUs, one per architecture
PLAN_GPUS = {(7, 5): "T4", (8, 0): "A100", (9, 0): "H100/H200"}


def _forward_cell(plan: KernelPlan) -> str:
    f = plan.forward
    defs = f.define_dict
    if isinstance(f, HopperConfig):
        consumers = (f.threads - 128) // 128
        opts = ", ".join(name for name, _ in plan.choice.options)
        return (f"`{f.source}` `{f.kernel}`: {f.block_m} x {f.block_n} tiles, {consumers} consumer warpgroups"
                + (f", {opts}" if opts else ""))
    step = plan.choice.variant
    tiles = f"{f.block_m} x {defs.get('V3_BLOCK_N', defs.get('V4_BLOCK_N'))}"
    stages = defs.get("V3_STAGES")
    return (f"`{f.source}` `{f.kernel}` ({step}): {tiles} tiles, {f.threads // 32} warps"
            + (f", {stages} stage{'s' if stages > 1 else ''}" if stages else ""))


#: what each rung of the Hopper backward that ships adds (plan_table's words)
_HOPPER_BACKWARD_CELL = {"b3": "wgmma for the five products, TMA ring, dQ tiles by TMA reduce-add",
                         "b4": "wgmma for the five products, TMA ring, dQ tiles by TMA reduce-add issued first"}


def _backward_cell(cfg: BackwardConfig, rung: str | None = None) -> str:
    if rung is not None:
        return f"`bwd_hopper.cu` rung {rung}: {_HOPPER_BACKWARD_CELL[rung]}"
    what = ("dQ by atomics" if cfg.dq_atomic else "separate dQ pass") + f", {cfg.warps} warps"
    what += f", {16 * cfg.warps} keys x {cfg.dkdv_block_m} queries, {cfg.stages} stage{'s' if cfg.stages > 1 else ''}"
    extras = [name for name, on in (("warp grid", cfg.warp_grid), ("staged dQ", cfg.dq_stage),
                                    ("one barrier", cfg.one_barrier), ("dK, dV split", cfg.split)) if on]
    return what + "".join(f", {e}" for e in extras)


def plan_table() -> str:
    """The Markdown table of :func:`kernel_plan` for the book's reference GPUs (:data:`PLAN_GPUS`), each
    dtype they take and every head dim the kernels are built for: the forward's kernel file, function and
    tiles, and the backward's configuration, default and deterministic."""
    rows = ["| GPU | dtype | D | forward | backward | backward, deterministic |", "|---|---|---|---|---|---|"]
    for cap, gpu in PLAN_GPUS.items():
        arch = 10 * cap[0] + cap[1]
        for dtype in ((torch.float16, torch.bfloat16) if arch >= 80 else (torch.float16,)):
            for d in HEAD_DIMS + (WIDE_DIMS if arch >= 80 else ()):
                plan = kernel_plan(cap, dtype, d)
                det = kernel_plan(cap, dtype, d, deterministic=True).backward
                rows.append(f"| {gpu} (sm_{arch}) | {str(dtype).removeprefix('torch.')} | {d} | {_forward_cell(plan)} "
                            f"| {_backward_cell(plan.backward, plan.backward_rung)} | {_backward_cell(det)} |")
    return "\n".join(rows) + "\n"

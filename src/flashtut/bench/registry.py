"""The implementations the harness can time, by name.

Each entry knows how to run a forward, how to run its backward (through autograd, through an
explicit backward function, or not at all), and whether it can run here: ``available(device,
dtype, D)`` returns ``(True, "")`` or ``(False, reason)``. The fused kernels are written in
other modules and imported only when asked about, so a machine without triton, cupy or a GPU
gets a reason instead of a traceback.

Names: ``naive``, ``tiled``, ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``, ``sdpa-math``,
``triton``, ``cuda`` (``cuda_attention``: the wgmma forward and backward on sm_90 GPUs), ``cuda-mma`` (the
same with the mma.sync forward and backward everywhere), the CUDA forward ladder ``cuda-v1``, ``cuda-v2``, ... discovered at run
time from ``flashtut.cuda.VARIANTS``, and the fast kernel at another tile shape,
``cuda-v3[wW,nN,mtM]`` (W warps, N keys per tile, M 16-row tiles per warp; the launch function's
``warps``, ``block_n`` and ``m_tiles``), and the Hopper rungs of chapter 11 (sm_90 only, forward only):
``hopper-w1`` and its variants ``hopper-w1[pv128]`` (one 128-column wgmma for P V) and
``hopper-w1[n64]`` (64-key tiles), rung W2 (TMA loads, mbarrier ring, producer warpgroup), ``hopper-w2``, and
rung W3 (W2 with the softmax overlapped with the tensor cores: pipelined and ping-pong consumers),
``hopper-w3``, with three consumer warpgroups at D = 64 ``hopper-w3[c3]``, and rung W4 (W3 with
persistent blocks) ``hopper-w4`` and ``hopper-w4[c3]``; the deeper rings and 64-key tiles of W3, and W3
with the build options ``cuda_attention`` ships (:data:`HOPPER_IMPLS`).
Groups: ``all``, ``sdpa``, ``cuda-ladder``, ``cuda-tiles`` (the shapes of :data:`TILE_CHOICES`),
``hopper``, ``hopper-options``.

Tests and chapters may ``register`` their own entries (for example a deliberately wrong one,
to see the correctness check catch it).
"""
from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

AUTOGRAD = "autograd"

#: the tiled PyTorch loop makes ~10 small tensor operations per 64 x 64 tile: beyond these many
#: tiles per call it is minutes per measurement, so it is refused unless forced
TILED_MAX_TILES = {"speed": 1024, "memory": 16384}

_LOWP = (torch.float16, torch.bfloat16)
_ALL = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _ok(device, dtype, D):
    return True, ""


@dataclass
class Impl:
    """One implementation the harness can time.

    ``forward(q, k, v, causal, scale)`` returns ``o`` or ``(o, lse)``. ``backward`` is ``AUTOGRAD``
    (``o.backward(do)`` through the forward), ``None`` (forward only) or an explicit
    ``backward(q, k, v, o, lse, do, causal, scale) -> (dq, dk, dv)``, which needs
    ``forward_lse(q, k, v, causal, scale) -> (o, lse)``. ``size_limit(B, H, Nq, Nk, D, purpose)``
    returns a reason to refuse a shape (``purpose`` is ``"speed"`` or ``"memory"``), or None.
    ``context()`` is entered around every call (the SDPA backend choice). ``quadratic_bytes``
    estimates the memory of a materialised-score implementation, so a CPU memory sweep can stop
    before the operating system kills the process instead of raising an error.
    """

    name: str
    description: str
    forward: Callable
    backward: Callable | str | None = None
    forward_lse: Callable | None = None
    available: Callable[[torch.device, torch.dtype, int], tuple[bool, str]] = _ok
    size_limit: Callable | None = None
    context: Callable[[], ContextManager] = contextlib.nullcontext
    quadratic_bytes: Callable | None = None
    group: str = ""

    @property
    def has_backward(self) -> bool:
        return self.backward is not None

    def check(self, device, dtype, D: int, shape=None, purpose: str = "speed", force: bool = False):
        """``None`` when this implementation can run the case, else the reason it cannot."""
        try:
            ok, reason = self.available(torch.device(device), dtype, D)
        except Exception as e:  # noqa: BLE001 - an availability probe must never crash a sweep
            ok, reason = False, f"{type(e).__name__}: {e}"
        if not ok:
            return reason or "not available here"
        if shape is not None and self.size_limit is not None and not force:
            return self.size_limit(*shape, purpose)
        return None


# ------------------------------------------------------------------------------- entries
def _naive_fwd(q, k, v, causal, scale):
    from ..reference import naive_attention
    return naive_attention(q, k, v, causal=causal, scale=scale)


def _naive_bytes(B, H, Nq, Nk, D, dtype):
    # scores, masked scores and probabilities in float32 (float64 for float64 inputs)
    item = 8 if dtype == torch.float64 else 4
    return 3 * B * H * Nq * Nk * item


def _tiled_fwd(q, k, v, causal, scale):
    from ..tiled import tiled_attention
    return tiled_attention(q, k, v, causal=causal, scale=scale)


def _tiled_fwd_lse(q, k, v, causal, scale):
    from ..tiled import tiled_attention
    return tiled_attention(q, k, v, causal=causal, scale=scale, return_lse=True)


def _tiled_bwd(q, k, v, o, lse, do, causal, scale):
    from ..tiled import tiled_attention_backward
    return tiled_attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale)


def _tiled_limit(B, H, Nq, Nk, D, purpose="speed", block=64):
    tiles = math.ceil(Nq / block) * math.ceil(Nk / block)
    limit = TILED_MAX_TILES.get(purpose, TILED_MAX_TILES["speed"])
    if tiles > limit:
        return (f"tiled is a Python loop over {block}x{block} tiles: Nq={Nq}, Nk={Nk} is {tiles} tiles "
                f"per call (limit {limit} for a {purpose} run); pass --force to run it anyway")
    return None


_SDPA = {  # name -> (SDPBackend member, dtypes it supports, what it is)
    "sdpa-flash": ("FLASH_ATTENTION", _LOWP, "PyTorch SDPA, flash backend (FlashAttention-2 inside PyTorch)"),
    "sdpa-cudnn": ("CUDNN_ATTENTION", _LOWP, "PyTorch SDPA, cuDNN backend"),
    "sdpa-efficient": ("EFFICIENT_ATTENTION", (torch.float16, torch.bfloat16, torch.float32),
                       "PyTorch SDPA, memory-efficient backend (xFormers kernels)"),
    "sdpa-math": ("MATH", _ALL, "PyTorch SDPA, math backend (unfused PyTorch operations)"),
}


def _sdpa_fwd(q, k, v, causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _sdpa_context(member: str):
    def ctx():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(getattr(SDPBackend, member))
    return ctx


def _sdpa_available(name: str, dtypes):
    def available(device, dtype, D):
        if device.type != "cuda":
            return False, f"{name} is timed on CUDA GPUs only (this run is on {device.type})"
        if dtype not in dtypes:
            return False, (f"{name} does not support {_dtype_name(dtype)} "
                           f"(supports {', '.join(_dtype_name(d) for d in dtypes)})")
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except ImportError as e:
            return False, f"this torch has no torch.nn.attention.sdpa_kernel ({e}); needs torch >= 2.3"
        return True, ""
    return available


def _import_reason(module: str, hint: str) -> str | None:
    """None when ``module`` imports, else why not (with how to fix it)."""
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure makes the entry unavailable
        return f"cannot import {module} ({type(e).__name__}: {e}); {hint}"
    return None


def _triton_available(device, dtype, D):
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return False, ("triton runs on CUDA GPUs; on the CPU set TRITON_INTERPRET=1 before "
                           "importing flashtut to use the (slow) interpreter")
        if dtype not in (torch.float32, torch.float16):
            return False, f"the Triton interpreter path runs float32 and float16, not {_dtype_name(dtype)}"
    elif device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major < 8:
            return False, f"the Triton kernels need a GPU of sm_80 or newer (this one is sm_{major}x)"
    reason = (_import_reason("triton", "install it with pip install triton (Linux)")
              or _import_reason("flashtut.triton.attention", "see the Triton chapter's set-up"))
    if reason:
        return False, reason
    kernels = importlib.import_module("flashtut.triton.attention")
    interpreting = getattr(kernels, "interpreting", None)
    if device.type == "cpu" and callable(interpreting) and not interpreting():
        return False, ("triton was imported before TRITON_INTERPRET=1 was set, so its kernels are built "
                       "for the GPU; set it before the first import of flashtut or triton")
    return True, ""


def _triton_fwd(q, k, v, causal, scale):
    from ..triton.attention import triton_attention
    return triton_attention(q, k, v, causal=causal, scale=scale)


def _cupy_reason() -> str | None:
    return _import_reason("cupy", "install CuPy for your CUDA version (pip install cupy-cuda12x or cupy-cuda13x)")


def _cuda_available(module: str):
    def available(device, dtype, D):
        if device.type != "cuda":
            return False, f"the CUDA kernels run on CUDA GPUs only (this run is on {device.type})"
        if dtype not in _LOWP:
            return False, f"the CUDA kernels run float16 and bfloat16, not {_dtype_name(dtype)}"
        if dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] < 8:
            return False, "bfloat16 needs a GPU of sm_80 or newer"
        reason = _cupy_reason() or _import_reason(module, "see the CUDA chapter's set-up")
        return (False, reason) if reason else (True, "")
    return available


def _cuda_fwd(q, k, v, causal, scale):
    from ..cuda.attention import cuda_attention
    return cuda_attention(q, k, v, causal=causal, scale=scale)


def _cuda_mma_fwd(q, k, v, causal, scale):
    from ..cuda.attention import cuda_attention
    return cuda_attention(q, k, v, causal=causal, scale=scale, forward_kernel="mma", backward_kernel="mma")


def _ladder_fwd(variant: str):
    def fwd(q, k, v, causal, scale):
        from ..cuda.attention import cuda_forward
        return cuda_forward(q, k, v, causal=causal, scale=scale, variant=variant)
    return fwd


@dataclass(frozen=True)
class HopperBuild:
    """One build of a Hopper rung (chapter 11), as ``flashtut.cuda.hopper.forward_hopper`` takes it: the rung,
    keys per tile, W1's P V split, the TMA ring's stages, consumer warpgroups and the W3 family's build
    ``options`` (``flashtut.cuda.configs.W3_OPTIONS`` names -> values)."""
    variant: str
    block_n: int = 128
    pv_split: bool = True
    stages: int = 2
    consumers: int = 2
    options: tuple = ()    # sorted (name, value) pairs

    @property
    def option_dict(self) -> dict:
        return dict(self.options)


def _build(variant: str, *, options: dict | None = None, **shape) -> HopperBuild:
    return HopperBuild(variant, **shape, options=tuple(sorted((options or {}).items())))


#: the Hopper builds the harness can time, by name: each rung at its defaults (group ``hopper``); the
#: shapes chapter 11 measures against them, 128-column P V and 64-key tiles for W1, deeper rings and 64-key
#: tiles for W3 (group ``hopper-ring``); and the build options ``cuda_attention`` ships
#: (``configs.HOPPER_OPTIONS``) one step at a time: the TMA store at D = 128 (``[store]``), the three
#: consumers' turns, the uniform warpgroup index and the short query block first at D = 64 (``[c3,turns]``,
#: ``[c3,turns,uni]``, ``[c3,turns,tail,uni]``), and W4 with the turns (group ``hopper-options``)
HOPPER_IMPLS = {
    "hopper-w1": _build("w1"),
    "hopper-w1[pv128]": _build("w1", pv_split=False),
    "hopper-w1[n64]": _build("w1", block_n=64),
    "hopper-w2": _build("w2"),
    "hopper-w3": _build("w3"),
    "hopper-w3[c3]": _build("w3", consumers=3),
    "hopper-w3[s3]": _build("w3", stages=3),
    "hopper-w3[s4]": _build("w3", stages=4),
    "hopper-w3[c3,s3]": _build("w3", stages=3, consumers=3),
    "hopper-w3[c3,n64]": _build("w3", block_n=64, consumers=3),
    "hopper-w4": _build("w4"),
    "hopper-w4[c3]": _build("w4", consumers=3),
    "hopper-w3[store]": _build("w3", options={"tma_store": True}),
    "hopper-w3[c3,turns]": _build("w3", consumers=3, options={"c3_turns": True}),
    "hopper-w3[c3,turns,uni]": _build("w3", consumers=3, options={"c3_turns": True, "uniform_wg": True}),
    "hopper-w3[c3,turns,tail,uni]": _build("w3", consumers=3,
                                           options={"c3_turns": True, "tail_first": True, "uniform_wg": True}),
    "hopper-w4[c3,turns]": _build("w4", consumers=3, options={"c3_turns": True}),
}


def hopper_name(variant: str, consumers: int, options: dict) -> str:
    """The registry name of Hopper rung ``variant`` with ``consumers`` consumer warpgroups and the build
    ``options`` (flashtut.cuda.configs.W3_OPTIONS), at 128-key tiles and two stages: ``hopper_name("w3",
    3, {"c3_turns": True})`` is ``"hopper-w3[c3,turns]"``. ValueError where the registry has none."""
    want = _build(variant, consumers=consumers, options=options)
    for name, build in HOPPER_IMPLS.items():
        if build == want:
            return name
    raise ValueError(f"no Hopper implementation of rung {variant!r} with {consumers} consumers and options "
                     f"{options}; named ones: {', '.join(HOPPER_IMPLS)}")


#: what each rung adds to wgmma, for the implementation's description
_HOPPER_ADDS = {"w1": "", "w2": ", TMA", "w3": ", TMA, softmax overlapped: pipelined and ping-pong warpgroups",
                "w4": ", TMA, softmax overlapped, persistent blocks"}


def _hopper_impl(name: str, build: HopperBuild) -> Impl:
    variant, block_n, pv_split, stages, consumers = (build.variant, build.block_n, build.pv_split, build.stages,
                                                     build.consumers)
    options = {} if stages == 2 else {"stages": stages}
    if consumers != 2:
        options["consumers"] = consumers
    options.update(build.option_dict)
    from ..cuda.configs import W3_OPTIONS   # what each build option does, said once

    def fwd(q, k, v, causal, scale):
        from ..cuda.hopper import forward_hopper
        return forward_hopper(q, k, v, causal=causal, scale=scale, variant=variant, block_n=block_n,
                              pv_split=pv_split, **options)

    cuda_ok = _cuda_available("flashtut.cuda.hopper")

    def available(device, dtype, D):
        ok, reason = cuda_ok(device, dtype, D)
        if ok and tuple(torch.cuda.get_device_capability(device)) != (9, 0):
            return False, "the Hopper kernels use wgmma, which only sm_90 GPUs (H100, H200) have"
        if ok and consumers == 3 and D != 64:
            return False, "three consumer warpgroups are built for D = 64 only (at 128 their registers spill)"
        return ok, reason

    adds = _HOPPER_ADDS[variant] if consumers == 2 else ", TMA, three pipelined consumer warpgroups" \
        + (", persistent blocks" if variant == "w4" else "")
    return Impl(name, f"Hopper rung {variant.upper()} (wgmma{adds}), {block_n} keys per tile"
                + ("" if pv_split else ", one 128-column wgmma for P V")
                + ("" if stages == 2 else f", a ring of {stages} K/V stages")
                + ("" if consumers == 2 else ", 192-row blocks")
                + "".join(f"; {opt} = {value}: {W3_OPTIONS[opt][3]}" for opt, value in build.options)
                + " (forward only, sm_90)",
                fwd, None, available=available,
                group=("hopper-ring" if stages != 2 or (variant != "w1" and block_n != 128)
                       else "hopper-options" if build.options else "hopper"))


def _builtin() -> dict[str, Impl]:
    impls = [
        Impl("naive", "standard attention, full score matrix (flashtut.naive_attention); backward by autograd",
             _naive_fwd, AUTOGRAD, quadratic_bytes=_naive_bytes, group="reference"),
        Impl("tiled", "FlashAttention-2 as PyTorch loops (flashtut.tiled_attention, tiled_attention_backward)",
             _tiled_fwd, _tiled_bwd, forward_lse=_tiled_fwd_lse, size_limit=_tiled_limit, group="reference"),
    ]
    for name, (member, dtypes, what) in _SDPA.items():
        impls.append(Impl(name, f"{what}; backward by autograd", _sdpa_fwd, AUTOGRAD,
                          available=_sdpa_available(name, dtypes), context=_sdpa_context(member),
                          quadratic_bytes=_naive_bytes if name == "sdpa-math" else None, group="sdpa"))
    impls += [
        Impl("triton", "fused Triton kernels (flashtut.triton_attention); backward through autograd",
             _triton_fwd, AUTOGRAD, available=_triton_available, group="kernel"),
        Impl("cuda", "fused CUDA C kernels via CuPy (flashtut.cuda_attention); backward through autograd",
             _cuda_fwd, AUTOGRAD, available=_cuda_available("flashtut.cuda.attention"), group="kernel"),
        Impl("cuda-mma", "cuda_attention with forward_kernel='mma' and backward_kernel='mma': chapter 08's mma.sync "
             "kernels on every GPU (on sm_90 'cuda' runs the wgmma ones); backward through autograd", _cuda_mma_fwd, AUTOGRAD,
             available=_cuda_available("flashtut.cuda.attention"), group="kernel"),
    ]
    impls += [_hopper_impl(name, build) for name, build in HOPPER_IMPLS.items()]
    return {i.name: i for i in impls}


_REGISTRY: dict[str, Impl] = _builtin()
_LADDER_RE = re.compile(r"^cuda-(v\d+\w*)$")
_TILE_RE = re.compile(r"^cuda-v3\[w(\d+),n(\d+),mt(\d+)\]$")
GROUPS = ("all", "sdpa", "cuda-ladder", "cuda-tiles", "hopper", "hopper-options")

#: (warps, keys per tile, 16-row tiles per warp) of the fast kernel tried by the group ``cuda-tiles``,
#: per head dim: the exploration behind the kernel's default tile shapes
TILE_CHOICES = {128: [(8, 64, 1), (8, 128, 1), (4, 64, 1), (4, 32, 2), (8, 32, 2), (4, 64, 2)],
                64: [(8, 64, 1), (8, 128, 1), (4, 128, 1), (4, 64, 2), (8, 64, 2), (4, 128, 2)]}


def tile_name(warps: int, block_n: int, m_tiles: int) -> str:
    return f"cuda-v3[w{warps},n{block_n},mt{m_tiles}]"


def _tile_impl(name: str, warps: int, block_n: int, m_tiles: int) -> Impl:
    def fwd(q, k, v, causal, scale):
        from ..cuda.attention import cuda_forward
        return cuda_forward(q, k, v, causal=causal, scale=scale, variant="v3", warps=warps,
                            block_n=block_n, m_tiles=m_tiles)

    cuda_ok = _cuda_available("flashtut.cuda.attention")

    def available(device, dtype, D):
        if (warps, block_n, m_tiles) not in TILE_CHOICES.get(D, ()):
            return False, f"tile shape {name} is not among TILE_CHOICES for D={D}"
        return cuda_ok(device, dtype, D)

    return Impl(name, f"the fast CUDA forward at {warps} warps, {block_n} keys per tile, {m_tiles} 16-row "
                "tiles per warp (forward only)", fwd, None, available=available, group="cuda-tiles")


def triton_tuning() -> dict:
    """The configuration Triton's autotuner picked for each key so far (empty when the Triton
    kernels were not imported, or autotuning is off): recorded with a run's results."""
    mod = sys.modules.get("flashtut.triton.attention")   # not imported: the kernels never ran
    return mod.best_configs() if mod is not None else {}


# ------------------------------------------------------------------------------ the ladder
def ladder_variants() -> tuple[dict[str, str], str | None]:
    """``({variant: description}, None)`` from ``flashtut.cuda.VARIANTS``, or ``({}, reason)``."""
    try:
        mod = importlib.import_module("flashtut.cuda")
    except Exception as e:  # noqa: BLE001
        return {}, f"cannot import flashtut.cuda ({type(e).__name__}: {e})"
    variants = getattr(mod, "VARIANTS", None)
    if not isinstance(variants, dict) or not variants:
        return {}, "flashtut.cuda has no VARIANTS dict (the forward ladder is not registered yet)"
    return {str(k): str(v) for k, v in variants.items()}, None


def _ladder_impl(variant: str, description: str) -> Impl:
    return Impl(f"cuda-{variant}", f"CUDA forward ladder step {variant}: {description} (forward only)",
                _ladder_fwd(variant), None, available=_cuda_available("flashtut.cuda.attention"),
                group="cuda-ladder")


def _missing_ladder_impl(name: str, reason: str) -> Impl:
    def available(device, dtype, D):
        return False, reason
    return Impl(name, "CUDA forward ladder step (not found)", _ladder_fwd(name[5:]), None,
                available=available, group="cuda-ladder")


# --------------------------------------------------------------------------------- lookup
def register(impl: Impl, replace: bool = False) -> Impl:
    """Add an implementation (``replace=True`` to overwrite an entry of the same name)."""
    if not isinstance(impl, Impl):
        raise TypeError(f"impl must be a flashtut.bench.registry.Impl, got {type(impl).__name__}")
    if impl.name in _REGISTRY and not replace:
        raise ValueError(f"an implementation named {impl.name!r} is already registered; pass replace=True")
    if impl.name in GROUPS:
        raise ValueError(f"{impl.name!r} is a group name; pick another name")
    _REGISTRY[impl.name] = impl
    return impl


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


@contextlib.contextmanager
def registered(impl: Impl):
    """Register ``impl`` for the duration of a ``with`` block (tests, notebooks)."""
    register(impl, replace=True)
    try:
        yield impl
    finally:
        unregister(impl.name)


def names(include_ladder: bool = True) -> list[str]:
    """Every registered name, the discovered CUDA ladder steps last."""
    out = list(_REGISTRY)
    if include_ladder:
        variants, _ = ladder_variants()
        out += [f"cuda-{v}" for v in variants if f"cuda-{v}" not in _REGISTRY]
    return out


def get(name: str) -> Impl:
    """The implementation called ``name``; ``ValueError`` listing the known names if none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    m = _TILE_RE.match(name)
    if m:
        return _tile_impl(name, *(int(g) for g in m.groups()))
    m = _LADDER_RE.match(name)
    if m:
        variants, reason = ladder_variants()
        if m.group(1) in variants:
            return _ladder_impl(m.group(1), variants[m.group(1)])
        if reason is not None:        # the ladder cannot be listed here: say why when it is asked for
            return _missing_ladder_impl(name, reason)
    raise ValueError(f"unknown implementation {name!r}; known: {', '.join(names())} "
                     f"(groups: {', '.join(GROUPS)})")


def expand(spec) -> list[Impl]:
    """Implementations for a list of names and groups (or one comma-separated string)."""
    if isinstance(spec, str):
        spec = [spec]
    out: list[str] = []
    for item in spec:
        # commas inside brackets belong to a name (cuda-v3[w8,n64,mt1], hopper-w3[c3,turns])
        for name in (s.strip() for s in re.split(r",(?![^\[]*\])", str(item))):
            if not name:
                continue
            if name == "all":
                group = names()
            elif name in ("sdpa", "hopper", "hopper-options"):
                group = [n for n in _REGISTRY if _REGISTRY[n].group == name]
            elif name == "cuda-ladder":
                group = [f"cuda-{v}" for v in ladder_variants()[0]]
            elif name == "cuda-tiles":
                group = list(dict.fromkeys(tile_name(*t) for ts in TILE_CHOICES.values() for t in ts))
            else:
                get(name)            # raises for an unknown name
                group = [name]
            out += [n for n in group if n not in out]
    if not out:
        raise ValueError("no implementation given; known: " + ", ".join(names()))
    return [get(n) for n in out]

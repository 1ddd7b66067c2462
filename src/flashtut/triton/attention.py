"""Fused FlashAttention-2 in Triton: forward, backward with recomputation, autograd.

Public functions (``flashtut.triton_attention`` calls the first):

* ``triton_attention(q, k, v, causal=False, scale=None, window=None) -> o``, differentiable; a
  PyTorch custom operator (``torch.ops.flashtut.triton_attention_fwd`` with its backward
  ``triton_attention_bwd``), so ``torch.compile(..., fullgraph=True)`` keeps it in one graph.
  The autograd node saves only ``q, k, v, o`` and the log-sum-exp.
* ``triton_forward(q, k, v, causal=False, scale=None, window=None) -> (o, lse)``
* ``triton_backward(q, k, v, o, lse, do, causal=False, scale=None, window=None) -> (dq, dk, dv)``
* ``varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, window=None,
  backend="triton")``: packed sequences of different lengths, ``(total, H, D)``.

``k``/``v`` may have fewer heads than ``q`` (grouped-query), ``causal`` is ``False``, ``True``/
``"top-left"`` or ``"bottom-right"``, ``window`` a sliding window (with a causal alignment). Head
dims 1 to 256 (``MAX_HEAD_DIM``, FlashAttention's range); one that is not a power of two runs
zero-padded to the next (at least 16), so 160, 192 and 224 cost what 256 costs.

The kernels live in ``flashtut.triton.forward`` and ``flashtut.triton.backward``, their search
space in ``flashtut.triton.configs``. On a CUDA GPU (sm_80 or newer) each kernel is autotuned once
per (GPU generation, dtype, head dim, causal, length class); under the Triton interpreter
(``TRITON_INTERPRET=1`` set before the first ``import triton``) they run on CPU tensors with
one tiny fixed configuration.
"""
from __future__ import annotations

import contextlib
import os

import torch

from ..checks import (check_bool, check_like, check_lse, check_mask, check_qkv, check_scale, check_tensor,
                      check_varlen, raise_if_flagged, raise_if_overflowed, rows_that_see_keys,
                      scores_can_overflow)
from ..constants import LOG2E
from ..reference import naive_varlen_attention
from . import configs
from .configs import TileConfig

try:  # the kernels need triton; importing flashtut does not
    import triton  # absolute: the real triton package, not this flashtut.triton

    from . import backward, forward
    _IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by a test that hides triton
    triton = None
    _IMPORT_ERROR = exc

#: dtypes the kernels accept (float64 has no fast tensor-core path in Triton: use tiled_attention)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: largest head dimension, as in FlashAttention; every other one is zero-padded inside the kernels
#: to the next power of two (at least 16): 160, 192 and 224 run as 256
MAX_HEAD_DIM = 256


def interpreting() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` was
    set before triton was first imported)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(forward.attn_fwd_kernel, InterpretedFunction)


def _require_runtime(t: torch.Tensor) -> None:
    """Raise the documented RuntimeError when the kernels cannot run on ``t``'s device."""
    if triton is None:
        raise RuntimeError(
            f"triton_attention needs the triton package, which failed to import ({_IMPORT_ERROR}). "
            "Install it with `pip install triton` (Linux; it ships with PyTorch's CUDA wheels), "
            "or use flashtut.tiled_attention, which needs only PyTorch.")
    if t.device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(t.device)
        if major < 8 and not interpreting():
            raise RuntimeError(
                f"triton_attention needs a GPU of compute capability sm_80 or newer (Ampere, Ada, "
                f"Hopper); this one ({torch.cuda.get_device_name(t.device)}) is sm_{major}{minor}, "
                "which Triton does not support (Colab's free T4 is sm_75). Use "
                "flashtut.cuda_attention (CUDA C kernels that run on sm_75) or "
                "flashtut.tiled_attention (plain PyTorch) instead.")
        return
    if t.device.type == "cpu":
        if not interpreting():
            raise RuntimeError(
                "triton_attention got CPU tensors, but Triton compiles for GPUs: run on a CUDA GPU, "
                "or set TRITON_INTERPRET=1 before importing (os.environ['TRITON_INTERPRET'] = '1' "
                "before the first `import flashtut` / `import triton`) to use Triton's CPU interpreter.")
        return
    raise RuntimeError(f"triton_attention runs on CUDA tensors (or CPU tensors under "
                       f"TRITON_INTERPRET=1), got tensors on {t.device}")


def _check_inputs(q, k, v, causal, scale, o=None, lse=None, do=None, window=None):
    """Argument errors first (ValueError/TypeError), then whether the kernels can run here.
    Returns ``(B, H, Nq, Nk, D, mask, scale)`` with ``mask = (alignment, window)``."""
    B, H, Nq, Nk, D = check_qkv(q, k, v, gqa=True)
    mask = check_mask(causal, window, Nq, Nk)
    scale = check_scale(scale, D)
    if q.dtype not in KERNEL_DTYPES:
        raise ValueError(
            f"q, k and v have dtype {str(q.dtype).replace('torch.', '')}; the Triton kernels accept "
            "float16, bfloat16 or float32 (for float64 use flashtut.tiled_attention)")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {D} is not supported by the Triton kernels; accepted: "
                         f"1 to {MAX_HEAD_DIM} (dims that are not a power of two are zero-padded to the next one)")
    if do is not None or o is not None or lse is not None:
        check_tensor("do", do)
        check_like("o", o, q)
        check_like("do", do, q)
        check_lse(lse, B, H, Nq, q.device)
    _require_runtime(q)
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        raise ValueError("q has dtype bfloat16, which the Triton CPU interpreter does not support; "
                         "accepted on CPU: float16 or float32 (bfloat16 runs on the GPU)")
    return B, H, Nq, Nk, D, mask, scale


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # the kernels address rows through strides but assume unit stride along D (16-byte loads)
    return t if t.stride(-1) == 1 else t.contiguous()


def _block_d(D: int) -> int:
    return max(16, triton.next_power_of_2(D))


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs get exact fp32 products; "tf32" (Triton's default) would round them to
    # 10-bit mantissas. For fp16/bf16 the setting is ignored.
    return "ieee" if dtype == torch.float32 else "tf32"


# -- kernel selection: autotuned on GPUs, one fixed configuration in the interpreter ---------

_TUNED: dict = {}


#: what each kernel's autotuner keys on besides the tensors' dtypes (which Triton adds itself)
_TUNE_KEYS = {"fwd": ["N_BUCKET", "BLOCK_D", "CAUSAL", "WINDOW", "VARLEN"]}
_TUNE_KEYS["dq"] = _TUNE_KEYS["fwd"] + ["DS_FP32"]
_TUNE_KEYS["dkdv"] = _TUNE_KEYS["dq"] + ["FUSED_DQ", "GROUPED", "WIDE_ROWS"]


def _tuned(kernel: str, jit_fn, capability, fp32: bool, block_d: int, window: bool = False):
    """The autotuner for ``kernel`` on this GPU generation, dtype class and head-dim class.
    Its key adds the length class, the mask and the backward's variants (``_TUNE_KEYS``)."""
    gen = configs.generation(capability)
    space = configs.search_space(kernel, capability, fp32, block_d, window)
    key = (kernel, gen, fp32, tuple(space))   # one autotuner per distinct search space
    if key not in _TUNED:
        candidates = [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n},
                                    num_warps=c.num_warps, num_stages=c.num_stages) for c in space]

        def bench(fn, quantiles):  # shorter than the default 25 ms + 100 ms per config
            return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles)

        # the fused dK/dV kernel adds into DQ: every timed run must start from zeros (without
        # FUSED_DQ the caller passes dk there, which the kernel overwrites anyway)
        reset = ["DQ"] if kernel == "dkdv" else None
        _TUNED[key] = triton.autotune(configs=candidates, key=_TUNE_KEYS[kernel], reset_to_zero=reset,
                                      do_bench=bench)(jit_fn)
    return _TUNED[key]


_FORCED: dict = {}


@contextlib.contextmanager
def use_configs(**pinned):
    """Run the kernels with fixed configurations instead of autotuning, e.g.
    ``with use_configs(fwd=TileConfig(128, 64, 8, 3)): ...`` (keys ``fwd``, ``dkdv``, ``dq``).
    For experiments in the chapter and for tests that check every configuration."""
    unknown = set(pinned) - {"fwd", "dkdv", "dq"}
    if unknown:
        raise ValueError(f"use_configs takes fwd, dkdv and dq, got {sorted(unknown)}")
    for name, cfg in pinned.items():
        if not isinstance(cfg, TileConfig):
            raise TypeError(f"use_configs: {name} must be a TileConfig, got {type(cfg).__name__}")
        configs.check_tile_config(name, cfg)
    saved = dict(_FORCED)
    _FORCED.update(pinned)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(saved)


def _fixed_configs(kernel: str, dtype, device, block_d: int, window: bool = False):
    """The configurations to launch without a sweep, in order (the first that fits the GPU's
    shared memory runs), or None to autotune."""
    if kernel in _FORCED:
        return [_FORCED[kernel]]
    if interpreting():
        return [configs.INTERPRETER[kernel]]
    if os.environ.get("FLASHTUT_TRITON_AUTOTUNE", "1") == "0":   # e.g. quick GPU tests
        cap = torch.cuda.get_device_capability(device)
        return configs.search_space(kernel, cap, dtype == torch.float32, block_d, window)
    return None


#: (kernel, device, configuration, compile-time arguments) of every fixed configuration that asked for
#: more shared memory than its GPU gives a block: skipped from then on (empty on most machines, so
#: the launch path pays nothing for it)
_TOO_BIG: set = set()


def _launch_fixed(kernel: str, jit_fn, grid_rows: int, bh: int, args: list, meta: dict, device, cands) -> None:
    tile_key = "BLOCK_N" if kernel == "dkdv" else "BLOCK_M"
    for i, c in enumerate(cands):
        if _TOO_BIG and (kernel, device, c, *meta.values()) in _TOO_BIG:
            continue
        grid = (triton.cdiv(grid_rows, c.block_m if tile_key == "BLOCK_M" else c.block_n), bh)
        launch = dict(meta, BLOCK_M=c.block_m, BLOCK_N=c.block_n)
        if not interpreting():
            launch.update(num_warps=c.num_warps, num_stages=c.num_stages)
        try:
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                jit_fn[grid](*args, **launch)
        except triton.runtime.errors.OutOfResources:
            # more shared memory than this GPU gives a block (a 99 KB Ada part, a 256-wide head):
            # the next entry of the list
            if i + 1 == len(cands):
                raise
            _TOO_BIG.add((kernel, device, c, *meta.values()))
            continue
        return


def _launch(kernel: str, jit_fn, grid_rows: int, bh: int, args: list, meta: dict, dtype, device):
    """Launch ``jit_fn`` with a grid of ``(cdiv(grid_rows, BLOCK), bh)`` programs, where BLOCK
    is the configuration's BLOCK_M (query-blocked kernels) or BLOCK_N (``dkdv``)."""
    tile_key = "BLOCK_N" if kernel == "dkdv" else "BLOCK_M"
    cands = _fixed_configs(kernel, dtype, device, meta["BLOCK_D"], meta["WINDOW"])
    if cands is not None:
        _launch_fixed(kernel, jit_fn, grid_rows, bh, args, meta, device, cands)
        return
    capability = torch.cuda.get_device_capability(device)
    tuned = _tuned(kernel, jit_fn, capability, dtype == torch.float32, meta["BLOCK_D"], meta["WINDOW"])

    def grid(m):
        return (triton.cdiv(grid_rows, m[tile_key]), bh)

    with torch.cuda.device(device):
        tuned[grid](*args, **meta)


def best_configs() -> dict:
    """The configuration each autotuner picked so far, per tuning key (for the book and logs)."""
    out = {}
    for (kernel, gen, fp32, _), tuner in _TUNED.items():
        for key, cfg in tuner.cache.items():
            out[f"{kernel}/{gen}/{'fp32' if fp32 else 'fp16-bf16'}/{key}"] = {
                **cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return out


def _strides(t: torch.Tensor):
    """(batch, head, row) strides: of a ``(B, H, N, D)`` tensor, or of a packed ``(total, H, D)``
    one (batch stride 0: its sequences are told apart by ``cu_seqlens``)."""
    if t.dim() == 3:
        return 0, t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


def _mask_meta(mask) -> dict:
    alignment, window = mask
    return dict(CAUSAL=alignment is not None, BOTTOM_RIGHT=alignment == "bottom-right",
                WINDOW=window is not None)


class _Layout:
    """Shapes and row bookkeeping of one call: dense ``(B, H, N, D)`` or packed ``(total, H, D)``
    with ``cu_seqlens`` (then B is the number of sequences and N the longest one)."""

    def __init__(self, q, k, cu_q=None, cu_k=None, max_q=None, max_k=None, seen=None):
        self.varlen = cu_q is not None
        self.seen = seen          # packed: (0, total_q) when every row sees a key, else None
        if self.varlen:
            self.B, self.H, self.Hkv, self.D = cu_q.numel() - 1, q.shape[1], k.shape[1], q.shape[2]
            self.Nq, self.Nk = max_q, max_k
            self.cu_q, self.cu_k = cu_q, cu_k
            # lse and delta: (H, total_q)
            self.lse_shape = (self.H, q.shape[0])
            self.lse_strides = (0, q.shape[0])
        else:
            self.B, self.H, self.Nq, self.D = q.shape
            self.Hkv, self.Nk = k.shape[1], k.shape[2]
            self.cu_q = self.cu_k = q            # unused by the kernels when VARLEN is False
            self.lse_shape = (self.B, self.H, self.Nq)
            self.lse_strides = (self.H * self.Nq, self.Nq)
        self.group = self.H // self.Hkv


def _forward(q, k, v, mask, scale: float, layout: _Layout | None = None,
             guard: bool = True):
    """The launch, on checked arguments. ``guard=False`` skips the overflow guard and
    its host sync, for a caller that guards a merged result once (chapter 14's ring)."""
    L = layout or _Layout(q, k)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(L.lse_shape, dtype=torch.float32, device=q.device)
    block_d = _block_d(L.D)
    args = [q, k, v, o, lse, L.cu_q, L.cu_k,
            *_strides(q), *_strides(k), *_strides(v), *_strides(o), *L.lse_strides,
            L.H, L.group, L.Nq, L.Nk, L.D, scale * LOG2E, mask[1] or 0,
            configs.length_bucket(max(L.Nq, L.Nk))]
    meta = dict(_mask_meta(mask), VARLEN=L.varlen, BLOCK_D=block_d,
                PAD_D=block_d != L.D, DOT_PREC=_dot_precision(q.dtype))
    _launch("fwd", forward.attn_fwd_kernel, L.Nq, L.B * L.H, args, meta, q.dtype,
            q.device)
    # the overflow guard reads lse (the kernel folds each output row's health into it),
    # for dtypes whose scores can overflow
    if guard:
        seen = L.seen if L.varlen else rows_that_see_keys(*mask, L.Nq, L.Nk)
        raise_if_overflowed(lse, q.dtype, scale, L.D, seen=seen,
                            inputs=(("q", q), ("k", k), ("v", v)))
    return o, lse


_FUSED_DQ: list = []       # a stack of use_fused_backward() settings; empty: configs decides


@contextlib.contextmanager
def use_fused_backward(enabled: bool = True):
    """Run the backward as one fused kernel (``enabled=True``: the dK/dV program also adds ``dQ``
    with float32 atomics, five tile products per tile pair instead of seven, not bit-for-bit
    deterministic) or as the two deterministic kernels (``False``), instead of the measured
    default (:func:`flashtut.triton.configs.fused_backward_default`)."""
    _FUSED_DQ.append(check_bool("enabled", enabled))
    try:
        yield
    finally:
        _FUSED_DQ.pop()


def _fused_dq(q: torch.Tensor, mask, ds_fp32: bool) -> bool:
    if _FUSED_DQ:
        return _FUSED_DQ[-1]
    if ds_fp32 or not q.is_cuda or interpreting():
        return False
    return configs.fused_backward_default(torch.cuda.get_device_capability(q.device), q.dtype == torch.float32,
                                          mask[0] is not None, mask[1] is not None)


#: row offsets (elements) from which the dK/dV kernel's query loop switches to 64-bit addressing
_WIDE_ROWS_FROM = 2 ** 31


class _BackwardPlan:
    """The launches of one backward, prepared once: ``preprocess()`` (Delta), ``dkdv()`` and
    ``dq()`` (or, fused, ``dkdv()`` alone and ``finish()``), then ``grads()``. Split out so that
    a benchmark can time each kernel on its own."""

    def __init__(self, q, k, v, o, lse, do, mask, scale: float, layout: _Layout | None = None,
                 ds_fp32: bool = False, fused_dq: bool | None = None):
        L = self.L = layout or _Layout(q, k)
        q, k, v, o, do = (_last_dim_contiguous(t) for t in (q, k, v, o, do))
        self.q, self.scale = q, scale
        self.fused = _fused_dq(q, mask, ds_fp32) if fused_dq is None else fused_dq
        lse = lse.to(torch.float32).contiguous()
        block_d = _block_d(L.D)
        self.delta = torch.empty(L.lse_shape, dtype=torch.float32, device=q.device)
        # Delta is row by row: a packed (total, H, D) tensor is read as one (1, H, total, D) sequence
        self.o4, self.do4 = (t.permute(1, 0, 2)[None] if L.varlen else t for t in (o, do))
        self.pre_block = 16 if interpreting() else 128
        self.block_d = block_d
        # the overflow guard: set to 1 by a kernel program whose gradients are not finite
        self.flag = torch.zeros(1, dtype=torch.int32, device=q.device)
        self.dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        self.dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        if self.fused:      # float32 sums, zeroed; cast to q's dtype (and scaled) by finish()
            self.dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            self.dq = None
        else:
            self.dq = torch.empty_like(q, memory_format=torch.contiguous_format)
            self.dq_acc = self.dk                    # an unused argument: never read or written
        bucket = configs.length_bucket(max(L.Nq, L.Nk))
        self.meta = dict(_mask_meta(mask), VARLEN=L.varlen, BLOCK_D=block_d, PAD_D=block_d != L.D,
                         DOT_PREC=_dot_precision(q.dtype), DS_FP32=ds_fp32)
        # the dK/dV kernel addresses query rows (of one sequence) in 32 bits unless row * stride,
        # padded by the largest tile, can reach 2**31
        row_stride = max(_strides(t)[2] for t in (q, do, self.dq_acc))
        self.dkdv_meta = dict(self.meta, FUSED_DQ=self.fused, GROUPED=L.group > 1,
                              WIDE_ROWS=(L.Nq + 256) * row_stride >= _WIDE_ROWS_FROM)
        common = [*L.lse_strides, L.group, L.Nq, L.Nk, L.D, scale, scale * LOG2E, mask[1] or 0, bucket]
        self.dkdv_args = [q, k, v, do, self.dk, self.dv, self.dq_acc, lse, self.delta, L.cu_q, L.cu_k, self.flag,
                          *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(self.dk),
                          *_strides(self.dv), *_strides(self.dq_acc), *common[:2], L.Hkv, *common[2:]]
        if not self.fused:
            self.dq_args = [q, k, v, do, self.dq, lse, self.delta, L.cu_q, L.cu_k, self.flag, *_strides(q),
                            *_strides(k),
                            *_strides(v), *_strides(do), *_strides(self.dq), *common[:2], L.H, *common[2:]]

    def _ctx(self):
        return torch.cuda.device(self.q.device) if self.q.is_cuda else contextlib.nullcontext()

    def preprocess(self):
        o4, do4, L = self.o4, self.do4, self.L
        grid = (triton.cdiv(o4.shape[2], self.pre_block), o4.shape[0] * L.H)
        with self._ctx():
            backward.bwd_preprocess_kernel[grid](o4, do4, self.delta, *_strides(o4), *_strides(do4), L.H,
                                                 o4.shape[2], L.D, BLOCK_M=self.pre_block, BLOCK_D=self.block_d)

    def dkdv(self):
        if self.fused:
            self.dq_acc.zero_()
        _launch("dkdv", backward.bwd_dkdv_kernel, self.L.Nk, self.L.B * self.L.Hkv, self.dkdv_args,
                self.dkdv_meta, self.q.dtype, self.q.device)

    def dq_kernel(self):
        if not self.fused:
            _launch("dq", backward.bwd_dq_kernel, self.L.Nq, self.L.B * self.L.H, self.dq_args, self.meta,
                    self.q.dtype, self.q.device)

    def finish(self):
        if self.fused:       # dQ was summed with atomics: no program saw it whole, so it is checked here
            self.dq = (self.dq_acc * self.scale).to(self.q.dtype)
            if scores_can_overflow(self.q.dtype, self.scale, self.L.D):
                self.flag |= (~torch.isfinite(self.dq)).any()

    def run(self):
        self.preprocess()
        self.dkdv()
        self.dq_kernel()
        self.finish()
        return self.dq, self.dk, self.dv


def _backward(q, k, v, o, lse, do, mask, scale: float, layout: _Layout | None = None,
              ds_fp32: bool = False, guard: bool = True):
    """The backward launches on checked arguments; ``guard=False`` leaves the flag unread (the
    caller checks the gradients it sums, once)."""
    plan = _BackwardPlan(q, k, v, o, lse, do, mask, scale, layout, ds_fp32)
    dq, dk, dv = plan.run()
    if not guard:
        return dq, dk, dv
    # the kernels flag non-finite gradients themselves: the guard reads one int (one small sync),
    # and only for dtypes whose scores can overflow; the gradients are not read again
    raise_if_flagged(plan.flag, q.dtype, scale, q.shape[-1], "gradients",
                     (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)))
    return dq, dk, dv


def triton_forward(q, k, v, causal=False, scale: float | None = None, window: int | None = None):
    """Fused forward. Returns ``(o, lse)``: ``o`` like ``q``; ``lse`` ``(B, H, Nq)`` float32,
    the natural-log log-sum-exp of each row's scaled, masked scores (``-inf`` for a row that
    sees no key, whose output is 0)."""
    _, _, _, _, _, mask, scale = _check_inputs(q, k, v, causal, scale, window=window)
    return _forward(q, k, v, mask, scale)


def triton_backward(q, k, v, o, lse, do, causal=False, scale: float | None = None,
                    window: int | None = None, *, ds_fp32: bool = False):
    """Fused backward with recomputation from ``lse``. Returns ``(dq, dk, dv)`` in the inputs'
    dtype (``dk``, ``dv`` with ``k``'s heads, each summed over its group); no autograd involved.
    ``ds_fp32=True`` keeps ``dS`` in float32 for the ``dQ`` and ``dK`` products instead of rounding
    it to the input dtype (slower; for measuring what the rounding costs, chapter 07)."""
    _, _, _, _, _, mask, scale = _check_inputs(q, k, v, causal, scale, o=o, lse=lse, do=do, window=window)
    return _backward(q, k, v, o, lse, do, mask, scale, ds_fp32=check_bool("ds_fp32", ds_fp32))


class TritonAttention(torch.autograd.Function):
    """``o = softmax(scale * q k^T [causal mask]) v``; saves ``q, k, v, o, lse``
    only."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        o, lse = _forward(q, k, v, mask, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mask = mask
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do.to(q.dtype), ctx.mask, ctx.scale)
        return dq, dk, dv, None, None


# -- the custom operator: what torch.compile sees -----------------------------------------
# The mask travels as two ints (schemas have no Optional[str] union): alignment 0 = none,
# 1 = top-left, 2 = bottom-right; window 0 = none.
_ALIGN_CODE = {None: 0, "top-left": 1, "bottom-right": 2}
_ALIGN_NAME = {c: a for a, c in _ALIGN_CODE.items()}


@torch.library.custom_op("flashtut::triton_attention_fwd", mutates_args=())
def _op_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, align: int, scale: float,
            window: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, (_ALIGN_NAME[align], window or None), scale)


@_op_fwd.register_fake
def _(q, k, v, align, scale, window):
    B, H, Nq, _ = q.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((B, H, Nq), dtype=torch.float32))


@torch.library.custom_op("flashtut::triton_attention_bwd", mutates_args=())
def _op_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
            do: torch.Tensor, align: int, scale: float,
            window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(q, k, v, o, lse, do, (_ALIGN_NAME[align], window or None), scale)


@_op_bwd.register_fake
def _(q, k, v, o, lse, do, align, scale, window):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _op_setup_context(ctx, inputs, output):
    q, k, v, align, scale, window = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.mask = (align, scale, window)
    ctx.mark_non_differentiable(lse)


def _op_backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _op_bwd(q, k, v, o, lse, do.to(q.dtype), *ctx.mask)
    return dq, dk, dv, None, None, None


_op_fwd.register_autograd(_op_backward, setup_context=_op_setup_context)


def triton_attention(q, k, v, causal=False, scale: float | None = None, window: int | None = None):
    """Fused Triton attention; ``o.backward()`` runs the fused Triton backward. A PyTorch custom
    operator underneath, so ``torch.compile(model, fullgraph=True)`` compiles a model calling it."""
    _, _, _, _, _, (alignment, window), scale = _check_inputs(q, k, v, causal, scale, window=window)
    o, _ = _op_fwd(q, k, v, _ALIGN_CODE[alignment], scale, window or 0)
    return o


# -- packed variable-length batches -----------------------------------------------------------

class TritonVarlenAttention(torch.autograd.Function):
    """Packed-batch attention: one launch for all sequences; saves ``q, k, v, o, lse`` only."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, mask, scale, seen=None):
        layout = _Layout(q, k, cu_q, cu_k, max_q, max_k, seen)
        o, lse = _forward(q, k, v, mask, scale, layout)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (layout, mask, scale)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        layout, mask, scale = ctx.args
        dq, dk, dv = _backward(q, k, v, o, lse, do.to(q.dtype), mask, scale, layout)
        return dq, dk, dv, None, None, None, None, None, None, None


VARLEN_BACKENDS = ("naive", "triton")


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale: float | None = None,
                     window: int | None = None, backend: str = "triton"):
    """Packed batches (``flashtut.varlen_attention``): ``backend="naive"`` runs the reference one
    sequence at a time (PyTorch only, autograd), ``"triton"`` one fused launch for the batch."""
    if backend not in VARLEN_BACKENDS:
        raise ValueError(f"backend must be one of {VARLEN_BACKENDS}, got {backend!r}")
    bounds_q, bounds_k, mask, scale = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window)
    if backend == "naive":
        return naive_varlen_attention(q, k, v, bounds_q, bounds_k, mask[0] or False, scale, mask[1])
    return varlen_triton(q, k, v, cu_seqlens_q, cu_seqlens_k, bounds_q, bounds_k, mask, scale)


def varlen_triton(q, k, v, cu_seqlens_q, cu_seqlens_k, bounds_q, bounds_k, mask, scale):
    """The Triton path of :func:`varlen_attention` (arguments already checked)."""
    if q.dtype not in KERNEL_DTYPES:
        raise ValueError(
            f"q, k and v have dtype {str(q.dtype).replace('torch.', '')}; the Triton kernels accept "
            "float16, bfloat16 or float32 (for float64 use backend='naive')")
    if q.shape[2] > MAX_HEAD_DIM:
        raise ValueError(f"head dim D = {q.shape[2]} is not supported by the Triton kernels; accepted: "
                         f"1 to {MAX_HEAD_DIM} (dims that are not a power of two are zero-padded to the next one)")
    _require_runtime(q)
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        raise ValueError("q has dtype bfloat16, which the Triton CPU interpreter does not support; "
                         "accepted on CPU: float16 or float32 (bfloat16 runs on the GPU)")
    # the kernels index cu_seqlens as a dense int32 array: a strided view (offsets[::2]) would be
    # read at the wrong addresses
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    max_q = max(b - a for a, b in zip(bounds_q, bounds_q[1:]))
    max_k = max(b - a for a, b in zip(bounds_k, bounds_k[1:]))
    # the guard can ask every row for a finite lse when no sequence has rows that see no key
    # (otherwise those rows, scattered through the batch, may be -inf and only NaN/+inf is flagged)
    every = all(rows_that_see_keys(*mask, q1 - q0, k1 - k0) == (0, q1 - q0) and (k1 > k0 or q1 == q0)
                for q0, q1, k0, k1 in zip(bounds_q, bounds_q[1:], bounds_k, bounds_k[1:]))
    return TritonVarlenAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max(max_q, 1), max(max_k, 1),
                                       mask, scale, (0, q.shape[0]) if every else None)


__all__ = ["triton_attention", "triton_forward", "triton_backward", "TritonAttention", "interpreting",
           "best_configs", "use_configs", "use_fused_backward", "TileConfig", "KERNEL_DTYPES", "MAX_HEAD_DIM",
           "varlen_attention", "varlen_triton"]

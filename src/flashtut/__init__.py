"""flashtut: FlashAttention from scratch.

Nine layers, bottom up; each imports only from the layers below it (``tests/test_layers.py``):

1. core: input checks, the softmax family, naive attention, the tiled PyTorch loops, split-KV
   decoding (``checks``, ``softmax``, ``reference``, ``tiled``, ``decode``): the float64-capable truth
2. hardware facts: datasheets of the book's GPUs (``hardware``)
3. cost models: FLOPs, tensor sizes, HBM traffic, IO complexity (``costs``)
4. kernels: ``triton`` and ``cuda``, the fused kernels (loaded lazily: ``import flashtut`` needs
   neither triton nor cupy)
5. bench: everything that times or measures, and the one results format (``bench``)
6. results data: the committed measurements the chapters draw (``results_data``)
7. figures: drawing only (``figures``)
8. tools for readers: exercise checkers, notebook helpers, the Colab cell, chapter 12's GPT, ring
   attention over several processes (``exercises``, ``notebook``, ``colab``, ``model``, ``distributed``)
9. notebooks and book pages: the narrative around all of it (outside the package)

This module is the public facade: it re-exports the names of the API reference.
"""
from __future__ import annotations

import sys

from .checks import accum_dtype
from .reference import attention_lse, causal_mask, naive_attention
from .softmax import merge_softmax_states, naive_softmax, online_softmax, safe_softmax
from .tiled import tiled_attention, tiled_attention_backward
from .decode import decode_attention_reference, merge_attention_states, split_kv_attention
from .block_mask import BlockMask, create_block_mask
from .flex_reference import flex_reference
from . import masks

from .version import __version__


def _load_kernel_module(module: str, package: str, how: str):
    """Import ``flashtut.<module>`` on first use; a missing ``package`` becomes a RuntimeError
    that says how to install it (``import flashtut`` itself never needs triton or cupy)."""
    import importlib

    loaded = sys.modules.get(f"{__name__}.{module}")
    if loaded is not None:               # a look-up that torch.compile traces without a graph break
        return loaded
    try:
        return importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == package:
            raise RuntimeError(f"{package} is not installed, and this kernel needs it: {how}") from exc
        raise


_TRITON_HOW = "pip install triton (Linux with a CUDA GPU of sm_80 or newer)"


def triton_attention(q, k, v, causal=False, scale: float | None = None, window: int | None = None):
    """Fused Triton attention, forward and backward (``flashtut.triton``).

    Returns ``o``; ``o.backward()`` runs the Triton backward, which recomputes the
    probabilities from the saved log-sum-exp. CUDA tensors, or CPU tensors when
    ``TRITON_INTERPRET=1`` was set before ``flashtut`` (and ``triton``) were imported.
    ``k``/``v`` may have fewer heads than ``q`` (grouped-query); ``causal`` is ``False``,
    ``True``/``"top-left"`` or ``"bottom-right"``; ``window`` is a sliding window. Head dims 1 to
    256, as FlashAttention (those that are not a power of two run zero-padded to the next one).
    A PyTorch custom operator: ``torch.compile(model, fullgraph=True)`` compiles a model calling
    it without graph breaks once the kernel module is loaded (any eager call, or
    ``import flashtut.triton.attention``, before the first compiled call).
    """
    attention = _load_kernel_module("triton.attention", "triton", _TRITON_HOW)
    return attention.triton_attention(q, k, v, causal=causal, scale=scale, window=window)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale: float | None = None,
                     window: int | None = None, backend: str = "triton"):
    """Attention over a batch of sequences of different lengths packed without padding
    (``flashtut.triton.attention.varlen_attention``).

    ``q`` is ``(total_q, H, D)``, ``k``/``v`` ``(total_k, Hkv, D)``; ``cu_seqlens_q``/``_k`` are
    int32 ``[0, len_0, len_0 + len_1, ..., total]``. Sequence ``b`` (rows
    ``cu_seqlens[b]:cu_seqlens[b + 1]``) attends only within itself, with ``causal`` and
    ``window`` applied per sequence. Returns ``(total_q, H, D)``. ``backend``: ``"naive"`` (the
    reference, one sequence at a time, autograd; needs only PyTorch) or ``"triton"`` (one fused
    launch for the whole batch, forward and backward).
    """
    attention = _load_kernel_module("triton.attention", "triton", _TRITON_HOW)
    return attention.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale,
                                      window=window, backend=backend)


def decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None, scale: float | None = None,
                     backend: str = "triton"):
    """A few new queries per sequence against each sequence's KV cache, contiguous or paged.

    ``q`` ``(B, H, Nq, D)`` holds the last ``Nq`` positions of each sequence (bottom-right
    aligned); the cache holds all ``cache_seqlens[b]`` positions (int32 ``(B,)``), the new ones
    included. Contiguous: ``k_cache``/``v_cache`` ``(B, Hkv, Nmax, D)``, ``block_table`` None.
    Paged: ``(num_pages, Hkv, page_size, D)`` and an int32 ``(B, max_pages)`` table; position ``p``
    of sequence ``b`` is row ``p % page_size`` of page ``block_table[b, p // page_size]``.
    Returns ``(B, H, Nq, D)``. ``backend``: ``"reference"`` (PyTorch split-KV, any device and
    dtype, ``flashtut.decode``) or ``"triton"`` (the split-KV kernel, ``flashtut.triton.decode``).
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be 'reference' or 'triton', got {type(backend).__name__}")
    if backend == "reference":
        return decode_attention_reference(q, k_cache, v_cache, cache_seqlens, block_table, scale)
    if backend != "triton":
        raise ValueError(f"backend must be 'reference' or 'triton', got {backend!r}")
    kernels = _load_kernel_module("triton.decode", "triton", _TRITON_HOW)
    return kernels.triton_decode_attention(q, k_cache, v_cache, cache_seqlens, block_table, scale)


def cuda_attention(q, k, v, causal=False, scale: float | None = None, window: int | None = None, *,
                   deterministic: bool = False, forward_kernel: str = "auto", backward_kernel: str = "auto"):
    """Fused CUDA C attention compiled with NVRTC and launched through CuPy (``flashtut.cuda``).

    Returns ``o``; ``o.backward()`` runs the CUDA backward with recomputation. CUDA tensors only.
    ``deterministic=True``: dQ in a separate pass instead of float32 atomics (the same bits every run).
    ``forward_kernel``: ``"auto"`` (warpgroup MMA on sm_90 GPUs where it supports the case, mma.sync
    elsewhere), ``"mma"`` or ``"wgmma"``; ``backward_kernel`` likewise for the backward (the Hopper backward
    with wgmma and TMA on sm_90 at head dims 64 and 128).
    """
    attention = _load_kernel_module("cuda.attention", "cupy",
                                    "pip install cupy-cuda12x (CUDA 12 drivers, e.g. Colab) or cupy-cuda13x")
    return attention.cuda_attention(q, k, v, causal=causal, scale=scale, window=window,
                                    deterministic=deterministic, forward_kernel=forward_kernel,
                                    backward_kernel=backward_kernel)


def __getattr__(name: str):
    # ``flashtut.distributed`` (ring attention) loads on first use: it imports torch.distributed
    if name == "distributed":
        import importlib
        return importlib.import_module(f"{__name__}.distributed")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flex_attention(q, k, v, score_mod=None, block_mask=None, scale: float | None = None):
    """Attention with a ``score_mod`` and a block mask, the semantics of PyTorch's
    ``torch.nn.attention.flex_attention`` (``flashtut.triton.flex_attention``).

    ``score_mod(score, b, h, q_idx, kv_idx) -> score`` changes each scaled score before the
    softmax; ``block_mask`` comes from :func:`create_block_mask`. Both mods are written with
    elementwise tensor operations; the Triton kernels trace them, visit only the listed tiles,
    evaluate the mask only on partial ones and differentiate the score mod for the backward
    (tensors it captures with ``requires_grad`` get their gradients). ``k``/``v`` may have fewer
    heads than ``q`` (grouped-query). A row that sees no key: output 0, finite gradients.
    CUDA tensors run the kernels; CPU tensors run them under the Triton interpreter
    (``TRITON_INTERPRET=1``) or, without it, fall back to the dense reference
    (:func:`flex_reference`, the same answer); float64 always runs densely.
    """
    import torch

    dense = (not isinstance(q, torch.Tensor) or q.dtype == torch.float64
             or (q.device.type == "cpu" and not _triton_interpreting()))
    if not dense:
        try:
            flex = _load_kernel_module("triton.flex_attention", "triton", _TRITON_HOW)
        except RuntimeError:
            if q.device.type != "cpu":
                raise
            dense = True
    if dense:
        return flex_reference(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return flex.triton_flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def _triton_interpreting() -> bool:
    """Whether triton is importable and runs its interpreter (without importing it otherwise)."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    try:
        return _load_kernel_module("triton.attention", "triton", _TRITON_HOW).interpreting()
    except RuntimeError:
        return False


__all__ = [
    "naive_softmax", "safe_softmax", "online_softmax", "merge_softmax_states",
    "naive_attention", "attention_lse", "causal_mask", "accum_dtype",
    "tiled_attention", "tiled_attention_backward",
    "split_kv_attention", "merge_attention_states",
    "triton_attention", "cuda_attention", "varlen_attention", "decode_attention",
    "flex_attention", "flex_reference", "create_block_mask", "BlockMask", "masks",
]

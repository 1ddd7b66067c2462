"""flashtut: FlashAttention from scratch.

Layers, bottom up (each uses only the ones below it):

1. ``softmax``, ``reference``: the softmax family and naive attention (float64-capable references)
2. ``tiled``: the FlashAttention algorithm as readable PyTorch loops, forward and backward
3. ``triton``, ``cuda``: fused kernels (loaded lazily: ``import flashtut`` needs
   neither triton nor cupy)
4. ``bench``, ``figures``, ``exercises``: measuring, plotting and checking tools for the book
"""
from __future__ import annotations

from .checks import accum_dtype
from .reference import attention_lse, causal_mask, naive_attention
from .softmax import merge_softmax_states, naive_softmax, online_softmax, safe_softmax
from .tiled import tiled_attention, tiled_attention_backward
from .decode import merge_attention_states, split_kv_attention

from .version import __version__


def _load_kernel_module(module: str, package: str, how: str):
    """Import ``flashtut.<module>`` on first use; a missing ``package`` becomes a RuntimeError
    that says how to install it (``import flashtut`` itself never needs triton or cupy)."""
    import importlib

    try:
        return importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == package:
            raise RuntimeError(f"{package} is not installed, and this kernel needs it: {how}") from exc
        raise


def triton_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """Fused Triton attention, forward and backward (``flashtut.triton``).

    Returns ``o``; ``o.backward()`` runs the Triton backward, which recomputes the
    probabilities from the saved log-sum-exp. CUDA tensors, or CPU tensors when
    ``TRITON_INTERPRET=1`` was set before ``flashtut`` (and ``triton``) were imported.
    """
    attention = _load_kernel_module("triton.attention", "triton",
                                    "pip install triton (Linux with a CUDA GPU of sm_80 or newer)")
    return attention.triton_attention(q, k, v, causal=causal, scale=scale)


def cuda_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """Fused CUDA C attention compiled with NVRTC and launched through CuPy (``flashtut.cuda``).

    Returns ``o``; ``o.backward()`` runs the CUDA backward with recomputation. CUDA tensors only.
    """
    attention = _load_kernel_module("cuda.attention", "cupy",
                                    "pip install cupy-cuda12x (CUDA 12 drivers, e.g. Colab) or cupy-cuda13x")
    return attention.cuda_attention(q, k, v, causal=causal, scale=scale)


__all__ = [
    "naive_softmax", "safe_softmax", "online_softmax", "merge_softmax_states",
    "naive_attention", "attention_lse", "causal_mask", "accum_dtype",
    "tiled_attention", "tiled_attention_backward",
    "split_kv_attention", "merge_attention_states",
    "triton_attention", "cuda_attention",
]

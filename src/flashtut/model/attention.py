"""How the model calls attention: the only module of ``flashtut.model`` that knows the backends.

A backend is a name, or a function of the reader's own:

* ``"naive"``: :func:`flashtut.naive_attention` (the full score matrix, autograd backward);
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch picks its kernel);
* ``"tiled"``: :func:`flashtut.tiled_attention` (Python loops over tiles: tiny sizes only);
* ``"triton"``: :func:`flashtut.triton_attention` (CUDA, or the CPU under ``TRITON_INTERPRET=1``);
* ``"cuda"``: :func:`flashtut.cuda_attention` (CUDA float16/bfloat16, head dim 64 or 128);
* a callable ``fn(q, k, v) -> o``: causal attention on ``(B, H, N, D)`` tensors with as many key/value
  heads as query heads (chapter 12's first exercise); with a window the model calls
  ``fn(q, k, v, window=w)``.

Three call patterns: :func:`attend` (a batch of equal-length sequences, or new tokens at the end of a
KV cache), :func:`attend_packed` (sequences of different lengths packed into one row, ``cu_seqlens``)
and :func:`attend_split_kv` (decoding against a KV cache through the split-KV algorithm of chapter 10).

Until flashtut's own functions take grouped-query heads, ``causal="bottom-right"``, ``window=`` and
``varlen_attention`` (``REAL_MODEL_API`` and :func:`packed_path` say whether this copy does), the fallbacks here
expand the key/value heads with ``repeat_interleave`` and run packed batches one sequence at a time.
Those fallbacks go away once the API is there; nothing outside this module changes.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys

import torch
import torch.nn.functional as F

from .. import decode
from ..checks import check_choice
from ..cuda.attention import cuda_attention
from ..reference import naive_attention
from ..tiled import tiled_attention
from ..triton.attention import interpreting, triton_attention

BACKENDS = ("naive", "sdpa", "tiled", "triton", "cuda")

_FLASHTUT = {"naive": naive_attention, "tiled": tiled_attention, "triton": triton_attention,
             "cuda": cuda_attention}

#: whether this flashtut's attention functions take grouped-query heads, ``causal="bottom-right"``
#: and ``window=`` (the "attention for real models" API); without it the fallbacks below run
REAL_MODEL_API = "window" in inspect.signature(naive_attention).parameters


def _varlen_attention():
    """``flashtut.varlen_attention``: it lives in ``flashtut.triton.attention`` (the facade forwards
    to it), so it is imported from there, as every layer does."""
    from ..triton.attention import varlen_attention
    return varlen_attention


def check_backend(backend):
    """``backend`` as given, after checking it is one of :data:`BACKENDS` or a callable."""
    if callable(backend):
        return backend
    return check_choice("attention_backend", backend, BACKENDS, " or a callable fn(q, k, v) -> o")


def unavailable_reason(backend: str, device) -> str | None:
    """Why ``backend`` cannot run on ``device`` here (None when it can): Triton needs a GPU of
    sm_80 or newer, or the CPU interpreter; the CUDA kernels a GPU and CuPy."""
    check_backend(backend)
    device = torch.device(device)
    if backend == "triton":
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install triton)"
        if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 8:
            return "Triton needs a GPU of compute capability sm_80 or newer"
        if device.type == "cpu" and not interpreting():
            return "Triton on the CPU needs TRITON_INTERPRET=1 set before the first import of flashtut"
    if backend == "cuda":
        if device.type != "cuda":
            return "the CUDA kernels run on a CUDA GPU only"
        if importlib.util.find_spec("cupy") is None:
            return "CuPy is not installed (pip install cupy-cuda12x, or cupy-cuda13x)"
    return None


def backend_name(backend) -> str:
    """A label for tables and figures: the name, or the callable's ``__name__``."""
    return backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")


def expand_kv_heads(k: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, Hkv, N, D)`` -> ``(B, heads, N, D)``: query head ``h`` gets key/value head
    ``h // (heads // Hkv)``, the grouping of ``scaled_dot_product_attention(enable_gqa=True)``.
    A copy per query head: what grouped-query attention exists to avoid, used only where a
    function cannot take ``Hkv`` heads."""
    groups = heads // k.shape[1]
    return k if groups == 1 else k.repeat_interleave(groups, dim=1)


def visible_keys(n_q: int, n_k: int, window: int | None = None, device=None) -> torch.Tensor:
    """Boolean ``(n_q, n_k)``, True where query ``i`` may see key ``j`` under the bottom-right causal
    alignment (``j <= i + n_k - n_q``; top-left when ``n_q == n_k``), within the last ``window``
    keys when a window is given. SDPA takes it as ``attn_mask``."""
    rows = torch.arange(n_q, device=device)[:, None] + (n_k - n_q)   # each row's diagonal key
    cols = torch.arange(n_k, device=device)[None, :]
    mask = cols <= rows
    if window is not None:          # a window past the first key hides nothing (and cannot overflow)
        mask &= cols > rows - min(window, n_k)
    return mask


def _old_api_causal(n_q: int, n_k: int, backend: str):
    """``causal`` for a flashtut function without ``"bottom-right"``: equal lengths are top-left,
    one new query row sees the whole cache."""
    if n_q == n_k:
        return True
    if n_q == 1:
        return False
    raise RuntimeError(f"backend {backend!r} needs causal='bottom-right' for {n_q} new queries against "
                       f"{n_k} cached keys, which this flashtut's {_FLASHTUT[backend].__name__} lacks; use "
                       "backend 'sdpa', or one query at a time")


def attend(q, k, v, backend, window: int | None = None,
           scale: float | None = None) -> torch.Tensor:
    """Causal attention of ``q`` ``(B, H, Nq, D)`` over ``k``, ``v`` ``(B, Hkv, Nk, D)``
    with ``Nq <= Nk``: the queries are the last ``Nq`` positions
    (``causal="bottom-right"``, which is ordinary causal attention when ``Nq == Nk``).
    Returns ``(B, H, Nq, D)``."""
    backend = check_backend(backend)
    H, n_q, n_k = q.shape[1], q.shape[2], k.shape[2]
    if callable(backend):
        if n_q != n_k:
            raise ValueError("a custom attention function runs on whole sequences "
                             f"(Nq == Nk), got Nq={n_q}, Nk={n_k}; generate with "
                             "the KV cache through 'split-kv'")
        k, v = expand_kv_heads(k, H), expand_kv_heads(v, H)
        return backend(q, k, v) if window is None else backend(q, k, v, window=window)
    if backend == "sdpa":
        # without a mask SDPA may take its flash kernel (the only fused one with
        # enable_gqa)
        if window is None and n_q == n_k:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                  enable_gqa=True)
        if window is None and n_q == 1:  # one new token sees the whole cache
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        mask = visible_keys(n_q, n_k, window, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    fn = _FLASHTUT[backend]
    if REAL_MODEL_API:
        return fn(q, k, v, causal="bottom-right", scale=scale, window=window)
    if window is not None:
        raise RuntimeError(f"this flashtut's {_FLASHTUT[backend].__name__} has no "
                           "window= argument; use backend 'sdpa' for a sliding window")
    causal = _old_api_causal(n_q, n_k, backend)
    return fn(q, expand_kv_heads(k, H), expand_kv_heads(v, H), causal=causal,
              scale=scale)


def packed_path(backend) -> str:
    """How :func:`attend_packed` runs ``backend``: ``"varlen_attention"`` (one fused call over
    the packed batch) or ``"per-sequence"`` (one attention call per sequence)."""
    if _varlen_attention() is not None and backend in ("naive", "triton"):
        return "varlen_attention"
    return "per-sequence"


def attend_packed(q, k, v, cu_seqlens: torch.Tensor, backend,
                  window: int | None = None,
                  scale: float | None = None) -> torch.Tensor:
    """Causal attention within each of the sequences packed into ``q`` ``(total, H, D)``
    and ``k``, ``v`` ``(total, Hkv, D)``: sequence ``b`` is rows
    ``cu_seqlens[b]:cu_seqlens[b + 1]`` (int32, starting at 0). Returns
    ``(total, H, D)``."""
    backend = check_backend(backend)
    if packed_path(backend) == "varlen_attention":
        return _varlen_attention()(q, k, v, cu_seqlens, cu_seqlens, causal=True,
                                   scale=scale, window=window, backend=backend)
    bounds = cu_seqlens.tolist()
    out = [attend(q[s:e].transpose(0, 1)[None], k[s:e].transpose(0, 1)[None],
                  v[s:e].transpose(0, 1)[None],
                  backend, window=window, scale=scale)[0].transpose(0, 1)
           for s, e in zip(bounds[:-1], bounds[1:]) if e > s]
    return torch.cat(out, dim=0)


def attend_split_kv(q, k, v, num_splits: int, window: int | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """The new queries ``q`` ``(B, H, Nq, D)`` against a KV cache ``k``, ``v``
    ``(B, Hkv, Nk, D)`` that already holds them at its end, through
    :func:`flashtut.split_kv_attention`: ``num_splits`` chunks of keys, each attended
    independently, merged by their log-sum-exps."""
    H, n_q, n_k = q.shape[1], q.shape[2], k.shape[2]
    if window is not None:
        # the keys a window hides are never read: keep the last window + Nq - 1 of the
        # cache
        keep = min(n_k, window + n_q - 1)
        k, v, n_k = k[:, :, n_k - keep:], v[:, :, n_k - keep:], keep
    if REAL_MODEL_API:
        # one query row over a trimmed cache needs no window; several rows each have
        # their own
        extra = {} if window is None or n_q == 1 else {"window": window}
        return decode.split_kv_attention(q, k, v, num_splits, causal="bottom-right",
                                         scale=scale, **extra)
    if window is not None and n_q > 1:
        raise RuntimeError("this flashtut's split_kv_attention has no window: decode "
                           "one token at a time")
    return decode.split_kv_attention(q, expand_kv_heads(k, H), expand_kv_heads(v, H),
                                     num_splits,
                                     causal=_old_api_causal(n_q, n_k, "naive"),
                                     scale=scale)


__all__ = ["BACKENDS", "REAL_MODEL_API", "attend", "attend_packed", "attend_split_kv", "backend_name",
           "check_backend", "expand_kv_heads", "packed_path", "unavailable_reason", "visible_keys"]

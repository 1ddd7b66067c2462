"""Ready-made masks and score modifications, in the shape of PyTorch's FlexAttention.

A **mask** ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` sees key
``kv_idx`` (True: it does); it goes to :func:`flashtut.create_block_mask`. A **score
modification** ``score_mod(score, b, h, q_idx, kv_idx) -> score`` changes the scaled score
``scale * q . k`` before the softmax; it goes to :func:`flashtut.flex_attention`. Both are written
with elementwise tensor operations (``+``, ``*``, comparisons, ``&``, ``|``, ``torch.where``,
``torch.tanh``, indexing a captured tensor by ``b``, ``h``, ``q_idx`` or ``kv_idx``), so that the
same function runs on broadcast index tensors in PyTorch and is traced into the Triton kernel.

Masks: :func:`causal`, :func:`sliding_window`, :func:`document`, :func:`prefix_lm`, and
:func:`and_masks`/:func:`or_masks` to combine them. Score mods: :func:`alibi` (with
:func:`alibi_slopes`), :func:`softcap`, :func:`relative_bias` (a learned bias per head and distance).
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from .block_mask import check_mask_mod
from .checks import check_count, check_number, check_tensor


def causal(b, h, q_idx, kv_idx):
    """Query ``i`` sees keys ``j <= i`` (the top-left causal mask)."""
    return q_idx >= kv_idx


def _window(w) -> int:
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Integral):
        raise TypeError(f"sliding_window(w): w must be a positive int, got {type(w).__name__} {w!r}")
    return check_count("w", w, 1)


def sliding_window(w: int):
    """Causal sliding window of ``w`` keys: query ``i`` sees ``i - w < j <= i`` (its own key
    included), the ``window=w`` of ``flashtut.triton_attention(..., causal=True, window=w)``."""
    w = _window(w)

    def sliding_window_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < w)

    sliding_window_mask.__name__ = f"sliding_window({w})"
    return sliding_window_mask


def _int_vector(name: str, t, what: str) -> torch.Tensor:
    check_tensor(name, t)
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor ({what}), got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers ({what}), got dtype {str(t.dtype).replace('torch.', '')}")
    return t


def document(doc_ids: torch.Tensor):
    """Packed documents: ``doc_ids[i]`` is the document of position ``i`` (queries and keys alike),
    and a query sees exactly the keys of its own document. Combine with :func:`causal`
    (``and_masks(causal, document(ids))``) for causal packed sequences, the ``varlen`` of
    ``flashtut.varlen_attention``."""
    doc_ids = _int_vector("doc_ids", doc_ids, "one document id per position").contiguous()

    def document_mask(b, h, q_idx, kv_idx):
        return doc_ids[q_idx] == doc_ids[kv_idx]

    document_mask.requires = {"positions": doc_ids.numel()}
    return document_mask


def prefix_lm(prefix_len):
    """Prefix-LM: every query sees the first ``prefix_len`` keys (the prompt, bidirectional) and,
    past them, keys up to itself (causal). ``prefix_len``: an int, or an integer tensor ``(B,)``
    of one prefix length per batch element."""
    if isinstance(prefix_len, torch.Tensor):
        lengths = _int_vector("prefix_len", prefix_len, "one prefix length per batch element").contiguous()

        def prefix_lm_mask(b, h, q_idx, kv_idx):
            return (kv_idx < lengths[b]) | (q_idx >= kv_idx)

        prefix_lm_mask.requires = {"batch": lengths.numel()}
        return prefix_lm_mask
    if isinstance(prefix_len, (bool, np.bool_)) or not isinstance(prefix_len, numbers.Integral):
        raise TypeError(f"prefix_len must be an int or an integer tensor (B,), got {type(prefix_len).__name__}")
    n = check_count("prefix_len", prefix_len, 0)

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < n) | (q_idx >= kv_idx)

    prefix_lm_mask.__name__ = f"prefix_lm({n})"
    return prefix_lm_mask


def and_masks(*mask_mods):
    """A query sees a key when every one of ``mask_mods`` lets it."""
    return _combine(mask_mods, "and")


def or_masks(*mask_mods):
    """A query sees a key when any of ``mask_mods`` lets it."""
    return _combine(mask_mods, "or")


def _combine(mask_mods, how: str):
    if not mask_mods:
        raise ValueError(f"{how}_masks needs at least one mask_mod")
    for m in mask_mods:
        check_mask_mod(m)

    def combined(b, h, q_idx, kv_idx):
        out = mask_mods[0](b, h, q_idx, kv_idx)
        for m in mask_mods[1:]:
            out = (out & m(b, h, q_idx, kv_idx)) if how == "and" else (out | m(b, h, q_idx, kv_idx))
        return out

    needs = {}
    for m in mask_mods:
        for key, n in (getattr(m, "requires", None) or {}).items():
            needs[key] = min(n, needs.get(key, n))
    combined.requires = needs
    combined.__name__ = f"{how}_masks(" + ", ".join(getattr(m, "__name__", "mask") for m in mask_mods) + ")"
    return combined


# ------------------------------------------------------------------------ score mods ----

def alibi_slopes(H: int, device=None) -> torch.Tensor:
    """The ALiBi slopes of Press et al. (2022) for ``H`` heads: ``2^(-8 (h + 1) / H)``, a
    geometric sequence from ``2^(-8 / H)`` down to ``2^(-8)``, float32 ``(H,)``."""
    H = check_count("H", H, 1)
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float32, device=device)


def alibi(slopes: torch.Tensor):
    """ALiBi: ``score - slopes[h] * (q_idx - kv_idx)``, a penalty growing linearly with the
    distance, steeper for some heads than others. ``slopes``: a float tensor ``(H,)``."""
    check_tensor("slopes", slopes)
    if slopes.dim() != 1 or not slopes.dtype.is_floating_point:
        raise ValueError(f"slopes must be a 1-D float tensor (H,), got shape {tuple(slopes.shape)} "
                         f"dtype {str(slopes.dtype).replace('torch.', '')}")

    def alibi_mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    alibi_mod.requires = {"heads": slopes.numel()}
    return alibi_mod


def softcap(cap: float):
    """Soft-capping (Gemma 2): ``cap * tanh(score / cap)``, scores squashed smoothly into
    ``(-cap, cap)``. ``cap``: a positive number (Gemma 2 uses 50 for attention)."""
    cap = check_number("cap", cap)
    if not math.isfinite(cap):
        raise ValueError(f"cap must be finite, got {cap}")

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    softcap_mod.__name__ = f"softcap({cap:g})"
    return softcap_mod


def relative_bias(table: torch.Tensor):
    """A learned bias per head and distance (T5-style): ``score + table[h, clamp(q_idx - kv_idx,
    0, L - 1)]``, ``table`` a float tensor ``(H, L)``: distances past ``L - 1`` share the last entry,
    keys ahead of the query the first. With ``requires_grad=True``, ``flex_attention``'s backward
    returns its gradient. (A bias of the head alone, ``score + bias[h]``, would do nothing: the
    softmax ignores what every key of a row gets.)"""
    check_tensor("table", table)
    if table.dim() != 2 or not table.dtype.is_floating_point:
        raise ValueError(f"table must be a 2-D float tensor (H, L), got shape {tuple(table.shape)} "
                         f"dtype {str(table.dtype).replace('torch.', '')}")
    last = table.shape[1] - 1

    def relative_bias_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, torch.clamp(q_idx - kv_idx, 0, last)]

    relative_bias_mod.requires = {"heads": table.shape[0]}
    return relative_bias_mod


__all__ = ["causal", "sliding_window", "document", "prefix_lm", "and_masks", "or_masks",
           "alibi", "alibi_slopes", "softcap", "relative_bias"]

"""Checks of token ids, shared by the model, the tokenizer, batching and generation."""
from __future__ import annotations

import torch

from ..checks import check_tensor


def _out_of_vocab(ids: torch.Tensor, vocab_size: int) -> list[int]:
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    return bad.flatten()[:5].tolist()


def check_integer_dtype(name: str, ids) -> torch.Tensor:
    """``ids`` must be a tensor of an integer dtype (token ids): TypeError otherwise."""
    check_tensor(name, ids)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {str(ids.dtype).replace('torch.', '')}")
    return ids


def check_token_ids(name: str, ids, vocab_size: int | None = None, targets=None) -> torch.Tensor:
    """``ids``: a ``(B, T)`` integer tensor with ``T >= 1`` (and, given ``vocab_size``, every id in
    ``[0, vocab_size)``; that check reads the ids on the host). ``targets``, when given, must be
    integer ids, one per id."""
    check_integer_dtype(name, ids)
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        raise ValueError(f"{name} must be a (B, T) tensor of token ids with B, T >= 1, got shape {tuple(ids.shape)}")
    if targets is not None and check_integer_dtype("targets", targets).numel() != ids.numel():
        raise ValueError(f"targets must have the shape of {name}, {tuple(ids.shape)}, got {tuple(targets.shape)}")
    if vocab_size is not None:
        bad = _out_of_vocab(ids, vocab_size)
        if bad:
            raise ValueError(f"{name} holds token ids outside the vocabulary, 0 to {vocab_size - 1}: {bad}")
    return ids


__all__ = ["check_integer_dtype", "check_token_ids"]

"""Batches of token sequences: random windows of one stream, and sequences of different lengths
either padded to the longest or packed end to end (``cu_seqlens``), with the FLOPs each costs."""
from __future__ import annotations

import numbers

import torch

from ..checks import check_block
from ..costs.flops import BWD_OVER_FWD, attention_flops
from .gpt import IGNORE_INDEX, GPTConfig
from .ids import check_integer_dtype


def random_windows(tokens: torch.Tensor, batch: int, context: int, steps: int, seed: int = 0) -> list:
    """``steps`` batches ``(x, y)`` of ``batch`` windows of ``context`` tokens drawn at random
    offsets of ``tokens`` (``y`` is ``x`` shifted by one). Drawn once from a seeded generator,
    so every backend trains on exactly the same batches."""
    if check_integer_dtype("tokens", tokens).dim() != 1:
        raise ValueError(f"tokens must be a 1-D tensor of integer token ids, got shape {tuple(tokens.shape)}")
    batch, context = check_block("batch", batch), check_block("context", context)
    steps = check_block("steps", steps)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if tokens.numel() < context + 2:
        raise ValueError(f"tokens has {tokens.numel()} ids, too few for windows of context={context}")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, tokens.numel() - context - 1, (batch,), generator=gen)
        rows = torch.stack([tokens[s:s + context + 1] for s in starts.tolist()])
        out.append((rows[:, :-1].contiguous(), rows[:, 1:].contiguous()))
    return out


def _check_sequences(seqs) -> list:
    seqs = list(seqs)
    if not seqs or any(not isinstance(s, torch.Tensor) or s.dim() != 1 or s.numel() < 2 for s in seqs):
        raise ValueError("seqs must be a non-empty list of 1-D token tensors of at least 2 tokens each")
    for s in seqs:
        check_integer_dtype("seqs", s)
    return seqs


def padded_batch(seqs):
    """``(x, y)`` of shape ``(B, T)`` with ``T`` the longest input length: sequence ``b`` of
    ``n + 1`` tokens fills ``x[b, :n]`` and ``y[b, :n]``, and the rest is padding (token 0 in
    ``x``, :data:`IGNORE_INDEX` in ``y``, so the loss skips it). Padding sits after the real
    tokens, so under causal attention no real token sees it."""
    seqs = _check_sequences(seqs)
    T = max(s.numel() for s in seqs) - 1
    x = torch.zeros(len(seqs), T, dtype=torch.long)
    y = torch.full((len(seqs), T), IGNORE_INDEX, dtype=torch.long)
    for b, s in enumerate(seqs):
        x[b, :s.numel() - 1], y[b, :s.numel() - 1] = s[:-1], s[1:]
    return x, y


def packed_batch(seqs):
    """``(x, y, cu_seqlens, positions)``: the sequences end to end in one row, ``x`` and
    ``y`` of shape ``(1, total)``, ``cu_seqlens`` int32 ``[0, n_0, n_0 + n_1, ...]`` and
    each token's position inside its own sequence (rotary positions restart at every
    sequence)."""
    seqs = _check_sequences(seqs)
    lengths = [s.numel() - 1 for s in seqs]
    x = torch.cat([s[:-1] for s in seqs])[None]
    y = torch.cat([s[1:] for s in seqs])[None]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                              dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lengths])
    return x, y, cu_seqlens, positions


def model_flops(config: GPTConfig, lengths, padded_to: int | None = None, backward: bool = True) -> float:
    """FLOPs of a forward (and backward) pass over sequences of ``lengths`` tokens, or over as many
    sequences all of ``padded_to`` tokens (what a padded batch computes).

    Matrix products: 2 FLOPs per weight per token (the tied output layer included; the embedding
    lookup is free), twice that again for the backward. Attention: :func:`flashtut.costs.flops.attention_flops`
    per sequence, causal, over the keys a query can see (all earlier ones, or the window)."""
    c = config
    lengths = [padded_to or n for n in lengths]
    D = c.head_dim
    per_token = 2 * (c.n_layer * (c.d_model * D * (2 * c.n_head + 2 * c.n_kv_head)
                                  + 2 * c.mlp_ratio * c.d_model ** 2) + c.d_model * c.vocab_size)
    total = 0.0
    for n in lengths:
        total += per_token * n * (3 if backward else 1)
        # causal over n keys credits n^2 / 2 scores; a window w < n leaves about n * w of them
        causal = c.window is None or c.window >= n
        fwd = attention_flops(1, c.n_head, n, n if causal else c.window, D, causal=causal)
        total += c.n_layer * fwd * ((1 + BWD_OVER_FWD) if backward else 1)
    return total


__all__ = ["random_windows", "padded_batch", "packed_batch", "model_flops"]

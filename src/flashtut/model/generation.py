"""Greedy generation, with a KV cache or by recomputing the whole prefix for every new token."""
from __future__ import annotations

import torch

from ..checks import check_block, check_bool
from .gpt import GPT, KVCache
from .ids import check_token_ids
from .training import autocast


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool = True,
             decode: str = "split-kv", num_splits: int = 1,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """``prompt`` ``(B, T0)`` followed by ``new_tokens`` greedily chosen tokens,
    ``(B, T0 + new_tokens)``.

    With ``use_cache`` the prompt runs once (the prefill) and fills a :class:`KVCache`;
    each new token then runs alone and attends to the cache (``decode``: ``"split-kv"``
    through :func:`flashtut.split_kv_attention` with ``num_splits`` chunks, or
    ``"backend"``). Without it, every step runs the model over the whole sequence so far
    and keeps only the last position. Both choose the same tokens (to rounding of
    near-ties)."""
    new_tokens = check_block("new_tokens", new_tokens)
    use_cache = check_bool("use_cache", use_cache)
    check_token_ids("prompt", prompt, model.config.vocab_size)
    device = next(model.parameters()).device
    model.eval()
    seq = prompt.to(device)
    cache = None
    if use_cache:
        cache_dtype = dtype or next(model.parameters()).dtype
        cache = KVCache(model.config, seq.shape[0], seq.shape[1] + new_tokens, device,
                        cache_dtype, decode=decode, num_splits=num_splits)
    step_input = seq
    for _ in range(new_tokens):
        with autocast(device, dtype):
            logits, _ = model(step_input if use_cache else seq, cache=cache)
        nxt = logits[:, -1].float().argmax(dim=-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
        step_input = nxt
    return seq


__all__ = ["generate"]

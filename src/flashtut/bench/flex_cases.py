"""The masks and score mods FlexAttention is measured on (the grid of the experiment), one definition for the
GPU tests and the benchmark (``experiments/flex/bench_flex.py``).

Causal; a sliding window of 1024 keys; a document mask of random lengths (about ``N / 1024`` cut
points drawn uniformly, so documents average 1024 positions); prefix-LM with a prefix of ``N / 4``;
ALiBi and soft-capping (cap 50, Gemma 2's), each on top of the causal mask.
"""
from __future__ import annotations

import torch

from .. import masks

CASES = ("causal", "window", "document", "prefix_lm", "alibi", "softcap")


def flex_case(name: str, N: int, H: int, device="cuda", seed: int = 0):
    """``(mask_mod, score_mod)`` of case ``name`` for sequences of ``N`` positions and ``H`` heads."""
    if name not in CASES:
        raise ValueError(f"name must be one of {', '.join(CASES)}, got {name!r}")
    if name == "document":
        gen = torch.Generator().manual_seed(seed)
        cuts = torch.randperm(N - 1, generator=gen)[:max(1, N // 1024)] + 1
        starts = torch.zeros(N, dtype=torch.int64)
        starts[cuts] = 1
        return masks.document(starts.cumsum(0).to(device)), None
    if name == "window":
        return masks.sliding_window(1024), None
    if name == "prefix_lm":
        return masks.prefix_lm(N // 4), None
    if name == "alibi":
        return masks.causal, masks.alibi(masks.alibi_slopes(H, device=device))
    if name == "softcap":
        return masks.causal, masks.softcap(50.0)
    return masks.causal, None

__all__ = ["CASES", "flex_case"]

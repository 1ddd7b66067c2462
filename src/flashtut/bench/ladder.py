"""The CUDA forward ladder timed on this GPU: TFLOP/s of each step next to naive attention.

Chapter 08 calls :func:`ladder_tflops` for its live table; ``python -m flashtut.bench run
--impl cuda-ladder`` measures the same steps with the full protocol (provenance, JSON rows).
"""
from __future__ import annotations

import torch

from ..costs.flops import attention_flops, tflops
from ..cuda.attention import cuda_forward
from ..cuda.configs import VARIANTS
from ..reference import naive_attention
from .timing import time_fn


def ladder_tflops(N: int = 2048, D: int = 128, H: int = 16, B: int = 1, dtype=torch.float16,
                  causal: bool = False, variants=None) -> dict:
    """Forward TFLOP/s of each ladder step (and naive attention) on this GPU, on random inputs,
    each checked against naive attention first. Returns ``{name: TFLOP/s}``."""
    if not torch.cuda.is_available():
        raise RuntimeError("ladder_tflops times the CUDA kernels and needs a CUDA GPU; torch sees none "
                           "(Colab: Runtime > Change runtime type > GPU)")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    flops = attention_flops(B, H, N, N, D, causal)
    ref = naive_attention(q, k, v, causal=causal)
    out = {"naive": tflops(flops, time_fn(lambda: naive_attention(q, k, v, causal=causal), "cuda"))}
    for name in variants or VARIANTS:
        o, _ = cuda_forward(q, k, v, causal=causal, variant=name)
        err = (o.float() - ref.float()).abs().max().item()
        if not err < 0.05:
            raise RuntimeError(f"cuda {name} differs from naive attention by {err:.3g}; not timing it")
        out[f"cuda-{name}"] = tflops(
            flops, time_fn(lambda: cuda_forward(q, k, v, causal=causal, variant=name), "cuda"))
    return out

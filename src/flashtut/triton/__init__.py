"""Attention in Triton: the fused FlashAttention-2 forward and backward kernels.

``attention`` is the autograd interface and the launches (``triton_attention``,
``triton_forward``, ``triton_backward``); ``forward`` and ``backward`` hold the ``@triton.jit``
kernels; ``configs`` the tile tables and the autotuning search space. Importing this package
needs triton only when a kernel is called.
"""
from __future__ import annotations

from .attention import (KERNEL_DTYPES, MAX_HEAD_DIM, TritonAttention, best_configs, interpreting,
                        triton_attention, triton_backward, triton_forward, use_configs,
                        use_fused_backward)
from .configs import TileConfig

__all__ = ["triton_attention", "triton_forward", "triton_backward", "TritonAttention", "interpreting",
           "best_configs", "use_configs", "use_fused_backward", "TileConfig", "KERNEL_DTYPES", "MAX_HEAD_DIM"]

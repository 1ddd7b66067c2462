"""Attention in CUDA C, compiled at run time with NVRTC through CuPy and launched on torch's stream.

``kernels/`` holds the ``.cu`` sources, one readable kernel per step of the forward ladder
(:data:`VARIANTS`) plus the backward's kernels and the Hopper rungs; ``configs`` says what to build
and launch on each GPU (tile shapes, shared-memory and register budgets), and :func:`kernel_plan`
answers which kernels and tiles run for a GPU, dtype and head dim; ``compile`` builds and launches
them; ``attention`` checks the inputs once, launches any ladder step (``cuda_forward``) and the
backward (``cuda_backward``), and holds the autograd entry point ``cuda_attention``; ``models/``
holds the kernels' CPU models (fragment layouts, warp grid, barrier schedule, the cubic exponential).
Importing this package needs neither a GPU nor CuPy; calling a kernel needs both.
"""
from __future__ import annotations

from .configs import FAST_VARIANTS, VARIANTS, KernelPlan, fast_variant, kernel_plan

__all__ = ["VARIANTS", "FAST_VARIANTS", "fast_variant", "kernel_plan", "KernelPlan"]

"""CPU models of the CUDA kernels: what a kernel does, written in plain Python and checked against the
kernel's own code by the tests, so that a chapter can show it and a reader can run it without a GPU.

* :mod:`.mma_layout`: which thread holds which element of an mma.sync fragment, and ldmatrix's addresses
  (chapter 08);
* :mod:`.warp_grid`: the backward's 2 x 4 warp grid, which warp owns which tile elements (chapter 08);
* :mod:`.hopper_layout`: the wgmma fragments, swizzled tiles, tile counts and register budgets of the
  Hopper rungs (chapter 11);
* :mod:`.hopper_schedule`: the Hopper rungs' barrier protocol, played step by step (chapter 11);
* :mod:`.hopper_bwd`: the Hopper backward's steps per query block, its MN-major operands and dS^T
  stores, and the costs of summing dQ (chapter 11b);
* :mod:`.exp2_poly`: ``ft_exp2_poly``, the exponential on the float32 pipe, operation by operation
  (chapter 11).
"""

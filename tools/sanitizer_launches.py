"""One small launch of every CUDA kernel (each forward ladder step, the fast kernel at its default
and its 32-rows-per-warp tile shapes, the backward), for compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tools/sanitizer_launches.py
    compute-sanitizer --tool racecheck python3 tools/sanitizer_launches.py

Odd lengths (77 queries, 131 keys) so that every masked tail is exercised.
"""
import torch

import flashtut
from flashtut.cuda.attention import cuda_forward as forward

for D in (64, 128):
    q, k, v = (torch.randn(1, 2, 77, D, device="cuda", dtype=torch.float16) for _ in range(3))
    k2, v2 = (torch.randn(1, 2, 131, D, device="cuda", dtype=torch.float16) for _ in range(2))
    for variant in ("v1", "v2", "v3"):
        for causal in (False, True):
            forward(q, k2, v2, causal=causal, variant=variant)
    for causal in (False, True):
        forward(q, k2, v2, causal=causal, warps=4, block_n=64, m_tiles=2)
    q.requires_grad_(); k2.requires_grad_(); v2.requires_grad_()
    flashtut.cuda_attention(q, k2, v2, causal=True).sum().backward()
torch.cuda.synchronize()
print("sanitizer launches done")

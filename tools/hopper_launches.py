"""Launches of the Hopper rungs for the profilers (run by tools/gpu_hopper.sh):

    compute-sanitizer --tool memcheck|racecheck|synccheck python3 tools/hopper_launches.py
        one small launch of every build: odd lengths (77 queries, 131 keys, and the reverse), so
        every masked tail, both causal alignments and grouped heads are exercised;
    ncu ... python3 tools/hopper_launches.py --profile
        one protocol-size forward (B = 4, H = 16, N = 4096, D = 128, float16) of W1, of cuda-v3
        (mma.sync) and of SDPA-flash, to compare tensor-pipe use and stall reasons.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtut.cuda.attention import cuda_forward
from flashtut.cuda.hopper import forward_hopper

if "--profile" in sys.argv:
    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    for causal in (False, True):
        forward_hopper(q, k, v, causal=causal)
        cuda_forward(q, k, v, causal=causal, variant="v3")
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
else:
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            q = torch.randn(1, 4, 77, D, device="cuda", dtype=dtype)
            k, v = (torch.randn(1, 2, 131, D, device="cuda", dtype=dtype) for _ in range(2))
            for causal in (False, True, "bottom-right"):
                forward_hopper(q, k, v, causal=causal)
                forward_hopper(k.repeat(1, 2, 1, 1), q[:, :2], q[:, :2], causal=causal)  # Nq > Nk
            for block_n, pv_split in ((64, True), (128, False)):
                forward_hopper(q, k, v, causal=True, block_n=block_n, pv_split=pv_split)
torch.cuda.synchronize()
print("hopper launches done")

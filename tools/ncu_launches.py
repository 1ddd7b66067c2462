"""One launch of each forward that chapter 11 compares, for Nsight Compute: SDPA flash, the
mma.sync forward ``cuda_attention(..., forward_kernel="mma")`` runs, and Hopper rungs W1, W2, W3 (at
D = 64 also W3 with three consumer warpgroups), W4 (three consumers at D = 64), then W3 and W4 causal,
at the protocol's N = 4096 (B = 4, H = 2048 / D), fp16, not causal unless said, random inputs:

    python3 tools/ncu_launches.py 128            # once without ncu: fills CuPy's kernel cache
    ncu -k regex:flash_fwd --metrics ... python3 tools/ncu_launches.py 128

Each kernel runs exactly once, so ncu's report has one entry per kernel (the benchmark's own
warm-up and timing launches would fill a launch count with the first implementation alone).

    python3 tools/ncu_launches.py 64 options     # the W3 build at this D plain, then with each build option
                                                 # (configs.W3_OPTIONS: 1, 2, 3 of every 8 exponentials on the
                                                 # float32 pipe, rows as trees, W4's causal order, the TMA
                                                 # store, and with three consumers their turns); not
                                                 # causal, then causal
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtut
from flashtut.cuda.hopper import forward_hopper
from flashtut.cuda import configs as cf

D = int(sys.argv[1]) if len(sys.argv) > 1 else 128
q, k, v = (torch.randn(4, 2048 // D, 4096, D, device="cuda", dtype=torch.float16) for _ in range(3))
wide = cf.HOPPER_CONSUMERS[D]    # cuda_attention's consumer warpgroups at this D
if sys.argv[2:] == ["options"]:
    for causal in (False, True):
        for options in ({}, {"exp2_poly": 1}, {"exp2_poly": 2}, {"exp2_poly": 3}, {"row_tree": True},
                        {"section_order": True}, {"tma_store": True}, *([{"c3_turns": True}] if wide == 3 else [])):
            forward_hopper(q, k, v, causal=causal, variant="w3", consumers=wide, **options)
    torch.cuda.synchronize()
    print(f"ncu launches done (D = {D}, W3 and its build options)")
    sys.exit(0)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    F.scaled_dot_product_attention(q, k, v)
flashtut.cuda_attention(q, k, v, forward_kernel="mma")
for variant in ("w1", "w2", "w3"):
    forward_hopper(q, k, v, variant=variant)
if D == 64:     # W3 with three consumer warpgroups, built for D = 64 only
    forward_hopper(q, k, v, variant="w3", consumers=3)
# W4 (persistent blocks) with cuda_attention's consumers at this D, not causal, then W3 and W4 causal
forward_hopper(q, k, v, variant="w4", consumers=wide)
forward_hopper(q, k, v, causal=True, variant="w3", consumers=wide)
forward_hopper(q, k, v, causal=True, variant="w4", consumers=wide)
torch.cuda.synchronize()
print(f"ncu launches done (D = {D})")

"""One backward of each named rung (and SDPA flash's) on one protocol case, for Nsight Compute:

    ncu --clock-control none -k regex:'bwd_hopper$|flash_bwd_dq' --metrics \\
        sm__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \\
        python3 experiments/hopper_backward/profile_one.py --rungs b3,b4 --D 128 [--causal]

Each rung runs once; ncu profiles every launch whose kernel name matches -k.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from flashtut.cuda.attention import cuda_forward
from flashtut.cuda.hopper_backward import hopper_backward


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rungs", default="b3,b4")
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)
    H, B = 2048 // args.D, 16384 // args.N
    q, k, v, do = (torch.randn(B, H, args.N, args.D, device="cuda", dtype=torch.float16) for _ in range(4))
    o, lse = cuda_forward(q, k, v, args.causal)
    for rung in args.rungs.split(","):
        hopper_backward(q, k, v, o, lse, do, args.causal, rung=rung)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(*leaves, is_causal=args.causal)
    torch.autograd.grad(out, leaves, do)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One small backward per rung and head dim, for compute-sanitizer (memcheck, racecheck, synccheck):

    compute-sanitizer --tool racecheck python3 experiments/hopper_backward/sanitize.py [--rungs b2]

Odd lengths (tails in both Nq and Nk), grouped heads and a bottom-right causal mask with a window, so
that masked tiles, skipped blocks and padded rows all run; a check against float32 so the run proves the
kernels ran. ``--no-reuse``: one query head per KV head and at most two query blocks, so that no block's
ring of two stages is filled twice (racecheck then sees every stage written once; with reuse it reports the
refill of a stage after the consumers' release, the pattern experiments/racecheck_probes shows it cannot follow).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from flashtut.cuda.hopper_backward import HEAD_DIMS, hopper_backward


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rungs", default="b1,b2,b3,b4")
    ap.add_argument("--no-reuse", action="store_true", help="shapes whose blocks fill each stage once")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    for rung in args.rungs.split(","):
        for D in HEAD_DIMS:
            # queries: two blocks of 8192 / D rows at most with --no-reuse (one head per KV head)
            Nq, Nk, G = (2 * 8192 // D - 11, 2 * 8192 // D + 22, 1) if args.no_reuse else (300, 333, 2)
            for causal, window in ((False, None), ("bottom-right", 100)):
                q = torch.randn(1, 2 * G, Nq, D, device="cuda", dtype=torch.float16)
                k, v = (torch.randn(1, 2, Nk, D, device="cuda", dtype=torch.float16) for _ in range(2))
                do = torch.randn_like(q)
                leaves = [t.float().requires_grad_() for t in (q, k, v)]
                kf, vf = (t.repeat_interleave(G, 1) for t in leaves[1:])
                s = leaves[0] @ kf.transpose(-1, -2) / math.sqrt(D)
                if causal:
                    i = torch.arange(Nq, device="cuda")[:, None]
                    j = torch.arange(Nk, device="cuda")[None, :]
                    s = s.masked_fill((j > i + Nk - Nq) | (j <= i + Nk - Nq - window), float("-inf"))
                lse = torch.logsumexp(s, -1)
                o = torch.softmax(s, -1) @ vf
                ref = torch.autograd.grad(o, leaves, do.float())
                grads = hopper_backward(q, k, v, o.detach().half(), lse.detach(), do, causal, window=window, rung=rung)
                torch.cuda.synchronize()
                err = max(float((g.float() - r).abs().max() / r.abs().max()) for g, r in zip(grads, ref))
                print(f"{rung} D={D} causal={causal} window={window}: max relative error {err:.2e}")
                if not err < 2e-2:
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

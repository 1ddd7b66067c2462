"""Launch one kernel of ``probe_racecheck.cu`` (named on the command line, default all five) once, for
compute-sanitizer's racecheck, and check that warp 1 received the word (sm_90 GPU):

    compute-sanitizer --tool racecheck python3 tools/racecheck_probe.py probe_arrive_sync

What racecheck reports for each says which orderings of a shared-memory handover it follows; see the
kernel file's comment.
"""
import sys

import torch

from flashtut.cuda import compile as cc

KERNELS = ("probe_unordered", "probe_both_sync", "probe_arrive_sync", "probe_mbar_parity", "probe_mbar_token")

if __name__ == "__main__":
    names = sys.argv[1:] or KERNELS
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        sys.exit(f"unknown probe {unknown[0]!r}; the probes are {', '.join(KERNELS)}")
    for name in names:
        out = torch.zeros(1, dtype=torch.int32, device="cuda")
        cc.launch(cc.get_function("probe_racecheck.cu", name, arch="90a"), (1,), (64,), (out, 42))
        torch.cuda.synchronize()
        print(name, "handed over", out.item())

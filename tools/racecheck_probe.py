"""Launch one kernel of ``probe_racecheck.cu`` (named on the command line, default all of them) once, for
compute-sanitizer's racecheck, and check that warp 1 received the word (sm_90 GPU):

    compute-sanitizer --tool racecheck python3 tools/racecheck_probe.py probe_arrive_sync

What racecheck reports for each says which orderings of a shared-memory handover it follows; see the
kernel file's comment.
"""
import sys

import torch

from flashtut.cuda import compile as cc

KERNELS = ("probe_unordered", "probe_both_sync", "probe_arrive_sync", "probe_mbar_parity", "probe_mbar_token",
           "probe_mbar_tx", "probe_named_ring", "probe_mbar_ring")
#: the probes that hand over PROBE_ROUNDS words in a row (warp 1 reports their sum)
ROUNDS = {"probe_named_ring": 8, "probe_mbar_ring": 8}

if __name__ == "__main__":
    names = sys.argv[1:] or KERNELS
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        sys.exit(f"unknown probe {unknown[0]!r}; the probes are {', '.join(KERNELS)}")
    for name in names:
        out = torch.zeros(1, dtype=torch.int32, device="cuda")
        args = (out, 42) + ((torch.zeros(4, dtype=torch.int32, device="cuda"),) if name == "probe_mbar_tx" else ())
        cc.launch(cc.get_function("probe_racecheck.cu", name, arch="90a"), (1,), (64,), args)
        torch.cuda.synchronize()
        rounds = ROUNDS.get(name, 1)
        expected = sum(42 + i for i in range(rounds))
        print(name, "handed over", out.item(), "ok" if out.item() == expected else f"WRONG (expected {expected})")

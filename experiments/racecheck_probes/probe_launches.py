"""The kernels of probe_racecheck.cu, each a handover of one shared-memory word from warp 0 to warp 1
ordered another way, one launch each on an sm_90 GPU, and whether the word arrived; names as arguments
keep only those (``probe_arrive_sync``). What compute-sanitizer's racecheck reports for each says which
orderings it follows (see the kernel file):

    compute-sanitizer --tool racecheck python3 experiments/racecheck_probes/probe_launches.py

(Moved here from tools/sanitizer_launches.py --probes: a question about the tool, not a kernel that ships.)
"""
import re
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "probe_racecheck.cu"


def probe_kernels() -> tuple[tuple[str, ...], int]:
    """The kernels of probe_racecheck.cu, each a handover of a shared-memory word, and its PROBE_ROUNDS:
    the words a ring (a kernel named ``*_ring``) hands over in a row, warp 1 reporting their sum."""
    text = SOURCE.read_text()
    names = tuple(re.findall(r'extern "C" __global__ void (probe_\w+)\(', text))
    return names, int(re.search(r"#define PROBE_ROUNDS (\d+)", text).group(1))


def probe_launches(names):
    """One launch of each probe of ``names`` (one block of 64 threads), and whether warp 1 got the word."""
    from flashtut.cuda import compile as cc

    probes, rounds = probe_kernels()
    unknown = [n for n in names if n not in probes]
    if unknown:
        sys.exit(f"unknown probe {unknown[0]!r}; the probes are {', '.join(probes)}")
    for name in names:
        out = torch.zeros(1, dtype=torch.int32, device="cuda")
        args = (out, 42) + ((torch.zeros(4, dtype=torch.int32, device="cuda"),) if name == "probe_mbar_tx" else ())
        cc.launch(cc.get_function(SOURCE.read_text(), name, arch="90a"), (1,), (64,), args)
        torch.cuda.synchronize()
        expected = sum(42 + i for i in range(rounds if name.endswith("_ring") else 1))
        print(name, "handed over", out.item(), "ok" if out.item() == expected else f"WRONG (expected {expected})")


if __name__ == "__main__":
    probe_launches(sys.argv[1:] or probe_kernels()[0])

"""Host time per call of each fused attention entry point, at a size where the GPU work is tiny.

The time of many back-to-back calls on a problem that takes the GPU a few microseconds is the
time the host needs to issue one call (checks, planning, allocation, the launch itself): the
per-call cost that decides a kernel's speed at short sequences (chapter 09, section 9.3).

    PYTHONPATH=src python3 tools/host_overhead.py --out host_overhead.json [--label new]

Run it with ``PYTHONPATH`` pointing at another checkout's ``src`` to compare two versions.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):                       # builds, caches, autotuning: not counted
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):                        # best of five: the host's quietest stretch
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    import flashtut

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--label", default="this checkout")
    p.add_argument("--calls", type=int, default=1000)
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)
    entries = {
        "cuda_attention fwd": lambda: flashtut.cuda_attention(q, k, v),
        "cuda_attention fwd+bwd": lambda: flashtut.cuda_attention(qg, kg, vg).backward(do),
        "triton_attention fwd": lambda: flashtut.triton_attention(q, k, v),
        "triton_attention fwd+bwd": lambda: flashtut.triton_attention(qg, kg, vg).backward(do),
        "sdpa fwd (flash backend)": lambda: F.scaled_dot_product_attention(q, k, v),
        "sdpa fwd+bwd (flash backend)": lambda: F.scaled_dot_product_attention(qg, kg, vg).backward(do),
    }
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for name, fn in entries.items():
            us = per_call_us(fn, a.calls)
            rows.append({"entry": name, "us_per_call": round(us, 2)})
            print(f"{a.label:>14s}  {name:30s} {us:8.1f} us per call")
    out = {"label": a.label, "shape": "B=1, H=1, N=128, D=64, float16", "calls": a.calls,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

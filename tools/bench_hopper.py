"""Time the Hopper rungs against PyTorch SDPA (flash and cuDNN backends) and our mma.sync kernel
in one process, at the protocol's shapes; write JSON rows (run by tools/gpu_hopper.sh).

Protocol: 16k tokens in total (B = 16384 / N), hidden 2048 (D = 128 with 16 heads, D = 64 with
32 heads); forward FLOPs 4 B H N^2 D, halved when causal; median of triton.testing.do_bench.
Every output is checked before it is timed: ``fwd_err`` = max |o - fp32 reference| must be at most
twice SDPA-flash's own error plus 1e-3 (FlashAttention's criterion), or the row records the
failure instead of a time. ``vs_flash`` = TFLOP/s over SDPA-flash's in the same case.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtut.bench.provenance import collect
from flashtut.costs.flops import attention_flops
from flashtut.bench.timing import time_fn
from flashtut.cuda.attention import cuda_forward
from flashtut.cuda.hopper import forward_hopper


def _sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


IMPLS = {
    "sdpa-flash": _sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
    "cuda-v3": lambda q, k, v, c: cuda_forward(q, k, v, causal=c, variant="v3")[0],
    "hopper-w1": lambda q, k, v, c: forward_hopper(q, k, v, causal=c)[0],
    "hopper-w1[pv128]": lambda q, k, v, c: forward_hopper(q, k, v, causal=c, pv_split=False)[0],
    "hopper-w1[n64]": lambda q, k, v, c: forward_hopper(q, k, v, causal=c, block_n=64)[0],
}


def reference(q, k, v, causal):
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)


def run_case(N, D, dtype, causal, impls, log):
    H, B = 2048 // D, max(1, 16384 // N)
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    flops = attention_flops(B, H, N, N, D, causal)
    ref = reference(q, k, v, causal)
    base = dict(dtype=str(dtype).replace("torch.", ""), D=D, N=N, B=B, H=H, causal=causal)
    rows, flash_err = [], None
    for name in impls:
        fn = IMPLS[name]
        row = dict(impl=name, **base)
        try:
            err = float((fn(q, k, v, causal).float() - ref).abs().max())
            row["fwd_err"] = err
            if name == "sdpa-flash":
                flash_err = err
            elif flash_err is not None and not err <= 2 * flash_err + 1e-3:
                raise RuntimeError(f"max error {err:.3g} > 2 x SDPA-flash's {flash_err:.3g} + 1e-3")
            ms = time_fn(lambda: fn(q, k, v, causal), "cuda")
            row["fwd_ms"], row["fwd_tflops"] = ms, round(flops / ms / 1e9, 2)
        except Exception as exc:  # record and go on: one failure must not lose the run
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        torch.cuda.empty_cache()
    flash = next((r.get("fwd_tflops") for r in rows if r["impl"] == "sdpa-flash"), None)
    for row in rows:
        if flash and row.get("fwd_tflops"):
            row["vs_flash"] = round(row["fwd_tflops"] / flash, 3)
        log(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ns", default="4096,16384", help="sequence lengths, comma-separated")
    ap.add_argument("--ds", default="128,64", help="head dims, comma-separated")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"any of {', '.join(IMPLS)}")
    args = ap.parse_args(argv)
    impls = ["sdpa-flash"] + [i for i in args.impls.split(",") if i != "sdpa-flash"]
    unknown = set(impls) - set(IMPLS)
    if unknown:
        ap.error(f"unknown impls {sorted(unknown)}; accepted: {', '.join(IMPLS)}")
    t0 = time.time()
    rows = []
    for D in map(int, args.ds.split(",")):
        for N in map(int, args.ns.split(",")):
            for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
                for causal in (False, True):
                    rows += run_case(N, D, dtype, causal, impls, lambda r: print(json.dumps(r), flush=True))
    doc = {"what": "flashtut Hopper forward rungs vs PyTorch SDPA (flash, cuDNN) and cuda-v3 (mma.sync); "
                   "fwd_tflops = 4*B*H*N^2*D / time (halved when causal), median of do_bench; "
                   "fwd_err = max |o - fp32 reference|; vs_flash = ratio to sdpa-flash",
           "provenance": collect(torch.device("cuda"),
                                 call=" ".join(["python3 tools/bench_hopper.py", *(argv or sys.argv[1:])])),
           "seconds": round(time.time() - t0, 1), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {len(rows)} rows to {args.out} in {doc['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()

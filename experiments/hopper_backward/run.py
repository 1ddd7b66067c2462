"""The Hopper backward ladder (bwd_hopper.cu, rungs b1 to b4) against SDPA flash's backward and the
mma.sync backward, in one process, on the book's protocol: 16k tokens, hidden 2048, D = 64 (32 heads) and
128 (16 heads), N = 4096 and 16384, float16 and bfloat16, causal and not.

Every implementation's gradients are checked against SDPA flash's on the same inputs before it is timed
(relative max error below 2e-2 in every gradient; the yardstick itself is the gpu tests' job). Only the
backward is timed: o and lse come from one forward before the timing. Prints a table of ratios to SDPA
flash and writes the rows (kind speed, mode bwd) to $OUT/hopper_backward.json (or --out).

    python experiments/hopper_backward/run.py [--quick] [--out PATH] [--rungs b1,b2,b3,b4]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

from flashtut.bench.provenance import collect
from flashtut.bench.results import save_results
from flashtut.bench.timing import time_fn
from flashtut.cuda.attention import cuda_backward, cuda_forward
from flashtut.cuda.hopper_backward import hopper_backward

TOKENS, HIDDEN = 16384, 2048


def cases(quick: bool):
    for D in (64, 128):
        for N in ((4096,) if quick else (4096, 16384)):
            for dtype in ((torch.float16,) if quick else (torch.float16, torch.bfloat16)):
                for causal in (False, True):
                    yield TOKENS // N, HIDDEN // D, N, D, dtype, causal


def rel_err(x, ref) -> float:
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 4096, float16 only")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "hopper_backward.json"))
    ap.add_argument("--rungs", default="b1,b2,b3,b4",
                    help="rungs to time, comma-separated; RUNG:S times it with S TMA stages (where it fits)")
    ap.add_argument("--rep-ms", type=float, default=200)
    args = ap.parse_args(argv)
    rungs = [r for r in args.rungs.split(",") if r]
    torch.manual_seed(0)
    rows, table = [], []
    name = torch.cuda.get_device_name()
    for B, H, N, D, dtype, causal in cases(args.quick):
        q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(4))
        o, lse = cuda_forward(q, k, v, causal)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            o_ref = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        ref = torch.autograd.grad(o_ref, leaves, do, retain_graph=True)
        impls = {"sdpa_flash": lambda: torch.autograd.grad(o_ref, leaves, do, retain_graph=True),
                 "cuda_mma": lambda: cuda_backward(q, k, v, o, lse, do, causal)}
        for r in rungs:
            rung, _, st = r.partition(":")
            impls[f"hopper_{r}"] = (lambda rung=rung, st=int(st or 2):
                                    hopper_backward(q, k, v, o, lse, do, causal, rung=rung, stages=st))
        flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
        times = {}
        for impl, fn in impls.items():
            row = {"impl": impl, "mode": "bwd", "B": B, "H": H, "N": N, "D": D,
                   "dtype": str(dtype).replace("torch.", ""), "causal": causal, "gpu": name}
            try:
                errs = [rel_err(g, r) for g, r in zip(fn(), ref)]
                row["rel_err"] = max(errs)
                if not max(errs) < 2e-2:
                    raise RuntimeError(f"gradients off: relative errors dq, dk, dv = {errs}")
                ms = time_fn(fn, "cuda", rep_ms=args.rep_ms)
                row.update(ms=ms, tflops=flops / ms / 1e9, status="ok")
                times[impl] = ms
            except Exception as exc:   # a failing impl is a row with its reason, not a lost sweep
                row.update(status=f"error: {type(exc).__name__}: {str(exc)[:300]}", ms=None, tflops=None)
            rows.append(row)
        for row in rows[-len(impls):]:
            if row.get("ms") and times.get("sdpa_flash"):
                row["ratio_to_sdpa_flash"] = times["sdpa_flash"] / row["ms"]
        table.append((B, H, N, D, str(dtype)[6:], causal, times))
        del q, k, v, do, o, lse, leaves, o_ref, ref
        torch.cuda.empty_cache()

    impl_names = ["sdpa_flash", "cuda_mma"] + [f"hopper_{r}" for r in rungs]
    print(f"\n{name}: backward ms (ratio to SDPA flash)")
    print(f"{'case':34s}" + "".join(f"{n:>16s}" for n in impl_names))
    for B, H, N, D, dt, causal, times in table:
        cells = []
        for n in impl_names:
            t = times.get(n)
            cells.append(f"{'-':>16s}" if t is None else f"{t:7.3f} ({times['sdpa_flash'] / t:4.2f}x)"
                         .rjust(16) if times.get("sdpa_flash") else f"{t:16.3f}")
        print(f"B{B} H{H} N{N} D{D} {dt} {'causal' if causal else 'full':7s}".ljust(34) + "".join(cells))
    prov = collect("cuda", sys.argv[1:] if argv is None else argv)
    save_results(args.out, "speed", rows, prov, {"tokens": TOKENS, "hidden": HIDDEN, "rungs": rungs})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"{time.time() - t0:.0f} s")
    sys.exit(rc)

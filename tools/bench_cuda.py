"""Benchmark the CUDA forward ladder, the fast kernel's forward and backward, naive attention and
PyTorch SDPA (flash backend) in one process; write JSON rows (run by tools/gpu_cuda.sh).

Protocol (DESIGN.md): 16k tokens in total (B = 16384 / N), hidden 2048 (D=128 with 16 heads,
D=64 with 32 heads); fwd FLOPs 4 B H N^2 D (halved when causal), bwd 2.5x that; median time
of triton.testing.do_bench; random inputs; each output checked before it is timed; errors are
max |out - fp32 reference| next to SDPA-flash's own.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtut
from flashtut.cuda import VARIANTS
from flashtut.bench.timing import time_fn
from flashtut.costs.flops import attention_flops
from flashtut.cuda.attention import cuda_forward as forward


def sdpa_flash(q, k, v, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def reference(q, k, v, causal):
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)


def fwd_impls(ladder: bool):
    impls = {"sdpa-flash": sdpa_flash, "cuda": lambda q, k, v, c: forward(q, k, v, causal=c, variant="v3")[0]}
    if ladder:
        impls["naive"] = lambda q, k, v, c: flashtut.naive_attention(q, k, v, causal=c)
        for name in VARIANTS:
            impls[f"cuda-{name}"] = (lambda n: lambda q, k, v, c: forward(q, k, v, causal=c, variant=n)[0])(name)
    return impls


def run_case(N, D, dtype, causal, ladder, with_bwd, log):
    H = 2048 // D
    B = max(1, 16384 // N)
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    flops = attention_flops(B, H, N, N, D, causal)
    ref = reference(q, k, v, causal)
    rows = []
    base = dict(dtype=str(dtype).replace("torch.", ""), D=D, N=N, B=B, H=H, causal=causal)
    for name, fn in fwd_impls(ladder).items():
        row = dict(impl=name, **base)
        try:
            o = fn(q, k, v, causal)
            row["fwd_err"] = float((o.float() - ref).abs().max())
            if not row["fwd_err"] < 0.1:
                raise RuntimeError(f"wrong output, max error {row['fwd_err']:.3g}")
            ms = time_fn(lambda: fn(q, k, v, causal), "cuda")
            row["fwd_ms"] = ms
            row["fwd_tflops"] = round(flops / ms / 1e9, 2)
        except Exception as exc:  # record and go on: one failure must not lose the whole run
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        log(row)
        torch.cuda.empty_cache()
    if with_bwd:
        do = torch.randn_like(q)
        grads_ref = None
        if N <= 4096:
            qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
            reference(qr, kr, vr, causal).backward(do.float())
            grads_ref = (qr.grad, kr.grad, vr.grad)
        for name, fn in (("sdpa-flash", lambda a, b, c: sdpa_flash(a, b, c, causal)),
                         ("cuda", lambda a, b, c: flashtut.cuda_attention(a, b, c, causal=causal))):
            row = next(r for r in rows if r["impl"] == name)
            try:
                qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
                o = fn(qg, kg, vg)
                o.backward(do, retain_graph=True)
                if grads_ref is not None:
                    for gname, mine, want in zip(("dq", "dk", "dv"), (qg.grad, kg.grad, vg.grad), grads_ref):
                        row[f"{gname}_err"] = float((mine.float() - want).abs().max())

                def bwd():
                    qg.grad = kg.grad = vg.grad = None
                    o.backward(do, retain_graph=True)
                ms = time_fn(bwd, "cuda")
                row["bwd_ms"] = ms
                row["bwd_tflops"] = round(2.5 * flops / ms / 1e9, 2)
            except Exception as exc:
                row["bwd_error"] = f"{type(exc).__name__}: {exc}"[:300]
            log(row)
            torch.cuda.empty_cache()
    return rows


#: (warps, block_n, m_tiles) tried by --explore
TILE_CHOICES = {128: [(8, 64, 1), (8, 128, 1), (4, 64, 1), (4, 32, 2), (8, 32, 2), (4, 64, 2)],
                64: [(8, 64, 1), (8, 128, 1), (4, 128, 1), (4, 64, 2), (8, 64, 2), (4, 128, 2)]}


def explore(log):
    """Forward TFLOP/s of the fast kernel at other (warps, block_n, m_tiles): rows named cuda-v3[wW,nN,mtM]."""
    rows = []
    for D, choices in TILE_CHOICES.items():
        H = 2048 // D
        for N in (4096, 16384):
            B = max(1, 16384 // N)
            g = torch.Generator(device="cuda").manual_seed(N + D)
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
            for causal in (False, True):
                ref = sdpa_flash(q, k, v, causal).float()
                flops = attention_flops(B, H, N, N, D, causal)
                for warps, block_n, mt in choices:
                    row = dict(impl=f"cuda-v3[w{warps},n{block_n},mt{mt}]", dtype="float16", D=D, N=N, B=B, H=H,
                               causal=causal)
                    try:
                        fn = lambda: forward(q, k, v, causal=causal, warps=warps, block_n=block_n, m_tiles=mt)[0]
                        row["fwd_err_vs_sdpa"] = float((fn().float() - ref).abs().max())
                        if not row["fwd_err_vs_sdpa"] < 0.05:
                            raise RuntimeError(f"wrong output, {row['fwd_err_vs_sdpa']:.3g} from sdpa")
                        ms = time_fn(fn, "cuda")
                        row["fwd_ms"], row["fwd_tflops"] = ms, round(flops / ms / 1e9, 2)
                    except Exception as exc:
                        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    rows.append(row)
                    log(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--explore", action="store_true", help="also time other tile sizes of the fast kernel")
    ap.add_argument("--explore-only", action="store_true", help="only time the fast kernel's tile sizes")
    args = ap.parse_args()
    t0 = time.time()

    def log(row):
        print(json.dumps(row), flush=True)

    rows = []
    # the ladder: every step, naive and SDPA-flash, at N = 1024 and 4096, D = 128 and 64
    for D in (() if args.explore_only else (128, 64)):
        for N in ((4096,) if args.quick else (1024, 4096)):
            for causal in (False, True):
                rows += run_case(N, D, torch.float16, causal, ladder=True, with_bwd=False, log=log)
    # the fast kernel against SDPA-flash, forward and backward
    for D in (() if args.explore_only else (128, 64)):
        quick_ns = (4096, 16384) if D == 128 else (4096,)
        for N in (quick_ns if args.quick else (1024, 4096, 16384)):
            for dtype in (torch.float16, torch.bfloat16):
                for causal in (False, True):
                    rows += run_case(N, D, dtype, causal, ladder=False, with_bwd=True, log=log)
    if args.explore_only:
        args.explore = True
    if args.explore:
        rows += explore(log)
    import cupy
    import triton
    doc = {
        "what": "flashtut CUDA kernels vs naive attention and PyTorch SDPA (flash backend). "
                "fwd_tflops = 4*B*H*N^2*D / time (halved when causal); bwd_tflops = 2.5x that over the "
                "backward time; median of triton.testing.do_bench; *_err = max |x - fp32 reference|.",
        "device": torch.cuda.get_device_name(),
        "capability": "sm_%d%d" % torch.cuda.get_device_capability(),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
                     "cupy": cupy.__version__, "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 tools/bench_cuda.py --out ..." + (" --quick" if args.quick else "")
                   + (" --explore-only" if args.explore_only else " --explore" if args.explore else ""),
        "seconds": round(time.time() - t0, 1),
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {len(rows)} rows to {args.out} in {doc['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()

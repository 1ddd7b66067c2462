"""Time flashtut's Triton attention against PyTorch SDPA (flash backend) in one process.

Usage (on a CUDA GPU):
    PYTHONPATH=src python3 tools/bench_triton.py --out results.json [--precompile 8]

Shapes: the FlashAttention-2 sweep at 16k tokens (B = 16384 / N), hidden 2048 (D=64 with 32
heads, D=128 with 16 heads), N in {4096, 16384}, fp16 and bf16, causal and not.
FLOPs: forward 4 B H N^2 D (halved when causal), backward 2.5 times that.
Timing: triton.testing.do_bench, median, warm-up excluded; random inputs; each result is
checked against SDPA before it is timed. Accuracy at N=4096: max |error| of o, dq, dk, dv
against an fp32 reference (SDPA math backend on upcast inputs), ours and SDPA flash's.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def shapes(ns=(4096, 16384), ds=(64, 128)):
    for D, N, dtype, causal in itertools.product(ds, ns, DTYPES, (False, True)):
        yield dict(B=16384 // N, H=2048 // D, N=N, D=D, dtype=dtype, causal=causal)


def _compile_combo(combo):
    """Worker: run one (dtype, D, causal) combination once at a small size, which compiles
    every configuration in its search space into triton's on-disk cache."""
    dtype, D, causal = combo
    from flashtut.triton import attention as tk
    t = time.time()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 1024, D, device="cuda", dtype=DTYPES[dtype], generator=g) for _ in range(3))
    o, lse = tk.triton_forward(q, k, v, causal)
    tk.triton_backward(q, k, v, o, lse, torch.randn_like(o), causal)
    torch.cuda.synchronize()
    return f"{dtype} D={D} causal={causal}: {time.time() - t:.1f}s"


def precompile(procs: int, ds=(64, 128)):
    combos = list(itertools.product(DTYPES, ds, (False, True)))
    ctx = mp.get_context("spawn")
    with ctx.Pool(min(procs, len(combos))) as pool:
        for line in pool.imap_unordered(_compile_combo, combos):
            print("precompiled", line, flush=True)


def max_err(a, b):
    return float((a.detach().float() - b.detach().float()).abs().max())


def run_shape(s, do_accuracy: bool):
    from triton.testing import do_bench
    from flashtut.triton import attention as tk

    B, H, N, D, causal = s["B"], s["H"], s["N"], s["D"], s["causal"]
    dt = DTYPES[s["dtype"]]
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=dt, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    fwd_flops = 4.0 * B * H * N * N * D / (2 if causal else 1)
    bwd_flops = 2.5 * fwd_flops
    row = dict(s)

    # correctness first: ours vs SDPA flash on these very inputs
    o_t = tk.triton_attention(q, k, v, causal)
    g_t = torch.autograd.grad(o_t, (q, k, v), do)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_s = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        g_s = torch.autograd.grad(o_s, (q, k, v), do)
    row["max_diff_vs_sdpa"] = {n: max_err(a, b) for n, a, b in zip(("o", "dq", "dk", "dv"), (o_t, *g_t), (o_s, *g_s))}
    ok = all(x < 0.1 for x in row["max_diff_vs_sdpa"].values())
    row["checked"] = ok
    if not ok:
        print("MISMATCH", s, row["max_diff_vs_sdpa"], flush=True)

    if do_accuracy:
        q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            o_r = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
            g_r = torch.autograd.grad(o_r, (q32, k32, v32), do.float())
        names = ("o", "dq", "dk", "dv")
        row["err_triton"] = {n: max_err(a, b) for n, a, b in zip(names, (o_t, *g_t), (o_r, *g_r))}
        row["err_sdpa_flash"] = {n: max_err(a, b) for n, a, b in zip(names, (o_s, *g_s), (o_r, *g_r))}
        row["accuracy_ok"] = all(row["err_triton"][n] <= 2 * row["err_sdpa_flash"][n] + 1e-4 for n in names)
        del q32, k32, v32, o_r, g_r

    def bench(fn):
        return do_bench(fn, warmup=25, rep=150, return_mode="median")

    with torch.no_grad():
        row["fwd_ms_triton"] = bench(lambda: tk.triton_forward(q, k, v, causal))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            row["fwd_ms_sdpa_flash"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    o_t = tk.triton_attention(q, k, v, causal)
    row["bwd_ms_triton"] = bench(lambda: torch.autograd.grad(o_t, (q, k, v), do, retain_graph=True))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o_s = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    row["bwd_ms_sdpa_flash"] = bench(lambda: torch.autograd.grad(o_s, (q, k, v), do, retain_graph=True))
    for impl in ("triton", "sdpa_flash"):
        row[f"fwd_tflops_{impl}"] = round(fwd_flops / row[f"fwd_ms_{impl}"] * 1e-9, 1)
        row[f"bwd_tflops_{impl}"] = round(bwd_flops / row[f"bwd_ms_{impl}"] * 1e-9, 1)
    from flashtut.triton import configs as tc
    cap = torch.cuda.get_device_capability()
    row["autotune_ms"] = {}  # every configuration's median time, from this shape's tuning
    for kernel in ("fwd", "dkdv", "dq"):
        space = tc.search_space(kernel, cap, False, max(16, 1 << (D - 1).bit_length()))
        tuner = tk._TUNED.get((kernel, tc.generation(cap), False, tuple(space)))
        row["autotune_ms"][kernel] = {
            f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}/w{c.num_warps}/s{c.num_stages}":
            round(t[0] if isinstance(t, (list, tuple)) else t, 4)
            for c, t in getattr(tuner, "configs_timings", {}).items()}
    row["fwd_ratio"] = round(row["fwd_tflops_triton"] / row["fwd_tflops_sdpa_flash"], 3)
    row["bwd_ratio"] = round(row["bwd_tflops_triton"] / row["bwd_tflops_sdpa_flash"], 3)
    return row


def naive_fp16(q, k, v, causal):
    """Framework attention without fusion, as the shared anchors time it: q k^T in the input
    dtype, softmax in fp32, the N x N probabilities back in the input dtype, times v."""
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def run_sweep(D=128, dtype="float16", ns=(512, 1024, 2048, 4096, 8192, 16384)):
    """Forward and backward TFLOP/s against N for the chapter's figure: triton, SDPA flash, naive."""
    from triton.testing import do_bench
    from flashtut.triton import attention as tk
    rows = []
    for causal in (False, True):
        for N in ns:
            B, H = 16384 // N, 2048 // D
            g = torch.Generator(device="cuda").manual_seed(N)
            q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=DTYPES[dtype], generator=g) for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_(True)
            fl = 4.0 * B * H * N * N * D / (2 if causal else 1)
            impls = {"triton": lambda: tk.triton_attention(q, k, v, causal),
                     "naive": lambda: naive_fp16(q, k, v, causal)}
            for name in ("triton", "sdpa-flash", "naive"):
                if name == "sdpa-flash":
                    ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
                else:
                    ctx, fn = contextlib.nullcontext(), impls[name]
                with ctx:
                    with torch.no_grad():
                        t_f = do_bench(fn, warmup=10, rep=60, return_mode="median")
                    o = fn()
                    t_b = do_bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
                                   warmup=10, rep=60, return_mode="median")
                rows.append(dict(impl=name, dtype=dtype, D=D, N=N, B=B, H=H, causal=causal,
                                 fwd_ms=t_f, bwd_ms=t_b, fwd_tflops=round(fl / t_f * 1e-9, 1),
                                 bwd_tflops=round(2.5 * fl / t_b * 1e-9, 1)))
                print(f"sweep {name:10s} N={N:5d} causal={int(causal)} fwd {rows[-1]['fwd_tflops']:6.1f} "
                      f"bwd {rows[-1]['bwd_tflops']:6.1f} TFLOP/s", flush=True)
                del o
            del q, k, v, do
            torch.cuda.empty_cache()
    return rows


def run_extras():
    """Chapter 07's GPU paths: the exercise checkers with the library's solutions (and one
    wrong attempt each), and the notebook's live speed cell through flashtut.bench."""
    from flashtut import bench
    from flashtut.exercises import ch07
    import flashtut
    out = {}
    out["check_preprocess(solution)"] = str(ch07.check_preprocess(ch07.solution_preprocess))
    out["check_window_attention(solution)"] = str(ch07.check_window_attention(ch07.solution_window_attention))
    out["check_window_attention(causal only)"] = str(ch07.check_window_attention(
        lambda q, k, v, w: flashtut.triton_attention(q, k, v, causal=True)))
    for k, v in out.items():
        print(k, "->", v.splitlines()[0], flush=True)
    cases = bench.protocol_cases(8192, [1024, 2048, 4096], [64], ["float16"], causal=(False, True), heads=16)
    live = bench.run_speed(["naive", "sdpa-flash", "triton"], cases)
    print(bench.report.speed_table(live))
    out["live_rows"] = live
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--precompile", type=int, default=0, help="worker processes that fill the compile cache first")
    ap.add_argument("--ns", default="4096,16384")
    ap.add_argument("--ds", default="64,128")
    ap.add_argument("--extras", action="store_true", help="chapter 07's exercise checkers and live-speed cell on the GPU")
    ap.add_argument("--sweep", action="store_true", help="the N sweep (D=128 fp16) of triton, SDPA flash and naive")
    args = ap.parse_args()
    ns = tuple(int(x) for x in args.ns.split(","))
    ds = tuple(int(x) for x in args.ds.split(","))
    t0 = time.time()
    if args.precompile:
        precompile(args.precompile, ds)
        print(f"precompile done in {time.time() - t0:.0f}s", flush=True)
    import triton
    from flashtut.triton import attention as tk
    meta = dict(device=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()),
                torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                command=" ".join([os.path.basename(sys.executable)] + sys.argv))
    if args.extras:
        with open(args.out, "w") as f:
            json.dump(dict(meta, extras=run_extras()), f, indent=1, default=str)
        print(f"total {time.time() - t0:.0f}s")
        return
    if args.sweep:
        rows = run_sweep()
        with open(args.out, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
        print(f"total {time.time() - t0:.0f}s")
        return
    rows = []
    for s in shapes(ns, ds):
        r = run_shape(s, do_accuracy=(s["N"] == 4096))
        rows.append(r)
        print(f"{s['dtype']:8s} D={s['D']:3d} N={s['N']:5d} causal={int(s['causal'])} "
              f"fwd {r['fwd_tflops_triton']:6.1f} vs {r['fwd_tflops_sdpa_flash']:6.1f} ({r['fwd_ratio']:.2f}x)  "
              f"bwd {r['bwd_tflops_triton']:6.1f} vs {r['bwd_tflops_sdpa_flash']:6.1f} ({r['bwd_ratio']:.2f}x)"
              + (f"  acc_ok={r['accuracy_ok']}" if "accuracy_ok" in r else ""), flush=True)
        with open(args.out, "w") as f:  # rewritten after every shape: a timeout keeps what was done
            json.dump(dict(meta, rows=rows, configs=tk.best_configs()), f, indent=1)
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()

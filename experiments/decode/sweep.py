"""Launch variants of the decode kernel, timed in one process against the shipped launch.

Each variant is a :class:`flashtut.triton.decode.DecodeTuning` (keys per tile, warps, pipeline
stages, the merge fused into the split kernel, the block table read one tile ahead) and a split
count rule (:func:`flashtut.decode.decode_num_splits` with other ``programs_per_sm`` or
``min_keys_per_split``, or one wave of programs: :func:`one_wave`). Every case is measured by the benchmark's own harness
(:func:`flashtut.bench.decode.measure_case`: the same problem sets, the yardstick before and after
timing, medians of CUDA-graph replays), with the copy bandwidth measured first in this process. On a
GPU, worker processes compile every launch first (``--precompile``), so the budget goes to timing.

    python experiments/decode/sweep.py --out decode_sweep.json        # on a GPU, at most about 160 s
    python experiments/decode/sweep.py --variants shipped,fused+ahead --cases 1:16384

The table: one line per variant, batch, cache length and dtype: the contiguous cache's time and
bandwidth fraction, the paged read's cost against it (page 64 / 16), and the speed against the
shipped launch on the same case. It stops starting cases after ``--budget-s`` seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from flashtut.bench.cli import _Saver
from flashtut.bench.decode import measure_case
from flashtut.bench.provenance import collect
from flashtut.bench.roofline import copy_bandwidth
from flashtut.decode import decode_num_splits
from flashtut.triton.decode import MAX_SPLITS, SHIPPED, DecodeTuning, num_sms, triton_decode_attention

FA = dict(fused_merge=True, page_ahead=True)


def one_wave(per_sm: int):
    """A split rule: as many programs as ``per_sm`` per SM hold at once, never more (a program
    past one wave waits for a whole program to finish), with splits of 256 keys at least."""
    def rule(B, Hkv, N, sms):
        return max(1, min(per_sm * sms // (B * Hkv), N // 256, MAX_SPLITS))
    return rule


#: name -> (tuning, split rule: keyword arguments of decode_num_splits, or a function of
#: (batch, KV heads, length, SMs))
VARIANTS = {
    "shipped": (SHIPPED, {}),
    "ahead": (DecodeTuning(page_ahead=True), {}),
    "fused": (DecodeTuning(fused_merge=True), {}),
    "fused+ahead": (DecodeTuning(**FA), {}),
    "fa/bn128": (DecodeTuning(block_n=128, **FA), {}),
    "fa/stages2": (DecodeTuning(num_stages=2, **FA), {}),
    "fa/stages4": (DecodeTuning(num_stages=4, **FA), {}),
    "fa/warps8": (DecodeTuning(num_warps=8, **FA), {}),
    "fa/2 per SM": (DecodeTuning(**FA), dict(programs_per_sm=2)),
    "fa/1 per SM": (DecodeTuning(**FA), dict(programs_per_sm=1)),
    "fa/one wave of 3": (DecodeTuning(**FA), one_wave(3)),
    "fa/min 128 keys": (DecodeTuning(**FA), dict(min_keys_per_split=128)),
}
#: (batch, cache length), the most telling first (each in every dtype): a budget that runs out drops
#: the last ones
CASES = ((1, 16384), (1, 1024), (1, 4096), (32, 4096), (32, 16384), (1, 65536))
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def impl_name(variant: str) -> str:
    return "triton-decode" if variant == "shipped" else f"triton-decode/{variant}"


def split_count(rule, B, Hkv, N, sms) -> int:
    if callable(rule):
        return rule(B, Hkv, N, sms)
    return decode_num_splits(B, Hkv, N, sms, max_splits=MAX_SPLITS, **rule)


def launches(names, cases, dnames, pages, kv_heads, sms) -> list[tuple]:
    """Every distinct compiled launch the sweep makes: (variant, split count, dtype, page size or
    None). The split count picks the merge's width, a compile-time constant."""
    jobs = set()
    for B, N in cases:
        for v in names:
            tuning, rule = VARIANTS[v]
            splits = split_count(rule, B, kv_heads, N, sms)
            jobs.update((v, splits, d, ps) for d in dnames for ps in [None, *pages])
    return sorted(jobs, key=str)


def warm(jobs, H, Hkv, D, device) -> None:
    """Run each launch of ``jobs`` once on one sequence of 1024 positions, so that its kernels land
    in Triton's cache on disk: the strides the compiler specialises on (multiples of 16) are those
    of the measured cases."""
    n = 1024
    for v, splits, dname, page in jobs:
        dtype = DTYPES[dname]
        q = torch.randn(1, H, 1, D, device=device, dtype=dtype)
        seqlens = torch.full((1,), n, dtype=torch.int32, device=device)
        if page is None:
            k = torch.randn(1, Hkv, n, D, device=device, dtype=dtype)
            table = None
        else:
            k = torch.randn(n // page, Hkv, page, D, device=device, dtype=dtype)
            table = torch.arange(n // page, dtype=torch.int32, device=device)[None]
        triton_decode_attention(q, k, k, seqlens, table, num_splits=splits, tuning=VARIANTS[v][0])


def precompile(jobs, workers: int, args) -> None:
    """:func:`warm` over ``workers`` processes at once (compiling is single-threaded per process)."""
    chunks = [jobs[i::workers] for i in range(workers) if jobs[i::workers]]
    procs = [subprocess.Popen([sys.executable, __file__, "--warm-jobs", json.dumps(c), "--heads", str(args.heads),
                               "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in chunks]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            print(f"precompile worker failed (the sweep compiles as it goes): {err.strip()[-500:]}", file=sys.stderr)


def table(rows) -> str:
    """The sweep's rows as a Markdown table (see the module's docstring)."""
    copy = [r["gb_per_s"] for r in rows if r.get("kind") == "roofline" and r.get("gb_per_s")]
    peak = max(copy) if copy else None
    got = {}
    for r in rows:
        if r.get("kind") == "decode" and r.get("variant"):
            got[(r["variant"], r["dtype"], r["B"], r["N"], r.get("page_size"))] = r
    pages = sorted({k[4] for k in got if k[4] is not None}, reverse=True)
    lines = [f"| variant | batch | cache length | dtype | splits | us | bandwidth fraction "
             f"| paged cost ({' / '.join(map(str, pages))}) | x shipped |", "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({k[:4] for k in got}, key=lambda k: (k[1], k[2], k[3], list(VARIANTS).index(k[0])
                                                        if k[0] in VARIANTS else 99))
    for v, dtype, B, N in keys:
        c = got.get((v, dtype, B, N, None))
        ok = c is not None and c.get("status") == "ok"
        us = f"{1e3 * c['ms']:.1f}" if ok else (c or {}).get("status", "-")
        frac = f"{c['gb_per_s'] / peak:.2f}" if ok and peak else ""
        costs = []
        for ps in pages:
            p = got.get((v, dtype, B, N, ps))
            costs.append(f"{100 * (p['ms'] / c['ms'] - 1):+.1f}%" if ok and p and p.get("status") == "ok"
                         else (p or {}).get("status", "-"))
        base = got.get(("shipped", dtype, B, N, None))
        speed = f"{base['ms'] / c['ms']:.2f}" if ok and base and base.get("status") == "ok" else ""
        lines.append(f"| {v} | {B} | {N} | {dtype} | {(c or {}).get('num_splits', '')} | {us} | {frac} "
                     f"| {' / '.join(costs)} | {speed} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="results JSON (kind decode), rewritten after every row")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names (default: all)")
    ap.add_argument("--cases", default=",".join(f"{b}:{n}" for b, n in CASES), help="batch:length,...")
    ap.add_argument("--dtypes", default=None, help="default float16,bfloat16 (float32 on the CPU)")
    ap.add_argument("--page-sizes", default="64,16")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--budget-s", type=float, default=150.0, help="start no case after this many seconds")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precompile", type=int, default=8, help="processes that compile every launch first (GPU)")
    ap.add_argument("--warm-jobs", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.warm_jobs:
        warm([tuple(j) for j in json.loads(args.warm_jobs)], args.heads, args.kv_heads, args.head_dim, device)
        return 0
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("on a CPU the kernel runs through Triton's interpreter: set TRITON_INTERPRET=1")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        ap.error(f"argument --variants: unknown {unknown}; accepted: {', '.join(VARIANTS)}")
    try:
        cases = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")]
        pages = [int(p) for p in args.page_sizes.split(",")]
        assert all(len(c) == 2 and min(c) > 0 for c in cases) and pages and min(pages) > 0
        assert all(max(pages) % p == 0 for p in pages)
    except (ValueError, AssertionError):
        ap.error("argument --cases: batch:length pairs such as 1:16384,32:4096; --page-sizes: positive sizes "
                 "that each divide the largest")
    dnames = (args.dtypes or ("float16,bfloat16" if device.type == "cuda" else "float32")).split(",")
    if any(d not in DTYPES for d in dnames):
        ap.error(f"argument --dtypes: accepted {', '.join(DTYPES)}, got {args.dtypes}")

    t0 = time.monotonic()
    saver = _Saver(args.out, "decode", collect(device, sys.argv[1:] if argv is None else argv),
                   {"variants": names, "cases": cases, "dtypes": dnames, "page_sizes": pages}, every_s=0.0)
    sms = num_sms(device)
    skipped = []
    if device.type == "cuda" and args.precompile > 1:
        jobs = launches(names, cases, dnames, pages, args.kv_heads, sms)
        precompile(jobs, args.precompile, args)
        print(f"{len(jobs)} launches compiled in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    try:
        saver(copy_bandwidth(device))
        for B, N in cases:
            for dname in dnames:
                if time.monotonic() - t0 > args.budget_s:
                    skipped.append(f"{dname} {B}x{N}")
                    continue
                kernels = {}
                for v in names:
                    tuning, rule = VARIANTS[v]
                    splits = split_count(rule, B, args.kv_heads, N, sms)
                    kernels[impl_name(v)] = (tuning, splits)
                for row in measure_case(B, args.heads, args.kv_heads, N, args.head_dim, DTYPES[dname], device,
                                        tuple(pages), sdpa=False, kernels=kernels):
                    row["variant"] = next((v for v in names if impl_name(v) == row["impl"]), None)
                    saver(row)
                print(f"{dname} batch {B} length {N}: done at {time.monotonic() - t0:.0f} s", file=sys.stderr)
    finally:
        saver.flush()
    print(table(saver.rows))
    if skipped:
        print(f"not measured (budget of {args.budget_s:.0f} s spent): {', '.join(skipped)}")
    bad = [r for r in saver.rows if r.get("status") in ("failed", "error")]
    for r in bad:
        print(f"{r['status']}: {r.get('variant')} {r['dtype']} {r['B']}x{r['N']} {r['layout']} {r.get('page_size')}: "
              f"{r.get('error', 'outside the yardstick')}")
    print(f"{len(saver.rows)} rows in {time.monotonic() - t0:.0f} s" + (f", written to {args.out}" if args.out else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""flashtut.flex_attention against PyTorch's FlexAttention, mask by mask, on one CUDA GPU.

``python experiments/flex/bench_flex.py --out DIR/flex.json [--budget-s 150] [--dims 128,64]
[--dtypes float16,bfloat16] [--ns 16384,4096] [--cases causal,window,...]``

The work is the performance protocol's: 16k tokens in total (batch = 16384 / N), hidden 2048
(D = 64 with 32 heads, D = 128 with 16). Cases: causal; sliding window w = 1024; document mask
(random document lengths, about N / 1024 cut points drawn uniformly); prefix-LM (prefix N / 4);
ALiBi and soft-capping (cap 50), each on top of the causal mask. PyTorch's FlexAttention runs
compiled (``torch.compile(flex_attention)``, as it requires) with its own block mask (impl ``flex``; ours is ``triton-flex``) of the same
``mask_mod``; ours with ours (both 128 x 128 blocks). Timing: ``triton.testing.do_bench``
(median), the forward alone (on inputs that require grad) and the backward alone (``o.backward(do, retain_graph=True)``),
after a correctness check of both against a float32 dense reference on the first batch element
and two heads. Rates are TFLOP/s of the visible work: 4 B H D per visible (query, key) pair
forward, 2.5 times that backward.

Where a fixed kernel computes the same (causal, window), ``flashtut.triton_attention`` is timed too
(impl ``triton``): the flex kernels should be within 5% of it.

Also the time to build the block mask at N = 16384, ours and PyTorch's, per mask (median of 5).

Cases run in the order of the grid (D, dtype, N, case) until ``--budget-s`` seconds have passed;
PyTorch's compilation dominates the time, so the budget decides how much of the grid a run
covers. Rows are written to ``--out`` as they are measured (bench results format, kind
``speed``; build times kind ``host``) and a summary line per case is printed.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import flashtut
from flashtut.bench.provenance import collect
from flashtut.bench.results import save_results
from flashtut.bench.flex_cases import CASES, flex_case
from flashtut.block_mask import evaluate_mask

def bench_ms(fn):
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))


def visible_pairs(mask_mod, N):
    total = 0
    for r0 in range(0, N, 2048):         # in bands: the full N x N mask at 16k is 256 MiB of bools
        rows = min(2048, N - r0)
        keep = evaluate_mask(mask_mod, 1, 1, rows, N, "cuda", q_start=r0)
        total += int(keep.sum())
    return total


def errors(fn, q, k, v, do, score_mod, bm):
    """Max errors of o, dq, dk, dv against the float32 dense reference, on batch 0 and 2 heads
    (computed at the full shape, so that the compiled function sees the shape it is timed on;
    heads are independent, so the slice is exact)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    g = torch.autograd.grad(o, leaves, do)
    ref = [t[:1, :2].float().requires_grad_() for t in (q, k, v)]
    o32 = flashtut.flex_reference(*ref, score_mod=score_mod, block_mask=bm)
    g32 = torch.autograd.grad(o32, ref, do[:1, :2].float())
    return {n: float((a[:1, :2].float() - b).detach().abs().max())
            for n, a, b in zip(("o", "dq", "dk", "dv"), (o, *g), (o32, *g32))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--ns", default="16384,4096")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--build", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_flex: needs a CUDA GPU", file=sys.stderr)
        return 2
    from torch.nn.attention.flex_attention import create_block_mask as torch_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex
    # one compilation per mask and score mod (each is a new code object): past dynamo's default
    # limit of 8 it would fall back to the unfused eager implementation and time that instead
    torch._dynamo.config.recompile_limit = 256
    # the backward is timed by replaying it on one graph (retain_graph), which donated buffers forbid
    torch._functorch.config.donated_buffer = False
    compiled = torch.compile(torch_flex, dynamic=False)
    t0 = time.time()
    rows = []
    prov = collect("cuda", call="experiments/flex/bench_flex.py " + " ".join(argv or sys.argv[1:]))
    config = dict(cases=args.cases, dims=args.dims, dtypes=args.dtypes, ns=args.ns, budget_s=args.budget_s,
                  block_size=128, timer="triton.testing.do_bench(median)")

    def save():
        save_results(args.out, "speed", rows, prov, config)

    dims = [int(x) for x in args.dims.split(",")]
    ns = [int(x) for x in args.ns.split(",")]
    dtypes = [getattr(torch, x) for x in args.dtypes.split(",")]
    cases = args.cases.split(",")
    if args.build:              # block-mask build time at N = 16384, ours and PyTorch's
        N = 16384
        for case in cases:
            mask_mod, _ = flex_case(case, N, 16, "cuda")
            for entry, build in (("flashtut.create_block_mask", flashtut.create_block_mask),
                                 ("torch create_block_mask", torch_block_mask)):
                build(mask_mod, None, None, N, N, device="cuda")
                times = []
                for _ in range(5):
                    torch.cuda.synchronize()
                    s = time.perf_counter()
                    build(mask_mod, None, None, N, N, device="cuda")
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - s)
                ms = sorted(times)[2] * 1e3
                rows.append(dict(kind="host", entry=f"{entry}({case}) N={N}", us_per_call=ms * 1e3, N=N,
                                 mask=case, impl=entry, ms=ms))
                print(f"build {case:10s} {entry:28s} {ms:8.2f} ms", flush=True)
        save()

    for D in dims:
        H = 2048 // D
        for dtype in dtypes:
            for N in ns:
                B = max(1, 16384 // N)
                for case in cases:
                    if time.time() - t0 > args.budget_s:
                        print(f"budget of {args.budget_s:.0f} s spent: stopped before D={D} {dtype} N={N} {case}")
                        save()
                        return 0
                    _one(rows, compiled, torch_block_mask, case, B, H, N, D, dtype)
                    save()
    save()
    print(f"done in {time.time() - t0:.0f} s")
    return 0


def _one(rows, compiled, torch_block_mask, case, B, H, N, D, dtype):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(4))
    mask_mod, score_mod = flex_case(case, N, H, "cuda")
    bm = flashtut.create_block_mask(mask_mod, None, None, N, N, device="cuda")
    tbm = torch_block_mask(mask_mod, None, None, N, N, device="cuda")
    pairs = visible_pairs(mask_mod, N)
    fwd_flops = 4.0 * B * H * D * pairs
    impls = {"triton-flex": lambda *t: flashtut.flex_attention(*t, score_mod=score_mod, block_mask=bm),
             "flex": lambda *t: compiled(*t, score_mod=score_mod, block_mask=tbm)}
    # where a fixed kernel computes the same thing, it is the other yardstick (target: flex within 5%)
    fixed = {"causal": dict(causal=True), "window": dict(causal=True, window=1024)}.get(case)
    if fixed is not None:
        impls["triton"] = lambda *t: flashtut.triton_attention(*t, **fixed)
    base = dict(kind="speed", B=B, H=H, Hkv=H, N=N, Nq=N, Nk=N, D=D, dtype=str(dtype).replace("torch.", ""),
                causal=case in ("causal", "alibi", "softcap"), mask=case, score_mod=score_mod.__name__
                if score_mod else None, visible_fraction=pairs / N / N, timer="triton.testing.do_bench(median)",
                seed=0, layout="dense")
    got = {}
    for impl, fn in impls.items():
        try:
            err = errors(fn, q, k, v, do, score_mod, bm)
            # the forward is timed on leaves that require grad, as in training (and so that the
            # compiled function runs the graph it compiled for the error check, not a second one)
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            ms_f = bench_ms(lambda: fn(*leaves))
            o = fn(*leaves)
            ms_b = bench_ms(lambda: o.backward(do, retain_graph=True))
            for mode, ms, fl in (("fwd", ms_f, fwd_flops), ("bwd", ms_b, 2.5 * fwd_flops)):
                rows.append(dict(base, impl=impl, mode=mode, ms=ms, flops=fl, tflops=fl / ms / 1e9, err=err,
                                 status="ok"))
            got[impl] = (ms_f, ms_b, err)
        except Exception as exc:          # noqa: BLE001 - one failing case must not lose the run
            for mode in ("fwd", "bwd"):
                rows.append(dict(base, impl=impl, mode=mode, status="error", reason=f"{type(exc).__name__}: {exc}"[:300]))
            print(f"{case} {impl} D={D} {dtype} N={N}: {type(exc).__name__}: {exc}", flush=True)
    if "triton-flex" in got and "flex" in got:
        (fo, bo, eo), (ft, bt, et) = got["triton-flex"], got["flex"]
        worst = max(eo[n] / max(et[n], 1e-6) for n in eo)
        fixed_line = ""
        if "triton" in got:
            fixed_line = f" | fixed kernel fwd x{got['triton'][0] / fo:4.2f} bwd x{got['triton'][1] / bo:4.2f}"
        print(f"{case:10s} D={D} {str(dtype)[6:]:8s} N={N:5d}: fwd {fo:7.3f} ms ({fwd_flops / fo / 1e9:5.0f} TF) "
              f"x{ft / fo:4.2f} vs torch | bwd {bo:7.3f} ms x{bt / bo:4.2f} | err ours/torch max {worst:4.2f}"
              + fixed_line, flush=True)


if __name__ == "__main__":
    sys.exit(main())

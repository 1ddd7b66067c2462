"""The CUDA forward ladder's steps 3 to 7 on one GPU, in one process: correctness on odd
shapes, first-call (NVRTC) compile time, forward TFLOP/s against SDPA flash at the protocol shapes,
and the backward's dQ strategies against SDPA flash. Run by experiments/cuda_ladder/gpu_ladder.sh; writes one JSON
(``book/data/cuda_ladder_h200.json``).

    python experiments/cuda_ladder/cuda_ladder.py --out ladder.json [--bwd-only] [--quick]

Protocol: 16384 tokens (B = 16384 / N), H * D = 2048, N = 4096 and 16384, fp16 and bf16, causal and
not; forward FLOPs 4 B H N^2 D (halved when causal), backward 2.5x; median of
triton.testing.do_bench; every output checked before it is timed. Correctness: the FlashAttention
criterion, max |out - fp64 reference| <= 2 x PyTorch's own error in the input dtype (+1e-3).
``--ncu-launch``: one launch of SDPA flash and of each step at N = 4096, D = 128, fp16, for ncu.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtut.costs.flops import attention_flops
from flashtut.cuda import attention as ca
from flashtut.cuda import compile as cc
from flashtut.cuda import configs as cfgs
from flashtut.bench.accuracy import yardstick
from flashtut.bench.report import BWD_GRID_COLUMNS  # noqa: F401  (the columns of the book's table)
from flashtut.bench.provenance import collect
from flashtut.bench.results import save_results
from flashtut.bench.timing import time_fn


def time_ms(fn) -> float:
    return time_fn(fn, "cuda")


def run(q, k, v, causal, scale, variant, diag_offset=0):
    """One forward of ladder step ``variant`` on prepared inputs: ``(o, lse)``."""
    return ca._forward(q, k, v, causal, scale, variant, diag_offset=diag_offset)

STEPS = ("v3", "v4", "v5", "v6", "v7")
NEW = ("v4", "v5", "v6", "v7")

def sdpa_flash(q, k, v, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def reference(q, k, v, causal_offset, kv_group=1):
    """float64 attention with grouped K/V heads and the mask j <= i + offset (None: no mask);
    rows that see no key give 0."""
    q, k, v = q.double(), k.double(), v.double()
    if kv_group > 1:
        k, v = k.repeat_interleave(kv_group, 1), v.repeat_interleave(kv_group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal_offset is not None:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(j > i + causal_offset, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


def torch_dtype_error(q, k, v, causal, kv_group, ref):
    if kv_group > 1:
        k, v = k.repeat_interleave(kv_group, 1), v.repeat_interleave(kv_group, 1)
    with sdpa_kernel([SDPBackend.MATH]):
        # the math backend in the input dtype: products and probabilities rounded as PyTorch does
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return float((out.double() - ref).abs().max())


def check(log):
    """Every new step on odd shapes: Nq != Nk both ways, lengths no tile divides, causal top-left,
    plus grouped K/V heads and bottom-right alignment (rows with no key: o = 0, lse = -inf)."""
    rows = []
    dtypes = (torch.float16, torch.bfloat16)
    shapes = [(1, 2, 77, 131, 1, 0), (2, 3, 257, 383, 1, 0), (1, 2, 130, 67, 1, 0), (1, 4, 1, 1, 1, 0),
              (2, 4, 200, 333, 2, 0), (1, 4, 300, 150, 4, 0)]
    for variant in NEW:
        for D in (64, 128):
            for dtype in dtypes:
                for si, (B, H, Nq, Nk, grp, _) in enumerate(shapes):
                    g = torch.Generator(device="cuda").manual_seed(100 * si + D)
                    q = torch.randn(B, H, Nq, D, device="cuda", dtype=dtype, generator=g)
                    k, v = (torch.randn(B, H // grp, Nk, D, device="cuda", dtype=dtype, generator=g)
                            for _ in range(2))
                    for mask in ("none", "top-left", "bottom-right"):
                        if mask == "bottom-right" and Nq <= Nk and grp == 1 and si != 2:
                            continue
                        off = {"none": None, "top-left": 0, "bottom-right": Nk - Nq}[mask]
                        ref = reference(q, k, v, off, grp)
                        o, lse = run(q, k, v, off is not None, 1 / math.sqrt(D), variant,
                                     diag_offset=off or 0)
                        err = float((o.double() - ref).abs().max())
                        if off in (None, 0):
                            terr = torch_dtype_error(q, k, v, off == 0, grp, ref)
                        else:  # SDPA has no bottom-right flag: its top-left error bounds the same work
                            terr = torch_dtype_error(q, k, v, True, grp, reference(q, k, v, 0, grp))
                        ok = math.isfinite(err) and err <= 2 * terr + 1e-3
                        empty = None
                        if off is not None and off < 0:  # rows i < -off see no key
                            n_empty = min(Nq, -off)
                            empty = bool((o[:, :, :n_empty] == 0).all()) and bool(
                                torch.isneginf(lse[:, :, :n_empty]).all())
                            ok = ok and empty
                        row = dict(check=variant, D=D, dtype=str(dtype)[6:], shape=[B, H, Nq, Nk], kv_group=grp,
                                   mask=mask, err=err, torch_err=terr, empty_rows_ok=empty, ok=ok)
                        rows.append(row)
                        if not ok:
                            log(row)
    bad = [r for r in rows if not r["ok"]]
    print(f"correctness: {len(rows) - len(bad)}/{len(rows)} cases pass the FA criterion", flush=True)
    return rows


def first_calls(log):
    """Seconds of the first call of each step at fp16 (NVRTC compile + module load + launch: CuPy's
    on-disk cache is empty on a fresh machine), and of the first default backward."""
    rows = []
    for D in (128, 64):
        for variant in STEPS:
            q = torch.randn(1, 1, 64, D, device="cuda", dtype=torch.float16)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(q, q, q, False, 0.125, variant)
            torch.cuda.synchronize()
            rows.append(dict(first_call=variant, dtype="float16", D=D, seconds=time.perf_counter() - t0))
    log({"first_call_seconds": {f"{r['first_call']}/{r['dtype']}/{r['D']}": round(r["seconds"], 2) for r in rows}})
    return rows


def _warm_one(build):
    from flashtut.cuda import compile as cc_
    t0 = time.perf_counter()
    cc_.get_function(build[0], build[1], dict(build[2]))
    return time.perf_counter() - t0


def warm_cache():
    """Compile every other build in parallel processes (CuPy's on-disk cache then serves this one)."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp

    arch = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    builds = set()
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            for s in STEPS:
                c = cfgs.launch_config(s, dtype, D, arch, cc.max_smem_per_block())
                builds.add((c.source, c.kernel, c.defines))
            if D == 64:   # the fast forward at D = 256 (step 3 only), for the tests
                c = cfgs.launch_config("v3", dtype, 256, arch, cc.max_smem_per_block())
                builds.add((c.source, c.kernel, c.defines))
            for cfg in cfgs.experiment_configs(D).values():
                for src, kern, defs in cfgs.kernel_builds(cfg, dtype).values():
                    builds.add((src, kern, tuple(sorted(defs.items()))))
    t0 = time.time()
    with ProcessPoolExecutor(12, mp_context=mp.get_context("spawn")) as ex:
        secs = list(ex.map(_warm_one, sorted(builds)))
    print(f"warmed {len(builds)} builds in {time.time() - t0:.1f} s (per build {min(secs):.1f} to "
          f"{max(secs):.1f} s)", flush=True)


def bench(log, Ns, Ds, bwd_configs=True, fwd=True):
    rows = []
    for D in Ds:
        H = 2048 // D
        for N in Ns:
            B = max(1, 16384 // N)
            for dtype in (torch.float16, torch.bfloat16):
                g = torch.Generator(device="cuda").manual_seed(N + D)
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
                for causal in (False, True):
                    flops = attention_flops(B, H, N, N, D, causal)
                    ref = sdpa_flash(q, k, v, causal).float()
                    base = dict(D=D, N=N, B=B, H=H, dtype=str(dtype)[6:], causal=causal)
                    impls = {"sdpa-flash": lambda: sdpa_flash(q, k, v, causal)}
                    for s in STEPS:
                        impls[f"cuda-{s}"] = (lambda s: lambda: run(q, k, v, causal, 1 / math.sqrt(D), s)[0])(s)
                    for name, fn in (impls if fwd else {}).items():
                        row = dict(impl=name, **base)
                        try:
                            row["fwd_err_vs_flash"] = float((fn().float() - ref).abs().max())
                            if not row["fwd_err_vs_flash"] < 0.05:
                                raise RuntimeError(f"wrong output, {row['fwd_err_vs_flash']:.3g} from SDPA flash")
                            ms = time_ms(fn)
                            row["fwd_ms"], row["fwd_tflops"] = ms, round(flops / ms / 1e9, 2)
                        except Exception as exc:
                            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                        rows.append(row)
                    if bwd_configs:
                        rows += bench_bwd(q, k, v, causal, flops, base)
                    log({r["impl"]: r.get("fwd_tflops", r.get("bwd_tflops", r.get("error")))
                         for r in rows if all(r.get(x) == base[x] for x in base)} | base)
                del q, k, v
                torch.cuda.empty_cache()
    return rows


def bench_bwd(q, k, v, causal, flops, base):
    """SDPA flash's backward and ours with each dQ strategy of backward.experiment_configs."""
    rows = []
    do = torch.randn_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    o_flash = sdpa_flash(qg, kg, vg, causal)
    o_flash.backward(do, retain_graph=True)
    want = (qg.grad.float(), kg.grad.float(), vg.grad.float())

    def flash_bwd():
        qg.grad = kg.grad = vg.grad = None
        o_flash.backward(do, retain_graph=True)

    ms = time_ms(flash_bwd)
    rows.append(dict(impl="sdpa-flash-bwd", **base, bwd_ms=ms, bwd_tflops=round(2.5 * flops / ms / 1e9, 2)))
    o, lse = run(q, k, v, causal, scale, "v3")
    for name, cfg in cfgs.experiment_configs(q.shape[-1]).items():
        row = dict(impl=f"cuda-bwd-{name}", **base)
        try:
            if max(cfg.dkdv_smem, cfg.dq_smem) > cc.max_smem_per_block():
                raise RuntimeError("does not fit shared memory")
            got = ca.cuda_backward(q, k, v, o, lse, do, causal, scale, config=cfg)
            row["grad_err_vs_flash"] = max(float((a.float() - b).abs().max()) for a, b in zip(got, want))
            if not row["grad_err_vs_flash"] < 0.05:
                raise RuntimeError(f"wrong gradients, {row['grad_err_vs_flash']:.3g} from SDPA flash")
            ms = time_ms(lambda: ca.cuda_backward(q, k, v, o, lse, do, causal, scale, config=cfg))
            row["bwd_ms"], row["bwd_tflops"] = ms, round(2.5 * flops / ms / 1e9, 2)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    return rows


def check_bwd(log):
    """Every dQ strategy on odd shapes, judged by the book's one yardstick
    (:func:`flashtut.bench.accuracy.yardstick`: at most twice PyTorch's own error in the input
    dtype, against a float32 reference)."""
    rows = []
    for D in (64, 128):
        for dtype in (torch.float16, torch.bfloat16):
            for si, (B, H, Nq, Nk) in enumerate([(2, 3, 257, 383), (1, 2, 130, 67)]):
                for causal in (False, True):
                    g = torch.Generator(device="cuda").manual_seed(7 + si + D)
                    q, k, v, = (torch.randn(B, H, n, D, device="cuda", dtype=dtype, generator=g)
                                for n in (Nq, Nk, Nk))
                    do = torch.randn(B, H, Nq, D, device="cuda", dtype=dtype, generator=g)
                    scale = D ** -0.5
                    o, lse = run(q, k, v, causal, scale, "v3")
                    for name, cfg in cfgs.experiment_configs(D).items():
                        if max(cfg.dkdv_smem, cfg.dq_smem) > cc.max_smem_per_block():
                            continue
                        got = ca.cuda_backward(q, k, v, o, lse, do, causal, scale, config=cfg)
                        ys = yardstick(q, k, v, o, got, do, causal, scale)
                        grads = ("dq", "dk", "dv")
                        row = dict(check=f"bwd-{name}", D=D, dtype=str(dtype)[6:], shape=[B, H, Nq, Nk],
                                   causal=causal, err=[ys.err[n] for n in grads],
                                   torch_err=[ys.lowp_err[n] for n in grads], ok=ys.passed)
                        rows.append(row)
                        if not ys.passed:
                            log(row)
    bad = [r for r in rows if not r["ok"]]
    print(f"backward correctness: {len(rows) - len(bad)}/{len(rows)} cases pass the FA criterion", flush=True)
    return rows


def ncu_launches():
    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    sdpa_flash(q, k, v, False)
    for s in STEPS:
        run(q, k, v, False, 128 ** -0.5, s)
    torch.cuda.synchronize()


def loader_ab(log, before_path):
    """Step 3 with its tile loader before and after the straight-line rewrite (ft_swizzle.cuh), in
    one process: the file as it was is read from ``before_path`` and built with the same defines."""
    before = open(before_path).read()
    arch = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    rows = []
    for D in (128, 64):
        H, dtype = 2048 // D, torch.float16
        cfg = cfgs.launch_config("v3", dtype, D, arch, cc.max_smem_per_block())
        fn = cc.get_function(before, cfg.kernel, cfg.define_dict)
        cc.set_max_dynamic_smem(fn, cfg.dynamic_smem)
        for N in (4096, 16384):
            B = 16384 // N
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
            for causal in (False, True):
                flops = attention_flops(B, H, N, N, D, causal)

                def old():
                    o = torch.empty_like(q)
                    lse = torch.empty((B, H, N), device="cuda", dtype=torch.float32)
                    cc.launch(fn, (math.ceil(N / cfg.block_m), B * H, 1), (cfg.threads, 1, 1),
                              (q, k, v, o, lse, N, N, D ** -0.5 * 1.4426950408889634, int(causal)), cfg.dynamic_smem)
                    return o
                new = lambda: run(q, k, v, causal, D ** -0.5, "v3")[0]
                assert float((old().float() - new().float()).abs().max()) == 0.0, "loaders disagree"
                for name, f in (("cuda-v3-loader-before", old), ("cuda-v3", new)):
                    ms = time_ms(f)
                    rows.append(dict(impl=name, D=D, N=N, B=B, H=H, dtype="float16", causal=causal, fwd_ms=ms,
                                     fwd_tflops=round(flops / ms / 1e9, 2)))
                log(rows[-2:])
    return rows


def ncu_bwd_launches():
    """One backward with each configuration of ``experiment_configs`` that fits this GPU, in their
    order (the backward ladder's rungs), at N = 4096, D = 128 and then 64."""
    for D in (128, 64):
        q, k, v, do = (torch.randn(4, 2048 // D, 4096, D, device="cuda", dtype=torch.float16)
                       for _ in range(4))
        o, lse = run(q, k, v, False, D ** -0.5, "v3")
        for cfg in cfgs.experiment_configs(D).values():
            if max(cfg.dkdv_smem, cfg.dq_smem) <= cc.max_smem_per_block():
                ca.cuda_backward(q, k, v, o, lse, do, False, D ** -0.5, config=cfg)
    torch.cuda.synchronize()


def sanitizer_launches():
    """One small launch of each new step: odd lengths, causal both alignments, grouped heads."""
    for D in (64, 128):
        q = torch.randn(1, 4, 77, D, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, 2, 131, D, device="cuda", dtype=torch.float16) for _ in range(2))
        for s in NEW:
            for causal, off in ((False, 0), (True, 0), (True, 131 - 77), (True, -20)):
                run(q, k, v, causal, D ** -0.5, s, diag_offset=off)
        k, v = k[:, :1].repeat(1, 4, 1, 1).contiguous(), v[:, :1].repeat(1, 4, 1, 1).contiguous()
        o, lse = run(q, k, v, True, D ** -0.5, "v3")
        for cfg in cfgs.experiment_configs(D).values():
            if max(cfg.dkdv_smem, cfg.dq_smem) <= cc.max_smem_per_block():
                ca.cuda_backward(q, k, v, o, lse, torch.randn_like(q), True, D ** -0.5, config=cfg)
    torch.cuda.synchronize()
    print("sanitizer launches done")


def schema_rows(rows):
    """This module's rows -> (speed rows of the one results format, first-call seconds by
    "step/dtype/D", check summaries per (check, D, dtype))."""
    speed, first, summ = [], {}, {}
    for r in rows:
        if "first_call" in r:
            first[f"{r['first_call']}/{r['dtype']}/{r['D']}"] = round(r["seconds"], 3)
        elif "check" in r:
            key = (r["check"], r["D"], r["dtype"])
            c = summ.setdefault(key, dict(check=r["check"], D=r["D"], dtype=r["dtype"], cases=0, passed=0,
                                          worst_err_over_torch_err=0.0, failed=[]))
            errs = r["err"] if isinstance(r["err"], list) else [r["err"]]
            terrs = r["torch_err"] if isinstance(r["torch_err"], list) else [r["torch_err"]]
            c["cases"] += 1
            c["passed"] += bool(r["ok"])
            c["worst_err_over_torch_err"] = round(max([c["worst_err_over_torch_err"]] +
                                                      [e / max(t, 1e-12) for e, t in zip(errs, terrs)]), 3)
            if not r["ok"]:
                c["failed"].append({k: r.get(k) for k in ("shape", "causal", "mask", "err", "torch_err")})
        else:
            mode = "bwd" if "bwd" in r["impl"] else "fwd"
            row = dict(kind="speed", impl=r["impl"].replace("-bwd", "") if r["impl"] == "sdpa-flash-bwd" else r["impl"],
                       mode=mode, dtype=r["dtype"], B=r["B"], H=r["H"], N=r["N"], Nq=r["N"], Nk=r["N"], D=r["D"],
                       causal=r["causal"], ms=r.get(f"{mode}_ms"), tflops=r.get(f"{mode}_tflops"),
                       status="error" if "error" in r else "ok", reason=r.get("error"),
                       err_vs_sdpa_flash=r.get("fwd_err_vs_flash", r.get("grad_err_vs_flash")))
            if "config" in r:
                row["config"] = r["config"]
            speed.append(row)
    return speed, first, list(summ.values())


def legacy_row(r):
    """A speed row back in this module's table layout (impl, fwd_tflops or bwd_tflops)."""
    impl = "sdpa-flash-bwd" if (r["impl"] == "sdpa-flash" and r["mode"] == "bwd") else r["impl"]
    return dict(impl=impl, D=r["D"], N=r["N"], dtype=r["dtype"], causal=r["causal"],
                **({f"{r['mode']}_tflops": r["tflops"]} if r.get("tflops") is not None else {}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="N = 4096 only")
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--ncu-launch", action="store_true")
    ap.add_argument("--sanitizer-launch", action="store_true")
    ap.add_argument("--ncu-bwd-launch", action="store_true")
    ap.add_argument("--loader-ab", metavar="BEFORE.cu", help="also time step 3 with the loader of BEFORE.cu")
    ap.add_argument("--bwd-only", action="store_true", help="backward checks and timings only")
    ap.add_argument("--warm-only", action="store_true", help="compile every build into CuPy's cache")
    a = ap.parse_args()
    if a.warm_only:
        return warm_cache()
    if a.ncu_launch:
        return ncu_launches()
    if a.ncu_bwd_launch:
        return ncu_bwd_launches()
    if a.sanitizer_launch:
        return sanitizer_launches()
    t0 = time.time()
    log = lambda r: print(json.dumps(r), flush=True)
    prov = collect("cuda", sys.argv[1:])
    prov["command"] = "python experiments/cuda_ladder/cuda_ladder.py " + " ".join(sys.argv[1:])
    prov["what"] = ("CUDA forward ladder steps 3-7 and the backward's dQ strategies against SDPA flash in one "
                    "process: speed rows per the protocol (fwd 4 B H N^2 D, halved when causal; bwd "
                    "2.5x), median of triton.testing.do_bench, each output checked against SDPA flash first; "
                    "first_call_seconds: NVRTC compile + load + launch on a fresh machine; checks: the "
                    "FlashAttention criterion on odd shapes per (step, D, dtype)")
    out = {"rows": []}

    def save(rows):  # after every phase: a run cut short keeps what it measured
        speed, first, checks = schema_rows(rows)
        out["rows"] += speed
        prov.setdefault("first_call_seconds", {}).update(first)
        prov.setdefault("checks", []).extend(checks)
        prov["seconds"] = round(time.time() - t0, 1)
        if a.out:
            save_results(a.out, "speed", out["rows"], prov)

    if not a.bwd_only:
        save(first_calls(log))
    warm_cache()
    if not a.bwd_only:
        save(check(log))
    save(check_bwd(log))
    Ns = (4096,) if a.quick else (4096, 16384)
    for D in (128, 64):
        save(bench(log, Ns, (D,), not a.no_bwd, fwd=not a.bwd_only))
    if a.loader_ab:
        try:
            save(loader_ab(log, a.loader_ab))
        except Exception as exc:  # the other phases are saved already
            print(f"loader A/B failed: {type(exc).__name__}: {exc}", flush=True)
    rows = [legacy_row(r) for r in out["rows"]]
    # the short table: forward TFLOP/s and ratio to SDPA flash
    fw = [r for r in rows if r.get("impl", "").startswith(("cuda-v", "sdpa-flash")) and "fwd_tflops" in r]
    print("D     N dtype    causal  flash " + " ".join(f"{s:>11s}" for s in STEPS))
    bw = [r for r in rows if "bwd_tflops" in r]
    keys = sorted({(r["D"], r["N"], r["dtype"], r["causal"]) for r in fw + bw})
    for key in keys:
        pick = {r["impl"]: r["fwd_tflops"] for r in fw if (r["D"], r["N"], r["dtype"], r["causal"]) == key}
        fl = pick.get("sdpa-flash", float("nan"))
        cells = [f"{pick.get('cuda-' + s, float('nan')):6.1f}/{pick.get('cuda-' + s, float('nan')) / fl:4.2f}"
                 for s in STEPS]
        print(f"{key[0]:3d} {key[1]:5d} {key[2]:8s} {str(key[3]):6s} {fl:6.1f} " + " ".join(cells))
    for key in keys:
        pick = {r["impl"]: r["bwd_tflops"] for r in bw if (r["D"], r["N"], r["dtype"], r["causal"]) == key}
        if pick:
            fl = pick.get("sdpa-flash-bwd", float("nan"))
            print(f"bwd {key[0]} {key[1]} {key[2]} {key[3]!s:5s} flash {fl:.1f} " + " ".join(
                f"{n[9:]} {t:.0f}/{t / fl:.2f}" for n, t in pick.items() if n != "sdpa-flash-bwd"))


if __name__ == "__main__":
    main()

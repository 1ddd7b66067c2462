"""Where the sliding window's Triton backward loses time, kernel by kernel, against SDPA flash.

``python experiments/triton_window/window_backward.py --out-dir DIR`` on a CUDA GPU
(``experiments/triton_window/gpu_triton_window.sh`` runs it with the tests). The shape is the real-models comparison's window case: B = 1, H = Hkv = 16,
N = 16384, D = 128, float16, causal, a window of 4096 against no window. For each mask it times,
with ``triton.testing.do_bench`` (median): the whole backward with each list's first tile and (window
only) autotuned; each kernel of the backward on its own (Delta, dK/dV, dQ) under several pinned tile
configurations; the fused backward (dQ by float32 atomics from the dK/dV program); the whole backward
with the best pinned pair; the same with the dQ kernel on a second stream; and SDPA's flash backward
(full causal: it has no window). Rates are TFLOP/s on visible keys (2.5 times the forward's FLOPs),
the yardstick of ``python -m flashtut.bench real-models``. Every variant's gradients are compared with
the default backward's before it is timed. Writes ``triton_window.txt`` (the lines printed) and
``triton_window.json`` (a plain list of rows, a diagnosis rather than a results file) to DIR.
"""
from __future__ import annotations

import json
import os
import time

import torch

from flashtut.costs.flops import visible_attention_flops
from flashtut.triton import attention as A
from flashtut.triton.configs import TileConfig as T

DKDV = [T(64, 128, 8, 3), T(64, 128, 8, 2), T(32, 128, 8, 3), T(32, 64, 4, 3), T(64, 64, 8, 3),
        T(32, 128, 4, 3), T(32, 128, 8, 4), T(64, 64, 4, 3)]
DQ = [T(128, 64, 8, 3), T(128, 64, 8, 4), T(64, 64, 4, 3), T(128, 32, 8, 3), T(128, 128, 8, 2),
      T(64, 128, 8, 3), T(128, 64, 4, 3)]
FUSED = [T(32, 128, 8, 3), T(64, 128, 8, 3), T(64, 64, 8, 3), T(64, 64, 4, 3), T(32, 64, 4, 3)]


def bench(fn):
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))


def cfg_name(c):
    return f"{c.block_m}x{c.block_n}/w{c.num_warps}/s{c.num_stages}"


def run_window_backward(out_dir: str, budget_s: float = 140.0, quick: bool = False) -> list[dict]:
    """Time the variants of the module docstring on the current CUDA GPU; ``budget_s`` stops the
    tile sweeps (past their first two entries) after that many seconds, ``quick`` sweeps four tiles."""
    os.makedirs(out_dir, exist_ok=True)
    saved_autotune = os.environ.get("FLASHTUT_TRITON_AUTOTUNE")
    os.environ["FLASHTUT_TRITON_AUTOTUNE"] = "0"
    try:
        return _run(out_dir, budget_s, quick)
    finally:
        if saved_autotune is None:
            os.environ.pop("FLASHTUT_TRITON_AUTOTUNE", None)
        else:
            os.environ["FLASHTUT_TRITON_AUTOTUNE"] = saved_autotune


def _run(out_dir, budget_s, quick):
    t_start = time.time()
    lines, rows = [], []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    B, H, N, D, W = 1, 16, 16384, 128, 4096
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn((B, H, N, D), generator=gen, device=dev, dtype=torch.float16) for _ in range(4))
    scale = D ** -0.5
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__} shape B={B} H={H} N={N} D={D} fp16 causal")

    # SDPA flash, full causal (what the real-models preset compares against)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.enable_grad():
        o_sdpa = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)

    def sdpa_step():
        for t in leaves:
            t.grad = None
        o_sdpa.backward(do, retain_graph=True)
    ms = bench(sdpa_step)
    f_full = visible_attention_flops(B, H, N, N, D, True, None, "bwd")
    sdpa_rate = f_full / ms / 1e9
    say(f"sdpa-flash bwd full causal: {ms:.3f} ms {sdpa_rate:.1f} TFLOP/s")
    rows.append(dict(variant="sdpa-flash", window=None, ms=ms, tflops=sdpa_rate))
    del o_sdpa, leaves

    for window in (W, None):
        mask = (("top-left"), window)
        flops = visible_attention_flops(B, H, N, N, D, True, window, "bwd")
        o, lse = A.triton_forward(q, k, v, causal=True, window=window)
        ref = A._BackwardPlan(q, k, v, o, lse, do, mask, scale, fused_dq=False).run()
        tag = f"window={window}"
        say(f"--- {tag}: visible bwd FLOPs {flops:.4g}; 310 TFLOP/s needs <= {flops / 310e9:.3f} ms")

        def rate(ms):
            return flops / ms / 1e9

        plan = A._BackwardPlan(q, k, v, o, lse, do, mask, scale, fused_dq=False)
        ms_pre = bench(plan.preprocess)
        grads = [g for g in ref]
        ms_chk = bench(lambda: torch.stack([g.abs().amax().float() for g in grads]).cpu())
        say(f"{tag} preprocess {ms_pre:.3f} ms; re-reading the gradients for overflow (3 reductions and a "
            f"sync, now bfloat16/float32 only) {ms_chk:.3f} ms")
        plan.preprocess()
        # the default path (autotuning off: first configs), as the real-models preset runs it
        ms = bench(lambda: A._backward(q, k, v, o, lse, do, mask, scale))
        say(f"{tag} DEFAULT whole bwd (first configs): {ms:.3f} ms {rate(ms):.1f} TFLOP/s "
            f"= {rate(ms) / sdpa_rate:.3f}x sdpa")
        rows.append(dict(variant="default", window=window, ms=ms, tflops=rate(ms)))
        if window:
            os.environ["FLASHTUT_TRITON_AUTOTUNE"] = "1"
            try:
                A._backward(q, k, v, o, lse, do, mask, scale)           # tunes once
                ms = bench(lambda: A._backward(q, k, v, o, lse, do, mask, scale))
            finally:
                os.environ["FLASHTUT_TRITON_AUTOTUNE"] = "0"
            say(f"{tag} AUTOTUNED whole bwd: {ms:.3f} ms {rate(ms):.1f} TFLOP/s = {rate(ms) / sdpa_rate:.3f}x sdpa "
                f"{ {k: v for k, v in A.best_configs().items() if k.startswith(('dkdv', 'dq'))} }")
            rows.append(dict(variant="autotuned", window=window, ms=ms, tflops=rate(ms)))

        def sweep(name, cands, fn_for, check):
            best = None
            for i, c in enumerate(cands[:4] if quick or window is None else cands):
                if i >= 2 and time.time() - t_start > budget_s:     # the first two always run
                    say(f"{tag} {name}: budget spent, sweep cut")
                    break
                try:
                    with A.use_configs(**{("dq" if name == "dq" else "dkdv"): c}):
                        fn = fn_for()
                        fn()
                        torch.cuda.synchronize()
                        err = check()
                        ms = bench(fn)
                except Exception as e:  # noqa: BLE001 - a config that does not compile or fit
                    say(f"{tag} {name} {cfg_name(c)}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                say(f"{tag} {name:6s} {cfg_name(c):14s} {ms:7.3f} ms  err {err:.2e}")
                rows.append(dict(variant=name, window=window, config=cfg_name(c), ms=ms, err=err))
                if best is None or ms < best[1]:
                    best = (c, ms)
            return best

        def err_of(got, idx):
            return float((got.float() - ref[idx].float()).abs().max())

        best_dkdv = sweep("dkdv", DKDV, lambda: plan.dkdv, lambda: max(err_of(plan.dk, 1), err_of(plan.dv, 2)))
        best_dq = sweep("dq", DQ, lambda: plan.dq_kernel, lambda: err_of(plan.dq, 0))
        fplan = A._BackwardPlan(q, k, v, o, lse, do, mask, scale, fused_dq=True)
        fplan.preprocess()

        def fused_step():
            fplan.dkdv()
            fplan.finish()

        def fused_err():
            return max(err_of(fplan.dq, 0), err_of(fplan.dk, 1), err_of(fplan.dv, 2))
        best_fused = sweep("fused", FUSED[:3] if window else FUSED[:2], lambda: fused_step, fused_err)

        if best_dkdv and best_dq:
            with A.use_configs(dkdv=best_dkdv[0], dq=best_dq[0]):
                def split():
                    return A._backward(q, k, v, o, lse, do, mask, scale)
                ms = bench(split)
                say(f"{tag} SPLIT whole bwd (best pair {cfg_name(best_dkdv[0])} + {cfg_name(best_dq[0])}): "
                    f"{ms:.3f} ms {rate(ms):.1f} TFLOP/s = {rate(ms) / sdpa_rate:.3f}x sdpa")
                rows.append(dict(variant="split", window=window, ms=ms, tflops=rate(ms)))
                side = torch.cuda.Stream()
                p2 = A._BackwardPlan(q, k, v, o, lse, do, mask, scale, fused_dq=False)

                def two_streams():
                    p2.preprocess()
                    main = torch.cuda.current_stream()
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        p2.dq_kernel()
                    p2.dkdv()
                    main.wait_stream(side)
                ms = bench(two_streams)
                say(f"{tag} SPLIT kernels only, dq on a second stream: {ms:.3f} ms {rate(ms):.1f} TFLOP/s "
                    f"(kernels only, sequential: {ms_pre + best_dkdv[1] + best_dq[1]:.3f} ms)")
                rows.append(dict(variant="two-streams", window=window, ms=ms, tflops=rate(ms)))
        if best_fused:
            with A.use_configs(dkdv=best_fused[0]), A.use_fused_backward(True):
                ms = bench(lambda: A._backward(q, k, v, o, lse, do, mask, scale))
            say(f"{tag} FUSED whole bwd ({cfg_name(best_fused[0])}): {ms:.3f} ms {rate(ms):.1f} TFLOP/s "
                f"= {rate(ms) / sdpa_rate:.3f}x sdpa")
            rows.append(dict(variant="fused-whole", window=window, ms=ms, tflops=rate(ms)))
        del o, lse, ref, plan, fplan
        torch.cuda.empty_cache()

    say(f"total {time.time() - t_start:.0f} s")
    with open(os.path.join(out_dir, "triton_window.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "triton_window.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return rows


__all__ = ["run_window_backward"]


def main(argv=None) -> int:
    import argparse
    import math
    import sys

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=".gpu_out", help="where triton_window.txt and .json go")
    ap.add_argument("--budget-s", type=float, default=140.0,
                    help="stop the tile sweeps (past their first two tiles) after this long (s)")
    ap.add_argument("--quick", action="store_true", help="sweep four tiles per kernel")
    a = ap.parse_args(argv)
    if not (math.isfinite(a.budget_s) and a.budget_s > 0):
        ap.error(f"--budget-s: got {a.budget_s}; accepted: a positive number of seconds")
    if os.path.exists(a.out_dir) and not os.path.isdir(a.out_dir):
        ap.error(f"--out-dir: {a.out_dir} is a file; accepted: a folder (created if missing)")
    if not torch.cuda.is_available():
        print("window_backward.py: times CUDA kernels; run it on a CUDA GPU", file=sys.stderr)
        return 2
    run_window_backward(a.out_dir, a.budget_s, a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

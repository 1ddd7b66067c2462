"""First-call compile time of the CUDA kernels: how long a reader waits the first time
``cuda_attention`` runs a (dtype, head dim) on a fresh machine, kernel by kernel.

    python experiments/compile_time/compile_time.py --out compile.json [--dims 32 64 96 128 256]
        [--dtypes float16 bfloat16] [--no-first-call]

``compile`` rows of the one results format (``flashtut.bench.results``):

* ``what="nvrtc"``: seconds of NVRTC alone for each build the first forward and backward make
  (``configs.attention_builds``), with the runtime's exact options and no cache; then the same
  builds of one call compiled one after the other (``step="all, one by one"``) and from one
  thread each (``step="all, threads"``): whether compiling a call's builds side by side would
  shorten the wait;
* ``what="first-call"``: seconds of the first forward and the first backward of
  ``cuda_attention`` in a new process, with an empty CuPy kernel cache (``cache="empty"``:
  compile, load, launch) and again in another new process once that cache is filled
  (``cache="disk"``: what every later session on the same machine pays; CuPy keeps the
  binaries on disk, keyed by the source text and options).

``--warm`` instead compiles every build of those first calls (both backward paths) in parallel
processes into CuPy's disk cache, so that later processes on the machine load them in
milliseconds (experiments/compile_time/gpu_cuda_dims.sh runs it before the tests).

Needs a CUDA GPU and CuPy: the compile is CPU work, but its target is the GPU's architecture.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from flashtut.cuda import compile as cc
from flashtut.cuda import configs as cfgs
from flashtut.bench.provenance import collect
from flashtut.bench.results import save_results

DTYPE_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _nvrtc_seconds(build: tuple, arch: str) -> float:
    source, _, defines = build
    code = cc.load_source(source)
    t0 = time.perf_counter()
    cc.nvrtc_cubin(code, arch, defines)
    return time.perf_counter() - t0


def nvrtc_rows(dtypes, dims, arch: int, smem_limit: int, log=print) -> list[dict]:
    """One row per build of each (dtype, head dim)'s first call, plus the call's builds
    compiled one by one and side by side (one thread each)."""
    rows = []
    for dtype in dtypes:
        for D in dims:
            base = {"kind": "compile", "what": "nvrtc", "arch": str(arch), "dtype": str(dtype)[6:], "D": D}
            try:
                builds = cfgs.attention_builds(dtype, D, arch, smem_limit)
            except (RuntimeError, ValueError) as exc:     # not built for this GPU (D = 256 on a T4)
                rows.append({**base, "step": "all, one by one", "status": f"skipped: {exc}"[:200]})
                continue
            for step, build in builds.items():
                secs = _nvrtc_seconds(build, str(arch))
                rows.append({**base, "step": step, "source": build[0], "kernel": build[1],
                             "defines": build[2], "seconds": round(secs, 3)})
            t0 = time.perf_counter()
            for build in builds.values():
                _nvrtc_seconds(build, str(arch))
            one_by_one = time.perf_counter() - t0
            t0 = time.perf_counter()
            with ThreadPoolExecutor(len(builds)) as pool:
                list(pool.map(lambda b: _nvrtc_seconds(b, str(arch)), builds.values()))
            threads = time.perf_counter() - t0
            rows.append({**base, "step": "all, one by one", "seconds": round(one_by_one, 3)})
            rows.append({**base, "step": "all, threads", "seconds": round(threads, 3)})
            log(f"nvrtc sm_{arch} {base['dtype']} D={D}: " + ", ".join(
                f"{r['step']} {r['seconds']:.2f} s" for r in rows if r.get("D") == D
                and r.get("dtype") == base["dtype"] and "seconds" in r))
    return rows


def _first_call(dtype_name: str, D: int) -> dict:
    # runs in a child process (see first_call_rows): the first forward, then the first backward
    from flashtut.cuda.attention import cuda_attention

    dtype = DTYPE_NAMES[dtype_name]
    q, k, v = (torch.randn(1, 2, 130, D, device="cuda", dtype=dtype).requires_grad_() for _ in range(3))
    do = torch.randn(1, 2, 130, D, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = cuda_attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    o.backward(do)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"forward": t1 - t0, "backward": t2 - t1}


def first_call_rows(dtypes, dims, arch: int, log=print) -> list[dict]:
    """The first forward and backward in new processes: CuPy's cache empty, then filled."""
    rows = []
    for dtype in dtypes:
        for D in dims:
            with tempfile.TemporaryDirectory(prefix="flashtut-cupy-cache-") as cache:
                env = {**os.environ, "CUPY_CACHE_DIR": cache}
                for state in ("empty", "disk"):
                    base = {"kind": "compile", "what": "first-call", "arch": str(arch), "dtype": str(dtype)[6:],
                            "D": D, "cache": state}
                    res = subprocess.run([sys.executable, __file__, "--child",
                                          str(dtype)[6:], str(D)], capture_output=True, text=True, env=env)
                    if res.returncode != 0:
                        rows.append({**base, "step": "forward", "status": f"error: {res.stderr[-300:]}"})
                        break
                    got = json.loads(res.stdout.strip().splitlines()[-1])
                    for step in ("forward", "backward"):
                        rows.append({**base, "step": step, "seconds": round(got[step], 3)})
                    log(f"first call sm_{arch} {base['dtype']} D={D} cache {state}: forward "
                        f"{got['forward']:.2f} s, backward {got['backward']:.2f} s")
    return rows


def _warm_one(build: tuple) -> float:
    # in a spawned process: a CUDA context cannot cross a fork
    t0 = time.perf_counter()
    cc.get_function(build[0], build[1], dict(build[2]))
    return time.perf_counter() - t0


def warm_cache(dtypes, dims, arch: int, smem_limit: int, workers: int = 16, log=print) -> int:
    """Compile every build of the first calls at ``dtypes`` x ``dims`` (default and deterministic
    backward) into CuPy's disk cache, ``workers`` processes at a time; returns how many."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    builds = set()
    for dtype in dtypes:
        for D in dims:
            for det in (False, True):
                try:
                    found = cfgs.attention_builds(dtype, D, arch, smem_limit, det).values()
                except (RuntimeError, ValueError):   # not built for this GPU
                    continue
                builds |= {(src, kern, tuple(sorted(defs.items()))) for src, kern, defs in found}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        secs = list(pool.map(_warm_one, sorted(builds)))
    log(f"warm: {len(builds)} builds in {time.perf_counter() - t0:.1f} s"
        + (f" (each {min(secs):.1f} to {max(secs):.1f} s)" if secs else ""))
    return len(builds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="compile_time.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results JSON to write")
    ap.add_argument("--dims", type=int, nargs="+", default=[*cfgs.HEAD_DIMS, *cfgs.WIDE_DIMS])
    ap.add_argument("--dtypes", nargs="+", choices=sorted(DTYPE_NAMES), default=["float16", "bfloat16"])
    ap.add_argument("--no-first-call", action="store_true", help="NVRTC times only (no child processes)")
    ap.add_argument("--warm", action="store_true", help="only compile every build into CuPy's disk cache")
    ap.add_argument("--workers", type=int, default=16, help="processes for --warm")
    ap.add_argument("--child", nargs=2, metavar=("DTYPE", "D"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_first_call(a.child[0], int(a.child[1]))))
        return 0
    if not torch.cuda.is_available():
        raise RuntimeError("the compile-time measurement needs a CUDA GPU (its target architecture) and "
                           "CuPy; run it on a GPU machine")
    major, minor = cc.capability()
    arch = 10 * major + minor
    dtypes = [DTYPE_NAMES[n] for n in a.dtypes if arch >= 80 or n == "float16"]
    if a.warm:
        warm_cache(dtypes, a.dims, arch, cc.max_smem_per_block(), a.workers)
        return 0
    args = sys.argv[1:] if argv is None else list(argv)
    prov = collect("cuda", args)
    prov["command"] = "python experiments/compile_time/compile_time.py " + " ".join(args)
    prov["what"] = ("first-call compile time of cuda_attention's kernels: NVRTC seconds per build (runtime "
                    "options, no cache), one by one and one thread each; and the first forward and backward "
                    "in a new process with CuPy's kernel cache empty, then filled")
    rows: list[dict] = []
    # one (dtype, head dim) at a time, the file rewritten after each: a run cut short keeps its rows
    for dtype in dtypes:
        for D in a.dims:
            if not a.no_first_call:
                rows += first_call_rows([dtype], [D], arch)
            rows += nvrtc_rows([dtype], [D], arch, cc.max_smem_per_block())
            if a.out:
                save_results(a.out, "compile", rows, prov)
    return 0


if __name__ == "__main__":
    sys.exit(main())

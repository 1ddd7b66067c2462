"""The Triton backward's candidates against SDPA flash, in one process, on the book's protocol.

Three parts, each a subcommand (``experiments/triton_backward/gpu.sh`` runs them in order):

* ``gate``: the correctness gate, and the compiler's warm-up. For one class of the protocol (head
  dim, causal, dtype) it runs every candidate's forward and autograd backward on two ragged shapes
  (Nq = 1040, Nk = 784 and the reverse: lengths no tile of 32 or more divides) and judges the
  gradients by the book's yardstick (``flashtut.bench.accuracy.yardstick``). The shapes keep the
  timing shapes' compile-time specialisations (row strides and lse strides multiples of 16), so the
  gate fills Triton's cache for the timing process. ``gpu.sh`` runs the 8 classes x 3 parts of the candidates in 24
  processes at once.
* ``time``: the protocol grid (16k tokens, hidden 2048: D = 64 with 32 heads, D = 128 with 16;
  N = 4096 and 16384; float16 and bfloat16; causal and not). Per case SDPA flash's backward and
  each candidate's that passed the gate, through autograd (``o.backward(do, retain_graph=True)``,
  as ``python -m flashtut.bench`` times it), ``triton.testing.do_bench`` medians, in ``--rounds``
  interleaved rounds. Ratio = SDPA flash's time / the candidate's.
* ``fwd-guard``: the forward in bfloat16 against float16 at N = 4096 (the overflow guard): the public
  ``triton_attention`` forward in both dtypes, and bfloat16 with the overflow guard switched off
  (this experiment only), interleaved, with SDPA flash's forward for the ratios.

Candidates (``CANDIDATES``; the tile tables are ``flashtut.triton.configs``):

* ``base``: what ships, autotuning off (each list's first entry on Hopper: dK/dV and dQ
  64x64/w4/s3 at D = 64; dK/dV 64x128/w8/s3 and dQ 128x64/w8/s3 at D = 128).
* ``autotuned``: the autotuner over the shipped lists, once per case (its pick is printed): which
  entry should come first per head dim, mask and dtype.
* ``deep``: narrower streamed tiles with deeper pipelines, the Triton tutorial's shape (dK/dV 32
  query rows past 128 keys, dQ 32 keys past 128 rows; 4 warps and 5 stages at D = 64, 8 warps and
  4 stages at D = 128).
* ``fused``: dQ added with float32 atomics by the dK/dV program (``use_fused_backward``), five tile
  products instead of seven, base tiles.

Writes ``gate_<class>.json`` (gate), ``triton_backward.json`` (time; results format, kind speed)
and ``fwd_guard.json`` (fwd-guard) to ``--out-dir``, and prints one summary line per row.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch

from flashtut.triton import attention as A
from flashtut.triton.configs import TileConfig as T

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: the protocol: 16k tokens, hidden 2048
TOKENS, HIDDEN = 16384, 2048
#: in the order the timing runs them: the slowest case first (a cut-off run keeps the cases that matter most)
DIMS, LENGTHS = (128, 64), (16384, 4096)
#: the gate's (Nq, Nk): no tile of 32 or more divides them, every row and lse stride stays a multiple of 16
GATE_SHAPES = [(1040, 784), (784, 1040)]
DEVICE = "cuda"


def _deep(D):
    if D <= 64:
        return dict(dkdv=T(32, 128, 4, 5), dq=T(128, 32, 4, 5))
    return dict(dkdv=T(32, 128, 8, 4), dq=T(128, 32, 8, 4))


#: name -> (contexts for head dim D, autotune?, description); the gate's parts split the list
CANDIDATES = {
    "base": (lambda D: [], False, "shipped first entries"),
    "autotuned": (lambda D: [], True, "autotuner over the shipped lists"),
    "deep": (lambda D: [A.use_configs(**_deep(D))], False, "32-row/key streamed tiles, deeper pipeline"),
    "fused": (lambda D: [A.use_fused_backward(True)], False, "dQ by float32 atomics in the dK/dV kernel"),
}
#: the gate's parts, about equal in compilations (``autotuned`` compiles every entry of the lists)
PARTS = {"a": ["base", "deep"], "b": ["autotuned"], "c": ["fused"]}


@contextlib.contextmanager
def candidate(name: str, D: int):
    ctxs, autotune, _ = CANDIDATES[name]
    saved = os.environ.get("FLASHTUT_TRITON_AUTOTUNE")
    os.environ["FLASHTUT_TRITON_AUTOTUNE"] = "1" if autotune else "0"
    try:
        with contextlib.ExitStack() as stack:
            for c in ctxs(D):
                stack.enter_context(c)
            yield
    finally:
        if saved is None:
            os.environ.pop("FLASHTUT_TRITON_AUTOTUNE", None)
        else:
            os.environ["FLASHTUT_TRITON_AUTOTUNE"] = saved


def heads(D: int) -> int:
    return HIDDEN // D


def _inputs(B, H, Nq, Nk, D, dtype, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn((B, H, Nq, D), generator=g, device=DEVICE, dtype=dtype)
    k, v = (torch.randn((B, H, Nk, D), generator=g, device=DEVICE, dtype=dtype) for _ in range(2))
    do = torch.randn((B, H, Nq, D), generator=g, device=DEVICE, dtype=dtype)
    return q, k, v, do


def _grads(q, k, v, do, causal):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = A.triton_attention(*leaves, causal=causal)
    return o.detach(), torch.autograd.grad(o, leaves, do)


def _say(lines, s):
    print(s, flush=True)
    lines.append(s)


# ------------------------------------------------------------------------------ gate ----

def gate(D: int, causal: bool, dtype_name: str, names: list[str], out_dir: str, H: int | None = None,
         capability=None) -> list[dict]:
    """Every candidate in ``names`` on the gate's shapes for one class; returns and writes rows.
    ``H`` (default: the protocol's heads) and ``capability`` (default: this GPU's) for tests."""
    from flashtut.bench.accuracy import yardstick
    from flashtut.triton import configs

    dtype = DTYPES[dtype_name]
    H = H or heads(D)
    rows, lines = [], []
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"gate_D{D}_c{int(causal)}_{dtype_name}_{'-'.join(names)}.json")
    for name in names:
        row = dict(candidate=name, D=D, causal=causal, dtype=dtype_name, passed=True, worst=0.0, error=None)
        t0 = time.time()
        try:
            with candidate(name, D):
                pinned = [None]
                if name == "autotuned":      # compile and check every entry the autotuner may pick
                    cap = capability or torch.cuda.get_device_capability()
                    pinned = [dict(dkdv=c) for c in configs.search_space("dkdv", cap, False, D)]
                    pinned += [dict(dq=c) for c in configs.search_space("dq", cap, False, D)]
                    os.environ["FLASHTUT_TRITON_AUTOTUNE"] = "0"
                for pin in pinned:
                    for Nq, Nk in GATE_SHAPES:
                        q, k, v, do = _inputs(1, H, Nq, Nk, D, dtype, seed=Nq + D)
                        with A.use_configs(**pin) if pin else contextlib.nullcontext():
                            o, grads = _grads(q, k, v, do, causal)
                        y = yardstick(q, k, v, o, grads, do, causal, None)
                        worst = max(y.err[n] / y.tolerance(n) for n in y.err)
                        row["worst"] = max(row["worst"], worst)
                        if not y.passed:
                            row["passed"] = False
                            row["error"] = f"{pin or ''} Nq={Nq} Nk={Nk}: {y}".replace("\n", "; ")[:400]
        except Exception as e:  # noqa: BLE001 - a candidate that does not compile or run fails the gate
            row.update(passed=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        _say(lines, f"gate D={D} causal={int(causal)} {dtype_name:8s} {name:9s} "
                    f"{'PASS' if row['passed'] else 'FAIL'} worst err/tolerance {row['worst']:.2f} "
                    f"({row['seconds']} s){'  ' + row['error'] if row['error'] else ''}")
        with open(path, "w") as f:        # after every candidate: a gate cut off by its time limit keeps its rows
            json.dump(rows, f, indent=1)
    return rows


def gate_results(out_dir: str) -> dict:
    """``{(candidate, D, causal, dtype): passed}`` from the gate files in out_dir."""
    out = {}
    if not os.path.isdir(out_dir):
        return out
    for fn in sorted(os.listdir(out_dir)):
        if fn.startswith("gate_") and fn.endswith(".json"):
            with open(os.path.join(out_dir, fn)) as f:
                for r in json.load(f):
                    out[r["candidate"], r["D"], r["causal"], r["dtype"]] = r["passed"]
    return out


# ------------------------------------------------------------------------------ time ----

def _bench(fn):
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))


def _flash():
    """SDPA restricted to its flash backend (FlashAttention-2 inside PyTorch): the baseline."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def _provenance():
    from flashtut.bench.provenance import collect
    return collect(torch.device(DEVICE), sys.argv)


def time_grid(names: list[str], rounds: int, out_dir: str, budget_s: float, dims=DIMS, lengths=LENGTHS,
              dtypes=("float16", "bfloat16"), require_gate: bool = True) -> list[dict]:
    """Time ``names`` on the protocol grid; with ``require_gate`` only the (candidate, class) pairs
    whose gate row in ``out_dir`` passed (a candidate the gate did not reach is not timed: it
    would compile here, on the clock)."""
    from flashtut.costs.flops import visible_attention_flops

    t_start = time.time()
    gated = gate_results(out_dir)
    rows, lines = [], []
    prov = _provenance()
    _say(lines, f"{prov['device'].get('name')} torch {torch.__version__}; candidates {', '.join(names)}; "
                f"rounds {rounds}; {'only what passed the gate' if require_gate else 'no gate required'}; "
                f"failed the gate: {sorted(k for k, ok in gated.items() if not ok) or 'none'}")
    for D in dims:
        for N in lengths:
            for dtype_name in dtypes:
                for causal in (False, True):
                    if time.time() - t_start > budget_s:
                        _say(lines, f"budget of {budget_s:.0f} s spent: stopping before D={D} N={N} {dtype_name}")
                        return _finish(rows, lines, prov, out_dir, names)
                    B, H = TOKENS // N, heads(D)
                    q, k, v, do = _inputs(B, H, N, N, D, DTYPES[dtype_name])
                    flops = visible_attention_flops(B, H, N, N, D, causal, None, "bwd")
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    with _flash(), torch.enable_grad():
                        o_ref = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
                    with torch.enable_grad():
                        o_ours = A.triton_attention(*leaves, causal=causal)

                    def step(o):
                        def run():
                            for t in leaves:
                                t.grad = None
                            o.backward(do, retain_graph=True)
                        return run
                    todo = [n for n in names if n == "base" or not require_gate
                            or gated.get((n, D, causal, dtype_name), False)]
                    times = {n: [] for n in ["sdpa-flash"] + todo}
                    picks = {}
                    for r in range(rounds):
                        times["sdpa-flash"].append(_bench(step(o_ref)))
                        for n in todo:
                            try:
                                with candidate(n, D):
                                    known = set(A.best_configs())
                                    step(o_ours)()          # the autotuner tunes here, once per case
                                    if n == "autotuned" and r == 0:
                                        picks = {key.split("/")[0]: cfg for key, cfg in A.best_configs().items()
                                                 if key not in known}
                                    times[n].append(_bench(step(o_ours)))
                            except Exception as e:  # noqa: BLE001
                                times[n] = None
                                _say(lines, f"  {n}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                                todo = [m for m in todo if m != n]
                    base_ms = _median(times["sdpa-flash"])
                    summary = []
                    for n, ts in times.items():
                        if not ts:
                            continue
                        ms = _median(ts)
                        row = dict(kind="speed", impl="sdpa-flash" if n == "sdpa-flash" else f"triton-bwd:{n}",
                                   candidate=n, mode="bwd", B=B, H=H, N=N, D=D, dtype=dtype_name, causal=causal,
                                   ms=ms, tflops=flops / ms / 1e9, ms_rounds=ts, ratio=base_ms / ms, status="ok",
                                   timer="triton.testing.do_bench(median)")
                        if n == "autotuned" and picks:
                            row["autotuned_configs"] = picks
                        rows.append(row)
                        if n != "sdpa-flash":
                            summary.append(f"{n} {base_ms / ms:.3f}")
                    _say(lines, f"D={D:3d} N={N:5d} {dtype_name:8s} causal={int(causal)} sdpa-flash "
                                f"{flops / base_ms / 1e9:6.1f} TFLOP/s | " + " | ".join(summary))
                    if picks:
                        _say(lines, f"  autotuned picks: {picks}")
                    _save(rows, lines, prov, out_dir, names)    # after every case: a run cut off keeps them
                    del q, k, v, do, leaves, o_ref, o_ours
                    torch.cuda.empty_cache()
    return _finish(rows, lines, prov, out_dir, names)


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _save(rows, lines, prov, out_dir, names):
    from flashtut.bench.results import save_results
    os.makedirs(out_dir, exist_ok=True)
    save_results(os.path.join(out_dir, "triton_backward.json"), "speed", rows, prov,
                 {"candidates": {n: CANDIDATES[n][2] for n in names}, "tokens": TOKENS, "hidden": HIDDEN})
    with open(os.path.join(out_dir, "triton_backward.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _finish(rows, lines, prov, out_dir, names, save: bool = True):
    # per candidate: the ratio range over the cases it ran
    for n in names:
        rs = [r["ratio"] for r in rows if r["candidate"] == n]
        if rs:
            gm = math.exp(sum(map(math.log, rs)) / len(rs))
            _say(lines, f"SUMMARY {n:9s} x sdpa-flash: min {min(rs):.3f} gmean {gm:.3f} max {max(rs):.3f} "
                        f"over {len(rs)} cases; >= 1.3 in {sum(r >= 1.3 for r in rs)}")
    if save:
        _save(rows, lines, prov, out_dir, names)
    return rows


# ------------------------------------------------------------------------- fwd-guard ----

def fwd_guard(rounds: int, out_dir: str, N: int = 4096, dims=DIMS, dtypes=DTYPES) -> list[dict]:
    """bfloat16 against float16, the Triton forward through the public call, at N = 4096."""
    from flashtut.bench.results import save_results
    from flashtut.costs.flops import visible_attention_flops

    os.environ["FLASHTUT_TRITON_AUTOTUNE"] = "0"
    rows, lines = [], []
    prov = _provenance()
    real_guard = A.raise_if_overflowed
    for D in dims:
        for causal in (False, True):
            B, H = TOKENS // N, heads(D)
            flops = visible_attention_flops(B, H, N, N, D, causal, None, "fwd")
            ins = {n: _inputs(B, H, N, N, D, dt)[:3] for n, dt in dtypes.items()}

            def ours(name):
                return lambda: A.triton_attention(*ins[name], causal=causal)

            def sdpa(name):
                def run():
                    with _flash():
                        torch.nn.functional.scaled_dot_product_attention(*ins[name], is_causal=causal)
                return run

            slow = "bfloat16" if "bfloat16" in ins else list(ins)[-1]     # a test may pass other dtypes

            def unguarded():
                A.raise_if_overflowed = lambda *a, **kw: None
                try:
                    A.triton_attention(*ins[slow], causal=causal)
                finally:
                    A.raise_if_overflowed = real_guard
            fast = "float16" if "float16" in ins else list(ins)[0]
            variants = {"triton fp16": ours(fast), "triton bf16": ours(slow),
                        "triton bf16 no guard": unguarded, "sdpa-flash fp16": sdpa(fast),
                        "sdpa-flash bf16": sdpa(slow)}
            ts = {n: [] for n in variants}
            for _ in range(rounds):
                for n, fn in variants.items():
                    fn()
                    ts[n].append(_bench(fn))
            ms = {n: _median(v) for n, v in ts.items()}
            for n, m in ms.items():
                rows.append(dict(kind="speed", impl=n.replace(" ", "-"), mode="fwd", B=B, H=H, N=N, D=D,
                                 dtype="bfloat16" if "bf16" in n else "float16", causal=causal, ms=m,
                                 tflops=flops / m / 1e9, ms_rounds=ts[n], status="ok",
                                 timer="triton.testing.do_bench(median)"))
            r16 = ms["sdpa-flash fp16"] / ms["triton fp16"]
            r_bf = ms["sdpa-flash bf16"] / ms["triton bf16"]
            _say(lines, f"fwd D={D:3d} N={N} causal={int(causal)}: bf16/fp16 time {ms['triton bf16'] / ms['triton fp16']:.3f} "
                        f"(no guard {ms['triton bf16 no guard'] / ms['triton fp16']:.3f}); x sdpa-flash fp16 {r16:.3f}, "
                        f"bf16 {r_bf:.3f}; guard cost {ms['triton bf16'] - ms['triton bf16 no guard']:+.4f} ms")
    os.makedirs(out_dir, exist_ok=True)
    save_results(os.path.join(out_dir, "fwd_guard.json"), "speed", rows, prov, {"N": N, "rounds": rounds})
    with open(os.path.join(out_dir, "fwd_guard.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows


# ------------------------------------------------------------------------------- cli ----

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gate", help="correctness gate of the candidates for one class")
    g.add_argument("--D", type=int, choices=DIMS, required=True)
    g.add_argument("--causal", type=int, choices=(0, 1), required=True)
    g.add_argument("--dtype", choices=tuple(DTYPES), required=True)
    g.add_argument("--part", choices=(*PARTS, "all"), default="all")
    t = sub.add_parser("time", help="the protocol grid, candidates against SDPA flash")
    t.add_argument("--candidates", default=",".join(CANDIDATES))
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--budget-s", type=float, default=150.0)
    t.add_argument("--dims", default="128,64")
    t.add_argument("--lengths", default="16384,4096")
    t.add_argument("--no-gate", action="store_true", help="time every candidate, gated or not")
    f = sub.add_parser("fwd-guard", help="the forward in bfloat16 against float16 at N = 4096")
    f.add_argument("--rounds", type=int, default=3)
    s = sub.add_parser("summary", help="the SUMMARY lines of triton_backward.json (a time run cut off)")
    for p in (g, t, f, s):
        p.add_argument("--out-dir", default=".gpu_out")
    a = ap.parse_args(argv)
    if a.cmd == "summary":
        path = os.path.join(a.out_dir, "triton_backward.json")
        if not os.path.isfile(path):
            print(f"summary: no {path}", file=sys.stderr)
            return 2
        with open(path) as fh:
            doc = json.load(fh)
        _finish(doc["rows"], [], doc["provenance"], a.out_dir, list(doc["config"]["candidates"]), save=False)
        return 0
    if not torch.cuda.is_available():
        print("ab.py: times and checks CUDA kernels; run it on a CUDA GPU", file=sys.stderr)
        return 2
    if a.cmd == "gate":
        names = PARTS[a.part] if a.part != "all" else list(CANDIDATES)
        rows = gate(a.D, bool(a.causal), a.dtype, names, a.out_dir)
        return 0 if all(r["passed"] for r in rows) else 1
    if a.cmd == "time":
        names = [n for n in a.candidates.split(",") if n]
        unknown = [n for n in names if n not in CANDIDATES]
        if unknown:
            ap.error(f"--candidates: unknown {unknown}; accepted: {', '.join(CANDIDATES)}")
        if a.rounds < 1:
            ap.error(f"--rounds: got {a.rounds}; accepted: 1 or more")
        time_grid(names, a.rounds, a.out_dir, a.budget_s, tuple(int(x) for x in a.dims.split(",")),
                  tuple(int(x) for x in a.lengths.split(",")), require_gate=not a.no_gate)
        return 0
    if a.rounds < 1:
        ap.error(f"--rounds: got {a.rounds}; accepted: 1 or more")
    fwd_guard(a.rounds, a.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Same-process A/B measurements of the Hopper rungs (chapter 11) on an sm_90 GPU.

Without ``--pair``, two of rung W3:

* how its three TMA tensor maps reach the GPU: copied from pageable memory (what the launch did
  before: torch then waits for the stream to drain, so the GPU idles while the host prepares the
  next call) or from pinned memory without blocking (``hopper_launch.tensor_maps`` now);
* the timing budget: ``do_bench`` warm-up / repetitions of 5 / 40 ms (the CUDA protocol runs) and
  25 / 100 ms (the ``hopper`` preset), which differ for a kernel that draws more power.

Each case also times SDPA flash under the same budget, for the ratio; W3's output is checked
against SDPA flash before any timing.

    python experiments/hopper_options/hopper_ab.py --out book/data/hopper_ab_h200.json

``flashtut.bench.paired.ab_table`` tabulates the result (``book/perflog_hopper.md``).

With ``--pair A B`` (two names of ``registry.HOPPER_IMPLS``), a build option whose effect is smaller than
what one timing of a case moves between runs (a few percent at N = 4096): at each protocol case of the
head dims both run, A, B and SDPA flash are timed in ``--rounds`` rounds, A before B in odd rounds and
after it in even ones, so that neither always runs on a GPU the other has just warmed; every round is a
row (``round``). ``flashtut.bench.paired.pair_table`` gives per case the median over the rounds of B's time against A's and
how many rounds B won. Both outputs are checked against SDPA flash's first.

    python experiments/hopper_options/hopper_ab.py --pair 'hopper-w3[c3,turns]' 'hopper-w3[c3,turns,uni]' --out ...
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtut.bench.paired import pair_table
from flashtut.bench.provenance import collect
from flashtut.bench.report import format_table
from flashtut.bench.results import save_results
from flashtut.bench.timing import time_fn
from flashtut.costs.flops import attention_flops
from flashtut.cuda import hopper_launch
from flashtut.cuda.hopper import forward_hopper

#: (warm-up ms, repetition ms) of do_bench
BUDGETS = ((5, 40), (25, 100))


def pageable_tensor_maps(q, k, v, block_m: int, block_n: int, counter: bool = False, o=None) -> torch.Tensor:
    """The launch's tensor maps as they were copied before: from pageable memory, blocking (the same
    arguments as ``hopper_launch.tensor_maps``, which it stands in for)."""
    blob = hopper_launch.tensor_map_bytes(q, k, v, block_m, block_n, counter, o)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(q.device)


def run(dtype=torch.float16, on_row=None) -> list[dict]:
    pinned = hopper_launch.tensor_maps
    rows = []
    for D in (128, 64):
        H = 2048 // D
        for N in (4096, 16384):
            B = 16384 // N
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
            for causal in (False, True):
                def flash():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def w3():
                    return forward_hopper(q, k, v, causal=causal, variant="w3")[0]

                err = float((w3().float() - flash().float()).abs().max())
                if not err < 0.05:
                    raise RuntimeError(f"W3 differs from SDPA flash by {err:.3g} (D={D}, N={N}, causal={causal})")
                flops = attention_flops(B, H, N, N, D, causal)
                for warmup, rep in BUDGETS:
                    for impl, maps in (("sdpa-flash", None), ("hopper-w3[pageable-maps]", pageable_tensor_maps),
                                       ("hopper-w3", pinned)):
                        hopper_launch.tensor_maps = maps or pinned
                        try:
                            ms = time_fn(flash if maps is None else w3, "cuda", warmup, rep)
                        finally:
                            hopper_launch.tensor_maps = pinned
                        row = dict(kind="speed", impl=impl, mode="fwd", dtype=str(dtype)[6:], B=B, H=H, N=N,
                                   Nq=N, Nk=N, D=D, causal=causal, ms=ms, tflops=round(flops / ms / 1e9, 2),
                                   warmup_ms=warmup, rep_ms=rep, status="ok")
                        rows.append(row)
                        if on_row:
                            on_row(row)
    return rows


def run_pair(impl_a: str, impl_b: str, rounds: int = 7, budget: tuple[float, float] = (25, 100),
             on_row=None) -> list[dict]:
    """The ``--pair`` A/B (module docstring): rows of A, B and SDPA flash at every protocol case (16k
    tokens, hidden 2048) of the head dims both of ``impl_a`` and ``impl_b`` run, float16 and bfloat16,
    ``rounds`` rounds each, timed with do_bench at ``budget`` (warm-up, repetitions in ms)."""
    from flashtut.bench import registry

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    impls = [registry.get(name) for name in (impl_a, impl_b)]
    flash_impl = registry.get("sdpa-flash")
    device = torch.device("cuda")
    rows = []
    for D in (128, 64):
        H = 2048 // D
        if not all(i.available(device, torch.float16, D)[0] for i in impls):
            continue
        for dtype in (torch.float16, torch.bfloat16):
            for N in (4096, 16384):
                B = 16384 // N
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
                for causal in (False, True):
                    scale = D ** -0.5
                    calls = {i.name: (lambda i=i: i.forward(q, k, v, causal, scale)) for i in impls}
                    with flash_impl.context():
                        ref = flash_impl.forward(q, k, v, causal, scale).float()
                    for name, call in calls.items():
                        o = call()
                        err = float(((o[0] if isinstance(o, tuple) else o).float() - ref).abs().max())
                        if not err < 0.05:
                            raise RuntimeError(f"{name} differs from SDPA flash by {err:.3g} "
                                               f"(D={D}, N={N}, {dtype}, causal={causal})")

                    def flash():
                        with flash_impl.context():
                            return flash_impl.forward(q, k, v, causal, scale)

                    calls["sdpa-flash"] = flash
                    flops = attention_flops(B, H, N, N, D, causal)
                    for rnd in range(rounds):
                        order = ([impl_a, impl_b] if rnd % 2 == 0 else [impl_b, impl_a]) + ["sdpa-flash"]
                        for name in order:
                            ms = time_fn(calls[name], "cuda", *budget)
                            row = dict(kind="speed", impl=name, mode="fwd", dtype=str(dtype)[6:], B=B, H=H, N=N,
                                       Nq=N, Nk=N, D=D, causal=causal, ms=ms, tflops=round(flops / ms / 1e9, 2),
                                       warmup_ms=budget[0], rep_ms=budget[1], round=rnd, status="ok")
                            rows.append(row)
                            if on_row:
                                on_row(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pair", nargs=2, metavar=("A", "B"),
                    help="two Hopper implementations (registry names) timed in alternated rounds instead")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of --pair (default 7)")
    a = ap.parse_args(argv)
    prov = collect("cuda", sys.argv[1:])
    prov["command"] = "python experiments/hopper_options/hopper_ab.py " + " ".join(sys.argv[1:])
    if a.pair:
        prov["what"] = (f"{a.pair[0]} and {a.pair[1]}, and SDPA flash, in {a.rounds} rounds per protocol case "
                        "(the order of the two swapped every round), do_bench 25/100 ms, one process, the "
                        "protocol's 16k tokens, float16 and bfloat16")
    else:
        prov["what"] = ("Hopper rung W3 with its tensor maps copied from pageable memory (blocking) and from pinned "
                        "memory (non-blocking), and SDPA flash, each at do_bench budgets 5/40 and 25/100 ms, one "
                        "process, float16, the protocol's 16k tokens")
    rows = []

    def keep(row):
        rows.append(row)
        save_results(a.out, "speed", rows, prov)
        print(f"{row['impl']:26s} D={row['D']:3d} N={row['N']:5d} {row['dtype']:8s} causal={row['causal']!s:5s} "
              f"budget {row['warmup_ms']}/{row['rep_ms']} ms{' round %d' % row['round'] if 'round' in row else ''}: "
              f"{row['tflops']:7.1f} TFLOP/s", flush=True)

    if a.pair:
        run_pair(*a.pair, rounds=a.rounds, on_row=keep)
        print(format_table(*pair_table(rows, *a.pair)))
    else:
        run(on_row=keep)


if __name__ == "__main__":
    main()

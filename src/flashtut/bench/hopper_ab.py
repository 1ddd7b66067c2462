"""Same-process A/B measurements of the Hopper rungs (chapter 11) on an sm_90 GPU.

Without ``--pair``, two of rung W3:

* how its three TMA tensor maps reach the GPU: copied from pageable memory (what the launch did
  before: torch then waits for the stream to drain, so the GPU idles while the host prepares the
  next call) or from pinned memory without blocking (``hopper_launch.tensor_maps`` now);
* the timing budget: ``do_bench`` warm-up / repetitions of 5 / 40 ms (the CUDA protocol runs) and
  25 / 100 ms (the ``hopper`` preset), which differ for a kernel that draws more power.

Each case also times SDPA flash under the same budget, for the ratio; W3's output is checked
against SDPA flash before any timing.

    python -m flashtut.bench.hopper_ab --out book/data/hopper_ab_h200.json

:func:`ab_table` tabulates the result (``book/perflog_hopper.md``).

With ``--pair A B`` (two names of ``registry.HOPPER_IMPLS``), a build option whose effect is smaller than
what one timing of a case moves between runs (a few percent at N = 4096): at each protocol case of the
head dims both run, A, B and SDPA flash are timed in ``--rounds`` rounds, A before B in odd rounds and
after it in even ones, so that neither always runs on a GPU the other has just warmed; every round is a
row (``round``). :func:`pair_table` gives per case the median over the rounds of B's time against A's and
how many rounds B won. Both outputs are checked against SDPA flash's first.

    python -m flashtut.bench.hopper_ab --pair 'hopper-w3[c3,turns]' 'hopper-w3[c3,turns,uni]' --out ...
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..costs.flops import attention_flops
from ..cuda import hopper_launch
from ..cuda.hopper import forward_hopper
from .provenance import collect
from .results import save_results
from .timing import time_fn

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
    from . import registry

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


#: the spread (%) the paired A/B measures between two builds that do the same work: the short query block
#: first without a causal mask (hopper_pair_tail_d64_h200.json, +0.6 to +1.4%); a build option worth less
#: than one timing moves is kept where no case's median falls below minus this and some case's rises above it
PAIR_NOISE_PCT = 1.5


def _pair_rounds(rows: list[dict]) -> dict:
    # (D, dtype, N, causal) -> impl -> round -> TFLOP/s
    by: dict = {}
    for r in rows:
        if r.get("tflops") and "round" in r:
            by.setdefault((r["D"], r["dtype"], r["N"], bool(r["causal"])), {}).setdefault(r["impl"], {})[
                r["round"]] = r["tflops"]
    return by


def pair_gains(rows: list[dict], impl_a: str, impl_b: str) -> dict:
    """Per case ``(D, dtype, N, causal)`` of a ``--pair`` run: ``(gain, won, rounds)``, B against A as the
    median over the rounds of each round's ratio in % (the two timed back to back), the rounds B was
    strictly faster, and the rounds both ran."""
    return _gains(_pair_rounds(rows), impl_a, impl_b)


def _gains(by: dict, impl_a: str, impl_b: str) -> dict:
    import statistics

    out = {}
    for case, t in by.items():
        if impl_a in t and impl_b in t:
            rounds = sorted(set(t[impl_a]) & set(t[impl_b]))
            gain = 100 * (statistics.median(t[impl_b][r] / t[impl_a][r] for r in rounds) - 1)
            out[case] = (gain, sum(t[impl_b][r] > t[impl_a][r] for r in rounds), len(rounds))
    return out


def pair_table(rows: list[dict], impl_a: str, impl_b: str) -> tuple[list[str], list[list[str]]]:
    """A ``--pair`` run per case: SDPA flash's and A's median TFLOP/s over the rounds (A's with its ratio
    to SDPA flash), B's likewise, B against A as :func:`pair_gains` has it, and the rounds B won. D
    descending, then dtype, N, non-causal first. Returns (header, body) for ``report.format_table``."""
    import statistics

    by = _pair_rounds(rows)
    gains = _gains(by, impl_a, impl_b)
    body = []
    for (D, dtype, N, causal), (gain, won, n) in sorted(gains.items(),
                                                      key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
        t = by[(D, dtype, N, causal)]
        med = {name: statistics.median(t[name].values()) for name in (impl_a, impl_b, "sdpa-flash")}
        body.append([str(D), str(N), "bf16" if dtype == "bfloat16" else "fp16", "yes" if causal else "no",
                     f"{med['sdpa-flash']:.0f}", f"{med[impl_a]:.0f} ({med[impl_a] / med['sdpa-flash']:.2f})",
                     f"{med[impl_b]:.0f} ({med[impl_b] / med['sdpa-flash']:.2f})", f"{gain:+.1f}%", f"{won} of {n}"])
    return (["D", "N", "dtype", "causal", "sdpa-flash TFLOP/s", impl_a, impl_b, "B / A (median)", "B won"], body)


def ab_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The A/B as one line per case and budget: SDPA flash's TFLOP/s, W3's with pageable and with
    pinned tensor maps (each with its ratio to SDPA flash under the same budget), and how much
    faster the pinned copy made W3. D descending, then N, non-causal first, the short budget first.
    Returns (header, body) for ``report.format_table`` or ``flashtut.notebook.show_table``."""
    tf = {(r["impl"], r["D"], r["N"], bool(r["causal"]), r["warmup_ms"], r["rep_ms"]): r["tflops"]
          for r in rows if r.get("tflops")}
    cases = sorted({k[1:] for k in tf if k[0] == "sdpa-flash"}, key=lambda c: (-c[0], c[1], c[2], c[3]))
    body = []
    for D, N, causal, warmup, rep in cases:
        flash = tf[("sdpa-flash", D, N, causal, warmup, rep)]
        paged = tf[("hopper-w3[pageable-maps]", D, N, causal, warmup, rep)]
        pinned = tf[("hopper-w3", D, N, causal, warmup, rep)]
        body.append([str(D), str(N), "yes" if causal else "no", f"{warmup:g} / {rep:g}", f"{flash:.0f}",
                     f"{paged:.0f} ({paged / flash:.2f})", f"{pinned:.0f} ({pinned / flash:.2f})",
                     f"{100 * (pinned / paged - 1):+.1f}%"])
    return (["D", "N", "causal", "budget (ms)", "sdpa-flash TFLOP/s", "W3, pageable maps", "W3, pinned maps",
             "pinned / pageable"], body)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pair", nargs=2, metavar=("A", "B"),
                    help="two Hopper implementations (registry names) timed in alternated rounds instead")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of --pair (default 7)")
    a = ap.parse_args(argv)
    prov = collect("cuda", sys.argv[1:])
    prov["command"] = "python -m flashtut.bench.hopper_ab " + " ".join(sys.argv[1:])
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
        from .report import format_table

        print(format_table(*pair_table(rows, *a.pair)))
    else:
        run(on_row=keep)


if __name__ == "__main__":
    main()

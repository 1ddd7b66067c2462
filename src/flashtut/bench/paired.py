"""Tables of A/B runs: two builds timed in one process, case by case (chapter 11 and its worklog).

Rows are ``speed`` rows of the results format. A paired run times builds A and B and SDPA flash at each
case in rounds, A before B in odd rounds and after it in even ones (a ``round`` field on every row);
:func:`pair_gains` and :func:`pair_table` summarise it. :func:`ab_table` tabulates the run that timed
rung W3 with its tensor maps copied from pageable and from pinned memory under two timing budgets
(``hopper_ab_h200.json``). The runner that measures both is in the repository's
``experiments/hopper_options/``.
"""
from __future__ import annotations

import statistics


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

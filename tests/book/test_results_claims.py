"""What the prose of README, chapters 09 and 11 and the Hopper log says about the committed H200 data, checked
against that data. The chapters compute every number they print, but their sentences also make
claims in words ("W3 reaches 1.5 times SDPA flash in every D = 128 case", "the ratio flips below 1"); a re-measured
file that broke one of them must fail here, so that the text is rewritten with the data."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashtut import results_data

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

needs_data = pytest.mark.skipif(results_data.local_data_dir() is None, reason="no book/data checkout")


def _tflops(rows, impl, **case):
    hits = [r["tflops"] for r in rows if r["impl"] == impl and r.get("tflops")
            and all(r[k] == v for k, v in case.items())]
    assert len(hits) == 1, (impl, case, hits)
    return hits[0]


# --- README's results table ----------------------------------------------------------------------

#: row label (a part of it) -> the committed files the row is read from and the implementation
README_ROWS = {
    "`flashtut.triton_attention`": ("bench_h200_protocol_d128_*.json", "triton"),
    "`flashtut.cuda_attention` (on an H200": ("cuda_protocol_h200.json", "cuda"),
    "forward_kernel=\"mma\"": ("cuda_protocol_h200.json", "cuda-mma"),
    "cuDNN": ("bench_h200_protocol_d128_*.json", "sdpa-cudnn"),
    "Hopper rung W3": ("hopper_h200.json", "hopper-w3"),
}


def _readme_table():
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| kernel | fp16 fwd"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([c.strip() for c in line.strip("|").split("|")])
    return header, body


@needs_data
def test_readme_ratios_are_the_committed_ones():
    header, body = _readme_table()
    assert len(body) == len(README_ROWS), [row[0] for row in body]
    dtypes = {"fp16": "float16", "bf16": "bfloat16"}
    for row in body:
        key = next(k for k in README_ROWS if k in row[0])
        pattern, impl = README_ROWS[key]
        rows, _ = results_data.load_results(pattern)
        for column, cell in zip(header[1:], row[1:]):
            m = re.fullmatch(r"(fp16|bf16) (fwd|bwd)( causal)?", column)
            case = dict(D=128, N=16384, dtype=dtypes[m.group(1)], mode=m.group(2), causal=bool(m.group(3)))
            mine = [r for r in rows if r["impl"] == impl and r.get("tflops")
                    and all(r[k] == v for k, v in case.items())]
            if not mine:                    # a pass the kernel does not have: the table says so
                assert cell == "-", (row[0], column, cell)
                continue
            ratio = mine[0]["tflops"] / _tflops(rows, "sdpa-flash", **case)
            assert cell == f"{ratio:.2f}", (row[0], column, cell, ratio)


def _tma_store_gain():
    """Per head dim, W3 with the TMA store of its output against W3 without it at cuda_attention's consumers,
    % per case, from the same process (hopper_options_h200.json)."""
    rows, _ = results_data.load_results("hopper_options_h200.json")
    rows = [r for r in rows if r.get("status") == "ok" and r.get("tflops")]
    gain = {}
    pairs = {128: ("hopper-w3[store]", "hopper-w3"), 64: ("hopper-w3[c3,store]", "hopper-w3[c3]")}
    for d, (store, base) in pairs.items():
        gain[d] = [100 * (x - 1) for k, x in _ratios(rows, store, base).items() if k[1] == d]
        assert len(gain[d]) == 8, (d, gain[d])
    return gain


def _turns_gain():
    """W3's three consumers at D = 64 taking turns against the same build without turns, % per case, from
    the same process (hopper_turns_h200.json)."""
    from flashtut.bench.report import gains

    rows, _ = results_data.load_results("hopper_turns_h200.json")
    gain = list(gains(rows, "hopper-w3[c3,turns]", "hopper-w3[c3]")[64].values())
    assert len(gain) == 8
    return gain


@needs_data
def test_readme_prose_ranges():
    # "there `cuda_attention`'s forward is 1.04-1.13x cuDNN's in these four cases" (D = 128, N = 16384);
    # "1.57-1.84x SDPA flash at D = 128, 1.45-1.64x at D = 64": the W3 build cuda_attention runs per head dim
    text = " ".join(README.read_text().split())
    proto, _ = results_data.load_results("cuda_protocol_h200.json")
    cudnn = [r["tflops"] / _tflops(proto, "sdpa-cudnn", **{k: r[k] for k in ("mode", "dtype", "D", "N", "causal")})
             for r in proto if r["impl"] == "cuda" and r["mode"] == "fwd" and r["D"] == 128 and r["N"] == 16384]
    assert len(cudnn) == 4
    assert f"forward is {_span(cudnn)}x cuDNN's in these four cases" in text
    rows, _ = results_data.load_results("hopper_h200.json")
    rows = [r for r in rows if r.get("status") == "ok" and r.get("tflops")]
    d128 = [x for k, x in _ratios(rows, "hopper-w3", "sdpa-flash").items() if k[1] == 128]
    d64 = list(_ratios(rows, "hopper-w3[c3]", "sdpa-flash").values())
    assert f"{_span(d128)}x SDPA flash at D = 128, {_span(d64)}x at D = 64" in text
    # "at head dim 128 with its output written by a TMA store (+0.6% to +5.2% over W3 without it, in one
    # process": faster in every D = 128 case of that run
    store = _tma_store_gain()[128]
    assert min(store) > 0
    assert (f"written by a TMA store (+{min(store):.1f}% to +{max(store):.1f}% over W3 without it, in one "
            f"process: `book/data/hopper_options_h200.json`)") in text
    # "at head dim 64 with the three taking turns ... (+1.0% to +7.7% over three without turns": faster in
    # every case of that run, which is what made cuda_attention take them
    turns = _turns_gain()
    assert min(turns) > 0
    assert (f"(+{min(turns):.1f}% to +{max(turns):.1f}% over three without turns, in one process: "
            "`book/data/hopper_turns_h200.json`)") in text


# --- chapter 11: the reading of rungs W2 and W3 --------------------------------------------------

@pytest.fixture(scope="module")
def hopper():
    rows, _ = results_data.load_results("hopper_h200.json")
    return [r for r in rows if r.get("status") == "ok" and r.get("tflops")]


def _ratios(rows, impl, base):
    out = {}
    for r in rows:
        if r["impl"] == impl:
            case = {k: r[k] for k in ("mode", "dtype", "D", "N", "causal")}
            out[(r["dtype"], r["D"], r["N"], r["causal"])] = r["tflops"] / _tflops(rows, base, **case)
    return out


@needs_data
def test_chapter_11_w2_reading(hopper):
    w2 = _ratios(hopper, "hopper-w2", "sdpa-flash")
    assert len(w2) == 16                      # both dtypes, D 64/128, N 4096/16384, both masks
    # "ahead of FlashAttention-2 everywhere" and "cuDNN stays ahead of W2 in every case"
    assert all(x > 1 for x in w2.values())
    assert all(x < 1 for x in _ratios(hopper, "hopper-w2", "sdpa-cudnn").values())
    # "comes to 1.5 at one point of the sweep only, D = 128, N = 16384, causal, in both dtypes"
    for dtype in ("float16", "bfloat16"):
        best = max((k for k in w2 if k[0] == dtype), key=w2.get)
        assert best == (dtype, 128, 16384, True), best
    assert [k for k, x in w2.items() if x >= 1.5] == [k for k in w2 if k[1:] == (128, 16384, True)]
    # "at D = 64 it is ahead by less than a quarter", and every D = 64 case behind every D = 128 one
    assert max(x for k, x in w2.items() if k[1] == 64) < min(x for k, x in w2.items() if k[1] == 128)
    assert all(x < 1.25 for k, x in w2.items() if k[1] == 64)
    # W1, where W2 started from: "level with FlashAttention-2" at D = 128
    w1 = _ratios(hopper, "hopper-w1", "sdpa-flash")
    assert all(0.9 < x < 1.2 for k, x in w1.items() if k[1] == 128)


@needs_data
def test_chapter_11_w3_reading(hopper):
    w3 = _ratios(hopper, "hopper-w3", "sdpa-flash")
    assert len(w3) == 16
    d128 = {k: x for k, x in w3.items() if k[1] == 128}
    d64 = {k: x for k, x in w3.items() if k[1] == 64}
    # "at or above 1.5 times FlashAttention-2 in every case" at D = 128, "short of 1.5 in every case" at 64
    assert all(x >= 1.5 for x in d128.values()) and all(x < 1.5 for x in d64.values())
    # "for each dtype and mask further above it at N = 16384 than at 4096" (D = 128); at D = 64
    # "shorter at N = 4096 than at 16384", every case at 4096 below every case at 16384
    for (dtype, d, n, causal), x in d128.items():
        if n == 4096:
            assert x < d128[(dtype, d, 16384, causal)], (dtype, causal)
    assert min(x for k, x in d64.items() if k[2] == 16384) > max(x for k, x in d64.items() if k[2] == 4096)
    # "level with cuDNN at N = 16384, causal (within a few percent of 1); everywhere else cuDNN stays ahead"
    cudnn = _ratios(hopper, "hopper-w3", "sdpa-cudnn")
    for k, x in cudnn.items():
        if k[1:] == (128, 16384, True):
            assert abs(x - 1) < 0.05, (k, x)
        else:
            assert x < 1, (k, x)
    # "cuDNN itself is only around 1.5 at this head dim" (D = 64)
    c64 = [x for k, x in _ratios(hopper, "sdpa-cudnn", "sdpa-flash").items() if k[1] == 64]
    assert min(c64) < 1.5 < max(c64) < 1.6
    # "W3 is the fastest of our forwards" in every case but its own three-consumer build at D = 64, which is
    # the fastest there (cuda_attention's sm_90 forward: configs.HOPPER_CONSUMERS)
    ours = {r["impl"] for r in hopper if r["impl"].startswith(("hopper-", "cuda"))} - {"hopper-w3", "hopper-w3[c3]"}
    assert {"hopper-w1", "hopper-w2", "cuda-mma"} <= ours
    for impl in ours:
        assert all(x > 1 for x in _ratios(hopper, "hopper-w3", impl).values()), impl
        assert all(x > 1 for x in _ratios(hopper, "hopper-w3[c3]", impl).values()), impl
    assert all(x > 1 for x in _ratios(hopper, "hopper-w3[c3]", "hopper-w3").values())
    # the prediction (perflog_hopper.md): the causal D = 128 cases inside their ranges (float16) or
    # above them (bfloat16); the non-causal ones at N = 4096 at the bottom of theirs (560-620 TFLOP/s,
    # ratio 1.65-1.8) or below: float16 below, bfloat16 inside in TFLOP/s (its lowest sixth) and below in ratio
    tflops = {(r["dtype"], r["D"], r["N"], r["causal"]): r["tflops"] for r in hopper if r["impl"] == "hopper-w3"}
    for (dtype, d, n, causal), t in tflops.items():
        if d == 128 and causal:
            lo, hi = (520, 580) if n == 16384 else (440, 500)
            assert (lo <= t <= hi) if dtype == "float16" else t > hi, (dtype, n, t)
        if d == 128 and not causal and n == 4096:
            assert (t < 560) if dtype == "float16" else (560 <= t < 580), (dtype, t)
            assert w3[(dtype, d, n, causal)] < 1.65, dtype


def test_cuda_attention_runs_the_measured_hopper_rung():
    # README, chapters 09 and 11: "cuda_attention runs W3 as its forward on an H100 or H200"
    import torch

    from flashtut.cuda import configs

    assert configs.HOPPER_DEFAULT == "w3"
    choice = configs.choose_forward("auto", 90, torch.float16, 128, (13, 0))
    assert (choice.kernel, choice.variant, choice.consumers) == ("wgmma", "w3", 2)
    # "with three consumer warpgroups at D = 64": the build measured faster there (hopper-w3[c3])
    choice = configs.choose_forward("auto", 90, torch.float16, 64, (13, 0))
    assert (choice.kernel, choice.variant, choice.consumers) == ("wgmma", "w3", 3)
    # README, chapters 08 and 09, the CUDA logs: "at D = 128 with the TMA store of its output", at D = 64 the
    # three consumers "taking turns" and no store, the short query block first and the warpgroup index uniform
    assert choice.options == (("c3_turns", True), ("tail_first", True), ("uniform_wg", True))
    choice = configs.choose_forward("auto", 90, torch.bfloat16, 128, (13, 0))
    assert choice.options == (("tma_store", True),)
    import json

    nb08 = json.loads((ROOT / "notebooks" / "08_cuda.ipynb").read_text())
    text08 = " ".join(" ".join("".join(c["source"]).split()) for c in nb08["cells"] if c["cell_type"] == "markdown")
    assert ("at $D = 128$ with the TMA store of its output, at $D = 64$ with three consumer warpgroups "
            "taking turns on the tensor cores") in text08
    log = " ".join((ROOT / "book" / "perflog_cuda.md").read_text().split())
    assert ("at D = 128 two consumer warpgroups with ping-pong and the output written by a TMA store; at "
            "D = 64 three consumers taking turns in a ring, storing from registers, the short query block "
            "first; `configs.HOPPER_OPTIONS`") in log


# --- chapter 09: the machine code and the DISABLE_MMA_V3 switch -----------------------------------

@pytest.fixture(scope="module")
def sass():
    rows, _ = results_data.load_results("sass_evidence_h200.json")
    return rows


def _matrix_kernels(rows, impl, setting):
    out = {}
    for r in rows:
        c = r.get("counts") or {}
        if (r.get("kind") == "sass" and r["impl"] == impl and r.get("setting", "default") == setting
                and c.get("HGMMA", 0) + c.get("HMMA", 0) > 0):
            out.setdefault(r["kernel"].split("(")[0], []).append(c)
    return out


@needs_data
def test_chapter_09_instruction_counts(sass):
    default = _matrix_kernels(sass, "triton", "default")
    off = _matrix_kernels(sass, "triton", "DISABLE_MMA_V3=1")
    assert set(default) == set(off) and len(default) == 3        # forward, dK/dV, dQ
    assert all(c["HGMMA"] > 0 and c.get("HMMA", 0) == 0 for cs in default.values() for c in cs)
    assert all(c.get("HGMMA", 0) == 0 and c["HMMA"] > 0 for cs in off.values() for c in cs)
    # "every mma.sync also costs ldmatrix instructions that a wgmma reading shared memory does not"
    for name in default:
        assert min(c["LDSM"] for c in off[name]) > max(c.get("LDSM", 0) for c in default[name]), name
    flash = _matrix_kernels(sass, "sdpa-flash", "default")
    assert flash and all(c["HMMA"] > 0 and c.get("HGMMA", 0) == 0 and c.get("UTMALDG", 0) == 0
                         for cs in flash.values() for c in cs)


@needs_data
def test_chapter_09_the_switch_flips_the_ratio(sass):
    speed = [r for r in sass if r.get("kind") == "speed" and r["impl"].startswith("triton")]
    for mode in ("fwd", "bwd"):
        on = [r["speedup_vs_sdpa_flash"] for r in speed if r["mode"] == mode and r["setting"] == "default"]
        off = [r["speedup_vs_sdpa_flash"] for r in speed if r["mode"] == mode and r["setting"] != "default"]
        assert len(on) == len(off) == 4
        assert min(on) > 1.2 and max(off) < 0.9, (mode, on, off)   # "well above 1 to below it"
    # "compiled to mma.sync, our Triton kernels land where our mma.sync CUDA kernels are"
    protocol, _ = results_data.load_results("bench_h200_protocol_d128_float16.json")
    for r in speed:
        if r["setting"] != "default":
            case = dict(mode=r["mode"], N=r["N"], causal=r["causal"], D=128, dtype="float16")
            cuda = _tflops(protocol, "cuda", **case) / _tflops(protocol, "sdpa-flash", **case)
            assert abs(r["speedup_vs_sdpa_flash"] - cuda) < 0.1, (case, r["speedup_vs_sdpa_flash"], cuda)
    # SDPA flash, which Triton does not compile, ran at one speed in both processes
    base = {(r["mode"], r["N"], r["causal"]): r["tflops"] for r in sass
            if r.get("kind") == "speed" and r["impl"] == "sdpa-flash"}
    again = [((r["mode"], r["N"], r["causal"]), r["tflops"]) for r in sass
             if r.get("kind") == "speed" and r["impl"].startswith("sdpa-flash[")]
    assert again and all(abs(t / base[k] - 1) < 0.05 for k, t in again)


@needs_data
def test_chapter_09_instruction_ceilings():
    rows, _ = results_data.load_results("h200_instruction_peaks.json")
    ceiling = {(r["instruction"], r["dtype"]): r["tflops"] for r in rows if r.get("what") == "instruction"}
    assert len(ceiling) == 4                      # two instructions, two dtypes: none merged away
    for dtype in ("float16", "bfloat16"):
        assert ceiling[("mma.sync", dtype)] < ceiling[("wgmma", dtype)]
    # "no kernel built on mma.sync passes it": the measured mma.sync kernels stay below the ceiling
    speed, _ = results_data.load_results("bench_h200*.json")
    top = max(r["tflops"] for r in speed if r["impl"] in ("sdpa-flash", "cuda") and r.get("tflops"))
    assert top < min(ceiling[("mma.sync", d)] for d in ("float16", "bfloat16"))


# --- chapter 12's reading of the real-model kernel run -------------------------------------------

@needs_data
def test_chapter_12_quotes_the_real_model_run():
    import json

    from flashtut.bench.real_models import summary_rows

    nb = json.loads((ROOT / "notebooks" / "12_real_model.ipynb").read_text())
    text = " ".join(" ".join("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")
    rows, _ = results_data.load_results("real_models_h200.json")
    header, body = summary_rows(rows)
    ratio = {(b[0], b[1]): float(b[-1]) for b in body}
    gqa = [v for (case, _), v in ratio.items() if case.startswith("grouped")]
    window = [v for (case, _), v in ratio.items() if case.startswith("window")]
    assert "grouped heads 1.2 to 1.5 times" in text and 1.15 <= min(gqa) and max(gqa) < 1.55
    assert 1.05 <= min(window) and max(window) < 1.45
    ms = {(r["layout"], r["mode"]): r["ms"] for r in rows if r["group"] == "varlen" and r["impl"] == "triton"}
    quoted = (f"takes {ms['packed', 'fwd']:.2f} ms forward and {ms['packed', 'bwd']:.2f} ms backward where the "
              f"padded one takes {ms['padded', 'fwd']:.2f} ms and {ms['padded', 'bwd']:.2f} ms")
    assert quoted in text, quoted
    assert f"D = 128, {rows[0]['dtype']}, forward" in text


# --- chapter 08 and the backward's log: the warp grid's run -------------------------------------

@needs_data
def test_chapter_08_quotes_the_warp_grid_run():
    import json

    from flashtut.bench.cuda_ladder import BWD_GRID_COLUMNS
    from flashtut.bench.report import column_impl, ratio_summary
    from flashtut.cuda import configs as cf

    nb = json.loads((ROOT / "notebooks" / "08_cuda.ipynb").read_text())
    text = " ".join(" ".join("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")
    log = " ".join((ROOT / "book" / "perflog_cuda_bwd.md").read_text().split())
    rows, _ = results_data.load_results("cuda_ladder_bwd_h200.json")
    old, det = BWD_GRID_COLUMNS["old default"], "cuda-bwd-separate-dq"
    new = {D: "cuda-bwd-" + next(n for n, c in cf.experiment_configs(D).items()
                                 if c == cf.pick_config(D, 90, cf.SMEM_PER_BLOCK[90])) for D in (128, 64)}
    s = {(x["D"], x["impl"]): x for x in ratio_summary(rows, {det, *new.values(), *old.values()})}
    gain = [s[D, new[D]]["gmean"] / s[D, column_impl(old, D)]["gmean"] - 1 for D in (128, 64)]
    assert f"it gained {gain[0]:.0%} and {gain[1]:.0%}" in text
    span = lambda impls: (min(s[k]["min"] for k in impls), max(s[k]["max"] for k in impls))  # noqa: E731
    lo, hi = span([(D, new[D]) for D in (128, 64)])
    old_lo, old_hi = span([(D, column_impl(old, D)) for D in (128, 64)])
    assert f"{lo:.2f} to {hi:.2f}x over the 16 cases against {old_lo:.2f} to {old_hi:.2f}x before" in text
    cost = [s[D, new[D]]["gmean"] / s[D, det]["gmean"] - 1 for D in (128, 64)]
    assert f"takes {cost[0]:.0%} longer at $D = 128$ and {cost[1]:.0%} longer at $D = 64$" in text
    assert f"the deterministic backward takes {cost[0]:.0%} longer" in log
    assert f"({cost[1]:.0%} longer;" in log
    doc = " ".join((ROOT / "src" / "flashtut" / "cuda" / "attention.py").read_text().split())
    assert f"the backward takes {cost[1]:.0%} (D = 64) to {cost[0]:.0%} (D = 128) longer" in doc
    assert f"{cost[1] * 100:.0f} to {cost[0]:.0%} slower on an H200" in doc
    # the figures before the grid, from the first ladder run (the log's earlier section)
    first, _ = results_data.load_results("cuda_ladder_h200.json")
    before = {(x["D"], x["impl"]): x["gmean"] for x in ratio_summary(
        first, [det, "cuda-bwd-atomic-dq-w8-1bar-v4", "cuda-bwd-atomic-dq-w8-1bar"])}
    was = [before[128, "cuda-bwd-atomic-dq-w8-1bar-v4"] / before[128, det] - 1,
           before[64, "cuda-bwd-atomic-dq-w8-1bar"] / before[64, det] - 1]
    assert f"before the grid, {was[0]:.0%} and {was[1]:.0%}" in text
    assert f"Before the grid it was {was[0]:.0%} and {was[1]:.0%}." in log


@needs_data
def test_chapter_08_reading_of_forward_steps_4_to_7():
    # "Steps 4 and 5 each bought about 1% ... the tensor pipe rose only from 50% to 54% ...
    # Steps 6 and 7 lost ground"
    from flashtut.bench.report import ratio_summary

    rows, prov = results_data.load_results("cuda_ladder_h200.json")
    steps = [f"cuda-v{i}" for i in range(3, 8)]
    g = {s["impl"]: s["gmean"] for s in ratio_summary(rows, steps, mode="fwd") if s["D"] == 128}
    assert 0.005 < g["cuda-v4"] / g["cuda-v3"] - 1 < 0.02 and 0.005 < g["cuda-v5"] / g["cuda-v4"] - 1 < 0.02
    assert g["cuda-v6"] < g["cuda-v5"] and g["cuda-v7"] < g["cuda-v5"]
    pipe = {p["impl"]: p["tensor_pipe_pct"] for p in prov[0]["ncu"]["rows"]}
    assert round(pipe["cuda-v3"]) == 50 and round(pipe["cuda-v5"]) == 54
    text = (ROOT / "notebooks" / "08_cuda.ipynb").read_text()
    assert "Steps 4 and 5 each bought about 1%" in text and "from 50% to 54%" in text


# --- chapter 11 and the Hopper log: Nsight Compute, the tensor maps A/B, the ring depth -----------

def _log():
    return " ".join((ROOT / "book" / "perflog_hopper.md").read_text().split())


def _chapter_11_text():
    import json

    nb = json.loads((ROOT / "notebooks" / "11_hopper.ipynb").read_text())
    return " ".join(" ".join("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")


def _span(values, fmt="{:.2f}"):
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}"


@needs_data
def test_hopper_log_summary_ranges(hopper):
    """The log's rung table and the W3 reading quote ranges of hopper_h200.json."""
    log = _log()
    ratios = {impl: _ratios(hopper, impl, "sdpa-flash")
              for impl in ("hopper-w1", "hopper-w2", "hopper-w3", "sdpa-cudnn")}
    by_d = lambda impl, d: [x for k, x in ratios[impl].items() if k[1] == d]  # noqa: E731
    for impl, rung in (("hopper-w1", "W1"), ("hopper-w2", "W2"), ("hopper-w3", "W3")):
        cells = f"| {_span(by_d(impl, 128))}x | {_span(by_d(impl, 64))}x |"
        row = next(line for line in (ROOT / "book" / "perflog_hopper.md").read_text().splitlines()
                   if line.startswith(f"| {rung} |"))
        assert cells in row, (rung, cells, row)
    c3 = _ratios(hopper, "hopper-w3[c3]", "sdpa-flash")
    row = next(line for line in (ROOT / "book" / "perflog_hopper.md").read_text().splitlines()
               if line.startswith("| W3, three consumers |"))
    assert f"| - | {_span(c3.values())}x |" in row, row
    assert f"cuDNN, for scale, is at {_span(by_d('sdpa-cudnn', 128))}x and {_span(by_d('sdpa-cudnn', 64))}x" in log
    w3 = {(r["dtype"], r["D"], r["N"], r["causal"]): r["tflops"] for r in hopper if r["impl"] == "hopper-w3"}
    over_w2 = _ratios(hopper, "hopper-w3", "hopper-w2")
    for d in (128, 64):
        tf = [t for k, t in w3.items() if k[1] == d]
        w2 = _span([x for k, x in over_w2.items() if k[1] == d])
        quoted = (f"D = {d}: {_span(tf, '{:.0f}')} TFLOP/s, {_span(by_d('hopper-w3', d))}x SDPA flash"
                  f"{' and' if d == 128 else ','} {w2}x W2")
        assert quoted in log, quoted


@pytest.fixture(scope="module")
def maps_ab():
    rows, _ = results_data.load_results("hopper_ab_h200.json")
    tf = {(r["impl"], r["D"], r["N"], r["causal"], r["warmup_ms"]): r["tflops"] for r in rows}
    assert len(tf) == 48
    return tf


def _pct(a, b):
    return 100 * (a / b - 1)


@needs_data
def test_tensor_map_ab_claims(maps_ab):
    """The log and chapter 11 on the pinned tensor maps: faster in every comparison at N = 4096,
    both signs at N = 16384; the budget's effect as the log states it."""
    tf = maps_ab
    cases = sorted({k[1:] for k in tf})
    gain = {n: [_pct(tf["hopper-w3", *c], tf["hopper-w3[pageable-maps]", *c]) for c in cases if c[1] == n]
            for n in (4096, 16384)}
    assert len(gain[4096]) == len(gain[16384]) == 8
    assert min(gain[4096]) > 0                                          # "all 8 comparisons"
    assert min(gain[16384]) < 0 < max(gain[16384])                      # "both signs"
    log = _log()
    assert f"faster in all 8 comparisons (4 cases, 2 budgets), by {min(gain[4096]):+.1f}% to {max(gain[4096]):+.1f}%" in log
    assert f"N = 16384: {min(gain[16384]):+.1f}% to {max(gain[16384]):+.1f}%, both signs" in log
    assert f"It cost W3 up to {max(gain[4096]):.0f}% at N = 4096" in log
    # the budget: 25 / 100 against 5 / 40 ms
    pairs = sorted({(impl, D, N, causal) for impl, D, N, causal, _ in tf})
    move = {p: _pct(tf[(*p, 25)], tf[(*p, 5)]) for p in pairs}
    flash = {p: x for p, x in move.items() if p[0] == "sdpa-flash"}
    f4096 = [x for p, x in flash.items() if p[2] == 4096]
    assert f"SDPA flash alone moves by {min(f4096):+.1f}% to {max(f4096):+.1f}% between the two budgets" in log
    assert max(abs(x) for p, x in flash.items() if p[2] == 16384) <= 2.05        # "by at most 2.0%"
    assert "noise of the order of 5-13%" in log and 5 <= max(abs(x) for x in f4096) < 13.5
    pinned = [x for p, x in move.items() if p[0] == "hopper-w3"]
    paged = [x for p, x in move.items() if p[0] == "hopper-w3[pageable-maps]"]
    assert sum(x < 0 for x in pinned + paged) == 14 and sum(x < 0 for x in paged) == 8
    assert sum(x < 0 for x in pinned) == 6 and f"by up to {-min(pinned):.1f}%" in log
    assert sum(x > 0 for x in flash.values()) == 7
    assert "slower in 14 of 16 comparisons (pinned in 6 of 8" in log and "SDPA flash faster in 7 of 8" in log
    text = _chapter_11_text()
    assert "At $N = 4096$, where one call is shortest, the pinned copy wins every comparison" in text
    assert "at $N = 16384$ the difference goes both ways" in text


@needs_data
def test_ring_depth_claims():
    """3 stages slower everywhere, 4 stages slower at D = 64 and too large at D = 128 (log, chapter 11)."""
    rows, _ = results_data.load_results("hopper_ring_h200.json")
    by = {(r["impl"], r["D"], r["N"], r["causal"]): r for r in rows}
    base = {k[1:]: r["tflops"] for k, r in by.items() if k[0] == "hopper-w3"}
    assert len(base) == 8
    loss = {}
    for stages in ("s3", "s4"):
        for case, t in base.items():
            r = by[(f"hopper-w3[{stages}]", *case)]
            if stages == "s4" and case[0] == 128:
                assert r["status"] == "error" and "shared memory" in r["reason"], r
                continue
            assert r["status"] == "ok" and r["tflops"] < t, (stages, case)      # "made W3 no faster"
            loss.setdefault((stages, case[0]), []).append(-_pct(r["tflops"], t))
    log = _log()
    s3 = f"by {_span(loss['s3', 64], '{:.1f}')}% at D = 64 and {_span(loss['s3', 128], '{:.1f}')}% at D = 128"
    assert s3 in log, s3
    assert f"4 stages: {_span(loss['s4', 64], '{:.1f}')}% slower at D = 64" in log
    reason = next(r["reason"] for r in rows if r["status"] == "error")
    need = int(re.search(r"needs (\d+) bytes", reason).group(1))
    allow = int(re.search(r"allows (\d+)", reason).group(1))
    assert need > allow
    assert f"needs {need} bytes of shared memory per block; this GPU allows {allow}" in log
    assert "made W3 no faster at either head dim" in _chapter_11_text()


def _chapter_09_text():
    import json

    nb = json.loads((ROOT / "notebooks" / "09_results.ipynb").read_text())
    return " ".join(" ".join("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")


@needs_data
def test_chapter_09_reading_of_the_mma_sync_kernels_after_chapter_8s_ladder():
    # "Chapter 8's mma.sync kernels run level with sdpa-flash (0.95 to 1.03 times forward, 0.98 to 1.06
    # backward)"
    rows, _ = results_data.load_results("cuda_protocol_h200.json")
    span = {}
    for mode in ("fwd", "bwd"):
        flash = {(r["D"], r["N"], r["dtype"], r["causal"]): r["tflops"] for r in rows
                 if r["impl"] == "sdpa-flash" and r["mode"] == mode}
        ratios = [r["tflops"] / flash[(r["D"], r["N"], r["dtype"], r["causal"])] for r in rows
                  if r["impl"] == "cuda-mma" and r["mode"] == mode]
        assert len(ratios) == 16
        # "level with it": within 10% either way in every case, where W3 and cuDNN are 1.5 to 2 times ahead
        assert 0.9 < min(ratios) and max(ratios) < 1.1, (mode, min(ratios), max(ratios))
        span[mode] = f"{min(ratios):.2f} to {max(ratios):.2f}"
    assert (f"chapter 8's `mma.sync` kernels run level with `sdpa-flash` ({span['fwd']} times forward, "
            f"{span['bwd']} backward)") in _chapter_09_text()


# --- W3 with three consumer warpgroups at D = 64 (hopper-w3[c3]): the log, chapters 11 and 09 ----------

@needs_data
def test_three_consumer_claims(hopper):
    c3 = _ratios(hopper, "hopper-w3[c3]", "sdpa-flash")
    assert len(c3) == 8 and {k[1] for k in c3} == {64}
    gain = {k: 100 * (x - 1) for k, x in _ratios(hopper, "hopper-w3[c3]", "hopper-w3").items()}
    cudnn = _ratios(hopper, "hopper-w3[c3]", "sdpa-cudnn")
    w3_cudnn = [x for k, x in _ratios(hopper, "hopper-w3", "sdpa-cudnn").items() if k[1] == 64]
    short = {k for k, x in c3.items() if x < 1.5}
    fp16, bf16 = ("float16", 64, 4096, True), ("bfloat16", 64, 4096, True)
    # "met in 6 of 8 cases ... The misses are N = 4096, causal"; "passes cuDNN in the same 6"
    assert short == {fp16, bf16}
    assert {k for k, x in cudnn.items() if x < 1} == short
    # "the two they miss ... gained least over W3"
    assert max(gain[k] for k in short) < min(g for k, g in gain.items() if k not in short)
    # "inside the range in 6 of 8 cases, above it in bfloat16 at N = 16384" (predicted 1.40-1.60)
    above = {k for k, x in c3.items() if x > 1.60}
    assert above == {("bfloat16", 64, 16384, False), ("bfloat16", 64, 16384, True)}
    assert all(1.40 <= x for x in c3.values())
    causal = [g for k, g in gain.items() if k[3]]
    full = [g for k, g in gain.items() if not k[3]]
    log = _log()
    for quoted in (
            f"{_span(c3.values())}x (+{min(gain.values()):.1f}% to +{max(gain.values()):.1f}% over W3)",
            f"1.45x in float16 and {c3[bf16]:.3f}x in bfloat16 (the table rounds it to {c3[bf16]:.2f})",
            f"(+{min(causal):.1f}% to +{max(causal):.1f}%, against +{min(full):.1f}% to +{max(full):.1f}% not causal)",
            f"0.98-1.10x, ahead in 6 of 8 cases",
            f"({cudnn[fp16]:.2f}x float16, {cudnn[bf16]:.2f}x bfloat16)",
            f"every D = 64 case ({_span(w3_cudnn)}x)",
            f"bfloat16 at N = 16384 ({c3[('bfloat16', 64, 16384, True)]:.2f}x causal, "
            f"{c3[('bfloat16', 64, 16384, False)]:.2f}x not causal)",
            "At D = 64 the two-consumer W3 meets it in no case and the three-consumer build in 6 of 8"):
        assert quoted in log, quoted
    assert f"{c3[fp16]:.2f}x in float16" in log and _span(cudnn.values()) == "0.98-1.10"
    assert max(w3_cudnn) < 1
    text = _chapter_11_text()
    lo, hi = _span(c3.values()).split("-")
    assert f"Against the prediction: {lo} to {hi} times `sdpa-flash` for 1.40 to 1.60 predicted" in text
    assert "inside the range in 6 of 8 cases, above it in bfloat16 at $N = 16384$" in text
    assert "reach 1.5 in 6 of the 8 cases and pass cuDNN in the same 6" in text
    assert f"{c3[bf16]:.3f} in bfloat16 shows as {c3[bf16]:.2f} in the table" in text


# --- the protocol run of cuda_attention (cuda_protocol_h200.json): the CUDA logs and the Hopper log ----

def _protocol_ratios(rows):
    """ratios(impl, base, mode) -> {(dtype, D, N, causal): impl's TFLOP/s over base's} for one version of
    cuda_protocol_h200.json."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("tflops")]

    def ratios(impl, base, mode="fwd"):
        return {(r["dtype"], r["D"], r["N"], r["causal"]): r["tflops"] / _tflops(
            ok, base, **{k: r[k] for k in ("mode", "dtype", "D", "N", "causal")})
            for r in ok if r["impl"] == impl and r["mode"] == mode}
    return ratios


def _by_d(x, d):
    return [v for k, v in x.items() if k[1] == d]


def _run_label(prov):
    """("08:42 UTC", "758b193"): how the logs name a run of the protocol file, from its provenance."""
    return f"{prov['date'][11:16]} UTC", prov["git"]["commit"][:7]


@needs_data
def test_protocol_claims():
    """What the logs say of the file's version of 08:42 UTC (commit 758b193), the protocol run with three
    consumers taking turns at D = 64 (the current version's claims: test_protocol_claims_now)."""
    rows, prov = _protocol_version(PROTOCOL_0842)
    ratios = _protocol_ratios(rows)
    cuda, cudnn = ratios("cuda", "sdpa-flash"), ratios("sdpa-cudnn", "sdpa-flash")
    vs_cudnn = ratios("cuda", "sdpa-cudnn")
    by = _by_d
    when, commit = _run_label(prov)
    assert (when, commit) == ("08:42 UTC", "758b193")
    fp16, bf16 = ("float16", 64, 4096, True), ("bfloat16", 64, 4096, True)
    # "at least 1.5 in every case", the lowest named; the two cases below 1.5 in the previous version and in
    # chapter 11's run of the three-consumer build are N = 4096, causal at D = 64
    assert min(cuda.values()) >= 1.5
    low = min(cuda, key=cuda.get)
    lowest = (f"the lowest {cuda[low]:.3f}x, {low[0]}, D = {low[1]}, N = {low[2]}, "
              f"{'causal' if low[3] else 'not causal'}")
    log = " ".join((ROOT / "book" / "perflog_cuda.md").read_text().split())
    behind64 = {k for k, v in vs_cudnn.items() if k[1] == 64 and v < 1}
    assert behind64 == {bf16}
    ahead128 = {k for k, v in vs_cudnn.items() if k[1] == 128 and v > 1}
    assert ahead128 == {k for k in vs_cudnn if k[1] == 128 and k[2] == 16384}
    for quoted in (
            f"The file's version of {when} (commit {commit}), the turns without the two options: "
            f"`cuda_attention`'s forward (`cuda`): {_span(by(cuda, 128))}x SDPA flash at D = 128 and "
            f"{_span(by(cuda, 64))}x at D = 64, at least 1.5 in every case ({lowest})",
            f"Against cuDNN in the same process: {_span(by(vs_cudnn, 128))}x at D = 128 (ahead in "
            f"{len(ahead128)} of 8 cases, those at N = 16384) and {_span(by(vs_cudnn, 64))}x at D = 64 (ahead in "
            f"{8 - len(behind64)} of 8, behind only in bfloat16 at N = 4096, causal, {vs_cudnn[bf16]:.3f}x)",
            f"({_span(by(cudnn, 128))}x and {_span(by(cudnn, 64))}x here,"):
        assert quoted in log, quoted
    # the TMA store that cuda runs at D = 128 only, measured in one process: faster in every D = 128 case,
    # slower in every D = 64 case with three consumers
    store = _tma_store_gain()
    assert min(store[128]) > 0 > max(store[64])
    assert (f"+{min(store[128]):.1f}% to +{max(store[128]):.1f}% over W3 without it at D = 128, in every case, "
            f"and {min(store[64]):.1f}% to {max(store[64]):.1f}% at D = 64 with three consumers") in log
    assert f"also has the TMA store, +{min(store[128]):.1f}% to +{max(store[128]):.1f}% in one process" in log
    # the three consumers' turns that cuda runs at D = 64, measured in one process: faster in every case, and
    # least in the two cases that crossed 1.5 ("against +1.6% and +1.0% for the turns in one process")
    from flashtut.bench.report import gains

    turns_rows, turns_prov = results_data.load_results("hopper_turns_h200.json")
    turns = gains(turns_rows, "hopper-w3[c3,turns]", "hopper-w3[c3]")[64]
    assert min(turns.values()) > 0 and len(turns) == 8
    span = f"+{min(turns.values()):.1f}% to +{max(turns.values()):.1f}%"
    assert (f"(`hopper_turns_h200.json`, {turns_prov[0]['date'][11:16]} UTC): {span} over three consumers "
            "without turns, in every case") in log
    assert f"at D = 64 the turns, {span};" in log
    assert (f"against +{turns[(4096, 'float16', True)]:.1f}% and +{turns[(4096, 'bfloat16', True)]:.1f}% for "
            "the turns in one process") in log
    # "In `hopper_turns_h200.json` itself (25 / 100 ms budgets) the build with turns is at 1.47x and 1.49x SDPA
    # flash in the same two cases, below 1.5"
    in_run = _ratios([r for r in turns_rows if r.get("tflops")], "hopper-w3[c3,turns]", "sdpa-flash")
    assert max(in_run[fp16], in_run[bf16]) < 1.5
    import json

    config = json.loads(results_data.data_path("hopper_turns_h200.json").read_text())["config"]
    assert (f"In `hopper_turns_h200.json` itself ({config['warmup_ms']:.0f} / {config['rep_ms']:.0f} ms budgets) "
            f"the build with turns is at {in_run[fp16]:.2f}x and {in_run[bf16]:.2f}x SDPA flash in the same two cases, below 1.5") in log
    # the mma.sync forward's one miss of issue 13's floor, in the hopper preset's run of the same shape
    hop, _ = results_data.load_results("hopper_h200.json")
    mma = _tflops(hop, "cuda-mma", mode="fwd", dtype="float16", D=128, N=4096, causal=False) / _tflops(
        hop, "sdpa-flash", mode="fwd", dtype="float16", D=128, N=4096, causal=False)
    assert f"put the same forward at {mma:.2f}x (03:18 UTC)" in log
    # the Hopper log: its intro (the two cases chapter 11's three-consumer build left below 1.5), the
    # three-consumer section's bullet and the build options' section
    c3 = _ratios([r for r in hop if r.get("status") == "ok" and r.get("tflops")], "hopper-w3[c3]", "sdpa-flash")
    assert {k for k, x in c3.items() if x < 1.5} == {fp16, bf16}
    hopper_log = _log()
    for quoted in (
            f"(`cuda_protocol_h200.json`, {when}, budgets of 5 / 40 ms",
            f"its forward is {_span(by(cuda, 128))}x SDPA flash at D = 128 and {_span(by(cuda, 64))}x at D = 64, "
            f"at least 1.5 in every case, the same two included ({cuda[fp16]:.3f}x float16, "
            f"{cuda[bf16]:.3f}x bfloat16)",
            f"The file's version of {when} (commit {commit}), where `cuda` runs this build with its consumers "
            f"taking turns (section \"Turns among three consumers\"), has {_span(by(cuda, 64))}x SDPA flash and "
            f"{_span(by(vs_cudnn, 64))}x cuDNN, ahead in {8 - len(behind64)} of 8 cases",
            f"file's version of {when} (commit {commit}: the same build at D = 128, three consumers taking turns "
            f"at D = 64) has {_span(by(cuda, 128))}x and {_span(by(cuda, 64))}x."):
        assert quoted in hopper_log, quoted


@needs_data
def test_protocol_claims_now():
    """What the logs, the README and chapters 09 and 11 say of cuda_protocol_h200.json as committed: the
    run with the short query block first and the uniform warpgroup index at D = 64."""
    rows, prov = results_data.load_results("cuda_protocol_h200.json")
    ratios = _protocol_ratios(rows)
    cuda, vs_cudnn = ratios("cuda", "sdpa-flash"), ratios("cuda", "sdpa-cudnn")
    by = _by_d
    when, commit = _run_label(prov[0])
    old, old_prov = _protocol_version(PROTOCOL_0842)
    before = _protocol_ratios(old)("cuda", "sdpa-flash")
    fp16, bf16 = ("float16", 64, 4096, True), ("bfloat16", 64, 4096, True)
    assert min(cuda.values()) >= 1.5
    low = min(cuda, key=cuda.get)
    assert low == fp16
    ahead128 = sorted(k for k, v in vs_cudnn.items() if k[1] == 128 and v > 1)
    assert ahead128 == [("bfloat16", 128, 16384, True), ("float16", 128, 16384, True)]
    assert all(v > 1 for k, v in vs_cudnn.items() if k[1] == 64)
    moves = _moves(rows, old, "cuda")
    log = " ".join((ROOT / "book" / "perflog_cuda.md").read_text().split())
    for quoted in (
            f"`book/data/cuda_protocol_h200.json` was measured again (2026-12-02 {when}, commit {commit}) after",
            f"In this run `cuda` is at {_span(by(cuda, 128))}x SDPA flash at D = 128 and {_span(by(cuda, 64))}x at "
            f"D = 64, at least 1.5 in every case (the lowest {cuda[low]:.3f}x, float16, D = 64, N = 4096, causal, "
            f"where it was {before[fp16]:.3f}x at 08:42 UTC); against cuDNN in the same process "
            f"{_span(by(vs_cudnn, 128))}x at D = 128 (ahead in 2 of 8 cases, causal at N = 16384) and "
            f"{_span(by(vs_cudnn, 64))}x at D = 64, ahead in all 8.",
            f"between the two calls `cuda`'s TFLOP/s at D = 64 moved by {_pct_span(by(moves, 64))} case by case, "
            f"{moves[fp16]:+.1f}% and {moves[bf16]:+.1f}% in the two N = 4096 causal cases, and at D = 128, where "
            f"its build did not change, by {_pct_span(by(moves, 128))}."):
        assert quoted in log, quoted
    # chapter 09's reading of the ratio table: cuda_attention's forward over every case of the file
    lo, hi = _span(cuda.values()).split("-")
    assert f"`cuda_attention`'s Hopper forward ({lo} to {hi} times)" in _chapter_09_text()
    # the backward: "cuDNN's backward ... SDPA flash at D = 128 and ... at D = 64"
    bwd = ratios("sdpa-cudnn", "sdpa-flash", "bwd")
    ours = ratios("cuda", "sdpa-cudnn", "bwd")
    bwd_log = " ".join((ROOT / "book" / "perflog_cuda_bwd.md").read_text().split())
    assert (f"{_span(by(bwd, 128))}x SDPA flash at D = 128 and {_span(by(bwd, 64))}x at D = 64, so ours runs at "
            f"{_span(by(ours, 128))}x and {_span(by(ours, 64))}x of it") in bwd_log
    assert f"measured again on 2026-12-02 at {when}, commit {commit};" in bwd_log
    readme = " ".join(README.read_text().split())
    assert f"(`book/data/cuda_protocol_h200.json`, 2026-12-02 {when}, which timed cuDNN" in readme
    # the Hopper log's summary of this run
    hopper_log = _log()
    assert (f"`cuda_protocol_h200.json` again, {when}, commit {commit}: forward {_span(by(cuda, 64))}x SDPA flash at "
            f"D = 64 and {_span(by(cuda, 128))}x at D = 128, the weakest case N = 4096 causal at D = 64 at "
            f"{cuda[fp16]:.3f}x (float16) and {cuda[bf16]:.3f}x (bfloat16)") in hopper_log


def _protocol_version(commit):
    """The rows and provenance of cuda_protocol_h200.json as committed at ``commit``, from git history (the
    logs compare the current file with its earlier versions); skips where the checkout has no history."""
    import json
    import subprocess

    try:
        out = subprocess.run(["git", "show", f"{commit}:book/data/cuda_protocol_h200.json"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"no git history with commit {commit} here")
    data = json.loads(out)
    return data["rows"], data["provenance"]


#: the versions of cuda_protocol_h200.json the logs quote: the commit they name it by -> the commit that
#: holds that version, and the name its mma.sync forward had there (2026-12-01 had no cuda-mma yet: cuda was
#: the mma.sync forward)
PROTOCOL_VERSIONS = {"28854c3": ("28854c3", "cuda"), "0c5be1b": ("0c5be1b", "cuda-mma"),
                     "ecf3bd3": ("a29859d", "cuda-mma"), "f397297": ("167bba1", "cuda-mma"),
                     "758b193": ("ed4ca53", "cuda-mma")}
#: the commit holding the file's version of 08:42 UTC (commit 758b193), which the logs' paragraphs on the
#: turns compare with the version before it
PROTOCOL_0842 = "ed4ca53"


def _moves(new, old, impl, keep=lambda k: True):
    """% change of impl's TFLOP/s per case from the rows ``old`` to the rows ``new``, forward."""
    tf = [{(r["dtype"], r["D"], r["N"], r["causal"]): r["tflops"] for r in rows
           if r["impl"] == impl and r["mode"] == "fwd" and r.get("tflops")} for rows in (new, old)]
    return {k: _pct(t, tf[1][k]) for k, t in tf[0].items() if keep(k)}


def _pct_span(values):
    return f"{min(values):+.1f}% to {max(values):+.1f}%".replace("+-", "-")


@needs_data
def test_protocol_history_in_the_files_previous_versions():
    """What the logs and the README say about the earlier versions of cuda_protocol_h200.json, recomputed
    from those versions: the issue-13 table of the mma.sync forward's worst cases, the `cuda` ranges of
    06:11, 03:31 and 01:14 UTC, and how far each figure moved between the last two calls."""
    import statistics

    version = {label: _protocol_version(commit) for label, (commit, _) in PROTOCOL_VERSIONS.items()}
    rows = version["758b193"][0]   # the paragraphs on the turns compare 08:42 UTC with 06:11 UTC
    assert version["ecf3bd3"][1]["git"]["commit"].startswith("ecf3bd3")
    assert version["f397297"][1]["git"]["commit"].startswith("f397297")
    log = " ".join((ROOT / "book" / "perflog_cuda.md").read_text().split())
    # issue 13's table: "| f397297 | 0.966 (float16, D = 128, N = 4096, not causal) | 1.003 | met |"
    for label, (_, impl) in PROTOCOL_VERSIONS.items():
        x = _protocol_ratios(version[label][0])(impl, "sdpa-flash")
        assert len(x) == 16
        k = min(x, key=x.get)
        below = sum(v < 0.95 for v in x.values())
        floor = f"missed in {below} case" + ("s" if below > 1 else "") if below else "met"
        row = (f"| {label} | {x[k]:.3f} ({k[0]}, D = {k[1]}, N = {k[2]}, {'causal' if k[3] else 'not causal'}) "
               f"| {statistics.median(x.values()):.3f} | {floor} |")
        assert row in log, row
    old = version["f397297"][0]
    # "From 06:11 to 08:42 UTC the mma.sync forward's ratio moved case by case by ..."
    ratio = [_protocol_ratios(r)("cuda-mma", "sdpa-flash") for r in (rows, old)]
    mma, flash = _moves(rows, old, "cuda-mma"), _moves(rows, old, "sdpa-flash")
    worst = min(ratio[0], key=ratio[0].get)
    assert (f"ratio moved case by case by {_pct_span([_pct(v, ratio[1][k]) for k, v in ratio[0].items()])}, its "
            f"TFLOP/s by {_pct_span(mma.values())} and SDPA flash's by {_pct_span(flash.values())}; in the case "
            f"that misses, SDPA flash ran {abs(flash[worst]):.1f}% {'faster' if flash[worst] > 0 else 'slower'} and "
            f"the mma.sync forward {abs(mma[worst]):.1f}% {'faster' if mma[worst] > 0 else 'slower'} than at 06:11 "
            "UTC") in log
    # the cuda ranges of the previous versions
    by = _by_d
    cuda = {label: _protocol_ratios(version[label][0])("cuda", "sdpa-flash")
            for label in ("f397297", "ecf3bd3", "0c5be1b")}
    prev = cuda["f397297"]
    fp16, bf16 = ("float16", 64, 4096, True), ("bfloat16", 64, 4096, True)
    assert {k for k, v in prev.items() if v < 1.5} == {fp16, bf16}
    assert (f"had `cuda` at {_span(by(prev, 128))}x and {_span(by(prev, 64))}x (06:11 UTC, three consumers without "
            f"turns at D = 64; below 1.5 only at D = 64, N = 4096, causal: {prev[fp16]:.3f}x float16, "
            f"{prev[bf16]:.3f}x bfloat16), at {_span(by(cuda['ecf3bd3'], 128))}x and {_span(by(cuda['ecf3bd3'], 64))}x "
            f"(03:31 UTC, W3 without the TMA store at D = 128) and at {_span(by(cuda['0c5be1b'], 128))}x and "
            f"{_span(by(cuda['0c5be1b'], 64))}x (01:14 UTC") in log
    # cuDNN's two new places behind cuda at D = 128: the cuda build there unchanged, cuDNN slower in them
    now = _protocol_ratios(rows)("cuda", "sdpa-cudnn")
    then = _protocol_ratios(old)("cuda", "sdpa-cudnn")
    new_ahead = {k for k in now if k[1] == 128 and now[k] > 1 >= then[k]}
    assert new_ahead == {("float16", 128, 16384, False), ("bfloat16", 128, 16384, False)}
    cudnn = _moves(rows, old, "sdpa-cudnn")
    assert (f"cuDNN ran {-cudnn[('bfloat16', 128, 16384, False)]:.1f}% (bfloat16) and "
            f"{-cudnn[('float16', 128, 16384, False)]:.1f}% (float16) slower in them than at 06:11 UTC") in log
    # the turns between two calls: "at D = 64 `cuda`'s TFLOP/s moved by ... and at D = 128 ... by ..."
    cuda_moves = _moves(rows, old, "cuda")
    assert (f"at D = 64 `cuda`'s TFLOP/s moved by {_pct_span(by(cuda_moves, 64))} case by case from 06:11 to "
            f"08:42 UTC, and at D = 128, where its build did not change, by {_pct_span(by(cuda_moves, 128))}") in log
    assert (f"gained {cuda_moves[fp16]:+.1f}% (float16) and {cuda_moves[bf16]:+.1f}% (bfloat16) in TFLOP/s between "
            "the calls") in log
    # the TMA store between the two calls before: "moved by -5.7% to +3.6% case by case from 03:31 to 06:11"
    store_moves = _moves(old, version["ecf3bd3"][0], "cuda", keep=lambda k: k[1] == 128)
    assert (f"at D = 128 `cuda`'s TFLOP/s moved by {_pct_span(store_moves.values())} case by case from 03:31 to "
            "06:11 UTC") in log
    # the backward's geometric means in the earlier versions
    from flashtut.bench.report import ratio_summary

    bwd_log = " ".join((ROOT / "book" / "perflog_cuda_bwd.md").read_text().split())
    g = {label: {(s["impl"], s["D"]): s["gmean"] for s in ratio_summary(version[label][0], ["cuda-mma", "cuda"])}
         for label in ("f397297", "ecf3bd3", "0c5be1b")}
    f, e, z = g["f397297"], g["ecf3bd3"], g["0c5be1b"]
    assert (f"in this file's version of 06:11 UTC (commit f397297) {f['cuda-mma', 128]:.3f} and "
            f"{f['cuda-mma', 64]:.3f} ({f['cuda', 128]:.3f} and {f['cuda', 64]:.3f}), in that of 03:31 UTC (commit "
            f"ecf3bd3) {e['cuda-mma', 128]:.3f} and {e['cuda-mma', 64]:.3f} ({e['cuda', 128]:.3f} and "
            f"{e['cuda', 64]:.3f}), and in that of 01:14 UTC (commit 0c5be1b) {z['cuda-mma', 128]:.3f} and "
            f"{z['cuda-mma', 64]:.3f}.") in bwd_log
    # the Hopper log's sentences about the 06:11 version
    vs_cudnn = {k: v for k, v in then.items() if k[1] == 64}
    hopper_log = _log()
    for quoted in (
            f"the file's version of 06:11 UTC, without the turns, had them below ({prev[fp16]:.3f}x and "
            f"{prev[bf16]:.3f}x)",
            f"(`cuda_protocol_h200.json` as measured at 06:11 UTC, commit f397297, where `cuda` ran this build; "
            f"5 / 40 ms budgets, SDPA cuDNN in the same process, `perflog_cuda.md`): {_span(by(prev, 64))}x SDPA "
            f"flash, below 1.5 again only at N = 4096, causal ({prev[fp16]:.3f}x float16, {prev[bf16]:.3f}x "
            f"bfloat16), and {_span(vs_cudnn.values())}x cuDNN, ahead in {sum(v > 1 for v in vs_cudnn.values())} of "
            "8 cases, behind in those two",
            f"its forward is {_span(by(prev, 128))}x SDPA flash at D = 128, now at least 1.75x in every case, and "
            f"{_span(by(prev, 64))}x at D = 64, where N = 4096 causal is still just under 1.5x ({prev[fp16]:.3f} "
            f"float16, {prev[bf16]:.3f} bfloat16)"):
        assert quoted in hopper_log, quoted
    assert {k for k, v in vs_cudnn.items() if v < 1} == {fp16, bf16} and min(by(prev, 128)) >= 1.75
    # README: the four D = 128, N = 16384 cases against cuDNN in the previous version, and cuDNN's moves there
    four = lambda x: [v for k, v in x.items() if k[1:3] == (128, 16384)]  # noqa: E731
    readme = " ".join(README.read_text().split())
    assert (f"where the file's previous version, 06:11 UTC, had {_span(four(then))}x with the same build at this "
            f"head dim; cuDNN's own figures moved by {_pct_span(four(cudnn))} between the two calls") in readme


@needs_data
def test_hopper_log_w3_reading_numbers(hopper):
    """The W3 section's prediction table and reading: TFLOP/s spans, the best case against the measured
    wgmma ceiling, and W3 against cuDNN at D = 128."""
    log = _log()
    tf = {(r["dtype"], r["D"], r["N"], r["causal"]): r["tflops"] for r in hopper if r["impl"] == "hopper-w3"}
    flash = _ratios(hopper, "hopper-w3", "sdpa-flash")
    groups = {"D = 128, not causal": lambda k: k[1] == 128 and not k[3],
              "D = 128, causal, N = 16384": lambda k: k[1] == 128 and k[3] and k[2] == 16384,
              "D = 128, causal, N = 4096": lambda k: k[1] == 128 and k[3] and k[2] == 4096,
              "D = 64": lambda k: k[1] == 64}
    for case, keep in groups.items():
        keys = [k for k in tf if keep(k)]
        cell = f"| {_span([tf[k] for k in keys], '{:.0f}')} ({_span([flash[k] for k in keys])}) |"
        row = next(line for line in (ROOT / "book" / "perflog_hopper.md").read_text().splitlines()
                   if line.startswith(f"| {case} |") and "(1." in line and line.count("|") == 4)
        assert row.endswith(cell), (case, row, cell)
    peaks, _ = results_data.load_results("h200_instruction_peaks.json")
    ceiling = {r["dtype"]: r["tflops"] for r in peaks if r.get("instruction") == "wgmma"}
    best = {dt: max((t, k) for k, t in tf.items() if k[0] == dt) for dt in ("float16", "bfloat16")}
    assert best["bfloat16"][1] == ("bfloat16", 128, 16384, False)
    assert (f"The best, {best['bfloat16'][0]:.0f} TFLOP/s (bfloat16, N = 16384, not causal), is "
            f"{best['bfloat16'][0] / ceiling['bfloat16']:.0%} of `wgmma`'s bfloat16 ceiling; float16's best, "
            f"{best['float16'][0]:.0f}, is {best['float16'][0] / ceiling['float16']:.0%} of its own") in log
    cudnn = {k: x for k, x in _ratios(hopper, "hopper-w3", "sdpa-cudnn").items() if k[1] == 128}
    tie = {k: x for k, x in cudnn.items() if k[2:] == (16384, True)}
    rest = [x for k, x in cudnn.items() if k not in tie]
    assert (f"Against cuDNN W3 is at {_span(cudnn.values())}x at D = 128: level with it at N = 16384, causal "
            f"({tie[('float16', 128, 16384, True)]:.2f}x float16, {tie[('bfloat16', 128, 16384, True)]:.2f}x bfloat16") in log
    assert f"behind it everywhere else ({_span(rest)}x)" in log


@needs_data
def test_backward_protocol_gmeans():
    # perflog_cuda_bwd.md: "at worst 0.98x SDPA flash in both columns, `cuda-mma` and `cuda`, median 1.03x in
    # either" and the geometric means; both columns run the same backward kernel, so "both" must hold at the
    # rounding the log prints
    import statistics

    from flashtut.bench.report import ratio_summary

    rows, _ = results_data.load_results("cuda_protocol_h200.json")
    g = {(s["impl"], s["D"]): s["gmean"] for s in ratio_summary(rows, ["cuda-mma", "cuda"], mode="bwd")}
    log = " ".join((ROOT / "book" / "perflog_cuda_bwd.md").read_text().split())
    assert (f"here {g['cuda-mma', 128]:.3f} and {g['cuda-mma', 64]:.3f} (`cuda-mma`; {g['cuda', 128]:.3f} and "
            f"{g['cuda', 64]:.3f} for `cuda`)") in log
    ratios = _protocol_ratios(rows)
    worst, median = set(), set()
    for impl in ("cuda-mma", "cuda"):
        x = list(ratios(impl, "sdpa-flash", "bwd").values())
        assert len(x) == 16
        worst.add(f"{min(x):.2f}")
        median.add(f"{statistics.median(x):.2f}")
    assert len(worst) == 1 and len(median) == 1, (worst, median)
    assert (f"at worst {worst.pop()}x SDPA flash in both columns, `cuda-mma` and `cuda`, median {median.pop()}x "
            "in either") in log


# --- W4, persistent blocks (hopper_w4_h200.json): the Hopper log and chapter 11 -------------------------

@needs_data
def test_w4_claims():
    rows, _ = results_data.load_results("hopper_w4_h200.json")
    rows = [r for r in rows if r.get("tflops")]
    # W3 and W4 with cuda_attention's consumers: two at D = 128, three at D = 64
    wide = {128: ("hopper-w3", "hopper-w4"), 64: ("hopper-w3[c3]", "hopper-w4[c3]")}
    w3, w4, gain = {}, {}, {}
    for D, (a, b) in wide.items():
        w3.update({k: x for k, x in _ratios(rows, a, "sdpa-flash").items() if k[1] == D})
        w4.update({k: x for k, x in _ratios(rows, b, "sdpa-flash").items() if k[1] == D})
    gain = {k: 100 * (w4[k] / w3[k] - 1) for k in w3}
    assert len(gain) == 16
    causal_short = [g for k, g in gain.items() if k[2] == 4096 and k[3]]
    log, text = _log(), _chapter_11_text()
    for quoted in (
            f"W4 against W3, per case: {min(gain.values()):+.1f}% to +{max(gain.values()):.1f}%".replace("+-", "-"),
            f"causal N = 4096 moved {min(causal_short):+.1f}% to {max(causal_short):+.1f}%".replace("+-", "-"),
            f"(D = 128 float16 causal: {w3[('float16', 128, 16384, True)]:.2f}x to "
            f"{w4[('float16', 128, 16384, True)]:.2f}x)",
            f"(+{gain[('float16', 128, 4096, False)]:.1f}% at D = 128, +{gain[('float16', 64, 4096, False)]:.1f}% "
            f"at D = 64), where the same cases in bfloat16 lost {-gain[('bfloat16', 128, 4096, False)]:.1f}% and "
            f"{-gain[('bfloat16', 64, 4096, False)]:.1f}%"):
        assert quoted in log, quoted
    # the ladder table's W4 row and the W3 of the same run
    by_d = lambda d, x: [v for k, v in x.items() if k[1] == d]  # noqa: E731
    assert f"| {_span(by_d(128, w4))}x | {_span(by_d(64, w4))}x |" in log
    assert f"W3 measured {_span(by_d(128, w3))}x and {_span(by_d(64, w3))}x (section W4)" in log
    # "N = 16384 lost up to 10%"; "the two gains above 4%"
    assert round(-min(gain.values())) == 10 and min(gain, key=gain.get)[2] == 16384
    assert sorted(k for k, g in gain.items() if g > 4) == [("float16", 64, 4096, False), ("float16", 128, 4096, False)]
    # the benchmark medians the log compares with Nsight Compute's single launches
    ms = {r["impl"]: r["ms"] for r in rows if (r["dtype"], r["D"], r["N"], r["causal"]) == ("float16", 128, 4096, False)}
    assert f"its benchmark median, {ms['hopper-w3']:.3f} ms" in log and f"W4's, {ms['hopper-w4']:.3f} ms" in log
    # chapter 11: "W4 loses up to 10%", "8% ahead"; and W4 is not what cuda_attention runs
    assert "At $N = 16384$ W4 loses up to 10%" in text and "the benchmark has W4 8% ahead" in text
    assert round(gain[("float16", 64, 4096, False)]) == 8 and round(gain[("float16", 128, 4096, False)]) == 8
    from flashtut.cuda import configs

    assert configs.HOPPER_DEFAULT == "w3" and "`configs.HOPPER_DEFAULT` stays W3" in log


def _option_gains(data: str, option: str) -> dict:
    """{head dim: [% against W3 per case]} for W3 with one build option, at cuda_attention's consumers."""
    from flashtut.bench.report import gains

    rows, _ = results_data.load_results(data)
    by_d = gains(rows, {128: f"hopper-w3[{option}]", 64: f"hopper-w3[c3,{option}]"}, {128: "hopper-w3", 64: "hopper-w3[c3]"})
    return {D: list(g.values()) for D, g in by_d.items()}


def test_w3_options_claims():
    """perflog_hopper.md, "W3's build options": every range against W3, recomputed from the two files, and
    the choice it leads to in configs.HOPPER_OPTIONS."""
    from flashtut.cuda import configs

    log = _log()
    span = lambda g: f"{min(g):+.1f}% to {max(g):+.1f}%"  # noqa: E731
    soft = {o: _option_gains("hopper_softmax_h200.json", o) for o in ("poly1", "poly2", "poly3", "tree")}
    opts = {o: _option_gains("hopper_options_h200.json", o) for o in ("order", "store")}
    assert all(len(g) == 8 for o in (soft, opts) for d in o.values() for g in d.values())
    for quoted in (
            f"1 of 8 by the cubic {span(soft['poly1'][128])} at D = 128 and\n{span(soft['poly1'][64])} at D = 64",
            f"2 of 8 {span(soft['poly2'][128])} and {span(soft['poly2'][64])}",
            f"{span(soft['poly3'][64])}; rows as trees {span(soft['tree'][128])} at D = 128",
            f"and {span(soft['tree'][64])} at D = 64",
            f"W4's order {span(opts['order'][128])} at D = 128 and {span(opts['order'][64])} at\nD = 64",
            f"the TMA store **{span(opts['store'][128])} at D = 128**, in all 8 cases, and {span(opts['store'][64])}",
            f"at D = 128 it is within {span(opts['order'][128])}"):
        assert quoted.replace("+-", "-").replace("\n", " ") in log, quoted
    # "every prediction missed in sign": each softmax change lost at D = 64 in every case
    assert all(max(g[64]) < 0 for g in soft.values())
    # the choice: the store where it won every case, nothing else anywhere
    assert min(opts["store"][128]) > 0 and max(opts["store"][64]) < 0
    assert configs.HOPPER_OPTIONS[128] == {"tma_store": True}
    assert not set(configs.HOPPER_OPTIONS[64]) & {"exp2_poly", "row_tree", "section_order", "tma_store"}
    # the ladder table's row for the store, and W3 in the same run
    rows = [r for r in results_data.load_results("hopper_options_h200.json")[0] if r.get("tflops")]
    ratio = lambda impl, D: [x for k, x in _ratios(rows, impl, "sdpa-flash").items() if k[1] == D]  # noqa: E731
    assert (f"| {_span(ratio('hopper-w3[store]', 128))}x | {_span(ratio('hopper-w3[c3,store]', 64))}x "
            "(three consumers) |") in log
    assert f"where W3 measured {_span(ratio('hopper-w3', 128))}x and {_span(ratio('hopper-w3[c3]', 64))}x" in log
    assert '`configs.HOPPER_OPTIONS = {128: {"tma_store": True}}`' in log


def test_c3_tile_shape_claims():
    from flashtut.bench.report import gains

    rows, _ = results_data.load_results("hopper_c3_tiles_h200.json")
    log = _log()
    for impl, label in (("hopper-w3[c3,s3]", "3 stages"), ("hopper-w3[c3,n64]", "64-key tiles")):
        g = list(gains(rows, impl, "hopper-w3[c3]")[64].values())
        assert len(g) == 8 and max(g) < 0
        assert f"{label} {min(g):+.1f}% to {max(g):+.1f}%".replace("+-", "-") in log


def test_heads_first_claims():
    from flashtut.bench.report import gains

    rows, _ = results_data.load_results("hopper_heads_h200.json")
    by_d = gains(rows, {64: "hopper-w3[c3,heads]", 128: "hopper-w3[heads,store]"},
                 {64: "hopper-w3[c3]", 128: "hopper-w3[store]"})
    spans, all_gains = [], []
    for D in (64, 128):
        g = list(by_d[D].values())
        assert len(g) == 8 and max(g) < 0
        all_gains.append(g)
        spans.append(f"{min(g):+.1f}% to {max(g):+.1f}% at D = {D}".replace("+-", "-"))
    assert f"Heads first: {spans[0]} and {spans[1]}, every case" in _log()
    worst = min(min(g) for g in all_gains)
    best = max(max(g) for g in all_gains)
    assert f"loses by {round(-best)} to {round(-worst)}% in every case" in _chapter_11_text()


# --- turns among three consumers (c3_turns): hopper_turns*.json and ncu_hopper_h200.json, the Hopper log ---

def _gains_at(data: str, impl: str, base: str, D: int) -> dict:
    from flashtut.bench.report import gains

    rows, _ = results_data.load_results(data)
    return gains(rows, impl, base)[D]


def _d64_gains(data: str, impl: str, base: str) -> dict:
    return _gains_at(data, impl, base, 64)


def test_turns_claims():
    """perflog_hopper.md, "Turns among three consumers": every percentage and ratio recomputed, and the
    choice in configs.HOPPER_OPTIONS that follows from them."""
    from flashtut.bench import profile
    from flashtut.cuda import configs

    log = _log()
    turns = _d64_gains("hopper_turns_h200.json", "hopper-w3[c3,turns]", "hopper-w3[c3]")
    assert len(turns) == 8 and min(turns.values()) > 0
    assert f"The turns win every case, {_pct_span(turns.values())}" in log
    assert sum(1 <= g <= 4 for g in turns.values()) == 6 and "in 6 of 8 cases, above it in 2" in log
    short = {dt: turns[(4096, dt, True)] for dt in ("float16", "bfloat16")}
    assert f"gained +{short['float16']:.1f}% (float16) and +{short['bfloat16']:.1f}% (bfloat16)" in log
    rows, _ = results_data.load_results("hopper_turns_h200.json")
    flash = _ratios(rows, "hopper-w3[c3,turns]", "sdpa-flash")
    assert f"(1.47x and 1.49x)" in log and (round(flash[("float16", 64, 4096, True)], 2),
                                           round(flash[("bfloat16", 64, 4096, True)], 2)) == (1.47, 1.49)
    cudnn = _ratios(rows, "hopper-w3[c3,turns]", "sdpa-cudnn")
    behind = {k: x for k, x in cudnn.items() if x < 1}
    assert set(behind) == {("float16", 64, 4096, True)}
    assert f"behind by {100 * (1 - behind[('float16', 64, 4096, True)]):.1f}% at N = 4096, float16, causal" in log
    assert f"by {100 * (cudnn[('bfloat16', 64, 4096, True)] - 1):.1f}% in the closest" in log
    # the profile of the same builds
    ncu, _ = results_data.load_results("ncu_hopper_h200.json")

    def m(impl, causal, name):
        return profile.metric(ncu, impl, 64, causal, name, "options")

    stall = profile.STALL.format
    for causal in (False, True):
        a, b = "hopper-w3[c3]", "hopper-w3[c3,turns]"
        assert m(b, causal, profile.TENSOR) > m(a, causal, profile.TENSOR)
        assert m(b, causal, stall("math_pipe_throttle")) < 0.65 * m(a, causal, stall("math_pipe_throttle"))
    assert (f"measured {m('hopper-w3[c3,turns]', False, profile.TENSOR):.1f}% (not causal) and "
            f"{m('hopper-w3[c3,turns]', True, profile.TENSOR):.1f}% (causal, against "
            f"{m('hopper-w3[c3]', True, profile.TENSOR):.1f}%)") in log
    # the stack and the pair: the store on top of the turns, and why it is not kept
    stack = {o: _d64_gains("hopper_turns_stack_h200.json", i, "hopper-w3[c3,turns]") for o, i in (
        ("poly1", "hopper-w3[c3,turns,poly1]"), ("tree", "hopper-w3[c3,turns,tree]"), ("w4", "hopper-w4[c3]"),
        ("w4turns", "hopper-w4[c3,turns]"), ("store", "hopper-w3[c3,turns,store]"))}
    assert (f"the cubic {_pct_span(stack['poly1'].values())} and the trees {_pct_span(stack['tree'].values())}" in log
            and f"W4 {_pct_span(stack['w4'].values())} and W4 with turns {_pct_span(stack['w4turns'].values())}" in log)
    won = [g for g in stack["store"].values() if g > 0]
    assert len(won) == 7 and f"ahead in 7 of 8 cases, {_pct_span(won)}, and {min(stack['store'].values()):.1f}%" in log
    pair = _d64_gains("hopper_turns_store_h200.json", "hopper-w3[c3,turns,store]", "hopper-w3[c3,turns]")
    lost = sorted(g for g in pair.values() if g < 0)
    assert len(lost) == 3 and f"Five of eight this time: {_pct_span(pair.values())}" in log
    assert f"the three losses {lost[0]:.1f}%, {lost[1]:.1f}% and {lost[2]:.1f}%" in log
    both = list(stack["store"].values()) + list(pair.values())
    assert sum(g < 0 for g in both) == 4 and f"by {-min(both):.1f}% at most" in log
    # the turns stayed alone at D = 64 until the two options of the paired A/B joined them
    assert {k for k in configs.HOPPER_OPTIONS[64] if k not in ("tail_first", "uniform_wg")} == {"c3_turns"}


def test_chapter_11_profile_and_turns_claims():
    """Chapter 11's readings of the committed profile (ncu_hopper_h200.json) and of the turns' runs."""
    from flashtut.bench import profile

    ncu, _ = results_data.load_results("ncu_hopper_h200.json")
    text = _chapter_11_text()
    m = lambda impl, name, causal=False, s="ladder": profile.metric(ncu, impl, 64, causal, name, s)  # noqa: E731
    stall = profile.STALL.format
    ms = lambda impl: m(impl, profile.DURATION) / 1e6  # noqa: E731
    assert f"The launch takes {ms('hopper-w3[c3]'):.3f} ms against {ms('hopper-w3'):.3f}." in text
    assert (f"`wait` {m('hopper-w3', stall('wait')):.2f} to {m('hopper-w3[c3]', stall('wait')):.2f}, long scoreboard "
            f"{m('hopper-w3', stall('long_scoreboard')):.2f} to {m('hopper-w3[c3]', stall('long_scoreboard')):.2f}") in text
    assert f"(math pipe throttle {m('hopper-w3', stall('math_pipe_throttle')):.2f} at $D = 64$)" in text
    # 11.11: "to 54.9% (not causal), just under the predicted 55 to 58%"; "about 40% rarer"
    turns = m("hopper-w3[c3,turns]", profile.TENSOR, s="options")
    assert f"to {turns:.1f}% (not causal), just under the predicted 55 to 58%" in text and turns < 55
    for causal in (False, True):
        drop = 1 - m("hopper-w3[c3,turns]", stall("math_pipe_throttle"), causal, "options") / m(
            "hopper-w3[c3]", stall("math_pipe_throttle"), causal, "options")
        assert 0.35 < drop < 0.45
    assert "is about 40% rarer" in text
    rows, _ = results_data.load_results("hopper_turns_h200.json")
    flash = _ratios(rows, "hopper-w3[c3,turns]", "sdpa-flash")
    short = [round(flash[(dt, 64, 4096, True)], 2) for dt in ("float16", "bfloat16")]
    assert "those two cases stay at 1.47 and 1.49" in text and short == [1.47, 1.49]
    assert "won 7 of 8 cases in one run and 5 of 8 in the next" in text



def test_w4_static_schedule_claims():
    """perflog_hopper.md, "W4 without a handover": the static schedule against W4's counter and W3."""
    from flashtut.bench.report import gains

    rows, _ = results_data.load_results("hopper_w4_static_h200.json")
    w3 = {128: "hopper-w3[store]", 64: "hopper-w3[c3,turns]"}
    w4 = {128: "hopper-w4", 64: "hopper-w4[c3]"}
    static = gains(rows, {128: "hopper-w4[static]", 64: "hopper-w4[c3,static]"}, w4)
    log = _log()
    assert (f"Against W4 with its counter: {_pct_span(static[128].values())} at D = 128 and {_pct_span(static[64].values())} "
            "at D = 64") in log
    full = {D: [g for k, g in by.items() if not k[2]] for D, by in static.items()}
    causal = [g for by in static.values() for k, g in by.items() if k[2]]
    assert max(abs(g) for g in full[128]) < 2 and max(full[64]) < 0
    assert f"and {-max(full[64]):.1f}% to {-min(full[64]):.1f}% slower at D = 64" in log
    assert f"with one {-max(causal):.1f}% to {-min(causal):.1f}% slower at both head dims" in log
    counter = gains(rows, w4, w3)
    assert (f"W4 with its counter {_pct_span(counter[128].values())} at D = 128 and {_pct_span(counter[64].values())} at "
            "D = 64 here") in log


def test_ladder_rows_of_the_turns_and_the_static_w4():
    log = _log()
    turns, _ = results_data.load_results("hopper_turns_h200.json")
    on = _ratios(turns, "hopper-w3[c3,turns]", "sdpa-flash").values()
    off = _ratios(turns, "hopper-w3[c3]", "sdpa-flash").values()
    assert f"| +1 to +4% over three consumers without turns | - | {_span(on)}x | - / 54.9 | - / 128 |" in log
    assert f"three consumers without turns measured {_span(off)}x" in log
    w4 = [r for r in results_data.load_results("hopper_w4_static_h200.json")[0] if r.get("tflops")]
    by_d = {D: [x for k, x in _ratios(w4, impl, "sdpa-flash").items() if k[1] == D]
            for D, impl in ((128, "hopper-w4[static]"), (64, "hopper-w4[c3,static]"))}
    assert f"| {_span(by_d[128])}x | {_span(by_d[64])}x (three consumers) | - | 168 / 128 |" in log
    assert "racecheck finds nothing in it, which places the report on the slot alone" in _chapter_11_text()


def test_pin_lazy_and_stepped_descriptor_claims():
    """perflog_hopper.md, "The softmax under the P V, pinned; and the lazy rescale": every percentage and
    ratio of its three runs recomputed, and that none of the four options is in configs.HOPPER_OPTIONS."""
    import math

    from flashtut.cuda import configs

    log = _log()
    base = {64: "hopper-w3[c3,turns]", 128: "hopper-w3[store]"}
    name = lambda D, o: base[D][:-1] + f",{o}]"  # noqa: E731
    pin = {D: _gains_at(f"hopper_pin_d{D}_h200.json", name(D, "pin"), base[D], D) for D in (64, 128)}
    lazy = {D: _gains_at(f"hopper_pin_d{D}_h200.json", name(D, "lazy"), base[D], D) for D in (64, 128)}
    both = {D: _gains_at(f"hopper_pin_d{D}_h200.json", name(D, "pin,lazy"), base[D], D) for D in (64, 128)}
    assert all(len(g) == 8 for d in (pin, lazy, both) for g in d.values())
    assert max(pin[64].values()) < 0 and f"The pin: {_pct_span(pin[64].values())} at D = 64 (all 8 cases)" in log
    up = [g for g in pin[128].values() if g > 0]
    worst = pin[128][(4096, "float16", False)]
    assert len(up) == 7 and worst == min(pin[128].values()) < 0
    assert f"at D = 128 {_pct_span(up)} in 7 cases and {worst:.1f}% in the eighth" in log
    assert max(lazy[64].values()) < 0 and max(lazy[128].values()) < 0
    assert f"The lazy rescale lost everywhere, {_pct_span(lazy[64].values())} at D = 64 and {_pct_span(lazy[128].values())}" in log
    assert all(both[D][c] < min(pin[D][c], lazy[D][c]) for D in (64, 128) for c in both[D] if D == 64)
    # the anchor's run
    anchor = {D: _gains_at(f"hopper_anchor_d{D}_h200.json", name(D, "anchor"), base[D], D) for D in (64, 128)}
    pin2 = {D: _gains_at(f"hopper_anchor_d{D}_h200.json", name(D, "pin"), base[D], D) for D in (64, 128)}
    assert max(anchor[64].values()) < 0 and max(pin2[64].values()) < 0
    assert f"as the pin does ({_pct_span(anchor[64].values())}; the pin {_pct_span(pin2[64].values())} in this run)" in log
    assert f"both are within {_pct_span([*anchor[128].values(), *pin2[128].values()])} of the build" in log
    long_pin = [g for (N, _, _), g in pin2[128].items() if N == 16384]
    short_pin = [g for (N, _, _), g in pin2[128].items() if N == 4096]
    first_long = [g for (N, _, _), g in pin[128].items() if N == 16384]
    assert (f"(the pin {_pct_span(long_pin)} at N = 16384 in this run, {_pct_span(first_long)} in the first, and "
            f"{_pct_span(short_pin)} at N = 4096 in this run)") in log
    # the stepped descriptors' run
    ds = {D: _gains_at(f"hopper_ds_d{D}_h200.json", name(D, "ds"), base[D], D) for D in (64, 128)}
    up = [g for g in ds[64].values() if g > 0]
    down = sorted(g for g in ds[64].values() if g <= 0)
    assert len(up) == 6 and f"{_pct_span(up)} in 6 of 8 cases at D = 64 and {down[0]:.1f}%, {down[1]:.1f}% in the other" in log
    assert f"{_pct_span(ds[128].values())} at D = 128" in log
    w4 = _gains_at("hopper_ds_d64_h200.json", "hopper-w4[c3,turns,ds]", "hopper-w4[c3,turns]", 64)
    w4_vs_w3 = _gains_at("hopper_ds_d64_h200.json", "hopper-w4[c3,turns,ds]", base[64], 64)
    assert min(w4.values()) > 0 and f"W4 at D = 64 gains in all 8 ({_pct_span(w4.values())})" in log
    assert f"stays below W3 ({_pct_span(w4_vs_w3.values())})" in log
    pin3 = _gains_at("hopper_ds_d128_h200.json", "hopper-w3[store,pin]", base[128], 128)
    assert min(pin3.values()) > 0 and f"The pin at D = 128 won all 8 cases of this run ({_pct_span(pin3.values())})" in log
    runs = [pin[128], pin2[128], pin3]
    assert sum(g > 0 for r in runs for g in r.values()) == 21 and "won 21 of 24" in log
    gmean = {c: 100 * (math.prod(1 + r[c] / 100 for r in runs) ** (1 / 3) - 1) for c in pin3}
    pos = [g for g in gmean.values() if g > 0]
    neg = [g for g in gmean.values() if g <= 0]
    assert len(pos) == 7 and f"is {_pct_span(pos)} in 7 cases and {neg[0]:.1f}% in the eighth" in log
    # the weakest case under this preset's budget, in the three runs at D = 64
    weakest, cudnn = [], []
    for data in ("hopper_pin_d64_h200.json", "hopper_anchor_d64_h200.json", "hopper_ds_d64_h200.json"):
        rows, _ = results_data.load_results(data)
        for dt in ("float16", "bfloat16"):
            weakest.append(_ratios(rows, base[64], "sdpa-flash")[(dt, 64, 4096, True)])
            cudnn.append(_ratios(rows, "sdpa-cudnn", "sdpa-flash")[(dt, 64, 4096, True)])
    assert f"{min(weakest):.2f}x to {max(weakest):.2f}x SDPA flash under this preset's budget" in log
    assert f"with cuDNN at {min(cudnn):.2f}x to {max(cudnn):.2f}x" in log
    kept = {name for options in configs.HOPPER_OPTIONS.values() for name in options}
    assert not kept & {"pin_overlap", "pin_anchor", "lazy_rescale", "desc_step"}


def test_overlap_profile_claims():
    """perflog_hopper.md, "Nsight Compute of the four": each figure of its reading, from ncu_overlap_h200.json."""
    from flashtut.bench import profile

    log = _log()
    rows, _ = results_data.load_results("ncu_overlap_h200.json")
    base = {128: "hopper-w3[store]", 64: "hopper-w3[c3,turns]"}

    def m(D, option, name, causal=False):
        impl = base[D] if not option else base[D][:-1] + f",{option}]"
        return profile.metric(rows, impl, D, causal, name, "overlap")

    def arrow(D, option, name, fmt=".2f", causal=False):
        return f"{m(D, '', name, causal):{fmt}} -> {m(D, option, name, causal):{fmt}}"

    stall = profile.STALL.format
    issue = "sm__issue_active.avg.pct_of_peak_sustained_active"
    assert f"{arrow(128, 'pin', stall('barrier'))} per issue at D = 128 and {arrow(64, 'pin', stall('barrier'))} at D = 64" in log
    assert f"rise by as much, {arrow(128, 'pin', stall('wait'))} and {arrow(64, 'pin', stall('wait'))}" in log
    assert f"({arrow(128, 'pin', profile.TENSOR, '.1f').replace(' -> ', '% -> ')}%)" in log
    assert f"falls at D = 64 ({arrow(64, 'pin', profile.TENSOR, '.1f').replace(' -> ', '% -> ')}%)" in log
    assert f"more math-pipe throttle at D = 64 ({arrow(64, 'anchor', stall('math_pipe_throttle'))})" in log
    assert f"triples the math-pipe throttle at D = 64 ({arrow(64, 'lazy', stall('math_pipe_throttle'))})" in log
    assert f"at D = 128 ({arrow(128, 'lazy', stall('math_pipe_throttle'))})" in log
    assert m(128, "lazy", stall("math_pipe_throttle")) / m(128, "", stall("math_pipe_throttle")) == 9
    for D in (128, 64):
        assert m(D, "ds", issue) < m(D, "", issue) - 2.9 and m(D, "ds", profile.DURATION) < m(64, "", profile.DURATION)
    assert f"({arrow(128, 'ds', issue, '.1f').replace(' -> ', '% -> ')}% at D = 128, " \
           f"{arrow(64, 'ds', issue, '.1f').replace(' -> ', '% -> ')}% at D = 64)" in log
    ms = lambda o: m(64, o, profile.DURATION) / 1e6  # noqa: E731
    assert f"one launch {100 * (1 - ms('ds') / ms('')):.1f}% faster ({ms(''):.3f} -> {ms('ds'):.3f} ms)" in log
    assert f"The barrier stalls rise ({arrow(64, 'ds', stall('barrier'))})" in log


def test_chapter_11_ptxas_claims():
    """Chapter 11, 11.12: the pin's and the lazy rescale's figures, from the three runs and the profile."""
    import math

    from flashtut.bench import profile

    text = _chapter_11_text()
    base = {64: "hopper-w3[c3,turns]", 128: "hopper-w3[store]"}
    pin128 = [_gains_at(f, "hopper-w3[store,pin]", base[128], 128)
              for f in ("hopper_pin_d128_h200.json", "hopper_anchor_d128_h200.json", "hopper_ds_d128_h200.json")]
    every = [g for run in pin128 for g in run.values()]
    mean = 100 * (math.prod(1 + g / 100 for g in every) ** (1 / len(every)) - 1)
    assert round(mean) == 1 and f"up to {max(every):.1f}% in one case" in text and min(every) < 0
    pin64 = [g for f in ("hopper_pin_d64_h200.json", "hopper_anchor_d64_h200.json")
             for g in _gains_at(f, "hopper-w3[c3,turns,pin]", base[64], 64).values()]
    assert -4 <= min(pin64) and max(pin64) < 0 and round(-max(pin64), 1) == 0.5
    assert "costs 0.5 to 4% at $D = 64$ in every case of two runs" in text
    lazy = [g for D in (64, 128) for g in _gains_at(f"hopper_pin_d{D}_h200.json", base[D][:-1] + ",lazy]", base[D], D).values()]
    assert max(lazy) < 0 and "the lazy rescale loses everywhere" in text
    rows, _ = results_data.load_results("ncu_overlap_h200.json")
    stall = profile.STALL.format

    def m(D, option, reason):
        return profile.metric(rows, base[D] if not option else base[D][:-1] + f",{option}]", D, False, stall(reason),
                              "overlap")

    for D in (64, 128):
        assert m(D, "pin", "barrier") <= m(D, "", "barrier") / 2 and "fall by half" in text
        assert m(D, "pin", "wait") - m(D, "", "wait") >= 0.6 * (m(D, "", "barrier") - m(D, "pin", "barrier"))
    ratios = [m(D, "lazy", "math_pipe_throttle") / m(D, "", "math_pipe_throttle") for D in (64, 128)]
    assert round(min(ratios)) == 3 and round(max(ratios)) == 9 and "three to nine times higher" in text


def test_final_source_protocol_rerun_claims():
    """perflog_hopper.md, "At the final kernel source": the protocol run again and the stepped descriptors
    once more."""
    log = _log()
    rows, _ = results_data.load_results("cuda_protocol_rerun_h200.json")
    flash = {}
    for r in rows:
        if r["impl"] == "cuda" and r["mode"] == "fwd":
            flash[(r["dtype"], r["D"], r["N"], r["causal"])] = r["tflops"] / _tflops(
                rows, "sdpa-flash", mode="fwd", dtype=r["dtype"], D=r["D"], N=r["N"], causal=r["causal"])
    assert len(flash) == 16 and min(flash.values()) >= 1.5
    for D in (64, 128):
        v = [x for k, x in flash.items() if k[1] == D]
        assert f"{min(v):.3f}-{max(v):.3f}x SDPA flash at D = {D}" in log or \
            f"and {min(v):.3f}-{max(v):.3f}x at D = {D}" in log
    weak = [flash[(dt, 64, 4096, True)] for dt in ("float16", "bfloat16")]
    assert f"at {weak[0]:.3f}x (float16) and {weak[1]:.3f}x (bfloat16)" in log
    cudnn = []
    for r in rows:
        if r["impl"] == "cuda" and r["mode"] == "fwd":
            cudnn.append(r["tflops"] / _tflops(rows, "sdpa-cudnn", mode="fwd", dtype=r["dtype"], D=r["D"], N=r["N"],
                                               causal=r["causal"]))
    assert f"cuDNN {min(cudnn):.3f}-{max(cudnn):.3f}x" in log and min(cudnn) > 0.9
    again = _gains_at("hopper_ds_d64_again_h200.json", "hopper-w3[c3,turns,ds]", "hopper-w3[c3,turns]", 64)
    up = [g for g in again.values() if g > 0]
    assert len(up) == 7 and f"{min(up):+.1f}% to {max(up):+.1f}% in 7 of 8 cases and {min(again.values()):.1f}% in the eighth" in log


def test_ladder_rows_of_the_pin_the_lazy_rescale_and_the_stepped_descriptors():
    from flashtut.bench import profile

    log = _log()
    ncu, _ = results_data.load_results("ncu_overlap_h200.json")
    base = {128: "hopper-w3[store]", 64: "hopper-w3[c3,turns]"}
    for option, data in (("pin", "pin"), ("lazy", "pin"), ("ds", "ds")):
        spans = []
        for D in (128, 64):
            rows, _ = results_data.load_results(f"hopper_{data}_d{D}_h200.json")
            spans.append(_span(_ratios(rows, base[D][:-1] + f",{option}]", "sdpa-flash").values()))
        tensor = [profile.metric(ncu, base[D][:-1] + f",{option}]", D, False, profile.TENSOR, "overlap") for D in (128, 64)]
        assert f"| {spans[0]}x | {spans[1]}x | {tensor[0]:.1f} / {tensor[1]:.1f} | 168 / 128 |" in log, option


def test_swapped_order_claims():
    """perflog_hopper.md, "The order of the A/B, swapped": the two runs with the change timed first, and the
    counts over every run of each change."""
    log = _log()
    ds_base, pin_base = "hopper-w3[c3,turns]", "hopper-w3[store]"
    ds = _gains_at("hopper_ds_d64_swapped_h200.json", "hopper-w3[c3,turns,ds]", ds_base, 64)
    up = [g for g in ds.values() if g > 0]
    lost = [c for c, g in ds.items() if g <= 0]
    assert len(up) == 7 and lost == [(4096, "bfloat16", False)]
    assert f"{min(up):+.1f}% to {max(up):+.1f}% in 7 of 8 cases and {ds[lost[0]]:.1f}% in the eighth" in log
    assert f"is {ds[(4096, 'float16', False)]:+.1f}% this time" in log
    ds_runs = [_gains_at(f, "hopper-w3[c3,turns,ds]", ds_base, 64) for f in
               ("hopper_ds_d64_h200.json", "hopper_ds_d64_again_h200.json", "hopper_ds_d64_swapped_h200.json")]
    assert sum(g > 0 for r in ds_runs for g in r.values()) == 20 and "won 20 of 24 comparisons" in log
    pin = _gains_at("hopper_pin_d128_swapped_h200.json", "hopper-w3[store,pin]", pin_base, 128)
    assert sum(g > 0 for g in pin.values()) == 4
    assert f"won 4 of 8 ({min(pin.values()):.1f}% to {max(pin.values()):+.1f}%)" in log
    pin_runs = [_gains_at(f, "hopper-w3[store,pin]", pin_base, 128) for f in
                ("hopper_pin_d128_h200.json", "hopper_anchor_d128_h200.json", "hopper_ds_d128_h200.json",
                 "hopper_pin_d128_swapped_h200.json")]
    assert sum(g > 0 for r in pin_runs for g in r.values()) == 25 and "25 of 32 over its four runs" in log
    spread = []
    for f in ("hopper_pin_d64_h200.json", "hopper_anchor_d64_h200.json", "hopper_ds_d64_h200.json",
              "hopper_ds_d64_again_h200.json", "hopper_ds_d64_swapped_h200.json"):
        rows, _ = results_data.load_results(f)
        spread.append(_ratios(rows, ds_base, "sdpa-flash")[("float16", 64, 4096, False)])
    assert f"({min(spread):.2f}x to {max(spread):.2f}x in that case)" in log


def test_w4_named_handover_claims():
    """perflog_hopper.md, "W4's handover again": the named-barrier handover against W4 on q_full."""
    log = _log()
    named = {D: _gains_at("hopper_w4_named_h200.json", impl, base, D)
             for D, impl, base in ((128, "hopper-w4[named]", "hopper-w4"),
                                   (64, "hopper-w4[c3,turns,named]", "hopper-w4[c3,turns]"))}
    two = _gains_at("hopper_w4_named_h200.json", "hopper-w4[named]", "hopper-w4", 64)
    won = {D: sum(g > 0 for g in by.values()) for D, by in named.items()}
    assert (f"Against W4 on `q_full`: {_pct_span(named[128].values())} at D = 128 ({won[128]} of 8 faster) and "
            f"{_pct_span(named[64].values())} at D = 64 with three consumers ({won[64]} of 8 faster); with two "
            f"consumers at D = 64 (also in the file) {_pct_span(two.values())}, all 8 slower") in log
    assert max(two.values()) < 0
    w4 = [r for r in results_data.load_results("hopper_w4_named_h200.json")[0] if r.get("tflops")]
    by_d = {D: [x for k, x in _ratios(w4, impl, "sdpa-flash").items() if k[1] == D]
            for D, impl in ((128, "hopper-w4[named]"), (64, "hopper-w4[c3,turns,named]"))}
    assert f"| {_span(by_d[128])}x | {_span(by_d[64])}x (three consumers, turns) | - | 168 / 128 |" in log


@needs_data
def test_short_block_first_and_uniform_index_claims():
    """perflog_hopper.md, "The short query block first, and the warpgroup index known uniform": the figures
    of the single run and of the paired rounds, recomputed, and the choice they lead to."""
    from flashtut.bench.hopper_ab import PAIR_NOISE_PCT, pair_gains
    from flashtut.cuda import configs

    log = _log()
    pair = {}
    for name, data, base, impl in (
            ("uni64", "hopper_pair_uni_d64_h200.json", "hopper-w3[c3,turns]", "hopper-w3[c3,turns,uni]"),
            ("tail", "hopper_pair_tail_d64_h200.json", "hopper-w3[c3,turns,uni]", "hopper-w3[c3,turns,tail,uni]"),
            ("uni128", "hopper_pair_uni_d128_h200.json", "hopper-w3[store]", "hopper-w3[store,uni]")):
        rows, _ = results_data.load_results(data)
        pair[name] = pair_gains(rows, base, impl)
    d64 = lambda g: {k: v for k, v in g.items() if k[0] == 64}  # noqa: E731
    uni64 = {k[1:]: v for k, v in d64(pair["uni64"]).items()}
    tail = {k[1:]: v for k, v in d64(pair["tail"]).items()}
    uni128 = {k[1:]: v for k, v in pair["uni128"].items() if k[0] == 128}
    two64 = {k[1:]: v for k, v in pair["uni128"].items() if k[0] == 64}
    assert all(len(x) == 8 for x in (uni64, tail, uni128, two64))
    g = lambda x: [v[0] for v in x.values()]  # noqa: E731
    # the short block first: the two N = 4096 causal cases, the largest; N = 16384 causal; no mask
    c4096 = [tail[(dt, 4096, True)] for dt in ("bfloat16", "float16")]
    assert max(g(tail)) == max(v[0] for v in c4096)
    nomask = [v[0] for k, v in tail.items() if not k[2]]
    for quoted in (
            f"At N = 4096 causal, {c4096[0][0]:+.1f}% and {c4096[1][0]:+.1f}%, won in {c4096[0][1]} and "
            f"{c4096[1][1]} of 7 rounds",
            f"At N = 16384 causal, {tail[('bfloat16', 16384, True)][0]:+.1f}% and "
            f"{tail[('float16', 16384, True)][0]:.1f}%",
            f"{_pct_span(nomask)}: what this method measures between two builds doing the same work"):
        assert quoted.replace("+-", "-") in log, quoted
    # the uniform index: D = 64 three consumers, two consumers, D = 128
    low = min(uni64, key=lambda k: uni64[k][0])
    assert low == ("bfloat16", 16384, False) and sum(v[0] > 0 for v in uni64.values()) == 7
    pos = [v[0] for v in uni64.values() if v[0] > 0]
    assert (f"At D = 64 with three consumers: {_pct_span(pos)} in 7 of 8 cases, {uni64[low][0]:.1f}% in the eighth "
            f"(N = 16384, bfloat16, not causal, won in {uni64[low][1]} of 7 rounds)") in log
    assert (f"With two consumers at D = 64: {_pct_span(g(two64))}, won in {sum(v[1] for v in two64.values())} of "
            "56 rounds") in log
    assert (f"At D = 128: {_pct_span(g(uni128))}, the median below zero in {sum(v < 0 for v in g(uni128))} of 8 "
            "cases") in log
    # the single run, and W4 with the index against W3 with it
    single = {D: _gains_at("hopper_uniform_h200.json", impl, base, D) for D, impl, base in (
        (64, "hopper-w3[c3,turns,uni]", "hopper-w3[c3,turns]"), (128, "hopper-w3[store,uni]", "hopper-w3[store]"))}
    assert (f"moved W3 by {_pct_span(single[64].values())} at D = 64 and {_pct_span(single[128].values())} at "
            "D = 128") in log
    w4 = _gains_at("hopper_uniform_h200.json", "hopper-w4[c3,turns,uni]", "hopper-w3[c3,turns,uni]", 64)
    assert f"(in `hopper_uniform_h200.json` {_pct_span(w4.values())} at D = 64)" in log
    first = _gains_at("hopper_uniform_h200.json", "hopper-w3[c3,turns,tail,uni]", "hopper-w3[c3,turns,uni]", 64)
    assert (f"it lost {-first[(16384, 'float16', False)]:.1f}% (float16) and {-first[(16384, 'bfloat16', False)]:.1f}% "
            "(bfloat16)") in log
    # the rule, and the choice
    assert f"kept when no case's median falls below -{PAIR_NOISE_PCT}% and some case's rises above +{PAIR_NOISE_PCT}%" in log
    for x, kept in ((uni64, True), (tail, True), (uni128, False)):
        assert (min(g(x)) > -PAIR_NOISE_PCT and max(g(x)) > PAIR_NOISE_PCT) == kept
    assert (f"The uniform index passes at D = 64 (lowest {min(g(uni64)):.1f}%, highest {max(g(uni64)):+.1f}%) and "
            f"fails at D = 128 ({min(g(uni128)):.1f}%); the short block first passes ({min(g(tail)):.1f}%, "
            f"{max(g(tail)):+.1f}%)") in log
    assert configs.HOPPER_OPTIONS == {64: {"c3_turns": True, "tail_first": True, "uniform_wg": True},
                                      128: {"tma_store": True}}
    text = _chapter_11_text()
    assert (f"The short block first gains most where it was aimed, {c4096[0][0]:+.1f}% and {c4096[1][0]:+.1f}% at "
            "$N = 4096$ causal") in text
    assert f"its {_pct_span(nomask)} there is what this method" in text
    assert f"The uniform index gains up to {max(g(uni64)):.1f}% in 7 of 8 cases" in text
    assert f"it lost up to {-min(g(uni128)):.1f}%, and it stays out there" in text
    rows, _ = results_data.load_results("cuda_protocol_h200.json")
    cuda = _protocol_ratios(rows)("cuda", "sdpa-flash")
    d64 = _by_d(cuda, 64)
    assert (f"puts the weakest case at {min(d64):.2f} times `sdpa-flash` and the head dim at {_span(d64).replace('-', ' to ')}, "
            "ahead of cuDNN in every case") in text

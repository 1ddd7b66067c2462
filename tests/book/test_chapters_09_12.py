"""Chapters 07, 09 and 12 as a reader sees them: every number the prose quotes is computed here
from the data it comes from (``flashtut.results_data``), the statements the reviews found wrong
stay fixed, no measurement bookkeeping is left in the chapters, and each figure has one caption
line that names its GPU and its data file. ``flashtut.bench.results_summary``, which computes
chapter 09's tables, is tested on invented rows as well."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flashtut import results_data
from flashtut.bench import results_summary as summary

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ("07_triton", "09_results", "12_real_model")


def _cells(stem: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]


def _text(stem: str) -> str:
    """The chapter's Markdown cells with the line breaks of the source folded into spaces."""
    return " ".join(" ".join("".join(c["source"]).split()) for c in _cells(stem) if c["cell_type"] == "markdown")


def _load(name):
    try:
        return results_data.load_results(name)[0]
    except FileNotFoundError as exc:          # an installed copy offline: nothing to compare with
        pytest.skip(str(exc))


# --- chapter 09 ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spans():
    return summary.headline_spans(_load("bench_h200_protocol_*.json"), _load("cuda_protocol_h200.json"))


def test_chapter_09_quotes_the_ratio_table(spans):
    text = _text("09_results")
    # the two mma.sync readings are one now: chapter 8's kernels as they ship, from one file
    assert (f"chapter 8's `mma.sync` kernels run level with `sdpa-flash` ({spans['cuda-mma', 'fwd']} times "
            f"forward, {spans['cuda-mma', 'bwd']} backward)") in text
    assert f"Triton's kernels pass it ({spans['triton', 'fwd']} times forward, {spans['triton', 'bwd']} backward)" in text
    assert f"cuDNN ({spans['sdpa-cudnn', 'fwd']} times forward)" in text
    assert f"`cuda_attention`'s Hopper forward ({spans['cuda', 'fwd']} times)" in text
    assert spans["cuda-mma", "fwd"] == "0.95 to 1.03"             # the figure the ablation is read against
    assert f"reaches {spans['cuda-mma', 'fwd']} times `sdpa-flash` (section 9.3)" in text


def test_chapter_09_says_what_cuda_attention_runs():
    from flashtut.cuda import configs

    text = _text("09_results")
    # the forward on sm_90 is chapter 11's last rung; elsewhere the mma.sync ladder's fast step
    assert configs.HOPPER_DEFAULT == "w3" and "(its last rung, W3, built on Hopper's `wgmma`" in text
    v128, v64 = configs.fast_variant(128, 80), configs.fast_variant(64, 80)
    assert f"{v128} at $D = 128$ and {v64} at $D = 64$" in text and (v128, v64) == ("v5", "v3")
    for stale in ("cuda-v3", "runs W1", "whose forward is the last step"):
        assert stale not in text


def test_chapter_09_instruction_ceilings_are_two_limits():
    from flashtut import hardware

    ceil = summary.instruction_ceilings(_load("h200_instruction_peaks.json"))
    peak = hardware.GPUS["H200-SXM"].fp16_tensor_tflops
    mma = max(ceil["mma.sync"].values())
    wg = sorted(ceil["wgmma"].values())
    text = _text("09_results")
    assert (f"`mma.sync` stops at about {mma:.0f} TFLOP/s on this GPU, {mma / peak:.0%} of the datasheet's "
            f"peak") in text
    assert f"while `wgmma` reaches {100 * wg[0] / peak:.0f} to {wg[-1] / peak:.0%}" in text
    assert "That is two limits, not one. The first is the instruction's issue rate" in text
    assert "The second is the cost of feeding it, which the microbenchmark leaves out" in text


def test_chapter_09_reads_the_ablation_as_an_upper_bound(spans):
    sass = _load("sass_evidence_h200.json")
    off = "DISABLE_MMA_V3=1"
    on, down = summary.sass_counts(sass, "triton"), summary.sass_counts(sass, "triton", off)
    assert on["HGMMA"][0] > 0 and on["HMMA"] == (0, 0) and down["HGMMA"] == (0, 0) and down["HMMA"][0] > 0
    text = _text("09_results")
    assert f"(`LDSM` goes from {on['LDSM'][1]} to {down['LDSM'][1]} in the forward kernel)" in text
    assert (on["LDSM"][1], down["LDSM"][1]) == (8, 152)
    fwd_on, fwd_off = (summary.span(summary.setting_ratios(sass, s, "fwd")) for s in ("default", off))
    bwd_on, bwd_off = (summary.span(summary.setting_ratios(sass, s, "bwd")) for s in ("default", off))
    assert f"the forward falls from {fwd_on} times `sdpa-flash` to {fwd_off} times" in text
    assert f"(the backward from {bwd_on} to {bwd_off})" in text
    assert f"So {fwd_off} is an upper bound on what the instruction costs" in text
    # the tuned mma.sync kernel is above the switched Triton kernel in every forward case
    assert float(spans["cuda-mma", "fwd"].split()[0]) > max(summary.setting_ratios(sass, off, "fwd"))


def test_chapter_09_says_one_thing_about_cudnn():
    text = _text("09_results")
    said = "cuDNN's attention kernels are closed source, and we have not measured which tensor-core " \
           "instructions they issue"
    assert said in text
    for other in ("built for Hopper", "cannot read its kernels"):
        assert other not in text


def test_chapter_09_is_short_and_its_code_is_folded():
    cells = _cells("09_results")
    code = [c for c in cells if c["cell_type"] == "code"]
    chars = {t: sum(len("".join(c["source"])) for c in cells if c["cell_type"] == t) for t in ("code", "markdown")}
    # a results chapter: the reader reads prose, figures and tables; the code that draws them is folded
    assert chars["code"] < 0.5 * (chars["code"] + chars["markdown"])
    words = len(_text("09_results").split())
    assert words < 2600, words
    drawing = [c for c in code if re.search(r"_figure\(|show_table\(\*summary", "".join(c["source"]))
               and "has_gpu()" not in "".join(c["source"])]
    assert len(drawing) >= 5
    for c in drawing:
        tags = c["metadata"].get("tags", [])
        assert "hide-input" in tags or "remove-input" in tags, "".join(c["source"])[:80]


# --- the figures' captions and the bookkeeping, chapters 07, 09, 12 ----------------------------------

def _figure_cells(stem):
    return [c for c in _cells(stem) if c["cell_type"] == "code" and "figure" in c["metadata"].get("mystnb", {})]


@pytest.mark.parametrize("stem", CHAPTERS)
def test_measured_figures_name_their_gpu_and_data_file_in_one_caption_line(stem):
    measured = 0
    for c in _figure_cells(stem):
        caption = c["metadata"]["mystnb"]["figure"]["caption"]
        files = re.findall(r"`([\w*.-]+\.json)`", caption)
        if "H200" in caption or files:                # a measurement, not a teaching diagram
            measured += 1
            assert "\n" not in caption and len(caption) < 260, caption
            assert "NVIDIA H200" in caption and files, caption
            for f in files:
                assert results_data.find(f), f"{stem}: {f} is not a data file the package knows"
    assert measured >= {"07_triton": 1, "09_results": 3, "12_real_model": 2}[stem]


BOOKKEEPING = [
    (re.compile(r"\b\d{2}:\d{2} UTC\b|\bUTC\b"), "a UTC time"),
    (re.compile(r"\bcommit [0-9a-f]{7,}\b|\b[0-9a-f]{7,40}\b(?=\))"), "a commit hash"),
    (re.compile(r"/root/out|/tmp/tmp"), "an internal path"),
    (re.compile(r"\b(this|that|the same|another|a later|the committed) run\b", re.I), "a run chain"),
    (re.compile(r"show_provenance|results_data\.describe|\bdescribe\(|print_provenance"), "provenance printing"),
]


@pytest.mark.parametrize("stem", CHAPTERS)
def test_no_measurement_bookkeeping_in_the_chapter(stem):
    found = []
    for i, c in enumerate(_cells(stem)):
        text = "".join(c["source"])
        for pattern, what in BOOKKEEPING:
            for m in pattern.finditer(text):
                found.append(f"[{i}] {what}: ...{text[max(0, m.start() - 40):m.end() + 40]}...")
    assert not found, "\n".join(found)


def test_the_bookkeeping_patterns_catch_what_they_should():
    for bad in ("measured at 08:42 UTC", "(commit 758b193)", "/root/out/bench.json", "in this run",
                "print(results_data.describe(p))", "display(show_provenance(provs))"):
        assert any(p.search(bad) for p, _ in BOOKKEEPING), bad
    for fine in ("a run of the protocol", "the H200's rows", "commit the notebook"):
        assert not any(p.search(fine) for p, _ in BOOKKEEPING), fine


# --- results_summary on invented rows -----------------------------------------------------------------

def _row(impl, tflops, mode="fwd", D=128, N=16384, causal=False, dtype="float16"):
    return {"kind": "speed", "impl": impl, "mode": mode, "dtype": dtype, "B": 1, "H": 16, "Nq": N, "Nk": N,
            "N": N, "D": D, "causal": causal, "tflops": tflops, "status": "ok", "device": "GPU"}


def test_headline_table_takes_each_ratio_within_its_own_process():
    # the sweep's sdpa-flash is 100, the protocol file's 200: each implementation is divided by its own
    sweep = [_row("sdpa-flash", 100.0), _row("triton", 150.0), _row("cuda", 1.0)]
    protocol = [_row("sdpa-flash", 200.0), _row("cuda-mma", 200.0), _row("cuda", 400.0), _row("sdpa-cudnn", 300.0)]
    header, body = summary.headline_table(sweep, protocol)
    assert header[3:] == [title for _, title in summary.HEADLINE_COLUMNS]
    assert body == [["fwd", "128", "no", "1.50", "1.00", "2.00", "1.50"]]
    # a case only one file has shows as "-" in the other's columns
    header, body = summary.headline_table(sweep + [_row("sdpa-flash", 50.0, D=64), _row("triton", 100.0, D=64)],
                                          protocol, N=16384)
    assert body[0] == ["fwd", "64", "no", "2.00", "-", "-", "-"]


def test_results_summary_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match="sweep"):
        summary.headline_table("bench.json", [])
    with pytest.raises(ValueError, match="no timed case"):
        summary.headline_table([], [])
    with pytest.raises(ValueError, match="N must be"):
        summary.headline_table([], [_row("sdpa-flash", 1.0)], N=0)
    with pytest.raises(ValueError, match="no case at N=4096"):
        summary.headline_table([], [_row("sdpa-flash", 1.0)], N=4096)
    with pytest.raises(ValueError, match="at least one"):
        summary.span([])
    with pytest.raises(ValueError, match="peak_tflops"):
        summary.instruction_table([], 0)
    with pytest.raises(ValueError, match="no SASS counts"):
        summary.sass_counts([], "triton")


def test_memory_summary_fits_the_growth_and_names_the_oom():
    rows = [{"impl": "naive", "N": n, "status": "ok", "peak_extra_bytes": 4 * n * n} for n in (1024, 4096)]
    rows += [{"impl": "naive", "N": 8192, "status": "oom"}]
    rows += [{"impl": "triton", "N": n, "status": "ok", "peak_extra_bytes": 1000 * n} for n in (1024, 4096)]
    lines = summary.memory_summary(rows)
    assert lines[0].startswith("`naive`: 4.0 MiB at N = 1024") and "$N^{2.00}$" in lines[0]
    assert lines[0].endswith("out of memory at N = 8192")
    assert "$N^{1.00}$" in lines[1] and "out of memory" not in lines[1]


# --- chapter 12: what the optimiser does with rounding ----------------------------------------------

def test_chapter_12_says_where_rounding_is_amplified():
    rows = _load("capstone_h200.json")
    loss = {r["backend"]: r for r in rows if r.get("section") == "loss" and r.get("status") == "ok"}
    sdpa = loss["sdpa"]["losses"]
    gaps = {b: max(abs(x - y) for x, y in zip(r["losses"], sdpa)) for b, r in loss.items() if b != "sdpa"}
    assert set(gaps) == {"naive", "triton", "cuda"}
    lo, hi = min(gaps.values()), max(gaps.values())
    assert (round(lo, 2), round(hi, 2)) == (0.08, 0.12)
    # the gaps are training noise, not a bias that grows: the largest is not at the last step everywhere
    finals = [r["final_loss"] for r in loss.values()]
    text = _text("12_real_model")
    assert (f"differ from SDPA's by up to {lo:.2f} to {hi:.2f} nats") in text
    assert f"the last losses of the four backends lie within {max(finals) - min(finals):.2f} nats" in text
    # the float32 claim is the CPU's, and it is stated as such
    assert "rounding, which the optimiser does not amplify" not in text
    assert "their differences stay at the level of float32 rounding within these steps" in text
    assert "Under bfloat16 autocast on a GPU that is no longer so" in text


def test_chapter_12_generation_claim():
    rows = [r for r in _load("capstone_h200.json") if r.get("section") == "generation"]
    methods = {r["method"] for r in rows}
    same = [r["same_tokens_as_first"] for r in rows if r["same_tokens_as_first"] is not None]
    assert len(methods) == 7 and all(same) and len(same) == len(rows) - len({r["prompt"] for r in rows})
    assert "all seven ways of generating" in _text("12_real_model")


# --- chapter 07: the statements the reviews found wrong ---------------------------------------------

def test_chapter_07_window_leaves_2w_over_n_of_the_causal_work():
    from flashtut.exercises import ch07

    N, w = 4096, 512
    tiles = ch07.tiles_visited(N, window=w)
    share = tiles["window"] / tiles["causal"]
    # the tiles a window visits against the causal triangle's: 2w/N, not w/N
    assert abs(share - 2 * w / N) < 0.02 and abs(share - w / N) > 0.1
    text = _text("07_triton")
    assert "the window leaves about $N w / (N^2 / 2) = 2w / N$ of the causal work" in text
    assert "`w / N` of it" not in text


def test_chapter_07_names_where_the_2x_criterion_and_the_sm75_limit_come_from():
    text = _text("07_triton")
    assert "the criterion of the tests of the flash-attn repository (the papers do not state one)" in text
    assert "criterion of the FlashAttention papers" not in text
    assert "Triton still compiles for it, but does not officially support it" in text
    assert "which Triton does not support" not in text


def test_chapter_07_h200_table_is_narrow():
    from flashtut.figures import triton_plots

    table = triton_plots.results_table(_load("triton_h200.json"))
    header = table.splitlines()[0]
    assert header.count("|") - 1 <= 7
    # no number with an exponent, whose hyphen a browser may break a line at ("1.1e-/04")
    assert not re.search(r"\de-\d", table)


# --- one caption scheme in every chapter ------------------------------------------------------------

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem[:2] for p in NOTEBOOKS])
def test_captions_follow_one_scheme(path):
    """Figures are numbered "Figure C.N:" by chapter: by the book build for a captioned figure cell
    (``mystnb.figure.caption``; ``book/_ext`` numbers them per chapter), or written so by hand in a
    Markdown cell, never both in one chapter, never "Fig. N" or an unnumbered "Figure.", and hand
    numbers run 1, 2, ... with the chapter's own number in front."""
    chapter = int(path.stem[:2])
    cells = json.loads(path.read_text())["cells"]
    captioned = [c for c in cells if "figure" in c.get("metadata", {}).get("mystnb", {})]
    text = "\n".join("".join(c["source"]) for c in cells)
    by_hand = [(int(a), int(b)) for a, b in re.findall(r"^\*Figure (\d+)\.(\d+):", text, re.M)]
    assert not (captioned and by_hand), f"{path.name} mixes numbered captions written by hand with captioned cells"
    assert by_hand == [(chapter, i) for i in range(1, len(by_hand) + 1)], by_hand
    assert not re.search(r"\*\*Figure\.\*\*|\bFig\. \d|Figure\.\*\*", text)
    for c in captioned:
        caption = c["metadata"]["mystnb"]["figure"]["caption"]
        assert not re.match(r"\s*(Figure|Fig\.)\s*\d", caption), f"{path.name}: the build numbers it: {caption[:60]}"

"""The worklogs' tables are what the generators print from the committed JSON: a re-measurement or a
hand edit that makes them drift fails here. The Hopper worklog's option-by-option diary lives with its
experiment (experiments/hopper_options/LOG.md, data in its data/ folder); its tables are checked the same
way, as part of that worklog."""
from pathlib import Path

import pytest

from conftest import load_committed
from flashtut import repository, results_data
from flashtut.bench import profile
from flashtut.bench.report import BWD_GRID_COLUMNS
from flashtut.figures.triton_plots import final_measurement_markdown

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
#: a worklog's diary continued in an experiment's log
CONTINUED = {"perflog_hopper.md": ROOT / "experiments" / "hopper_options" / "LOG.md"}


load_results = load_committed


def page_text(page: str) -> str:
    text = (BOOK / page).read_text()
    return text + ("\n" + CONTINUED[page].read_text() if page in CONTINUED else "")


@pytest.mark.parametrize("page,kwargs", [
    ("perflog_triton.md", dict(impl="triton")),
    ("perflog_cuda.md", dict(impl="cuda")),
    ("perflog_cuda_bwd.md", dict(impl="cuda", modes=("bwd",))),
])
def test_final_measurement_tables_match_the_data(page, kwargs):
    text = page_text(page)
    rows, prov = load_results("bench_h200_kernels.json")
    generated = final_measurement_markdown(rows, prov[0], **kwargs)
    table_lines = [l for l in generated.splitlines() if l.startswith("|")]
    assert len(table_lines) > 10
    for line in table_lines:
        assert line in text, f"{page}: generated row missing or changed:\n{line}"


#: the Hopper log's ladder table: every rung of hopper_h200.json against the kernels timed with it
HOPPER_LADDER = ("sdpa-flash", "sdpa-cudnn", "cuda-mma", "hopper-w1", "hopper-w2", "hopper-w3", "hopper-w3[c3]")


def test_hopper_ladder_table_matches_the_data():
    from flashtut.bench.report import format_ratio_table, ratio_table

    text = page_text("perflog_hopper.md")
    rows, _ = load_results("hopper_h200.json")
    keep = [r for r in rows if r["impl"] in HOPPER_LADDER]
    table_lines = [l for l in format_ratio_table(ratio_table(keep)).splitlines() if l.startswith("|")]
    assert len(table_lines) == 2 + 16
    assert all(f"{impl} / sdpa-flash" in table_lines[0] for impl in HOPPER_LADDER[1:])
    for line in table_lines:
        assert line in text, f"perflog_hopper.md: generated row missing or changed:\n{line}"


def _assert_in_page(page: str, lines: list[str]) -> None:
    text = page_text(page)
    for line in lines:
        assert line in text, f"{page}: generated line missing or changed:\n{line}"


#: the Hopper log's W3 table: TFLOP/s (ratio to SDPA flash) of cuDNN and the TMA rungs, per case
HOPPER_W3_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W2": "hopper-w2", "W3": "hopper-w3"}
#: the Hopper log's ring-depth table: W3 with 2, 3 and 4 K/V stages (hopper_ring_h200.json)
HOPPER_RING_COLUMNS = {"W3, 2 stages": "hopper-w3", "3 stages": "hopper-w3[s3]", "4 stages": "hopper-w3[s4]"}
#: the Hopper log's three-consumer table (D = 64 only: the build exists there alone)
HOPPER_C3_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W3, 2 consumers": "hopper-w3", "W3, 3 consumers": "hopper-w3[c3]"}
#: the Hopper log's W4 table (hopper_w4_h200.json): W3 and W4 with cuda_attention's consumers per head dim
HOPPER_W4_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W3": {128: "hopper-w3", 64: "hopper-w3[c3]"},
                     "W4": {128: "hopper-w4", 64: "hopper-w4[c3]"}}
#: the Hopper log's tables of W3's build options (configs.W3_OPTIONS), at cuda_attention's consumers per head dim
_W3 = {128: "hopper-w3", 64: "hopper-w3[c3]"}
HOPPER_SOFTMAX_COLUMNS = {"W3": _W3, "1 of 8 by the cubic": {128: "hopper-w3[poly1]", 64: "hopper-w3[c3,poly1]"},
                          "2 of 8": {128: "hopper-w3[poly2]", 64: "hopper-w3[c3,poly2]"},
                          "rows as trees": {128: "hopper-w3[tree]", 64: "hopper-w3[c3,tree]"}}
HOPPER_OPTIONS_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W3": _W3,
                          "W4's order": {128: "hopper-w3[order]", 64: "hopper-w3[c3,order]"},
                          "TMA store": {128: "hopper-w3[store]", 64: "hopper-w3[c3,store]"}}
HOPPER_C3_TILES_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W3, 3 consumers": "hopper-w3[c3]", "3 stages": "hopper-w3[c3,s3]",
                           "64-key tiles": "hopper-w3[c3,n64]"}
HOPPER_HEADS_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W3": {128: "hopper-w3[store]", 64: "hopper-w3[c3]"},
                        "heads first": {128: "hopper-w3[heads,store]", 64: "hopper-w3[c3,heads]"}}
#: the Hopper log's tables of the three consumers' turns (D = 64 only)
HOPPER_TURNS_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W3, 3 consumers": "hopper-w3[c3]", "with turns": "hopper-w3[c3,turns]"}
HOPPER_TURNS_STACK_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "turns": "hopper-w3[c3,turns]",
                              "+ TMA store": "hopper-w3[c3,turns,store]", "+ rows as trees": "hopper-w3[c3,turns,tree]",
                              "+ 1 of 8 by the cubic": "hopper-w3[c3,turns,poly1]", "W4": "hopper-w4[c3]",
                              "W4 with turns": "hopper-w4[c3,turns]"}
HOPPER_TURNS_STORE_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "turns": "hopper-w3[c3,turns]",
                              "+ TMA store": "hopper-w3[c3,turns,store]"}
HOPPER_W4_STATIC_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W3 (cuda_attention)": {128: "hopper-w3[store]", 64: "hopper-w3[c3,turns]"},
                            "W4": {128: "hopper-w4", 64: "hopper-w4[c3]"},
                            "W4, static": {128: "hopper-w4[static]", 64: "hopper-w4[c3,static]"}}
#: the softmax pins, the lazy rescale and the stepped descriptors, each on cuda_attention's build at its head dim
HOPPER_PIN_COLUMNS = {64: {"sdpa-cudnn": "sdpa-cudnn", "turns (cuda_attention)": "hopper-w3[c3,turns]",
                           "+ pin": "hopper-w3[c3,turns,pin]", "+ lazy": "hopper-w3[c3,turns,lazy]",
                           "+ pin + lazy": "hopper-w3[c3,turns,pin,lazy]"},
                      128: {"sdpa-cudnn": "sdpa-cudnn", "store (cuda_attention)": "hopper-w3[store]",
                            "+ pin": "hopper-w3[store,pin]", "+ lazy": "hopper-w3[store,lazy]",
                            "+ pin + lazy": "hopper-w3[store,pin,lazy]"}}
HOPPER_ANCHOR_COLUMNS = {64: {"sdpa-cudnn": "sdpa-cudnn", "turns (cuda_attention)": "hopper-w3[c3,turns]",
                              "+ anchor": "hopper-w3[c3,turns,anchor]", "+ pin": "hopper-w3[c3,turns,pin]"},
                         128: {"sdpa-cudnn": "sdpa-cudnn", "store (cuda_attention)": "hopper-w3[store]",
                               "+ anchor": "hopper-w3[store,anchor]", "+ pin": "hopper-w3[store,pin]"}}
HOPPER_DS_COLUMNS = {64: {"sdpa-cudnn": "sdpa-cudnn", "turns (cuda_attention)": "hopper-w3[c3,turns]",
                          "+ ds": "hopper-w3[c3,turns,ds]", "W4, turns": "hopper-w4[c3,turns]",
                          "W4, turns + ds": "hopper-w4[c3,turns,ds]"},
                     128: {"sdpa-cudnn": "sdpa-cudnn", "store (cuda_attention)": "hopper-w3[store]",
                           "+ ds": "hopper-w3[store,ds]", "+ pin": "hopper-w3[store,pin]",
                           "+ pin + ds": "hopper-w3[store,pin,ds]", "W4": "hopper-w4", "W4 + ds": "hopper-w4[ds]"}}
#: the CUDA logs' protocol tables: cuda_attention's default, its mma.sync forward, and cuDNN for scale
CUDA_PROTOCOL_COLUMNS = {"cuda-mma": "cuda-mma", "cuda": "cuda", "sdpa-cudnn": "sdpa-cudnn"}

#: (page, data file, columns, mode, head dim or None for all, cases): the per-case tables the logs
#: print with report.case_table
CASE_TABLES = [
    ("perflog_hopper.md", "hopper_h200.json", HOPPER_W3_COLUMNS, "fwd", None, 16),
    ("perflog_hopper.md", "hopper_h200.json", HOPPER_C3_COLUMNS, "fwd", 64, 8),
    ("perflog_hopper.md", "hopper_ring_h200.json", HOPPER_RING_COLUMNS, "fwd", None, 8),
    ("perflog_hopper.md", "hopper_w4_h200.json", HOPPER_W4_COLUMNS, "fwd", None, 16),
    ("perflog_hopper.md", "hopper_softmax_h200.json", HOPPER_SOFTMAX_COLUMNS, "fwd", None, 16),
    ("perflog_hopper.md", "hopper_options_h200.json", HOPPER_OPTIONS_COLUMNS, "fwd", None, 16),
    ("perflog_hopper.md", "hopper_c3_tiles_h200.json", HOPPER_C3_TILES_COLUMNS, "fwd", None, 8),
    ("perflog_hopper.md", "hopper_heads_h200.json", HOPPER_HEADS_COLUMNS, "fwd", None, 16),
    ("perflog_hopper.md", "hopper_turns_h200.json", HOPPER_TURNS_COLUMNS, "fwd", None, 8),
    ("perflog_hopper.md", "hopper_turns_stack_h200.json", HOPPER_TURNS_STACK_COLUMNS, "fwd", None, 8),
    ("perflog_hopper.md", "hopper_turns_store_h200.json", HOPPER_TURNS_STORE_COLUMNS, "fwd", None, 8),
    ("perflog_hopper.md", "hopper_w4_static_h200.json", HOPPER_W4_STATIC_COLUMNS, "fwd", None, 16),
    ("perflog_hopper.md", "hopper_w4_named_h200.json", {"sdpa-cudnn": "sdpa-cudnn",
     "W4": {128: "hopper-w4", 64: "hopper-w4[c3,turns]"}, "W4, named": {128: "hopper-w4[named]", 64: "hopper-w4[c3,turns,named]"}},
     "fwd", None, 16),
    *(("perflog_hopper.md", f"hopper_{name}_d{D}_h200.json", columns[D], "fwd", None, 8)
      for name, columns in (("pin", HOPPER_PIN_COLUMNS), ("anchor", HOPPER_ANCHOR_COLUMNS), ("ds", HOPPER_DS_COLUMNS))
      for D in (64, 128)),
    ("perflog_hopper.md", "hopper_ds_d64_swapped_h200.json", {"sdpa-cudnn": "sdpa-cudnn",
     "+ ds (timed first)": "hopper-w3[c3,turns,ds]", "turns (cuda_attention)": "hopper-w3[c3,turns]"}, "fwd", None, 8),
    ("perflog_hopper.md", "hopper_pin_d128_swapped_h200.json", {"sdpa-cudnn": "sdpa-cudnn",
     "+ pin (timed first)": "hopper-w3[store,pin]", "store (cuda_attention)": "hopper-w3[store]"}, "fwd", None, 8),
    ("perflog_hopper.md", "hopper_ds_d64_again_h200.json",
     {k: v for k, v in HOPPER_DS_COLUMNS[64].items() if "W4" not in k}, "fwd", None, 8),
    ("perflog_cuda_bwd.md", "cuda_ladder_bwd_h200.json", BWD_GRID_COLUMNS, "bwd", None, 16),
    ("perflog_cuda.md", "cuda_protocol_h200.json", CUDA_PROTOCOL_COLUMNS, "fwd", None, 16),
    ("perflog_cuda_bwd.md", "cuda_protocol_h200.json", CUDA_PROTOCOL_COLUMNS, "bwd", None, 16),
]


@pytest.mark.parametrize("page,data,columns,mode,head_dim,cases", CASE_TABLES,
                         ids=[f"{p}:{d}:{m}" + (f":D{h}" if h else "") for p, d, _, m, h, _ in CASE_TABLES])
def test_case_tables_match_the_data(page, data, columns, mode, head_dim, cases):
    from flashtut.bench.report import case_table, format_table

    rows, _ = load_results(data)
    if head_dim is not None:
        rows = [r for r in rows if r.get("D") == head_dim]
    table_lines = format_table(*case_table(rows, columns, mode=mode), markdown=True).splitlines()
    assert len(table_lines) == 2 + cases
    _assert_in_page(page, table_lines)


def test_hopper_tensor_map_ab_table_matches_the_data():
    """The pageable-against-pinned tensor maps A/B (hopper_ab_h200.json), as hopper_ab.ab_table prints it."""
    from flashtut.bench.paired import ab_table
    from flashtut.bench.report import format_table

    rows, _ = load_results("hopper_ab_h200.json")
    table_lines = format_table(*ab_table(rows), markdown=True).splitlines()
    assert len(table_lines) == 2 + 16                 # 8 cases x 2 budgets
    _assert_in_page("perflog_hopper.md", table_lines)


@pytest.mark.parametrize("page,data,impls,mode", [
    ("perflog_cuda_bwd.md", "cuda_ladder_bwd_h200.json", None, "bwd"),
    ("perflog_cuda.md", "cuda_protocol_h200.json", list(CUDA_PROTOCOL_COLUMNS), "fwd"),
    ("perflog_cuda_bwd.md", "cuda_protocol_h200.json", list(CUDA_PROTOCOL_COLUMNS), "bwd"),
])
def test_ratio_summaries_match_the_data(page, data, impls, mode):
    # "D = 128: name gmean (min to max); ..." per head dim; the ladder's run lists every configuration
    from flashtut.bench.report import format_ratio_summary, ratio_summary
    from flashtut.cuda.configs import experiment_configs

    rows, _ = load_results(data)
    names = {}
    if impls is None:
        impls = [f"cuda-bwd-{name}" for name in experiment_configs(64)]
        names = {i: i[len("cuda-bwd-"):] for i in impls}
    summary = format_ratio_summary(ratio_summary(rows, impls, mode=mode), names)
    assert len(summary) == 2
    _assert_in_page(page, summary)


def test_the_mma_sync_targets_on_the_committed_protocol():
    # the targets of the mma.sync kernels: the forward >= 0.95x SDPA flash everywhere, median >= 1.0; the
    # backward >= 0.85x, median >= 0.9. The forward's floor is checked more loosely than it is stated, because
    # at D = 128, N = 4096, not causal it lies inside the run-to-run noise (0.945 to 0.966 over five protocol
    # runs of unchanged kernels): at most one case below 0.95 and none below 0.94. A slower kernel moves several
    # cases at once (1.5% slower everywhere puts a case below 0.94), so this still fails on a regression. The
    # worklog's table of runs carries this file's row as the data has it.
    import statistics

    rows, prov = load_results("cuda_protocol_h200.json")
    ratios = {}
    for impl, mode, floor, median in (("cuda-mma", "fwd", 0.95, 1.0), ("cuda-mma", "bwd", 0.85, 0.9),
                                      ("cuda", "bwd", 0.85, 0.9)):
        flash = {(r["D"], r["N"], r["dtype"], r["causal"]): r["tflops"] for r in rows
                 if r["impl"] == "sdpa-flash" and r["mode"] == mode}
        x = {(r["D"], r["N"], r["dtype"], r["causal"]): r["tflops"] / flash[(r["D"], r["N"], r["dtype"], r["causal"])]
             for r in rows if r["impl"] == impl and r["mode"] == mode}
        assert len(x) == 16
        assert statistics.median(x.values()) >= median, (impl, mode, sorted(x.values()))
        if mode == "bwd":
            assert {k for k, v in x.items() if v < floor} == set(), (impl, mode)
        ratios[impl, mode] = x
    fwd = ratios["cuda-mma", "fwd"]
    below = {k: v for k, v in fwd.items() if v < 0.95}
    assert len(below) <= 1 and min(fwd.values()) >= 0.94, sorted(fwd.values())
    worst, median = min(fwd.values()), statistics.median(fwd.values())
    d, n, dtype, causal = min(fwd, key=fwd.get)
    case = f"{dtype}, D = {d}, N = {n}, {'causal' if causal else 'not causal'}"
    row = (f"| {prov[0]['date'][:10]} {prov[0]['date'][11:16]} UTC (this file) | {prov[0]['git']['commit'][:7]} "
           f"| {worst:.3f} ({case}) | {median:.3f} | "
           + (f"missed in {len(below)} case" if below else "met") + " |")
    assert row in page_text("perflog_cuda.md"), row


#: the Hopper log's Nsight Compute tables generated from ncu_hopper_h200.json: (set, [(label, impl, D, causal)])
def _ladder_profile():
    entries = []
    for D, more in ((128, [("W3, TMA store", "hopper-w3[store]"), ("W4", "hopper-w4")]),
                    (64, [("W3, 3 consumers", "hopper-w3[c3]"), ("W3, 3 consumers, turns", "hopper-w3[c3,turns]"),
                          ("W4, 3 consumers", "hopper-w4[c3]")])):
        base = [("SDPA flash", "sdpa-flash"), ("mma.sync", "cuda-mma"), ("W1", "hopper-w1"), ("W2", "hopper-w2"),
                ("W3", "hopper-w3")]
        entries += [(label, impl, D, False) for label, impl in base + more]
    return entries


PROFILE_TABLES = [
    ("ladder", _ladder_profile()),
    ("options", [("W3, 3 consumers", "hopper-w3[c3]", 64, False), ("with turns", "hopper-w3[c3,turns]", 64, False),
                 ("W3, 3 consumers, causal", "hopper-w3[c3]", 64, True),
                 ("with turns, causal", "hopper-w3[c3,turns]", 64, True)]),
]


#: the profile of the softmax pins, the lazy rescale and the stepped descriptors (set overlap)
OVERLAP_PROFILE = [(label + (", causal" if causal else ""), base if not option else base[:-1] + f",{option}]", D, causal)
                   for D, base in ((128, "hopper-w3[store]"), (64, "hopper-w3[c3,turns]")) for causal in (False, True)
                   for option, label in (("", "cuda_attention's build"), ("pin", "+ pin"), ("anchor", "+ anchor"),
                                         ("lazy", "+ lazy"), ("ds", "+ ds"))]


#: cuda_attention's Hopper build as it ships beside the build the other profiles launch (set shipped)
SHIPPED_PROFILE = profile.shipped_entries(128) + profile.shipped_entries(64)


@pytest.mark.parametrize("set_name,entries,data", [(s, e, "ncu_hopper_h200.json") for s, e in PROFILE_TABLES]
                         + [("overlap", OVERLAP_PROFILE, "ncu_overlap_h200.json"),
                            ("shipped", SHIPPED_PROFILE, "ncu_shipped_h100.json")],
                         ids=[s for s, _ in PROFILE_TABLES] + ["overlap", "shipped"])
def test_hopper_profile_tables_match_the_data(set_name, entries, data):
    from flashtut.bench.report import format_table

    rows, _ = load_results(data)
    table_lines = format_table(*profile.table(rows, entries, set_name=set_name), markdown=True).splitlines()
    assert len(table_lines) == 2 + len(entries)
    _assert_in_page("perflog_hopper.md", table_lines)


def test_the_shipped_profiles_prose_reads_its_data():
    """The table covers exactly the set's launches, and the paragraph under it quotes the data: the
    shipped D = 64 build's time saved and barrier stall, and the same wgmma count and registers."""
    rows, _ = load_results("ncu_shipped_h100.json")
    assert sorted((impl, D, causal) for _, impl, D, causal in SHIPPED_PROFILE) == sorted(
        (impl, D, causal) for D in (128, 64) for impl, causal in profile.launches("shipped", D))
    page = page_text("perflog_hopper.md")
    before, shipped = (impl for _, impl, _, causal in profile.shipped_entries(64) if not causal)

    def get(impl, causal, name):
        return profile.metric(rows, impl, 64, causal, name, set_name="shipped")

    text = " ".join(page.split())
    for causal, quoted in ((False, "{:.1f}% shorter without a mask"), (True, "{:.1f}% shorter causal")):
        saved = 1 - get(shipped, causal, profile.DURATION) / get(before, causal, profile.DURATION)
        assert quoted.format(100 * saved) in text
        for name in ("sm__inst_executed_pipe_tensor_op_gmma.sum", "launch__registers_per_thread"):
            assert get(shipped, causal, name) == get(before, causal, name)
    barrier = profile.STALL.format("barrier")
    assert f"{get(before, True, barrier):.2f} to {get(shipped, True, barrier):.2f}" in text


def test_pair_table_takes_the_median_of_each_rounds_ratio_and_counts_the_rounds_won():
    """hopper_ab --pair: B against A is the median over the rounds of the ratio of the two timed in that
    round (not the ratio of two medians), and a round counts as won only when B is strictly faster."""
    from flashtut.bench.paired import pair_table

    def row(impl, rnd, tflops, causal=False):
        return dict(kind="speed", impl=impl, mode="fwd", dtype="float16", D=64, N=4096, causal=causal,
                    tflops=tflops, round=rnd, status="ok")

    a, b = "hopper-w3[c3,turns]", "hopper-w3[c3,turns,uni]"
    # rounds where both drift: B/A per round is 1.10, 1.00, 1.02 (median 1.02); medians alone give 410/400
    rows = [row(a, 0, 400), row(b, 0, 440), row(a, 1, 500), row(b, 1, 500), row(a, 2, 300), row(b, 2, 306)]
    rows += [row("sdpa-flash", r, 250) for r in range(3)]
    rows += [row(a, 0, 100, causal=True)]   # a case without B is left out
    header, body = pair_table(rows, a, b)
    assert header[-2:] == ["B / A (median)", "B won"]
    assert body == [["64", "4096", "fp16", "no", "250", "400 (1.60)", "440 (1.76)", "+2.0%", "2 of 3"]]


#: each worklog's "What we learned" table: (data file, rungs for report.ladder_summary)
WORKLOG_LADDERS = {
    "perflog_triton.md": ("bench_h200_kernels.json", {
        "Triton forward (chapter 7)": ("triton", "fwd"), "Triton backward": ("triton", "bwd")}),
    "perflog_cuda.md": ("cuda_ladder_h200.json", {
        "v3: 8 warps, cp.async double buffer": "cuda-v3", "v4": "cuda-v4", "v5": "cuda-v5", "v6": "cuda-v6",
        "v7": "cuda-v7"}),
    "perflog_cuda_bwd.md": ("cuda_ladder_bwd_h200.json", {
        "separate dQ pass": "cuda-bwd-separate-dq", "atomic dQ, 8 warps": "cuda-bwd-atomic-dq-w8",
        "atomic dQ, one barrier": "cuda-bwd-atomic-dq-w8-1bar",
        "warp grid 2 x 4": "cuda-bwd-atomic-dq-w8-split2x4"}),
    "perflog_hopper.md": ("hopper_h200.json", {
        "mma.sync forward (chapter 8)": "cuda-mma", "W1: wgmma": "hopper-w1",
        "W2: TMA ring, producer warpgroup": "hopper-w2", "W3: ping-pong, S issued before the softmax": "hopper-w3",
        "W3, three consumers": {64: "hopper-w3[c3]"}, "SDPA cuDNN": "sdpa-cudnn"}),
}


@pytest.mark.parametrize("page", sorted(WORKLOG_LADDERS))
def test_each_worklog_opens_with_what_we_learned_and_its_ladder_from_the_data(page):
    from flashtut.bench.report import format_table, ladder_summary

    data, rungs = WORKLOG_LADDERS[page]
    rows, _ = load_results(data)
    table = format_table(*ladder_summary(rows, rungs, mode="bwd" if "bwd" in page else "fwd"), markdown=True)
    text = (BOOK / page).read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## What we learned", f"{page} opens with {headings[0]!r}"
    learned = text[text.index("## What we learned"):text.index(headings[1])]
    assert table in learned, f"{page}: the ladder table is not the one the data gives:\n{table}"
    lessons = [line for line in learned.splitlines() if line.startswith("- **")]
    assert 3 <= len(lessons) <= 5, f"{page}: {len(lessons)} lessons"
    assert len(learned.split()) < 600, f"{page}: 'What we learned' is {len(learned.split())} words: one page"


def test_the_worklogs_are_the_books_appendix():
    toc = (ROOT / "_toc.yml").read_text()
    part = toc[toc.index("- caption: Worklogs"):]
    for page in WORKLOG_LADDERS:
        assert f"file: book/{page[:-3]}" in part, page


def test_the_hopper_worklog_links_its_experiments_log_through_the_repository():
    text = (BOOK / "perflog_hopper.md").read_text()
    section = text[text.index("## The options that were tried"):]
    assert repository.file_url("experiments/hopper_options/LOG.md") in section
    assert "../experiments" not in text and "](experiments" not in text      # never a path outside the book
    assert CONTINUED["perflog_hopper.md"].is_file()

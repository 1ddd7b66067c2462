"""The perf logs' final-measurement tables are what the generator prints from the committed JSON:
a re-measurement or a hand edit that makes them drift fails here."""
from pathlib import Path

import pytest

from flashtut.figures.triton_plots import final_measurement_markdown
from flashtut.results_data import load_results

BOOK = Path(__file__).resolve().parents[2] / "book"


@pytest.mark.parametrize("page,kwargs", [
    ("perflog_triton.md", dict(impl="triton")),
    ("perflog_cuda.md", dict(impl="cuda")),
    ("perflog_cuda_bwd.md", dict(impl="cuda", modes=("bwd",))),
])
def test_final_measurement_tables_match_the_data(page, kwargs):
    text = (BOOK / page).read_text()
    rows, prov = load_results("bench_h200_kernels.json")
    generated = final_measurement_markdown(rows, prov[0], **kwargs)
    table_lines = [l for l in generated.splitlines() if l.startswith("|")]
    assert len(table_lines) > 10
    for line in table_lines:
        assert line in text, f"{page}: generated row missing or changed:\n{line}"


#: the Hopper log's ladder table: every rung of hopper_h200.json against the kernels timed with it
HOPPER_LADDER = ("sdpa-flash", "sdpa-cudnn", "cuda-mma", "hopper-w1", "hopper-w2", "hopper-w3")


def test_hopper_ladder_table_matches_the_data():
    from flashtut.bench.report import format_ratio_table, ratio_table

    text = (BOOK / "perflog_hopper.md").read_text()
    rows, _ = load_results("hopper_h200.json")
    keep = [r for r in rows if r["impl"] in HOPPER_LADDER]
    table_lines = [l for l in format_ratio_table(ratio_table(keep)).splitlines() if l.startswith("|")]
    assert len(table_lines) == 2 + 16
    assert all(f"{impl} / sdpa-flash" in table_lines[0] for impl in HOPPER_LADDER[1:])
    for line in table_lines:
        assert line in text, f"perflog_hopper.md: generated row missing or changed:\n{line}"


#: the Hopper log's W3 table: TFLOP/s (ratio to SDPA flash) of cuDNN and the TMA rungs, per case
HOPPER_W3_COLUMNS = {"sdpa-cudnn": "sdpa-cudnn", "W2": "hopper-w2", "W3": "hopper-w3"}


def test_hopper_w3_table_matches_the_data():
    from flashtut.bench.report import case_table, format_table

    text = (BOOK / "perflog_hopper.md").read_text()
    rows, _ = load_results("hopper_h200.json")
    table_lines = format_table(*case_table(rows, HOPPER_W3_COLUMNS, mode="fwd"), markdown=True).splitlines()
    assert len(table_lines) == 2 + 16
    for line in table_lines:
        assert line in text, f"perflog_hopper.md: generated row missing or changed:\n{line}"


def test_hopper_tensor_map_ab_table_matches_the_data():
    """The pageable-against-pinned tensor maps A/B (hopper_ab_h200.json), as hopper_ab.ab_table prints it."""
    from flashtut.bench.hopper_ab import ab_table
    from flashtut.bench.report import format_table

    text = (BOOK / "perflog_hopper.md").read_text()
    rows, _ = load_results("hopper_ab_h200.json")
    table_lines = format_table(*ab_table(rows), markdown=True).splitlines()
    assert len(table_lines) == 2 + 16                 # 8 cases x 2 budgets
    for line in table_lines:
        assert line in text, f"perflog_hopper.md: generated row missing or changed:\n{line}"


#: the Hopper log's ring-depth table: W3 with 2, 3 and 4 K/V stages (hopper_ring_h200.json)
HOPPER_RING_COLUMNS = {"W3, 2 stages": "hopper-w3", "3 stages": "hopper-w3[s3]", "4 stages": "hopper-w3[s4]"}


def test_hopper_ring_table_matches_the_data():
    from flashtut.bench.report import case_table, format_table

    text = (BOOK / "perflog_hopper.md").read_text()
    rows, _ = load_results("hopper_ring_h200.json")
    table_lines = format_table(*case_table(rows, HOPPER_RING_COLUMNS, mode="fwd"), markdown=True).splitlines()
    assert len(table_lines) == 2 + 8
    for line in table_lines:
        assert line in text, f"perflog_hopper.md: generated row missing or changed:\n{line}"


def test_warp_grid_backward_table_matches_the_data():
    from flashtut.bench.cuda_ladder import BWD_GRID_COLUMNS
    from flashtut.bench.report import case_table, format_ratio_summary, format_table, ratio_summary
    from flashtut.cuda.configs import experiment_configs

    text = (BOOK / "perflog_cuda_bwd.md").read_text()
    rows, _ = load_results("cuda_ladder_bwd_h200.json")
    header, body = case_table(rows, BWD_GRID_COLUMNS)
    table_lines = format_table(header, body, markdown=True).splitlines()
    assert len(table_lines) == 2 + 16
    impls = [f"cuda-bwd-{name}" for name in experiment_configs(64)]
    summary = format_ratio_summary(ratio_summary(rows, impls), {i: i[len("cuda-bwd-"):] for i in impls})
    assert len(summary) == 2
    for line in table_lines + summary:
        assert line in text, f"perflog_cuda_bwd.md: generated line missing or changed:\n{line}"


@pytest.mark.parametrize("page,mode", [("perflog_cuda.md", "fwd"), ("perflog_cuda_bwd.md", "bwd")])
def test_cuda_protocol_tables_match_the_data(page, mode):
    # the protocol of cuda_attention (cuda: its default; cuda-mma: the mma.sync forward) against SDPA flash
    from flashtut.bench.report import case_table, format_ratio_summary, format_table, ratio_summary

    text = (BOOK / page).read_text()
    rows, _ = load_results("cuda_protocol_h200.json")
    columns = {"cuda-mma": "cuda-mma", "cuda": "cuda"}
    table_lines = format_table(*case_table(rows, columns, mode=mode), markdown=True).splitlines()
    assert len(table_lines) == 2 + 16
    summary = format_ratio_summary(ratio_summary(rows, list(columns), mode=mode))
    assert len(summary) == 2
    for line in table_lines + summary:
        assert line in text, f"{page}: generated line missing or changed:\n{line}"


def test_issue_13_targets_hold_on_the_committed_protocol():
    # the mma.sync forward: >= 0.95x SDPA flash everywhere, median >= 1.0; the backward: >= 0.85x, median >= 0.9
    import statistics

    rows, _ = load_results("cuda_protocol_h200.json")
    for impl, mode, floor, median in (("cuda-mma", "fwd", 0.95, 1.0), ("cuda-mma", "bwd", 0.85, 0.9),
                                      ("cuda", "bwd", 0.85, 0.9)):
        flash = {(r["D"], r["N"], r["dtype"], r["causal"]): r["tflops"] for r in rows
                 if r["impl"] == "sdpa-flash" and r["mode"] == mode}
        ratios = [r["tflops"] / flash[(r["D"], r["N"], r["dtype"], r["causal"])] for r in rows
                  if r["impl"] == impl and r["mode"] == mode]
        assert len(ratios) == 16
        assert min(ratios) >= floor and statistics.median(ratios) >= median, (impl, mode, sorted(ratios))

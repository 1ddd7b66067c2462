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


def test_hopper_w3_table_matches_the_data():
    # W3's own table: TFLOP/s of W3, W2 and both SDPA backends, and W3 over SDPA flash
    from flashtut.bench.report import case_table

    text = (BOOK / "perflog_hopper.md").read_text()
    rows, _ = load_results("hopper_h200.json")
    table = case_table(rows, ["sdpa-flash", "sdpa-cudnn", "hopper-w2", "hopper-w3"],
                       ratio=("hopper-w3", "sdpa-flash"))
    table_lines = table.splitlines()
    assert len(table_lines) == 2 + 16
    for line in table_lines:
        assert line in text, f"perflog_hopper.md: generated row missing or changed:\n{line}"


def test_case_table_lines_up_the_implementations_of_each_case():
    from flashtut.bench.report import case_table

    def row(impl, tflops, **case):
        return dict(dict(kind="speed", impl=impl, mode="fwd", dtype="float16", B=1, H=1, Nq=256, Nk=256,
                         D=64, causal=False, tflops=tflops), **case)

    rows = [row("a", 100.0), row("b", 150.0), row("a", 90.0, D=128), row("b", 200.0, D=128),
            row("a", 80.0, causal=True)]                          # b has no causal case: no line
    lines = case_table(rows, ["a", "b"], ratio=("b", "a"), markdown=False).splitlines()
    assert lines[0].split() == ["D", "N", "dtype", "causal", "a", "b", "b", "/", "a"]
    assert [l.split() for l in lines[2:]] == [["128", "256", "float16", "no", "90.0", "200.0", "2.22"],
                                               ["64", "256", "float16", "no", "100.0", "150.0", "1.50"]]

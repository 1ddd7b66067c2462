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

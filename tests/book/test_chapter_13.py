"""Chapter 13 (masks and score modifications): its figures and tables compute what they say, and
the chapter keeps the book's rules for a measured figure (folded code, read from book/data)."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import load_committed, measured_cells, notebook_cells  # noqa: E402

import flashtut  # noqa: E402
from flashtut import masks  # noqa: E402
from flashtut.figures import flex_plots  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "13_masks.ipynb"


def _row(impl, mode, mask, ms, err):
    return dict(kind="speed", status="ok", impl=impl, mode=mode, mask=mask, D=128, dtype="float16", N=4096,
                B=4, H=16, ms=ms, tflops=100.0 / ms, err={"o": err})


def test_the_ratio_is_their_time_over_ours_and_the_error_ratio_is_ours_over_theirs():
    rows = [_row("triton-flex", "fwd", "causal", 2.0, 1e-3), _row("flex", "fwd", "causal", 3.0, 2e-3),
            _row("triton-flex", "bwd", "causal", 5.0, 1e-3), _row("flex", "bwd", "causal", 4.0, 2e-3),
            _row("triton-flex", "fwd", "window", 1.0, 1e-3)]          # no PyTorch row: left out
    (e,) = flex_plots.versus_flex_rows(rows)
    assert e["mask"] == "causal"
    assert e["fwd_ratio"] == pytest.approx(1.5) and e["bwd_ratio"] == pytest.approx(0.8)
    assert e["err_ratio"] == pytest.approx(0.5)
    header, body = flex_plots.versus_flex_table(rows)
    # one cell per pass, the ratio and our TFLOP/s: 100 / 2 ms forward, 100 / 5 ms backward
    assert body == [["128", "float16", "4096", "causal", "1.50x (50)", "0.80x (20)", "0.50"]]
    assert len(header) == len(body[0])
    assert flex_plots.versus_flex_figure(rows) is not None
    with pytest.raises(ValueError, match="no mask measured"):
        flex_plots.versus_flex_figure(rows[-1:])


def test_the_tile_figure_draws_one_panel_per_mask():
    maps = {n: flashtut.create_block_mask(m, None, None, 64, 64, device="cpu", BLOCK_SIZE=16).kinds()[0, 0]
            for n, m in (("causal", masks.causal), ("window", masks.sliding_window(9)))}
    fig = flex_plots.tile_kinds_figure(maps)
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == ["causal", "window"]
    assert "10/16 tiles visited" in fig.axes[0].get_title()


def test_the_measured_section_reads_committed_data_in_folded_code_and_captions_it():
    # 13.7: the comparison with PyTorch's FlexAttention (experiments/flex), one table, then its reading
    cells = notebook_cells(NOTEBOOK.name)
    measured = measured_cells(cells)
    assert [files for _, _, files in measured] == [["flex_h100.json"]]
    (tags, (kind, after, _), _), = measured
    assert "hide-input" in tags
    src = next(s for k, s, _ in cells if k == "code" and "load_results" in s)
    assert "measured_caption(" in src and "Table 13.1: " in src and "versus_flex_table" in src
    # the short headers are spelled out in the caption
    assert "time over ours (our TFLOP/s), error as ours over PyTorch's" in src
    assert kind == "markdown" and "Ours is slower in every row" in after
    rows, _ = load_committed("flex_h100.json")
    assert {r["impl"] for r in rows if r.get("kind") == "speed"} == {"triton-flex", "flex", "triton"}
    assert flex_plots.versus_flex_rows(rows)          # both sides measured on the same cases
    # Table 13.1 fits a phone's column unwrapped (344 of 368 px at 400 px): five columns once the
    # chapter moves D and dtype to the caption, no cell longer than "0.92x (379)" nor header than
    # "mask / mod" (a table's columns take the width of their widest header unwrapped too)
    header, body = flex_plots.versus_flex_table([r for r in rows if r.get("kind") == "speed"])
    assert all(len({row[i] for row in body}) == 1 for i in (0, 1)) and len(header) == 7
    assert max(len(c) for row in body for c in row[2:]) <= 11 and max(map(len, header[2:])) <= 10
    headings = re.findall(r"^## (13\.\d+) ", "\n".join(s for k, s, _ in cells if k == "markdown"), re.M)
    assert headings == [f"13.{i}" for i in range(1, 8)]
    md = "\n".join(s for k, s, _ in cells if k == "markdown")
    assert md.index("## 13.7 Measured") < md.index("## Exercises")
    toc = (ROOT / "_toc.yml").read_text()
    assert toc.index("notebooks/12_real_model") < toc.index("notebooks/13_masks")


def test_the_chapter_draws_the_four_masks_of_the_issue():
    text = NOTEBOOK.read_text()
    for name in ("masks.causal", "masks.sliding_window", "masks.document", "masks.prefix_lm", "masks.alibi",
                 "masks.softcap"):
        assert name in text, name


def test_the_reading_of_13_7_quotes_the_committed_run():
    rows, _ = load_committed("flex_h100.json")
    table = flex_plots.versus_flex_rows(rows)

    def span(values):
        return f"{min(values):.2f} to {max(values):.2f}"

    ms = {(r["impl"], r["mask"], r["N"], r["mode"]): r["ms"] for r in rows if r.get("kind") == "speed"}

    def fixed(mask, mode):
        return [ms["triton", m, n, md] / ms["triton-flex", m, n, md] for (i, m, n, md) in ms
                if i == "triton" and m == mask and md == mode]

    reading = " ".join(next(s for k, s, _ in notebook_cells(NOTEBOOK.name)
                            if k == "markdown" and "Ours is slower in every row" in s).split())
    fwd, bwd = [e["fwd_ratio"] for e in table], [e["bwd_ratio"] for e in table]
    assert max(fwd + bwd) < 1.0                                     # "slower in every row"
    assert f"reaches {span(fwd)} of PyTorch's speed, the backward {span(bwd)}" in reading
    by_bwd = sorted(table, key=lambda e: e["bwd_ratio"])
    assert (by_bwd[0]["mask"], by_bwd[-1]["mask"]) == ("document", "softcap")
    assert f"at most {max(e['err_ratio'] for e in table):.2f}" in reading
    assert f"{span(fixed('causal', 'fwd'))} of its speed forward, {span(fixed('causal', 'bwd'))} backward" in reading
    assert f"the forward is close ({span(fixed('window', 'fwd'))})" in reading
    assert f"the backward at {span(fixed('window', 'bwd'))}" in reading
    build = {(r["impl"].startswith("flashtut"), r["mask"]): r["ms"] for r in rows if r.get("kind") == "host"}
    assert all(build[True, m] <= build[False, m] for _, m in build)  # "no slower than PyTorch's"

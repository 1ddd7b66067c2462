"""What chapter 14 draws and shows: its figures return figures from the numbers the package computes,
and the listings it displays fit the page."""
from __future__ import annotations

import inspect

import matplotlib

matplotlib.use("Agg")

import pytest

from flashtut.distributed import ring, ring_schedule, row_owner, training, work_per_rank
from flashtut.figures import ring_plots


def test_the_figures_draw_what_the_package_computes():
    steps = [ring_schedule(r, 3, 120, True) for r in range(3)]
    unit = max(s.pairs for rank in steps for s in rank)
    assert ring_plots.ring_timeline_figure([[(s.source, s.pairs / unit) for s in rank] for rank in steps], 0.5)
    panels = [(s, row_owner(24, 3, s), work_per_rank(24, 3, s, block=4)) for s in ("contiguous", "zigzag")]
    assert ring_plots.owner_figure(panels)
    assert ring_plots.merge_weights_figure([[1.0, 0.0], [0.4, 0.6]])


def test_row_owner_matches_the_cut():
    assert row_owner(8, 2, "zigzag") == [0, 0, 1, 1, 1, 1, 0, 0]
    assert row_owner(8, 2, "contiguous") == [0, 0, 0, 0, 1, 1, 1, 1]
    assert row_owner(6, 3, "striped") == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("fn", [ring.forward_step, ring.ring_forward, ring.ring_backward, training.train_step])
def test_shown_listings_fit_the_page(fn):
    # chapter 14 displays these with show_source: the listing box holds 88 characters
    long = [line for line in inspect.getsource(fn).splitlines() if len(line) > 88]
    assert not long, long


# -- exercise 14.1: the zigzag step plan ------------------------------------------------------

def test_the_solution_passes_the_checker():
    from flashtut.exercises import ch14

    assert ch14.check_step_plan(ch14.solution_step_plan)
    # and it is what the library's ring runs
    for world, n in ch14.CASES:
        for r in range(world):
            for s in ring_schedule(r, world, n, True):
                assert ch14.solution_step_plan(r, s.source, world, n) == (s.q_rows, s.kv_rows, s.causal)


def _every_pair_causal(rank, source, world, n):
    # one causal call per pair of whole shards: hides pairs a later key's early chunk should meet
    from flashtut.exercises import ch14

    lengths = [sum(e - b for b, e in ch14.shard_ranges(n, r, world, True)) for r in (rank, source)]
    return (0, lengths[0]), (0, lengths[1]), lengths[0] == lengths[1]


def _full_everywhere(rank, source, world, n):
    from flashtut.exercises import ch14

    mine, theirs = (sum(e - b for b, e in ch14.shard_ranges(n, r, world, True)) for r in (rank, source))
    return (0, mine), (0, theirs), False


def _skips_later_ranks(rank, source, world, n):
    from flashtut.exercises import ch14

    return ch14.solution_step_plan(rank, source, world, n) if source <= rank else ((0, 0), (0, 0), False)


@pytest.mark.parametrize("plan, says", [
    (_every_pair_causal, "causal mask hides"), (_full_everywhere, "which the causal mask hides"),
    (_skips_later_ranks, "never"), (lambda r, s, w, n: (0, 1), "expected (q_rows, kv_rows, causal)"),
    (lambda r, s, w, n: ((0, 10 ** 6), (0, 1), False), "outside"),
    (lambda r, s, w, n: ((0, 2), (0, 3), True), "square"),
])
def test_wrong_plans_fail_and_say_why(plan, says):
    from flashtut.exercises import ch14

    res = ch14.check_step_plan(plan)
    assert not res and says in res.message, res.message


def test_the_checker_takes_numpy_numbers():
    import numpy as np

    from flashtut.exercises import ch14

    def numpy_plan(rank, source, world, n):
        (a, b), (c, d), causal = ch14.solution_step_plan(rank, source, world, n)
        return (np.int64(a), np.int64(b)), (np.int32(c), np.int32(d)), np.bool_(causal)
    assert ch14.check_step_plan(numpy_plan)
    assert not ch14.check_step_plan(lambda r, s, w, n: ((0, 1), (0, 1), 1))


def test_the_chapter_quotes_the_balance_it_computes():
    import json
    from pathlib import Path

    from flashtut.distributed import balance_table

    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "14_ring_attention.ipynb").read_text())
    text = " ".join(" ".join("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")
    worst = next(r for r in balance_table(131072, worlds=(8,)) if r["scheme"] == "contiguous")
    assert f"the busiest of 8 GPUs work {1 + worst['imbalance']:.2f} times an even share" in text


# -- 14.6: the ring's compute path on one GPU, from the committed data ---------------------------

RING_DATA = "ring_compute_path_h100.json"


def _ring_row(world, mode, ratio, N=16384, dtype="float16", causal=False):
    return {"impl": f"ring-compute-w{world}", "mode": mode, "N": N, "dtype": dtype, "causal": causal,
            "world": world, "vs_unsharded": ratio}


def test_the_measured_table_holds_every_committed_ratio_in_its_cell():
    import json
    from pathlib import Path

    from flashtut import results_data

    doc = json.loads((Path(results_data.data_path(RING_DATA))).read_text())
    rows = doc["rows"]
    header, body = ring_plots.ring_compute_table(rows)
    worlds = sorted({r["world"] for r in rows if r["impl"].startswith("ring-compute")})
    assert header == ["dtype, N, mask"] + [f"{w} ranks" for w in worlds] == ["dtype, N, mask", "2 ranks",
                                                                            "4 ranks", "8 ranks"]
    cells = {line[0]: dict(zip(worlds, line[1:])) for line in body}
    base = {(r["dtype"], r["N"], r["causal"], r["mode"]): r["ms"] for r in rows if r["world"] == 1}
    ring_rows = [r for r in rows if r["impl"].startswith("ring-compute")]
    for r in ring_rows:
        # the ratio is the unsharded time over the ring's, as measured in the same process
        assert r["vs_unsharded"] == pytest.approx(base[(r["dtype"], r["N"], r["causal"], r["mode"])] / r["ms"])
        label = f"{'fp16' if r['dtype'] == 'float16' else 'bf16'}, {r['N'] // 1024}k, " \
                f"{'causal' if r['causal'] else 'full'}"
        fwd, bwd = cells[label][r["world"]].split(" / ")
        assert float(fwd if r["mode"] == "fwd" else bwd) == pytest.approx(r["vs_unsharded"], abs=0.005)
    # one line per measured case, none invented (bfloat16 at 64k was not reached in the run's budget)
    assert len(body) == len({(r["dtype"], r["N"], r["causal"]) for r in ring_rows}) == 6
    assert [line[0] for line in body[:2]] == ["fp16, 16k, full", "fp16, 16k, causal"]
    assert cells["fp16, 64k, full"][2] == "0.91 / 0.98" and cells["bf16, 16k, full"][8] == "0.09 / 0.31"


def test_the_measured_table_marks_a_missing_mode_and_refuses_foreign_rows():
    rows = [_ring_row(2, "fwd", 0.5), _ring_row(2, "bwd", 0.75), _ring_row(4, "fwd", 0.25),
            _ring_row(2, "fwd", 0.9, dtype="bfloat16"), {"impl": "triton", "mode": "fwd", "world": 1}]
    header, body = ring_plots.ring_compute_table(rows)
    assert header == ["dtype, N, mask", "2 ranks", "4 ranks"]
    assert body == [["fp16, 16k, full", "0.50 / 0.75", "0.25 / -"], ["bf16, 16k, full", "0.90 / -", "- / -"]]
    with pytest.raises(ValueError, match="rows: none is a ring compute row"):
        ring_plots.ring_compute_table([{"impl": "triton", "mode": "fwd"}])
    with pytest.raises(TypeError, match="rows"):
        ring_plots.ring_compute_table("ring_compute_path_h100.json")
    with pytest.raises(TypeError, match="rows: expected dicts"):
        ring_plots.ring_compute_table([("ring-compute-w2", 0.5)])


def test_the_chapter_reads_the_measurement_in_folded_code_with_its_caption():
    from conftest import measured_cells, notebook_cells

    from flashtut import results_data
    from flashtut.notebook import measured_caption

    measured = measured_cells(notebook_cells("14_ring_attention.ipynb"))
    assert [files for _, _, files in measured] == [[RING_DATA]]
    tags, (kind, caption, _), _ = measured[0]
    assert "hide-input" in tags and kind == "markdown"
    rows, provenance = results_data.load_results(RING_DATA)
    # the caption is the one measured_caption writes from the rows: the GPU and the file they came from
    caption = " ".join(caption.split())
    assert measured_caption(rows, caption.strip("*").split(" Measured on ")[0]).data == caption
    assert provenance[0]["device"]["name"] in caption

"""Chapter 11's exercise checkers and figures (CPU): each checker passes the library's own answer,
fails a plausible wrong one and says where, and each figure draws from the layout model's numbers."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from conftest import load_committed, measured_cells, notebook_cells  # noqa: E402

from flashtut.cuda.models import hopper_layout as hl  # noqa: E402
from flashtut.cuda.models import hopper_schedule as hs  # noqa: E402
from flashtut.exercises import ch11  # noqa: E402
from flashtut.figures import hopper_plots, timelines  # noqa: E402


def test_checkers_pass_the_right_answers():
    assert ch11.check_tile_offset(hl.tile_offset)
    assert ch11.check_accumulator_owner(hl.accumulator_owner)
    assert ch11.check_descriptor(lambda s, l, b: hl.encode_descriptor(s, l, b, "128B"))
    assert ch11.check_ring_slot(hl.ring_slot)
    assert ch11.check_register_budget(lambda d, n: sum(hl.w1_register_budget(d, n).values()))


def test_checkers_catch_wrong_answers_and_say_where():
    unswizzled = ch11.check_tile_offset(lambda r, c, rows: (c // 64) * rows * 128 + r * 128 + (c % 64) * 2)
    assert not unswizzled and "tile_offset(1, 0, 64)" in unswizzled.message
    # the mma.sync habit of 8-row halves inside a 16-row warp tile, but rows counted per warpgroup
    wrong_owner = ch11.check_accumulator_owner(lambda r, c, n: (4 * (r % 8) + (c % 8) // 2, 4 * (c // 8) + 2 * (r // 8) % 2 + c % 2))
    assert not wrong_owner and wrong_owner.n_bad > 0
    no_swizzle_bits = ch11.check_descriptor(lambda s, l, b: hl.encode_descriptor(s, l, b, "none"))
    assert not no_swizzle_bits
    assert not ch11.check_ring_slot(lambda i, s: (i % s, i // s))  # a count, not a parity
    assert not ch11.check_register_budget(lambda d, n: n + d + 4)  # P counted as float32
    raised = ch11.check_ring_slot(lambda i, s: 1 // 0)
    assert not raised and "ZeroDivisionError" in raised.message


def test_exp2_checker_wants_the_kernels_bits():
    import numpy as np

    from flashtut.cuda.models import exp2_poly as ep

    assert ch11.check_exp2_poly(ep.exp2_poly)
    # an accurate exponential is a different function: caught, with the first inputs that differ
    accurate = ch11.check_exp2_poly(lambda x: np.exp2(x).astype(np.float32))
    assert not accurate and "exp2(" in accurate.message and accurate.n_bad > 1000

    def in_place(x):
        y = ep.exp2_poly(x)
        x[:] = 0
        return y

    changed = ch11.check_exp2_poly(in_place)
    assert not changed and "changed its input" in changed.message

    def truncating(x):   # floor instead of round: f in [0, 1) where the cubic was fitted on [-1/2, 1/2]
        x = np.maximum(x, np.float32(-127))
        j = np.floor(x)
        c = ep.coefficients()
        f = (x - j).astype(np.float32)
        p = ((c[3] * f + c[2]) * f + c[1]) * f + c[0]
        return (p * np.exp2(j)).astype(np.float32)

    assert not ch11.check_exp2_poly(truncating)
    raised = ch11.check_exp2_poly(lambda x: 1 // 0)
    assert not raised and "ZeroDivisionError" in raised.message


def test_figures_draw():
    acc = [[f"T{hl.accumulator_owner(r, c, 128)[0]}" for c in range(16)] for r in range(8)]
    owner = [[hl.accumulator_owner(r, c, 128)[0] for c in range(16)] for r in range(8)]
    fig = hopper_plots.accumulator_to_a_fragment(acc, acc, owner)
    assert len(fig.axes) == 2
    # labels of at least 9 points (they were 4.2 on a 16 x 16 grid, about 4 px on the page)
    assert min(t.get_fontsize() for ax in fig.axes for t in ax.texts) >= 9
    with pytest.raises(ValueError, match="one shape"):
        hopper_plots.accumulator_to_a_fragment(acc, acc[:4], owner)
    fig = hopper_plots.stage_ring([hl.ring_slot(i, 2) for i in range(6)], stages=2)
    assert len(fig.axes[0].patches) == 6
    plt.close("all")


def _tensor_order(spans, cw):
    return [sp.label for sp in sorted(spans, key=lambda s: s.start) if sp.lane == "tensor" and sp.who == cw]


@pytest.mark.parametrize("my_tiles", [(4, 4), (4, 3), (4, 0), (3, 3, 3), (2, 3, 3)])
def test_timeline_plays_the_models_schedule(my_tiles):
    # the figure's products are, per consumer, the groups hopper_schedule has it issue, in that order
    n = max(my_tiles)
    spans = timelines.schedule(n, my_tiles)
    trace = hs.simulate(n, my_tiles, stages=2, seed=3)
    for cw in range(len(my_tiles)):
        assert _tensor_order(spans, cw) == trace.issued[cw]
    # one product at a time on the tensor cores, one copy at a time on the TMA lane
    for lane in ("tensor", "tma"):
        busy = sorted((sp.start, sp.end) for sp in spans if sp.lane == lane)
        assert all(a[1] <= b[0] for a, b in zip(busy, busy[1:]))
    # each softmax(S_j) starts only once S_j is done
    done = {(sp.who, sp.label): sp.end for sp in spans if sp.lane == "tensor"}
    for sp in spans:
        if sp.label.startswith("softmax"):
            assert sp.start >= done[(sp.who, sp.label.split()[1])]


def test_pingpong_alternates_and_fills_the_tensor_cores():
    spans = timelines.schedule(4, (4, 4))
    turns = [sp.who for sp in sorted(spans, key=lambda s: s.start) if sp.lane == "tensor"]
    # slot 0 issues S alone, later slots S_j with P_{j-1} V_{j-1}, the last P V alone: the owners alternate
    # in runs of one (slot 0), two, ..., and the same turn order the model's simulation takes
    runs = [turns[0]]
    for a, b in zip(turns, turns[1:]):
        if a != b:
            runs.append(b)
    assert runs == [cw for cw, _ in hs.simulate(4, (4, 4), stages=2, seed=1).turns]
    # once both are under way the tensor cores never wait
    busy = sorted((sp.start, sp.end) for sp in spans if sp.lane == "tensor")
    first_pv = min(sp.start for sp in spans if sp.label.startswith("PV"))
    steady = [(a, b) for a, b in busy if a >= first_pv]
    assert all(x[1] == y[0] for x, y in zip(steady, steady[1:]))
    # while one consumer computes a softmax, the tensor cores run the other's products
    for sp in spans:
        if sp.label.startswith("softmax") and sp.start >= first_pv:
            assert any(t.lane == "tensor" and t.who != sp.who and t.start < sp.end and t.end > sp.start
                       for t in spans)


def test_the_pipeline_pairs_softmax_of_s_j_with_the_previous_pv():
    spans = timelines.schedule(4, (4, 0))
    tensor = {sp.label: sp for sp in spans if sp.lane == "tensor"}
    for j in range(1, 4):
        soft = next(sp for sp in spans if sp.label == f"softmax S{j}")
        pv = tensor[f"PV{j - 1}"]
        # S_j and P_{j-1} V_{j-1} go in back to back, and the softmax of S_j runs under that P V
        assert tensor[f"S{j}"].end == pv.start
        assert soft.start < pv.end and soft.end > pv.start
        # never under a later tile's S: S_{j+1} is issued after the softmax of S_j
        if f"S{j + 1}" in tensor:
            assert tensor[f"S{j + 1}"].start >= soft.end


def test_timeline_figures_draw_and_check_their_inputs():
    for fig in (timelines.pingpong_figure(), timelines.intra_warpgroup_figure()):
        assert min(t.get_fontsize() for t in fig.axes[0].texts) >= 9
    plt.close("all")
    with pytest.raises(ValueError, match="n_tiles"):
        timelines.schedule(0, (0, 0))
    with pytest.raises(ValueError, match="my_tiles"):
        timelines.schedule(3, (4, 1))
    with pytest.raises(ValueError, match="stages"):
        timelines.schedule(3, (3, 3), stages=1)


def _first(cw, consumers):
    return 1 if cw == consumers - 1 else None


def _after(cw, slot, n_tiles, consumers):
    return None if (cw == consumers - 1 and slot == n_tiles) else 1 + (cw + 1) % consumers


def test_turn_ring_checker_plays_the_protocol():
    assert ch11.check_turn_ring(_first, _after)
    # the last consumer gives a turn after its last slot: a half-counted generation at exit
    extra = ch11.check_turn_ring(_first, lambda cw, s, n, c: 1 + (cw + 1) % c)
    assert not extra and "left with arrivals" in extra.message
    # nobody gives consumer 0 its first turn
    assert "deadlock" in ch11.check_turn_ring(lambda cw, c: None, _after).message
    # the ring backwards, and ping-pong's rule (1 - cw) kept for three consumers
    assert not ch11.check_turn_ring(_first, lambda cw, s, n, c: None if (cw == c - 1 and s == n) else 1 + (cw - 1) % c)
    two_only = ch11.check_turn_ring(lambda cw, c: 1 if cw == 1 else None,
                                    lambda cw, s, n, c: None if (cw == 1 and s == n) else 2 - cw)
    assert not two_only and two_only.message.startswith("✗ 3 consumers")
    wrong_id = ch11.check_turn_ring(_first, lambda cw, s, n, c: 5)
    assert not wrong_id and "named barrier 5, on which no consumer waits" in wrong_id.message
    raised = ch11.check_turn_ring(_first, lambda cw, s, n, c: 1 // 0)
    assert not raised and "ZeroDivisionError" in raised.message


def test_exp2_between_waits_checker():
    # the library's count passes; the count between the first two waits of the listing (slot 0's wait
    # for everything comes first), every exponential of the listing, a constant, and a reader's function
    # that raises all fail, each saying so
    import re

    from flashtut.bench.sass import exp2_between_waits

    assert ch11.check_exp2_between_waits(exp2_between_waits)

    def first_two_waits(sass):
        lines = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
        waits = [i for i, t in enumerate(lines) if "DEPBAR" in t]
        return sum("MUFU.EX2" in t for t in lines[waits[0]:waits[1]])

    for wrong in (first_two_waits, lambda s: s.count("MUFU.EX2"), lambda s: 66, lambda s: s.count("MUFU")):
        result = ch11.check_exp2_between_waits(wrong)
        assert not result and "first listing that differs" in result.message
    raised = ch11.check_exp2_between_waits(lambda s: 1 // 0)
    assert not raised and "ZeroDivisionError" in raised.message


def test_query_blocks_checker():
    assert ch11.check_query_blocks(hl.query_blocks)
    # the blocks' order reversed: the short block is first, but holds the last rows
    reversed_order = ch11.check_query_blocks(lambda n, bm, tf: hl.query_blocks(n, bm)[::-1] if tf
                                             else hl.query_blocks(n, bm))
    assert not reversed_order and "query_blocks(65, 64, True)" in reversed_order.message
    # the short block first whatever the order asked for
    assert not ch11.check_query_blocks(lambda n, bm, tf: hl.query_blocks(n, bm, True))
    # lists instead of tuples are the same answer
    assert ch11.check_query_blocks(lambda n, bm, tf: [list(b) for b in hl.query_blocks(n, bm, tf)])
    raised = ch11.check_query_blocks(lambda n, bm, tf: 1 // 0)
    assert not raised and "ZeroDivisionError" in raised.message


def test_exercise_11_9_answer_counts_the_turns_it_quotes():
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "11_hopper.ipynb").read_text())
    answer = " ".join("".join(next(c for c in nb["cells"] if c.get("id") == "ch11-ex9-answer")["source"]).split())
    counts = {}
    for tail_first in (False, True):
        blocks = hl.query_blocks(4096, 192, tail_first)
        idle = [3 * n - sum(mine) for n, mine in (hl.consumer_tiles(m0, end, 4096) for m0, end in blocks)]
        short = next(k for k, (m0, end) in enumerate(blocks) if end - m0 < 192)
        counts[tail_first] = (idle[short], sum(idle) - idle[short],
                              hl.consumer_tiles(*blocks[short], 4096)[0])
    (last_short, last_full, last_tiles), (first_short, first_full, first_tiles) = counts[False], counts[True]
    assert f"reads all {last_tiles} and its two empty consumers spend {last_short} turns idle" in answer
    assert f"first, it reads {'one' if first_tiles == 1 else first_tiles}, and they spend {first_short}" in answer
    assert f"own idle turns ({last_full} and {first_full}) move by {'one' if abs(last_full - first_full) == 1 else abs(last_full - first_full)}" in answer


# ---------------------------------------------------------------- what the chapter now teaches

def _cells(name="11_hopper.ipynb"):
    return notebook_cells(name)


def _text(name="11_hopper.ipynb"):
    return " ".join(" ".join(src.split()) for kind, src, _ in _cells(name) if kind == "markdown")


def test_chapter_11_is_a_lesson_not_a_lab_notebook():
    import re

    text = _text()
    for lab in ("UTC", "since this run", "Since this run", "show_provenance", "/root/out", "/tmp/tmp"):
        assert lab not in text and all(lab not in src for _, src, _ in _cells()), lab
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text.replace("0x", ""))     # no commit hashes
    headings = re.findall(r"^## (11\.\d+) ", "\n".join(src for kind, src, _ in _cells() if kind == "markdown"),
                          re.M)
    assert headings == [f"11.{i}" for i in range(1, 12)]


def test_every_measurement_is_folded_and_captioned_with_its_gpu_and_file():
    import re

    cells = _cells()
    measured = measured_cells(cells)
    for tags, (kind, caption, _), files in measured:
        assert "hide-input" in tags, files
        assert kind == "markdown" and re.match(r"\*(Figure|Table) 11\.\d+: ", caption), caption[:60]
        assert "H200" in caption and all(f"`{f}`" in caption for f in files), caption
    assert len(measured) >= 5
    # figures and tables numbered in order, each once
    for kind in ("Figure", "Table"):
        numbers = [int(n) for _, src, _ in cells for n in re.findall(rf"^\*{kind} 11\.(\d+):", src, re.M)]
        assert numbers == list(range(1, len(numbers) + 1)), (kind, numbers)


def test_chapter_11_states_the_reviewed_facts():
    text = _text()
    # FlashAttention-3's in-warpgroup pipeline: softmax(S_j) under the previous tile's P V
    assert ("issues $S_j = Q K_j^\\top$ together with the previous tile's $O \\mathrel{+}= P_{j-1} V_{j-1}$"
            in text)
    assert "K_{j+1}" not in text and "QK^T_{j+1}" not in text
    # the register splits: 24 / 240 with two consumers, 32 / 160 with three
    assert "24 registers per producer thread and 240 per consumer thread; with three consumers it is 32 and 160" in text
    assert 128 * 32 + 3 * 128 * 160 == 65536 and "$128 \\cdot 32 + 3 \\cdot 128 \\cdot 160 = 65536$" in text
    # the standard way to pass a tensor map, beside the pinned copy the library makes
    src = "\n".join(s for _, s, _ in _cells())
    assert "const __grid_constant__ CUtensorMap" in src and "Copied from pinned memory without blocking" in text
    from flashtut.cuda import hopper_launch

    assert "pin_memory()" in __import__("inspect").getsource(hopper_launch.tensor_maps)
    # the FlashAttention-3 map names its files and classes
    for name in ("mainloop_fwd_sm90_tma_gmma_ws.hpp", "epilogue_fwd.hpp", "tile_scheduler.hpp",
                 "flash_fwd_kernel_sm90.h", "CollectiveMainloopFwdSm90", "CollectiveEpilogueFwd",
                 "DynamicPersistentTileScheduler", "PipelineTmaAsync", "warp_scheduler_barrier_sync"):
        assert f"`{name}" in text, name


def test_cudnn_is_described_one_way_in_chapters_10_and_11():
    claim = "closed source, and we have not measured which tensor-core instructions they issue"
    for name in ("10_beyond.ipynb", "11_hopper.ipynb"):
        assert claim in _text(name), name
    ch10 = _text("10_beyond.ipynb")
    assert "QK_{j+1}" not in ch10 and "per-SM pool" not in ch10
    assert "moves registers between its warpgroups within that allocation" in ch10
    assert "the softmax of $S_j$ then runs while $P_{j-1} V_{j-1}$ is still on the tensor cores" in ch10


def _span(values):
    return f"{min(values):+.1f} to {max(values):+.1f}%"


def test_what_else_was_tried_quotes_the_committed_data():
    from flashtut import results_data
    from flashtut.bench.paired import pair_gains
    from flashtut.bench.report import gains

    text = _text()
    table = text[text.index("| option, verdict | idea |"):text.index("The measurements are the files")]
    load = load_committed           # the A/B runs live with their experiment; the rungs' runs in book/data

    def g(name, column, base, D=None):
        rows, _ = load(name)
        by_d = gains(rows, column, base)
        return [x for d, by in by_d.items() if D in (None, d) for x in by.values()]

    w3 = {128: "hopper-w3", 64: "hopper-w3[c3]"}

    def opt(o):
        return {128: f"hopper-w3[{o}]", 64: f"hopper-w3[c3,{o}]"}

    checks = {
        "three consumers": _span(g("hopper_h200.json", "hopper-w3[c3]", "hopper-w3")),
        "turns among three": _span(g("hopper_turns_h200.json", "hopper-w3[c3,turns]", "hopper-w3[c3]")),
        "TMA store of O": "D = 128: " + _span(g("hopper_options_h200.json", opt("store"), w3, 128)),
        "W4 persistent": "D = 128: " + _span(g("hopper_w4_h200.json", {128: "hopper-w4", 64: "hopper-w4[c3]"},
                                                 w3, 128)),
        "exponentials by a cubic": "D = 64: " + _span(
            g("hopper_softmax_h200.json", opt("poly1"), w3, 64) + g("hopper_softmax_h200.json", opt("poly2"), w3, 64)),
        "row reductions": "D = 64: " + _span(g("hopper_softmax_h200.json", opt("tree"), w3, 64)),
        "W4's order": "D = 64: " + _span(g("hopper_options_h200.json", opt("order"), w3, 64)),
        "heads first": _span(g("hopper_heads_h200.json", {128: "hopper-w3[heads,store]", 64: "hopper-w3[c3,heads]"},
                               {128: "hopper-w3[store]", 64: "hopper-w3[c3]"})),
        "keep the overlap": "D = 128: " + _span(g("hopper_pin_d128_h200.json", "hopper-w3[store,pin]",
                                                  "hopper-w3[store]")),
        "lazy rescale": "D = 64: " + _span(g("hopper_pin_d64_h200.json", "hopper-w3[c3,turns,lazy]",
                                             "hopper-w3[c3,turns]")),
        "deeper ring": _span(g("hopper_ring_h200.json", "hopper-w3[s3]", "hopper-w3")
                             + g("hopper_ring_h200.json", "hopper-w3[s4]", "hopper-w3")
                             + g("hopper_c3_tiles_h200.json", "hopper-w3[c3,s3]", "hopper-w3[c3]")) + " (ring)",
    }
    for option, quoted in checks.items():
        assert option in table and quoted in table, (option, quoted)
    pairs, _ = load("hopper_pair_uni_d64_h200.json")
    uni = [x[0] for x in pair_gains(pairs, "hopper-w3[c3,turns]", "hopper-w3[c3,turns,uni]").values()]
    assert f"{min(uni):+.1f} to {max(uni):+.1f}%, {sum(x > 0 for x in uni)} of {len(uni)}" in table
    pairs, _ = load("hopper_pair_tail_d64_h200.json")
    tail = pair_gains(pairs, "hopper-w3[c3,turns,uni]", "hopper-w3[c3,turns,tail,uni]")
    assert (f"{tail[(64, 'float16', 4096, True)][0]:+.1f}% and {tail[(64, 'bfloat16', 4096, True)][0]:+.1f}% "
            "at N = 4096, causal") in table


def test_what_else_was_tried_ships_what_cuda_attention_runs():
    from flashtut.cuda import configs

    text = _text()
    table = text[text.index("| option, verdict | idea |"):text.index("The measurements are the files")]
    shipped = {(name, D) for D, options in configs.HOPPER_OPTIONS.items() for name, on in options.items() if on}
    for name, D in shipped:
        assert f"(`{name}`): **shipped** at D = {D}" in table, name
    # every other option of the table was dropped
    assert table.count("**shipped**") == len(shipped) + 1      # + the three consumers, a build of its own
    assert configs.HOPPER_CONSUMERS[64] == 3 and "three consumers: **shipped** at D = 64" in table

"""Chapter 11's exercise checkers and figures (CPU): each checker passes the library's own answer,
fails a plausible wrong one and says where, and each figure draws from the layout model's numbers."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from flashtut.cuda.models import hopper_layout as hl
from flashtut.exercises import ch11
from flashtut.figures import hopper_plots


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
    acc = [[f"T{hl.accumulator_owner(r, c, 128)[0]}" for c in range(16)] for r in range(16)]
    owner = [[hl.accumulator_owner(r, c, 128)[0] for c in range(16)] for r in range(16)]
    fig = hopper_plots.accumulator_to_a_fragment(acc, acc, owner)
    assert len(fig.axes) == 2
    fig = hopper_plots.stage_ring([hl.ring_slot(i, 2) for i in range(6)], stages=2)
    assert len(fig.axes[0].patches) == 6


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

"""Rungs W3 and W4: the barrier protocol (flashtut.cuda.models.hopper_schedule), simulated on the CPU.

Every block shape the kernel meets is a tile count n_tiles and the two consumers' own counts (fewer
than n_tiles for a causal block's upper warpgroup, none for rows past Nq). For each, and for each ring
depth, many random interleavings of the producer, the two consumers and the TMA copies must finish,
take the tensor-core turns strictly in turn, and issue each product once, in the pipelined order.
Each rule the kernel's comments give a reason for is then broken on purpose, and the simulation must
catch it: so a pass means the protocol is right, not that the checker is blind.
"""
from __future__ import annotations

import pytest

from flashtut.cuda.models import hopper_schedule as hs

SHAPES = hs.block_shapes(2, 5)
SEEDS = range(12)


def expected_issue(my_tiles: int) -> list[str]:
    # slot 0: S_0; slot j: S_j then P_{j-1} V_{j-1}; slot my_tiles: the last P V
    if my_tiles == 0:
        return []
    out = ["S0"]
    for j in range(1, my_tiles):
        out += [f"S{j}", f"PV{j - 1}"]
    return out + [f"PV{my_tiles - 1}"]


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_every_shape_finishes_in_turn(stages):
    for n_tiles, mine in SHAPES:
        for seed in SEEDS:
            trace = hs.simulate(n_tiles, mine, stages, seed)
            # n_tiles + 1 turns each, consumer 0 first, strictly alternating
            assert trace.turns == [(cw, slot) for slot in range(n_tiles + 1) for cw in (0, 1)], (n_tiles, mine)
            for cw in (0, 1):
                assert trace.issued[cw] == expected_issue(mine[cw]), (n_tiles, mine, cw)


def test_random_schedules_differ():
    # the scheduler really explores: the turn order is fixed by the barriers, the interleaving is not
    runs = [hs.simulate(5, (4, 5), 3, seed) for seed in range(6)]
    assert len({tuple(r.turns) for r in runs}) == 1
    assert len({tuple(r.picks) for r in runs}) == len(runs)


def _failures(shapes=None, seeds: int = 4, **knobs) -> set[str]:
    """The distinct ScheduleError messages of every shape (SHAPES by default) under ``knobs``."""
    found = set()
    for n_tiles, mine in SHAPES if shapes is None else shapes:
        for seed in range(seeds):
            try:
                hs.simulate(n_tiles, mine, 2, seed, **knobs)
            except hs.ScheduleError as exc:
                found.add(str(exc).split(": ", 1)[1])
    return found


def test_without_the_first_turn_consumer_0_waits_forever():
    found = _failures(prime=False)
    assert found and all(msg.startswith("deadlock") for msg in found)


def test_a_turn_given_after_the_last_slot_is_left_on_the_barrier():
    found = _failures(final_arrive=True)
    assert found == {"named barrier 1 is left with arrivals [(1, False)] at exit"}


def test_releasing_skipped_tiles_before_the_idle_turns_deadlocks():
    # the tail of the kernel releases tile j in slot j: all at once would wait for fills that need the
    # other consumer's releases, which need turns not yet given
    found = _failures(interleave_idle=False)
    assert found and all(msg.startswith("deadlock") for msg in found)
    hs.simulate(5, (5, 5), 2, 0, interleave_idle=False)   # harmless when no tile is skipped


def test_one_barrier_for_both_turns_double_counts():
    found = _failures(own_barriers=False)
    assert any("arrives twice on named barrier 1" in msg for msg in found)


def test_a_stage_released_before_its_wgmma_finished_is_caught():
    found = _failures(wait_before_release=False)
    assert any("releases K0 while its wgmma still reads it" in msg for msg in found)


def test_parity_and_argument_checks():
    assert [hs.parity(j, 2) for j in range(6)] == [0, 0, 1, 1, 0, 0]
    assert [hs.parity(j, 3) for j in range(7)] == [0, 0, 0, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="my_tiles"):
        hs.simulate(2, (3, 0))
    with pytest.raises(ValueError, match="stages"):
        hs.simulate(2, (2, 2), stages=1)


# ------------------------------------------------------------------ three consumers, with and without turns
#: every block of the W3_CONSUMERS=3 build: tile counts up to 4, each consumer's own count (rows past
#: Nq: none; a causal block's lower warpgroups: fewer)
SHAPES3 = hs.block_shapes(3, 4)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_three_consumers_without_turns_finish_every_shape(stages):
    for n_tiles, mine in SHAPES3:
        for seed in range(4):
            trace = hs.simulate(n_tiles, mine, stages, seed, turns=False)
            assert trace.turns == []                               # no named barrier at all
            for cw in range(3):
                assert trace.issued[cw] == expected_issue(mine[cw]), (n_tiles, mine, cw)


def test_three_consumers_really_interleave():
    runs = [hs.simulate(4, (4, 4, 4), 2, seed, turns=False) for seed in range(6)]
    orders = {tuple(p for p in r.picks if p in (0, 1, 2)) for r in runs}
    assert len(orders) == len(runs)


def test_three_consumers_catch_a_release_before_the_wait():
    found = set()
    for n_tiles, mine in SHAPES3[:60]:
        for seed in range(4):
            try:
                hs.simulate(n_tiles, mine, 2, seed, turns=False, wait_before_release=False)
            except hs.ScheduleError as exc:
                found.add(str(exc).split(": ", 1)[1])
    assert found and all("while its wgmma still reads it" in m or "starts while a wgmma" in m for m in found)


def test_without_turns_releasing_skipped_tiles_first_is_harmless():
    # with ping-pong, releasing a consumer's skipped tiles before its idle turns deadlocks (above);
    # without turns nothing waits on them, so the order does not matter
    for n_tiles, mine in SHAPES3[:80]:
        hs.simulate(n_tiles, mine, 2, 0, turns=False, interleave_idle=False)


def test_turns_take_two_or_three_consumers():
    with pytest.raises(ValueError, match="two or three consumers"):
        hs.simulate(3, (3, 3, 3, 3), 2, 0)
    with pytest.raises(ValueError, match="two or three consumers"):
        hs.simulate(3, (3,), 2, 0, turns=False)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_three_consumers_with_turns_go_round(stages):
    # W3_C3_TURNS: n_tiles + 1 turns each, 0, 1, 2, 0, 1, 2 ..., whatever each consumer's own tile count
    for n_tiles, mine in SHAPES3:
        for seed in range(3):
            trace = hs.simulate(n_tiles, mine, stages, seed)
            assert trace.turns == [(cw, slot) for slot in range(n_tiles + 1) for cw in (0, 1, 2)], (n_tiles, mine)
            for cw in range(3):
                assert trace.issued[cw] == expected_issue(mine[cw]), (n_tiles, mine, cw)


def test_the_ring_of_three_catches_each_broken_rule():
    # no first turn from consumer 2: consumer 0 waits forever, and so the others
    found = _failures(SHAPES3[::3], 3, prime=False)
    assert found and all(msg.startswith("deadlock") for msg in found)
    # consumer 2 gives a turn after its last slot: an arrival left on consumer 0's barrier
    assert _failures(SHAPES3[::3], 3, final_arrive=True) == {"named barrier 1 is left with arrivals [(2, False)] at exit"}
    # one barrier for all three: two warpgroups' arrivals complete a generation meant for one
    found = _failures(SHAPES3[::3], 3, own_barriers=False)
    assert any("arrives twice on named barrier 1" in m for m in found)
    assert any("takes the turn while" in m for m in found), found


# ------------------------------------------------------------------ W4: one block walks many query blocks

def expected_issue_from(kv0: int, my_tiles: int) -> list[str]:
    # the names count on across query blocks: tile g of the block's K/V stream is S{g} / PV{g}
    return [name[:1 + (name[1] == "V")] + str(int(name.lstrip("SPV")) + kv0) for name in expected_issue(my_tiles)]


def _walks(consumers: int, count: int, seed: int) -> list:
    """``count`` random sequences of 1 to 4 query blocks (tile counts 0 to 4, each consumer's own)."""
    import random

    rng = random.Random(seed)
    walks = []
    for _ in range(count):
        walk = []
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(0, 4)
            walk.append((n, tuple(rng.randint(0, n) for _ in range(consumers))))
        walks.append(walk)
    return walks


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("consumers", [2, 3])
def test_persistent_blocks_finish_every_walk(stages, consumers):
    for turns in (True, False) if consumers == 3 else (True,):   # three: with W3_C3_TURNS and without
        for walk in _walks(consumers, 40, seed=stages * 10 + consumers):
            for seed in range(3):
                trace = hs.simulate_persistent(walk, stages, seed, turns=turns)
                slots = sum(n + 1 for n, _ in walk)
                # the turns go round across query blocks as within one: n_tiles + 1 each per block
                assert trace.turns == ([(cw, s) for s in range(slots) for cw in range(consumers)] if turns
                                       else []), walk
            kv0, want = 0, {cw: [] for cw in range(consumers)}
            for n, mine in walk:
                for cw in range(consumers):
                    want[cw] += expected_issue_from(kv0, mine[cw])
                kv0 += n
            assert trace.issued == want, walk


def test_persistent_equals_w3_for_one_query_block():
    # a walk of one query block is W3's block: the same operations, plus the Q release nobody waits for
    for n_tiles, mine in SHAPES[:40]:
        assert hs.simulate_persistent([(n_tiles, mine)], 2, 1).turns == hs.simulate(n_tiles, mine, 2, 1).turns


def test_q_never_released_deadlocks_the_next_query_block():
    with pytest.raises(hs.ScheduleError, match="deadlock.*q_empty"):
        hs.simulate_persistent([(2, (2, 1)), (1, (1, 1))], 2, 0, q_release="never")


def test_q_released_before_its_last_product_finished_is_caught():
    found = set()
    for walk in _walks(2, 30, seed=5):
        for seed in range(3):
            try:
                hs.simulate_persistent(walk, 2, seed, q_release="at_issue")
            except hs.ScheduleError as exc:
                found.add(str(exc).split(": ", 1)[1])
    assert found and all("releases Q while its wgmma still reads it" in m or "into Q starts while" in m
                          for m in found), found


def test_persistent_argument_checks():
    with pytest.raises(ValueError, match="same number of consumers"):
        hs.simulate_persistent([(2, (2, 2)), (2, (2, 2, 2))], turns=False)
    with pytest.raises(ValueError, match="at least one"):
        hs.simulate_persistent([])
    with pytest.raises(ValueError, match="my_tiles"):
        hs.simulate_persistent([(1, (2, 0))])

"""Ring attention over a real gloo process group: worlds of 2, 3 and 4 CPU processes, spawned here,
against single-process attention in float64, and what happens when a rank fails."""
from __future__ import annotations

import time

import pytest
import torch

import flashtut
import ring_world_workers as workers
from flashtut.distributed import WorldError, demo, ring_attention, run_world


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_matches_one_process(world):
    for rank, cases in enumerate(run_world(workers.check_against_one_process, world, timeout=60)):
        for case, err in zip(workers.CASES, cases):
            assert max(err.values()) < 1e-12, (rank, case, err)


def test_a_failing_rank_does_not_hang_the_others():
    start = time.monotonic()
    with pytest.raises(WorldError) as info:
        run_world(workers.failures, 3, timeout=4)
    assert time.monotonic() - start < 120
    errors, results = info.value.errors, info.value.results
    assert list(errors) == [1] and "ZeroDivisionError: rank 1 fails on purpose" in errors[1]
    assert sorted(results) == [0, 2]
    for rank in (0, 2):
        seen = results[rank]
        kind, msg, took = seen["bad_dtype_on_rank_1"]
        assert kind == "RuntimeError" and "rank(s) [1]" in msg, seen   # at once, not after the timeout
        kind, msg, _ = seen["scale_differs"]
        assert kind == "ValueError" and "scale differs" in msg
        kind, msg, _ = seen["wrong_cut"]
        assert kind == "ValueError" and "shard(x," in msg
        assert seen["fine_after_all_that"][0] == "ok"
    # rank 2 waits for the shard rank 1 never sends: a clear error once the group's timeout passes, not a
    # hang (rank 0 already holds all it needs: rank 1's first send left before its kernel failed)
    kind, msg, took = results[2]["peer_failed"]
    assert kind == "RuntimeError" and "did not complete" in msg and "timeout" in msg, results[2]
    assert took < 30
    assert results[0]["peer_failed"][0] in ("ok", "RuntimeError")


def test_the_sharded_gpt_trains_like_one_process():
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, demo.tiny_gpt().vocab_size, (2, 27), generator=g)
    targets = torch.randint(0, demo.tiny_gpt().vocab_size, (2, 27), generator=g)
    targets[0, 5] = -100                       # ignored, as padding is
    want = demo.one_process_training(idx, targets)
    assert want[2] < want[0]                   # it trains
    for losses in run_world(demo.sharded_training, 3, idx, targets, timeout=60):
        assert losses == pytest.approx(want, rel=1e-12, abs=0)


def test_without_a_process_group_the_error_says_what_to_do():
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(q, q, q)
    assert flashtut.distributed.ring_attention is ring_attention


def test_run_world_reports_bad_arguments():
    with pytest.raises(ValueError, match="world"):
        run_world(workers.failures, 0)
    with pytest.raises(TypeError, match="fn"):
        run_world("not a function", 2)


def test_the_overflow_guard_runs_once_per_pass_on_every_rank():
    for rank, seen in enumerate(run_world(workers.overflow, 3, timeout=60)):
        assert seen["fine"] == ("ok", "", ["output", "gradients"]), (rank, seen)
        # rank 1's overflow: every rank raises after the forward's ring (none is left waiting in the backward)
        kind, msg, reads = seen["big_q_on_rank_1"]
        assert kind == "ValueError" and "overflow float32" in msg and reads == ["output"], (rank, seen)
        kind, msg, reads = seen["huge_do"]
        assert kind == "ValueError" and "gradients would be" in msg and reads == ["output", "gradients"], seen

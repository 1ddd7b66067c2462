"""The zigzag cut, the ring's schedule and the work per rank: no processes, only arithmetic."""
from __future__ import annotations

import pytest
import torch

from flashtut.distributed import (balance_table, imbalance, ring_schedule, shard, shard_ranges, tiles, unshard,
                                  work_per_rank)
from flashtut.reference import causal_mask


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [13, 40, 67])
@pytest.mark.parametrize("causal", [False, True])
def test_unshard_inverts_shard(world, n, causal):
    if n < 2 * world:
        pytest.skip("too short for the cut")
    x = torch.randn(2, 3, n, 5, dtype=torch.float64)
    shards = [shard(x, r, world, causal) for r in range(world)]
    assert sum(s.shape[2] for s in shards) == n
    assert max(s.shape[2] for s in shards) - min(s.shape[2] for s in shards) <= 2
    assert torch.equal(unshard(shards, causal), x)
    assert torch.equal(unshard(shards, world, causal), x)


def test_zigzag_holds_an_early_and_a_late_chunk():
    x = torch.arange(16)
    assert shard(x, 0, 4, True, dim=0).tolist() == [0, 1, 14, 15]
    assert shard(x, 1, 4, True, dim=0).tolist() == [2, 3, 12, 13]
    assert shard(x, 3, 4, True, dim=0).tolist() == [6, 7, 8, 9]
    assert shard(x, 1, 4, False, dim=0).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("bad, err", [
    (dict(rank=4), ValueError), (dict(rank=-1), ValueError), (dict(world=0), ValueError),
    (dict(rank=1.0), TypeError), (dict(x=[1, 2]), TypeError), (dict(causal="yes"), ValueError),
    (dict(x=torch.zeros(1, 1, 5, 2)), ValueError)])
def test_shard_rejects_bad_arguments(bad, err):
    args = dict(x=torch.zeros(1, 1, 16, 2), rank=1, world=4, causal=True) | bad
    with pytest.raises(err):
        shard(**args)


def test_unshard_rejects_shards_that_shard_did_not_make():
    x = torch.zeros(1, 1, 16, 2)
    with pytest.raises(ValueError, match="shards\\[0\\]"):
        unshard([x[:, :, :9], x[:, :, 9:]], True)
    with pytest.raises(ValueError, match="world"):
        unshard([x[:, :, :8], x[:, :, 8:]], 3, True)
    with pytest.raises(TypeError):
        unshard(x, True)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("n", [24, 37])
@pytest.mark.parametrize("causal", [False, True])
def test_the_schedule_scores_every_visible_pair_once(world, n, causal):
    # map every step's rows back to global positions: the union must be the mask, with no pair twice
    covered = torch.zeros(n, n, dtype=torch.int64)
    pos = [torch.cat([torch.arange(b, e) for b, e in shard_ranges(n, r, world, causal)]) for r in range(world)]
    for r in range(world):
        steps = ring_schedule(r, world, n, causal)
        assert sorted(s.source for s in steps) == list(range(world))
        for s in steps:
            qi = pos[r][s.q_rows[0]:s.q_rows[1]]
            kj = pos[s.source][s.kv_rows[0]:s.kv_rows[1]]
            block = torch.ones(len(qi), len(kj), dtype=torch.int64)
            if s.causal:
                block = (~causal_mask(len(qi), len(kj))).long()
            covered[qi[:, None], kj[None, :]] += block
    want = (~causal_mask(n, n)).long() if causal else torch.ones(n, n, dtype=torch.int64)
    assert torch.equal(covered, want)


def test_tiles_counts_what_a_brute_force_count_finds():
    for n_q, n_k, block, off in [(70, 70, 16, 0), (33, 65, 8, None), (40, 40, 16, -1), (64, 64, 64, 0)]:
        vis = torch.ones(n_q, n_k, dtype=torch.bool) if off is None else \
            torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + off
        brute = sum(bool(vis[i:i + block, j:j + block].any())
                    for i in range(0, n_q, block) for j in range(0, n_k, block))
        assert tiles(n_q, n_k, block, off) == brute


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("n", [8192, 3 * 4096 + 64, 131072])
def test_zigzag_balances_causal_work_within_five_percent(world, n):
    work = work_per_rank(n, world, "zigzag")
    assert imbalance(work) <= 0.05, work
    # nothing is computed twice: with chunks of whole tiles the ranks together compute exactly the tiles
    # of one causal kernel; chunks that end inside a tile add partial tiles
    whole = tiles(n, n, 64, 0)
    assert sum(work) == whole if n % (2 * world * 64) == 0 else sum(work) > whole
    # and the measure can fail: the contiguous cut is far out of balance
    assert imbalance(work_per_rank(n, world, "contiguous")) > 0.4


def test_balance_table_rows():
    rows = balance_table(16384, worlds=(2, 4))
    assert {(r["world"], r["scheme"]) for r in rows} == {(w, s) for w in (2, 4)
                                                         for s in ("contiguous", "zigzag", "striped")}
    for r in rows:
        assert r["max_tiles"] >= r["min_tiles"] > 0
    with pytest.raises(ValueError, match="scheme"):
        work_per_rank(100, 2, "diagonal")

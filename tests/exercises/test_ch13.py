"""Chapter 13's checkers: the worked solutions pass, and wrong answers of our own fail with the
sentence the reader sees (the numbers, and the technique: how the mask is evaluated, and whether
the kernel can compile it)."""
from __future__ import annotations

import torch

from flashtut.block_mask import EMPTY, FULL, PARTIAL
from flashtut.exercises import ch13


def _flat(message):
    return " ".join(message.split())


def _fails(res, *phrases):
    assert not res.ok, res.message
    for phrase in phrases:
        assert phrase in _flat(res.message), res.message


def test_tile_kinds_solution_passes():
    res = ch13.check_tile_kinds(ch13.solution_tile_kinds)
    assert res.ok, res.message


def test_tile_kinds_that_forget_the_ragged_end_fail():
    def padded_with_true(mask_mod, Nq, Nk, block):   # a tile past the end counted as full
        q, kv = torch.arange(Nq)[:, None], torch.arange(Nk)[None, :]
        keep = mask_mod(torch.tensor(0), torch.tensor(0), q, kv).expand(Nq, Nk)
        nq, nk = -(-Nq // block), -(-Nk // block)
        padded = torch.ones(nq * block, nk * block, dtype=torch.bool)
        padded[:Nq, :Nk] = keep
        t = padded.view(nq, block, nk, block)
        return torch.where(t.all(3).all(1), FULL, torch.where(t.any(3).any(1), PARTIAL, EMPTY))

    _fails(ch13.check_tile_kinds(padded_with_true), "values differ", "no mask")


def test_tile_kinds_evaluated_one_position_at_a_time_fail_the_technique():
    def per_element(mask_mod, Nq, Nk, block):
        keep = torch.tensor([[bool(mask_mod(0, 0, i, j)) for j in range(Nk)] for i in range(Nq)])
        return ch13.solution_tile_kinds(lambda b, h, q, kv: keep[q, kv], Nq, Nk, block)

    _fails(ch13.check_tile_kinds(per_element), "technique", "single positions")


def test_tile_kinds_evaluated_tile_by_tile_fail_the_technique():
    def per_tile(mask_mod, Nq, Nk, block):
        out = torch.empty(-(-Nq // block), -(-Nk // block), dtype=torch.int8)
        for m in range(out.shape[0]):
            for n in range(out.shape[1]):
                q = torch.arange(m * block, min(Nq, (m + 1) * block))[:, None]
                kv = torch.arange(n * block, min(Nk, (n + 1) * block))[None, :]
                t = mask_mod(torch.tensor(0), torch.tensor(0), q, kv).expand(q.shape[0], kv.shape[1])
                whole = t.shape == (block, block)
                out[m, n] = FULL if whole and bool(t.all()) else PARTIAL if bool(t.any()) else EMPTY
        return out

    _fails(ch13.check_tile_kinds(per_tile), "technique", "more than once per query block")


def test_tile_kinds_with_swapped_codes_fail():
    _fails(ch13.check_tile_kinds(lambda m, Nq, Nk, b: 2 - ch13.solution_tile_kinds(m, Nq, Nk, b)), "values differ")


def test_sink_window_solution_passes():
    res = ch13.check_sink_window(ch13.solution_sink_window)
    assert res.ok, res.message
    assert "compiles your mask_mod" in res.message


def test_a_window_without_the_sink_fails():
    _fails(ch13.check_sink_window(lambda w: ch13.masks.sliding_window(w)), "values differ")


def test_a_mask_the_kernel_cannot_compile_fails_the_technique():
    def with_if(w):
        def mod(b, h, q_idx, kv_idx):
            sink = kv_idx == 0
            if w > 1:                        # fine: w is a number
                window = (q_idx >= kv_idx) & (q_idx - kv_idx < w)
            else:
                window = q_idx == kv_idx
            return torch.where(sink, torch.ones_like(window), window)   # ones_like: not in the kernel
        return mod

    _fails(ch13.check_sink_window(with_if), "technique", "cannot compile", "ones_like")


def test_a_mask_that_reads_one_element_for_all_fails():
    # the sink decided from the first key only, then broadcast: right on no grid of more than one key
    def branching(w):
        def mod(b, h, q_idx, kv_idx):
            return torch.stack([torch.tensor(bool(kv_idx.flatten()[0] == 0))]).expand(
                torch.broadcast_shapes(q_idx.shape, kv_idx.shape)) | ((q_idx >= kv_idx) & (q_idx - kv_idx < w))
        return mod

    _fails(ch13.check_sink_window(branching), "values differ")

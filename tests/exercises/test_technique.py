"""The watcher follows data, not storage: every tensor computed from an input carries the input
rows it holds, per element, through copies, joins, selections, conversions and arithmetic; a
tensor holding more than a block of an input's rows is a whole read; values taken out of torch
are refused."""
import numpy as np
import pytest
import torch

from flashtut.exercises import technique as tq


def _run(fn, block=8, **kwargs):
    q = torch.randn(1, 2, 40, 4, dtype=torch.float64)
    k = torch.randn(1, 2, 30, 4, dtype=torch.float64)
    return tq.run_watched(lambda: fn(q, k), dict(q=q, k=k), block_rows={"q": block, "k": block},
                          pair_rows=(block, block), **kwargs)


COPIES = {
    "cat of blocks": lambda q, k: torch.cat([k[:, :, s:s + 8] for s in range(0, 30, 8)], 2),
    "stack of blocks": lambda q, k: torch.stack([k[:, :, s:s + 6] for s in range(0, 30, 6)]),
    "clone": lambda q, k: k.clone(),
    "index_select": lambda q, k: k.index_select(2, torch.arange(30)),
    "advanced indexing": lambda q, k: k[:, :, torch.arange(0, 30, 2)],
    "gather": lambda q, k: k.gather(2, torch.arange(30).view(1, 1, 30, 1).expand(1, 2, 30, 4)),
    ".to(float32)": lambda q, k: k.to(torch.float32),
    ".contiguous() of a transpose": lambda q, k: k.transpose(-2, -1).contiguous(),
    "arithmetic": lambda q, k: 2.0 * k + 1.0,
    "two separate blocks": lambda q, k: torch.cat([k[:, :, :8], k[:, :, 20:28]], 2),
    "copy_ into a buffer": lambda q, k: torch.empty(1, 2, 30, 4, dtype=torch.float64).copy_(k),
    "written block by block": lambda q, k: _blockwise_copy(k),
}


def _blockwise_copy(k):
    buf = torch.zeros_like(k)
    for s in range(0, 30, 8):
        buf[:, :, s:s + 8] = k[:, :, s:s + 8] * 1.0
    return buf


@pytest.mark.parametrize("how", COPIES)
def test_a_copy_of_more_than_a_block_is_a_whole_read(how):
    _, trace, err = _run(COPIES[how])
    assert err is None, err
    assert trace.whole_reads and trace.whole_reads[0][0] == "k", trace.whole_reads


def test_one_block_at_a_time_is_no_whole_read():
    def tiled(q, k):
        out = []
        for s in range(0, 30, 8):
            kb = torch.cat([k[:, :, s:s + 4], k[:, :, s + 4:s + 8]], 2).clone().to(torch.float32)
            out.append((q[:, :, :8].float() @ kb.transpose(-2, -1)).sum())
        return out
    _, trace, err = _run(tiled)
    assert err is None and not trace.whole_reads and not trace.wide_scores, trace


def test_reads_of_a_copy_count_as_reads_of_its_rows():
    def twice(q, k):
        kc = k[:, :, :8].clone()
        return [(q[:, :, :8] @ kc.transpose(-2, -1)).sum() for _ in range(3)]
    _, trace, _ = _run(twice)
    assert trace.read_elements("k") == 3 * 2 * 8 * 4


def test_a_whole_score_row_is_seen_even_for_one_query_row():
    _, trace, _ = _run(lambda q, k: q[:, :, 3:4] @ torch.cat([k[:, :, s:s + 8] for s in range(0, 30, 8)], 2)
                       .transpose(-2, -1), block=8)
    assert any(side == "k" and n == 30 for side, _, _, n in trace.wide_scores), trace.wide_scores


def test_causal_pairs_are_tracked_per_element_through_copies():
    def rows_against_all(q, k):
        kc = torch.cat([k[:, :, s:s + 8] for s in range(0, 30, 8)], 2)
        return [q[:, :, i:i + 1] @ kc.transpose(-2, -1) for i in range(0, 16)]
    _, trace, _ = _run(rows_against_all, causal=True, blocks=(8, 8))
    extra = trace.hidden & ~tq.causal_allowed(40, 30, 8, 8)
    assert bool(extra[0, 8:].all()) and not bool(extra[0, :8].any())


@pytest.mark.parametrize("leave", [lambda q, k: k.numpy(), lambda q, k: np.asarray(k[:, :, :2] * 2),
                                   lambda q, k: k.tolist(), lambda q, k: [float(x) for x in k[0, 0, :, 0]]])
def test_values_leaving_torch_are_refused(leave):
    _, _, err = _run(leave)
    assert err and ("NumPy" in err or "Python numbers" in err), err


def test_a_maximum_taken_out_as_a_number_is_allowed():
    _, _, err = _run(lambda q, k: [float(k[:, :, :i + 1].amax()) for i in range(30)])
    assert err is None, err


def test_a_caught_refusal_still_counts():
    def swallow(q, k):
        try:
            return k.numpy()
        except Exception:  # noqa: BLE001 - the reader hides it
            return None
    _, _, err = _run(swallow)
    assert err and "NumPy" in err

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


def _index_put_acc(b):
    n = b.shape[2]
    idx = (torch.arange(1)[:, None, None], torch.arange(2)[None, :, None], torch.arange(n)[None, None, :])
    return torch.zeros_like(b).index_put_(idx, b, accumulate=True)


def _index_along(b, dim=2):
    shape = [1] * 4
    shape[dim] = b.shape[dim]
    return torch.arange(b.shape[dim]).view(shape).expand(b.shape).contiguous()


#: copies made one block at a time by operators that compute (products with the identity,
#: sorts, accumulating writes...), then joined: the join holds every row all the same
BLOCKWISE = {
    "eye @ block": lambda b: torch.eye(b.shape[2], dtype=b.dtype) @ b,
    "block @ eye": lambda b: b @ torch.eye(b.shape[3], dtype=b.dtype),
    "einsum with the identity": lambda b: torch.einsum("ij,bhjd->bhid", torch.eye(b.shape[2], dtype=b.dtype), b),
    "mv with the identity": lambda b: torch.stack([torch.eye(b.shape[2], dtype=b.dtype) @ b[0, 0, :, d]
                                                   for d in range(b.shape[3])], -1)[None, None],
    ".T.T": lambda b: b.transpose(-2, -1).transpose(-2, -1).contiguous(),
    "* 1": lambda b: b * 1,
    "+ 0": lambda b: b + 0,
    "index_select of all rows": lambda b: b.index_select(2, torch.arange(b.shape[2])),
    "clone": lambda b: b.clone(),
    "float32 round trip": lambda b: b.float().double(),
    "int64 bits": lambda b: b.view(torch.int64).clone().view(torch.float64),
    "scaled to int64": lambda b: (b * 2 ** 40).long().double() / 2 ** 40,
    "sort along rows": lambda b: b.sort(dim=2).values,
    "sort within rows": lambda b: b.sort(dim=3).values,
    "topk": lambda b: b.topk(b.shape[2], dim=2).values,
    "max over a broadcast identity": lambda b: (b[:, :, :, None] * torch.eye(b.shape[2], dtype=b.dtype)[:, :, None])
    .sum(2),
    "gather": lambda b: b.gather(3, _index_along(b, 3)),
    "scatter": lambda b: torch.zeros_like(b).scatter(2, _index_along(b), b),
    "scatter_add": lambda b: torch.zeros_like(b).scatter_add(2, _index_along(b), b),
    "scatter_reduce": lambda b: torch.zeros_like(b).scatter_reduce(2, _index_along(b), b, "sum"),
    "index_add": lambda b: torch.zeros_like(b).index_add(2, torch.arange(b.shape[2]), b),
    "index_put(accumulate=True)": _index_put_acc,
    "cumsum then diff": lambda b: torch.diff(b.cumsum(2), dim=2, prepend=torch.zeros_like(b[:, :, :1])),
    "diag_embed": lambda b: torch.diag_embed(b).sum(-1),
}


@pytest.mark.parametrize("how", BLOCKWISE)
def test_a_copy_made_block_by_block_is_a_whole_read(how):
    def copy(q, k):
        return torch.cat([BLOCKWISE[how](k[:, :, s:s + 8].contiguous()) for s in range(0, 30, 8)], 2)
    _, trace, err = _run(copy)
    assert err is None, err
    assert [r[0] for r in trace.whole_reads][:1] == ["k"], trace.whole_reads


def test_accumulated_copies_carry_the_rows_they_hold():
    _, trace, _ = _run(lambda q, k: _index_put_acc(k[:, :, :8]) * 1)
    assert not trace.whole_reads
    _, trace, _ = _run(lambda q, k: torch.cat([_index_put_acc(k[:, :, s:s + 8]) for s in range(0, 30, 8)], 2))
    assert trace.whole_reads[0][0] == "k" and trace.whole_reads[0][3] == 30, trace.whole_reads


def test_tensors_from_outside_the_call_and_random_draws_are_recorded():
    stash = torch.randn(1, 2, 30, 4, dtype=torch.float64)
    _, trace, _ = _run(lambda q, k: (stash * 2, stash))
    assert [op for op, _ in trace.foreign] == ["mul"], trace.foreign
    _, trace, _ = _run(lambda q, k: stash, known=[stash])
    assert not trace.foreign
    _, trace, _ = _run(lambda q, k: q[:, :, :8] + torch.randn(1, 2, 8, 4, dtype=torch.float64))
    assert trace.random == ["randn"]


def test_what_stays_alive_after_the_call_is_counted():
    kept = []
    _, trace, _ = _run(lambda q, k: kept.append(k[:, :, :8] * 2) or torch.zeros(3))
    assert trace.live_after == 2 * 8 * 4 + 3

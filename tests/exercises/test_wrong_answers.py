"""Wrong answers of our own that every technique checker must reject, with the sentence the
reader sees, and right answers (the book's worked solutions, the library, answers that work in
place) that it must accept. Sizes are the checkers' own: small, but with D = 128, more rows
than a block and odd lengths, so shortcuts show."""
import concurrent.futures
import inspect
import math
import pickle

import numpy as np
import pytest
import torch

import flashtut
from flashtut.cuda.models import hopper_layout as hl
from flashtut.exercises import ch04, ch05, ch06, ch07, ch10, ch11, ch12

from exercises.answers import (KEPT, NEG_INF, cat_copy, fails as _fails, hidden as _hidden, keeping, tiled_backward,
                              tiled_forward)


# ---------------------------------------------------------------- 4.2 and 4.3

def softmax_inplace_online(x, bs):
    """Right, and in place: pass 1 online over blocks, pass 2 overwrites x with the answer."""
    m = torch.full(x.shape[:-1] + (1,), NEG_INF, dtype=x.dtype)
    d = torch.zeros_like(m)
    for s in range(0, x.shape[-1], bs):
        blk = x[..., s:s + bs]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        d.mul_(torch.exp(m - m_new)).add_(torch.exp(blk - m_new).sum(-1, keepdim=True))
        m = m_new
    return x.sub_(m).exp_().div_(d)


def softmax_max_first(x, bs):
    """Blocks for the sum, but the maximum of the whole row first: not online."""
    m = x.amax(-1, keepdim=True)
    d = sum(torch.exp(x[..., s:s + bs] - m).sum(-1, keepdim=True) for s in range(0, x.shape[-1], bs))
    return torch.exp(x - m) / d


def softmax_of_the_callers_copy(x, bs):
    """torch.softmax of the checker's own x, found in its frame (not the watched copy)."""
    frame = inspect.currentframe()
    while frame is not None and not (isinstance(frame.f_locals.get("x"), torch.Tensor)
                                     and frame.f_locals["x"] is not x and frame.f_locals["x"].shape == x.shape):
        frame = frame.f_back
    return torch.softmax(x if frame is None else frame.f_locals["x"], -1)


def softmax_numpy(x, bs):
    a = x.numpy()
    e = np.exp(a - a.max(-1, keepdims=True))
    return torch.from_numpy(e / e.sum(-1, keepdims=True))


@pytest.mark.parametrize("fn", [ch04.solution_online_softmax, softmax_inplace_online,
                                lambda x, bs: flashtut.online_softmax(x, block_size=bs)])
def test_online_softmax_accepts_right_answers(fn):
    res = ch04.check_online_softmax(fn)
    assert res, res.message


@pytest.mark.parametrize("fn,phrases", [
    (lambda x, bs: torch.softmax(x, -1), ["aten._softmax", "covered 101 columns", "one block"]),
    (softmax_max_first, ["aten.amax", "covered 101 columns"]),
    (softmax_numpy, ["NumPy"]),
    (softmax_of_the_callers_copy, ["neither made nor was given"]),
    (lambda x, bs: torch.softmax(torch.cat([x[:, s:s + bs] @ torch.eye(x[:, s:s + bs].shape[1], dtype=x.dtype)
                                            for s in range(0, x.shape[1], bs)], 1), -1), ["covered 101 columns"]),
])
def test_online_softmax_rejects_whole_row_work(fn, phrases):
    _fails(ch04.check_online_softmax(fn), *phrases)


def combine_loop(m, d):
    m_out, d_out = m[0], d[0]
    for p in range(1, m.shape[0]):
        m_out, d_out = flashtut.merge_softmax_states(m_out, d_out, m[p], d[p])
    return m_out, d_out


def combine_rows_loop(m, d):
    cols = [ch04.solution_combine_states(m[:, r:r + 1], d[:, r:r + 1]) for r in range(m.shape[1])]
    return torch.cat([c[0] for c in cols]), torch.cat([c[1] for c in cols])


def combine_in_place(m, d):
    m_total = m.amax(dim=0)
    return m_total, d.mul_(torch.exp(m.sub_(m_total))).sum(dim=0)


def test_combine_states_accepts_vectorised_answers():
    for fn in (ch04.solution_combine_states, combine_in_place):
        res = ch04.check_combine_states(fn)
        assert res and "no Python loop" in res.message, res.message


@pytest.mark.parametrize("fn,phrases", [
    (combine_loop, ["a Python loop over the states P"]),
    (combine_rows_loop, ["a Python loop over the rows"]),
    (lambda m, d: ch04.solution_combine_states(torch.from_numpy(m.numpy()), d), ["NumPy"]),
])
def test_combine_states_rejects_loops_and_numpy(fn, phrases):
    _fails(ch04.check_combine_states(fn), *phrases)


# ---------------------------------------------------------------- 5.1

def test_tiled_loop_checker_rejects_naive_attention_and_the_bug():
    _fails(ch05.check_tiled_attention(lambda q, k, v, b: flashtut.naive_attention(q, k, v)),
           "the output matches, but this is not the tiled loop", "whole row of the score matrix")
    _fails(ch05.check_tiled_attention(ch05.buggy_loop), "exactly the rows whose max rose")


def test_tiled_loop_checker_accepts_the_fix_and_the_library():
    assert ch05.check_tiled_attention(ch05.solution_fixed_tiled_attention)
    assert ch05.check_tiled_attention(lambda q, k, v, b: flashtut.tiled_attention(q, k, v, block_m=b, block_n=b))


# ---------------------------------------------------------------- 5.3

def eye_copy(t, bn):
    """A whole copy of ``t`` made block by block by matrix products with the identity."""
    return torch.cat([torch.eye(min(bn, t.shape[2] - s), dtype=t.dtype) @ t[:, :, s:s + bn]
                      for s in range(0, t.shape[2], bn)], dim=2)


def index_add_copy(t, bn):
    """A whole copy of ``t`` accumulated block by block into zeros (index_add_)."""
    buf = torch.zeros_like(t)
    for s in range(0, t.shape[2], bn):
        buf.index_add_(2, torch.arange(s, min(s + bn, t.shape[2])), t[:, :, s:s + bn])
    return buf


def sort_copy(t, bn):
    """A whole copy of ``t`` through a sort of each block's rows and a scatter back."""
    buf = torch.empty_like(t)
    for s in range(0, t.shape[2], bn):
        vals, idx = t[:, :, s:s + bn].sort(dim=3)
        buf[:, :, s:s + bn] = torch.empty_like(vals).scatter_(3, idx, vals)
    return buf


def forward_cat_then_rows(q, k, v, causal, bm, bn, copy=cat_copy):
    """The issue's hidden wrong answer: K and V copied once with a cat of block slices (or
    another ``copy``), then a softmax over whole score rows, row by row."""
    D = q.shape[3]
    kc, vc = copy(k, bn), copy(v, bn)
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=q.dtype)
    for i in range(q.shape[2]):
        s = q[:, :, i:i + 1] @ kc.transpose(-2, -1) * D ** -0.5
        if causal:
            s[..., i + 1:] = NEG_INF
        o[:, :, i:i + 1] = torch.softmax(s, -1) @ vc
        lse[:, :, i] = torch.logsumexp(s, -1)[..., 0]
    return o, lse


def forward_index_copy(q, k, v, causal, bm, bn):
    """Tiled over query blocks, but K and V gathered whole with index_select first."""
    idx = torch.arange(k.shape[2])
    kc, vc = k.index_select(2, idx), v.index_select(2, idx).clone()
    return ch05.solution_flash_forward(q, kc, vc, causal, bm, bn)


def forward_numpy(q, k, v, causal, bm, bn):
    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    s = qn @ np.swapaxes(kn, -1, -2) / math.sqrt(qn.shape[-1])
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return torch.from_numpy(e @ vn / e.sum(-1, keepdims=True)), torch.from_numpy((m + np.log(e.sum(-1, keepdims=True)))[..., 0])


def forward_via_item(q, k, v, causal, bm, bn):
    """Right numbers built from Python floats: the values left torch."""
    rows = [[float(x) for x in r] for r in k[0, 0, :, :2].reshape(-1, 2)]
    assert rows
    return ch05.solution_flash_forward(q, k, v, causal, bm, bn)


def forward_via_tolist(q, k, v, causal, bm, bn):
    """K and V round-tripped through Python lists, then the worked solution."""
    return ch05.solution_flash_forward(q, torch.tensor(k.tolist(), dtype=k.dtype),
                                       torch.tensor(v.tolist(), dtype=v.dtype), causal, bm, bn)


def forward_sdpa(q, k, v, causal, bm, bn):
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return o, ch05.solution_flash_forward(q, k, v, causal, bm, bn)[1]


def forward_naive_in_float16(q, k, v, causal, bm, bn):
    """The worked solution where the checker looks hard (float64), naive attention in float32
    for the float16 case."""
    if q.dtype != torch.float16:
        return ch05.solution_flash_forward(q, k, v, causal, bm, bn)
    q32, k32 = q.float(), k.float()
    return flashtut.naive_attention(q32, k32, v.float()).half(), flashtut.attention_lse(q32, k32)


ANSWERS = {}


def forward_precomputed(q, k, v, causal, bm, bn):
    """Caching between calls: answers computed earlier (here by naive attention on a first
    run of the checker), looked up by shape."""
    return ANSWERS[tuple(q.shape), causal]


def forward_reads_the_callers_copies(q, k, v, causal, bm, bn):
    """Naive attention on the checker's own q, k and v, found in its frame."""
    frame = inspect.currentframe()
    while frame is not None and not (isinstance(frame.f_locals.get("k"), torch.Tensor)
                                     and frame.f_locals["k"] is not k and frame.f_locals["k"].shape == k.shape):
        frame = frame.f_back
    q0, k0, v0 = (frame.f_locals[n] for n in "qkv")
    return flashtut.naive_attention(q0, k0, v0, causal=causal), flashtut.attention_lse(q0, k0, causal=causal)


def forward_in_another_thread(q, k, v, causal, bm, bn):
    """Naive attention run in a worker thread, where the watch of this thread does not look."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        o, lse = pool.submit(lambda: (flashtut.naive_attention(q, k, v, causal=causal),
                                      flashtut.attention_lse(q, k, causal=causal))).result()
    return o * 1, lse


def forward_regenerates_the_inputs(q, k, v, causal, bm, bn):
    torch.randn(q.shape, dtype=q.dtype)
    return ch05.solution_flash_forward(q, k, v, causal, bm, bn)


def forward_d64_only(q, k, v, causal, bm, bn):
    """Right only for head dims up to 64: drops the rest of each row."""
    if q.shape[-1] > 64:                       # as if the scale were 1/sqrt(min(D, 64))
        q = q * (q.shape[-1] / 64) ** 0.5
    return ch05.solution_flash_forward(q, k, v, causal, bm, bn)


FORWARD_WRONG = {
    "cat copy, then whole rows": (forward_cat_then_rows, ["read or held", "aten.cat", "whole row of the score matrix"]),
    "index_select copy": (forward_index_copy, ["rows of k at once", "aten.index_select"]),
    "eye matmul copy, then whole rows": (lambda *a: forward_cat_then_rows(*a, copy=eye_copy), ["rows of k at once"]),
    "index_add copy, then whole rows": (lambda *a: forward_cat_then_rows(*a, copy=index_add_copy),
                                        ["rows of k at once", "aten.index_add_"]),
    "sort and scatter copy": (lambda *a: forward_cat_then_rows(*a, copy=sort_copy), ["rows of k at once"]),
    "python lists": (forward_via_tolist, ["Python numbers", "tolist"]),
    "scaled_dot_product_attention": (forward_sdpa, ["rows of q at once"]),
    "naive attention in the float16 case": (forward_naive_in_float16, ["float16", "whole row of the score matrix"]),
    "the caller's copies": (forward_reads_the_callers_copies, ["neither made nor was given"]),
    "random numbers": (forward_regenerates_the_inputs, ["drew random numbers"]),
    "another thread": (forward_in_another_thread, ["neither made nor was given"]),
    "numpy": (forward_numpy, ["NumPy"]),
    "python floats": (forward_via_item, ["Python numbers"]),
    "right only for D <= 64": (forward_d64_only, ["q (1, 2, 45, 128)", "values differ"]),
    "no causal skip": (lambda *a: tiled_forward(*a, skip=False), ["above the causal diagonal", "skip those tiles"]),
}


@pytest.mark.parametrize("wrong", FORWARD_WRONG)
def test_forward_checker_rejects(wrong):
    fn, phrases = FORWARD_WRONG[wrong]
    _fails(ch05.check_flash_forward(fn), *phrases)


def test_forward_checker_rejects_answers_cached_from_an_earlier_call():
    def record(q, k, v, causal, bm, bn):
        ANSWERS[tuple(q.shape), causal] = (flashtut.naive_attention(q, k, v, causal=causal),
                                           flashtut.attention_lse(q, k, causal=causal))
        return ch05.solution_flash_forward(q, k, v, causal, bm, bn)
    ch05.check_flash_forward(record)                  # an earlier run (itself rejected) fills the cache
    assert len(ANSWERS) == len(ch05.FORWARD_CASES)
    _fails(ch05.check_flash_forward(forward_precomputed), "returned a tensor", "neither made nor was given")
    _fails(ch05.check_flash_forward(lambda *a: tuple(t * 1 for t in forward_precomputed(*a))),
           "read (aten.mul)", "a cache kept from an earlier call")


def test_forward_checker_accepts_an_in_place_answer():
    res = ch05.check_flash_forward(lambda *a: tiled_forward(*a, in_place=True))
    assert res, res.message


# ---------------------------------------------------------------- 6.4 and 6.5

def backward_rows_softmax(q, k, v, o, lse, do, causal, bm, bn):
    """The issue's wrong backward: per query row, torch.softmax over the whole score row,
    ignoring lse and Delta (K and V copied once with a cat)."""
    D = q.shape[3]
    kc, vc = cat_copy(k, bn), cat_copy(v, bn)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(q.shape[2]):
        s = q[:, :, i:i + 1] @ kc.transpose(-2, -1) * D ** -0.5
        if causal:
            s[..., i + 1:] = NEG_INF
        p, doi = torch.softmax(s, -1), do[:, :, i:i + 1]
        dp = doi @ vc.transpose(-2, -1)
        ds = p * (dp - (p * dp).sum(-1, keepdim=True))
        dv += p.transpose(-2, -1) @ doi
        dq[:, :, i:i + 1] = ds @ kc * D ** -0.5
        dk += ds.transpose(-2, -1) @ q[:, :, i:i + 1] * D ** -0.5
    return dq, dk, dv


def backward_tiles_softmax(q, k, v, o, lse, do, causal, bm, bn):
    """Tiled, but each tile's probabilities from a softmax over the tile's keys rescaled by a
    row max and sum it recomputes: it ignores lse (two passes over the keys per query block)."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    sc = D ** -0.5
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0 in range(0, Nq, bm):
        q1 = min(q0 + bm, Nq)
        qi, doi = q[:, :, q0:q1], do[:, :, q0:q1]
        ends = range(0, min(q1, Nk) if causal else Nk, bn)
        tiles = []
        for k0 in ends:
            s = qi @ k[:, :, k0:k0 + bn].transpose(-2, -1) * sc
            tiles.append(s.masked_fill(_hidden(q0, q1, k0, min(k0 + bn, Nk)), NEG_INF) if causal else s)
        m = torch.stack([t.amax(-1) for t in tiles]).amax(0)
        l = sum(torch.exp(t - m[..., None]).sum(-1) for t in tiles)
        delta = (doi * o[:, :, q0:q1]).sum(-1)
        for k0, s in zip(ends, tiles):
            k1 = min(k0 + bn, Nk)
            p = torch.exp(s - m[..., None]) / l[..., None]
            dv[:, :, k0:k1] += p.transpose(-2, -1) @ doi
            ds = p * (doi @ v[:, :, k0:k1].transpose(-2, -1) - delta[..., None])
            dq[:, :, q0:q1] += ds @ k[:, :, k0:k1] * sc
            dk[:, :, k0:k1] += ds.transpose(-2, -1) @ qi * sc
    return dq, dk, dv


def backward_numpy(q, k, v, o, lse, do, causal, bm, bn):
    grads = ch06.solution_attention_backward(*(torch.from_numpy(t.numpy()) for t in (q, k, v, do)), causal)
    return tuple(grads)


def backward_autograd_in_float16(q, k, v, o, lse, do, causal, bm, bn):
    if q.dtype != torch.float16:
        return ch06.solution_flash_backward(q, k, v, o, lse, do, causal, bm, bn)
    return tuple(g.half() for g in ch06.autograd_grads(q.float(), k.float(), v.float(), do.float(), causal))


def backward_copies_outside_the_operators(how):
    """Whole matrices on copies of q, k and v made where no operator is seen."""
    def copy(t):
        if how == "map_":
            return torch.zeros_like(t).map_(t, lambda a, b: b)
        return pickle.loads(pickle.dumps(t))

    def backward(q, k, v, o, lse, do, causal, bm, bn):
        return ch06.solution_attention_backward(copy(q), copy(k), copy(v), do, causal)
    return backward


BACKWARD_WRONG = {
    "per-row softmax, no lse or Delta": (backward_rows_softmax, ["reduced scores over key rows", "aten._softmax"]),
    "tiles from their own softmax": (backward_tiles_softmax, ["reduced scores over key rows"]),
    "every tile above the diagonal": (lambda *a: tiled_backward(*a, skip=False), ["above the causal diagonal"]),
    "float16 accumulators": (lambda *a: tiled_backward(*a, acc_t=a[0].dtype), ["float16", "in float32"]),
    "numpy": (backward_numpy, ["NumPy"]),
    "autograd in the float16 case": (backward_autograd_in_float16, ["float16", "Nq x Nk"]),
    "copies by Tensor.map_": (backward_copies_outside_the_operators("map_"), ["Tensor.map_"]),
    "copies by pickle": (backward_copies_outside_the_operators("pickle"), ["Tensor.untyped_storage"]),
}


@pytest.mark.parametrize("wrong", BACKWARD_WRONG)
def test_backward_checker_rejects(wrong):
    fn, phrases = BACKWARD_WRONG[wrong]
    _fails(ch06.check_flash_backward(fn), *phrases)


class NumpyInside(ch06.SolutionFlashAttention):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, bm=64, bn=64):
        o, lse = forward_numpy(q.detach(), k.detach(), v.detach(), causal, bm, bn)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.blocks = causal, (bm, bn)
        return o


@pytest.mark.parametrize("wrong,phrases", [
    (NumpyInside, ["forward", "NumPy"]),
    (keeping(lambda q, k, o, lse, c: lse.clone()), ["saved 6 tensors", "save only q, k, v, o"]),
    (keeping(lambda q, k, o, lse, c: lse.clone(), how="ctx"), ["on ctx as attributes", "ctx.more[0]"]),
    (keeping(lambda q, k, o, lse, c: o.detach() * 1, how="global"), ["alive after the forward returned"]),
])
def test_function_checker_rejects(wrong, phrases):
    _fails(ch06.check_flash_function(wrong), *phrases)
    KEPT.clear()


# ---------------------------------------------------------------- 07 at D = 128 and long rows

def test_chapter_07_checkers_catch_answers_right_only_on_small_shapes():
    ok = ch07.check_preprocess(ch07.reference_delta)
    assert ok, ok.message
    _fails(ch07.check_preprocess(lambda o, do: ch07.reference_delta(o[..., :64], do[..., :64])),
           "(1, 2, 181, 128)", "values differ")

    def first_rows_only(o, do):
        d = ch07.reference_delta(o, do)
        d[..., 64:] = 0
        return d
    _fails(ch07.check_preprocess(first_rows_only), "values differ")

    def window_64_keys(q, k, v, window):
        return ch07.reference_window_attention(q, k[:, :, :64].expand_as(k) if k.shape[2] <= 64 else
                                               torch.cat([k[:, :, :64], k[:, :, 64:] * 0], 2), v, window)
    ok = ch07.check_window_attention(ch07.reference_window_attention)
    assert ok, ok.message
    _fails(ch07.check_window_attention(window_64_keys), "values differ")
    _fails(ch07.check_window_attention(lambda q, k, v, w: ch07.reference_window_attention(q, k, v, w, scale=0.125)),
           "values differ")


# ---------------------------------------------------------------- 10, 11, 12

def merge_without_the_max(o_a, lse_a, o_b, lse_b):
    w_a, w_b = torch.exp(lse_a), torch.exp(lse_b)
    total = w_a + w_b
    o = (o_a * w_a[..., None] + o_b * w_b[..., None]) / total[..., None]
    return torch.where(total[..., None] > 0, o, torch.zeros_like(o)), torch.log(total)


def test_merge_rejects_an_unguarded_exponential():
    _fails(ch10.check_merge(merge_without_the_max), "+900 or -900", "subtract the larger lse first")
    assert ch10.check_merge(flashtut.decode.merge_attention_states)


def test_chapter_11_answers_arrays_and_accepts_numpy_integers():
    _fails(ch11.check_tile_offset(lambda r, c, rows: np.array([hl.tile_offset(r, c, rows)] * 2)),
           "cases differ", "ndarray of shape (2,)")
    assert ch11.check_tile_offset(lambda r, c, rows: np.int64(hl.tile_offset(r, c, rows)))
    assert ch11.check_ring_slot(lambda i, s: list(hl.ring_slot(i, s)))
    _fails(ch11.check_ring_slot(lambda i, s: np.array(hl.ring_slot(i, s))), "cases differ")
    _fails(ch11.check_exp2_poly(lambda x: [[1.0], [2.0, 3.0]]), "not an array of numbers")


def test_chapter_12_reports_an_exception_inside_the_model():
    def only_float64(q, k, v):
        if q.dtype != torch.float64:
            raise TypeError("only float64, please")
        return flashtut.naive_attention(q, k, v, causal=True)
    _fails(ch12.check_attention_backend(only_float64), "inside the model your function raised TypeError")

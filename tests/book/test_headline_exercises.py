"""The three headline exercises (chapter 05: the tiled forward; chapter 06: the tiled backward
and the autograd.Function): their checkers accept the worked solutions and the library, and
reject answers that get the numbers right with the wrong technique (not tiled, not streaming,
no causal skipping, float16 accumulators, writing into the inputs, saving P)."""
import math

import pytest
import torch

import flashtut
from flashtut.exercises import ch05, ch06, technique

from exercises.answers import NEG_INF, flat as _flat, hidden as _hidden, keeping, tiled_backward, tiled_forward


def naive(q, k, v, causal, bm, bn):
    return flashtut.naive_attention(q, k, v, causal=causal), flashtut.attention_lse(q, k, causal=causal)


def query_blocks_against_all_keys(q, k, v, causal, bm, bn):
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=q.dtype)
    for q0 in range(0, q.shape[2], bm):
        q1 = min(q0 + bm, q.shape[2])
        s = q[:, :, q0:q1] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(_hidden(q0, q1, 0, k.shape[2]), NEG_INF)
        o[:, :, q0:q1], lse[:, :, q0:q1] = torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
    return o, lse


def two_passes_over_the_keys(q, k, v, causal, bm, bn):
    """Tiled, but one pass for the maximum and another for the sum: K is read twice."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=q.dtype)
    for q0 in range(0, Nq, bm):
        q1 = min(q0 + bm, Nq)
        qi = q[:, :, q0:q1] * D ** -0.5
        ends = range(0, min(q1, Nk) if causal else Nk, bn)

        def tile(k0):
            s = qi @ k[:, :, k0:min(k0 + bn, Nk)].transpose(-2, -1)
            return s.masked_fill(_hidden(q0, q1, k0, min(k0 + bn, Nk)), NEG_INF) if causal else s
        m = torch.full(qi.shape[:3], NEG_INF, dtype=q.dtype)
        for k0 in ends:
            m = torch.maximum(m, tile(k0).amax(-1))
        l, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for k0 in ends:
            p = torch.exp(tile(k0) - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, k0:min(k0 + bn, Nk)]
        o[:, :, q0:q1], lse[:, :, q0:q1] = acc / l[..., None], m + torch.log(l)
    return o, lse


def keeps_a_row_of_tiles(q, k, v, causal, bm, bn):
    """Reads each block once, but holds every score tile of a query block before the softmax."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=q.dtype)
    for q0 in range(0, Nq, bm):
        q1 = min(q0 + bm, Nq)
        qi, tiles = q[:, :, q0:q1] * D ** -0.5, []
        for k0 in range(0, min(q1, Nk) if causal else Nk, bn):
            s = qi @ k[:, :, k0:k0 + bn].transpose(-2, -1)
            tiles.append(s.masked_fill(_hidden(q0, q1, k0, min(k0 + bn, Nk)), NEG_INF) if causal else s)
        m = tiles[0].amax(-1)
        for s in tiles[1:]:
            m = torch.maximum(m, s.amax(-1))
        l = acc = 0
        for j, s in enumerate(tiles):
            p = torch.exp(s - m[..., None])
            l, acc = l + p.sum(-1), acc + p @ v[:, :, j * bn:j * bn + p.shape[-1]]
        o[:, :, q0:q1], lse[:, :, q0:q1] = acc / l[..., None], m + torch.log(l)
    return o, lse


FORWARD_WRONG = {
    "not tiled": (naive, "at once"),
    "not streaming": (query_blocks_against_all_keys, "at once"),
    "two passes": (two_passes_over_the_keys, "one pass"),
    "holds every tile": (keeps_a_row_of_tiles, "alive at once"),
    "no causal skipping": (lambda *a: tiled_forward(*a, skip=False), "above the causal diagonal"),
    "float16 accumulators": (lambda *a: tiled_forward(*a, acc_t=a[0].dtype), "float16"),
    "writes into q": (lambda *a: tiled_forward(*a, prescale_in_place=True), "changed its input q"),
}


def test_forward_checker_accepts_the_solution_and_the_library():
    res = ch05.check_flash_forward(ch05.solution_flash_forward)
    assert res, res.message
    assert ch05.check_flash_forward(
        lambda q, k, v, c, bm, bn: flashtut.tiled_attention(q, k, v, causal=c, block_m=bm, block_n=bn,
                                                            return_lse=True))
    assert all(len(line) <= 90 for line in res.message.splitlines())


@pytest.mark.parametrize("wrong", FORWARD_WRONG)
def test_forward_checker_rejects_the_wrong_technique(wrong):
    fn, phrase = FORWARD_WRONG[wrong]
    res = ch05.check_flash_forward(fn)
    assert not res
    assert phrase in _flat(res.message), res.message
    assert all(len(line) <= 90 for line in res.message.splitlines())


def test_forward_checker_survives_a_raising_or_badly_shaped_answer():
    assert "raised ZeroDivisionError" in _flat(ch05.check_flash_forward(lambda *a: 1 / 0).message)
    assert "expected (o, lse)" in _flat(ch05.check_flash_forward(lambda q, *a: q).message)


# ------------------------------------------------------------------------------ backward

def backward_by_columns(q, k, v, o, lse, do, causal, bm, bn):
    """One key block against all queries at once: an Nq x block_n column of P."""
    D = q.shape[3]
    delta = (do * o).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.empty_like(k), torch.empty_like(v)
    for k0 in range(0, k.shape[2], bn):
        k1 = min(k0 + bn, k.shape[2])
        s = q @ k[:, :, k0:k1].transpose(-2, -1) * D ** -0.5
        if causal:
            s = s.masked_fill(_hidden(0, q.shape[2], k0, k1), NEG_INF)
        p = torch.exp(s - lse[..., None])
        dv[:, :, k0:k1] = p.transpose(-2, -1) @ do
        ds = p * (do @ v[:, :, k0:k1].transpose(-2, -1) - delta)
        dq += ds @ k[:, :, k0:k1] * D ** -0.5
        dk[:, :, k0:k1] = ds.transpose(-2, -1) @ q * D ** -0.5
    return dq, dk, dv


def backward_scaling_do_in_place(q, k, v, o, lse, do, causal, bm, bn):
    do.mul_(2.0)
    dq, dk, dv = ch06.solution_flash_backward(q, k, v, o, lse, do, causal, bm, bn)
    return dq / 2, dk / 2, dv / 2


BACKWARD_WRONG = {
    "autograd through naive": (lambda q, k, v, o, lse, do, c, bm, bn: ch06.autograd_grads(q, k, v, do, causal=c),
                               "Nq x Nk"),
    "whole matrices": (lambda q, k, v, o, lse, do, c, bm, bn: ch06.solution_attention_backward(q, k, v, do, c),
                       "at once"),
    "no causal skipping": (lambda *a: tiled_backward(*a, skip=False), "skip those tiles"),
    "columns of P": (backward_by_columns, "at once"),
    "writes into do": (backward_scaling_do_in_place, "changed its input do"),
}


def test_backward_checker_accepts_the_solution_and_the_library():
    assert ch06.check_flash_backward(ch06.solution_flash_backward)
    assert ch06.check_flash_backward(
        lambda q, k, v, o, lse, do, c, bm, bn: flashtut.tiled_attention_backward(
            q, k, v, o, lse, do, causal=c, block_m=bm, block_n=bn))


@pytest.mark.parametrize("wrong", BACKWARD_WRONG)
def test_backward_checker_rejects_the_wrong_technique(wrong):
    fn, phrase = BACKWARD_WRONG[wrong]
    res = ch06.check_flash_backward(fn)
    assert not res
    assert phrase in _flat(res.message), res.message


# ------------------------------------------------------------------------------ autograd.Function

def probabilities(q, k, o, lse, causal):
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(flashtut.causal_mask(q.shape[2], k.shape[2]), NEG_INF)
    return torch.softmax(s, -1)


SavesP = keeping(probabilities)


class WrongDv(ch06.SolutionFlashAttention):
    @staticmethod
    def backward(ctx, do):
        dq, dk, dv, *rest = ch06.SolutionFlashAttention.backward(ctx, do)
        return (dq, dk, 1.001 * dv, *rest)


class NaiveInside(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, bm, bn):
        ctx.save_for_backward(q, k, v)
        ctx.causal = causal
        return flashtut.naive_attention(q, k, v, causal=causal)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():                      # backward runs with grad mode off
            grads = ch06.autograd_grads(q, k, v, do, causal=ctx.causal)
        return (*grads, None, None, None)


def test_function_checker_accepts_the_solution():
    res = ch06.check_flash_function(ch06.SolutionFlashAttention)
    assert res, res.message
    assert res.message.count("gradcheck") == 2


@pytest.mark.parametrize("wrong,phrase", [(SavesP, "saved a tensor of shape"),
                                          (WrongDv, "input 2 (v)"),
                                          (NaiveInside, "Nq x Nk"),
                                          (ch06.solution_flash_backward, "subclass of torch.autograd.Function")])
def test_function_checker_rejects_wrong_answers(wrong, phrase):
    res = ch06.check_flash_function(wrong)
    assert not res
    assert phrase in _flat(res.message), res.message


# ------------------------------------------------------------------------------ the watcher itself

def test_watch_sees_reads_sizes_rows_and_writes():
    q, k = torch.randn(1, 2, 40, 4), torch.randn(1, 2, 30, 4)
    qg, kg = q.clone(), k.clone()

    def run():
        a = qg[:, :, :8] @ kg[:, :, 10:20].transpose(-2, -1)   # rows 0..7 with keys 10..19
        b = qg @ kg.transpose(-2, -1)                          # everything at once
        kg[:, :, :1].zero_()
        return a, b

    _, tr = technique.watch(run, dict(q=qg, k=kg), block_rows={"q": 8, "k": 10}, causal=True,
                            pair_rows=(8, 10), blocks=(8, 10))
    assert tr.reads["q"] == [64, 320] and tr.reads["k"][:2] == [80, 240]
    assert [r[0] for r in tr.whole_reads] == ["q", "k"]
    assert {side for side, *_ in tr.wide_scores} == {"q", "k"}
    assert tr.largest[0] == 2 * 40 * 30
    assert tr.masked_products[0][1:] == ((0, 7), (10, 19)) and len(tr.masked_products) == 1
    assert tr.hidden[0, 10] and tr.hidden[39 - 30, 29] is not None and not tr.hidden[20, 5]
    assert tr.input_writes == [("k", "zero_")]
    assert technique.mutated("qk", (qg, kg), (q, k)) == ["k"]


def test_wrap_keeps_lines_short_and_indented():
    text = technique.wrap("  " + "word " * 40)
    assert all(len(line) <= 90 and line.startswith("  ") for line in text.splitlines())

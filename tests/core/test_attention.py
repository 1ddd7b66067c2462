"""naive_attention, tiled_attention and tiled_attention_backward against float64 references."""
import math

import pytest
import torch
import torch.nn.functional as F

import flashtut as ft


def rand_qkv(gen, B, H, Nq, Nk, D, dtype=torch.float64, scale=1.0):
    q = torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64) * scale
    k = torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64) * scale
    v = torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def ref_attention(q, k, v, causal, scale):
    """Independent float64 reference: explicit formula, no flashtut code."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


CASES = [  # B, H, Nq, Nk, D, block_m, block_n
    (1, 1, 1, 1, 8, 64, 64),
    (2, 3, 37, 53, 24, 16, 32),
    (1, 2, 100, 61, 64, 64, 64),
    (2, 1, 61, 100, 16, 32, 16),
    (1, 2, 130, 130, 128, 64, 64),
    (1, 1, 77, 77, 40, 7, 13),
    (1, 1, 5, 300, 32, 64, 64),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.37])
def test_naive_and_tiled_match_reference(case, causal, scale, gen):
    B, H, Nq, Nk, D, bm, bn = case
    q, k, v = rand_qkv(gen, B, H, Nq, Nk, D, scale=2.0)
    o_ref, lse_ref = ref_attention(q, k, v, causal, scale)
    torch.testing.assert_close(ft.naive_attention(q, k, v, causal=causal, scale=scale), o_ref)
    o, lse = ft.tiled_attention(q, k, v, causal=causal, scale=scale, block_m=bm, block_n=bn, return_lse=True)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(lse, lse_ref)
    assert lse.dtype == torch.float64 and lse.shape == (B, H, Nq)
    torch.testing.assert_close(ft.attention_lse(q, k, causal=causal, scale=scale), lse_ref)
    assert torch.equal(ft.tiled_attention(q, k, v, causal=causal, scale=scale, block_m=bm, block_n=bn), o)


@pytest.mark.parametrize("causal", [False, True])
def test_causal_alignment_matches_sdpa(causal, gen):
    # top-left alignment, as scaled_dot_product_attention(is_causal=True), also for Nq != Nk
    for Nq, Nk in ((19, 45), (45, 19)):
        q, k, v = rand_qkv(gen, 1, 2, Nq, Nk, 16)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(ft.naive_attention(q, k, v, causal=causal), want)
        torch.testing.assert_close(ft.tiled_attention(q, k, v, causal=causal, block_m=8, block_n=8), want)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision(dtype, tol, causal, gen):
    q, k, v = rand_qkv(gen, 2, 2, 83, 71, 32, dtype=dtype)
    o_ref, lse_ref = ref_attention(q, k, v, causal, None)
    for fn in (ft.naive_attention, lambda *a, **kw: ft.tiled_attention(*a, block_m=32, block_n=16, **kw)):
        o = fn(q, k, v, causal=causal)
        assert o.dtype == dtype and o.shape == q.shape
        torch.testing.assert_close(o.double(), o_ref, rtol=0, atol=tol)
    _, lse = ft.tiled_attention(q, k, v, causal=causal, return_lse=True)
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), lse_ref, rtol=0, atol=1e-4)


def test_maximum_arrives_in_a_late_block(gen):
    # large logits whose row maximum sits in the last key block: exercises the rescaling
    q, k, v = rand_qkv(gen, 1, 2, 50, 300, 16)
    k[:, :, -3:] = q[:, :, :1] * 60          # late keys whose scores (~240) overflow exp in fp32
    o_ref, lse_ref = ref_attention(q, k, v, False, None)
    o, lse = ft.tiled_attention(q, k, v, block_m=16, block_n=32, return_lse=True)
    assert lse_ref.max() > 150
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(lse, lse_ref)
    o32 = ft.tiled_attention(q.float(), k.float(), v.float(), block_m=16, block_n=32)
    assert torch.isfinite(o32).all()
    torch.testing.assert_close(o32.double(), o_ref, atol=1e-4, rtol=0)


def test_half_inputs_with_large_scores_stay_finite(gen):
    q, k, v = rand_qkv(gen, 1, 1, 40, 70, 64, dtype=torch.float16, scale=6.0)  # scores ~ 1e3
    for fn in (ft.naive_attention, ft.tiled_attention):
        assert torch.isfinite(fn(q, k, v)).all()


@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_autograd(case, causal, gen):
    B, H, Nq, Nk, D, bm, bn = case
    q, k, v = rand_qkv(gen, B, H, Nq, Nk, D, scale=1.5)
    scale = 0.29
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    o_ref, _ = ref_attention(qr, kr, vr, causal, scale)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    o_ref.backward(do)
    o, lse = ft.tiled_attention(q, k, v, causal=causal, scale=scale, block_m=bm, block_n=bn, return_lse=True)
    dq, dk, dv = ft.tiled_attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale,
                                             block_m=bn, block_n=bm)  # other blocking than the forward
    torch.testing.assert_close(dq, qr.grad)
    torch.testing.assert_close(dk, kr.grad)
    torch.testing.assert_close(dv, vr.grad)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2), (torch.bfloat16, 1e-1)])
def test_backward_low_precision(dtype, tol, gen):
    q, k, v = rand_qkv(gen, 1, 2, 45, 67, 32)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    o_ref, _ = ref_attention(qr, kr, vr, True, None)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    o_ref.backward(do)
    ql, kl, vl, dol = (t.to(dtype) for t in (q, k, v, do))
    o, lse = ft.tiled_attention(ql, kl, vl, causal=True, return_lse=True)
    grads = ft.tiled_attention_backward(ql, kl, vl, o, lse, dol, causal=True, block_m=16, block_n=32)
    for g, want in zip(grads, (qr.grad, kr.grad, vr.grad)):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), want, rtol=0, atol=tol)


def test_no_nan_for_finite_inputs_anywhere(gen):
    q, k, v = rand_qkv(gen, 1, 1, 33, 9, 8)
    for causal in (False, True):
        o, lse = ft.tiled_attention(q, k, v, causal=causal, block_m=4, block_n=4, return_lse=True)
        do = torch.randn_like(o)
        for t in (o, lse, *ft.tiled_attention_backward(q, k, v, o, lse, do, causal=causal, block_m=4, block_n=4)):
            assert torch.isfinite(t).all()

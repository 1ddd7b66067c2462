"""The softmax family against float64 references on random inputs."""
import math

import pytest
import torch

import flashtut as ft

SHAPES = [(1,), (7,), (3, 33), (2, 5, 129), (4, 1000)]


def ref_softmax(x):
    return torch.softmax(x.double(), dim=-1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fn", [ft.safe_softmax, ft.online_softmax])
def test_matches_float64(shape, fn, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 5
    torch.testing.assert_close(fn(x), ref_softmax(x), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("block_size", [None, 1, 3, 7, 64, 5000])
def test_online_any_block_size(block_size, gen):
    x = torch.randn(6, 259, generator=gen) * 30
    torch.testing.assert_close(ft.online_softmax(x, block_size), ref_softmax(x).float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ft.online_softmax(x, block_size), ft.safe_softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3), (torch.float32, 1e-6)])
def test_low_precision_dtypes(dtype, atol, gen):
    x = (torch.randn(5, 77, generator=gen) * 8).to(dtype)
    for fn in (ft.safe_softmax, lambda t: ft.online_softmax(t, 16)):
        y = fn(x)
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), ref_softmax(x), rtol=0, atol=atol)


def test_late_maximum_is_rescaled(gen):
    # the row maximum arrives in the last block: the running sum must be rescaled, not kept
    x = torch.randn(4, 200, generator=gen, dtype=torch.float64)
    x[:, -1] = 500.0
    torch.testing.assert_close(ft.online_softmax(x, 16), ref_softmax(x))


def test_large_logits_stay_finite(gen):
    x = torch.randn(3, 50, generator=gen) * 1e4
    for fn in (ft.safe_softmax, ft.online_softmax):
        y = fn(x)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y.sum(-1), torch.ones(3))


def test_naive_overflows_where_safe_does_not():
    threshold = math.log(torch.finfo(torch.float16).max)  # about 11.09
    assert 11.08 < threshold < 11.1
    x = torch.tensor([[threshold + 0.01, 0.0]], dtype=torch.float16)
    assert torch.isnan(ft.naive_softmax(x)).any()
    assert torch.isfinite(ft.safe_softmax(x)).all()
    small = torch.tensor([[threshold - 0.5, 0.0]], dtype=torch.float16)
    torch.testing.assert_close(ft.naive_softmax(small).double(), ref_softmax(small), atol=1e-3, rtol=0)


def test_naive_matches_on_small_inputs(gen):
    x = torch.randn(3, 41, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(ft.naive_softmax(x), ref_softmax(x))


def test_masked_entries(gen):
    x = torch.randn(3, 40, generator=gen, dtype=torch.float64)
    x[:, :17] = float("-inf")  # whole first blocks masked, as causal attention produces
    for bs in (None, 5, 16):
        y = ft.online_softmax(x, bs)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, ref_softmax(x))


def test_merge_is_associative_and_commutative(gen):
    x = torch.randn(4, 90, generator=gen, dtype=torch.float64) * 10
    parts = [x[:, :13], x[:, 13:50], x[:, 50:]]
    states = [(p.amax(-1), torch.exp(p - p.amax(-1, keepdim=True)).sum(-1)) for p in parts]
    (ma, da), (mb, db), (mc, dc) = states
    left = ft.merge_softmax_states(*ft.merge_softmax_states(ma, da, mb, db), mc, dc)
    right = ft.merge_softmax_states(ma, da, *ft.merge_softmax_states(mb, db, mc, dc))
    swapped = ft.merge_softmax_states(mc, dc, *ft.merge_softmax_states(mb, db, ma, da))
    want_m = x.amax(-1)
    want_d = torch.exp(x - want_m[:, None]).sum(-1)
    for m, d in (left, right, swapped):
        torch.testing.assert_close(m, want_m)
        torch.testing.assert_close(d, want_d)
    empty = (torch.full_like(ma, float("-inf")), torch.zeros_like(da))
    m, d = ft.merge_softmax_states(*empty, ma, da)
    torch.testing.assert_close(m, ma)
    torch.testing.assert_close(d, da)


@pytest.mark.parametrize("fn", [ft.naive_softmax, ft.safe_softmax, ft.online_softmax])
def test_errors(fn):
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fn([1.0, 2.0])
    with pytest.raises(ValueError, match="x has dtype int64"):
        fn(torch.arange(4))
    with pytest.raises(ValueError, match="at least one element"):
        fn(torch.empty(3, 0))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_online_block_size_errors(bad):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        ft.online_softmax(torch.randn(2, 5), bad)

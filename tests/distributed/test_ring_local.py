"""The ring's steps run in one process (every rank in turn, no network) against single-process
attention: float64, odd lengths, causal and not, grouped-query heads, forward and backward."""
from __future__ import annotations

import pytest
import torch

import flashtut
from flashtut.distributed import ring, ring_backward_local, ring_forward_local


def _inputs(n, heads=4, kv_heads=2, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, kv_heads, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, n, d, generator=g, dtype=torch.float64)
    do = torch.randn(2, heads, n, d, generator=g, dtype=torch.float64)
    return q, k, v, do


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_local_ring_matches_one_process(world, causal):
    n = 10 * world + 3                        # chunks of unequal, odd lengths
    q, k, v, do = _inputs(n)
    o, lse = ring_forward_local(q, k, v, world, causal, scale=0.3)
    ref, ref_lse = flashtut.tiled_attention(q, k, v, causal=causal, scale=0.3, return_lse=True, block_m=8,
                                            block_n=8)
    torch.testing.assert_close(o, flashtut.naive_attention(q, k, v, causal=causal, scale=0.3), rtol=0, atol=1e-12)
    torch.testing.assert_close(o, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-12)
    grads = ring_backward_local(q, k, v, o, lse, do, world, causal, scale=0.3)
    qa, ka, va = (x.clone().requires_grad_() for x in (q, k, v))
    flashtut.naive_attention(qa, ka, va, causal=causal, scale=0.3).backward(do)
    for got, want in zip(grads, (qa.grad, ka.grad, va.grad)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_a_ring_that_forgets_to_rescale_fails(monkeypatch):
    # the test can fail: a merge that adds the partial outputs without their weights is caught
    def wrong_merge(o_a, lse_a, o_b, lse_b):
        return o_a + o_b, torch.logaddexp(lse_a, lse_b)
    monkeypatch.setattr(ring, "merge_attention_states", wrong_merge)
    q, k, v, _ = _inputs(23)
    o, _ = ring_forward_local(q, k, v, 2, True)
    assert (o - flashtut.naive_attention(q, k, v, causal=True)).abs().max() > 1e-3


def test_local_ring_checks_its_inputs():
    q, k, v, _ = _inputs(20)
    with pytest.raises(ValueError, match="world"):
        ring_forward_local(q, k, v, 0)
    with pytest.raises(ValueError, match="rows"):
        ring_forward_local(q, k, v, 11, causal=True)
    with pytest.raises(ValueError, match="backend"):
        ring_forward_local(q, k, v, 2, backend="cudnn")

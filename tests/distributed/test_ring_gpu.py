"""Ring attention on one GPU: every rank's steps with the Triton kernel (local), and the autograd path
over a one-rank NCCL group, against the unsharded kernel and a float32 reference."""
from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest
import torch

import flashtut
from flashtut.distributed import ring_attention, ring_backward_local, ring_forward_local

pytestmark = pytest.mark.gpu


def _inputs(n, h, hkv, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(2, hh, n, d, device="cuda", dtype=dtype, generator=g) for hh in (h, hkv, hkv, h)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_local_ring_with_triton_meets_the_yardstick(dtype, causal, world):
    q, k, v, do = _inputs(1000 + world, 8, 2, 64, dtype)
    o, lse = ring_forward_local(q, k, v, world, causal, backend="triton")
    ref = flashtut.naive_attention(*(x.double() for x in (q, k, v)), causal=causal)
    # the yardstick: at most twice the error of attention computed in the input precision
    low = flashtut.naive_attention(q, k, v, causal=causal)
    assert (o.double() - ref).abs().max() <= 2 * (low.double() - ref).abs().max() + 1e-3
    dq, dk, dv = ring_backward_local(q, k, v, o, lse, do, world, causal, backend="triton")
    qa, ka, va = (x.double().requires_grad_() for x in (q, k, v))
    flashtut.naive_attention(qa, ka, va, causal=causal).backward(do.double())
    for got, want in zip((dq, dk, dv), (qa.grad, ka.grad, va.grad)):
        assert (got.double() - want).abs().max() <= 0.02 * want.abs().max()


def test_ring_attention_over_a_one_rank_nccl_group():
    import torch.distributed as dist

    folder = tempfile.mkdtemp()
    dist.init_process_group("nccl", init_method=f"file://{os.path.join(folder, 'store')}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    try:
        q, k, v, do = _inputs(777, 4, 4, 128, torch.float16)
        qa, ka, va = (x.clone().requires_grad_() for x in (q, k, v))
        o = ring_attention(qa, ka, va, causal=True)
        o.backward(do)
        qb, kb, vb = (x.clone().requires_grad_() for x in (q, k, v))
        ref = flashtut.triton_attention(qb, kb, vb, causal=True)
        ref.backward(do)
        torch.testing.assert_close(o, ref, atol=2e-3, rtol=0)
        for a, b in ((qa, qb), (ka, kb), (va, vb)):
            torch.testing.assert_close(a.grad, b.grad, atol=2e-2, rtol=0)
    finally:
        dist.destroy_process_group()

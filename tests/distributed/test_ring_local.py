"""The ring's steps run in one process (every rank in turn, no network) against single-process
attention: float64, odd lengths, causal and not, grouped-query heads, forward and backward."""
from __future__ import annotations

import pytest
import torch

import flashtut
from flashtut import checks
from flashtut.distributed import kernels, ring, ring_backward_local, ring_forward_local


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
    def wrong_merge(o, lse, o_p, lse_p, backend):
        o.add_(o_p)
        lse.copy_(torch.logaddexp(lse, lse_p))
    monkeypatch.setattr(ring, "shard_merge", wrong_merge)
    q, k, v, _ = _inputs(23)
    o, _ = ring_forward_local(q, k, v, 2, True)
    assert (o - flashtut.naive_attention(q, k, v, causal=True)).abs().max() > 1e-3


@pytest.mark.parametrize("backend", ["tiled", "triton"])
@pytest.mark.parametrize("partial_dtype", [torch.float64, torch.float16])
def test_the_in_place_merge_is_merge_attention_states(partial_dtype, backend):
    # the Triton kernel takes float32 states (what the ring keeps for its dtypes); the PyTorch one any
    acc = torch.float32 if backend == "triton" else torch.float64
    partial_dtype = acc if partial_dtype == torch.float64 else partial_dtype
    g = torch.Generator().manual_seed(3)
    o = torch.randn(2, 3, 11, 24, generator=g, dtype=acc)
    lse = 4 * torch.randn(2, 3, 11, generator=g, dtype=acc)
    lse[0, 0, :3] = float("-inf")              # rows that have seen no key yet
    o[0, 0, :3] = 0
    o_p = torch.randn(2, 3, 11, 24, generator=g).to(partial_dtype)
    lse_p = 4 * torch.randn(2, 3, 11, generator=g, dtype=acc)
    want_o, want_lse = flashtut.merge_attention_states(o[:, :, 2:], lse[:, :, 2:], o_p[:, :, 2:].to(acc),
                                                       lse_p[:, :, 2:])
    kept = o[:, :, :2].clone()
    kernels.shard_merge(o[:, :, 2:], lse[:, :, 2:], o_p[:, :, 2:], lse_p[:, :, 2:], backend)   # strided views
    tol = 1e-14 if acc == torch.float64 else 2e-6
    torch.testing.assert_close(o[:, :, 2:], want_o, rtol=0, atol=tol)
    torch.testing.assert_close(lse[:, :, 2:], want_lse, rtol=0, atol=tol)
    assert torch.equal(o[:, :, :2], kept)      # rows outside the views untouched


def _count_guards(monkeypatch):
    """Count the ring's guard reads; fail if a step's kernel call runs a guard of its own."""
    from flashtut import tiled
    from flashtut.triton import attention as tri

    reads = []

    def counted(*args, **kwargs):
        reads.append(args[4] if len(args) > 4 else kwargs.get("what"))
        return checks.raise_if_flagged(*args, **kwargs)

    def per_call(*args, **kwargs):
        raise AssertionError("a step's kernel call ran the overflow guard")
    monkeypatch.setattr(ring, "raise_if_flagged", counted)
    for module in (tiled, tri):
        monkeypatch.setattr(module, "raise_if_overflowed", per_call)
        monkeypatch.setattr(module, "raise_if_flagged", per_call)
    return reads


@pytest.mark.parametrize("backend", ["tiled", "triton"])
def test_the_guard_runs_once_per_pass_and_still_raises(monkeypatch, backend):
    n, world = 29, 3
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, n, 16, generator=g) for _ in range(4))   # float32: the guard runs
    big_q, big_k = q.clone(), k.clone()
    big_q[0, 1, 20], big_k[0, 1, 3] = 1e20, 1e20    # one score, 4e40, overflows float32
    with pytest.raises(ValueError, match="overflow float32"):       # as one call does
        flashtut.tiled_attention(big_q, big_k, v, causal=True)
    reads = _count_guards(monkeypatch)
    o, lse = ring_forward_local(q, k, v, world, True, backend=backend)
    grads = ring_backward_local(q, k, v, o, lse, do, world, True, backend=backend)
    assert reads == ["output", "gradients"]          # one guard per pass, not one per pair of shards
    qa, ka, va = (x.double().requires_grad_() for x in (q, k, v))
    ref = flashtut.naive_attention(qa, ka, va, causal=True)
    ref.backward(do.double())
    for got, want in zip((o, *grads), (ref, qa.grad, ka.grad, va.grad)):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)

    reads.clear()
    with pytest.raises(ValueError, match="overflow float32"):
        ring_forward_local(big_q, big_k, v, world, True, backend=backend)
    assert reads == ["output"]
    reads.clear()
    with pytest.raises(ValueError, match="overflow float32.* gradients would be"):
        ring_backward_local(q, k, v, o, lse, do / do.abs().max() * 3e38, world, True, backend=backend)
    assert reads == ["gradients"]


def test_float16_pays_no_guard(monkeypatch):
    reads = _count_guards(monkeypatch)
    q, k, v, do = (x.half() for x in _inputs(19))
    o, lse = ring_forward_local(q, k, v, 2, False, backend="tiled")
    ring_backward_local(q, k, v, o, lse, do, 2, False, backend="tiled")
    assert reads == []


def test_local_ring_checks_its_inputs():
    q, k, v, _ = _inputs(20)
    with pytest.raises(ValueError, match="world"):
        ring_forward_local(q, k, v, 0)
    with pytest.raises(ValueError, match="rows"):
        ring_forward_local(q, k, v, 11, causal=True)
    with pytest.raises(ValueError, match="backend"):
        ring_forward_local(q, k, v, 2, backend="cudnn")


def test_local_steps_check_the_shards_once():
    from flashtut.distributed import local_backward, local_forward, shard
    q, k, v, do = _inputs(21)                 # zigzag: 11 and 10 rows; contiguous: 10 and 11
    cut = [[shard(x, r, 2, True) for r in range(2)] for x in (q, k, v, do)]
    with pytest.raises(ValueError, match="rank 1's shards do not match"):
        local_forward(cut[0], [cut[1][0], cut[1][1][:, :, 1:]], [cut[2][0], cut[2][1][:, :, 1:]], causal=True)
    with pytest.raises(ValueError, match="rank 0's shards do not match"):    # the cut of another mask
        local_forward(*([shard(x, r, 2, False) for r in range(2)] for x in (q, k, v)), causal=True)
    with pytest.raises(ValueError, match="rank 1's shards do not match"):
        local_forward(*([c[0], c[1].float()] for c in cut[:3]), causal=True)
    with pytest.raises(ValueError, match="lists of every rank's shards"):
        local_forward(cut[0], cut[1][:1], cut[2], causal=True)
    with pytest.raises(ValueError, match="Triton kernels accept"):          # the backend's own check
        local_forward(*cut[:3], causal=True, backend="triton")
    states = local_forward(*cut[:3], causal=True)
    with pytest.raises(ValueError, match="do must have the shape"):
        local_backward(*cut[:3], [s[0] for s in states], [s[1] for s in states], cut[3][::-1], causal=True)
    with pytest.raises(ValueError, match="lse must have shape"):
        local_backward(*cut[:3], [s[0] for s in states], [s[0] for s in states], cut[3], causal=True)

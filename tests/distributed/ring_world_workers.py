"""What each rank runs in the tests of tests/distributed/test_ring_world.py (a module of its own: the
ranks are other processes, which import these functions by name)."""
from __future__ import annotations

import time

import torch

import flashtut
from flashtut.distributed import ring, ring_attention, shard

#: (causal, q heads, k/v heads, head dim, scale) of every case each world runs
CASES = [(False, 4, 2, 12, None), (True, 4, 2, 12, None), (True, 3, 3, 7, 0.7), ("bottom-right", 2, 1, 16, None),
         (False, 3, 1, 5, 1.3)]


def inputs(n, h, hkv, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, h, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, hkv, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, n, d, generator=g, dtype=torch.float64)
    do = torch.randn(2, h, n, d, generator=g, dtype=torch.float64)
    return q, k, v, do


def check_against_one_process(rank, world):
    """Max error of this rank's output and gradients against naive and tiled attention of the whole
    sequence, one entry per case."""
    out = []
    for i, (causal, h, hkv, d, scale) in enumerate(CASES):
        n = 2 * world * 3 + 2 * i + 1                  # odd, and chunks of unequal lengths
        q, k, v, do = inputs(n, h, hkv, d, seed=i)
        mine = [shard(x, rank, world, causal).requires_grad_() for x in (q, k, v)]
        o = ring_attention(*mine, causal=causal, scale=scale)
        o.backward(shard(do, rank, world, causal))
        full = [x.clone().requires_grad_() for x in (q, k, v)]
        naive = flashtut.naive_attention(*full, causal=causal, scale=scale)
        naive.backward(do)
        tiled = flashtut.tiled_attention(q, k, v, causal=causal, scale=scale, block_m=4, block_n=8)
        err = {"o_naive": (o - shard(naive, rank, world, causal)).abs().max().item(),
               "o_tiled": (o - shard(tiled, rank, world, causal)).abs().max().item()}
        for name, a, b in zip(("dq", "dk", "dv"), mine, full):
            err[name] = (a.grad - shard(b.grad, rank, world, causal)).abs().max().item()
        out.append(err)
    return out


def _outcome(fn):
    t0 = time.monotonic()
    try:
        fn()
        return ("ok", "", time.monotonic() - t0)
    except Exception as exc:   # what each rank saw, for the test to read
        return (type(exc).__name__, str(exc), time.monotonic() - t0)


def failures(rank, world):
    """Bad inputs on one rank, ranks that disagree, then a rank whose kernel raises mid-ring (world 3)."""
    q, k, v, _ = inputs(24, 2, 2, 8, seed=0)
    qs, ks, vs = (shard(x, rank, world, True) for x in (q, k, v))
    seen = {}
    seen["bad_dtype_on_rank_1"] = _outcome(
        lambda: ring_attention(qs.float() if rank == 1 else qs, ks, vs, causal=True))
    seen["scale_differs"] = _outcome(
        lambda: ring_attention(qs, ks, vs, causal=True, scale=0.5 if rank == 2 else 0.25))
    odd = inputs(25, 2, 2, 8, seed=0)[:3]   # contiguous shards where zigzag was asked for: 8, 8, 9 rows, not 9, 8, 8
    seen["wrong_cut"] = _outcome(lambda: ring_attention(*(shard(x, rank, world, False) for x in odd), causal=True))
    seen["fine_after_all_that"] = _outcome(lambda: ring_attention(qs, ks, vs, causal=True))
    if rank == 1:                          # this rank's kernel fails at its first step, after posting its first send
        def failing(*args):
            raise ZeroDivisionError("rank 1 fails on purpose")
        ring.shard_forward = failing
        ring_attention(qs, ks, vs, causal=True)
    seen["peer_failed"] = _outcome(lambda: ring_attention(qs, ks, vs, causal=True))
    return seen




def overflow(rank, world):
    """float32 passes (the overflow guard runs): fine ones, one whose rank 1 holds a query row whose
    scores overflow, one whose gradients overflow on every rank; with the guard's reads counted."""
    q, k, v, do = (x.float() for x in inputs(6 * world + 1, 2, 1, 8, seed=3))
    qs, ks, vs, dos = (shard(x, rank, world, True) for x in (q, k, v, do))
    reads = []
    guard = ring.raise_if_flagged

    def counted(*args, **kwargs):
        reads.append(args[4])
        return guard(*args, **kwargs)
    ring.raise_if_flagged = counted

    def run(q_, do_):
        reads.clear()
        mine = [x.clone().requires_grad_() for x in (q_, ks, vs)]
        outcome = _outcome(lambda: ring_attention(*mine, causal=True).backward(do_))
        return outcome[:2] + (list(reads),)

    seen = {"fine": run(qs, dos)}
    big = qs.clone()
    if rank == 1:
        big[0, 0, 0] = 3e38                  # finite, but its scores overflow float32
    seen["big_q_on_rank_1"] = run(big, dos)
    seen["huge_do"] = run(qs, dos / dos.abs().max() * 3e38)
    return seen

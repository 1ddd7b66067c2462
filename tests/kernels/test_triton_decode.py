"""Tests of the Triton decode kernel (``flashtut.decode_attention(..., backend="triton")``).

Without a GPU, conftest sets TRITON_INTERPRET=1 before triton is imported, and the CPU tests run
the kernel through Triton's interpreter at tiny sizes (float32, float16). Each sequence of a batch
is judged on its own by the book's yardstick (``flashtut.bench.accuracy.yardstick``) against naive
attention over that sequence's cache with the bottom-right alignment. The ``gpu`` tests run
realistic sizes (GQA 32/8, D = 128, float16 and bfloat16, caches of thousands of positions), the
split counts the launch chooses, and a decode step captured in a CUDA graph.
"""
from __future__ import annotations

import pytest
import torch

import flashtut
from flashtut.bench.accuracy import yardstick
from flashtut.decode import gather_cache
from flashtut.triton import decode as td

CPU = not torch.cuda.is_available()
DEV = "cpu" if CPU else "cuda"


def make_problem(gen, lengths, H, Hkv, Nq, D, page_size, dtype, device=DEV, spread=1.5):
    """Queries and a cache holding ``lengths[b]`` positions of each sequence, in a pool of pages
    scattered in random order (paged) and laid out contiguously. Drawn in float64 on the CPU."""
    B = len(lengths)
    need = [-(-n // page_size) for n in lengths]
    num_pages = sum(need) + 2
    order = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.full((B, max(need) + 1), -1, dtype=torch.int32)     # unused entries: never read
    for b in range(B):
        table[b, :need[b]] = torch.tensor(order[:need[b]], dtype=torch.int32)
        order = order[need[b]:]
    k_pool = torch.randn(num_pages, Hkv, page_size, D, generator=gen, dtype=torch.float64)
    v_pool = torch.randn(num_pages, Hkv, page_size, D, generator=gen, dtype=torch.float64)
    nmax = max(lengths) + 3
    k_dense = torch.randn(B, Hkv, nmax, D, generator=gen, dtype=torch.float64)
    v_dense = torch.randn(B, Hkv, nmax, D, generator=gen, dtype=torch.float64)
    for b, n in enumerate(lengths):
        k_dense[b, :, :n] = gather_cache(k_pool, b, n, table)
        v_dense[b, :, :n] = gather_cache(v_pool, b, n, table)
    q = spread * torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64)
    out = {"q": q, "k_pool": k_pool, "v_pool": v_pool, "k_dense": k_dense, "v_dense": v_dense}
    out = {n: t.to(device=device, dtype=dtype) for n, t in out.items()}
    out["seqlens"] = torch.tensor(lengths, dtype=torch.int32, device=device)
    out["table"] = table.to(device)
    out["lengths"] = list(lengths)
    return out


def judge(p, o, scale=None):
    """The yardstick per sequence: ``o[b]`` against naive attention over its first
    ``lengths[b]`` cached positions, bottom-right aligned. Returns the worst ratio to PyTorch in
    the input precision; fails on the first sequence outside the yardstick."""
    worst = 0.0
    for b, n in enumerate(p["lengths"]):
        k, v = p["k_dense"][b:b + 1, :, :n], p["v_dense"][b:b + 1, :, :n]
        y = yardstick(p["q"][b:b + 1], k, v, o[b:b + 1], causal="bottom-right", scale=scale)
        assert y.passed, f"sequence {b} (length {n}):\n{y}"
        worst = max(worst, y.ratio("o"))
    return worst


# ---------------------------------------------------------------- CPU: the interpreter ----

# (lengths, H, Hkv, Nq, D, page_size): one-token caches, lengths no page or split divides, a page
# exactly full next to one barely used, GQA 32/8 and multi-query, page sizes below, equal to and
# above the kernel's 64-key tile, a page size no power of two
CPU_CASES = [
    ([1, 70, 64, 3], 4, 2, 1, 32, 16),
    ([130, 1], 8, 2, 1, 16, 64),
    ([9, 33, 12], 6, 1, 4, 24, 3),
    ([40], 32, 8, 16, 16, 128),
    ([17, 16], 2, 2, 16, 8, 8),
]


@pytest.mark.skipif(not CPU, reason="interpreter tests; the GPU tests cover CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: "n{}H{}kv{}q{}d{}p{}".format(
    "-".join(map(str, c[0])), *c[1:]))
def test_interpreter_paged_and_contiguous(gen, case, dtype):
    lengths, H, Hkv, Nq, D, page = case
    p = make_problem(gen, lengths, H, Hkv, Nq, D, page, dtype)
    for splits in (1, 3):
        o = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"],
                                       num_splits=splits)
        judge(p, o)
        o_dense = td.triton_decode_attention(p["q"], p["k_dense"], p["v_dense"], p["seqlens"],
                                             num_splits=splits, scale=0.2)
        judge(p, o_dense, scale=0.2)
    assert o.shape == p["q"].shape and o.dtype == dtype


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_interpreter_lse_and_many_splits(gen):
    # more splits than tiles: the empty splits must merge as the neutral state, not NaN
    p = make_problem(gen, [70, 5], 4, 2, 2, 16, 16, torch.float32)
    o, lse = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"],
                                        num_splits=6, return_lse=True)
    for b, n in enumerate(p["lengths"]):
        q64, k64 = p["q"][b:b + 1].double(), p["k_dense"][b:b + 1, :, :n].double()
        want = flashtut.attention_lse(q64, k64, causal="bottom-right")
        torch.testing.assert_close(lse[b:b + 1].double(), want, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(o).all()
    judge(p, o)


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_the_judge_rejects_a_kernel_that_reads_the_wrong_pages(gen):
    # the checker must be able to fail: swap two pages of the table and the output must fall
    # outside the yardstick
    p = make_problem(gen, [40, 30], 4, 2, 1, 16, 16, torch.float32)
    table = p["table"].clone()
    table[0, 0], table[1, 1] = p["table"][1, 1], p["table"][0, 0]
    o = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], table, num_splits=2)
    with pytest.raises(AssertionError, match="sequence 0"):
        judge(p, o)


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_interpreter_refuses_what_the_kernel_does_not_take(gen):
    p = make_problem(gen, [5], 2, 1, 1, 8, 4, torch.float64)
    with pytest.raises(ValueError, match="reference"):
        flashtut.decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"])
    big = torch.randn(1, 1, 1, 256, dtype=torch.float32)
    with pytest.raises(ValueError, match="head dim"):
        flashtut.decode_attention(big, big, big, torch.ones(1, dtype=torch.int32))
    bf = p["q"].to(torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        flashtut.decode_attention(bf, p["k_pool"].to(torch.bfloat16), p["v_pool"].to(torch.bfloat16),
                                  p["seqlens"], p["table"])
    with pytest.raises(ValueError, match="num_splits"):
        td.triton_decode_attention(p["q"].float(), p["k_pool"].float(), p["v_pool"].float(), p["seqlens"],
                                   p["table"], num_splits=0)


# the launch's variants (``DecodeTuning``): the merge fused into the split kernel, the table read one
# tile ahead, tiles of other widths
FUSED = td.DecodeTuning(fused_merge=True, page_ahead=True)
VARIANTS = [FUSED, td.DecodeTuning(page_ahead=True), td.DecodeTuning(block_n=16, fused_merge=True),
            td.DecodeTuning(block_n=128, fused_merge=True, page_ahead=True)]


def exact_table(p, page):
    """``p``'s table cut to the pages its longest sequence needs: that sequence's last entry
    ends its row, so a read one tile ahead must not go past it."""
    return p["table"][:, :max(-(-n // page) for n in p["lengths"])].contiguous()


VARIANT_CASES = {
    # ragged lengths with one-token caches; full pages next to pages holding one position; a
    # tile in one page (64 % 16) and a tile over several (16 < 64); multi-query, 4 new queries
    "p16": ([1, 70, 64, 3, 48], 8, 2, 1, 16, 16),
    "p64": ([130, 1, 64], 8, 2, 1, 16, 64),
    "p3-mq": ([9, 33, 12], 6, 1, 4, 24, 3),
}


def _tuning_id(t) -> str:
    return "bn{}{}{}".format(t.block_n, "-fused" if t.fused_merge else "", "-ahead" if t.page_ahead else "")


@pytest.mark.skipif(not CPU, reason="interpreter test")
@pytest.mark.parametrize("case, tuning", [
    # make test: every variant on the first case, the likeliest to ship (FUSED) on all; the rest of the
    # grid (candidates the sweep has not chosen yet) in make test-all
    pytest.param(case, t, id=f"{name}-{_tuning_id(t)}",
                 marks=() if name == "p16" or t == FUSED else pytest.mark.slow)
    for name, case in VARIANT_CASES.items() for t in VARIANTS])
def test_interpreter_variants_equal_the_shipped_launch(gen, case, tuning):
    # every variant gives the shipped launch's answer (the fused merge is the merge kernel's code
    # in another place: to rounding) and passes the yardstick, paged and contiguous, with more
    # splits than a short sequence has tiles
    lengths, H, Hkv, Nq, D, page = case
    p = make_problem(gen, lengths, H, Hkv, Nq, D, page, torch.float32)
    table = exact_table(p, page)
    for splits in (1, 2, 5):
        want, want_lse = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], table,
                                                    num_splits=splits, return_lse=True)
        got, lse = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], table,
                                              num_splits=splits, return_lse=True, tuning=tuning)
        judge(p, got)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-6)
        dense = td.triton_decode_attention(p["q"], p["k_dense"], p["v_dense"], p["seqlens"], num_splits=splits,
                                           tuning=tuning)
        judge(p, dense)


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_interpreter_fused_merge_is_the_merge_kernel_and_leaves_its_counters_at_zero(gen):
    # float16, ragged lengths (a one-token cache, a sequence of whole pages): the fused merge runs
    # the merge kernel's code, so its answer is the two-launch answer bit for bit; each call
    # leaves every ticket counter at zero, so a second call (and a call of another shape) gives
    # the same answer
    p = make_problem(gen, [1, 64, 100, 17], 8, 2, 1, 16, 16, torch.float16)
    table = exact_table(p, 16)
    args = (p["q"], p["k_pool"], p["v_pool"], p["seqlens"], table)
    two = td.triton_decode_attention(*args, num_splits=4, return_lse=True,
                                     tuning=td.DecodeTuning(page_ahead=True))
    first = td.triton_decode_attention(*args, num_splits=4, return_lse=True, tuning=FUSED)
    counters = td._merge_counters(torch.device("cpu"), 1)
    assert not counters.any(), counters[:16]
    other = make_problem(gen, [5, 80], 4, 2, 1, 8, 16, torch.float16)
    judge(other, td.triton_decode_attention(other["q"], other["k_pool"], other["v_pool"], other["seqlens"],
                                            other["table"], num_splits=3, tuning=FUSED))
    second = td.triton_decode_attention(*args, num_splits=4, return_lse=True, tuning=FUSED)
    assert not counters.any()
    for got in (first, second):
        assert torch.equal(got[0], two[0]) and torch.equal(got[1], two[1])
    judge(p, first[0])


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_interpreter_a_stuck_counter_is_caught(gen):
    # the checker can fail: counters left S tickets ahead give no program the last ticket, so
    # nothing merges, the output keeps its zeros and leaves the yardstick
    p = make_problem(gen, [90, 70], 8, 2, 1, 16, 16, torch.float32)
    counters = td._merge_counters(torch.device("cpu"), 1)
    counters[:4] = 3
    out = torch.zeros_like(p["q"])
    try:
        td.decode_launch(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"], 0.25, 3, out=out,
                         tuning=FUSED)
    finally:
        counters.zero_()
    with pytest.raises(AssertionError, match="sequence 0"):
        judge(p, out)


def test_decode_tuning_refuses_what_the_kernel_does_not_take():
    for bad, match in ((dict(block_n=48), "block_n"), (dict(block_n=8), "block_n"), (dict(num_warps=3), "num_warps"),
                       (dict(num_stages=0), "num_stages"), (dict(num_warps=True), "num_warps")):
        with pytest.raises(ValueError, match=match):
            td.DecodeTuning(**bad)
    q = torch.zeros(1, 1, 1, 8)
    with pytest.raises(TypeError, match="tuning"):
        td.triton_decode_attention(q, q, q, torch.ones(1, dtype=torch.int32), tuning={"block_n": 64})


# ---------------------------------------------------------------- GPU ----

GPU_CASES = [
    # lengths, H, Hkv, Nq, page_size
    ([1, 4097, 64, 1000, 31], 32, 8, 1, 16),
    ([3000, 17, 4, 2048], 32, 8, 4, 64),       # a sequence exactly Nq long
    ([5000], 32, 8, 16, 256),
    ([700, 2, 129], 16, 1, 2, 128),
    ([333, 90], 8, 8, 3, 32),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "B{}H{}kv{}q{}p{}".format(len(c[0]), *c[1:]))
def test_gpu_decode_paged_and_contiguous(gen, case, dtype):
    lengths, H, Hkv, Nq, page = case
    p = make_problem(gen, lengths, H, Hkv, Nq, 128, page, dtype)
    outs = [flashtut.decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"]),
            flashtut.decode_attention(p["q"], p["k_dense"], p["v_dense"], p["seqlens"])]
    outs += [td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"],
                                        num_splits=s) for s in (1, 7, 64)]
    for o in outs:
        worst = judge(p, o)
        print(f"\n[accuracy] {dtype} {case}: worst {worst:.2f}x PyTorch")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 80, 128])
def test_gpu_head_dims(gen, D):
    p = make_problem(gen, [1500, 3], 8, 2, 1, D, 64, torch.float16)
    judge(p, flashtut.decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"]))


@pytest.mark.gpu
def test_gpu_decode_step_replays_in_a_cuda_graph(gen):
    # the launch takes no host sync, so a CUDA graph captures it once and replays it as the
    # lengths grow (the split bounds are read from cache_seqlens on the device)
    p = make_problem(gen, [600, 2000, 1], 32, 8, 1, 128, 64, torch.bfloat16)
    seqlens = p["seqlens"].clone()
    shorter = torch.tensor([300, 1000, 1], dtype=torch.int32, device="cuda")
    seqlens.copy_(shorter)
    out = torch.empty_like(p["q"])
    scale = 128 ** -0.5
    splits = td.choose_num_splits(3, 8, 2000, "cuda")
    args = (p["q"], p["k_pool"], p["v_pool"], seqlens, p["table"], scale, splits)
    td.decode_launch(*args, out=out)          # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        td.decode_launch(*args, out=out)
    for lengths in ([300, 1000, 1], [600, 2000, 1], [451, 1999, 1]):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        judge({**p, "lengths": lengths}, out)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_public_decode_attention_is_captured_in_a_cuda_graph(gen, dtype):
    # the public call checks the lengths and the table on eager calls only: under capture it
    # reads nothing back (bfloat16's overflow guard included), so the benchmark's graphs hold it
    p = make_problem(gen, [600, 2000, 4], 32, 8, 4, 128, 64, dtype)
    seqlens = p["seqlens"].clone()
    call = lambda: flashtut.decode_attention(p["q"], p["k_pool"], p["v_pool"], seqlens, p["table"])
    call()                                     # eager: checked and compiled
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for lengths in ([600, 2000, 4], [301, 1999, 4]):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        judge({**p, "lengths": lengths}, out)
    with pytest.raises(ValueError, match="cache_seqlens"):      # eager calls still check
        flashtut.decode_attention(p["q"], p["k_pool"], p["v_pool"], seqlens - 2, p["table"])


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", VARIANTS, ids=lambda t: "bn{}{}{}".format(
    t.block_n, "-fused" if t.fused_merge else "", "-ahead" if t.page_ahead else ""))
def test_gpu_variants_equal_the_shipped_launch(gen, tuning):
    # bfloat16, GQA 32/8, D = 128, ragged lengths over pages of 16 (a tile over several pages), a table
    # that ends where the longest sequence does, the split count the launch chooses
    p = make_problem(gen, [1, 4097, 64, 1000, 31], 32, 8, 1, 128, 16, torch.bfloat16)
    table = exact_table(p, 16)
    splits = td.choose_num_splits(5, 8, 4097, "cuda")
    want = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], table, num_splits=splits)
    got = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], table, num_splits=splits,
                                     tuning=tuning)
    judge(p, got)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    judge(p, td.triton_decode_attention(p["q"], p["k_dense"], p["v_dense"], p["seqlens"], num_splits=splits,
                                        tuning=tuning))


@pytest.mark.gpu
def test_gpu_fused_merge_replays_in_a_cuda_graph(gen):
    # the counters are reset by the kernel itself: a captured step replays many times (lengths growing,
    # pages of 64, a tile in one page) and every replay gives the two-launch answer (the same code in
    # another kernel: equal to the compiler's contractions)
    p = make_problem(gen, [600, 2000, 1, 64], 32, 8, 1, 128, 64, torch.float16)
    seqlens = p["seqlens"].clone()
    out, out_two = torch.empty_like(p["q"]), torch.empty_like(p["q"])
    splits = td.choose_num_splits(4, 8, 2000, "cuda")
    args = (p["q"], p["k_pool"], p["v_pool"], seqlens, p["table"], 128 ** -0.5, splits)
    td.decode_launch(*args, out=out, tuning=FUSED)                 # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        td.decode_launch(*args, out=out, tuning=FUSED)
    for lengths in ([300, 1000, 1, 64], [600, 2000, 1, 64], [451, 1999, 1, 63]):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        for _ in range(5):
            graph.replay()
        td.decode_launch(*args, out=out_two, tuning=td.DecodeTuning(page_ahead=True))
        torch.cuda.synchronize()
        torch.testing.assert_close(out, out_two, rtol=1e-3, atol=1e-3, msg=lambda m: f"{lengths}: {m}")
        judge({**p, "lengths": lengths}, out)
    assert not td._merge_counters(out.device, 1).any()


# ---------------------------------------------------------------- generation (chapter 12) ----

from flashtut import model as m  # noqa: E402


def _prompts(gen, lengths):
    return [torch.randint(0, 256, (n,), generator=gen) for n in lengths]


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_generate_batch_matches_recomputing_every_prefix(gen):
    # mixed prompt lengths (a one-token prompt, lengths no page divides), GQA 8/2; the paged
    # cache through the kernel and the reference, and the dense cache through SDPA, choose the
    # tokens that running the whole sequence each time chooses
    gpt = m.GPT(m.GPTConfig(n_layer=2, d_model=64, n_head=8, n_kv_head=2), attention_backend="naive")
    prompts = _prompts(gen, [5, 1, 19])
    want = [m.generate(gpt, p[None], 5, use_cache=False)[0] for p in prompts]
    for kernel, layout in [("triton", "paged"), ("triton", "dense"), ("sdpa", "dense")]:
        timings = {}
        got = m.generate_batch(gpt, prompts, 5, kernel=kernel, layout=layout, page_size=4, timings=timings)
        for b, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g, w), f"{kernel}/{layout}, sequence {b}: {g.tolist()} != {w.tolist()}"
        # 5 new tokens: the prefill's, one untimed step that compiles, three timed
        assert timings["steps"] == 3 and timings["decode_s"] > 0 and timings["setup_s"] > 0


def test_decode_cache_errors():
    cfg = m.GPTConfig(n_layer=1, d_model=32, n_head=4, n_kv_head=2)
    with pytest.raises(ValueError, match="layout"):
        m.DecodeCache(cfg, 1, 8, layout="ring")
    with pytest.raises(ValueError, match="kernel"):
        m.DecodeCache(cfg, 1, 8, kernel="cuda")
    with pytest.raises(ValueError, match="layout='dense'"):
        m.DecodeCache(cfg, 1, 8, kernel="sdpa")
    with pytest.raises(ValueError, match="window"):
        m.DecodeCache(m.GPTConfig(n_layer=1, d_model=32, n_head=4, n_kv_head=2, window=4), 1, 8)
    gpt = m.GPT(cfg)
    with pytest.raises(TypeError, match="prompts"):
        m.generate_batch(gpt, "hello", 2, kernel="reference")
    with pytest.raises(ValueError, match="prompts\\[1\\]"):
        m.generate_batch(gpt, [torch.tensor([1, 2]), torch.tensor([300])], 2, kernel="reference")
    if CPU:
        with pytest.raises(ValueError, match="cuda_graph"):
            m.generate_batch(gpt, [torch.tensor([1, 2])], 2, kernel="reference", cuda_graph=True)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["paged", "dense"])
def test_gpu_generate_batch_graph_replays_the_eager_step(gen, layout):
    # bfloat16, GQA 32/8, head dim 128, mixed prompts: the captured step chooses the tokens the
    # eager step chooses, and the SDPA baseline agrees except for near ties
    cfg = m.GPTConfig(n_layer=2, d_model=4096, n_head=32, n_kv_head=8)
    gpt = m.GPT(cfg, attention_backend="sdpa").to("cuda", torch.bfloat16)
    prompts = _prompts(gen, [300, 1, 1000, 77])
    eager = m.generate_batch(gpt, prompts, 12, layout=layout, cuda_graph=False)
    graph = m.generate_batch(gpt, prompts, 12, layout=layout, cuda_graph=True)
    # the prefill and the eager warm-up step run the same code in both: their tokens are equal;
    # the replays run the same kernels (a library may pick another algorithm inside a capture,
    # which can flip a bfloat16 near tie, hence 95%)
    assert all(torch.equal(e[:-10], g[:-10]) for e, g in zip(eager, graph))
    same = sum(int((e[-12:] == g[-12:]).sum()) for e, g in zip(eager, graph))
    assert same >= 0.95 * 12 * len(prompts), same
    ref = m.generate_batch(gpt, prompts, 12, kernel="sdpa", layout="dense", cuda_graph=True)
    agree = sum(int((e[-12:] == r[-12:]).sum()) for e, r in zip(eager, ref))
    assert agree >= 0.9 * 12 * len(prompts)


# ---------------------------------------------------------------- the measurements' machinery ----

@pytest.mark.skipif(not CPU, reason="interpreter test of the machinery; the GPU runs it at size")
def test_bench_decode_rows_load_and_summarize(tmp_path):
    from flashtut.bench import results
    from flashtut.bench.decode import run_decode, summarize, summary_table

    rows = run_decode("cpu", [70], [2], [torch.float32], H=4, Hkv=2, D=16, page_sizes=(32, 8))
    path = results.save_results(tmp_path / "decode.json", "decode", rows, {"device": {"name": "cpu"}})
    loaded = results.load_results(path)["rows"]
    kernel = [r for r in loaded if r["kind"] == "decode"]
    assert [(r["layout"], r["page_size"]) for r in kernel] == [("contiguous", None), ("paged", 32), ("paged", 8)]
    assert all(r["status"] == "ok" and r["passed"] and r["gb_per_s"] > 0 for r in kernel)
    assert kernel[0]["bytes"] == 2 * 2 * 70 * 2 * 16 * 4 + 2 * 2 * 4 * 16 * 4
    (s,) = summarize(loaded)
    assert s["B"] == 2 and s["N"] == 70 and set(s["paged_cost"]) == {32, 8} and s["vs_sdpa"] is None
    assert "| float32 | 2 | 70 |" in summary_table(loaded)
    bad = dict(kernel[0], what="prefill")
    assert "what" in results.check_row(bad)


@pytest.mark.skipif(not CPU, reason="interpreter test of the machinery")
def test_measure_serving_rows():
    from flashtut.model.paged_decoding import measure_serving, mixed_lengths

    assert mixed_lengths(5, 160)[-1] == 160 and min(mixed_lengths(5, 160)) >= 10
    cfg = m.GPTConfig(n_layer=1, d_model=32, n_head=4, n_kv_head=2)
    rows = measure_serving("cpu", prompts=(9,), batches=("mixed-2",), config=cfg, dtype=torch.float32,
                           new_tokens=3, reference_tokens=3)
    assert [r["method"] for r in rows] == ["sdpa dense", "triton paged", "triton paged, eager", "pytorch reference"]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 and r["batch"] == 2 for r in rows)
    assert all(r["same_tokens"] == 1.0 for r in rows[1:])
    with pytest.raises(ValueError, match="reference_tokens must be at least 3"):
        measure_serving("cpu", prompts=(9,), batches=("1",), config=cfg, reference_tokens=2)


@pytest.mark.skipif(not CPU, reason="interpreter test")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # the interpreter's NumPy overflow warnings
def test_non_finite_inputs_and_overflow_are_named(gen):
    p = make_problem(gen, [20, 9], 4, 2, 1, 16, 8, torch.float32)
    k = p["k_pool"].clone()
    k[int(p["table"][0, 1]), 0, 3, 2] = float("nan")
    with pytest.raises(ValueError, match="k_cache"):
        flashtut.decode_attention(p["q"], k, p["v_pool"], p["seqlens"], p["table"])
    with pytest.raises(ValueError, match="overflow"):
        flashtut.decode_attention(p["q"] * 1e19, p["k_pool"] * 1e19, p["v_pool"], p["seqlens"], p["table"])
    with pytest.raises(ValueError, match="overflow"):
        flashtut.decode_attention(p["q"] * 1e19, p["k_pool"] * 1e19, p["v_pool"], p["seqlens"], p["table"],
                                  backend="reference")


# ---------------------------------------------------------------- compiled for a GPU, without one ----

_COMPILE = r'''
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashtut.triton import decode_kernels as dk

arch = int(sys.argv[1])
def build(fn, types, constexprs, stages):
    # as a launch specialises them: pointers, strides and D = 128 divisible by 16 (the K/V loads then
    # become the asynchronous copies of the software pipeline)
    div = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
           if types[n].startswith("*") or n.startswith("stride") or n == "head_dim"}
    src = ASTSource(fn=fn, signature=types, constexprs=constexprs, attrs=div)
    triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4, "num_stages": stages})

consts = ("SINGLE", "PAGED", "PAGE", "TILE_IN_PAGE", "PAGE_AHEAD", "FUSED_MERGE", "BLOCK_M", "BLOCK_N", "BLOCK_D",
          "BLOCK_S", "EVEN_D", "DOT_PREC")
built = 0
# dtype, paged, page, single, D, page ahead, fused merge, keys per tile
variants = [("fp16", False, 1, True, 128, False, False, 64), ("fp16", True, 64, False, 128, False, False, 64),
            ("fp16", True, 16, False, 80, False, False, 64), ("bf16", True, 64, False, 128, False, False, 64),
            ("fp32", False, 1, False, 128, False, False, 64), ("bf16", True, 64, False, 128, True, True, 64),
            ("fp16", True, 16, False, 128, True, True, 128), ("bf16", False, 1, False, 128, False, True, 64)]
for dtype, paged, page, single, d, ahead, fused, block_n in variants:
        types = {}
        for n in dk.decode_split_kernel.arg_names:
            types[n] = ("*" + dtype if n in ("Q", "K", "V", "O") else "*fp32" if n in ("OP", "LP", "LSE")
                        else "*i32" if n in ("SEQLENS", "TABLE", "COUNTERS") else "fp32" if n == "qk_scale"
                        else "constexpr" if n in consts else "i32")
        build(dk.decode_split_kernel, types,
              dict(SINGLE=single, PAGED=paged, PAGE=page, TILE_IN_PAGE=paged and page % block_n == 0,
                   PAGE_AHEAD=ahead, FUSED_MERGE=fused, BLOCK_M=16, BLOCK_N=block_n, BLOCK_D=128, BLOCK_S=64,
                   EVEN_D=d == 128, DOT_PREC="ieee" if dtype == "fp32" else "tf32"),
              2 if dtype == "fp32" else 3)
        built += 1
types = {n: "*fp32" if n in ("OP", "LP", "LSE") else "*bf16" if n == "O" else
         "constexpr" if n in ("BLOCK_S", "BLOCK_D") else "i32" for n in dk.decode_merge_kernel.arg_names}
build(dk.decode_merge_kernel, types, dict(BLOCK_S=64, BLOCK_D=128), 1)
print("built", built + 1)
'''


def test_the_kernels_compile_for_the_gpu_without_one(tmp_path, arch=90):
    # the interpreter accepts code the compiler rejects (a return type that differs between branches,
    # for one): compile every variant the launch uses in a process without
    # TRITON_INTERPRET, as Triton does on a GPU (sm_90; the GPU tests cover the rest)
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(Path(flashtut.__file__).parents[1]))
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(arch)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "built 9" in done.stdout, done.stderr[-3000:]


@pytest.mark.skipif(not CPU, reason="interpreter test of the machinery; the GPU runs it at size")
def test_launch_variant_sweep_rows_and_table(tmp_path, capsys):
    # experiments/decode/sweep.py through the bench's harness at a tiny size: one row per variant and
    # layout, each checked, loadable as a results file, and a table line per variant
    import importlib.util
    from pathlib import Path

    from flashtut.bench import results

    path = Path(flashtut.__file__).parents[2] / "experiments" / "decode" / "sweep.py"
    spec = importlib.util.spec_from_file_location("decode_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    out = tmp_path / "sweep.json"
    rc = sweep.main(["--device", "cpu", "--cases", "2:70", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                     "--page-sizes", "32,8", "--variants", "shipped,fused+ahead,fa/bn128", "--out", str(out)])
    assert rc == 0
    rows = [r for r in results.load_results(out)["rows"] if r["kind"] == "decode"]
    assert [(r["variant"], r["layout"], r["page_size"]) for r in rows] == [
        (v, layout, ps) for v in ("shipped", "fused+ahead", "fa/bn128")
        for layout, ps in (("contiguous", None), ("paged", 32), ("paged", 8))]
    assert all(r["status"] == "ok" and r["passed"] for r in rows)
    assert rows[0]["impl"] == "triton-decode" and rows[3]["impl"] == "triton-decode/fused+ahead"
    assert rows[6]["block_n"] == 128 and rows[3]["fused_merge"] and rows[3]["page_ahead"]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| variant | batch | cache length | dtype |") and "(32 / 8)" in lines[0]
    assert lines[1].startswith("| shipped | 2 | 70 | float32 | 1 |") and lines[1].endswith("| 1.00 |")
    assert [line.split(" | ")[0] for line in lines[1:]] == ["| shipped", "| fused+ahead", "| fa/bn128"]
    with pytest.raises(SystemExit):
        sweep.main(["--device", "cpu", "--variants", "fastest"])


def test_serving_table_reads_the_rows():
    from flashtut.bench.decode import serving_table

    rows = [dict(section="generation", method=m, layout="batch 1", prompt=1024, status="ok", tokens_per_s=t)
            for m, t in (("sdpa dense", 400.0), ("pytorch reference", 20.0), ("triton paged", 500.0))]
    rows.append(dict(section="generation", method="triton paged", layout="batch mixed-32", prompt=4096,
                     status="oom"))
    lines = serving_table(rows).splitlines()
    assert lines[0] == "| batch | prompt | sdpa dense | pytorch reference | triton paged | ours / SDPA | ours / reference |"
    assert lines[2] == "| 1 | 1,024 | 400 | 20 | 500 | 1.25 | 25.00 |"
    assert lines[3] == "| mixed-32 | 4,096 | - | - | - | - | - |"


def test_cpu_without_the_interpreter_says_what_to_do(tmp_path):
    # a fresh process without TRITON_INTERPRET: the kernel cannot run on CPU tensors, and the
    # error names the way out (the reference backend, or the interpreter)
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import torch, flashtut\n"
            "q = torch.randn(1, 2, 1, 8); k = torch.randn(1, 1, 4, 8)\n"
            "n = torch.tensor([4], dtype=torch.int32)\n"
            "ref = flashtut.decode_attention(q, k, k, n, backend='reference')\n"
            "try:\n    flashtut.decode_attention(q, k, k, n)\n"
            "except RuntimeError as e:\n    print('RuntimeError:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(flashtut.__file__).parents[1])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert "RuntimeError: decode_attention(backend='triton') got CPU tensors" in done.stdout, done.stderr[-2000:]
    assert "backend='reference'" in done.stdout


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_strided_lengths_table_and_cache_views(gen):
    # views with other strides (a lengths column of a wider tensor, a transposed table, a cache
    # whose head dim is not contiguous) give the answer their contiguous copies give
    p = make_problem(gen, [20, 9], 4, 2, 1, 16, 8, torch.float32)
    want = td.triton_decode_attention(p["q"], p["k_pool"], p["v_pool"], p["seqlens"], p["table"], num_splits=2)
    lens = torch.stack([p["seqlens"], p["seqlens"] * 0], 1)[:, 0]
    table = p["table"].t().contiguous().t()
    k = p["k_pool"].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert lens.stride(0) == 2 and table.stride(1) != 1 and k.stride(-1) != 1
    got = td.triton_decode_attention(p["q"], k, p["v_pool"], lens, table, num_splits=2)
    torch.testing.assert_close(got, want)

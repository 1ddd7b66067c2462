"""The CUDA kernels (flashtut.cuda): every forward ladder step, the autograd path, and the errors.

GPU tests (marked ``gpu``) run on random inputs with odd sizes, Nq != Nk, causal or not, a
custom scale and large logits, judged by the book's one accuracy yardstick
(``flashtut.bench.accuracy.yardstick``): the kernel's largest error against a float32 reference
is at most twice that of PyTorch attention computed in the input precision (plus a small slack
for tensors PyTorch gets exactly); the ratio to SDPA's math backend is printed beside it.
"""
from __future__ import annotations

import math

import pytest
import torch

import flashtut
from flashtut.bench.accuracy import lowp_attention, yardstick, yardstick_tolerance
from flashtut.cuda import VARIANTS
from flashtut.cuda import attention as ca
from flashtut.cuda import configs as cfgs

HAS_CUDA = torch.cuda.is_available()


def _bf16_ok():
    return HAS_CUDA and torch.cuda.get_device_capability()[0] >= 8


def rand_qkv(B, H, Nq, Nk, D, dtype, seed=0, logit_scale=1.0, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = (torch.randn(B, H, Nq, D, generator=g) * logit_scale).to(device, dtype)
    k = torch.randn(B, H, Nk, D, generator=g).to(device, dtype)
    v = torch.randn(B, H, Nk, D, generator=g).to(device, dtype)
    return q, k, v


def assert_yardstick(name, q, k, v, o, causal, scale, grads=None, do=None):
    """The book's accuracy yardstick on ``o`` (and the gradients), with the ratios printed."""
    y = yardstick(q, k, v, o, grads, do, causal, scale)
    print(f"\n[accuracy] {name}: " + "; ".join(
        f"{n} {y.ratio(n):.2f}x PyTorch {str(q.dtype)[6:]}, {y.ratio(n, 'math'):.2f}x SDPA math" for n in y.err))
    assert y.passed, f"{name}:\n{y}"
    return y


# ----------------------------------------------------------------------------- CPU-side checks

def test_variants_are_the_ladder():
    assert list(VARIANTS) == ["v1", "v2", "v3", "v4", "v5", "v6", "v7"]
    assert all(isinstance(v, str) and v for v in VARIANTS.values())


def test_bad_inputs_raise_documented_errors():
    q = torch.randn(1, 2, 5, 64)
    with pytest.raises(TypeError):
        flashtut.cuda_attention(q.numpy(), q, q)
    with pytest.raises(ValueError, match="4-D"):
        flashtut.cuda_attention(q[0], q, q)
    with pytest.raises(ValueError, match="variant"):
        ca.cuda_forward(q, q, q, variant="v9")
    assert [cfgs.padded_dim(d) for d in (8, 32, 40, 64, 72, 96, 104, 128, 256)] == [32, 32, 64, 64, 96, 96, 128, 128, 256]
    with pytest.raises(ValueError, match="warps"):
        cfgs.launch_config("v3", torch.float16, 64, 90, 200_000, warps=3)
    with pytest.raises(ValueError, match="block_n"):
        cfgs.launch_config("v3", torch.float16, 64, 90, 200_000, block_n=48)
    with pytest.raises(ValueError, match="m_tiles"):
        cfgs.launch_config("v3", torch.float16, 64, 90, 200_000, m_tiles=3)
    with pytest.raises(ValueError, match="v3"):
        cfgs.launch_config("v2", torch.float16, 64, 90, 200_000, warps=4)


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU message")
def test_no_gpu_is_a_runtime_error():
    q = torch.randn(1, 2, 5, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        flashtut.cuda_attention(q, q, q)


# ----------------------------------------------------------------------------- GPU

SHAPES = [  # (B, H, Nq, Nk): odd lengths, Nq != Nk both ways, lengths below one tile
    (1, 2, 1, 1),
    (2, 3, 77, 77),
    (1, 2, 130, 67),
    (1, 2, 67, 200),
    (2, 2, 257, 383),
]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_ladder_matches_tiled(variant, D, dtype, causal):
    if dtype == torch.bfloat16 and not _bf16_ok():
        pytest.skip("bfloat16 needs sm_80")
    for i, (B, H, Nq, Nk) in enumerate(SHAPES):
        q, k, v = rand_qkv(B, H, Nq, Nk, D, dtype, seed=i)
        scale = None if i % 2 else 0.3  # default and a custom scale
        ref, ref_lse = flashtut.tiled_attention(q.double(), k.double(), v.double(), causal=causal,
                                                scale=scale, return_lse=True)
        o, lse = ca.cuda_forward(q, k, v, causal=causal, scale=scale, variant=variant)
        assert o.shape == q.shape and o.dtype == q.dtype
        assert lse.shape == (B, H, Nq) and lse.dtype == torch.float32
        assert_yardstick(f"{variant} o {(B, H, Nq, Nk, D)}", q, k, v, o, causal, scale)
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forward_large_logits_and_realistic_size(variant):
    dtype = torch.bfloat16 if _bf16_ok() else torch.float16
    # scores of order 100: exp would overflow without the running max
    q, k, v = rand_qkv(2, 4, 1000, 1531, 128, dtype, seed=7, logit_scale=8.0)
    for causal in (False, True):
        o, _ = ca.cuda_forward(q, k, v, causal=causal, scale=1.0, variant=variant)
        assert_yardstick(f"{variant} large logits causal={causal}", q, k, v, o, causal, 1.0)


@pytest.mark.gpu
def test_fast_forward_long_sequence_matches_sdpa_accuracy():
    for dtype in ([torch.float16, torch.bfloat16] if _bf16_ok() else [torch.float16]):
        q, k, v = rand_qkv(1, 4, 4096, 4096, 128, dtype, seed=3)
        for causal in (False, True):
            o = flashtut.cuda_attention(q, k, v, causal=causal)
            assert_yardstick(f"v3 N=4096 {dtype} causal={causal}", q, k, v, o, causal, None)


@pytest.mark.gpu
@pytest.mark.parametrize("warps,block_n,m_tiles", [(4, 64, 1), (4, 32, 1), (4, 128, 1), (8, 128, 1), (2, 16, 1),
                                                   (4, 32, 2), (8, 32, 2), (4, 64, 2), (8, 64, 2), (2, 16, 2)])
def test_fast_kernel_other_tile_sizes(warps, block_n, m_tiles):
    dtype = torch.bfloat16 if _bf16_ok() else torch.float16
    for D in (64, 128):
        for causal in (False, True):
            q, k, v = rand_qkv(2, 2, 333, 517, D, dtype, seed=D + warps + m_tiles)
            try:
                o, _ = ca.cuda_forward(q, k, v, causal=causal, warps=warps, block_n=block_n, m_tiles=m_tiles)
            except RuntimeError as exc:  # a tile choice that does not fit this GPU's shared memory
                assert "shared memory" in str(exc)
                continue
            assert_yardstick(f"v3 w{warps} n{block_n} mt{m_tiles} D={D} causal={causal}", q, k, v, o, causal, None)


def assert_fa_criterion(name, got, ref, lowp_err):
    """The yardstick on one tensor whose PyTorch-in-the-input-dtype error ``lowp_err`` is known
    (for masks the public API cannot express, such as a negative diagonal offset)."""
    err = (got.double() - ref.double()).abs().max().item()
    tol = yardstick_tolerance(got.dtype, lowp_err)
    assert err <= tol, f"{name}: error {err:.3g} above {tol:.3g} (PyTorch in {got.dtype}: {lowp_err:.3g})"


def torch_error(q, k, v, causal, scale, ref):
    """PyTorch attention's own error in the input precision against ``ref``."""
    return (lowp_attention(q, k, v, causal, scale).double() - ref.double()).abs().max().item()


def _masked_attention(q, k, v, offset, scale):
    """Attention with the mask j <= i + offset (None: none) in q's dtype the way PyTorch computes it
    (products in the dtype, softmax in float32, P rounded to the dtype), and its lse; rows that see
    no key give o = 0 and lse = -inf."""
    s = (q @ k.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) * scale
    if offset is not None:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(j > i + offset, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p.to(q.dtype) @ v).to(q.dtype), lse


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [name for name in VARIANTS if name in cfgs.V4_STEPS])
@pytest.mark.parametrize("D", [64, 128])
def test_fa2_steps_take_grouped_heads_and_a_diagonal_offset(variant, D):
    dtype = torch.bfloat16 if _bf16_ok() else torch.float16
    for i, (B, H, group, Nq, Nk) in enumerate([(2, 4, 2, 200, 333), (1, 6, 3, 300, 150), (1, 4, 4, 77, 77)]):
        g = torch.Generator(device="cpu").manual_seed(40 + i)
        q = torch.randn(B, H, Nq, D, generator=g).to("cuda", dtype)
        k, v = (torch.randn(B, H // group, Nk, D, generator=g).to("cuda", dtype) for _ in range(2))
        kx, vx = (x.repeat_interleave(group, 1) for x in (k, v))
        scale = D ** -0.5
        for offset in (None, 0, Nk - Nq, -5, 40):
            ref, ref_lse = _masked_attention(q.double(), kx.double(), vx.double(), offset, scale)
            in_dtype, _ = _masked_attention(q, kx, vx, offset, scale)
            o, lse = ca._forward(q, k, v, offset is not None, scale, variant, diag_offset=offset or 0)
            name = f"{variant} D={D} {(B, H, group, Nq, Nk)} offset={offset}"
            assert_fa_criterion(name, o, ref, (in_dtype.double() - ref).abs().max().item())
            seen = torch.isfinite(ref_lse)
            assert torch.isneginf(lse[~seen]).all(), f"{name}: a row with no key must have lse -inf"
            assert (o[~seen] == 0).all(), f"{name}: a row with no key must be 0"
            torch.testing.assert_close(lse[seen].double(), ref_lse[seen], atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
def test_older_steps_refuse_grouped_heads_and_offsets():
    q = torch.randn(1, 4, 32, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 2, 32, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="diag_offset"):
        ca._forward(q, k, k, True, 0.125, "v2")
    with pytest.raises(ValueError, match="diag_offset"):
        ca._forward(q, q, q, True, 0.125, "v2", diag_offset=3)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [8, 32, 40, 80, 96, 120])
def test_cuda_attention_pads_other_head_dims(D):
    dtype = torch.bfloat16 if _bf16_ok() else torch.float16
    q, k, v = rand_qkv(2, 3, 201, 333, D, dtype, seed=D)
    do = torch.randn_like(q)
    for causal in (False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = flashtut.cuda_attention(*leaves, causal=causal)
        assert o.shape == q.shape and o.dtype == dtype
        o.backward(do)
        ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
        ref = flashtut.naive_attention(*ref_leaves, causal=causal)
        ref.backward(do.double())
        assert_fa_criterion(f"D={D} causal={causal} o", o, ref.detach(), torch_error(q, k, v, causal, None, ref))
        # the yardstick: PyTorch attention in the input dtype (products and P in it), by autograd
        low = [x.clone().requires_grad_() for x in (q, k, v)]
        sc = (low[0] @ low[1].transpose(-1, -2)) * D ** -0.5
        if causal:
            sc = sc.masked_fill(flashtut.causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
        (torch.softmax(sc.float(), -1).to(dtype) @ low[2]).backward(do)
        for name, mine, want, lp in zip("qkv", leaves, ref_leaves, low):
            assert mine.grad.shape == mine.shape
            assert_fa_criterion(f"D={D} causal={causal} d{name}", mine.grad, want.grad,
                                (lp.grad.double() - want.grad).abs().max().item())


@pytest.mark.gpu
def test_head_dim_256_forward_and_other_steps_refuse_it():
    # the backward at D = 256: tests/kernels/test_cuda_dims.py
    dtype = torch.bfloat16 if _bf16_ok() else torch.float16
    q, k, v = rand_qkv(1, 2, 300, 177, 256, dtype, seed=9)
    for causal in (False, True):
        ref = flashtut.naive_attention(q.double(), k.double(), v.double(), causal=causal)
        try:
            o = flashtut.cuda_attention(q, k, v, causal=causal)
        except (RuntimeError, ValueError) as exc:   # a T4 (sm_75), or too little shared memory
            assert "sm_80" in str(exc) or "shared memory" in str(exc)
            return
        assert_fa_criterion(f"D=256 causal={causal}", o, ref, torch_error(q, k, v, causal, None, ref))
    with pytest.raises(ValueError, match="multiple of 8"):
        ca.cuda_forward(q, k, v, variant="v5")


@pytest.mark.gpu
def test_default_backward_is_close_run_to_run_and_deterministic_is_exact():
    q, k, v = rand_qkv(2, 4, 1000, 1000, 128, torch.float16, seed=21)
    do = torch.randn_like(q)
    grads = {}
    for det in (False, True):
        for rep in range(2):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            flashtut.cuda_attention(*leaves, causal=True, deterministic=det).backward(do)
            grads[det, rep] = [x.grad for x in leaves]
    assert all(torch.equal(a, b) for a, b in zip(grads[True, 0], grads[True, 1]))
    for a, b in zip(grads[False, 0], grads[True, 0]):   # atomics reorder float32 sums: rounding only
        torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-2)


@pytest.mark.gpu
def test_runs_on_torchs_current_stream_and_non_contiguous_inputs():
    q, k, v = rand_qkv(2, 3, 200, 300, 64, torch.float16, seed=5)
    # (B, N, H, D) storage viewed as (B, H, N, D): not contiguous
    qt, kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qt.is_contiguous()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        o = flashtut.cuda_attention(qt, kt, vt)
        o2 = o * 1  # ordered after the kernel on the same stream
    stream.synchronize()
    assert_yardstick("side stream", q, k, v, o2, False, None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_autograd_matches_reference(dtype, causal, D):
    if dtype == torch.bfloat16 and not _bf16_ok():
        pytest.skip("bfloat16 needs sm_80")
    B, H, Nq, Nk = 2, 3, 301, 451
    q, k, v = rand_qkv(B, H, Nq, Nk, D, dtype, seed=11)
    do = torch.randn(B, H, Nq, D, device="cuda", dtype=dtype)
    scale = 0.2
    qc, kc, vc = (x.clone().requires_grad_() for x in (q, k, v))
    o = flashtut.cuda_attention(qc, kc, vc, causal=causal, scale=scale)
    o.backward(do)
    grads = (qc.grad, kc.grad, vc.grad)
    assert all(g is not None and g.dtype == dtype for g in grads)
    assert_yardstick(f"autograd {dtype} causal={causal} D={D}", q, k, v, o, causal, scale, grads, do)


@pytest.mark.gpu
def test_gpu_errors():
    for D in (100, 136):   # not a multiple of 8; above 128 and not 256
        q = torch.randn(1, 2, 5, D, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="head dim"):
            flashtut.cuda_attention(q, q, q)
    q = torch.randn(1, 2, 5, 64, device="cuda", dtype=torch.float32)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        flashtut.cuda_attention(q, q, q)
    q = torch.randn(1, 2, 5, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="CUDA tensors"):
        flashtut.cuda_attention(q, q, q)
    q = torch.randn(1, 2, 5, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="scale"):
        flashtut.cuda_attention(q, q, q, scale=-1.0)


@pytest.mark.gpu
def test_bf16_on_a_t4_is_a_runtime_error(monkeypatch):
    import flashtut.cuda.compile as cc

    # the capability is asked once per GPU and cached: stand in for the cached lookup
    monkeypatch.setattr(cc, "_capability", lambda index: (7, 5))
    q = torch.randn(1, 2, 5, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="sm_80"):
        flashtut.cuda_attention(q, q, q)


# ----------------------------------------------------------------------------- chapter 08 exercises

def test_ch08_checkers_accept_solutions_and_reject_mistakes():
    from flashtut.exercises import ch08

    assert ch08.check_one_thread_row(ch08.solution_one_thread_row)
    # base e without rescaling the past: the classic bug
    def no_rescale(q, k, v, scale, block_n=32):
        acc, m, l = torch.zeros_like(q), -math.inf, 0.0
        for n0 in range(0, k.shape[0], block_n):
            s = (k[n0:n0 + block_n] @ q) * scale
            m = max(m, float(s.max()))
            p = torch.exp(s - m)
            l += float(p.sum())
            acc = acc + p @ v[n0:n0 + block_n]
        return acc / l, m + math.log(l)
    assert not ch08.check_one_thread_row(no_rescale)

    assert ch08.check_a_fragment_owner(ch08.solution_a_fragment_owner)
    res = ch08.check_a_fragment_owner(lambda r, c: (4 * (r % 8) + (c % 8) // 2, r // 8 + 2 * (c // 8), 0))
    assert not res and res.n_bad == 128

    assert ch08.check_swizzle(ch08.solution_swizzle)
    assert ch08.check_swizzle(lambda r, c: (c + r) % 8)  # any conflict-free permutation passes
    assert not ch08.check_swizzle(lambda r, c: c)
    assert not ch08.check_swizzle(lambda r, c: 0)

    assert ch08.check_v3_smem_bytes(ch08.solution_v3_smem_bytes)
    assert not ch08.check_v3_smem_bytes(lambda d, w, s: 16 * w * d * 2)


def test_budgets_match_the_kernels():
    # the fast kernel's arrays fit the 255-register limit with room for addresses
    assert sum(cfgs.register_budget("v3", 128).values()) < 200
    # the H200 defaults: 128-key tiles at D = 128 (ptxas: 239 registers), 32 rows per warp at D = 64
    assert sum(cfgs.register_budget("v3", 128, block_n=128).values()) < 200
    assert sum(cfgs.register_budget("v3", 64, m_tiles=2).values()) < 210
    assert "re-read" in " ".join(cfgs.register_budget("v3", 128, m_tiles=2))   # Q left in shared memory
    b = cfgs.shared_memory_budget("v3", 128, 90)
    assert b["smem_bytes"] == (128 + 2 * 2 * 128) * 128 * 2 and b["blocks_per_sm_by_smem"] == 1
    b = cfgs.shared_memory_budget("v3", 64, 90)
    assert b["smem_bytes"] == (2 * 16 * 4 + 2 * 2 * 64) * 64 * 2 and b["block_m"] == 128 and b["threads"] == 128
    assert cfgs.shared_memory_budget("v3", 128, 75)["smem_bytes"] <= 64 * 1024
    # steps 4 to 7: Q re-read at every k-step; two (one for step 5) K and V buffers of 64 keys
    assert "re-read" in " ".join(cfgs.register_budget("v4", 64))
    assert sum(cfgs.register_budget("v4", 128).values()) == 8 + 64 + 32 + 128 + 8
    for variant, bufs in (("v4", 2), ("v5", 1), ("v6", 2), ("v7", 2)):
        b = cfgs.shared_memory_budget(variant, 128, 90)
        assert b["smem_bytes"] == (128 + 2 * bufs * 64) * 128 * 2 and b["threads"] == 128
        assert b["blocks_per_sm_by_smem"] >= 2
        assert cfgs.shared_memory_budget(variant, 128, 75)["defines"]["V4_BLOCK_N"] == 32
    with pytest.raises(ValueError, match="variant"):
        cfgs.register_budget("v9", 64)


def test_chapter_figures_draw_from_the_committed_run():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashtut import results_data
    from flashtut.figures import bench_plots, cuda_plots

    rows, prov = results_data.load_results("cuda_h200.json")
    assert prov[0]["device"]["name"] and prov[0]["command"] and prov[0]["versions"]["cupy"]
    ladder = {r["impl"] for r in rows if r.get("N") == 4096 and r.get("D") == 128}
    assert {"naive", "cuda-v1", "cuda-v2", "cuda-v3", "sdpa-flash"} <= ladder
    bars = bench_plots.ladder_figure(rows, "fwd", dtype="float16", D=128, N=4096, causal=(False, True),
                                     others=("naive", "sdpa-flash"))
    for fig in (cuda_plots.mma_fragment_layout(), cuda_plots.thread_ownership(), cuda_plots.swizzle_banks(),
                cuda_plots.fast_vs_sdpa(rows), bars):
        assert fig.axes
    # the bars are the committed numbers, not zeros: two masks x five implementations
    widths = [p.get_width() for p in bars.axes[0].patches]
    assert len(widths) == 10 and min(widths) > 0
    plt.close("all")

"""The Triton FlexAttention kernels (``flashtut.triton.flex``) against the float64 dense reference.

Without a GPU the kernels run under Triton's interpreter (conftest sets ``TRITON_INTERPRET=1``)
at tiny sizes with 16 x 16 mask blocks, so that every case has empty, partial and full tiles and
ragged ends; the reference applies the same ``mask_mod`` and ``score_mod`` to the dense score
matrix in float64. The ``gpu`` tests run realistic sizes in float16 and bfloat16 and hold the
kernels to the book's yardstick (at most twice the error of the same attention computed in the
input precision).
"""
from __future__ import annotations

import pytest
import torch

import flashtut
import flashtut.block_mask
from flashtut import masks
from flashtut.triton import flex_attention as fa
from flashtut.bench.flex_cases import CASES, flex_case
from flashtut.triton import mods

CPU = not torch.cuda.is_available()
DEV = "cpu" if CPU else "cuda"


def _inputs(gen, B, H, Hkv, Nq, Nk, D, dtype=torch.float32):
    shapes = [(B, H, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D), (B, H, Nq, D)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(DEV, dtype) for s in shapes]


def _grads(fn, q, k, v, do, extra=()):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    return o.detach(), torch.autograd.grad(o, leaves + list(extra), do)


def _check(gen, mask_mod, score_mod_of, B=1, H=2, Hkv=1, Nq=45, Nk=45, D=16, block=16, dtype=torch.float32,
           tol=2e-5, params=()):
    """Kernel vs float64 reference, output and every gradient (of the captured ``params`` too:
    ``score_mod_of(*params)`` builds the mod around them)."""
    q, k, v, do = _inputs(gen, B, H, Hkv, Nq, Nk, D, dtype)
    bm = flashtut.create_block_mask(mask_mod, None, None, Nq, Nk, device=DEV, BLOCK_SIZE=block) \
        if mask_mod is not None else None
    mine = [p.detach().clone().requires_grad_() for p in params]
    ref = [p.detach().double().clone().requires_grad_() for p in params]
    mod = score_mod_of(*mine) if score_mod_of else None
    mod64 = score_mod_of(*ref) if score_mod_of else None
    o, g = _grads(lambda *t: fa.triton_flex_attention(*t, score_mod=mod, block_mask=bm), q, k, v, do, mine)
    o64, g64 = _grads(lambda *t: flashtut.flex_reference(*t, score_mod=mod64, block_mask=bm),
                      *(t.double() for t in (q, k, v, do)), ref)
    names = ["o", "dq", "dk", "dv"] + [f"d{p}" for p in range(len(params))]
    for name, got, want in zip(names, [o, *g], [o64, *g64]):
        err = float((got.double() - want).abs().max())
        scale = max(1.0, float(want.abs().max()))
        assert err <= tol * scale, f"{name}: max error {err:.2e} (tolerance {tol * scale:.1e})"
    return o, g


def _ids(gen, n, docs=3):
    return torch.sort(torch.randint(0, docs, (n,), generator=gen)).values.to(DEV)


@pytest.mark.parametrize("case", ["none", "causal", "window", "document", "prefix_lm", "causal_document"])
def test_masks(gen, case):
    mod = {"none": None, "causal": masks.causal, "window": masks.sliding_window(11),
           "document": masks.document(_ids(gen, 45)), "prefix_lm": masks.prefix_lm(19),
           "causal_document": masks.and_masks(masks.causal, masks.document(_ids(gen, 45)))}[case]
    _check(gen, mod, None, Hkv=1 if case != "none" else 2)


@pytest.mark.parametrize("case", ["alibi", "softcap"])
def test_score_mods(gen, case):
    slopes = masks.alibi_slopes(2, device=DEV)
    mod = {"alibi": lambda: masks.alibi(slopes), "softcap": lambda: masks.softcap(0.7)}[case]
    _check(gen, masks.causal if case == "alibi" else masks.sliding_window(20), mod, D=24)


def test_learned_slopes_and_table_get_their_gradients(gen):
    # alibi's slopes index by head only (one atomic add per tile); the table by distance (per element)
    slopes = torch.rand(2, generator=gen).to(DEV)
    table = torch.randn(2, 6, generator=gen).to(DEV)

    def both(s, t):
        a, r = masks.alibi(s), masks.relative_bias(t)
        return lambda score, b, h, q_idx, kv_idx: r(a(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)

    # mask blocks of 32 against the interpreter's tiles of 16: each listed block takes two steps
    _check(gen, masks.causal, both, Nq=37, Nk=37, block=32, params=(slopes, table))


def test_queries_and_keys_of_different_lengths_and_a_square_mask_tile(gen):
    def diagonal_band(b, h, q_idx, kv_idx):            # bottom-right causal for Nq = 21, Nk = 50
        return kv_idx <= q_idx + 29

    _check(gen, diagonal_band, lambda: masks.softcap(2.0), B=2, H=2, Hkv=2, Nq=21, Nk=50, block=(16, 32))


def test_mask_on_batch_and_head(gen):
    # per-head lists under grouped heads: the dK/dV program of the shared key/value head walks the
    # lists of each of its query heads
    def per_head(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx - 9 * h) | (b == 1)

    q, k, v, do = _inputs(gen, 2, 2, 1, 33, 33, 16)
    bm = flashtut.create_block_mask(per_head, 2, 2, 33, 33, device=DEV, BLOCK_SIZE=16)
    o, g = _grads(lambda *t: fa.triton_flex_attention(*t, block_mask=bm), q, k, v, do)
    o64, g64 = _grads(lambda *t: flashtut.flex_reference(*t, block_mask=bm), *(t.double() for t in (q, k, v, do)))
    for got, want in zip((o, *g), (o64, *g64)):
        assert float((got.double() - want).abs().max()) < 2e-5


def test_float16(gen):
    _check(gen, masks.sliding_window(9), lambda: masks.softcap(1.5), dtype=torch.float16, tol=4e-3)


def test_a_row_that_sees_nothing_gives_zeros_and_finite_gradients(gen):
    def late(b, h, q_idx, kv_idx):
        return (q_idx >= 20) & (kv_idx <= q_idx)

    o, grads = _check(gen, late, lambda: masks.alibi(masks.alibi_slopes(2, device=DEV)), Nq=40, Nk=40)
    assert torch.equal(o[:, :, :20], torch.zeros_like(o[:, :, :20]))
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    q, k, v, _ = _inputs(gen, 1, 2, 1, 40, 40, 16)
    _, lse = fa.triton_flex_forward(q, k, v, block_mask=flashtut.create_block_mask(late, None, None, 40, 40,
                                                                                   device=DEV, BLOCK_SIZE=16))
    assert bool(torch.isinf(lse[:, :, :20]).all()) and bool(torch.isfinite(lse[:, :, 20:]).all())


def test_the_fixed_kernels_equal_flex_with_their_masks(gen):
    # causal, window and packed sequences: triton_attention / varlen_attention and flex_attention
    # compute the same thing through two mechanisms
    q, k, v, _ = _inputs(gen, 1, 2, 1, 40, 40, 16)
    for mod, kw in ((masks.causal, dict(causal=True)), (masks.sliding_window(7), dict(causal=True, window=7))):
        bm = flashtut.create_block_mask(mod, None, None, 40, 40, device=DEV, BLOCK_SIZE=16)
        torch.testing.assert_close(flashtut.flex_attention(q, k, v, block_mask=bm),
                                   flashtut.triton_attention(q, k, v, **kw), atol=2e-6, rtol=2e-6)
    lengths = torch.tensor([7, 20, 13])
    ids = torch.repeat_interleave(torch.arange(3), lengths).to(DEV)
    cu = torch.tensor([0, 7, 27, 40], dtype=torch.int32, device=DEV)
    bm = flashtut.create_block_mask(masks.and_masks(masks.causal, masks.document(ids)), None, None, 40, 40,
                                    device=DEV, BLOCK_SIZE=16)
    packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v)]
    torch.testing.assert_close(flashtut.flex_attention(q, k, v, block_mask=bm)[0].transpose(0, 1),
                               flashtut.varlen_attention(*packed, cu, cu, causal=True), atol=2e-6, rtol=2e-6)


def test_one_block_mask_serves_many_calls(gen):
    bm = flashtut.create_block_mask(masks.causal, None, None, 30, 30, device=DEV, BLOCK_SIZE=16)
    for _ in range(2):
        q, k, v, _ = _inputs(gen, 1, 1, 1, 30, 30, 16)
        want = flashtut.flex_reference(q.double(), k.double(), v.double(), block_mask=bm)
        assert float((fa.triton_flex_attention(q, k, v, block_mask=bm).double() - want).abs().max()) < 2e-5


def test_generated_code_reads_the_mod(gen):
    slopes = masks.alibi_slopes(4)
    compiled = mods.compile_score(masks.alibi(slopes))
    assert "tl.load(X0 + ((h)))" in compiled.source and "def grad_params" in compiled.source
    assert compiled.captured[0] is slopes and compiled.wants_grad == (False,)
    assert "(q_idx >= kv_idx)" in mods.compile_mask(masks.causal).source


def test_mods_the_kernel_cannot_compile_are_named(gen):
    q, k, v, _ = _inputs(gen, 1, 1, 1, 20, 20, 16)
    with pytest.raises(TypeError, match="erf"):
        fa.triton_flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: torch.erf(s))
    with pytest.raises(TypeError, match="without Python control flow"):
        fa.triton_flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s if i > j else -s)
    with pytest.raises(TypeError, match="score_mod must take 5 positional arguments"):
        fa.triton_flex_attention(q, k, v, score_mod=lambda s, b, h: s)
    bm = flashtut.create_block_mask(masks.causal, None, None, 24, 20, device=DEV, BLOCK_SIZE=16)
    with pytest.raises(ValueError, match=r"block_mask was built for other sizes.*Nq = 20 \(built for 24\)"):
        fa.triton_flex_attention(q, k, v, block_mask=bm)
    if CPU:
        with pytest.raises(ValueError, match="bfloat16"):
            fa.triton_flex_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())


# ------------------------------------------------------------------------- GPU ----

def lowp_flex(q, k, v, score_mod, block_mask):
    """The yardstick's baseline: FlexAttention in the input precision (``q k^T`` and ``P V`` in
    float16/bfloat16, the mod and the softmax in float32, ``P`` rounded to the input dtype)."""
    H, Hkv = q.shape[1], k.shape[1]
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    s = (q @ k.transpose(-2, -1)).float() * q.shape[-1] ** -0.5
    if score_mod is not None:
        s = score_mod(s, *flashtut.block_mask.index_grids(q.shape[0], H, q.shape[2], k.shape[2], q.device))
    keep = flashtut.block_mask.evaluate_mask(block_mask.mask_mod, 1, 1, q.shape[2], k.shape[2], q.device)
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return p.to(q.dtype) @ v


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", CASES)
def test_gpu_against_pytorch_flex(name, dtype):
    torch.manual_seed(0)
    B, H, Hkv, N, D = 2, 8, 2, 1536 + 37, 128
    q = torch.randn(B, H, N, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    mask_mod, score_mod = flex_case(name, N, H)
    bm = flashtut.create_block_mask(mask_mod, None, None, N, N, device="cuda")
    o, g = _grads(lambda *t: flashtut.flex_attention(*t, score_mod=score_mod, block_mask=bm), q, k, v, do)
    o_l, g_l = _grads(lambda *t: lowp_flex(*t, score_mod, bm), q, k, v, do)
    o32, g32 = _grads(lambda *t: flashtut.flex_reference(*t, score_mod=score_mod, block_mask=bm),
                      *(t.float() for t in (q, k, v, do)))
    for name_, mine, lowp, ref in zip(("o", "dq", "dk", "dv"), (o, *g), (o_l, *g_l), (o32, *g32)):
        err = float((mine.float() - ref).abs().max())
        err_l = float((lowp.float() - ref).abs().max())
        assert err <= 2 * err_l + 1e-3 * float(ref.abs().max()), f"{name_}: ours {err:.2e}, PyTorch in {dtype} {err_l:.2e}"


@pytest.mark.gpu
def test_gpu_learned_table_gradient():
    torch.manual_seed(0)
    B, H, N, D = 1, 4, 777, 64
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    table = torch.randn(H, 64, device="cuda", requires_grad=True)
    bm = flashtut.create_block_mask(masks.causal, None, None, N, N, device="cuda")
    o = flashtut.flex_attention(q, k, v, score_mod=masks.relative_bias(table), block_mask=bm)
    (g,) = torch.autograd.grad(o, table, do)
    o32 = flashtut.flex_reference(q.float(), k.float(), v.float(), score_mod=masks.relative_bias(table), block_mask=bm)
    (g32,) = torch.autograd.grad(o32, table, do.float())
    assert float((g - g32).abs().max()) <= 2e-2 * float(g32.abs().max())

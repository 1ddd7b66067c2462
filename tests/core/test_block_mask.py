"""Block masks, the ready-made mods and the dense FlexAttention reference (pure PyTorch).

The builder is checked against a brute-force classification of every tile, its lists against the
dense map of kinds both ways, and ``flex_reference`` against naive attention where the two say
the same thing (causal, window, packed documents) and against hand-written formulas elsewhere.
"""
from __future__ import annotations

import math

import pytest
import torch

import flashtut
from flashtut import masks
from flashtut.block_mask import EMPTY, FULL, PARTIAL, dense_block_mask, mask_matrix


def _brute_kinds(keep, bq, bk):
    """EMPTY/PARTIAL/FULL of every tile of a dense (Nq, Nk) mask, one tile at a time."""
    Nq, Nk = keep.shape
    out = torch.zeros(math.ceil(Nq / bq), math.ceil(Nk / bk), dtype=torch.int8)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            tile = keep[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
            whole = tile.shape == (bq, bk)
            out[i, j] = FULL if whole and bool(tile.all()) else PARTIAL if bool(tile.any()) else EMPTY
    return out


def _doc_ids(gen, n, docs):
    return torch.sort(torch.randint(0, docs, (n,), generator=gen)).values


MASKS = {
    "causal": lambda gen, n: masks.causal,
    "window": lambda gen, n: masks.sliding_window(13),
    "document": lambda gen, n: masks.document(_doc_ids(gen, n, 4)),
    "prefix_lm": lambda gen, n: masks.prefix_lm(21),
    "causal_document": lambda gen, n: masks.and_masks(masks.causal, masks.document(_doc_ids(gen, n, 3))),
}


@pytest.mark.parametrize("name", sorted(MASKS))
@pytest.mark.parametrize("Nq, Nk, block", [(77, 77, 16), (50, 83, (16, 32)), (64, 64, 32)])
def test_tiles_match_brute_force(gen, name, Nq, Nk, block):
    mod = MASKS[name](gen, max(Nq, Nk))
    bm = flashtut.create_block_mask(mod, None, None, Nq, Nk, device="cpu", BLOCK_SIZE=block)
    keep = mask_matrix(mod, None, None, Nq, Nk)[0, 0]
    bq, bk = bm.block_size
    assert torch.equal(bm.kinds()[0, 0], _brute_kinds(keep, bq, bk))
    # the lists, read back: each query block lists exactly the tiles of each kind, ascending
    kinds = bm.kinds()[0, 0]
    for m in range(kinds.shape[0]):
        for num, idx, kind in ((bm.kv_num_blocks, bm.kv_indices, PARTIAL), (bm.full_kv_num_blocks,
                                                                           bm.full_kv_indices, FULL)):
            listed = idx[0, 0, m, :int(num[0, 0, m])].tolist()
            assert listed == sorted(listed) == torch.nonzero(kinds[m] == kind).flatten().tolist()
    # the transposed lists serve the backward: per key block, its query blocks of each kind
    for n in range(kinds.shape[1]):
        for num, idx, kind in ((bm.q_num_blocks, bm.q_indices, PARTIAL), (bm.full_q_num_blocks,
                                                                         bm.full_q_indices, FULL)):
            listed = idx[0, 0, n, :int(num[0, 0, n])].tolist()
            assert listed == torch.nonzero(kinds[:, n] == kind).flatten().tolist()


def test_causal_skips_about_half_the_tiles():
    bm = flashtut.create_block_mask(masks.causal, None, None, 1024, 1024, device="cpu")
    kinds = bm.kinds()[0, 0]
    n = kinds.shape[0]
    assert int((kinds == PARTIAL).sum()) == n                   # the diagonal
    assert int((kinds == FULL).sum()) == n * (n - 1) // 2       # below it
    assert bm.visited_fraction() == pytest.approx((n * (n + 1) / 2) / n ** 2)


def test_masks_that_depend_on_batch_and_head():
    def per_head(b, h, q_idx, kv_idx):          # head h sees keys up to q_idx - 8 h, batch 1 sees all
        return (kv_idx <= q_idx - 8 * h) | (b == 1)

    bm = flashtut.create_block_mask(per_head, 2, 3, 40, 40, device="cpu", BLOCK_SIZE=16)
    assert bm.kv_indices.shape[:2] == (2, 3)
    keep = mask_matrix(per_head, 2, 3, 40, 40)
    for b in range(2):
        for h in range(3):
            assert torch.equal(bm.kinds()[b, h], _brute_kinds(keep[b, h], 16, 16))
    assert bool((bm.kinds()[1] != EMPTY).all())


def test_no_mask_is_full_but_the_ragged_end():
    bm = dense_block_mask(70, 45, device="cpu", BLOCK_SIZE=32)
    ref = flashtut.create_block_mask(lambda b, h, q, kv: q >= 0, None, None, 70, 45, device="cpu", BLOCK_SIZE=32)
    assert torch.equal(bm.kinds(), ref.kinds())


def test_the_builder_works_in_bands(monkeypatch):
    # a small chunk forces one band of query blocks at a time: the same answer
    from flashtut import block_mask
    mod = masks.sliding_window(20)
    whole = flashtut.create_block_mask(mod, None, None, 200, 200, device="cpu", BLOCK_SIZE=16)
    monkeypatch.setattr(block_mask, "_CHUNK_ELEMENTS", 16 * 16)
    banded = flashtut.create_block_mask(mod, None, None, 200, 200, device="cpu", BLOCK_SIZE=16)
    assert torch.equal(whole.kinds(), banded.kinds())


# ------------------------------------------------------------- the dense reference ----

def _qkv(gen, B, H, Hkv, Nq, Nk, D, dtype=torch.float64):
    return (torch.randn(B, H, Nq, D, generator=gen, dtype=dtype), torch.randn(B, Hkv, Nk, D, generator=gen, dtype=dtype),
            torch.randn(B, Hkv, Nk, D, generator=gen, dtype=dtype))


@pytest.mark.parametrize("window", [None, 1, 7])
def test_reference_equals_naive_attention(gen, window):
    q, k, v = _qkv(gen, 2, 4, 2, 37, 37, 16)
    mod = masks.causal if window is None else masks.sliding_window(window)
    bm = flashtut.create_block_mask(mod, None, None, 37, 37, device="cpu", BLOCK_SIZE=16)
    got = flashtut.flex_reference(q, k, v, block_mask=bm)
    want = flashtut.naive_attention(q, k, v, causal=True, window=window)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_reference_document_equals_varlen(gen):
    lengths = [9, 20, 1, 13]
    N = sum(lengths)
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    q, k, v = _qkv(gen, 1, 2, 2, N, N, 16)
    bm = flashtut.create_block_mask(masks.and_masks(masks.causal, masks.document(ids)), None, None, N, N,
                                    device="cpu", BLOCK_SIZE=16)
    got = flashtut.flex_reference(q, k, v, block_mask=bm)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]
    want = flashtut.varlen_attention(*packed, cu, cu, causal=True, backend="naive")
    torch.testing.assert_close(got[0].transpose(0, 1), want, atol=1e-12, rtol=1e-12)


def test_reference_score_mods_follow_their_formulas(gen):
    q, k, v = _qkv(gen, 1, 3, 3, 11, 13, 8)
    scale = 0.3
    s = (q @ k.transpose(-2, -1)) * scale
    i = torch.arange(11)[:, None]
    j = torch.arange(13)[None, :]
    slopes = masks.alibi_slopes(3).double()
    for mod, scores in ((masks.alibi(slopes), s - slopes[:, None, None] * (i - j)),
                        (masks.softcap(2.0), 2.0 * torch.tanh(s / 2.0))):
        got = flashtut.flex_reference(q, k, v, score_mod=mod, scale=scale)
        torch.testing.assert_close(got, torch.softmax(scores, -1) @ v, atol=1e-12, rtol=1e-12)


def test_a_row_that_sees_nothing_gives_zeros_and_finite_gradients(gen):
    q, k, v = (t.requires_grad_() for t in _qkv(gen, 1, 2, 2, 20, 20, 8))

    def late(b, h, q_idx, kv_idx):          # rows 0..4 see no key
        return (q_idx >= 5) & (kv_idx <= q_idx)

    bm = flashtut.create_block_mask(late, None, None, 20, 20, device="cpu", BLOCK_SIZE=16)
    o, lse = flashtut.flex_reference(q, k, v, block_mask=bm, return_lse=True)
    assert torch.equal(o[:, :, :5], torch.zeros_like(o[:, :, :5]))
    assert bool(torch.isinf(lse[:, :, :5]).all()) and bool(torch.isfinite(lse[:, :, 5:]).all())
    grads = torch.autograd.grad(o.sum(), (q, k, v))
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert torch.equal(grads[0][:, :, :5], torch.zeros_like(grads[0][:, :, :5]))


def test_learned_biases_get_their_gradients_through_the_reference(gen):
    q, k, v = _qkv(gen, 1, 3, 3, 9, 7, 8)
    slopes = torch.rand(3, generator=gen, dtype=torch.float64, requires_grad=True)
    table = torch.randn(3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda s: flashtut.flex_reference(q, k, v, score_mod=masks.alibi(s)), (slopes,))
    torch.autograd.gradcheck(lambda t: flashtut.flex_reference(q, k, v, score_mod=masks.relative_bias(t)), (table,))
    # the table by hand: distance q - kv clamped into [0, 4]
    i, j = torch.arange(9)[:, None], torch.arange(7)[None, :]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(8) + table[:, (i - j).clamp(0, 4)]
    got = flashtut.flex_reference(q, k, v, score_mod=masks.relative_bias(table))
    torch.testing.assert_close(got, torch.softmax(s, -1) @ v, atol=1e-12, rtol=1e-12)


def test_cpu_flex_attention_without_the_interpreter_is_the_reference(gen, monkeypatch):
    monkeypatch.setattr(flashtut, "_triton_interpreting", lambda: False)
    q, k, v = _qkv(gen, 1, 2, 1, 19, 19, 8, torch.float32)
    bm = flashtut.create_block_mask(masks.causal, None, None, 19, 19, device="cpu", BLOCK_SIZE=16)
    got = flashtut.flex_attention(q, k, v, score_mod=masks.softcap(3.0), block_mask=bm)
    assert torch.equal(got, flashtut.flex_reference(q, k, v, score_mod=masks.softcap(3.0), block_mask=bm))


# ------------------------------------------------------------------------- errors ----

def test_bad_mods_and_masks_name_what_is_wrong(gen):
    q, k, v = _qkv(gen, 1, 2, 2, 20, 20, 8)
    with pytest.raises(TypeError, match="score_mod must take 5 positional arguments"):
        flashtut.flex_reference(q, k, v, score_mod=lambda s, b: s)
    with pytest.raises(TypeError, match="mask_mod must take 4 positional arguments"):
        flashtut.create_block_mask(lambda q_idx, kv_idx: q_idx >= kv_idx, None, None, 20, 20, device="cpu")
    with pytest.raises(TypeError, match="mask_mod must return a bool tensor"):
        flashtut.create_block_mask(lambda b, h, i, j: (i - j).float(), None, None, 20, 20, device="cpu")
    with pytest.raises(TypeError, match="mask_mod must be a function"):
        flashtut.create_block_mask("causal", None, None, 20, 20, device="cpu")
    with pytest.raises(ValueError, match="doc_ids.*1-D"):
        masks.document(torch.zeros(4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="covers 10 positions.*Nq = 20"):
        flashtut.create_block_mask(masks.document(torch.zeros(10, dtype=torch.long)), None, None, 20, 20, device="cpu")
    with pytest.raises(ValueError, match="one per head.*H = 2"):
        flashtut.flex_reference(q, k, v, score_mod=masks.alibi(masks.alibi_slopes(1)))
    with pytest.raises(ValueError, match="power of two"):
        flashtut.create_block_mask(masks.causal, None, None, 20, 20, device="cpu", BLOCK_SIZE=24)
    with pytest.raises(TypeError, match="w must be a positive int"):
        masks.sliding_window(2.5)
    with pytest.raises(ValueError, match="cap must be"):
        masks.softcap(-1.0)
    bm = flashtut.create_block_mask(masks.causal, None, None, 24, 24, device="cpu", BLOCK_SIZE=16)
    with pytest.raises(ValueError, match=r"block_mask was built for other sizes.*Nq = 20 \(built for 24\)"):
        flashtut.flex_reference(q, k, v, block_mask=bm)
    bm = flashtut.create_block_mask(masks.causal, 3, None, 20, 20, device="cpu", BLOCK_SIZE=16)
    with pytest.raises(ValueError, match=r"B = 1 \(built for 3\)"):
        flashtut.flex_reference(q, k, v, block_mask=bm)
    with pytest.raises(TypeError, match="block_mask must be a BlockMask"):
        flashtut.flex_reference(q, k, v, block_mask=torch.ones(20, 20, dtype=torch.bool))
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        flashtut.flex_attention("q", k, v)
    with pytest.raises(ValueError, match="scale"):
        flashtut.flex_attention(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="head"):
        flashtut.flex_attention(q, k[:, :, :, :4], v)
    with pytest.raises(ValueError, match="mask_mod returned shape"):
        flashtut.create_block_mask(lambda b, h, i, j: torch.ones(3, dtype=torch.bool), None, None, 20, 20,
                                   device="cpu")

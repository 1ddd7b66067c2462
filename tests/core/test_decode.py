"""Split-KV decoding: the merged result equals one-pass attention, the merge is associative with
a neutral empty state, bad inputs get the documented errors; plus the chapter 10 checkers."""
import math

import pytest
import torch

import flashtut
from flashtut.decode import (empty_attention_state, merge_attention_states, split_bounds,
                             split_kv_attention, suggest_num_splits)
from flashtut.exercises import ch10


def _qkv(gen, B, H, Nq, Nk, D, dtype=torch.float64, spread=2.0):
    q = spread * torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64)
    k = spread * torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, Nk, D, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq", [1, 5])
@pytest.mark.parametrize("num_splits", [1, 3, 7, 100])
@pytest.mark.parametrize("Nk,D", [(53, 16), (97, 40)])
def test_split_kv_matches_tiled_and_naive(gen, causal, Nq, num_splits, Nk, D):
    # Nk = 53 and 97 are prime: no split size divides them; 100 splits exceeds Nk
    q, k, v = _qkv(gen, 2, 3, Nq, Nk, D)
    o, lse = split_kv_attention(q, k, v, num_splits, causal=causal, return_lse=True)
    o_tiled = flashtut.tiled_attention(q, k, v, causal=causal, block_m=16, block_n=16)
    o_naive = flashtut.naive_attention(q, k, v, causal=causal)
    torch.testing.assert_close(o, o_tiled, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, o_naive, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, flashtut.attention_lse(q, k, causal=causal), rtol=1e-12, atol=1e-12)
    assert o.dtype == q.dtype and lse.dtype == torch.float64 and lse.shape == (2, 3, Nq)


@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_more_queries_than_keys_custom_scale_large_logits(gen, causal):
    # Nq > Nk and Nq not a multiple of anything; the logits reach the hundreds, with the largest
    # score in the last split, so every earlier split's state is rescaled by the merge
    q, k, v = _qkv(gen, 1, 2, 23, 11, 24, spread=6.0)
    k[:, :, -1] = 3.0 * q[:, :, 0].abs().max() * torch.sign(q[:, :, 0])
    for s in (2, 4, 11, 12):
        o, lse = split_kv_attention(q, k, v, s, causal=causal, scale=0.9, return_lse=True)
        torch.testing.assert_close(o, flashtut.naive_attention(q, k, v, causal=causal, scale=0.9),
                                   rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse, flashtut.attention_lse(q, k, causal=causal, scale=0.9),
                                   rtol=1e-12, atol=1e-12)
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert flashtut.attention_lse(q, k, scale=0.9).max() > 100


def test_causal_rows_without_keys_in_a_split_get_no_nan(gen):
    # With top-left causal, row 0 sees only key 0: every split but the first is fully masked
    # for it, and the rows 0..Nq-1 see none of the splits that start at or after Nq.
    q, k, v = _qkv(gen, 1, 1, 4, 40, 8)
    o, lse = split_kv_attention(q, k, v, 10, causal=True, return_lse=True)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(o[0, 0, 0], v[0, 0, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, flashtut.naive_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_split_kv_low_precision_against_float64(gen, dtype, tol):
    q, k, v = _qkv(gen, 2, 2, 3, 77, 32, dtype=dtype)
    o, lse = split_kv_attention(q, k, v, 5, return_lse=True)
    assert o.dtype == dtype and lse.dtype == torch.float32
    ref = flashtut.naive_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(o.double(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), flashtut.attention_lse(q.double(), k.double()),
                               rtol=1e-5, atol=1e-5)
    # the partial states are merged in float32: each merge adds a rescaling and a division, so the
    # split result may be a few float32 roundings worse than the tiled one, never more than that
    err_split = (o.double() - ref).abs().max()
    err_tiled = (flashtut.tiled_attention(q, k, v).double() - ref).abs().max()
    merge_roundings = 16 * torch.finfo(torch.float32).eps * ref.abs().max()
    assert err_split <= 2 * err_tiled + merge_roundings


def _states(gen, n, shape=(2, 3, 4, 8)):
    """n partial states of one query set over n disjoint random key sets."""
    out = []
    q = torch.randn(shape, generator=gen, dtype=torch.float64)
    for _ in range(n):
        nk = int(torch.randint(1, 30, (1,), generator=gen))
        k = 3.0 * torch.randn(shape[:2] + (nk, shape[-1]), generator=gen, dtype=torch.float64)
        v = torch.randn(shape[:2] + (nk, shape[-1]), generator=gen, dtype=torch.float64)
        out.append(flashtut.tiled_attention(q, k, v, return_lse=True))
    return out


def test_merge_is_associative_and_commutative(gen):
    a, b, c, d = _states(gen, 4)
    left = merge_attention_states(*merge_attention_states(*merge_attention_states(*a, *b), *c), *d)
    tree = merge_attention_states(*merge_attention_states(*a, *b), *merge_attention_states(*c, *d))
    right = merge_attention_states(*a, *merge_attention_states(*b, *merge_attention_states(*c, *d)))
    swapped = merge_attention_states(*merge_attention_states(*d, *b), *merge_attention_states(*c, *a))
    for other in (tree, right, swapped):
        torch.testing.assert_close(other[0], left[0], rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(other[1], left[1], rtol=1e-13, atol=1e-13)


def test_merge_of_two_halves_equals_attention_over_all_keys(gen):
    q, k, v = _qkv(gen, 2, 2, 6, 45, 16)
    cut = 19
    sa = flashtut.tiled_attention(q, k[:, :, :cut], v[:, :, :cut], return_lse=True)
    sb = flashtut.tiled_attention(q, k[:, :, cut:], v[:, :, cut:], return_lse=True)
    o, lse = merge_attention_states(*sa, *sb)
    torch.testing.assert_close(o, flashtut.naive_attention(q, k, v), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, flashtut.attention_lse(q, k), rtol=1e-12, atol=1e-12)


def test_empty_state_is_neutral(gen):
    (o, lse), = _states(gen, 1)
    e_o, e_lse = empty_attention_state(o.shape, dtype=torch.float64)
    for merged in (merge_attention_states(o, lse, e_o, e_lse), merge_attention_states(e_o, e_lse, o, lse)):
        torch.testing.assert_close(merged[0], o, rtol=0, atol=0)
        torch.testing.assert_close(merged[1], lse, rtol=0, atol=0)
    both_o, both_lse = merge_attention_states(e_o, e_lse, e_o, e_lse)
    assert (both_o == 0).all() and torch.isneginf(both_lse).all()


def test_merge_far_apart_states_does_not_overflow(gen):
    (o_a, lse_a), (o_b, lse_b) = _states(gen, 2)
    o, lse = merge_attention_states(o_a, lse_a + 1000.0, o_b, lse_b.to(torch.float32))
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(o, o_a, rtol=1e-12, atol=1e-12)   # b weighs exp(-1000) = 0
    torch.testing.assert_close(lse, lse_a + 1000.0, rtol=1e-12, atol=1e-12)


def test_merge_keeps_o_dtype_and_widens_lse():
    o = torch.randn(3, 5, dtype=torch.float16)
    lse = torch.randn(3, dtype=torch.float32)
    mo, ml = merge_attention_states(o, lse, o, lse)
    assert mo.dtype == torch.float16 and ml.dtype == torch.float32
    torch.testing.assert_close(ml, lse + math.log(2.0))
    torch.testing.assert_close(mo, o)


def test_split_bounds_cover_keys_evenly():
    for n, s in [(1, 1), (10, 3), (97, 7), (5, 12), (64, 64)]:
        b = split_bounds(n, s)
        assert len(b) == s and b[0][0] == 0 and b[-1][1] == n
        assert all(b[i][1] == b[i + 1][0] for i in range(s - 1))
        sizes = [e - a for a, e in b]
        assert max(sizes) - min(sizes) <= 1


def test_suggest_num_splits():
    assert suggest_num_splits(1, 32, 1, 32768, 132) == 5      # decoding: 32 blocks, 132 SMs
    assert suggest_num_splits(8, 32, 1, 32768, 132) == 1      # 256 blocks already fill them
    assert suggest_num_splits(1, 8, 1, 1024, 132) == 4        # capped: 256 keys per split
    assert suggest_num_splits(1, 32, 4096, 4096, 132) == 1    # prefill: 64 query blocks per head
    assert suggest_num_splits(1, 1, 1, 10, 132) == 1


@pytest.mark.parametrize("bad,err,match", [
    (dict(num_splits=0), ValueError, "num_splits"),
    (dict(num_splits=-2), ValueError, "num_splits"),
    (dict(num_splits=2.5), ValueError, "num_splits"),
    (dict(num_splits=True), ValueError, "num_splits"),
    (dict(scale=-1.0), ValueError, "scale"),
    (dict(causal="yes"), ValueError, "causal"),
    (dict(causal=2), TypeError, "causal"),
])
def test_split_kv_bad_arguments(gen, bad, err, match):
    q, k, v = _qkv(gen, 1, 1, 2, 9, 8)
    kwargs = dict(num_splits=2)
    kwargs.update(bad)
    with pytest.raises(err, match=match):
        split_kv_attention(q, k, v, **kwargs)


def test_split_kv_bad_tensors(gen):
    q, k, v = _qkv(gen, 1, 2, 2, 9, 8)
    with pytest.raises(TypeError, match="q"):
        split_kv_attention(q.numpy(), k, v, 2)
    with pytest.raises(ValueError, match="head dim"):
        split_kv_attention(q, k[..., :4], v, 2)
    with pytest.raises(ValueError, match="dtype"):
        split_kv_attention(q, k.float(), v, 2)
    with pytest.raises(ValueError, match="4-D"):
        split_kv_attention(q[0], k, v, 2)
    with pytest.raises(ValueError, match="dtype"):
        split_kv_attention(q.int(), k.int(), v.int(), 2)


def test_merge_bad_arguments():
    o = torch.randn(2, 3, 4)
    lse = torch.randn(2, 3)
    with pytest.raises(TypeError, match="lse_b"):
        merge_attention_states(o, lse, o, 1.0)
    with pytest.raises(ValueError, match="lse_a"):
        merge_attention_states(o, lse[:, :2], o, lse)
    with pytest.raises(ValueError, match="o_a and o_b"):
        merge_attention_states(o, lse, o[:1], lse[:1])
    with pytest.raises(ValueError, match="o_a and o_b"):
        merge_attention_states(o, lse, o.double(), lse)
    with pytest.raises(ValueError, match="lse_a"):
        merge_attention_states(o, lse.half(), o, lse)


@pytest.mark.parametrize("args", [(0, 1, 1, 1, 1), (1, 1, 1, 1, 0), (1, 2.0, 1, 1, 1), (1, 1, -3, 1, 1)])
def test_suggest_num_splits_bad_arguments(args):
    with pytest.raises(ValueError, match="must be a positive integer"):
        suggest_num_splits(*args)


def test_ch10_checkers_accept_the_library_and_reject_wrong_answers():
    assert ch10.check_merge(merge_attention_states)
    assert ch10.check_split_kv(lambda q, k, v, s: split_kv_attention(q, k, v, s))
    assert ch10.check_num_splits(suggest_num_splits)

    def unguarded(o_a, lse_a, o_b, lse_b):                 # NaN for two empty states
        lse = torch.logaddexp(lse_a, lse_b)
        return torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b, lse

    def no_rescale(o_a, lse_a, o_b, lse_b):                # the bug of the source documents
        return 0.5 * (o_a + o_b), torch.logaddexp(lse_a, lse_b)

    r = ch10.check_merge(unguarded)
    assert not r and "NaN" in r.message
    r = ch10.check_merge(no_rescale)
    assert not r and "differ" in r.message
    r = ch10.check_split_kv(lambda q, k, v, s: flashtut.tiled_attention(q, k[:, :, :-1], v[:, :, :-1]))
    assert not r and "differ" in r.message
    r = ch10.check_num_splits(lambda b, h, nq, nk, sms: math.ceil(sms / (b * h)))
    assert not r and "cases differ" in r.message
    r = ch10.check_merge(lambda *a: 1 / 0)
    assert not r and "ZeroDivisionError" in r.message


def test_split_merge_figure_weights_sum_to_one():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from flashtut.figures.decode_plots import plot_split_merge

    fig = plot_split_merge(num_splits=5)
    heights = [p.get_height() for p in fig.axes[2].patches]
    assert len(heights) == 5 and abs(sum(heights) - 1.0) < 1e-12
    assert max(heights) < 0.99                       # the demo row spreads its mass over splits
    plt.close(fig)
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(8, generator=gen), torch.randn(10, 8, generator=gen)
    fig = plot_split_merge(q, k, num_splits=20)      # more splits than keys: empty ones are dropped
    assert len(fig.axes[2].patches) == 10
    plt.close(fig)
    with pytest.raises(ValueError, match="k must be"):
        plot_split_merge(q, k[:, :4])
    with pytest.raises(ValueError, match="q and k"):
        plot_split_merge(q=q)
    with pytest.raises(ValueError, match="num_splits"):
        plot_split_merge(num_splits=0)


def test_sm_fill_figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from flashtut.figures.decode_plots import plot_sm_fill

    fig = plot_sm_fill(num_sms=40, batch_heads=(4, 64), max_splits=12)
    curves = [line for line in fig.axes[0].lines if len(line.get_xdata()) == 12]
    assert len(curves) == 2
    assert list(curves[0].get_ydata()[:3]) == [4 / 40, 8 / 40, 12 / 40]
    assert all(y == 1.0 for y in curves[1].get_ydata())
    plt.close(fig)
    with pytest.raises(ValueError, match="num_sms"):
        plot_sm_fill(num_sms=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_on_gpu_matches_sdpa(gen, dtype, causal):
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    q, k, v = (t.to("cuda", dtype) for t in _qkv(gen, 2, 8, 3, 4099, 128, spread=1.0))
    o = split_kv_attention(q, k, v, 13, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           is_causal=causal)
    tol = 2e-3 if dtype == torch.float16 else 1.6e-2
    torch.testing.assert_close(o.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("Hkv", [1, 2, 4])
@pytest.mark.parametrize("Nq, Nk, num_splits, window", [
    (1, 1, 1, None),             # the first generated token: a cache of one key
    (1, 997, 7, None),           # one new token against a long cache
    (6, 301, 5, None),           # a prefill of several tokens at once
    (6, 301, 5, 40),             # the same through a sliding window
    (1, 130, 300, 17),           # more splits than keys, most of them behind the window
])
def test_split_kv_reads_a_grouped_query_kv_cache(gen, Hkv, Nq, Nk, num_splits, window):
    """Decoding: the new tokens sit at the end of the cache (causal='bottom-right')."""
    q = torch.randn(2, 4, Nq, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, Hkv, Nk, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(2, Hkv, Nk, 16, generator=gen, dtype=torch.float64)
    o, lse = split_kv_attention(q, k, v, num_splits, causal="bottom-right", window=window, return_lse=True)
    # query h, row i: its key/value head h // (4 // Hkv), the keys j <= i + Nk - Nq in its window
    for h in range(4):
        for i in range(Nq):
            hi = i + Nk - Nq + 1
            lo = 0 if window is None else max(0, hi - window)
            s = q[:, h, i:i + 1] @ k[:, h // (4 // Hkv), lo:hi].transpose(-1, -2) / 4.0
            want = torch.softmax(s, -1) @ v[:, h // (4 // Hkv), lo:hi]
            torch.testing.assert_close(o[:, h, i:i + 1], want, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(lse[:, h, i], torch.logsumexp(s, -1)[:, 0], rtol=1e-12, atol=1e-12)

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


# -- decoding over a KV cache, contiguous or paged (flashtut.decode_attention) ----------------------

from flashtut.decode import check_decode_inputs, decode_num_splits, gather_cache  # noqa: E402
from flashtut.paged_cache import PagedKVCache  # noqa: E402


def paged_problem(gen, lengths, H, Hkv, Nq, D, page_size, dtype=torch.float64, spare_pages=3):
    """Random queries and a paged cache holding ``lengths[b]`` positions of each sequence, its
    pages scattered over the pool in a random order; also the same cache laid out contiguously.
    Returns ``q, k_pool, v_pool, seqlens, table, k_dense, v_dense``."""
    B = len(lengths)
    need = [-(-n // page_size) for n in lengths]
    num_pages = sum(need) + spare_pages
    max_pages = max(need) + 1
    order = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.full((B, max_pages), num_pages + 7, dtype=torch.int32)   # unused entries: never read
    k_pool = torch.randn(num_pages, Hkv, page_size, D, generator=gen, dtype=torch.float64)
    v_pool = torch.randn(num_pages, Hkv, page_size, D, generator=gen, dtype=torch.float64)
    for b in range(B):
        table[b, :need[b]] = torch.tensor(order[:need[b]], dtype=torch.int32)
        order = order[need[b]:]
    nmax = max(lengths) + 2
    k_dense = torch.randn(B, Hkv, nmax, D, generator=gen, dtype=torch.float64)
    v_dense = torch.randn(B, Hkv, nmax, D, generator=gen, dtype=torch.float64)
    for b, n in enumerate(lengths):
        k_dense[b, :, :n] = gather_cache(k_pool, b, n, table)
        v_dense[b, :, :n] = gather_cache(v_pool, b, n, table)
    q = 1.5 * torch.randn(B, H, Nq, D, generator=gen, dtype=torch.float64)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return [t.to(dtype) if t.is_floating_point() else t
            for t in (q, k_pool, v_pool, seqlens, table, k_dense, v_dense)]


def per_sequence_naive(q, k_dense, v_dense, lengths, scale=None):
    return torch.cat([flashtut.naive_attention(q[b:b + 1], k_dense[b:b + 1, :, :n], v_dense[b:b + 1, :, :n],
                                               causal="bottom-right", scale=scale)
                      for b, n in enumerate(lengths)])


@pytest.mark.parametrize("lengths,H,Hkv,Nq,page_size", [
    ([1, 37, 16, 70], 4, 2, 1, 16),    # a one-token cache, a full page, lengths no page divides
    ([5, 5, 12], 6, 1, 5, 4),          # multi-query; Nq = the whole one-token-short cache
    ([33, 8, 9], 8, 8, 3, 8),          # one page exactly full, one with a single row used
    ([19], 32, 8, 16, 7),              # GQA 32/8, Nq 16, a page size no power of two
])
def test_decode_reference_matches_naive_per_sequence(gen, lengths, H, Hkv, Nq, page_size):
    q, kp, vp, sl, table, kd, vd = paged_problem(gen, lengths, H, Hkv, Nq, 24, page_size)
    want = per_sequence_naive(q, kd, vd, lengths, scale=0.4)
    paged = flashtut.decode_attention(q, kp, vp, sl, table, scale=0.4, backend="reference")
    dense = flashtut.decode_attention(q, kd, vd, sl, scale=0.4, backend="reference")
    torch.testing.assert_close(paged, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dense, want, rtol=1e-12, atol=1e-12)
    assert paged.shape == q.shape and paged.dtype == q.dtype


def test_decode_reference_low_precision_keeps_dtype(gen):
    q, kp, vp, sl, table, kd, vd = paged_problem(gen, [9, 30], 4, 2, 2, 16, 8, dtype=torch.bfloat16)
    o = flashtut.decode_attention(q, kp, vp, sl, table, backend="reference")
    want = per_sequence_naive(q.double(), kd.double(), vd.double(), [9, 30])
    assert o.dtype == torch.bfloat16
    assert (o.double() - want).abs().max() < 2e-2


def test_decode_reference_reads_only_the_used_part_of_the_cache(gen):
    # positions past cache_seqlens and pages the table does not name must not matter
    q, kp, vp, sl, table, kd, vd = paged_problem(gen, [10, 3], 4, 2, 1, 16, 4)
    before = flashtut.decode_attention(q, kp, vp, sl, table, backend="reference")
    used = {int(p) for b, n in enumerate([10, 3]) for p in table[b, :-(-n // 4)]}
    kp2, vp2 = kp.clone(), vp.clone()
    for p in set(range(kp.shape[0])) - used:
        kp2[p], vp2[p] = 1e4, float("nan")
    kp2[int(table[1, 0]), :, 3] = 1e4      # the row after sequence 1's last position
    torch.testing.assert_close(flashtut.decode_attention(q, kp2, vp2, sl, table, backend="reference"), before)
    kd2 = kd.clone()
    kd2[0, :, 10:] = 1e4
    torch.testing.assert_close(flashtut.decode_attention(q, kd2, vd, sl, backend="reference"),
                               flashtut.decode_attention(q, kd, vd, sl, backend="reference"))


def _decode_args(gen):
    q, kp, vp, sl, table, _, _ = paged_problem(gen, [6, 11], 4, 2, 2, 8, 4, dtype=torch.float32)
    return dict(q=q, k_cache=kp, v_cache=vp, cache_seqlens=sl, block_table=table)


@pytest.mark.parametrize("change,err,name", [
    (lambda a: a.update(q=a["q"][0]), ValueError, "q"),
    (lambda a: a.update(q=[1.0]), TypeError, "q"),
    (lambda a: a.update(k_cache=a["k_cache"].double()), ValueError, "k_cache"),
    (lambda a: a.update(v_cache=a["v_cache"][:, :, :3]), ValueError, "v_cache"),
    (lambda a: a.update(q=a["q"][:, :3]), ValueError, "heads"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), ValueError, "cache_seqlens"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"][:1]), ValueError, "cache_seqlens"),
    (lambda a: a.update(cache_seqlens=torch.tensor([1, 11], dtype=torch.int32)), ValueError, r"cache_seqlens\[0\]"),
    (lambda a: a.update(cache_seqlens=torch.tensor([6, 17], dtype=torch.int32)), ValueError, r"cache_seqlens\[1\]"),
    (lambda a: a.update(block_table=a["block_table"].long()), ValueError, "block_table"),
    (lambda a: a.update(block_table=a["block_table"][:1]), ValueError, "block_table"),
    (lambda a: a["block_table"].__setitem__((1, 2), 99), ValueError, r"block_table\[1\]"),
    (lambda a: a["block_table"].__setitem__((0, 0), -1), ValueError, r"block_table\[0\]"),
    (lambda a: a.update(block_table=None), ValueError, "k_cache"),
    (lambda a: a.update(scale=-1.0), ValueError, "scale"),
])
def test_decode_bad_inputs_name_the_argument(gen, change, err, name):
    args = _decode_args(gen)
    change(args)
    for backend in ("reference", "triton"):
        with pytest.raises(err, match=name):
            flashtut.decode_attention(**args, backend=backend)


def test_decode_contiguous_length_past_nmax_and_bad_backend(gen):
    q = torch.randn(2, 4, 1, 8, generator=gen)
    k = torch.randn(2, 2, 5, 8, generator=gen)
    with pytest.raises(ValueError, match="Nmax"):
        flashtut.decode_attention(q, k, k, torch.tensor([5, 6], dtype=torch.int32), backend="reference")
    with pytest.raises(ValueError, match="backend"):
        flashtut.decode_attention(q, k, k, torch.tensor([5, 4], dtype=torch.int32), backend="cuda")
    with pytest.raises(TypeError, match="backend"):
        flashtut.decode_attention(q, k, k, torch.tensor([5, 4], dtype=torch.int32), backend=None)


def test_an_unused_table_entry_may_be_anything(gen):
    args = _decode_args(gen)
    args["block_table"][0, -1] = -5          # sequence 0 holds 6 positions: 2 pages of 4, 3 entries
    assert check_decode_inputs(**args)[0] == [6, 11]


def test_decode_num_splits_fills_the_gpu_without_tiny_splits():
    assert decode_num_splits(1, 8, 65536, 132) == 64          # capped by max_splits
    assert decode_num_splits(32, 8, 65536, 132) == 3          # 256 programs: 3 splits fill 4 per SM
    assert decode_num_splits(1, 8, 1024, 132) == 4            # never below 256 keys a split
    assert decode_num_splits(1, 8, 100, 132) == 1
    assert decode_num_splits(64, 8, 65536, 132) == 2
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        s = decode_num_splits(b, 8, 16384, 132)
        assert s == 1 or b * 8 * (s - 1) < 4 * 132 <= b * 8 * s or s == 64


# -- the paged cache -------------------------------------------------------------------------------

def test_paged_cache_append_allocates_pages_and_reads_back(gen):
    cache = PagedKVCache(num_pages=12, page_size=8, kv_heads=2, head_dim=16, batch=3, max_pages=4, layers=2)
    written = [[[], []] for _ in range(3)]
    for seqs, T in [([0], 5), ([1], 17), ([2], 1), (None, 1), (None, 2), ([1], 3), ([0], 11)]:
        ss = [0, 1, 2] if seqs is None else seqs
        for layer in range(2):
            k = torch.randn(len(ss), 2, T, 16, generator=gen)
            v = torch.randn(len(ss), 2, T, 16, generator=gen)
            cache.append(k, v, layer=layer, seqs=seqs)
            if layer == 1:
                for i, s in enumerate(ss):
                    written[s][0].append(k[i])
                    written[s][1].append(v[i])
    assert cache.lengths == [19, 23, 4] and cache.seqlens.tolist() == [19, 23, 4]
    assert [len(p) for p in cache.pages] == [3, 3, 1] and cache.free_pages == 12 - 7
    held = [p for pages in cache.pages for p in pages]
    assert len(set(held)) == len(held)                       # no page handed out twice
    for s in range(3):
        k, v = cache.gather(1, s)
        assert torch.equal(k, torch.cat(written[s][0], 1)) and torch.equal(v, torch.cat(written[s][1], 1))
        assert cache.block_table[s, :len(cache.pages[s])].tolist() == cache.pages[s]
    cache.release(1)
    assert cache.free_pages == 12 - 4 and cache.lengths[1] == 0


def test_paged_cache_errors_name_the_argument(gen):
    cache = PagedKVCache(num_pages=3, page_size=4, kv_heads=1, head_dim=8, batch=2, max_pages=2)
    kv = torch.randn(1, 1, 9, 8, generator=gen)
    with pytest.raises(ValueError, match="max_pages"):
        cache.append(kv, kv, seqs=[0])
    cache.append(kv[:, :, :8], kv[:, :, :8], seqs=[0])
    with pytest.raises(ValueError, match="num_pages"):
        cache.append(kv[:, :, :5], kv[:, :, :5], seqs=[1])
    with pytest.raises(ValueError, match="k must be"):
        cache.append(kv[:, :, :1, :4], kv[:, :, :1, :4], seqs=[1])
    with pytest.raises(ValueError, match="seqs"):
        cache.append(kv[:, :, :1], kv[:, :, :1], seqs=[2])
    with pytest.raises(ValueError, match="layer"):
        cache.append(kv[:, :, :1], kv[:, :, :1], layer=1, seqs=[1])
    with pytest.raises(TypeError, match="k"):
        cache.append("k", kv, seqs=[1])
    for bad in (dict(num_pages=0), dict(page_size=2.5), dict(batch=-1)):
        kwargs = dict(num_pages=3, page_size=4, kv_heads=1, head_dim=8, batch=2) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            PagedKVCache(**kwargs)


def test_decode_figures_draw_the_rule_and_the_rows():
    from flashtut.figures import decode_plots

    fig = decode_plots.plot_decode_splits(num_sms=132, kv_heads=8, batches=(1, 32), lengths=(1024, 65536))
    (a, b) = fig.axes
    assert [list(line.get_ydata()) for line in a.lines] == [[4, 3], [64, 3]]
    assert list(b.lines[1].get_ydata()) == [8 * 64 / 132, 32 * 8 * 3 / 132]
    rows = [dict(kind="decode", status="ok", dtype="bfloat16", B=1, N=n, impl=i, layout=lay, page_size=p,
                 ms=ms, gb_per_s=g)
            for n in (1024, 4096)
            for i, lay, p, ms, g in [("triton-decode", "contiguous", None, 1.0, 2400.0),
                                     ("triton-decode", "paged", 64, 1.1, 2200.0),
                                     ("sdpa-flash", "dense", None, 2.0, 1200.0),
                                     ("sdpa-cudnn-rows", "dense", None, 1.5, 1600.0)]]
    fig = decode_plots.plot_decode_bandwidth(rows + [dict(r, B=32) for r in rows[:4]], 3000.0)
    ys = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].lines if not line.get_label().startswith("_")}
    assert ys == {"triton (contiguous)": [0.8, 0.8], "triton (paged, 64)": [2200 / 3000] * 2,
                  "SDPA, best form": [1600 / 3000] * 2}
    # legible on a phone: the batches stacked in one column (a taller figure), one legend under
    # both panels, clear of the data
    fig.canvas.draw()
    (top, bottom), (legend,) = [ax.get_position() for ax in fig.axes], fig.legends
    assert [ax.get_title() for ax in fig.axes] == ["batch 1, bfloat16", "batch 32, bfloat16"]
    assert top.y0 > bottom.y1 and fig.get_figheight() > fig.get_figwidth()
    assert [t.get_text() for t in legend.get_texts()] == list(ys)
    box = legend.get_window_extent().transformed(fig.transFigure.inverted())
    assert box.y1 < bottom.y0 and not any(ax.get_legend() for ax in fig.axes)
    with pytest.raises(ValueError, match="copy_gb_per_s"):
        decode_plots.plot_decode_bandwidth(rows, 0)
    with pytest.raises(ValueError, match="float16"):
        decode_plots.plot_decode_bandwidth(rows, 3000.0, dtype="float16")

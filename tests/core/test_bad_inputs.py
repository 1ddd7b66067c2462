"""Every bad input a clear error, every odd-but-valid input a right answer.

A harness over the public API of ``book/api.md``: each function gets non-tensors, wrong ranks, mismatched
dtypes, devices and heads, bad scales, causal flags and windows, empty and integer tensors, and
non-finite values, and must raise the documented exception whose message names the argument,
before any work. Alongside: the classes a harness found silent or raw (strided ``cu_seqlens``,
``window=10**20``, ``deterministic="no"``) and the overflow guard that reads the log-sum-exp.
Triton runs under its CPU interpreter (tests/conftest.py sets TRITON_INTERPRET=1): tiny shapes.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import flashtut as ft
from flashtut import checks

tk = pytest.importorskip("flashtut.triton.attention")
INTERP = tk.interpreting()
needs_triton = pytest.mark.skipif(not (INTERP or torch.cuda.is_available()),
                                  reason="needs a GPU or the Triton interpreter")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: the Triton interpreter computes with NumPy, which warns as the planted overflows happen
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def qkv(B=1, H=2, Hkv=None, Nq=5, Nk=7, D=16, dtype=torch.float32, device="cpu", seed=0, mag=1.0):
    g = torch.Generator().manual_seed(seed)
    Hkv = Hkv or H
    return tuple((mag * torch.randn(B, h, n, D, generator=g, dtype=torch.float64)).to(dtype).to(device)
                 for h, n in ((H, Nq), (Hkv, Nk), (Hkv, Nk)))


def _tiled_bwd(q, k, v, **kw):
    o, lse = ft.tiled_attention(q, k, v, causal=kw.get("causal", False), scale=kw.get("scale"),
                                window=kw.get("window"), return_lse=True) if _all_tensors(q, k, v) \
        else (q, None)
    return ft.tiled_attention_backward(q, k, v, o, lse, o, **kw)


def _all_tensors(*ts):
    try:
        checks.check_qkv(*ts, gqa=True)
        checks.check_mask(False, None)
        return True
    except (TypeError, ValueError):
        return False


#: the PyTorch-level attention functions, each taking (q, k, v, **options)
DENSE = {
    "naive_attention": ft.naive_attention,
    "tiled_attention": lambda q, k, v, **kw: ft.tiled_attention(q, k, v, block_m=4, block_n=4, **kw),
    "split_kv_attention": lambda q, k, v, **kw: ft.split_kv_attention(q, k, v, 3, **kw),
    "attention_lse": lambda q, k, v, **kw: ft.attention_lse(q, k, **kw),
    "tiled_attention_backward": _tiled_bwd,
}
KERNELS = {"triton_attention": ft.triton_attention}
ALL = {**DENSE, **KERNELS}


def _call(name, *args, **kw):
    if name in KERNELS and not (INTERP or torch.cuda.is_available()):
        pytest.skip("needs a GPU or the Triton interpreter")
    return ALL[name](*args, **kw)


# --- 1. argument errors: the class and a message naming the argument ----------------------------

@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("case, exc, words", [
    ("q list", TypeError, "q must be a torch.Tensor"),
    ("k ndarray", TypeError, "k must be a torch.Tensor"),
    ("v None", TypeError, "v must be a torch.Tensor"),
    ("q 3-D", ValueError, "q must be a 4-D tensor"),
    ("k 5-D", ValueError, "k must be a 4-D tensor"),
    ("k float64", ValueError, "share one dtype"),
    ("v on meta", ValueError, "one device"),
    ("heads 3 over 2", ValueError, "heads"),
    ("D differs", ValueError, "head dim D must match"),
    ("Nk of v differs", ValueError, "same sequence length Nk"),
    ("Nq = 0", ValueError, "Nq, Nk and D must be at least 1"),
    ("Nk = 0", ValueError, "Nq, Nk and D must be at least 1"),
    ("int tensors", ValueError, "q has dtype int64"),
    ("bool tensors", ValueError, "q has dtype bool"),
])
def test_bad_tensors(name, case, exc, words):
    q, k, v = qkv()
    args = {
        "q list": (q.tolist(), k, v), "k ndarray": (q, k.numpy(), v), "v None": (q, k, None),
        "q 3-D": (q[0], k, v), "k 5-D": (q, k[None], v), "k float64": (q, k.double(), v.double()),
        "v on meta": (q, k, v.to("meta")), "heads 3 over 2": (torch.cat([q, q[:, :1]], 1), k, v),
        "D differs": (q, k[..., :8], v[..., :8]), "Nk of v differs": (q, k, v[:, :, :3]),
        "Nq = 0": (q[:, :, :0], k, v), "Nk = 0": (q, k[:, :, :0], v[:, :, :0]),
        "int tensors": tuple(t.long() for t in (q, k, v)), "bool tensors": tuple(t > 0 for t in (q, k, v)),
    }[case]
    if name == "attention_lse" and case in ("v None", "v on meta", "Nk of v differs"):
        pytest.skip("attention_lse takes no v")
    with pytest.raises(exc, match=words):
        _call(name, *args)


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                      (float("inf"), ValueError), (-float("inf"), ValueError),
                                      (True, TypeError), ("0.5", TypeError), (1j, TypeError),
                                      (torch.tensor(0.5), TypeError)])
def test_bad_scale(name, bad, exc):
    with pytest.raises(exc, match="scale"):
        _call(name, *qkv(), scale=bad)


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("bad, exc", [(1, TypeError), (0, TypeError), (None, TypeError), (1.0, TypeError),
                                      ("yes", ValueError), ("top_left", ValueError), ("", ValueError)])
def test_bad_causal(name, bad, exc):
    with pytest.raises(exc, match="causal"):
        _call(name, *qkv(), causal=bad)


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("bad, causal, exc", [
    (True, True, TypeError), (False, True, TypeError), (np.bool_(True), True, TypeError),
    (2.0, True, TypeError), (float("nan"), True, TypeError), (float("inf"), True, TypeError), ("3", True, TypeError),
    (0, True, ValueError), (-1, True, ValueError), (-10**20, True, ValueError), (3, False, ValueError),
])
def test_bad_window(name, bad, causal, exc):
    with pytest.raises(exc, match="window"):
        _call(name, *qkv(), causal=causal, window=bad)


@pytest.mark.parametrize("name", ["tiled_attention", "tiled_attention_backward"])
@pytest.mark.parametrize("block", ["block_m", "block_n"])
@pytest.mark.parametrize("bad", [0, -4, 2.0, True, None, "8"])
def test_bad_block_sizes(name, block, bad):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=block):
        if name == "tiled_attention":
            ft.tiled_attention(q, k, v, **{block: bad})
        else:
            o, lse = ft.tiled_attention(q, k, v, return_lse=True)
            ft.tiled_attention_backward(q, k, v, o, lse, o, **{block: bad})


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (2.0, ValueError), (True, ValueError),
                                      (None, ValueError)])
def test_split_kv_bad_num_splits(bad, exc):
    with pytest.raises(exc, match="num_splits"):
        ft.split_kv_attention(*qkv(), bad)


@pytest.mark.parametrize("fn", [ft.naive_softmax, ft.safe_softmax, ft.online_softmax])
def test_softmax_bad_inputs(fn):
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fn([1.0, 2.0])
    with pytest.raises(ValueError, match="x has dtype int64"):
        fn(torch.arange(3))
    for empty in (torch.ones(3, 0), torch.tensor(1.0)):
        with pytest.raises(ValueError, match="x must have at least one element"):
            fn(empty)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_online_softmax_bad_block_size(bad):
    with pytest.raises(ValueError, match="block_size"):
        ft.online_softmax(torch.randn(2, 5), block_size=bad)


def test_merge_states_bad_inputs():
    o, lse = torch.randn(2, 3, 4), torch.randn(2, 3)
    with pytest.raises(TypeError, match="lse_b"):
        ft.merge_attention_states(o, lse, o, None)
    with pytest.raises(ValueError, match="lse_a"):
        ft.merge_attention_states(o, lse[:, :2], o, lse)
    with pytest.raises(ValueError, match="o_a and o_b must have one shape"):
        ft.merge_attention_states(o, lse, o[:1], lse[:1])
    with pytest.raises(ValueError, match="lse_b has dtype float16"):
        ft.merge_attention_states(o, lse, o, lse.half())


# --- 2. windows wider than the sequence: every backend agrees with no window -------------------

HUGE = [10**20, 2**63, 2**31, 10**6]


@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("causal", [True, "bottom-right"])
@pytest.mark.parametrize("window", HUGE)
def test_huge_window_sees_everything_it_may_see(name, causal, window):
    q, k, v = qkv(Nq=5, Nk=7)
    got = _call(name, q, k, v, causal=causal, window=window)
    want = _call(name, q, k, v, causal=causal)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(a, b)


def test_huge_window_in_causal_mask_and_varlen():
    assert torch.equal(ft.causal_mask(4, 6, window=10**20), ft.causal_mask(4, 6))
    assert torch.equal(ft.causal_mask(4, 6, diag_offset=10**30, window=10**20), ft.causal_mask(4, 6, diag_offset=6))
    assert ft.causal_mask(4, 6, diag_offset=-10**30).all()
    with pytest.raises(TypeError, match="diag_offset"):
        ft.causal_mask(4, 6, diag_offset=1.5)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in qkv(Nq=9, Nk=9))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    torch.testing.assert_close(ft.varlen_attention(q, k, v, cu, cu, causal=True, window=10**20, backend="naive"),
                               ft.varlen_attention(q, k, v, cu, cu, causal=True, backend="naive"))


@needs_triton
def test_huge_window_triton_forward_backward_and_varlen():
    q, k, v = (t.to(DEV).requires_grad_() for t in qkv(Nq=6, Nk=6))
    o = ft.triton_attention(q, k, v, causal=True, window=10**20)
    o.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ft.triton_attention(q, k, v, causal=True).sum().backward()
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, t.grad)
    qp, kp, vp = (t.detach()[0].transpose(0, 1).contiguous() for t in (q, k, v))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device=DEV)
    torch.testing.assert_close(ft.varlen_attention(qp, kp, vp, cu, cu, causal=True, window=10**20),
                               ft.varlen_attention(qp, kp, vp, cu, cu, causal=True, backend="naive"))


# --- 3. the rest of the silent or raw classes -----------------------------------------------------

@needs_triton
def test_varlen_triton_reads_a_strided_cu_seqlens_view():
    """``offsets[::2]`` is a view with stride 2: the kernel must not read it as dense memory."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(9, 2, 16, generator=g).to(DEV).requires_grad_() for _ in range(3))
    offsets = torch.tensor([0, 99, 3, 99, 5, 99, 9], dtype=torch.int32, device=DEV)
    cu = offsets[::2]
    assert not cu.is_contiguous()
    got = ft.varlen_attention(q, k, v, cu, cu, causal=True)
    want = ft.varlen_attention(q, k, v, cu.contiguous(), cu.contiguous(), causal=True, backend="naive")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want.sum().backward()
    for a, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(a, t.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bad", ["no", 1, 0, None, "False"])
def test_cuda_deterministic_must_be_a_bool_before_any_gpu_check(bad):
    q, k, v = qkv(D=64, dtype=torch.float16)          # CPU tensors: the argument is checked first
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        ft.cuda_attention(q, k, v, deterministic=bad)


def test_cuda_bad_arguments_before_any_gpu_check():
    q, k, v = qkv(D=64, dtype=torch.float16)
    with pytest.raises(ValueError, match="window"):
        ft.cuda_attention(q, k, v, causal=True, window=10**20)
    with pytest.raises(TypeError, match="window"):
        ft.cuda_attention(q, k, v, causal=True, window=2.5)
    with pytest.raises(TypeError, match="causal"):
        ft.cuda_attention(q, k, v, causal=None)
    with pytest.raises(ValueError, match="forward_kernel"):
        ft.cuda_attention(q, k, v, forward_kernel="fast")
    with pytest.raises(ValueError, match="backward_kernel"):
        ft.cuda_attention(q, k, v, backward_kernel="fast")
    with pytest.raises(TypeError, match="backward_kernel"):
        ft.cuda_attention(q, k, v, backward_kernel=None)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        ft.cuda_attention(q.numpy(), k, v)


def test_varlen_bad_inputs():
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in qkv(Nq=9, Nk=9))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    cases = [
        (dict(cu_seqlens_q=cu.long()), ValueError, "cu_seqlens_q must have dtype int32"),
        (dict(cu_seqlens_k=torch.tensor([1, 4, 9], dtype=torch.int32)), ValueError, "cu_seqlens_k must start at 0"),
        (dict(cu_seqlens_q=torch.tensor([0, 5, 4, 9], dtype=torch.int32)), ValueError, "non-decreasing"),
        (dict(cu_seqlens_q=torch.tensor([0, 4, 8], dtype=torch.int32)), ValueError, "must end at"),
        (dict(cu_seqlens_q=torch.tensor([0, 9], dtype=torch.int32)), ValueError, "same number of sequences"),
        (dict(cu_seqlens_q=cu.tolist()), TypeError, "cu_seqlens_q must be a torch.Tensor"),
        (dict(backend="flash"), ValueError, "backend"),
        (dict(q=q[None]), ValueError, "q must be a 3-D packed tensor"),
        (dict(window=1.5, causal=True), TypeError, "window"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(causal="yes"), ValueError, "causal"),
    ]
    for change, exc, words in cases:
        args = {**dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="naive"), **change}
        with pytest.raises(exc, match=words):
            ft.varlen_attention(**args)


# --- 4. non-finite inputs and overflow: a finite answer or a ValueError that says so --------------

FINITE_PATHS = list(DENSE) + ["triton_attention"]


@pytest.mark.parametrize("name", FINITE_PATHS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_non_finite_inputs_are_named(name, bad, which):
    if name == "attention_lse" and which == 2:
        pytest.skip("attention_lse takes no v")
    ts = list(qkv(device=DEV if name in KERNELS else "cpu"))
    ts[which][0, 1, 2, 3] = bad
    with pytest.raises(ValueError, match=f"{'qkv'[which]} holds NaN or Inf"):
        _call(name, *ts)


def _overflowing(name, dtype):
    """Inputs whose scaled scores overflow float32: huge q and k of one sign (the max is +inf)."""
    dev = DEV if name in KERNELS else "cpu"
    q, k, v = qkv(dtype=torch.float32)
    q, k = (t.abs() * 1e20 for t in (q, k))
    return tuple(t.to(dtype).to(dev) for t in (q, k, v))


@pytest.mark.parametrize("name", FINITE_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sign", [1, -1])
def test_overflow_is_caught_by_the_lse_guard(name, dtype, sign):
    """Scores of +inf (every path) and of -inf for every key of a row (which would otherwise look
    like a row that sees no key: output 0, lse -inf, silently)."""
    if name in KERNELS and dtype == torch.bfloat16 and DEV == "cpu":
        pytest.skip("the interpreter has no bfloat16")
    q, k, v = _overflowing(name, dtype)
    with pytest.raises(ValueError, match="overflow"):
        _call(name, sign * q, k, v)


@pytest.mark.parametrize("name", ["tiled_attention", "split_kv_attention", "triton_attention"])
def test_overflow_of_the_output_sum_is_caught(name):
    """Scores are fine but V is so large that the unnormalised sum of P V overflows float32:
    the lse alone would not show it; the output health folded into it does."""
    q, k, _ = qkv(Nq=3, Nk=7)
    v = torch.full_like(k, 3e38)
    dev = DEV if name in KERNELS else "cpu"
    with pytest.raises(ValueError, match="overflow"):
        _call(name, *(t.to(dev) for t in (q * 0, k, v)))


@pytest.mark.parametrize("name", FINITE_PATHS)
@pytest.mark.parametrize("causal", [False, True, "bottom-right"])
def test_the_guard_does_not_flag_normal_inputs_or_empty_rows(name, causal):
    """Rows that see no key (bottom-right with Nq > Nk; a window past the keys) keep lse = -inf
    and output 0 without tripping the guard; large but representable scores pass."""
    dev = DEV if name in KERNELS else "cpu"
    for Nq, Nk, window in ((7, 4, None), (9, 3, 2), (4, 9, 3)):
        q, k, v = (t.to(dev) for t in qkv(Nq=Nq, Nk=Nk, mag=1e3))
        out = _call(name, q, k, v, causal=causal, window=window if causal else None)
        for t in out if isinstance(out, tuple) else (out,):
            assert not torch.isnan(t).any() and not torch.isposinf(t).any()


def test_rows_that_see_keys_match_the_mask():
    for alignment in (None, "top-left", "bottom-right"):
        for Nq, Nk in ((5, 5), (7, 3), (3, 7), (9, 2)):
            for window in (None, 1, 2, 4):
                if alignment is None and window is not None:
                    continue
                from flashtut.reference import visible_keys
                off = checks.diag_offset(alignment, Nq, Nk)
                if alignment is None:
                    sees = [True] * Nq
                else:
                    sees = [b > a for a, b in (visible_keys(i, Nk, off, window) for i in range(Nq))]
                r0, r1 = checks.rows_that_see_keys(alignment, window, Nq, Nk)
                assert sees == [r0 <= i < r1 for i in range(Nq)], (alignment, Nq, Nk, window)


def test_backward_overflow_is_flagged_and_normal_gradients_are_not():
    q, k, v = qkv(Nq=6, Nk=9)
    o, lse = ft.tiled_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="overflow"):
        ft.tiled_attention_backward(q, k, v, o, lse, torch.full_like(q, 3e38), block_m=4, block_n=4)
    with pytest.raises(ValueError, match="do holds NaN or Inf"):
        ft.tiled_attention_backward(q, k, v, o, lse, torch.full_like(q, float("nan")))
    dq, dk, dv = ft.tiled_attention_backward(q, k, v, o, lse, torch.full_like(q, 1e30))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


@needs_triton
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the interpreter warns as numpy overflows
@pytest.mark.parametrize("fused", [False, True])
def test_triton_backward_flag(fused):
    """The dK/dV and dQ kernels set the flag; the host reads one int, not the gradients."""
    q, k, v = (t.to(DEV) for t in qkv(Nq=6, Nk=9))
    o, lse = tk.triton_forward(q, k, v, causal="bottom-right")
    with tk.use_fused_backward(fused):
        for do, blamed in ((torch.full_like(q, 3e38), "overflow"), (torch.full_like(q, float("nan")), "do holds")):
            with pytest.raises(ValueError, match=blamed):
                tk.triton_backward(q, k, v, o, lse, do, causal="bottom-right")
        plan = tk._BackwardPlan(q, k, v, o, lse, torch.ones_like(q), ("bottom-right", None), 0.25)
        grads = plan.run()
        assert int(plan.flag) == 0 and all(torch.isfinite(g).all() for g in grads)


@needs_triton
def test_triton_guard_reads_the_lse_not_the_output(monkeypatch):
    """What the forward guard is handed: the (B, H, Nq) lse, never the (B, H, Nq, D) output; the
    backward guard: the kernels' one-element flag, never the gradients."""
    seen = []
    real_lse, real_flag = tk.raise_if_overflowed, tk.raise_if_flagged
    monkeypatch.setattr(tk, "raise_if_overflowed", lambda t, *a, **kw: (seen.append(tuple(t.shape)),
                                                                        real_lse(t, *a, **kw)))
    monkeypatch.setattr(tk, "raise_if_flagged", lambda t, *a, **kw: (seen.append(tuple(t.shape)),
                                                                     real_flag(t, *a, **kw)))
    q, k, v = (t.to(DEV).requires_grad_() for t in qkv(B=2, Nq=5, Nk=7))
    ft.triton_attention(q, k, v, causal=True).sum().backward()
    assert seen == [(2, 2, 5), (1,)]
    assert math.isfinite(float(q.grad.abs().max()))


@needs_triton
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_varlen_guard_asks_every_row_for_a_finite_lse_when_none_is_empty():
    """A packed batch whose scores all overflow to -inf: with no sequence that has empty rows the
    -inf rows are overflow, not empty rows, and the guard says so."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(9, 2, 16, generator=g).abs().to(DEV) for _ in range(3))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="overflow"):
        ft.varlen_attention(-1e20 * q, 1e20 * k, v, cu, cu, causal=True)
    out = ft.varlen_attention(q, k, v, cu, cu, causal=True)
    assert torch.isfinite(out).all()
    cu_k = torch.tensor([0, 2, 9], dtype=torch.int32, device=DEV)     # bottom-right: rows 0-1 see no key
    out = ft.varlen_attention(q, k, v, cu, cu_k, causal="bottom-right")
    torch.testing.assert_close(out, ft.varlen_attention(q, k, v, cu, cu_k, causal="bottom-right", backend="naive"))
    assert (out[:2] == 0).all()


# --- decode_attention over a KV cache (contiguous; the paged table has its own tests in test_decode) ---

DECODE_BACKENDS = ["reference", pytest.param("triton", marks=needs_triton)]


def _decode_args():
    q, k, v = qkv(B=2, H=4, Hkv=2, Nq=2, Nk=9, device=DEV)
    return [q, k, v, torch.tensor([9, 5], dtype=torch.int32, device=DEV)]


@pytest.mark.parametrize("backend", DECODE_BACKENDS)
@pytest.mark.parametrize("case, exc, words", [
    ("q list", TypeError, "q must be a torch.Tensor"),
    ("k_cache None", TypeError, "k_cache must be a torch.Tensor"),
    ("cache_seqlens list", TypeError, "cache_seqlens must be a torch.Tensor"),
    ("block_table ndarray", TypeError, "block_table must be a torch.Tensor"),
    ("int tensors", ValueError, "q has dtype int64"),
    ("v_cache on meta", ValueError, "v_cache must be on"),
    ("k_cache 3-D", ValueError, "k_cache must be a 4-D tensor"),
])
def test_decode_attention_bad_tensors(backend, case, exc, words):
    q, k, v, n = _decode_args()
    args, table = {
        "q list": ([q.tolist(), k, v, n], None), "k_cache None": ([q, None, v, n], None),
        "cache_seqlens list": ([q, k, v, [9, 5]], None), "block_table ndarray": ([q, k, v, n], np.zeros((2, 3))),
        "int tensors": ([q.long(), k.long(), v.long(), n], None), "v_cache on meta": ([q, k, v.to("meta"), n], None),
        "k_cache 3-D": ([q, k[0], v, n], None),
    }[case]
    with pytest.raises(exc, match=words):
        ft.decode_attention(*args, block_table=table, backend=backend)


@pytest.mark.parametrize("backend", DECODE_BACKENDS)
@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                      (float("inf"), ValueError), (True, TypeError), ("0.5", TypeError)])
def test_decode_attention_bad_scale(backend, bad, exc):
    with pytest.raises(exc, match="scale"):
        ft.decode_attention(*_decode_args(), scale=bad, backend=backend)

"""Right answers or clear errors for every input, and checkers that cannot be fooled.

One test (or one parametrized family) per class of defect: checkers that share tensors between
the reader's function and the reference, checkers that accept wrong answers or raise instead of
answering, scores that overflow the accumulation dtype, argument errors of the API contract,
``num_splits`` that costs in proportion to itself, the Colab ``sync`` command on bad files, and
the warnings of a book build.
"""
from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import flashtut as ft
from flashtut.checks import scores_can_overflow
from flashtut.exercises import checker
from flashtut.exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = [ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10]
ALL_CHECKERS = [getattr(m, n) for m in CHAPTERS for n in dir(m)
                if n.startswith("check_") and inspect.isfunction(getattr(m, n))
                and getattr(m, n).__module__ == m.__name__]


def qkv(gen, B=2, H=2, Nq=13, Nk=21, D=8, dtype=torch.float32, mag=1.0):
    return tuple(mag * torch.randn(B, H, n, D, generator=gen, dtype=torch.float64).to(dtype)
                 for n in (Nq, Nk, Nk))


# --- 2. each side gets its own copy --------------------------------------------------------------

def _zero_inputs_then(result):
    """A wrong function that zeroes every tensor it was given, then returns ``result(args)``
    computed on the zeroed inputs: before, the reference saw the zeros too and agreed."""
    def fn(*args):
        for a in args:
            if isinstance(a, torch.Tensor):
                a.zero_()
        return result(*args)
    return fn


@pytest.mark.parametrize("check, reference", [
    (ch02.check_attention, ft.naive_attention),
    (ch06.check_delta, ch06.solution_delta),
    (ch10.check_split_kv, lambda q, k, v, s: ft.tiled_attention(q, k, v)),
    (ch06.check_attention_backward, ch06.solution_attention_backward),
    (ch04.check_online_softmax, ch04.solution_online_softmax),
])
def test_a_function_that_zeroes_its_inputs_fails(check, reference):
    res = check(_zero_inputs_then(reference))
    assert not res.ok, res.message
    assert "changed its inputs in place" in res.message


def test_zeroing_inputs_fails_the_loop_checkers_too():
    res = ch05.check_tiled_attention(_zero_inputs_then(lambda q, k, v, b: ft.naive_attention(q, k, v)))
    assert not res.ok and "changed its inputs in place" in res.message
    res = ch06.check_dv_tile(_zero_inputs_then(ch06.solution_dv_tile))
    assert not res.ok and "changed its inputs in place" in res.message


def test_a_right_answer_computed_in_place_is_accepted_with_a_note():
    def delta_in_place(o, do):
        return o.mul_(do).sum(dim=-1)

    res = ch06.check_delta(delta_in_place)
    assert res.ok, res.message
    assert "changed its inputs in place: argument 1" in res.message

    def attention_in_place(q, k, v, causal, scale):
        out = ft.naive_attention(q, k, v, causal=causal, scale=scale)
        q.mul_(2.0)
        return out

    assert ch02.check_attention(attention_in_place).ok
    res = ch04.check_merge(lambda m_a, d_a, m_b, d_b: ch04.solution_merge(m_a, d_a.mul_(1.0), m_b, d_b))
    assert res.ok, res.message


# --- 3. checkers that accepted wrong answers ---------------------------------------------------

def test_compare_treats_complex_output_as_wrong():
    e = torch.randn(3, 4, dtype=torch.float64)
    res = checker.compare(torch.complex(e, torch.ones_like(e)), e)
    assert not res.ok and "complex" in res.message
    assert not checker.compare(torch.complex(e, torch.zeros_like(e)), e).ok


@pytest.mark.parametrize("check, right", [
    (ch08.check_v3_smem_bytes, ch08.solution_v3_smem_bytes),
    (ch08.check_swizzle, ch08.solution_swizzle),
    (ch08.check_a_fragment_owner, ch08.solution_a_fragment_owner),
    (ch05.check_fa1_traffic, ch05.solution_fa1_traffic),
    (ch10.check_num_splits, ft.decode.suggest_num_splits if hasattr(ft, "decode") else None),
])
def test_integer_answers_are_not_rounded(check, right):
    if right is None:
        from flashtut.decode import suggest_num_splits as right

    def plus_half(*a):
        got = right(*a)
        return tuple(x + 0.5 for x in got) if isinstance(got, tuple) else got + 0.5

    assert check(right).ok
    res = check(plus_half)
    assert not res.ok and "whole number" in res.message, res.message
    # integral floats are whole numbers
    as_float = check(lambda *a: tuple(float(x) for x in right(*a)) if isinstance(right(*a), tuple)
                     else float(right(*a)))
    assert as_float.ok, as_float.message


def test_v3_smem_24576_5_fails():
    res = ch08.check_v3_smem_bytes(lambda d, w, s: ch08.solution_v3_smem_bytes(d, w, s) + 0.5)
    assert not res.ok


def test_check_merge_tries_two_empty_states():
    def unguarded(m_a, d_a, m_b, d_b):
        m = torch.maximum(m_a, m_b)
        return m, d_a * torch.exp(m_a - m) + d_b * torch.exp(m_b - m)

    res = ch04.check_merge(unguarded)
    assert not res.ok and "NaN" in res.message, res.message
    assert ch04.check_merge(ch04.solution_merge).ok


# --- 10. checkers answer, whatever the reader's function does ------------------------------------

def _raises(*a, **k):
    raise RuntimeError("boom")


BAD_ANSWERS = {
    "None": lambda *a, **k: None,
    "string": lambda *a, **k: "42",
    "vector": lambda *a, **k: torch.arange(3.0),
    "numpy": lambda *a, **k: np.zeros(3),
    "numpy scalar": lambda *a, **k: np.float64(1.0),
    "meta": lambda *a, **k: torch.empty(3, device="meta"),
    "complex": lambda *a, **k: torch.ones(2, dtype=torch.complex64),
    "bool": lambda *a, **k: True,
    "dict": lambda *a, **k: {"a": 1},
    "tuple of None": lambda *a, **k: (None, None),
    "raises": _raises,
}


@pytest.mark.parametrize("answer", list(BAD_ANSWERS), ids=list(BAD_ANSWERS))
@pytest.mark.parametrize("check", ALL_CHECKERS, ids=lambda c: f"{c.__module__.split('.')[-1]}.{c.__name__}")
def test_every_checker_answers_a_wrong_kind_of_result(check, answer):
    res = check(BAD_ANSWERS[answer])
    assert isinstance(res, checker.CheckResult)
    assert not res.ok, res.message
    assert res.message.startswith("✗") or "✗" in res.message


def test_compare_refuses_what_is_not_a_real_tensor():
    e = torch.zeros(3, dtype=torch.float64)
    for bad, words in [(None, "NoneType"), ("x", "str"), (np.zeros(3), "numpy.ndarray"),
                       (torch.empty(3, device="meta"), "meta"), (torch.zeros(3, dtype=torch.bool), "bool")]:
        res = checker.compare(bad, e)
        assert not res.ok and words in res.message
    assert checker.compare(0.5, torch.tensor(0.5, dtype=torch.float64)).ok   # a number for a 0-d answer
    assert not checker.compare(torch.zeros(1), torch.tensor(0.0)).ok         # a vector is not a number


# --- 12. the API contract's error rules --------------------------------------------------------------

def test_compare_equal_infinities_are_equal_nan_is_not():
    e = torch.tensor([float("inf"), float("-inf"), 1.0], dtype=torch.float64)
    assert checker.compare(e.clone(), e).ok
    assert not checker.compare(torch.tensor([float("-inf"), float("-inf"), 1.0]), e).ok
    assert not checker.compare(torch.tensor([float("nan"), float("-inf"), 1.0]), e).ok
    with pytest.raises(ValueError, match="atol"):
        checker.compare(e, e, atol=-1.0)
    with pytest.raises(TypeError, match="expected"):
        checker.compare(e, "x")


def test_run_trials_needs_trials_and_callables():
    make = lambda g: (torch.randn(3, generator=g),)  # noqa: E731
    with pytest.raises(ValueError, match="trials must be at least 1, got 0"):
        checker.run_trials(torch.neg, torch.neg, make, trials=0)
    with pytest.raises(TypeError, match="trials must be an int"):
        checker.run_trials(torch.neg, torch.neg, make, trials=2.5)
    with pytest.raises(TypeError, match="candidate must be callable"):
        checker.run_trials(None, torch.neg, make)
    with pytest.raises(ValueError, match="seed"):
        checker.run_trials(torch.neg, torch.neg, make, seed=-1)
    for check in (ch02.check_attention, ch06.check_dv_tile, ch05.check_fa1_traffic, ch09.check_tflops):
        with pytest.raises(ValueError, match="trials must be at least 1"):
            check(lambda *a: None, trials=0)
    with pytest.raises(ValueError, match="cases must be at least 1"):
        ch02.check_max_seq_len(ch02.solution_max_seq_len, cases=0)
    with pytest.raises(TypeError, match="must be a function"):
        ch08.check_v3_smem_bytes(42)
    # a count that would build its cases forever is refused at once
    with pytest.raises(ValueError, match="cases must be at most"):
        ch02.check_max_seq_len(ch02.solution_max_seq_len, cases=2 ** 70)
    with pytest.raises(ValueError, match="trials must be at most"):
        ch09.check_tflops(ch09.reference_tflops, trials=2 ** 70)


def test_tiled_backward_o_and_do_must_have_q_dtype(gen):
    q, k, v = qkv(gen)
    o, lse = ft.tiled_attention(q, k, v, return_lse=True)
    for name, args in (("o", (o.double(), lse, o)), ("do", (o, lse, o.half()))):
        with pytest.raises(ValueError, match=f"{name} must have the dtype of q, float32"):
            ft.tiled_attention_backward(q, k, v, *args)


def test_triton_backward_without_do_is_a_type_error(gen):
    tk = pytest.importorskip("flashtut.triton.attention")
    q, k, v = qkv(gen, D=16)
    o = torch.zeros_like(q)
    lse = torch.zeros(q.shape[:3])
    with pytest.raises(TypeError, match="do must be a torch.Tensor, got NoneType"):
        tk.triton_backward(q, k, v, o, lse, None)
    with pytest.raises(TypeError, match="o must be a torch.Tensor"):
        tk.triton_backward(q, k, v, None, lse, o)


@pytest.mark.parametrize("fn", [ft.tiled_attention, lambda q, k, v, **kw: ft.split_kv_attention(q, k, v, 3, **kw)])
@pytest.mark.parametrize("bad", ["no", 1, 0, None, 1.0])
def test_return_lse_must_be_a_bool(gen, fn, bad):
    with pytest.raises(TypeError, match="return_lse must be True or False"):
        fn(*qkv(gen), return_lse=bad)
    assert isinstance(fn(*qkv(gen), return_lse=np.bool_(True)), tuple)


def test_merge_softmax_states_validates_and_never_broadcasts():
    m = torch.zeros(4)
    d = torch.ones(4)
    with pytest.raises(ValueError, match=r"m_b must have the shape of m_a, \(4,\), got \(1,\)"):
        ft.merge_softmax_states(m, d, m[:1], d[:1])
    with pytest.raises(ValueError, match=r"d_a must have the shape of m_a"):
        ft.merge_softmax_states(m, d[:, None], m, d)
    with pytest.raises(ValueError, match="d_b must have the dtype of m_a, float32, got float64"):
        ft.merge_softmax_states(m, d, m, d.double())
    with pytest.raises(ValueError, match="d_a has dtype int64"):
        ft.merge_softmax_states(m, torch.ones(4, dtype=torch.long), m, d)
    with pytest.raises(TypeError, match="m_b must be a torch.Tensor, got float"):
        ft.merge_softmax_states(m, d, 0.0, d)


def test_small_public_helpers_check_their_arguments():
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        ft.accum_dtype("float32")
    with pytest.raises(ValueError, match="accepted: float16"):
        ft.accum_dtype(torch.int32)
    with pytest.raises(ValueError, match="n_q must be at least 0"):
        ft.causal_mask(-1, 3)
    with pytest.raises(TypeError, match="n_k must be an int"):
        ft.causal_mask(2, 3.5)
    assert ft.causal_mask(2, 3).tolist() == [[False, True, True], [False, False, True]]


# --- 9. num_splits is clamped to the number of keys -----------------------------------------------

def test_split_kv_huge_num_splits_is_clamped(gen):
    q, k, v = qkv(gen, Nq=3, Nk=17, dtype=torch.float64)
    start = time.perf_counter()
    o, lse = ft.split_kv_attention(q, k, v, 2 ** 40, causal=True, return_lse=True)
    assert time.perf_counter() - start < 5.0
    torch.testing.assert_close(o, ft.naive_attention(q, k, v, causal=True), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ft.attention_lse(q, k, causal=True), rtol=1e-10, atol=1e-10)


# --- 4. scaled scores that overflow the accumulation dtype ------------------------------------------

def _api_calls():
    def tiled_bwd(q, k, v, scale):
        o, lse = ft.tiled_attention(q, k, v, scale=scale, return_lse=True)
        return ft.tiled_attention_backward(q, k, v, o, lse, torch.ones_like(q), scale=scale)

    calls = {
        "naive": lambda q, k, v, scale: ft.naive_attention(q, k, v, scale=scale),
        "naive causal": lambda q, k, v, scale: ft.naive_attention(q, k, v, causal=True, scale=scale),
        "lse": lambda q, k, v, scale: ft.attention_lse(q, k, scale=scale),
        "tiled": lambda q, k, v, scale: ft.tiled_attention(q, k, v, scale=scale, block_m=8, block_n=8),
        "tiled backward": tiled_bwd,
        "split-kv": lambda q, k, v, scale: ft.split_kv_attention(q, k, v, 3, scale=scale),
    }
    return calls


def _finite_or_overflow_error(call, q, k, v, scale):
    try:
        out = call(q, k, v, scale)
    except ValueError as exc:
        assert "overflow" in str(exc), str(exc)
        return "error"
    for t in (out if isinstance(out, tuple) else (out,)):
        assert torch.isfinite(t).all(), "silent NaN/Inf"
    return "finite"


@pytest.mark.parametrize("name", list(_api_calls()))
@pytest.mark.parametrize("case", ["scale 1e39 float32", "inputs 1e20 float32", "bfloat16 1e30",
                                  "float64 1e160"])
def test_overflowing_scores_give_a_finite_answer_or_say_so(gen, name, case):
    dtype, mag, scale = {"scale 1e39 float32": (torch.float32, 1.0, 1e39),
                         "inputs 1e20 float32": (torch.float32, 1e20, None),
                         "bfloat16 1e30": (torch.bfloat16, 1e30, None),
                         "float64 1e160": (torch.float64, 1e160, None)}[case]
    q, k, v = qkv(gen, dtype=dtype, mag=mag)
    v = torch.randn(v.shape, generator=gen).to(dtype)
    assert _finite_or_overflow_error(_api_calls()[name], q, k, v, scale) == "error"


def test_overflow_check_is_skipped_where_the_dtype_rules_it_out(gen):
    assert not scores_can_overflow(torch.float16, 1 / 8, 64)
    assert not scores_can_overflow(torch.float16, 1e3, 256)
    assert scores_can_overflow(torch.float16, 1e39, 64)
    for dt in (torch.bfloat16, torch.float32, torch.float64):
        assert scores_can_overflow(dt, 1 / 8, 64)
    # float16 inputs at the top of their range: finite, with no check needed
    q, k, v = (t.clamp(-6e4, 6e4).half() for t in qkv(gen, dtype=torch.float32, mag=3e4))
    assert torch.isfinite(ft.tiled_attention(q, k, v.clamp(-1, 1))).all()


def test_large_but_representable_scores_still_work(gen):
    q, k, v = qkv(gen, dtype=torch.float32, mag=1e15)     # scores ~1e30: fine in float32
    o = ft.tiled_attention(q, k, v)
    torch.testing.assert_close(o.double(), ft.naive_attention(q.double(), k.double(), v.double()),
                               rtol=1e-3, atol=1e-3 * float(v.abs().max()))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter warns as numpy overflows
@pytest.mark.parametrize("case", ["scale", "inputs"])
def test_triton_overflow_is_an_error(gen, case):
    tk = pytest.importorskip("flashtut.triton.attention")
    if not (torch.cuda.is_available() or tk.interpreting()):
        pytest.skip("needs a GPU or the Triton interpreter")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    mag, scale = (1.0, 1e39) if case == "scale" else (1e20, None)
    q, k, _ = (t.to(dev) for t in qkv(gen, Nq=5, Nk=7, D=16, mag=mag))
    v = torch.randn(k.shape, generator=gen).to(dev)
    with pytest.raises(ValueError, match="overflow"):
        ft.triton_attention(q, k, v, scale=scale)
    q, k, v = (t.requires_grad_() for t in qkv(gen, Nq=5, Nk=7, D=16))
    o, lse = tk.triton_forward(q, k, v)
    with pytest.raises(ValueError, match="overflow"):
        tk.triton_backward(q, k, v, o, lse, torch.full_like(q, 3e38), scale=None)


# --- 8. colab sync on files that are not notebooks ---------------------------------------------------

@pytest.mark.parametrize("make, words", [
    (lambda p: p.write_text(json.dumps({"a": 1})), "is not a valid Jupyter notebook"),
    (lambda p: p.write_text("[1, 2]"), "is not a valid Jupyter notebook"),
    (lambda p: p.write_text("not json"), "is not a valid Jupyter notebook"),
    (lambda p: p.mkdir(), "is not a notebook file"),
])
def test_colab_sync_on_a_bad_notebook_says_what_is_wrong(tmp_path, make, words):
    (tmp_path / "_config.yml").write_text((ROOT / "_config.yml").read_text())
    (tmp_path / "notebooks").mkdir()
    make(tmp_path / "notebooks" / "01_bad.ipynb")
    proc = subprocess.run([sys.executable, "-m", "flashtut.colab", "sync", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr


# --- 14. the book's notebook kernels do not warn about their transport ------------------------------

def test_book_extension_gives_kernels_an_encrypted_transport(monkeypatch):
    zmq = pytest.importorskip("zmq")
    manager = pytest.importorskip("jupyter_client.manager")
    if not zmq.has("curve"):
        pytest.skip("this pyzmq has no CurveZMQ")
    trait = manager.KernelManager.class_traits()["transport_encryption"]
    monkeypatch.setattr(trait, "default_value", trait.default_value)   # restored after the test
    monkeypatch.syspath_prepend(str(ROOT / "book" / "_ext"))
    page_fixes = importlib.import_module("page_fixes")
    assert manager.KernelManager().transport_encryption == "disabled"
    page_fixes._encrypted_kernel_transport()
    assert manager.KernelManager().transport_encryption == "auto"
    assert "page_fixes" in (ROOT / "_config.yml").read_text()

"""Attention for real models: grouped-query heads, both causal alignments, sliding windows,
packed variable-length batches and torch.compile, in the references and the Triton kernels.

Every result is judged against float64: a brute-force loop (one query row at a time, the
visible keys listed explicitly) for the references, and float64 naive attention for the
kernels. CPU tests run the Triton kernels through the interpreter at tiny odd sizes; ``gpu``
tests run them, fp16 and bf16, against the accuracy criterion on the device.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import flashtut
from flashtut import tiled
from flashtut.triton import attention as tk

CPU = not torch.cuda.is_available()
ALIGNMENTS = [False, True, "top-left", "bottom-right"]


def _rand(gen, *shape, dtype=torch.float64, device="cpu"):
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def _qkv(gen, B, H, Hkv, Nq, Nk, D, dtype=torch.float64, device="cpu"):
    return (_rand(gen, B, H, Nq, D, dtype=dtype, device=device),
            _rand(gen, B, Hkv, Nk, D, dtype=dtype, device=device),
            _rand(gen, B, Hkv, Nk, D, dtype=dtype, device=device))


def _brute_force(q, k, v, causal, window, scale=None):
    """One query row at a time over an explicit list of visible keys (float64)."""
    B, H, Nq, D = q.shape
    Nk, group = k.shape[2], H // k.shape[1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    off = Nk - Nq if causal == "bottom-right" else 0
    o = torch.zeros(B, H, Nq, D, dtype=torch.float64)
    lse = torch.full((B, H, Nq), float("-inf"), dtype=torch.float64)
    for h in range(H):
        for i in range(Nq):
            js = [j for j in range(Nk) if not causal or
                  (j <= i + off and (window is None or j > i + off - window))]
            if not js:
                continue
            s = torch.einsum("bd,bjd->bj", q[:, h, i].double(), k[:, h // group, js].double()) * scale
            o[:, h, i] = torch.einsum("bj,bjd->bd", torch.softmax(s, -1), v[:, h // group, js].double())
            lse[:, h, i] = torch.logsumexp(s, -1)
    return o, lse


def _grads64(q, k, v, do, causal, window, scale=None):
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o = flashtut.naive_attention(q64, k64, v64, causal=causal, scale=scale, window=window)
    return (o.detach(), *torch.autograd.grad(o, (q64, k64, v64), do.double()))


def _err(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max())


def _same_lse(got, want, tol):
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    fin = torch.isfinite(want)
    assert _err(got[fin], want[fin]) < tol


# (Nq, Nk, H, Hkv, causal, window): odd sizes, Nq != Nk both ways, rows that see no key
# (bottom-right with Nq > Nk; a window with top-left and Nq > Nk), MQA, GQA and MHA
REF_CASES = [
    (7, 13, 4, 1, False, None),
    (13, 7, 4, 2, False, None),
    (11, 19, 4, 2, True, None),
    (19, 11, 4, 4, "top-left", 3),
    (11, 19, 6, 2, "bottom-right", None),
    (19, 11, 6, 3, "bottom-right", None),
    (17, 17, 4, 1, "bottom-right", 5),
    (9, 23, 4, 2, "bottom-right", 4),
    (23, 9, 2, 1, "bottom-right", 2),
    (15, 21, 4, 2, True, 6),
]
_ids = ["q{}k{}H{}kv{}-{}-w{}".format(*c) for c in REF_CASES]


# ---------------------------------------------------------------- argument checks ----

def test_check_mask_normalises_every_spelling():
    from flashtut.checks import check_mask
    assert check_mask(False) == (None, None)
    assert check_mask(True) == ("top-left", None)
    assert check_mask(np.bool_(True)) == ("top-left", None)
    assert check_mask(np.bool_(False)) == (None, None)
    assert check_mask("top-left", 4) == ("top-left", 4)
    assert check_mask("bottom-right", np.int64(3)) == ("bottom-right", 3)


def _all_fns():
    def tiled_bwd(q, k, v, **kw):
        o, lse = flashtut.tiled_attention(q, k, v, return_lse=True)
        return flashtut.tiled_attention_backward(q, k, v, o, lse, torch.ones_like(o), **kw)

    def lse(q, k, v, **kw):
        return flashtut.attention_lse(q, k, **kw)
    fns = [flashtut.naive_attention, flashtut.tiled_attention, tiled_bwd, lse]
    if CPU:
        fns.append(flashtut.triton_attention)
    return fns


@pytest.mark.parametrize("fn", _all_fns(), ids=lambda f: f.__name__)
def test_every_function_checks_the_new_arguments_the_same_way(fn):
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(gen, 1, 4, 2, 5, 6, 16, dtype=torch.float32)
    fn(q, k, v, causal=np.bool_(True))                    # numpy bools work
    with pytest.raises(TypeError, match="causal must be a bool.*got int"):
        fn(q, k, v, causal=2)
    with pytest.raises(ValueError, match="causal must be False, True, 'top-left' or 'bottom-right'"):
        fn(q, k, v, causal="bottom-left")
    with pytest.raises(ValueError, match="window"):
        fn(q, k, v, causal=True, window=0)
    with pytest.raises(ValueError, match="window=3 needs a causal alignment"):
        fn(q, k, v, window=3)
    with pytest.raises(TypeError, match="window must be None or a positive int"):
        fn(q, k, v, causal=True, window=2.5)
    with pytest.raises(ValueError, match="heads: q has H = 4 heads and k, v have Hkv = 3"):
        fn(q, k[:, :1].expand(1, 3, 6, 16), v[:, :1].expand(1, 3, 6, 16))


# ------------------------------------------------------------------ the references ----

@pytest.mark.parametrize("case", REF_CASES, ids=_ids)
def test_references_against_brute_force(case):
    Nq, Nk, H, Hkv, causal, window = case
    gen = torch.Generator().manual_seed(Nq * 31 + Nk)
    q, k, v = _qkv(gen, 2, H, Hkv, Nq, Nk, 24)
    do = _rand(gen, 2, H, Nq, 24)
    o_bf, lse_bf = _brute_force(q, k, v, causal, window)
    assert _err(flashtut.naive_attention(q, k, v, causal=causal, window=window), o_bf) < 1e-12
    _same_lse(flashtut.attention_lse(q, k, causal=causal, window=window), lse_bf, 1e-12)
    o, lse = flashtut.tiled_attention(q, k, v, causal=causal, window=window, block_m=4, block_n=3,
                                      return_lse=True)
    assert _err(o, o_bf) < 1e-12
    _same_lse(lse, lse_bf, 1e-12)
    _, gq, gk, gv = _grads64(q, k, v, do, causal, window)
    dq, dk, dv = flashtut.tiled_attention_backward(q, k, v, o, lse, do, causal=causal, window=window,
                                                   block_m=5, block_n=4)
    assert dk.shape == k.shape and dv.shape == v.shape
    for got, want in ((dq, gq), (dk, gk), (dv, gv)):
        assert torch.isfinite(want).all() and _err(got, want) < 1e-12


def test_rows_that_see_no_key_give_zero_output_and_gradients():
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(gen, 1, 2, 1, 10, 4, 16)        # bottom-right: rows 0..5 see no key
    o, lse = flashtut.tiled_attention(q, k, v, causal="bottom-right", return_lse=True, block_m=4)
    assert torch.isneginf(lse[..., :6]).all() and torch.isfinite(lse[..., 6:]).all()
    assert (o[..., :6, :] == 0).all()
    assert (flashtut.naive_attention(q, k, v, causal="bottom-right")[..., :6, :] == 0).all()
    do = _rand(gen, 1, 2, 10, 16)
    dq, dk, dv = flashtut.tiled_attention_backward(q, k, v, o, lse, do, causal="bottom-right")
    assert (dq[..., :6, :] == 0).all() and all(torch.isfinite(t).all() for t in (dq, dk, dv))


def test_old_arguments_unchanged_bit_for_bit():
    gen = torch.Generator().manual_seed(4)
    q, k, v = _qkv(gen, 2, 3, 3, 13, 17, 16, dtype=torch.float32)
    for causal in (False, True):
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.25
        if causal:
            s = s.masked_fill(torch.ones(13, 17, dtype=torch.bool).triu(1), float("-inf"))
        want = torch.matmul(torch.softmax(s, -1), v)
        assert torch.equal(flashtut.naive_attention(q, k, v, causal=causal), want)
        assert torch.equal(flashtut.causal_mask(13, 17), torch.ones(13, 17, dtype=torch.bool).triu(1))


def _visited_key_tiles(monkeypatch, **kw):
    """How many key tiles the tiled forward computes (it expands one K tile per visit)."""
    count = []
    real = tiled._expand_heads

    def counting(t, group):
        count.append(t.shape[2])
        return real(t, group)
    monkeypatch.setattr(tiled, "_expand_heads", counting)
    gen = torch.Generator().manual_seed(5)
    q, k, v = _qkv(gen, 1, 1, 1, kw.pop("Nq"), kw.pop("Nk"), 8)
    flashtut.tiled_attention(q, k, v, **kw)
    return len(count) // 2                                  # K and V tiles


def test_tiled_loops_skip_blocks_outside_the_diagonal_and_window(monkeypatch):
    # 64 queries x 64 keys in 8 x 8 tiles of 8: 64 tiles without a mask
    assert _visited_key_tiles(monkeypatch, Nq=64, Nk=64, block_m=8, block_n=8) == 64
    assert _visited_key_tiles(monkeypatch, Nq=64, Nk=64, block_m=8, block_n=8, causal=True) == 36
    # a window of 8: each query block sees its diagonal tile and the one before
    assert _visited_key_tiles(monkeypatch, Nq=64, Nk=64, block_m=8, block_n=8, causal=True, window=8) == 15
    # bottom-right, 16 new queries after 48 cached keys: the last 2 query blocks see 7 and 8 tiles
    assert _visited_key_tiles(monkeypatch, Nq=16, Nk=64, block_m=8, block_n=8, causal="bottom-right") == 15
    # bottom-right with more queries than keys: the first query blocks see nothing and cost nothing
    assert _visited_key_tiles(monkeypatch, Nq=64, Nk=16, block_m=8, block_n=8, causal="bottom-right") == 3


# -------------------------------------------------------------- Triton, interpreter ----

# (Nq, Nk, H, Hkv, causal, window, dtype): a covering subset (the interpreter is slow)
TRITON_CASES = [
    (37, 53, 4, 2, False, None, torch.float32),
    (53, 37, 4, 1, True, None, torch.float32),
    (53, 37, 4, 2, "bottom-right", None, torch.float32),
    (29, 61, 2, 2, "bottom-right", None, torch.float16),
    (45, 45, 4, 1, True, 7, torch.float32),
    (40, 20, 4, 2, "top-left", 5, torch.float32),
    (33, 70, 3, 1, "bottom-right", 19, torch.float16),
    (61, 27, 2, 1, "bottom-right", 4, torch.float32),
]


@pytest.mark.skipif(not CPU, reason="interpreter tests; the gpu tests cover the device")
@pytest.mark.parametrize("case", TRITON_CASES, ids=["q{}k{}H{}kv{}-{}-w{}-{}".format(*c[:6], str(c[6])[-7:])
                                                    for c in TRITON_CASES])
def test_triton_interpreter_against_float64(case):
    Nq, Nk, H, Hkv, causal, window, dtype = case
    gen = torch.Generator().manual_seed(Nq + 7 * Nk)
    q, k, v = _qkv(gen, 2, H, Hkv, Nq, Nk, 24, dtype=dtype)
    do = _rand(gen, 2, H, Nq, 24, dtype=dtype)
    ro, rq, rk, rv = _grads64(q, k, v, do, causal, window)
    _, rlse = _brute_force(q, k, v, causal, window)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flashtut.triton_attention(qq, kk, vv, causal=causal, window=window)
    o.backward(do)
    _, lse = tk.triton_forward(q, k, v, causal=causal, window=window)
    tol, gtol = (2e-5, 5e-5) if dtype == torch.float32 else (4e-3, 2e-2)
    assert o.dtype == dtype and _err(o, ro) < tol
    _same_lse(lse, rlse.float(), 1e-4)
    for got, want in ((qq.grad, rq), (kk.grad, rk), (vv.grad, rv)):
        assert got.shape == want.shape and torch.isfinite(got).all()
        assert _err(got, want) < gtol * max(1.0, float(want.abs().max()))


@pytest.mark.skipif(not CPU, reason="interpreter test")
@pytest.mark.parametrize("block_m", [16, 32, 64])
@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_triton_every_pinnable_tile_shape_is_right(block_m, block_n):
    """Query blocks taller than key blocks (and the reverse) once double-counted causal dK/dV."""
    gen = torch.Generator().manual_seed(block_m + block_n)
    cfg = tk.TileConfig(block_m, block_n, 1, 1)
    for causal, window, Hkv in ((True, None, 2), ("bottom-right", 21, 1)):
        q, k, v = _qkv(gen, 1, 2, Hkv, 83, 71, 16, dtype=torch.float32)
        do = _rand(gen, 1, 2, 83, 16, dtype=torch.float32)
        ro, rq, rk, rv = _grads64(q, k, v, do, causal, window)
        with tk.use_configs(fwd=cfg, dkdv=cfg, dq=cfg):
            o, lse = tk.triton_forward(q, k, v, causal, window=window)
            grads = tk.triton_backward(q, k, v, o, lse, do, causal, window=window)
        assert _err(o, ro) < 2e-5
        for got, want in zip(grads, (rq, rk, rv)):
            assert _err(got, want) < 5e-5, (causal, block_m, block_n)


@pytest.mark.parametrize("bad, match", [
    (tk.TileConfig(24, 16, 1, 1), "block_m must be a power of two >= 16, got 24"),
    (tk.TileConfig(16, 8, 1, 1), "block_n must be a power of two >= 16, got 8"),
    (tk.TileConfig(16, 16, 3, 1), "num_warps must be a power of two"),
    (tk.TileConfig(16, 16, 1, 0), "num_stages must be a positive int"),
])
def test_unrunnable_tile_shapes_are_value_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        with tk.use_configs(dkdv=bad):
            pass


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_triton_rows_that_see_no_key():
    gen = torch.Generator().manual_seed(8)
    q, k, v = _qkv(gen, 1, 2, 1, 40, 9, 16, dtype=torch.float32)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    o = flashtut.triton_attention(q, k, v, causal="bottom-right")
    o.backward(torch.ones_like(o))
    _, lse = tk.triton_forward(q.detach(), k.detach(), v.detach(), "bottom-right")
    assert (o[..., :31, :] == 0).all() and torch.isneginf(lse[..., :31]).all()
    assert (q.grad[..., :31, :] == 0).all()
    assert all(torch.isfinite(t).all() for t in (o, q.grad, k.grad, v.grad))


# ------------------------------------------------------------------ packed batches ----

def _packed(gen, lens_q, lens_k, H, Hkv, D, dtype=torch.float32, device="cpu"):
    cu = [torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32, device=device)
          for lens in (lens_q, lens_k)]
    q = _rand(gen, sum(lens_q), H, D, dtype=dtype, device=device)
    k = _rand(gen, sum(lens_k), Hkv, D, dtype=dtype, device=device)
    v = _rand(gen, sum(lens_k), Hkv, D, dtype=dtype, device=device)
    return q, k, v, cu[0], cu[1]


def test_varlen_naive_is_per_sequence_attention():
    gen = torch.Generator().manual_seed(9)
    lens_q, lens_k = [5, 12, 1], [9, 3, 14]
    q, k, v, cq, ck = _packed(gen, lens_q, lens_k, 4, 2, 16, torch.float64)
    o = flashtut.varlen_attention(q, k, v, cq, ck, causal="bottom-right", window=4, backend="naive")
    for b in range(3):
        qs, ks, vs = (t[c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ck), (v, ck)))
        want, _ = _brute_force(qs, ks, vs, "bottom-right", 4)
        assert _err(o[cq[b]:cq[b + 1]], want[0].transpose(0, 1)) < 1e-12


@pytest.mark.skipif(not CPU, reason="interpreter test")
@pytest.mark.parametrize("causal, window", [(False, None), ("bottom-right", None), (True, 6),
                                            ("bottom-right", 4)])
def test_varlen_triton_against_float64(causal, window):
    gen = torch.Generator().manual_seed(10)
    lens_q, lens_k = [5, 0, 17, 33], [9, 4, 17, 20]      # an empty sequence, Nq < Nk, Nq > Nk
    q, k, v, cq, ck = _packed(gen, lens_q, lens_k, 4, 2, 16)
    do = _rand(gen, *q.shape, dtype=torch.float32)
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    want = flashtut.varlen_attention(q64, k64, v64, cq, ck, causal=causal, window=window, backend="naive")
    wq, wk, wv = torch.autograd.grad(want, (q64, k64, v64), do.double())
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flashtut.varlen_attention(qq, kk, vv, cq, ck, causal=causal, window=window)
    o.backward(do)
    assert o.shape == q.shape and _err(o, want) < 2e-5
    for got, w in ((qq.grad, wq), (kk.grad, wk), (vv.grad, wv)):
        assert _err(got, w) < 5e-5


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
@pytest.mark.parametrize("bad, match", [
    (lambda c: c.long(), "must have dtype int32"),
    (lambda c: c + 1, "must start at 0"),
    (lambda c: c.flip(0), "must start at 0|non-decreasing"),
    (lambda c: torch.tensor([0, 9, 4, c[-1]], dtype=torch.int32), "non-decreasing"),
    (lambda c: torch.cat([c[:-1], c[-1:] + 2]), "must end at the number of packed rows"),
    (lambda c: c[::2].contiguous(), "same number of sequences|must end at"),
    (lambda c: c.tolist(), "must be a torch.Tensor"),
])
def test_malformed_cu_seqlens_name_the_argument(name, bad, match):
    gen = torch.Generator().manual_seed(11)
    q, k, v, cq, ck = _packed(gen, [3, 4, 5], [6, 2, 5], 2, 1, 16)
    args = dict(cu_seqlens_q=cq, cu_seqlens_k=ck)
    args[name] = bad(args[name])
    for backend in ("naive", "triton"):
        with pytest.raises((ValueError, TypeError), match=match) as info:
            flashtut.varlen_attention(q, k, v, backend=backend, **args)
        assert name in str(info.value) or "cu_seqlens_q and cu_seqlens_k" in str(info.value)
    with pytest.raises(ValueError, match="backend must be one of"):
        flashtut.varlen_attention(q, k, v, cq, ck, backend="cuda")


# ------------------------------------------------------------------- torch.compile ----

class _TinyAttentionModel(torch.nn.Module):
    def __init__(self, D=16):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)

    def forward(self, q, k, v):
        return flashtut.triton_attention(self.proj(q), k, v, causal="bottom-right").square().sum()


@pytest.mark.skipif(not CPU, reason="the gpu test compiles with inductor on the device")
def test_triton_attention_compiles_without_graph_breaks():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(12)
    q, k, v = _qkv(gen, 1, 4, 2, 9, 13, 16, dtype=torch.float32)
    model = _TinyAttentionModel()
    model(q, k, v)                                            # loads the kernel module
    explained = torch._dynamo.explain(model)(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(q, k, v).backward()
    got = model.proj.weight.grad.clone()
    model.zero_grad()
    model(q, k, v).backward()
    assert _err(got, model.proj.weight.grad) < 1e-6
    assert "flashtut.triton_attention_fwd" in explained.graphs[0].code     # one opaque node


def test_custom_operator_passes_torch_opcheck():
    if not CPU:
        pytest.skip("covered by the gpu test")
    gen = torch.Generator().manual_seed(13)
    q, k, v = _qkv(gen, 1, 2, 1, 7, 9, 16, dtype=torch.float32)
    q.requires_grad_(True)
    torch.library.opcheck(torch.ops.flashtut.triton_attention_fwd.default, (q, k, v, 2, 0.25, 0),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


# ------------------------------------------------------------------------ GPU tests ----

def _lowp_torch_error(q, k, v, do, causal, window, ref):
    """The yardstick: PyTorch attention with every operation in the inputs' precision (fp16/bf16
    matmuls, probabilities rounded before P @ V, gradients by autograd in that precision)."""
    from flashtut.bench.accuracy import lowp_attention
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o = lowp_attention(qq, kk, vv, causal=causal, window=window)
    grads = torch.autograd.grad(o, (qq, kk, vv), do)
    return [_err(a, b) for a, b in zip((o, *grads), ref)]


# no row without keys here: the low-precision yardstick's softmax is NaN on such rows
GPU_CASES = [
    (1000, 1000, 8, 2, True, None),
    (700, 1123, 8, 1, "bottom-right", None),
    (1123, 1123, 8, 4, "bottom-right", 256),
    (513, 2049, 6, 2, "bottom-right", 300),
    (999, 999, 4, 4, True, 100),
    (777, 901, 8, 8, False, None),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D, fused", [(64, False), (128, False), (128, True)],
                         ids=["D64", "D128", "D128-fused"])     # fused: dQ by atomics (use_fused_backward)
@pytest.mark.parametrize("case", GPU_CASES, ids=["q{}k{}H{}kv{}-{}-w{}".format(*c) for c in GPU_CASES])
def test_gpu_triton_accuracy_criterion(case, D, fused, dtype):
    Nq, Nk, H, Hkv, causal, window = case
    gen = torch.Generator().manual_seed(Nq + D)
    q, k, v = _qkv(gen, 2, H, Hkv, Nq, Nk, D, dtype=dtype, device="cuda")
    do = _rand(gen, 2, H, Nq, D, dtype=dtype, device="cuda")
    ref = _grads64(q.float(), k.float(), v.float(), do.float(), causal, window)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flashtut.triton_attention(qq, kk, vv, causal=causal, window=window)
    with tk.use_fused_backward(fused):
        grads = torch.autograd.grad(o, (qq, kk, vv), do)
    ours = [_err(a, b) for a, b in zip((o, *grads), ref)]
    theirs = _lowp_torch_error(q, k, v, do, causal, window, ref)
    for name, a, b in zip(("o", "dq", "dk", "dv"), ours, theirs):
        assert math.isfinite(a) and a <= 2 * b + 1e-3, f"{name}: ours {a:.3e} vs torch {b:.3e}"


@pytest.mark.gpu
def test_gpu_triton_rows_without_keys_and_varlen():
    gen = torch.Generator().manual_seed(21)
    q, k, v = _qkv(gen, 1, 4, 2, 300, 100, 64, dtype=torch.float16, device="cuda")
    qq = q.clone().requires_grad_(True)
    o = flashtut.triton_attention(qq, k, v, causal="bottom-right")
    o.sum().backward()
    assert (o[..., :200, :] == 0).all() and torch.isfinite(qq.grad).all()
    lens_q, lens_k = [1, 300, 77, 1024], [513, 300, 1, 1500]
    q, k, v, cq, ck = _packed(gen, lens_q, lens_k, 8, 2, 128, torch.bfloat16, "cuda")
    do = torch.randn_like(q)
    for causal, window in ((False, None), ("bottom-right", None), ("bottom-right", 128)):
        q32, k32, v32 = (t.float().requires_grad_(True) for t in (q, k, v))
        want = flashtut.varlen_attention(q32, k32, v32, cq, ck, causal=causal, window=window, backend="naive")
        wgrads = torch.autograd.grad(want, (q32, k32, v32), do.float())
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        got = flashtut.varlen_attention(qq, kk, vv, cq, ck, causal=causal, window=window)
        ggrads = torch.autograd.grad(got, (qq, kk, vv), do)
        assert _err(got, want) < 2e-2
        for a, b in zip(ggrads, wgrads):
            assert _err(a, b) < 5e-2 * max(1.0, float(b.abs().max()))


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph_inductor():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(22)
    q, k, v = _qkv(gen, 2, 8, 2, 257, 301, 64, dtype=torch.float16, device="cuda")
    model = _TinyAttentionModel(64).cuda().half()
    model(q, k, v)
    compiled = torch.compile(model, fullgraph=True)
    compiled(q, k, v).backward()
    got = model.proj.weight.grad.clone()
    model.zero_grad()
    model(q, k, v).backward()
    assert _err(got, model.proj.weight.grad) < 1e-2 * max(1.0, float(got.abs().max()))


@pytest.mark.gpu
def test_gpu_64bit_row_offsets():
    """A (B, N, H, D)-strided view whose row offsets pass 2**31 elements (4 GiB of K in fp16)."""
    torch.manual_seed(23)
    H, D, Nk, Nq = 128, 128, 131072 + 17, 16
    k = torch.randn(1, Nk, H, D, device="cuda", dtype=torch.float16).transpose(1, 2)
    v = torch.randn(1, Nk, H, D, device="cuda", dtype=torch.float16).transpose(1, 2)
    assert (Nk - 1) * k.stride(2) >= 2 ** 31
    q = torch.randn(1, H, Nq, D, device="cuda", dtype=torch.float16)
    o, lse = tk.triton_forward(q, k, v, "bottom-right", window=300)
    heads = [0, 77, 127]
    for h in heads:                           # float32 reference head by head
        ks, vs = k[:, h:h + 1, -400:].float(), v[:, h:h + 1, -400:].float()
        want = flashtut.naive_attention(q[:, h:h + 1].float(), ks, vs, causal="bottom-right", window=300)
        assert _err(o[:, h:h + 1], want) < 2e-2
    do = torch.randn_like(q)
    dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, "bottom-right", window=300)
    assert float(dk[:, :, :-400].abs().max()) == 0.0 and float(dk[:, :, -300:].abs().max()) > 0
    del k, v, dk, dv
    torch.cuda.empty_cache()


# ------------------------------------------------------------- CUDA kernels (GPU) ----

CUDA_CASES = [   # (Nq, Nk, H, Hkv, causal): odd sizes, Nq != Nk both ways, Hkv in {1, 2, H}
    (333, 517, 4, 1, False),
    (517, 333, 4, 2, True),
    (300, 701, 6, 2, "bottom-right"),
    (257, 257, 4, 4, "bottom-right"),
    (129, 1000, 8, 1, "bottom-right"),
    (700, 700, 8, 2, "top-left"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("case", CUDA_CASES, ids=["q{}k{}H{}kv{}-{}".format(*c) for c in CUDA_CASES])
def test_gpu_cuda_grouped_query_and_alignments(case, D, dtype):
    Nq, Nk, H, Hkv, causal = case
    gen = torch.Generator().manual_seed(Nq * 3 + D)
    q, k, v = _qkv(gen, 2, H, Hkv, Nq, Nk, D, dtype=dtype, device="cuda")
    do = _rand(gen, 2, H, Nq, D, dtype=dtype, device="cuda")
    ref = _grads64(q.float(), k.float(), v.float(), do.float(), causal, None)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flashtut.cuda_attention(qq, kk, vv, causal=causal)
    grads = torch.autograd.grad(o, (qq, kk, vv), do)
    assert grads[1].shape == k.shape and grads[2].shape == v.shape
    ours = [_err(a, b) for a, b in zip((o, *grads), ref)]
    theirs = _lowp_torch_error(q, k, v, do, causal, None, ref)
    for name, a, b in zip(("o", "dq", "dk", "dv"), ours, theirs):
        assert math.isfinite(a) and a <= 2 * b + 1e-3, f"{name}: ours {a:.3e} vs torch {b:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("atomic", [False, True], ids=["dq-pass", "dq-atomic"])
def test_gpu_cuda_rows_without_keys_and_lse(atomic):
    from dataclasses import replace

    from flashtut.cuda import attention as ca
    from flashtut.cuda import configs as cc
    gen = torch.Generator().manual_seed(31)
    q, k, v = _qkv(gen, 1, 4, 2, 300, 123, 64, dtype=torch.float16, device="cuda")
    do = _rand(gen, 1, 4, 300, 64, dtype=torch.float16, device="cuda")
    o, lse = ca.cuda_forward(q, k, v, causal="bottom-right")
    want_lse = flashtut.attention_lse(q.float(), k.float(), causal="bottom-right")
    assert (o[..., :177, :] == 0).all() and torch.isneginf(lse[..., :177]).all()
    assert _err(lse[..., 177:], want_lse[..., 177:]) < 2e-2
    cfg = replace(cc.pick_config(64, 90 if torch.cuda.get_device_capability()[0] >= 9 else 80,
                                 48 * 1024), dq_atomic=atomic)
    dq, dk, dv = ca.cuda_backward(q, k, v, o, lse, do, causal="bottom-right", config=cfg)
    ref = _grads64(q.float(), k.float(), v.float(), do.float(), "bottom-right", None)
    assert (dq[..., :177, :] == 0).all()
    for got, want in zip((dq, dk, dv), ref[1:]):
        assert torch.isfinite(got).all() and _err(got, want) < 5e-2 * max(1.0, float(want.abs().max()))
    with pytest.raises(ValueError, match="window=8 is not supported by the CUDA kernels"):
        flashtut.cuda_attention(q, k, v, causal=True, window=8)
    with pytest.raises(ValueError, match="variant 'v1' takes k and v with q's heads"):
        ca.cuda_forward(q, k, v, variant="v1")


# ------------------------------------------------------------------ benchmark preset ----

@pytest.mark.parametrize("Nq, Nk, causal, window", [
    (37, 53, False, None), (53, 37, True, None), (37, 53, "bottom-right", None),
    (53, 37, "bottom-right", None), (64, 64, True, 16), (20, 70, "bottom-right", 9), (70, 20, True, 5)])
def test_visible_flops_count_exactly_the_visible_keys(Nq, Nk, causal, window):
    from flashtut.costs.flops import attention_flops, visible_attention_flops, visible_pairs
    off = Nk - Nq if causal == "bottom-right" else 0
    hidden = flashtut.causal_mask(Nq, Nk, diag_offset=off, window=window) if causal else torch.zeros(Nq, Nk, dtype=bool)
    assert visible_pairs(Nq, Nk, causal, window) == int((~hidden).sum())
    assert visible_attention_flops(2, 3, Nq, Nk, 16, causal, window, "bwd") == \
        2.5 * 4 * 2 * 3 * 16 * int((~hidden).sum())
    if not causal:
        assert visible_attention_flops(2, 3, Nq, Nk, 16) == attention_flops(2, 3, Nq, Nk, 16)


@pytest.mark.skipif(not CPU, reason="the CPU run of the preset's machinery (Triton interpreter)")
def test_real_models_preset_checks_and_records_every_row(monkeypatch):
    from flashtut.bench import real_models
    from flashtut.bench.results import check_row
    calls = []

    def once(fn, device, warmup_ms=0, rep_ms=0, grad_to_none=None):      # one call, not a timing loop
        fn()
        calls.append(1)
        return 2.0
    monkeypatch.setattr(real_models, "time_fn", once)
    rows = real_models.run_real_models("cpu", small=True)
    assert len(rows) == 2 * (2 + 2 + 3) and len(calls) == len(rows)
    assert all(r["status"] == "ok" and check_row(r) is None for r in rows), [r["reason"] for r in rows]
    win = [r for r in rows if r["group"] == "window" and r["mode"] == "fwd"]
    # the windowed Triton row is credited its visible keys only, SDPA (no window) the full causal work
    assert win[0]["window"] == 12 and win[1]["window"] is None and win[0]["flops"] < win[1]["flops"]
    packed = [r for r in rows if r["group"] == "varlen"]
    assert {r["layout"] for r in packed} == {"packed", "padded"}
    assert len({r["flops"] for r in packed if r["mode"] == "fwd"}) == 1      # the real tokens' FLOPs
    assert all("x sdpa" in line for line in real_models.summary(rows))


def test_real_models_cli_needs_a_gpu_or_small():
    from flashtut.bench.cli import main
    if not CPU:
        pytest.skip("on a GPU the full run is allowed")
    with pytest.raises(SystemExit):
        main(["real-models", "--device", "cpu"])


# ------------------------------------- the fused backward (dQ by atomics) and tile choice ----

FUSED_CASES = [
    (45, 45, 4, 1, True, 7, torch.float32),
    (33, 70, 3, 1, "bottom-right", 19, torch.float16),
    (61, 27, 2, 1, "bottom-right", None, torch.float32),    # rows that see no key
    (37, 53, 4, 2, False, None, torch.float32),
]


@pytest.mark.skipif(not CPU, reason="interpreter test; the gpu test below runs the same switch")
@pytest.mark.parametrize("case", FUSED_CASES, ids=["q{}k{}H{}kv{}-{}-w{}-{}".format(*c[:6], str(c[6])[-7:])
                                                   for c in FUSED_CASES])
def test_triton_fused_backward_against_float64(case):
    Nq, Nk, H, Hkv, causal, window, dtype = case
    gen = torch.Generator().manual_seed(3 * Nq + Nk)
    q, k, v = _qkv(gen, 2, H, Hkv, Nq, Nk, 24, dtype=dtype)
    do = _rand(gen, 2, H, Nq, 24, dtype=dtype)
    _, rq, rk, rv = _grads64(q, k, v, do, causal, window)
    o, lse = tk.triton_forward(q, k, v, causal=causal, window=window)
    with tk.use_fused_backward(True):
        plan = tk._BackwardPlan(q, k, v, o, lse, do, flashtut.checks.check_mask(causal, window), 24 ** -0.5)
        grads = tk.triton_backward(q, k, v, o, lse, do, causal=causal, window=window)
    assert plan.fused and plan.dq_acc.dtype == torch.float32
    gtol = 5e-5 if dtype == torch.float32 else 2e-2
    for got, want in zip(grads, (rq, rk, rv)):
        assert got.dtype == dtype and got.shape == want.shape and torch.isfinite(got).all()
        assert _err(got, want) < gtol * max(1.0, float(want.abs().max()))


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_triton_fused_backward_packed_batches():
    gen = torch.Generator().manual_seed(31)
    q, k, v, cq, ck = _packed(gen, [5, 23, 1, 17], [9, 23, 4, 30], 4, 2, 16)
    do = torch.randn(q.shape, generator=gen)
    for causal, window in ((False, None), ("bottom-right", 6)):
        q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
        want = flashtut.varlen_attention(q64, k64, v64, cq, ck, causal=causal, window=window, backend="naive")
        wgrads = torch.autograd.grad(want, (q64, k64, v64), do.double())
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        with tk.use_fused_backward(True):
            got = flashtut.varlen_attention(qq, kk, vv, cq, ck, causal=causal, window=window)
            ggrads = torch.autograd.grad(got, (qq, kk, vv), do)
        for a, b in zip(ggrads, wgrads):
            assert _err(a, b) < 5e-5 * max(1.0, float(b.abs().max())), (causal, window)


@pytest.mark.skipif(not CPU, reason="interpreter test; test_gpu_64bit_row_offsets covers the device")
def test_triton_dkdv_paths_agree(monkeypatch):
    """The dK/dV kernel has a grouped and an ungrouped path, and 32- and 64-bit query addressing
    (64-bit only past 2**31 elements: forced here): all give the float64 gradients."""
    gen = torch.Generator().manual_seed(17)
    for Hkv, causal, window in ((2, "bottom-right", 9), (4, True, None)):
        q, k, v = _qkv(gen, 2, 4, Hkv, 41, 35, 16, dtype=torch.float32)
        do = _rand(gen, 2, 4, 41, 16, dtype=torch.float32)
        _, rq, rk, rv = _grads64(q, k, v, do, causal, window)
        o, lse = tk.triton_forward(q, k, v, causal=causal, window=window)
        for wide_from in (2 ** 31, 0):
            monkeypatch.setattr(tk, "_WIDE_ROWS_FROM", wide_from)
            plan = tk._BackwardPlan(q, k, v, o, lse, do, flashtut.checks.check_mask(causal, window), 0.25)
            assert plan.dkdv_meta["WIDE_ROWS"] == (wide_from == 0)
            assert plan.dkdv_meta["GROUPED"] == (Hkv < 4)
            for got, want in zip(plan.run(), (rq, rk, rv)):
                assert _err(got, want) < 5e-5, (Hkv, wide_from)


def test_fused_backward_switch_nests_and_defaults_off():
    assert not tk._FUSED_DQ
    with tk.use_fused_backward():
        with tk.use_fused_backward(False):
            assert tk._FUSED_DQ[-1] is False
        assert tk._FUSED_DQ[-1] is True
    assert not tk._FUSED_DQ
    with pytest.raises((TypeError, ValueError), match="enabled"):
        with tk.use_fused_backward("yes"):
            pass
    # measured on the H200: the two deterministic kernels are faster, so they are the default
    for window in (False, True):
        assert not tk.configs.fused_backward_default((9, 0), False, True, window)


def test_window_moves_its_measured_tile_first():
    from flashtut.triton import configs
    assert configs.search_space("dq", (9, 0), False, 128, window=True) == \
        configs.search_space("dq", (9, 0), False, 128)                          # no override measured
    for kernel in ("dkdv",):
        plain = configs.search_space(kernel, (9, 0), False, 128)
        windowed = configs.search_space(kernel, (9, 0), False, 128, window=True)
        assert windowed[0] == configs.WINDOW_FIRST[kernel, "hopper", "large"] != plain[0]
        assert sorted(map(tuple_of, plain)) == sorted(map(tuple_of, windowed))    # same entries, reordered
        assert configs.search_space(kernel, (8, 0), False, 128, window=True) == \
            configs.search_space(kernel, (8, 0), False, 128)                    # no measurement there


def tuple_of(c):
    return (c.block_m, c.block_n, c.num_warps, c.num_stages)


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_backward_guard_reads_one_flag_and_half_precision_not_even_that(monkeypatch):
    """The gradients are never read a second time: the kernels flag non-finite ones, the guard gets
    that one int32, and reads it (one small sync) only where the scores can overflow (not float16)."""
    from flashtut.checks import scores_can_overflow
    checked = []
    monkeypatch.setattr(tk, "raise_if_flagged", lambda flag, dtype, scale, D, what, *a: checked.append(
        (dtype, what, tuple(flag.shape), flag.dtype, scores_can_overflow(dtype, scale, D))))
    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.float16, torch.float32):
        q, k, v = _qkv(gen, 1, 2, 1, 19, 23, 16, dtype=dtype)
        do = _rand(gen, 1, 2, 19, 16, dtype=dtype)
        o, lse = tk.triton_forward(q, k, v, causal=True, window=5)
        tk.triton_backward(q, k, v, o, lse, do, causal=True, window=5)
    assert checked == [(torch.float16, "gradients", (1,), torch.int32, False),
                       (torch.float32, "gradients", (1,), torch.int32, True)]


@pytest.mark.gpu
def test_gpu_default_backward_is_deterministic_with_a_window():
    gen = torch.Generator().manual_seed(41)
    q, k, v = _qkv(gen, 1, 8, 2, 1500, 1500, 128, dtype=torch.float16, device="cuda")
    do = _rand(gen, 1, 8, 1500, 128, dtype=torch.float16, device="cuda")
    o, lse = tk.triton_forward(q, k, v, causal=True, window=300)
    first = tk.triton_backward(q, k, v, o, lse, do, causal=True, window=300)
    again = tk.triton_backward(q, k, v, o, lse, do, causal=True, window=300)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_real_models_summary_rows_read_the_committed_run():
    from flashtut.bench.real_models import summary_rows
    from flashtut.results_data import load_results

    rows, _ = load_results("real_models_h200.json")
    header, body = summary_rows(rows)
    ours = [r for r in rows if not r["impl"].startswith("sdpa")]
    assert len(body) == len(ours) and all(len(line) == len(header) for line in body)
    window_bwd = next(r for r in ours if r["group"] == "window" and r["mode"] == "bwd")
    sdpa_bwd = next(r for r in rows if r["group"] == "window" and r["mode"] == "bwd" and r["impl"] == "sdpa-flash")
    line = next(b for b in body if b[0].startswith("window") and b[1] == "bwd")
    assert line[-1] == f"{window_bwd['tflops'] / sdpa_bwd['tflops']:.2f}"
    # the bar: every kernel row at least as fast as SDPA flash on the same work
    assert all(float(b[-1]) >= 1.0 for b in body), body
    failed = [dict(ours[0], status="oom", reason="out of memory")] + rows
    assert summary_rows(failed)[1][0][4] == "oom"

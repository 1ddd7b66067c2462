"""Tests of the Triton kernels (``flashtut.triton``).

Without a GPU, conftest sets TRITON_INTERPRET=1 before triton is imported, so the CPU tests
below run the very kernels through Triton's interpreter, at tiny sizes (fp32, fp16).
Both are judged by the book's one accuracy yardstick (``flashtut.bench.accuracy.yardstick``,
the criterion of the flash-attn repository's tests): our max error against a float32 (on the CPU
float64) reference is at most twice that of PyTorch attention computed in the input precision,
plus a small absolute slack; the ratio to SDPA's math backend is printed beside it. The ``gpu``
tests run at realistic sizes, every dtype, head dim and causal setting.
"""
from __future__ import annotations

import os
import subprocess
import math
import sys
import types

import pytest
import torch

import flashtut
from flashtut.bench.accuracy import yardstick
from flashtut.triton import attention as tk
from flashtut.triton import configs as tconfigs

CPU = not torch.cuda.is_available()
DEV = "cpu" if CPU else "cuda"


def _qkvd(gen, B, H, Nq, Nk, D, dtype, device="cpu", spread=1.0):
    shapes = [(B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, D), (B, H, Nq, D)]
    q, k, v, do = (torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes)
    q = q * spread
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, do)]


def _reference(q, k, v, do, causal, scale):
    """float64 forward (o, lse) and gradients via autograd of naive attention."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o = flashtut.naive_attention(q64, k64, v64, causal, scale)
    lse = flashtut.attention_lse(q64, k64, causal, scale).detach()
    dq, dk, dv = torch.autograd.grad(o, (q64, k64, v64), do.double())
    return o.detach(), lse, dq, dk, dv


def _maxerr(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max())


def _assert_yardstick(name, q, k, v, o, causal, scale, grads=None, do=None):
    y = yardstick(q.detach(), k.detach(), v.detach(), o, grads, do, causal, scale)
    print(f"\n[accuracy] {name}: " + "; ".join(
        f"{n} {y.ratio(n):.2f}x PyTorch {str(q.dtype)[6:]}, {y.ratio(n, 'math'):.2f}x SDPA math" for n in y.err))
    assert y.passed, f"{name}:\n{y}"
    return y


# ---------------------------------------------------------------- CPU: the interpreter ----

# (B, H, Nq, Nk, D, causal, scale): odd lengths, Nq != Nk both ways, one block or several,
# head dims 16/32/64 and a padded 24
CPU_CASES = [
    (1, 2, 37, 53, 32, False, None),
    (2, 1, 50, 29, 16, True, 0.3),
    (1, 1, 45, 45, 64, True, None),
    (1, 2, 70, 33, 24, True, None),
    (2, 1, 17, 80, 16, False, 1.7),
    (1, 1, 1, 19, 32, True, None),
]


@pytest.mark.skipif(not CPU, reason="interpreter tests; the GPU tests cover CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: "B{}H{}q{}k{}d{}{}".format(*c[:5], "c" if c[5] else ""))
def test_interpreter_forward_backward(gen, case, dtype):
    B, H, Nq, Nk, D, causal, scale = case
    q, k, v, do = _qkvd(gen, B, H, Nq, Nk, D, dtype)
    _, rlse, *_ = _reference(q, k, v, do, causal, scale)
    o, lse = tk.triton_forward(q, k, v, causal, scale)
    assert o.dtype == dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (B, H, Nq)
    dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, causal, scale)
    assert _maxerr(lse, rlse) < 1e-4
    for got, like in ((dq, q), (dk, k), (dv, v)):
        assert got.dtype == dtype and got.shape == like.shape
    _assert_yardstick(f"interpreter {case} {dtype}", q, k, v, o, causal, scale, (dq, dk, dv), do)


# head dims above 128, as FlashAttention accepts them: 256, and dims padded to it (multiples of 8 and 16)
WIDE_CASES = [(160, torch.float16, True), (192, torch.float32, False), (200, torch.float16, False),
              (224, torch.float16, True), (256, torch.float32, True), (256, torch.float16, False)]


@pytest.mark.skipif(not CPU, reason="interpreter tests; the GPU tests cover CUDA")
@pytest.mark.parametrize("D, dtype, causal", WIDE_CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_interpreter_head_dims_up_to_256(gen, D, dtype, causal):
    q, k, v, do = _qkvd(gen, 1, 2, 37, 29, D, dtype)
    o, lse = tk.triton_forward(q, k, v, causal)
    dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, causal)
    _, rlse, *_ = _reference(q, k, v, do, causal, None)
    assert _maxerr(lse[..., 8:] if causal else lse, rlse[..., 8:] if causal else rlse) < 1e-4
    for got, like in ((o, q), (dq, q), (dk, k), (dv, v)):
        assert got.dtype == dtype and got.shape == like.shape
    _assert_yardstick(f"interpreter D={D} {dtype} causal={causal}", q, k, v, o, causal, None, (dq, dk, dv), do)


@pytest.mark.skipif(not CPU, reason="interpreter test")
@pytest.mark.parametrize("causal", [False, True])
def test_interpreter_autograd_saves_only_qkvo_lse(gen, causal):
    q, k, v, do = _qkvd(gen, 1, 2, 41, 35, 32, torch.float32)
    ro, _, rdq, rdk, rdv = _reference(q, k, v, do, causal, None)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    o = flashtut.triton_attention(q, k, v, causal=causal)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5                                   # q, k, v, o, lse and nothing N x N
    assert all(t.numel() <= max(q.numel(), k.numel()) for t in saved)
    o.backward(do)
    assert _maxerr(o, ro) < 2e-5
    for got, want in ((q.grad, rdq), (k.grad, rdk), (v.grad, rdv)):
        assert _maxerr(got, want) < 5e-5


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_interpreter_other_tile_shapes_agree(gen):
    """Any tile configuration computes the same function (exercised with use_configs)."""
    q, k, v, do = _qkvd(gen, 1, 1, 61, 47, 32, torch.float32)
    ro, _, rdq, rdk, rdv = _reference(q, k, v, do, True, None)
    cfg = tk.TileConfig
    with tk.use_configs(fwd=cfg(32, 16, 1, 1), dkdv=cfg(16, 16, 1, 1), dq=cfg(16, 32, 1, 1)):
        o, lse = tk.triton_forward(q, k, v, True)
        dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, True)
    assert _maxerr(o, ro) < 2e-5
    for got, want in ((dq, rdq), (dk, rdk), (dv, rdv)):
        assert _maxerr(got, want) < 5e-5
    with pytest.raises(ValueError, match="fwd, dkdv and dq"):
        with tk.use_configs(bwd=cfg(16, 16, 1, 1)):
            pass
    with pytest.raises(TypeError, match="fwd must be a TileConfig"):
        with tk.use_configs(fwd=(16, 16, 1, 1)):
            pass


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_interpreter_large_logits_stay_finite(gen):
    # scores of several hundred: exp overflows without the running max
    q, k, v, do = _qkvd(gen, 1, 1, 33, 40, 16, torch.float32, spread=30.0)
    ro, rlse, rdq, rdk, rdv = _reference(q, k, v, do, False, None)
    o, lse = tk.triton_forward(q, k, v)
    dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do)
    assert float(rlse.abs().max()) > 100
    for t in (o, lse, dq, dk, dv):
        assert torch.isfinite(t).all()
    assert _maxerr(o, ro) < 1e-4
    assert _maxerr(lse, rlse) < 1e-3
    assert _maxerr(dv, rdv) < 1e-4


@pytest.mark.skipif(not CPU, reason="interpreter test")
def test_interpreter_matches_tiled_attention(gen):
    q, k, v, _ = _qkvd(gen, 2, 2, 30, 30, 16, torch.float32)
    o_t = flashtut.triton_attention(q, k, v, causal=True)
    o_ref = flashtut.tiled_attention(q, k, v, causal=True, block_m=16, block_n=16)
    assert _maxerr(o_t, o_ref) < 1e-5


# ------------------------------------------------------------------------ input checks ----

def test_rejects_non_tensor():
    x = torch.randn(1, 1, 4, 16)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        tk.triton_attention(x, [1.0], x)


@pytest.mark.parametrize("bad, match", [
    (dict(q=torch.randn(1, 4, 16)), "q must be a 4-D tensor"),
    (dict(k=torch.randn(1, 1, 5, 32)), "head dim D must match"),
    (dict(q=torch.randn(1, 1, 4, 16, dtype=torch.float64), k=torch.randn(1, 1, 5, 16, dtype=torch.float64),
          v=torch.randn(1, 1, 5, 16, dtype=torch.float64)), "accept float16, bfloat16 or float32"),
    (dict(q=torch.randn(1, 1, 4, 264), k=torch.randn(1, 1, 5, 264), v=torch.randn(1, 1, 5, 264)),
     "head dim D = 264 is not supported.*1 to 256"),
    (dict(k=torch.randn(1, 1, 5, 16, dtype=torch.float16)), "share one dtype"),
])
def test_rejects_bad_inputs(bad, match):
    args = dict(q=torch.randn(1, 1, 4, 16), k=torch.randn(1, 1, 5, 16), v=torch.randn(1, 1, 5, 16))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        tk.triton_attention(**args)


def test_rejects_bad_scale_and_causal():
    x = torch.randn(1, 1, 4, 16)
    with pytest.raises(ValueError, match="scale must be a positive"):
        tk.triton_forward(x, x, x, scale=-1.0)
    with pytest.raises(ValueError, match="causal must be False, True, 'top-left' or 'bottom-right'"):
        tk.triton_forward(x, x, x, causal="yes")
    with pytest.raises(TypeError, match="causal must be a bool"):
        tk.triton_forward(x, x, x, causal=2)


def test_backward_checks_its_extra_inputs():
    x = torch.randn(1, 1, 4, 16)
    lse = torch.zeros(1, 1, 4)
    with pytest.raises(ValueError, match="do must have the shape of q"):
        tk.triton_backward(x, x, x, x, lse, torch.randn(1, 1, 5, 16))
    with pytest.raises(ValueError, match="lse must have shape"):
        tk.triton_backward(x, x, x, x, torch.zeros(1, 1, 5), x)


@pytest.mark.skipif(not CPU, reason="bfloat16 CPU tensors only reach the interpreter")
def test_rejects_bfloat16_in_interpreter():
    x = torch.randn(1, 1, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16, which the Triton CPU interpreter"):
        tk.triton_attention(x, x, x)


def test_cpu_tensors_without_interpreter_say_how(monkeypatch):
    monkeypatch.setattr(tk, "interpreting", lambda: False)
    x = torch.randn(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="run on a CUDA GPU, or set TRITON_INTERPRET=1"):
        tk.triton_attention(x, x, x)


def test_old_gpu_is_refused_with_alternatives(monkeypatch):
    monkeypatch.setattr(tk, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    fake = types.SimpleNamespace(device=torch.device("cuda"))
    with pytest.raises(RuntimeError, match=r"sm_80 or newer.*sm_75.*cuda_attention.*tiled_attention"):
        tk._require_runtime(fake)


def test_missing_triton_says_how_to_install():
    """A fresh process with triton hidden: calls raise RuntimeError. Not in this process: loading a
    second copy of the module here would register its custom operators over the real ones."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "import torch, flashtut\n"
            "x = torch.randn(1, 1, 4, 16)\n"
            "try:\n    flashtut.triton_attention(x, x, x)\n"
            "except RuntimeError as e:\n    print('RuntimeError:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "RuntimeError:" in res.stdout and "pip install triton" in res.stdout, res.stdout


def test_search_space_and_buckets():
    hopper = tconfigs.search_space("fwd", (9, 0), False, 128)
    assert hopper and all(c.block_m == 128 for c in hopper)
    for kernel in ("fwd", "dkdv", "dq"):
        for cap in ((8, 0), (8, 9), (9, 0)):
            for fp32 in (False, True):
                for bd in (16, 64, 128, 256):
                    assert tconfigs.search_space(kernel, cap, fp32, bd)
    # the 256-wide head dims get their own, smaller tiles: the 128-wide lists do not fit or spill there
    for kernel in ("fwd", "dkdv", "dq"):
        for cap in ((8, 0), (9, 0)):
            wide = tconfigs.search_space(kernel, cap, False, 256)
            assert wide != tconfigs.search_space(kernel, cap, False, 128)
            assert all(c.block_n <= 64 and c.num_stages <= 3 for c in wide)
    assert [tconfigs.head_dim_class(bd) for bd in (16, 64, 128, 256)] == ["small", "small", "large", "wide"]
    assert [tconfigs.length_bucket(n) for n in (1, 128, 129, 4096, 5000)] == [128, 128, 256, 4096, 8192]


# ------------------------------------------------------------------------- GPU tests ----

GPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("lengths", [(1000, 1000), (700, 1123)], ids=["square", "ragged"])
def test_gpu_accuracy_criterion(dtype, D, causal, lengths):
    gen = torch.Generator().manual_seed(D * 7 + causal)
    Nq, Nk = lengths
    scale = 0.9 / math.sqrt(D) if Nq != Nk else None
    q, k, v, do = _qkvd(gen, 2, 3, Nq, Nk, D, dtype, "cuda")
    ref = _reference(q, k, v, do, causal, scale)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    o = flashtut.triton_attention(q, k, v, causal=causal, scale=scale)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    _, lse = tk.triton_forward(q.detach(), k.detach(), v.detach(), causal, scale)
    assert _maxerr(lse, ref[1]) < (1e-4 if dtype == torch.float32 else 2e-2)
    _assert_yardstick(f"gpu {dtype} D={D} causal={causal} {lengths}", q, k, v, o.detach(), causal, scale,
                      (dq, dk, dv), do)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("kernel", ["fwd", "dkdv", "dq"])
def test_gpu_every_config_in_search_space_is_correct(kernel, D):
    """The autotuner may pick any entry: each must compute the same function."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, do = _qkvd(gen, 1, 2, 517, 389, D, torch.float16, "cuda")
    ref = _reference(q, k, v, do, True, None)
    cap = torch.cuda.get_device_capability()
    for cfg in tconfigs.search_space(kernel, cap, False, D):
        with tk.use_configs(**{kernel: cfg}):
            o, lse = tk.triton_forward(q, k, v, True)
            dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, True)
        errs = [_maxerr(a, b) for a, b in zip((o, dq, dk, dv), (ref[0], ref[2], ref[3], ref[4]))]
        assert max(errs) < 2e-2, f"{cfg}: {errs}"


# every padded width with float16, the unpadded 256 and one padded width with each dtype
GPU_WIDE = ([(torch.float16, D) for D in (160, 192, 200, 224, 256)]
            + [(dt, D) for dt in (torch.bfloat16, torch.float32) for D in (200, 256)])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype, D", GPU_WIDE, ids=lambda x: str(x).replace("torch.", ""))
def test_gpu_head_dims_up_to_256(dtype, D, causal):
    """Head dims above 128 (FlashAttention's up to 256): the forward and the autograd backward."""
    gen = torch.Generator().manual_seed(D + causal)
    q, k, v, do = _qkvd(gen, 2, 3, 700, 523, D, dtype, "cuda")
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    o = flashtut.triton_attention(q, k, v, causal="bottom-right" if causal else False)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    _assert_yardstick(f"gpu {dtype} D={D} causal={causal}", q, k, v, o.detach(),
                      "bottom-right" if causal else False, None, (dq, dk, dv), do)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["fwd", "dkdv", "dq"])
def test_gpu_every_wide_config_is_correct(kernel):
    """Every entry of the D = 256 lists that fits this GPU computes the same function."""
    from triton.runtime.errors import OutOfResources
    gen = torch.Generator().manual_seed(13)
    q, k, v, do = _qkvd(gen, 1, 2, 517, 389, 256, torch.float16, "cuda")
    ref = _reference(q, k, v, do, True, None)
    cap = torch.cuda.get_device_capability()
    ran = 0
    for cfg in tconfigs.search_space(kernel, cap, False, 256):
        try:
            with tk.use_configs(**{kernel: cfg}):
                o, lse = tk.triton_forward(q, k, v, True)
                dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, True)
        except OutOfResources:
            continue
        ran += 1
        errs = [_maxerr(a, b) for a, b in zip((o, dq, dk, dv), (ref[0], ref[2], ref[3], ref[4]))]
        assert max(errs) < 2e-2, f"{cfg}: {errs}"
    assert ran, "no D = 256 configuration fits this GPU"


@pytest.mark.gpu
def test_gpu_padded_head_dim_and_strided_inputs():
    gen = torch.Generator().manual_seed(5)
    q, k, v, do = _qkvd(gen, 2, 2, 300, 257, 40, torch.float16, "cuda")
    ref = _reference(q, k, v, do, True, None)
    o, lse = tk.triton_forward(q, k, v, True)
    dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, True)
    for a, b in zip((o, dq, dk, dv), (ref[0], ref[2], ref[3], ref[4])):
        assert _maxerr(a, b) < 2e-2
    # (B, N, H, D) memory viewed as (B, H, N, D): strided rows, unit stride along D
    qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert _maxerr(tk.triton_forward(qs, ks, vs, True)[0], o) == 0.0


@pytest.mark.gpu
def test_gpu_large_logits_and_no_nan():
    gen = torch.Generator().manual_seed(9)
    q, k, v, do = _qkvd(gen, 1, 2, 1024, 1024, 64, torch.float16, "cuda", spread=20.0)
    o, lse = tk.triton_forward(q, k, v, False)
    dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, False)
    for t in (o, lse, dq, dk, dv):
        assert torch.isfinite(t).all()


# --------------------------------------------------------- chapter 07 exercises, figures ----

@pytest.mark.skipif(not CPU, reason="interpreter-sized checks; the GPU path runs the same code")
def test_ch07_preprocess_checker():
    from flashtut.exercises import ch07
    assert ch07.check_preprocess(ch07.solution_preprocess).ok

    def wrong(o, do):                       # forgets dO: rowsum(O * O)
        return (o.float() * o.float()).sum(-1)
    res = ch07.check_preprocess(wrong)
    assert not res.ok and "delta" in res.message


@pytest.mark.skipif(not CPU, reason="interpreter-sized checks; the GPU path runs the same code")
def test_ch07_window_exercise():
    from flashtut.exercises import ch07
    assert ch07.check_window_key_range(ch07.reference_window_key_range).ok
    causal_only = ch07.check_window_key_range(lambda s, bm, bn, w, nk: (0, min(s + bm, nk)))
    assert not causal_only.ok and "no row of the block sees" in causal_only.message
    assert ch07.check_window_attention(ch07.solution_window_attention).ok
    res = ch07.check_window_attention(lambda q, k, v, w: flashtut.triton_attention(q, k, v, causal=True))
    assert not res.ok
    # a window at least as long as the sequence is plain causal attention
    gen = torch.Generator().manual_seed(3)
    q, k, v, _ = _qkvd(gen, 1, 2, 30, 41, 16, torch.float32)
    ref = flashtut.naive_attention(q.double(), k.double(), v.double(), causal=True)
    assert _maxerr(ch07.solution_window_attention(q, k, v, 100), ref) < 1e-5
    with pytest.raises(ValueError, match="Nq <= Nk"):
        ch07.solution_window_attention(k, q, q[:, :, :30], 5)
    counts = ch07.tiles_visited(4096, 512)
    assert counts["full"] == 64 * 64 and counts["causal"] == 64 * 65 // 2
    assert counts["window"] < counts["causal"] // 3


def test_triton_figures_from_committed_data():
    from flashtut import results_data
    from flashtut.figures import triton_plots
    rows, prov = results_data.load_results("triton_h200.json")
    sweep, _ = results_data.load_results("triton_h200_sweep.json")
    assert prov[0]["device"]["name"].startswith("NVIDIA")
    shapes = triton_plots.side_by_side(rows)
    assert len(shapes) == 16
    for r in shapes:                # the targets, as committed
        assert r["fwd_ratio"] >= 1.0 and r["bwd_ratio"] >= 0.8
        assert r.get("accuracy_ok", True)
    table = triton_plots.results_table(rows)
    assert table.count("\n") == len(shapes) + 1
    for fig in (triton_plots.ratio_figure(rows),
                triton_plots.speed_vs_n_figure(sweep),
                triton_plots.program_grid_figure(130, 100, 32, 32, causal=True)):
        assert fig.axes


def test_a_fixed_launch_takes_the_next_tile_that_fits(monkeypatch):
    """With autotuning off, a tile that asks for more shared memory than the GPU gives a block (a
    256-wide head on a 99 KB Ada part) is skipped, once and for good; the last one's error is raised."""
    from triton.runtime.errors import OutOfResources
    monkeypatch.setattr(tk, "_TOO_BIG", set())
    launched = []

    class FakeKernel:
        def __init__(self, limit):
            self.limit = limit

        def __getitem__(self, grid):
            def launch(*args, **kw):
                if kw["BLOCK_M"] * kw["BLOCK_N"] > self.limit:
                    raise OutOfResources(kw["BLOCK_M"] * kw["BLOCK_N"], self.limit, "shared memory")
                launched.append((grid, kw["BLOCK_M"], kw["BLOCK_N"]))
            return launch
    cfg = tk.TileConfig
    cands = [cfg(128, 64, 8, 3), cfg(64, 64, 4, 2), cfg(32, 32, 4, 1)]
    meta = dict(BLOCK_D=256, WINDOW=False)
    dev = torch.device("cpu")
    tk._launch_fixed("fwd", FakeKernel(4096), 300, 6, [], meta, dev, cands)
    assert launched == [((5, 6), 64, 64)]                     # cdiv(300, 64) query blocks
    assert tk._TOO_BIG == {("fwd", dev, cands[0], 256, False)}
    tk._launch_fixed("fwd", FakeKernel(4096), 300, 6, [], meta, dev, cands)
    assert len(launched) == 2 and len(tk._TOO_BIG) == 1       # the big tile is not tried again
    with pytest.raises(OutOfResources):
        tk._launch_fixed("dq", FakeKernel(100), 300, 6, [], meta, dev, cands)


def test_each_search_space_gets_its_own_autotuner():
    """Regression: the D=128 kernels must be tuned over the D=128 list even when a D=64 call
    created an autotuner for the same kernel first."""
    from flashtut.triton import forward as tforward
    small = tk._tuned("fwd", tforward.attn_fwd_kernel, (9, 0), False, 64)
    large = tk._tuned("fwd", tforward.attn_fwd_kernel, (9, 0), False, 128)
    assert small is not large
    as_tuples = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in large.configs]
    assert as_tuples == [(c.block_m, c.block_n, c.num_warps, c.num_stages)
                         for c in tconfigs.search_space("fwd", (9, 0), False, 128)]
    assert tk._tuned("fwd", tforward.attn_fwd_kernel, (9, 0), False, 128) is large


# ------------------------------------------------------ dS kept in float32 (chapter 07) ----

@pytest.mark.skipif(not CPU, reason="interpreter-sized; the GPU test below runs the same flag")
@pytest.mark.parametrize("causal", [False, True])
def test_interpreter_ds_fp32_flag(gen, causal):
    """``ds_fp32=True`` computes the same gradients (by the yardstick), differently rounded:
    dV does not use dS and is bit-identical; dQ and dK change."""
    q, k, v, do = _qkvd(gen, 1, 2, 45, 38, 32, torch.float16)
    o, lse = tk.triton_forward(q, k, v, causal)
    rounded = tk.triton_backward(q, k, v, o, lse, do, causal)
    kept = tk.triton_backward(q, k, v, o, lse, do, causal, ds_fp32=True)
    _assert_yardstick("ds_fp32", q, k, v, o, causal, None, kept, do)
    assert torch.equal(rounded[2], kept[2])
    assert not torch.equal(rounded[0], kept[0]) and not torch.equal(rounded[1], kept[1])
    with pytest.raises(TypeError, match="ds_fp32 must be True or False"):
        tk.triton_backward(q, k, v, o, lse, do, causal, ds_fp32="yes")


@pytest.mark.skipif(not CPU, reason="interpreter-sized")
def test_ds_rounding_effect_reports_both_and_the_row_cancellation(gen):
    from flashtut.bench.accuracy import ds_rounding_effect, ds_rounding_table
    q, k, v, do = _qkvd(gen, 1, 1, 40, 40, 32, torch.float16)
    effect = ds_rounding_effect(q, k, v, do)
    assert effect["rounded"].passed and effect["fp32"].passed
    assert effect["row_cancellation"] < 1e-12          # each row of dS sums to zero
    table = ds_rounding_table(effect)
    assert table.count("\n") == 4 and "| dq |" in table


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_ds_fp32_flag(dtype):
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = _qkvd(gen, 2, 4, 1000, 1000, 64, dtype, "cuda")
    o, lse = tk.triton_forward(q, k, v, True)
    kept = tk.triton_backward(q, k, v, o, lse, do, True, ds_fp32=True)
    y = _assert_yardstick(f"gpu ds_fp32 {dtype}", q, k, v, o, True, None, kept, do)
    rounded = yardstick(q, k, v, o, tk.triton_backward(q, k, v, o, lse, do, True), do, True, None)
    print(f"[accuracy] dq error, dS rounded / dS in float32: {rounded.err['dq'] / y.err['dq']:.2f}")

"""The Hopper backward (flashtut.cuda.hopper_backward, kernels/bwd_hopper.cu).

Any machine: input checks, the build matrix and its shared memory; with nvcc: every runtime build
compiles for sm_90a with HGMMA in its SASS and no serialised-wgmma warning, and the file builds (as a
trap) for the other targets. On an sm_90 GPU (``gpu`` marker): dq, dk, dv within the book's yardstick
(``flashtut.bench.accuracy.yardstick``: at most twice PyTorch's own error in the input precision against
a float32 reference) on odd shapes, grouped heads, both causal alignments, windows, non-contiguous
inputs, float16 and bfloat16, D = 64 and 128, both rungs, and the deterministic mode's bits.
"""
from __future__ import annotations

import math
import re
import shutil

import pytest
import torch

from flashtut.bench.accuracy import yardstick
from flashtut.cuda import hopper_backward as hb

NVCC = shutil.which("nvcc")


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# ---------------------------------------------------------------- any machine

def test_builds_and_shared_memory():
    builds = hb.builds()
    assert {(c.rung, c.head_dim, c.bf16) for c in builds} == \
        {(r, d, b) for r in hb.RUNGS for d in hb.HEAD_DIMS for b in (False, True)}
    for c in builds:
        assert c.block_m * c.head_dim == 8192          # each consumer's dQ product is 64 x 64
        assert c.dynamic_smem <= 227 * 1024
        assert c.threads == (256 if c.rung == "b1" else 384)
        assert c.dq or c.rung == hb.DETERMINISTIC_RUNG
    # D = 128: K, V (128 x 128), two stages of Q, dO (64 x 128) and 64 floats each of lse2 and Delta,
    # two dS^T tiles (128 x 64), 5 mbarriers, 1024 bytes of alignment slack
    c = hb.HopperBackwardConfig("b2", False, 128, 2)
    assert c.dynamic_smem == 2 * 32768 + 2 * (2 * 16384 + 512) + 2 * 16384 + 40 + 1024
    # b3 adds the two consumers' 64 x 64 float32 dQ tiles
    assert hb.HopperBackwardConfig("b3", False, 128, 2).dynamic_smem == c.dynamic_smem + 2 * 16384


@pytest.mark.parametrize("kwargs, match", [
    ({"rung": "b9"}, "rung"),
    ({"stages": 0}, "stages"),
    ({"rung": "b1", "stages": 3}, "stages"),
    ({"window": 16}, "window"),            # a window needs a causal alignment
    ({"causal": "diagonal"}, "causal"),
])
def test_bad_arguments_are_value_errors_before_the_machine(kwargs, match):
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    lse = torch.zeros(1, 2, 8)
    args = dict(causal=kwargs.pop("causal", False), **kwargs)
    with pytest.raises(ValueError, match=match):
        hb.hopper_backward(q, q, q, q, lse, q, **args)


def test_a_cpu_tensor_is_refused():
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises((ValueError, RuntimeError)):
        hb.hopper_backward(q, q, q, q, torch.zeros(1, 2, 8), q)


def _ptxas_entry(log: str, kernel: str) -> dict:
    m = re.search(rf"Compiling entry function '{kernel}'.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                  rf"(\d+) bytes spill loads.*?Used (\d+) registers", log, re.S)
    assert m, log
    return dict(zip(("stack", "spill_st", "spill_ld", "regs"), map(int, m.groups())))


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("cfg", hb.builds(), ids=lambda c: f"{c.rung}-d{c.head_dim}-{'bf16' if c.bf16 else 'fp16'}"
                         f"{'' if c.dq else '-nodq'}")
def test_sm90a_build_has_hgmma_and_reports_its_registers(cfg, record_property):
    from flashtut.bench.sass import nvcc_sass

    log, sass = nvcc_sass(hb.SOURCE, cfg.define_dict)
    assert "serializ" not in log.lower(), log     # ptxas warns when it must serialise the wgmma
    rep = _ptxas_entry(log, "bwd_hopper")
    record_property("ptxas", rep)
    print(cfg, rep)
    # five products with dQ (S^T, dP^T: D / 16 each; dV, dK: BM / 16 x D / 64 each; dQ: 8), three without
    per_step = 2 * (cfg.head_dim // 16) + 2 * (cfg.block_m // 16) * (cfg.head_dim // 64) + 8 * cfg.dq
    assert sass.count(" HGMMA") == per_step
    # no spills, except b2 and b3 at D = 64 (a few loop-invariant values, 12 to 16 bytes, reloaded once per
    # query block: experiments/hopper_backward/README.md)
    if not (cfg.head_dim == 64 and cfg.rung in ("b2", "b3") and cfg.dq):
        assert rep["spill_st"] == rep["spill_ld"] == 0, rep
    else:
        assert rep["spill_st"] <= 16, rep
    if cfg.rung != "b1":
        assert "USETMAXREG" in sass and "UTMALDG" in sass
    assert ("UTMAREDG" in sass) == cfg.dq_tma


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["75", "80", "90"])
def test_other_targets_build_the_kernel_as_a_trap(arch):
    from flashtut.bench.sass import nvcc_sass

    _, sass = nvcc_sass(hb.SOURCE, {"HEAD_DIM": 64}, arch=arch)
    assert "HGMMA" not in sass and "BPT.TRAP" in sass


# ---------------------------------------------------------------- an sm_90 GPU

def _forward(q, k, v, causal, scale, window):
    """o (input dtype) and lse (float32) in float32 arithmetic, with grouped heads, both alignments and a window."""
    from flashtut.checks import check_mask, diag_offset

    alignment, window = check_mask(causal, window)
    G = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(G, dim=1) for t in (k, v))
    s = q.float() @ kf.transpose(-1, -2) * scale
    Nq, Nk = q.shape[2], k.shape[2]
    if alignment is not None:
        off = diag_offset(alignment, Nq, Nk)
        i = torch.arange(Nq, device=q.device)[:, None]
        j = torch.arange(Nk, device=q.device)[None, :]
        hidden = j > i + off
        if window is not None:
            hidden |= j <= i + off - window
        s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ vf).to(q.dtype), lse


CASES = [  # B, H, Hkv, Nq, Nk, causal, window
    (1, 2, 2, 200, 200, False, None),
    (2, 4, 2, 300, 257, "top-left", None),
    (1, 4, 1, 129, 385, "bottom-right", None),
    (1, 2, 2, 385, 129, "bottom-right", None),
    (1, 2, 2, 333, 333, True, 64),
    (1, 4, 2, 520, 700, "bottom-right", 150),
]


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("rung", list(hb.RUNGS))
@pytest.mark.parametrize("D", hb.HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_gradients_within_the_yardstick(case, dtype, D, rung):
    B, H, Hkv, Nq, Nk, causal, window = case
    gen = torch.Generator().manual_seed(Nq * 7 + Nk + D)
    q = torch.randn(B, H, Nq, D, generator=gen).to("cuda", dtype)
    k, v = (torch.randn(B, Hkv, Nk, D, generator=gen).to("cuda", dtype) for _ in range(2))
    do = torch.randn(B, H, Nq, D, generator=gen).to("cuda", dtype)
    scale = 1 / math.sqrt(D)
    o, lse = _forward(q, k, v, causal, scale, window)
    grads = hb.hopper_backward(q, k, v, o, lse, do, causal, window=window, rung=rung)
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and bool(torch.isfinite(g).all())
    ys = yardstick(q, k, v, o, grads, do, causal, window=window)
    print(case, dtype, D, rung, ys, sep="\n")
    assert ys.passed, str(ys)


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU")
def test_a_wrong_gradient_fails_the_yardstick_and_non_contiguous_inputs_pass():
    gen = torch.Generator().manual_seed(5)
    B, H, N, D = 2, 3, 257, 128
    base = torch.randn(B, N, H, D, generator=gen).to("cuda", torch.bfloat16)
    q = base.transpose(1, 2)                  # (B, H, N, D), not contiguous
    k, v = (torch.randn(B, N, H, D, generator=gen).to("cuda", torch.bfloat16).transpose(1, 2) for _ in range(2))
    do = torch.randn(B, H, N, D, generator=gen).to("cuda", torch.bfloat16)
    o, lse = _forward(q, k, v, True, 1 / math.sqrt(D), None)
    dq, dk, dv = hb.hopper_backward(q, k, v, o, lse, do, True)
    assert yardstick(q, k, v, o, (dq, dk, dv), do, True).passed
    wrong = dk.clone()
    wrong[:, :, 100] = 0                      # one key's gradient lost (a missed tile would do this)
    assert not yardstick(q, k, v, o, (dq, wrong, dv), do, True).passed


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("D", hb.HEAD_DIMS)
def test_deterministic_mode_repeats_its_bits(D):
    gen = torch.Generator().manual_seed(D)
    q = torch.randn(1, 4, 1000, D, generator=gen).to("cuda", torch.float16)
    k, v = (torch.randn(1, 2, 900, D, generator=gen).to("cuda", torch.float16) for _ in range(2))
    do = torch.randn(1, 4, 1000, D, generator=gen).to("cuda", torch.float16)
    o, lse = _forward(q, k, v, "bottom-right", 1 / math.sqrt(D), None)
    a = hb.hopper_backward(q, k, v, o, lse, do, "bottom-right", deterministic=True)
    b = hb.hopper_backward(q, k, v, o, lse, do, "bottom-right", deterministic=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert yardstick(q, k, v, o, a, do, "bottom-right").passed


def test_cuda_attention_takes_it_on_sm90_at_d64_and_d128_only():
    from types import SimpleNamespace

    from flashtut.cuda import hopper_backward_launch as hbl
    from flashtut.cuda.configs import kernel_plan

    for dtype in (torch.float16, torch.bfloat16):
        for D, rung in ((64, "b3"), (128, "b4"), (40, "b3"), (120, "b4")):   # 40 and 120 pad to 64 and 128
            assert kernel_plan((9, 0), dtype, D).backward_rung == rung
            assert kernel_plan((9, 0), dtype, D, deterministic=True).backward_rung is None
            assert kernel_plan((9, 0), dtype, D, nvrtc_version=(11, 8)).backward_rung is None   # no sm_90a
            assert kernel_plan((8, 0), dtype, D).backward_rung is None      # an A100 keeps the mma.sync one
        for D in (32, 96, 256):                                              # other dims: the warp grid
            assert kernel_plan((9, 0), dtype, D).backward_rung is None
        assert kernel_plan((9, 0), dtype, 64, backward_kernel="mma").backward_rung is None
        assert kernel_plan((9, 0), dtype, 64, deterministic=True, backward_kernel="wgmma").backward_rung == "b2"

    def fake(B, H, N, D):
        return SimpleNamespace(shape=(B, H, N, D))

    assert hbl.fits(fake(2, 4, 100, 64), fake(2, 2, 90, 64))
    assert not hbl.fits(fake(1, 1, 2**24, 128), fake(1, 1, 16, 128))       # dQ rows past 32-bit indexing
    assert not hbl.fits(fake(65536, 1, 16, 64), fake(65536, 1, 16, 64))    # grid.y

"""The CUDA backward (flashtut.cuda.attention.cuda_backward): input checks and tile choice on any machine;
on a GPU, dq, dk, dv against float64 and float32 references at realistic sizes.

Accuracy: the book's one yardstick (``flashtut.bench.accuracy.yardstick``), the criterion of the
flash-attn repository's tests: against a float32 reference, the kernel's max error in each gradient is at
most twice the error of PyTorch's own attention computed in float16 / bfloat16 (matmuls and the
probabilities in the input dtype, autograd backward) on the same inputs. The ratio to SDPA's
math backend (float32 inside) is printed beside it (run with -s to see it).
"""
import dataclasses
import math
import os

import pytest
import torch

import flashtut
from flashtut.bench.accuracy import yardstick
from flashtut.cuda import attention as ca
from flashtut.cuda import configs as cfgs
from flashtut.cuda.models import warp_grid as wg

HAS_CUDA = torch.cuda.is_available()


def _inputs(gen, B, H, Nq, Nk, D, dtype, device="cpu", q_mul=1.0):
    q = torch.randn(B, H, Nq, D, generator=gen) * q_mul
    k = torch.randn(B, H, Nk, D, generator=gen)
    v = torch.randn(B, H, Nk, D, generator=gen)
    do = torch.randn(B, H, Nq, D, generator=gen)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, do)]


# ---------------------------------------------------------------- any machine
@pytest.mark.parametrize("arch, limit, D, expect", [
    (90, 232448, 128, (2, 64, 64)),     # H100/H200: double-buffered 64-row tiles, 103 KB
    (80, 166912, 128, (2, 64, 64)),     # A100
    (75, 65536, 128, (1, 32, 32)),      # T4: 64 KB per block, no cp.async
    (75, 65536, 64, (1, 64, 64)),
])
def test_pick_config_fits_the_gpu(arch, limit, D, expect):
    cfg = cfgs.pick_config(D, arch, limit)
    assert (cfg.stages, cfg.dkdv_block_m, cfg.dq_block_n) == expect
    assert max(cfg.dkdv_smem, cfg.dq_smem) <= limit


def test_atomic_dq_is_the_default_from_sm80_and_deterministic_takes_the_dq_pass():
    for arch, limit in ((90, 232448), (80, 166912)):
        for D in (64, 128):
            fast = cfgs.pick_config(D, arch, limit)
            assert fast.dq_atomic and fast.warps == 8 and fast.one_barrier and fast.dkdv_smem <= limit
            assert not cfgs.pick_config(D, arch, limit, deterministic=True).dq_atomic
    # the staged 16-byte reductions at D = 128 need 191 KB: an H200 yes, an A100 (163 KB) no
    assert cfgs.pick_config(128, 90, 232448).dq_stage and not cfgs.pick_config(128, 80, 166912).dq_stage
    assert not cfgs.pick_config(128, 75, 65536).dq_atomic      # a T4 keeps the separate pass
    cfg = cfgs.BackwardConfig(128, 2, 64, 64, warps=8, dq_atomic=True, one_barrier=True, dq_stage=True)
    # K, V (128 keys) + dS^T (128 x 72) + 8 warps' dQ staging (16 x 72 floats) + two stages
    assert cfg.dkdv_smem == 2 * 128 * 272 + 128 * 72 * 2 + 8 * 16 * 72 * 4 + 2 * (2 * 64 * 272 + 2 * 64 * 4)


def test_config_smem_arithmetic():
    # D = 128: a padded row is 136 halves = 272 bytes; K and V tiles of 64 rows, then two stages
    # of Q and dO tiles plus 64 floats each of lse2 and Delta
    cfg = cfgs.BackwardConfig(128, 2, 64, 64)
    assert cfg.dkdv_smem == 2 * 64 * 272 + 2 * (2 * 64 * 272 + 2 * 64 * 4) == 105472
    assert cfg.dq_smem == 2 * 64 * 272 + 2 * 2 * 64 * 272 == 104448
    # the atomic variant adds the dS^T tile (64 keys x 72 padded query columns) and has no dQ kernel
    atomic = cfgs.BackwardConfig(128, 2, 64, 64, dq_atomic=True)
    assert atomic.dkdv_smem == 105472 + 64 * 72 * 2 and atomic.dq_smem == 0


@pytest.mark.parametrize("arch", [75, 80, 90])
def test_runtime_builds_cover_both_dq_strategies(arch):
    builds = cfgs.backward_builds(arch)
    sources = {src for src, _ in builds}
    assert sources == {"bwd_preprocess.cu", "bwd_dkdv.cu", "bwd_dq.cu", "bwd_dq_convert.cu"}
    dkdv = [d for src, d in builds if src == "bwd_dkdv.cu"]
    assert {d["DKDV_DQ_ATOMIC"] for d in dkdv} == {0, 1}
    assert {d["HEAD_DIM"] for d in dkdv} == set(cfgs.HEAD_DIMS) | (set(cfgs.WIDE_DIMS) if arch >= 80 else set())
    # D = 256 splits dK and dV over two blocks; the other dims keep both in one
    assert all(d.get("DKDV_SPLIT", 0) == (d["HEAD_DIM"] > 128) for d in dkdv)
    # bfloat16 builds only where the tensor cores take bfloat16
    assert {d["FT_BF16"] for _, d in builds} == ({0} if arch < 80 else {0, 1})
    assert len({(src, tuple(sorted(d.items()))) for src, d in builds}) == len(builds)


def test_kernel_builds_follow_the_config():
    cfg = cfgs.BackwardConfig(128, 1, 32, 48, warps=2)
    steps = cfgs.kernel_builds(cfg, torch.bfloat16)
    assert list(steps) == ["preprocess", "dkdv", "dq"]
    assert steps["dkdv"][2] == {"HEAD_DIM": 128, "FT_BF16": 1, "DKDV_WARPS": 2, "DKDV_BLOCK_M": 32,
                                "DKDV_STAGES": 1, "DKDV_DQ_ATOMIC": 0}
    assert steps["dq"][2]["DQ_BLOCK_N"] == 48
    atomic = cfgs.kernel_builds(dataclasses.replace(cfg, dq_atomic=True), torch.float16)
    assert list(atomic) == ["preprocess", "dkdv", "dq_convert"]


# ---------------------------------------------------------------- the warp grid (DKDV_WARP_GRID)
GRID_CONFIGS = {n: c for n, c in cfgs.experiment_configs(64).items() if c.warp_grid}


def test_warp_grid_is_the_default_where_it_fits():
    """Measured fastest on the H200 (book/perflog_cuda_bwd.md): the grid with 128 queries per step at
    D = 64 (198 KB) and with 64 at D = 128 (193 KB) on an H100/H200; an A100 (163 KB) takes the grid
    at D = 64 with 64 queries per step and the one-warp-per-16-keys kernel at D = 128; no grid on an
    sm_89 (99 KB), a T4, other head dims or with deterministic=True."""
    assert set(GRID_CONFIGS) == {"atomic-dq-w8-split2x4", "atomic-dq-w8-split2x4-m128"}
    for d in (64, 128):
        assert all(c.dq_atomic and c.warps == 8 and c.one_barrier and c.dq_stage
                   for n, c in cfgs.experiment_configs(d).items() if n in GRID_CONFIGS)
    h200, a100 = (90, 232448), (80, 166912)
    assert cfgs.pick_config(64, *h200) == cfgs.experiment_configs(64)["atomic-dq-w8-split2x4-m128"]
    assert cfgs.pick_config(128, *h200) == cfgs.experiment_configs(128)["atomic-dq-w8-split2x4"]
    assert cfgs.pick_config(64, *a100) == cfgs.experiment_configs(64)["atomic-dq-w8-split2x4"]
    assert cfgs.pick_config(128, *a100) == cfgs.experiment_configs(128)["atomic-dq-w8-1bar"]
    for d in cfgs.HEAD_DIMS + cfgs.WIDE_DIMS:
        for arch, limit in (h200, a100, (89, 101376), (75, 65536)):
            try:
                cfg = cfgs.pick_config(d, arch, limit)
            except RuntimeError:        # D = 256 on a T4
                continue
            fits = {64: 123904, 128: 197632}.get(d, limit + 1) <= limit
            assert cfg.warp_grid == (arch >= 80 and fits)
            assert cfgs.check_backward_config(cfg, d, arch, limit) is cfg
            assert not cfgs.pick_config(d, arch, limit, deterministic=True).warp_grid
    defs = cfgs.kernel_builds(GRID_CONFIGS["atomic-dq-w8-split2x4"], torch.bfloat16)["dkdv"][2]
    assert defs["DKDV_WARP_GRID"] == 1 and defs["DKDV_WARPS"] == 8 and defs["DKDV_DQ_ATOMIC"] == 1
    assert cfgs.kernel_builds(cfgs.pick_config(128, *h200), torch.float16)["dkdv"][2]["DKDV_WARP_GRID"] == 1


def test_warp_grid_shared_memory():
    grid = cfgs.experiment_configs(128)["atomic-dq-w8-split2x4"]
    # K, V (128 keys x 272 bytes); dS^T and P^T (128 x 72 halves); dQ staging, 8 warps x 16 rows x
    # (32 + 8) floats; two stages of Q, dO (64 rows) with 64 floats each of lse2 and Delta
    assert grid.dq_cols == 32
    assert grid.dkdv_smem == 2 * 128 * 272 + 2 * 128 * 72 * 2 + 8 * 16 * 40 * 4 + 2 * (2 * 64 * 272 + 2 * 64 * 4) == 197632
    d64 = cfgs.experiment_configs(64)
    assert d64["atomic-dq-w8-split2x4"].dq_cols == 16 and d64["atomic-dq-w8-split2x4"].dkdv_smem == 123904
    assert d64["atomic-dq-w8-split2x4-m128"].dq_cols == 32 and d64["atomic-dq-w8-split2x4-m128"].dkdv_smem == 202752
    # an H100/H200 holds all three; an A100 only D = 64 with 64-query steps
    assert max(grid.dkdv_smem, d64["atomic-dq-w8-split2x4-m128"].dkdv_smem) <= 232448
    assert d64["atomic-dq-w8-split2x4"].dkdv_smem <= 166912 < grid.dkdv_smem
    assert cfgs.experiment_configs(128)["atomic-dq-w8-split2x4-m128"].dkdv_smem > 232448
    # the runtime's builds: both dims on sm_90, D = 64 on sm_80, none on a T4
    grid_dims = lambda arch: {d["HEAD_DIM"] for s, d in cfgs.backward_builds(arch) if d.get("DKDV_WARP_GRID")}  # noqa: E731
    assert grid_dims(90) == {64, 128} and grid_dims(80) == {64} and grid_dims(75) == set()


@pytest.mark.parametrize("change, match", [
    (dict(warps=4), "warps=8"),
    (dict(dq_atomic=False, dq_stage=False), "dq_atomic=True"),
    (dict(dkdv_block_m=32), "dkdv_block_m in"),
])
def test_warp_grid_configs_are_checked(change, match):
    cfg = dataclasses.replace(GRID_CONFIGS["atomic-dq-w8-split2x4"], **change)
    with pytest.raises(ValueError, match=match):
        cfgs.check_backward_config(cfg, 64, 90, 232448)


def test_warp_grid_needs_sm80_and_its_dims():
    grid = GRID_CONFIGS["atomic-dq-w8-split2x4"]
    assert cfgs.check_backward_config(grid, 64, 80, 166912) is grid
    with pytest.raises(ValueError, match="sm_80"):
        cfgs.check_backward_config(grid, 64, 75, 232448)
    with pytest.raises(ValueError, match="head_dim in"):
        cfgs.check_backward_config(dataclasses.replace(grid, head_dim=96), 96, 90, 232448)
    with pytest.raises(ValueError, match="shared memory"):     # a T4's 64 KB, before the arch
        cfgs.check_backward_config(grid, 64, 75, 65536)


def _count(cells, shape):
    seen = {}
    for c in cells:
        seen[c] = seen.get(c, 0) + 1
    assert set(seen) == {(r, c) for r in range(shape[0]) for c in range(shape[1])}, "not every element"
    assert set(seen.values()) == {1}, "an element owned twice"


def _fragment_cells(block, m_tiles, n_tiles):
    rows, cols = block
    return [(rows[0] + 16 * m + r, cols[0] + 8 * t + c) for m in range(m_tiles) for t in range(n_tiles)
            for lane in range(32) for r, c in (wg.c_element(lane, i) for i in range(4))]


@pytest.mark.parametrize("block_m, D", [(64, 64), (64, 128), (128, 64)])
def test_warp_grid_covers_each_tile_once(block_m, D):
    s_cells, dkdv_cells, dq_cells = [], [], []
    for w in range(wg.WARPS):
        s_rows, s_cols = wg.s_block(w, block_m)
        k_rows, d_cols = wg.dkdv_block(w, D)
        assert len(s_rows) == 32 and len(s_cols) == block_m // 2 and len(d_cols) == D // 2
        s_cells += _fragment_cells((s_rows, s_cols), 2, block_m // 16)
        dkdv_cells += _fragment_cells((k_rows, d_cols), 2, D // 16)
        dq_cells += _fragment_cells(wg.dq_block(w, block_m, D), 2, wg.dq_cols(block_m, D) // 8)
        # dV += P^T dO needs P^T of its keys for every query: its own half and its partner's
        p = wg.partner(w)
        assert p != w and wg.partner(p) == w and k_rows == s_rows == wg.s_block(p, block_m)[0]
        assert sorted([*s_cols, *wg.s_block(p, block_m)[1]]) == list(range(block_m))
    _count(s_cells, (wg.BLOCK_N, block_m))
    _count(dkdv_cells, (wg.BLOCK_N, D))
    _count(dq_cells, (block_m, D))
    cfg = cfgs.BackwardConfig(D, 2, block_m, 64, warps=8, dq_atomic=True, warp_grid=True)
    assert cfg.dq_cols == wg.dq_cols(block_m, D)


def test_warp_grid_fragment_layouts_agree_with_ldmatrix():
    for lane in range(32):
        for reg in range(4):
            a = wg.a_elements(lane, reg)
            # A from a row-major tile (K rows for S^T; the partner's P^T, dS^T rows): plain, lane_off_a
            assert wg.ldmatrix_x4(wg.lane_off_a)[lane][reg] == a
            # A = dS from the key-major dS^T tile (dQ = dS K): transposing, lane_off_b
            assert [(c, r) for r, c in wg.ldmatrix_x4(wg.lane_off_b, trans=True)[lane][reg]] == a
            # acc_to_a: accumulator n-tiles 2kt, 2kt + 1 are the A fragment of k-step kt
            assert [(wg.c_element(lane, i)[0], 8 * nt + wg.c_element(lane, i)[1])
                    for nt, i in wg.acc_to_a(lane, reg)] == a
            # store_a_frags writes A element (r, c) to (r, c): the plain ldmatrix above reads it back
            assert wg.store_a_frags(lane, 0, reg) == a
            # B registers {0, 1} feed n-tile 0 and {2, 3} n-tile 1
            nt, breg = reg // 2, reg % 2
            want = [(k, n + 8 * nt) for k, n in wg.b_elements(lane, breg)]
            # B stored n-major (Q, dO rows for S^T, dP^T): plain, lane_off_b, stored (n, k)
            assert [(k, n) for n, k in wg.ldmatrix_x4(wg.lane_off_b)[lane][reg]] == want
            # B stored k-major (dO, Q for dV, dK; K for dQ): transposing, lane_off_a
            assert wg.ldmatrix_x4(wg.lane_off_a, trans=True)[lane][reg] == want


@pytest.mark.parametrize("block_m", [64, 128])
def test_warp_grid_shared_tiles_have_no_bank_conflicts(block_m):
    lds_ds = block_m + 8              # P^T and dS^T rows (DKDV_LDS_DS), 16-bit values
    for kt in range(block_m // 32):
        for reg in range(4):          # store_a_frags: one 4-byte store per register
            addr = [2 * (r * lds_ds + c) for lane in range(32) for r, c in [wg.store_a_frags(lane, kt, reg)[0]]]
            assert wg.bank_conflicts_32bit(addr) == 0
    for ld in (lds_ds, 64 + 8, 128 + 8):   # ldmatrix phases of 8 rows: P^T/dS^T, and BWD_LDS at D = 64, 128
        for off in (wg.lane_off_a, wg.lane_off_b):
            for phase in range(4):
                rows = [2 * (off(l)[0] * ld + off(l)[1]) for l in range(8 * phase, 8 * phase + 8)]
                assert wg.ldmatrix_conflicts(rows) == 0


@pytest.mark.parametrize("B, H, Hkv, Nq, Nk, D, dtype, causal, block_m", [
    (1, 4, 2, 130, 67, 64, torch.float16, "bottom-right", 64),     # grouped heads, Nq > Nk: rows see no key
    (1, 2, 2, 77, 201, 128, torch.bfloat16, "top-left", 64),
    (1, 2, 1, 201, 140, 64, torch.float16, False, 128),
])
def test_warp_grid_data_flow_passes_the_yardstick(B, H, Hkv, Nq, Nk, D, dtype, causal, block_m):
    # the kernel's data flow on the grid, emulated on the CPU (own half from registers, the
    # partner's from the shared P^T / dS^T tiles, dQ per warp), judged like the kernel on a GPU
    g = torch.Generator().manual_seed(Nq + Nk + D)
    q = torch.randn(B, H, Nq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, Nk, D, generator=g).to(dtype) for _ in range(2))
    do = torch.randn(B, H, Nq, D, generator=g).to(dtype)
    scale = D ** -0.5
    o, lse = flashtut.tiled_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    o = o.to(dtype)
    delta = (do.float() * o.float()).sum(-1)         # bwd_preprocess.cu
    off = Nk - Nq if causal == "bottom-right" else 0
    G = H // Hkv
    dq = torch.zeros(B, H, Nq, D)
    dk, dv = torch.zeros(B, Hkv, Nk, D), torch.zeros(B, Hkv, Nk, D)
    for b in range(B):
        for h in range(H):   # each query head's share of dK, dV in the input dtype, summed in float32
            a, bk, c = wg.emulate_backward(q[b, h], k[b, h // G], v[b, h // G], do[b, h], lse[b, h],
                                           delta[b, h], scale, bool(causal), off, block_m)
            dq[b, h] = a
            dk[b, h // G] += bk.to(dtype).float()
            dv[b, h // G] += c.to(dtype).float()
    y = yardstick(q, k, v, o, [x.to(dtype) for x in (dq, dk, dv)], do, causal, scale)
    assert y.passed, str(y)


def test_pick_config_refuses_too_little_smem():
    with pytest.raises(RuntimeError, match="shared memory"):
        cfgs.pick_config(128, 75, 16 * 1024)


def _valid(gen, dtype=torch.float16, D=64):
    q, k, v, do = _inputs(gen, 1, 2, 9, 7, D, dtype)
    o = torch.randn(q.shape, generator=gen).to(dtype)
    lse = torch.randn(1, 2, 9, generator=gen)
    return q, k, v, o, lse, do


@pytest.mark.parametrize("change, error, match", [
    (lambda a: {**a, "q": a["q"][..., :40].contiguous(), "k": a["k"][..., :40].contiguous(),
                "v": a["v"][..., :40].contiguous(), "o": a["o"][..., :40].contiguous(),
                "do": a["do"][..., :40].contiguous()}, ValueError, "head dim D = 40"),
    (lambda a: {**{n: t.float() for n, t in a.items() if n != "lse"}, "lse": a["lse"]},
     ValueError, "float16 or bfloat16"),
    (lambda a: {**a, "o": a["o"][:, :, :5]}, ValueError, "o must have the shape of q"),
    (lambda a: {**a, "do": a["do"].to(torch.bfloat16)}, ValueError, "do must have the dtype of q"),
    (lambda a: {**a, "lse": a["lse"][..., :4]}, ValueError, "lse must have shape"),
    (lambda a: {**a, "lse": a["lse"].half()}, ValueError, "lse has dtype float16"),
    (lambda a: {**a, "k": a["k"][:, :1]}, ValueError, "k and v must have the same number of heads"),
    (lambda a: {**a, "k": torch.cat([a["k"]] * 2), "v": torch.cat([a["v"]] * 2)}, ValueError,
     "batch and head dims must match"),
    (lambda a: {**a, "q": a["q"].numpy()}, TypeError, "q must be a torch.Tensor"),
    (lambda a: {**a, "scale": -0.5}, ValueError, "scale must be a positive"),
    (lambda a: {**a, "causal": "yes"}, ValueError, "causal must be False, True, 'top-left' or 'bottom-right'"),
    (lambda a: {**a, "causal": 2}, TypeError, "causal must be a bool"),
])
def test_bad_inputs_are_refused(gen, change, error, match):
    q, k, v, o, lse, do = _valid(gen)
    args = change({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do})
    with pytest.raises(error, match=match):
        ca.cuda_backward(**args)


def test_needs_a_cuda_device(gen):
    q, k, v, o, lse, do = _valid(gen)
    if HAS_CUDA:   # CPU tensors on a machine with a GPU: say where they must be
        with pytest.raises(ValueError, match="CUDA tensors"):
            ca.cuda_backward(q, k, v, o, lse, do)
    else:          # no GPU at all: say what is missing and how to get it
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            ca.cuda_backward(q, k, v, o, lse, do)


# ---------------------------------------------------------------- GPU
def _default_config(D, deterministic=False):
    major, minor = torch.cuda.get_device_capability()
    from flashtut.cuda.compile import max_smem_per_block
    return cfgs.pick_config(D, 10 * major + minor, max_smem_per_block(), deterministic)


def _check_against_references(q, k, v, do, causal, scale, **kw):
    """Run the kernel on every element of NaN-filled outputs and judge its gradients by the
    book's accuracy yardstick (``flashtut.bench.accuracy.yardstick``): at most twice the error of
    PyTorch attention in the input precision, against a float32 autograd reference. The ratio to
    SDPA's math backend is printed beside it (run with -s to see it)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    o, lse = flashtut.tiled_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    outs = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))   # every element must be written
    ours = ca.cuda_backward(q, k, v, o, lse, do, causal=causal, scale=scale, out=outs, **kw)
    assert all(g.dtype == q.dtype for g in ours)
    assert all(torch.isfinite(g).all() for g in ours), "unwritten (NaN) or non-finite gradient"
    y = yardstick(q, k, v, o, ours, do, causal, scale)
    print(f"\n[accuracy] {os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}: " + "; ".join(
        f"{n} {y.ratio(n):.2f}x PyTorch {str(q.dtype)[6:]}, {y.ratio(n, 'math'):.2f}x SDPA math"
        for n in ("dq", "dk", "dv")))
    assert y.passed, str(y)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq, Nk", [(1000, 1000), (777, 1000), (1000, 777)])
@pytest.mark.parametrize("deterministic", [True, False], ids=["dq-pass", "default"])
def test_backward_matches_references(gen, dtype, D, causal, Nq, Nk, deterministic):
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bfloat16 needs sm_80")
    q, k, v, do = _inputs(gen, 2, 3, Nq, Nk, D, dtype, "cuda")
    _check_against_references(q, k, v, do, causal, None, deterministic=deterministic)


@pytest.mark.gpu
@pytest.mark.parametrize("Nq, Nk", [(1, 1), (17, 130), (130, 17), (64, 64), (65, 193)])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_odd_small_sizes(gen, Nq, Nk, causal):
    q, k, v, do = _inputs(gen, 1, 2, Nq, Nk, 64, torch.float16, "cuda")
    _check_against_references(q, k, v, do, causal, None)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_backward_large_logits_custom_scale(gen, D):
    # logits with a standard deviation of about 16: peaked rows, exp2 arguments far below 0
    q, k, v, do = _inputs(gen, 2, 2, 300, 411, D, torch.float16, "cuda", q_mul=4.0)
    _check_against_references(q, k, v, do, True, 4.0 / math.sqrt(D))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [
    cfgs.BackwardConfig(128, 1, 32, 32),                 # the T4's: single-buffered 32-row steps
    cfgs.BackwardConfig(64, 1, 16, 16),
    cfgs.BackwardConfig(64, 2, 32, 48),
    cfgs.BackwardConfig(128, 2, 64, 64, warps=8),        # 128-row blocks
    cfgs.BackwardConfig(64, 2, 64, 64, warps=2),
    cfgs.BackwardConfig(128, 1, 32, 32, dq_atomic=True),
    cfgs.BackwardConfig(64, 2, 48, 32, warps=2, dq_atomic=True),   # 3 query tiles over 2 warps
    *(c for d in (64, 128) for c in cfgs.experiment_configs(d).values()),   # the measured alternatives
], ids=lambda c: f"D{c.head_dim}-st{c.stages}-m{c.dkdv_block_m}-n{c.dq_block_n}-w{c.warps}"
                 + ("-atomic" if c.dq_atomic else "") + ("-1bar" if c.one_barrier else "")
                 + ("-v4" if c.dq_stage else "") + ("-grid" if c.warp_grid else ""))
def test_backward_other_tile_configs(gen, cfg):
    from flashtut.cuda.compile import max_smem_per_block
    if max(cfg.dkdv_smem, cfg.dq_smem) > max_smem_per_block():
        pytest.skip("this configuration needs more shared memory than this GPU has")
    q, k, v, do = _inputs(gen, 1, 3, 333, 271, cfg.head_dim, torch.float16, "cuda")
    for causal in (False, True):
        _check_against_references(q, k, v, do, causal, None, config=cfg)


@pytest.mark.gpu
def test_backward_is_deterministic(gen):
    # with the separate dQ pass there are no atomics: the same inputs give the same bits (a race
    # on shared memory would show up here too)
    q, k, v, do = _inputs(gen, 2, 4, 1500, 1500, 128, torch.bfloat16, "cuda")
    o, lse = flashtut.tiled_attention(q, k, v, causal=True, return_lse=True)
    cfg = _default_config(128, deterministic=True)
    assert not cfg.dq_atomic
    first = ca.cuda_backward(q, k, v, o, lse, do, causal=True, config=cfg)
    for _ in range(3):
        again = ca.cuda_backward(q, k, v, o, lse, do, causal=True, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GRID_CONFIGS))
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, "top-left", "bottom-right"])
def test_backward_warp_grid_odd_shapes(name, D, dtype, causal):
    # the warp grid on lengths no tile divides, Nq < Nk and Nq > Nk, grouped K/V heads, one row
    from flashtut.cuda.compile import max_smem_per_block
    cfg = cfgs.experiment_configs(D)[name]
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the warp grid is built for sm_80 and newer")
    if cfg.dkdv_smem > max_smem_per_block():
        pytest.skip("this configuration needs more shared memory than this GPU has")
    for i, (B, H, Hkv, Nq, Nk) in enumerate([(1, 4, 2, 333, 271), (2, 3, 3, 77, 201), (1, 2, 2, 130, 67),
                                             (1, 2, 1, 1, 1)]):
        g = torch.Generator().manual_seed(10 * D + i)
        q = torch.randn(B, H, Nq, D, generator=g)
        k, v = (torch.randn(B, Hkv, Nk, D, generator=g) for _ in range(2))
        do = torch.randn(B, H, Nq, D, generator=g)
        q, k, v, do = (t.to("cuda", dtype) for t in (q, k, v, do))
        _check_against_references(q, k, v, do, causal, None, config=cfg)

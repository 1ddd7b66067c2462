"""Chapters 04-06: HBM traffic counting, the chapters' figures, and the exercise checkers (they
accept right answers, including the library's, and catch wrong ones)."""
import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import flashtut  # noqa: E402
from flashtut.costs import io_complexity as io  # noqa: E402
from flashtut.exercises import ch04, ch05, ch06  # noqa: E402
from flashtut.figures import online_softmax_plots, tiling_diagrams  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def _close(fig):
    import matplotlib.pyplot as plt
    plt.close(fig)


def _rand(gen, *shape, scale=1.0):
    return scale * torch.randn(*shape, generator=gen, dtype=torch.float64)


# ------------------------------------------------------------------------------ io_complexity

@pytest.mark.parametrize("n_q,n_k,d", [(1, 1, 1), (100, 77, 16), (256, 256, 64)])
def test_standard_traffic_is_nd_plus_n_squared(n_q, n_k, d):
    t = io.count(io.schedule("standard", n_q, n_k, d))
    assert t.reads == {"Q": n_q * d, "K": n_k * d, "S": n_q * n_k, "P": n_q * n_k, "V": n_k * d}
    assert t.writes == {"S": n_q * n_k, "P": n_q * n_k, "O": n_q * d}
    assert t.elements == 2 * n_q * d + 2 * n_k * d + 4 * n_q * n_k


@pytest.mark.parametrize("n_q,n_k,d,bm,bn", [(128, 128, 64, 32, 64), (100, 77, 16, 32, 10), (5, 300, 8, 64, 7)])
def test_flash2_traffic_formula(n_q, n_k, d, bm, bn):
    t = io.count(io.flash2_schedule(n_q, n_k, d, bm, bn))
    t_r = math.ceil(n_q / bm)
    assert t.reads == {"Q": n_q * d, "K": t_r * n_k * d, "V": t_r * n_k * d}
    assert t.writes == {"O": n_q * d, "lse": n_q}


@pytest.mark.parametrize("n,d,bm,bn", [(128, 64, 32, 64), (100, 16, 32, 10), (301, 8, 64, 7)])
def test_flash1_traffic_formula(n, d, bm, bn):
    t = io.count(io.flash1_schedule(n, n, d, bm, bn))
    t_c = math.ceil(n / bn)
    assert t.reads == {"K": n * d, "V": n * d, "Q": t_c * n * d, "O": t_c * n * d, "l": t_c * n, "m": t_c * n}
    assert t.writes == {"O": (t_c + 1) * n * d, "l": (t_c + 1) * n, "m": (t_c + 1) * n}


@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])
@pytest.mark.parametrize("n_q,n_k,bm,bn", [(100, 77, 16, 12), (64, 64, 16, 16), (37, 90, 8, 32), (90, 37, 32, 8)])
def test_causal_schedules_visit_exactly_the_tiles_with_a_visible_key(algorithm, n_q, n_k, bm, bn):
    hidden = flashtut.causal_mask(n_q, n_k)
    want = set()
    for i, q0 in enumerate(range(0, n_q, bm)):
        for j, k0 in enumerate(range(0, n_k, bn)):
            if not bool(hidden[q0:q0 + bm, k0:k0 + bn].all()):
                want.add((i, j))
    visits = set()
    for e in io.schedule(algorithm, n_q, n_k, 4, bm, bn, causal=True):
        if e.step is None:
            continue
        if algorithm == "flash2" and e.tensor == "K":
            visits.add(e.step)
        if algorithm == "flash1" and e.tensor == "Q":
            visits.add((e.step[1], e.step[0]))
    assert visits == want
    full = io.count(io.schedule(algorithm, n_q, n_k, 4, bm, bn)).elements
    assert io.count(io.schedule(algorithm, n_q, n_k, 4, bm, bn, causal=True)).elements < full


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k,bm,bn", [(100, 77, 32, 16), (33, 120, 16, 40)])
def test_tiled_attention_loads_match_the_flash2_schedule(causal, n_q, n_k, bm, bn, gen):
    B, H, D = 2, 3, 12
    q, k, v = _rand(gen, B, H, n_q, D), _rand(gen, B, H, n_k, D), _rand(gen, B, H, n_k, D)
    counted = io.count_slice_reads(
        lambda q, k, v: flashtut.tiled_attention(q, k, v, causal=causal, block_m=bm, block_n=bn), q=q, k=k, v=v)
    model = io.count(io.flash2_schedule(n_q, n_k, D, bm, bn, causal)).reads
    assert counted == {"q": B * H * model["Q"], "k": B * H * model["K"], "v": B * H * model["V"]}


def test_count_slice_reads_leaves_results_unchanged(gen):
    q, k, v = _rand(gen, 1, 2, 19, 8), _rand(gen, 1, 2, 23, 8), _rand(gen, 1, 2, 23, 8)
    out = {}
    io.count_slice_reads(lambda q, k, v: out.setdefault("o", flashtut.tiled_attention(q, k, v, block_m=8)),
                         q=q, k=k, v=v)
    assert type(out["o"]) is torch.Tensor
    torch.testing.assert_close(out["o"], flashtut.naive_attention(q, k, v), rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        io.count_slice_reads(lambda k: None, k=[1.0])


def test_block_sizes_for_sram():
    assert io.block_sizes_for_sram(32768, 64, "flash1") == (64, 128)
    assert io.block_sizes_for_sram(32768, 64, "flash2") == (128, 64)
    assert io.block_sizes_for_sram(1000, 128) == (2, 2)
    bm, bn = io.block_sizes_for_sram(98304, 128, "flash2")
    assert io.tile_footprint_elements(bm, bn, 128) <= 1.25 * 98304
    with pytest.raises(ValueError, match="sram_elements must be at least 4 \\* d = 512"):
        io.block_sizes_for_sram(511, 128)
    with pytest.raises(ValueError, match="algorithm"):
        io.block_sizes_for_sram(4096, 16, "flash3")


def test_flash_traffic_scales_as_n2_d2_over_m_and_standard_as_n2():
    n, d = 8192, 64
    for alg in ("flash1", "flash2"):
        small = io.hbm_traffic(alg, n, d, 16384).elements
        large = io.hbm_traffic(alg, n, d, 65536).elements
        assert 3.5 < small / large < 4.1                  # 4x the SRAM, about 4x less traffic
        doubled = io.hbm_traffic(alg, 2 * n, d, 16384).elements
        assert 3.9 < doubled / small < 4.1                # quadratic in N
    std = io.hbm_traffic("standard", n, d).elements
    assert std == 4 * n * d + 4 * n * n
    assert std > 4 * io.hbm_traffic("flash2", n, d, 65536).elements


def test_traffic_bytes_and_errors():
    t = io.hbm_traffic("flash2", 100, 16, block_m=32, block_n=32)
    mats = sum(t.reads.values()) + t.writes["O"]                  # Q, K, V reads and the O write
    assert t.bytes == 2 * mats + 4 * t.writes["lse"]
    with pytest.raises(ValueError, match="algorithm must be one of"):
        io.schedule("flash3", 10, 10, 4)
    with pytest.raises(ValueError, match="sram_elements"):
        io.hbm_traffic("flash1", 100, 16)
    with pytest.raises(ValueError, match="block_n must be a positive integer"):
        io.schedule("flash2", 10, 10, 4, 8, 0)


# ------------------------------------------------------------------------------ figures

def test_running_states_end_in_the_exact_state(gen):
    x = _rand(gen, 29, scale=5.0) + torch.linspace(0, 12, 29, dtype=torch.float64)
    states = online_softmax_plots.running_states(x, 4)
    assert [s["end"] for s in states] == [4, 8, 12, 16, 20, 24, 28, 29]
    assert states[-1]["m"] == float(x.max())
    assert states[-1]["d"] == pytest.approx(float(torch.exp(x - x.max()).sum()), rel=1e-12)
    for prev, cur in zip(states, states[1:]):
        assert (cur["rescale"] < 1.0) == (cur["m"] > prev["m"])
    assert any(s["rescale"] < 1.0 for s in states[1:])
    # the never-rescaled sum overshoots once the max has risen
    assert states[-1]["d_unrescaled"] > states[-1]["d"] * (1 + 1e-6)


def test_running_states_without_a_rise_need_no_rescale(gen):
    x = _rand(gen, 17)
    x[0] = 100.0
    states = online_softmax_plots.running_states(x, 5)
    assert all(s["rescale"] == 1.0 for s in states)
    assert states[-1]["d_unrescaled"] == pytest.approx(states[-1]["d"], rel=1e-12)


def test_figure_functions_return_figures(gen):
    figs = [online_softmax_plots.running_state_figure(_rand(gen, 21), 4),
            tiling_diagrams.loop_order_figure(3, 5),
            tiling_diagrams.loop_order_figure(4, 4, causal=True),
            tiling_diagrams.hbm_traffic_figure(d=64, sram_kib=(64,), ns=[256, 512]),
            tiling_diagrams.memory_vs_n_figure([256, 512, 1024], {"naive": [1e6, 4e6, None],
                                                                 "tiled": [2e6, 2.5e6, 3e6]})]
    for fig in figs:
        assert isinstance(fig, Figure)
        assert fig.axes
        _close(fig)


def test_figure_inputs_are_checked():
    with pytest.raises(ValueError, match="1-D"):
        online_softmax_plots.running_states(torch.ones(2, 3), 2)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        online_softmax_plots.running_states([1.0, 2.0], 2)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        online_softmax_plots.running_states(torch.ones(3), 0)
    with pytest.raises(ValueError, match="n_k_blocks must be an integer from 1 to 16"):
        tiling_diagrams.loop_order_figure(3, 40)
    with pytest.raises(ValueError, match="sram_kib"):
        tiling_diagrams.hbm_traffic_figure(sram_kib=())
    with pytest.raises(ValueError, match="has 1 values for 2 sizes"):
        tiling_diagrams.memory_vs_n_figure([1, 2], {"naive": [1.0]})


# ------------------------------------------------------------------------------ chapter 04

def test_ch04_checkers_accept_solutions_and_library():
    assert ch04.check_merge(ch04.solution_merge)
    assert ch04.check_merge(flashtut.merge_softmax_states)
    assert ch04.check_online_softmax(ch04.solution_online_softmax)
    assert ch04.check_online_softmax(lambda x, bs: flashtut.online_softmax(x, block_size=bs))
    assert ch04.check_combine_states(ch04.solution_combine_states)


def _no_rescale_softmax(x, bs):
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
    d = torch.zeros_like(m)
    for s in range(0, x.shape[-1], bs):
        blk = x[..., s:s + bs]
        m = torch.maximum(m, blk.amax(-1))
        d = d + torch.exp(blk - m[..., None]).sum(-1)
    return torch.exp(x - m[..., None]) / d[..., None]


def test_ch04_checkers_catch_wrong_answers():
    res = ch04.check_merge(lambda ma, da, mb, db: (torch.maximum(ma, mb), da + db))
    assert not res and "differ" in res.message and res.bad_positions
    assert not ch04.check_online_softmax(_no_rescale_softmax)
    res = ch04.check_online_softmax(lambda x, bs: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))
    assert not res and "NaN or Inf" in res.message
    assert not ch04.check_combine_states(lambda m, d: (m.amax(0), d.sum(0)))
    res = ch04.check_merge(lambda *a: 1 / 0)
    assert not res and "ZeroDivisionError" in res.message


# ------------------------------------------------------------------------------ chapter 05

def test_buggy_tiled_attention_is_right_when_the_max_is_in_the_first_block(gen):
    q, k, v = ch05.inputs_max_in_first_block(gen, B=2, H=3, Nq=41, Nk=67, D=20, block_size=16)
    assert not bool((ch05.max_rise_after_first_block(q, k, 16) > 0).any())
    torch.testing.assert_close(ch05.buggy_tiled_attention(q, k, v, 16), flashtut.naive_attention(q, k, v),
                               rtol=1e-12, atol=1e-12)


def test_buggy_tiled_attention_is_wrong_exactly_on_rows_whose_max_rises(gen):
    q, k, v = ch05.inputs_random(gen, B=2, H=3, Nq=41, Nk=67, D=20)
    rise = ch05.max_rise_after_first_block(q, k, 16)
    err = (ch05.buggy_tiled_attention(q, k, v, 16) - flashtut.naive_attention(q, k, v)).abs().amax(-1)
    assert 0 < int((rise > 0).sum()) < rise.numel()
    assert bool((err[rise == 0] < 1e-12).all())
    assert bool((err[rise > 0.05] > 1e-6).all())
    # one block holds every key: nothing can rise, and the loop is right
    torch.testing.assert_close(ch05.buggy_tiled_attention(q, k, v, 128), flashtut.naive_attention(q, k, v),
                               rtol=1e-12, atol=1e-12)


def test_buggy_tiled_attention_checks_inputs(gen):
    q = _rand(gen, 1, 1, 5, 4)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        ch05.buggy_tiled_attention(q, "k", q)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        ch05.buggy_tiled_attention(q, q, q, 0)
    with pytest.raises(ValueError, match="scale must be a positive finite float"):
        ch05.max_rise_after_first_block(q, q, 4, scale=-1.0)


def test_ch05_checker_fails_the_buggy_loop_only_where_the_max_rises():
    res = ch05.check_tiled_attention(ch05.buggy_tiled_attention)
    assert not res
    lines = res.message.splitlines()
    assert all(line.startswith("✓") for line in lines if line.startswith(("✓ case A", "✗ case A")))
    assert any(line.startswith("✗ case B") for line in lines)
    assert "exactly the rows whose max rose" in res.message


def test_ch05_checker_accepts_fixes():
    assert ch05.check_tiled_attention(ch05.solution_fixed_tiled_attention)
    assert ch05.check_tiled_attention(
        lambda q, k, v, bs: flashtut.tiled_attention(q, k, v, block_m=bs, block_n=bs))
    res = ch05.check_tiled_attention(lambda q, k, v, bs: q)
    assert not res


def test_ch05_traffic_checker():
    assert ch05.check_fa1_traffic(ch05.solution_fa1_traffic)
    res = ch05.check_fa1_traffic(lambda n, d, bm, bn: ch05.solution_fa1_traffic(n, d, bm, bn) - n)
    assert not res and "schedule moves" in res.message
    assert not ch05.check_fa1_traffic(lambda n, d, bm, bn: 3 * n * d + (n // bn) * (3 * n * d + 4 * n))


# ------------------------------------------------------------------------------ chapter 06

def test_ch06_checkers_accept_solutions_and_library():
    assert ch06.check_delta(ch06.solution_delta)
    assert ch06.check_dv_tile(ch06.solution_dv_tile)
    assert ch06.check_attention_backward(ch06.solution_attention_backward)

    def via_library(q, k, v, do, causal, scale):
        o, lse = flashtut.tiled_attention(q, k, v, causal=causal, scale=scale, return_lse=True,
                                          block_m=7, block_n=5)
        return flashtut.tiled_attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale,
                                                 block_m=7, block_n=5)
    assert ch06.check_attention_backward(via_library)


def test_ch06_checkers_catch_wrong_answers():
    assert not ch06.check_delta(lambda o, do: (o * do).sum(-2))
    # a softmax over the tile alone normalises over the wrong keys
    res = ch06.check_dv_tile(lambda q, kt, do, lse, sc: torch.softmax(q @ kt.transpose(-2, -1) * sc, -1)
                             .transpose(-2, -1) @ do)
    assert not res and "dv_tile" in res.message

    def no_scale_on_dq(q, k, v, do, causal, scale):
        dq, dk, dv = ch06.solution_attention_backward(q, k, v, do, causal, scale)
        return dq / scale, dk, dv
    res = ch06.check_attention_backward(no_scale_on_dq)
    assert not res and "(dq, dk, dv)[0]" in res.message

    def no_delta(q, k, v, do, causal, scale):
        s = q @ k.transpose(-2, -1) * scale
        if causal:
            s = s.masked_fill(flashtut.causal_mask(q.shape[2], k.shape[2]), float("-inf"))
        p = torch.softmax(s, -1)
        ds = p * (do @ v.transpose(-2, -1))
        return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ do
    assert not ch06.check_attention_backward(no_delta)


def test_autograd_reference_matches_library_backward(gen):
    q, k, v, do = _rand(gen, 1, 2, 23, 12), _rand(gen, 1, 2, 31, 12), _rand(gen, 1, 2, 31, 12), _rand(gen, 1, 2, 23, 12)
    for causal in (False, True):
        o, lse = flashtut.tiled_attention(q, k, v, causal=causal, scale=0.3, return_lse=True, block_m=8, block_n=16)
        got = flashtut.tiled_attention_backward(q, k, v, o, lse, do, causal=causal, scale=0.3, block_m=8, block_n=16)
        for g, w in zip(got, ch06.autograd_grads(q, k, v, do, causal=causal, scale=0.3)):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_traffic_figure_defaults_are_the_hardware_tables_shared_memory():
    import inspect

    from flashtut.hardware import GPUS
    default = inspect.signature(tiling_diagrams.hbm_traffic_figure).parameters["sram_kib"].default
    assert default == (GPUS["T4"].smem_per_block_kib, GPUS["H200-SXM"].smem_per_block_kib)


def test_recomputation_beats_the_round_trip_of_p_on_every_listed_gpu():
    # chapter 06: per score, a 16-bit write and read of P (4 bytes at W) against the 2d FLOPs
    # that recompute it (at F) and its exponential (at E); the round trip is the slower one everywhere
    from flashtut.hardware import GPUS
    ratios = {}
    for key in ("T4", "A100-80GB", "H100-SXM", "H200-SXM"):
        gpu = GPUS[key]
        for d in (64, 128):
            round_trip = 4 / (gpu.memory_bandwidth_gbps * 1e9)
            product = 2 * d / (gpu.peak_tflops(torch.float16) * 1e12)
            exp = 1 / (gpu.exp_tera_per_s * 1e12)
            assert round_trip / product == pytest.approx(2 * gpu.ridge_point(torch.float16) / d)
            assert round_trip > product + exp, (key, d)
            ratios[key, d] = (round_trip / product, round_trip / (product + exp))
    # "with the exponential it is 1.6 on the H200" where the product alone says 3.2
    assert f"{ratios['H200-SXM', 128][0]:.1f}" == "3.2" and f"{ratios['H200-SXM', 128][1]:.1f}" == "1.6"
    for key in ("H100-SXM", "H200-SXM"):                      # "the exponential halves the margin"
        assert ratios[key, 128][1] / ratios[key, 128][0] == pytest.approx(0.5, abs=0.01)
    assert "with the exponential it is 1.6 on the H200" in " ".join(_text("06_backward").split())


def test_traffic_ratio_is_about_m_over_2d2_as_the_glossary_says():
    # standard / FlashAttention-2 traffic with the paper's tiles, for the GPUs of chapter 5's table
    from flashtut.hardware import GPUS
    for key in ("T4", "A100-80GB", "H200-SXM"):
        m = GPUS[key].smem_per_block_kib * 1024 // 2
        for d in (64, 128):
            ratio = io.hbm_traffic("standard", 16384, d).elements / io.hbm_traffic("flash2", 16384, d, m).elements
            assert ratio == pytest.approx(m / (2 * d * d), rel=0.06)
    t4 = GPUS["T4"].smem_per_block_kib * 1024 // 2
    assert io.hbm_traffic("standard", 16384, 128).elements == pytest.approx(
        io.hbm_traffic("flash2", 16384, 128, t4).elements, rel=0.01)


def test_ch04_merge_checker_catches_a_merge_without_the_empty_guard():
    def no_guard(m_a, d_a, m_b, d_b):
        m = torch.maximum(m_a, m_b)
        return m, d_a * torch.exp(m_a - m) + d_b * torch.exp(m_b - m)   # nan where both are empty

    res = ch04.check_merge(no_guard)
    assert not res and "got nan, expected 0" in res.message
    assert ch04.check_merge(ch04.solution_merge) and ch04.check_merge(flashtut.merge_softmax_states)


# ------------------------------------------------------------------------ what chapters 04-06 say

NOTEBOOKS = __import__("pathlib").Path(__file__).resolve().parents[2] / "notebooks"


def _text(stem: str) -> str:
    import json
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    return " ".join(" ".join("".join(c["source"]) for c in nb["cells"]).split())


def test_combine_solution_keeps_the_empty_guard():
    m = torch.tensor([[float("-inf"), 2.0], [float("-inf"), float("-inf")]], dtype=torch.float64)
    d = torch.tensor([[0.0, 3.0], [0.0, 0.0]], dtype=torch.float64)
    m_total, d_total = ch04.solution_combine_states(m, d)
    assert m_total[0] == float("-inf") and d_total[0] == 0        # every worker saw the row empty
    assert m_total[1] == 2.0 and d_total[1] == 3.0
    assert ch04.check_combine_states(ch04.solution_combine_states)


def _cases(gen):
    for causal in (False, True):
        for nq, nk, bm, bn in ((50, 73, 16, 24), (73, 50, 32, 16), (64, 64, 64, 64), (33, 33, 5, 7)):
            q, k, v, do = (_rand(gen, 2, 2, n, 24) for n in (nq, nk, nk, nq))
            yield causal, bm, bn, q, k, v, do


def test_worked_forward_is_the_library_on_what_it_covers(gen):
    for causal, bm, bn, q, k, v, _ in _cases(gen):
        for dtype, tol in ((torch.float64, 1e-12), (torch.float16, 2e-3)):
            ql, kl, vl = (t.to(dtype) for t in (q, k, v))
            o, lse = ch05.solution_flash_forward(ql, kl, vl, causal, bm, bn)
            o_ref, lse_ref = flashtut.tiled_attention(ql, kl, vl, causal=causal, block_m=bm, block_n=bn,
                                                      return_lse=True)
            assert o.dtype == o_ref.dtype
            assert torch.allclose(o.double(), o_ref.double(), atol=tol, rtol=tol), (causal, bm, bn, dtype)
            assert torch.allclose(lse.double(), lse_ref.double(), atol=tol, rtol=tol)
    assert "show_source(ch05.solution_flash_forward)" in _text("05_tiled_attention")


def test_worked_backward_is_the_library_on_what_it_covers(gen):
    for causal, bm, bn, q, k, v, do in _cases(gen):
        o, lse = flashtut.tiled_attention(q, k, v, causal=causal, return_lse=True)
        mine = ch06.solution_flash_backward(q, k, v, o, lse, do, causal, bm, bn)
        ref = flashtut.tiled_attention_backward(q, k, v, o, lse, do, causal=causal, block_m=bm, block_n=bn)
        for a, b in zip(mine, ref):
            assert torch.allclose(a, b, atol=1e-12, rtol=1e-12), (causal, bm, bn)
    assert "show_source(ch06.solution_flash_backward)" in _text("06_backward")


def test_m_is_finite_after_the_first_tile_only_without_bottom_right_or_window(gen):
    # chapter 05: with top-left causal every row sees key 0; bottom-right with Nq > Nk leaves rows
    # that see nothing, which the library guards (output 0) and the worked version does not take
    q, k, v = (_rand(gen, 1, 1, n, 8) for n in (6, 3, 3))
    o = flashtut.tiled_attention(q, k, v, causal="bottom-right", block_m=2, block_n=2)
    assert torch.isfinite(o).all() and (o[0, 0, :3] == 0).all()
    assert torch.allclose(o, flashtut.naive_attention(q, k, v, causal="bottom-right"))
    text = _text("05_tiled_attention")
    assert "because with this mask (top-left, no window) every query row sees key 0" in text
    assert "because every row sees key 0" not in text


def test_chapter_06_hand_example_numbers():
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    do = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    p = torch.softmax(q @ k.T, dim=-1)
    dp = do @ v.T
    delta = (p * dp).sum()
    assert torch.allclose(delta, (do * (p @ v)).sum())
    ds = p * (dp - delta)
    assert abs(ds.sum().item()) < 1e-15                       # the centring: a row of dS sums to 0
    text = _text("06_backward")
    quoted = (f"${p[0, 0]:.4f} \\cdot 1 + {p[0, 1]:.4f} \\cdot (-1) + {p[0, 2]:.4f} \\cdot 0 = "
              f"{delta:.4f}$")
    assert quoted in text
    # "key 1 ... and key 2 ... pushed down by about the same amount"
    assert ds[0, 1] < 0 and ds[0, 2] < 0 and abs(ds[0, 1] / ds[0, 2] - 1) < 0.05


def test_chapter_06_states_the_dq_route_each_kernel_takes():
    from flashtut.cuda import configs as cuda_configs
    from flashtut.triton import configs as triton_configs
    smem = 227 * 1024
    # chapter 8: float32 atomics for dQ from sm_80; the separate pass with deterministic=True or on a T4
    assert cuda_configs.pick_config(128, 90, smem).dq_atomic
    assert cuda_configs.pick_config(64, 80, 163 * 1024).dq_atomic
    assert not cuda_configs.pick_config(128, 90, smem, deterministic=True).dq_atomic
    assert not cuda_configs.pick_config(128, 75, 64 * 1024).dq_atomic
    # chapter 7: the separate pass by default, everywhere
    for cap in ((8, 0), (9, 0)):
        for causal in (False, True):
            assert not triton_configs.fused_backward_default(cap, False, causal, False)
    text = _text("06_backward")
    assert "take the second route" not in text
    assert ("chapter 8's CUDA backward adds $dQ$ with **float32 atomics** on every GPU from sm_80" in text
            and "only with `deterministic=True` or on a T4 (sm_75)" in text)
    assert "chapter 7's Triton backward takes the **separate pass** by default" in text


def test_figure_backward_dataflow():
    fig = tiling_diagrams.backward_dataflow_figure(4, 6, causal=False, key_block=5, query_block=0)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    w, h = fig.get_size_inches()
    assert 1.2 < w / h < 2.5                                   # drawn at a natural aspect ratio
    _close(fig)
    with pytest.raises(ValueError, match="key_block"):
        tiling_diagrams.backward_dataflow_figure(4, 4, key_block=4)

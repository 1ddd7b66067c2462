"""Library code behind chapters 01-03: GPU facts, memory accounting, figures and exercise checkers."""
from __future__ import annotations

import json
import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import flashtut  # noqa: E402
from flashtut import hardware, results_data  # noqa: E402
from flashtut.bench import roofline as bench_roofline  # noqa: E402
from flashtut.bench.results import save_results  # noqa: E402
from flashtut.bench.memory import peak_extra_memory  # noqa: E402
from flashtut.costs import memory  # noqa: E402
from flashtut.exercises import ch01, ch02, ch03  # noqa: E402
from flashtut.figures import memory_plots, roofline, softmax_plots  # noqa: E402

MiB = 2 ** 20


# --- hardware table ---------------------------------------------------------------------------------

def test_gpu_table_is_sane():
    assert {"T4", "A100-40GB", "A100-80GB", "H100-SXM", "H200-SXM"} <= set(hardware.GPUS)
    for g in hardware.GPUS.values():
        assert g.source and "NVIDIA" in g.source
        assert 0 < g.smem_per_block_kib <= g.smem_per_sm_kib <= 256
        assert g.fp32_tflops < g.fp16_tensor_tflops          # tensor cores are the fast path
        # on-chip shared memory is thousands of times smaller than device memory
        assert g.smem_total_mib * MiB * 1000 < g.memory_bytes
        assert 100 < g.ridge_point(torch.float16) < 400
    t4, h100, h200 = hardware.GPUS["T4"], hardware.GPUS["H100-SXM"], hardware.GPUS["H200-SXM"]
    assert t4.bf16_tensor_tflops is None and t4.smem_per_block_kib == 64
    # TF32 (Ampere and newer) runs at half the 16-bit tensor rate; Turing has none
    assert t4.tf32_tensor_tflops is None
    for g in hardware.GPUS.values():
        if g.compute_capability >= (8, 0):
            assert g.tf32_tensor_tflops == pytest.approx(g.fp16_tensor_tflops / 2, rel=0.01)
    with pytest.raises(ValueError, match="bfloat16"):
        t4.peak_tflops(torch.bfloat16)
    # the H200 is an H100 with more and faster memory
    assert h200.fp16_tensor_tflops == h100.fp16_tensor_tflops and h200.sm_count == h100.sm_count
    assert h200.memory_gb > h100.memory_gb and h200.memory_bandwidth_gbps > h100.memory_bandwidth_gbps
    # the "about 19 TB/s" of on-chip SRAM the FlashAttention paper quotes for the A100
    assert hardware.GPUS["A100-40GB"].smem_bandwidth_tbps == pytest.approx(19.5, abs=0.1)
    assert len(hardware.gpu_table()) == len(hardware.GPUS)
    table = hardware.format_gpu_table()
    assert table.count("\n") == len(hardware.GPUS) + 1 and "| T4 | 7.5 | 16 GB GDDR6 | 320 |" in table


def test_spec_for_device_names():
    assert hardware.spec_for("NVIDIA H200") is hardware.GPUS["H200-SXM"]
    assert hardware.spec_for("NVIDIA A100-SXM4-80GB") is hardware.GPUS["A100-80GB"]
    assert hardware.spec_for("NVIDIA A100-SXM4-40GB") is hardware.GPUS["A100-40GB"]
    assert hardware.spec_for("Tesla T4") is hardware.GPUS["T4"]
    assert hardware.spec_for("NVIDIA GeForce RTX 4090") is None
    with pytest.raises(TypeError, match="device_name"):
        hardware.spec_for(None)


def test_attainable_tflops_is_the_roofline():
    h200 = hardware.GPUS["H200-SXM"]
    ridge = h200.ridge_point()
    peak, bw = h200.fp16_tensor_tflops, h200.memory_bandwidth_gbps
    assert hardware.attainable_tflops(ridge, peak, bw) == pytest.approx(peak)
    assert hardware.attainable_tflops(ridge / 10, peak, bw) == pytest.approx(peak / 10)
    assert hardware.attainable_tflops(ridge * 10, peak, bw) == peak
    t = hardware.attainable_tflops(torch.tensor([1.0, 1e5]), peak, bw)
    assert t[0].item() == pytest.approx(bw * 1e9 / 1e12) and t[1].item() == pytest.approx(peak)
    with pytest.raises(ValueError, match="positive"):
        hardware.attainable_tflops(1.0, 0.0, bw)


def test_committed_roofline_data_has_provenance():
    data = results_data.load_roofline_data()
    assert set(data["provenance"]) >= {"provisional", "device", "note"}
    assert data["copy_bandwidth_GBps"] > 0
    assert set(data["matmul_tflops"]) >= {"float16", "bfloat16", "float32"}
    # a measured copy cannot beat the datasheet bandwidth
    assert data["copy_bandwidth_GBps"] <= hardware.GPUS["H200-SXM"].memory_bandwidth_gbps


def test_load_roofline_data_rejects_a_file_without_its_keys(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"copy_bandwidth_GBps": 1.0}))
    with pytest.raises(ValueError, match="not a flashtut.bench results file"):
        results_data.load_roofline_data(bad)
    speed = tmp_path / "speed.json"
    save_results(speed, "speed", [], {"date": "x"})
    with pytest.raises(ValueError, match="roofline"):
        results_data.load_roofline_data(speed)


def test_measurements_need_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        bench_roofline.measure_roofline()
    assert "H200" in results_data.roofline_data()["provenance"]["device"]


def test_ceilings_from_benchmark_rows():
    rows = bench_roofline.run_roofline("cpu", dtypes=("float32", "tf32"), copy_bytes=4 << 20, matmul_n=64,
                        warmup_ms=1, rep_ms=2)
    data = bench_roofline.ceilings_from_rows(rows, "cpu", "test")
    assert data["copy_bandwidth_GBps"] > 0 and set(data["matmul_tflops"]) == {"float32"}
    assert data["provenance"] == {"provisional": False, "device": "cpu", "note": "test"}
    with pytest.raises(ValueError, match="copy"):
        bench_roofline.ceilings_from_rows([], "cpu", "test")


@pytest.mark.gpu
def test_measurements_on_gpu():
    data = bench_roofline.measure_roofline()
    assert data["provenance"]["provisional"] is False
    assert 10 < data["copy_bandwidth_GBps"] < 10_000
    assert 0.5 < data["matmul_tflops"]["float16"] < 3_000


# --- memory accounting ------------------------------------------------------------------------------

def test_memory_table_exact_numbers():
    rows = {r.name: r for r in memory.attention_memory_table(1, 16, 2048, 128, torch.float16)}
    for name in "QKVO":
        assert rows[name].bytes == 8 * MiB
    assert rows["S"].bytes == rows["P"].bytes == 128 * MiB
    assert rows["total Q, K, V, O"].bytes == 32 * MiB
    assert rows["total"].bytes == (32 + 256) * MiB
    # naive_attention keeps S and P in float32: twice as large
    rows32 = {r.name: r for r in memory.attention_memory_table(1, 16, 2048, 128, torch.float16,
                                                                score_dtype=torch.float32)}
    assert rows32["S"].bytes == 256 * MiB and rows32["Q"].bytes == 8 * MiB
    # Nk != Nq
    rows_k = {r.name: r for r in memory.attention_memory_table(2, 3, 5, 7, torch.float32, Nk=11)}
    assert rows_k["K"].shape == (2, 3, 11, 7) and rows_k["S"].bytes == 2 * 3 * 5 * 11 * 4
    assert "| S |" in memory.format_table(memory.attention_memory_table(1, 1, 4, 2))
    with pytest.raises(ValueError, match="N must be a positive int"):
        memory.attention_memory_table(1, 1, 0, 2)
    with pytest.raises(ValueError, match="score_dtype"):
        memory.attention_memory_table(1, 1, 4, 2, score_dtype=torch.int32)


def test_max_seq_len_is_the_boundary():
    for cap, B, H, dt, n in [(16e9, 1, 16, torch.float16, 1), (80e9, 1, 16, torch.float32, 2),
                             (141e9, 2, 32, torch.bfloat16, 1), (2 * 16 * 1000 ** 2 * 4, 1, 16, torch.float32, 2)]:
        N = memory.max_seq_len(cap, B, H, dt, n)
        per = B * H * n * memory.element_size(dt)
        assert per * N * N <= cap < per * (N + 1) ** 2
    assert memory.max_seq_len(16e9, 1, 16) == 22360          # S alone, fp16, on a 16 GB T4
    with pytest.raises(ValueError, match="capacity_bytes"):
        memory.max_seq_len(0, 1, 1)


def test_kernel_traffic_and_intensity():
    B, H, N, D = 2, 3, 257, 64
    qk, sm, pv = memory.naive_attention_kernels(B, H, N, D, torch.float16)
    e = 2
    assert qk.flops == 2 * B * H * N * N * D
    assert qk.bytes_read == 2 * B * H * N * D * e and qk.bytes_written == B * H * N * N * e
    assert sm.bytes_read == sm.bytes_written == B * H * N * N * e
    assert pv.bytes_read == B * H * (N * N + N * D) * e and pv.bytes_written == B * H * N * D * e
    fused = memory.fused_attention_kernel(B, H, N, D, torch.float16)
    assert fused.bytes == 4 * B * H * N * D * e
    assert fused.flops == qk.flops + pv.flops + sm.flops
    # QK^T intensity tends to D (fp16 in and out) as N grows; the fused kernel's grows like N
    big = memory.naive_attention_kernels(1, 1, 1 << 20, 128, torch.float16)[0]
    assert big.intensity == pytest.approx(128, rel=1e-3)
    assert memory.fused_attention_kernel(1, 1, 4096, 128).intensity > 1000
    mm = memory.matmul_traffic(3, 5, 7, torch.float32)
    assert mm.intensity == pytest.approx(2 * 3 * 5 * 7 / ((21 + 35 + 15) * 4))
    assert "**total**" in memory.format_traffic([qk, sm, pv])


def test_trace_traffic_of_naive_attention_on_meta():
    q = torch.empty(1, 16, 2048, 128, dtype=torch.float16, device="meta")
    o, ops = memory.trace_traffic(flashtut.naive_attention, q, q, q)
    assert o.shape == q.shape and o.dtype == torch.float16
    names = [r.name for r in ops]
    assert names.count("bmm") == 2 and "_softmax" in names
    softmax = ops[names.index("_softmax")]
    assert softmax.bytes_read == softmax.bytes_written == 256 * MiB     # fp32 scores
    bmm = [r for r in ops if r.name == "bmm"]
    assert bmm[0].flops == bmm[1].flops == 2 * 16 * 2048 * 2048 * 128
    assert "bmm" in memory.format_ops(ops)
    assert bmm[0].writes["output"] == 16 * 2048 * 2048 and bmm[0].output == "(16, 2048, 2048) float32"


def test_trace_traffic_leaves_out_views():
    x = torch.randn(6, 10)
    _, ops = memory.trace_traffic(lambda t: t.transpose(0, 1).reshape(60).exp(), x)
    # reshape of a transposed tensor copies; transpose itself is a view and moves nothing
    assert all(r.name != "transpose" for r in ops)
    assert ops[-1].name == "exp" and ops[-1].bytes_read == ops[-1].bytes_written == 240


def test_peak_extra_memory_on_cpu_sees_the_score_matrix():
    q = torch.randn(1, 8, 1024, 32)
    fn = lambda: flashtut.naive_attention(q, q, q)                      # noqa: E731
    peak_extra_memory(fn, "cpu")                                 # warm-up
    got = peak_extra_memory(fn, "cpu")
    if got is None:
        pytest.skip("peak resident memory cannot be read on this OS")
    s = 8 * 1024 * 1024 * 4                                             # one fp32 score matrix
    assert 1.5 * s < got < 4 * s


def test_naive_attention_peak_matches_the_committed_h200_measurement():
    # book/data/memory_h200.json: torch.cuda.max_memory_allocated around one naive_attention call
    from flashtut import results_data
    rows, _ = results_data.load_results("memory_h200.json")
    naive = [r for r in rows if r["impl"] == "naive" and r["status"] == "ok"]
    assert len(naive) >= 4
    for r in naive:
        want = memory.naive_attention_peak_bytes(r["B"], r["H"], r["Nq"], r["D"], getattr(torch, r["dtype"]),
                                                 Nk=r["Nk"], causal=r["causal"])
        assert want == r["peak_extra_bytes"], (r["N"], want, r["peak_extra_bytes"])


def test_naive_attention_peak_by_dtype_and_mask():
    B, H, N, Nk, D = 2, 3, 40, 56, 24
    nn32 = B * H * N * Nk * 4
    # float32 inputs: no casts, so S, P and the output of P V are all that is added
    assert memory.naive_attention_peak_bytes(B, H, N, D, torch.float32, Nk=Nk) == 2 * nn32 + B * H * N * D * 4
    # float16 inputs: the float32 copy of V and the float32 P V as well
    assert (memory.naive_attention_peak_bytes(B, H, N, D, torch.float16, Nk=Nk)
            == 2 * nn32 + B * H * Nk * D * 4 + B * H * N * D * 4)
    # float64 keeps scores in float64
    assert memory.naive_attention_peak_bytes(B, H, N, D, torch.float64, Nk=Nk) == 2 * 2 * nn32 + B * H * N * D * 8
    # the causal mask (one byte per score, shared by batch and heads) is alive next to two score copies
    small_d = memory.naive_attention_peak_bytes(1, 1, 512, 2, torch.float32, causal=True)
    assert small_d == 2 * 512 * 512 * 4 + 512 * 512
    with pytest.raises(ValueError, match="causal"):
        memory.naive_attention_peak_bytes(1, 1, 4, 2, causal=1)
    with pytest.raises(ValueError, match="dtype"):
        memory.naive_attention_peak_bytes(1, 1, 4, 2, torch.int8)


@pytest.mark.gpu
def test_naive_attention_peak_on_gpu():
    B, H, N, D = 1, 4, 1024, 64
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
    fn = lambda: flashtut.naive_attention(q, k, v)                      # noqa: E731
    peak_extra_memory(fn, "cuda")
    assert peak_extra_memory(fn, "cuda") == memory.naive_attention_peak_bytes(B, H, N, D, torch.float16)


def test_softmax_pass_table():
    passes = {p.algorithm: p for p in memory.SOFTMAX_PASSES}
    assert passes["safe, three passes"].reads_of_x == 3
    assert passes["online (chapter 04)"].reads_of_x == 2
    assert passes["safe, three passes"].bytes(10, torch.float16) == 80


# --- figures ------------------------------------------------------------------------------------------

def test_figures_return_figures():
    from matplotlib.figure import Figure

    g = hardware.GPUS
    ks = memory.naive_attention_kernels(4, 16, 4096, 128) + [memory.fused_attention_kernel(4, 16, 4096, 128)]
    figs = [
        roofline.roofline_figure([(g[k].name, g[k].fp16_tensor_tflops, g[k].memory_bandwidth_gbps)
                                  for k in ("H200-SXM", "T4")], [(k.name, k.intensity) for k in ks]),
        memory_plots.attention_memory_figure(1, 16, 128, capacities={"T4": 16e9}, measured={1024: 6e7},
                                             score_dtype=torch.float32),
        memory_plots.traffic_figure(ks[:3], ks[3]),
        softmax_plots.exp_overflow_figure(),
        softmax_plots.safe_softmax_passes_figure(torch.randn(9) * 5 + 30),
    ]
    labels = [t.get_text() for t in figs[1].legends[0].get_texts()]
    assert "measured peak extra memory" in labels
    assert any("S and P fit up to N = 11,180" in t for t in labels)   # 2 * 16 * 4 * 11180^2 <= 16e9
    named = memory_plots.attention_memory_figure(1, 16, 128, measured={1024: 6e7}, measured_label="H200 run")
    assert "H200 run" in [t.get_text() for t in named.legends[0].get_texts()]
    figs.append(named)
    import matplotlib.pyplot as plt
    for f in figs:
        assert isinstance(f, Figure)
        plt.close(f)
    with pytest.raises(ValueError, match="roofs"):
        roofline.roofline_figure([])
    with pytest.raises(ValueError, match="1-D"):
        softmax_plots.safe_softmax_passes_figure(torch.randn(3, 3))


def test_exp_overflow_threshold():
    th = softmax_plots.exp_overflow_threshold(torch.float16)
    assert th["exact"] == pytest.approx(math.log(65504))
    assert th["last_finite"] == 11.0859375 and th["first_inf"] == 11.09375
    assert th["last_finite"] < th["exact"] < th["first_inf"]
    x = torch.tensor([th["first_inf"], 0.0], dtype=torch.float16)
    assert torch.isnan(flashtut.naive_softmax(x)).any()
    assert torch.isfinite(flashtut.safe_softmax(x)).all()
    with pytest.raises(ValueError, match="dtype"):
        softmax_plots.exp_overflow_threshold(torch.int32)


# --- exercise checkers ---------------------------------------------------------------------------------

def _wrong_attention_no_scale(q, k, v, causal=False, scale=None):
    return ch02.solution_attention(q, k, v, causal, scale=1.0)


def _wrong_attention_no_mask(q, k, v, causal=False, scale=None):
    return ch02.solution_attention(q, k, v, False, scale)


def _wrong_attention_raises(q, k, v, causal=False, scale=None):
    raise NotImplementedError("not yet")


@pytest.mark.parametrize("check, right, wrongs", [
    (ch01.check_roofline, ch01.solution_roofline,
     [lambda i, p, b: torch.clamp(b * i, max=p), lambda i, p, b: b * 1e9 * i / 1e12]),
    (ch01.check_matmul_intensity, ch01.solution_matmul_intensity,
     [lambda M, N, K, e: 2 * M * N * K / ((M * K + K * N) * e), lambda M, N, K, e: M * N * K / ((M * K + K * N + M * N) * e)]),
    (ch01.check_unfused_intensities, ch01.solution_unfused_intensities,
     [lambda N, D, i, s: ch01.solution_unfused_intensities(N, D, i, i),        # scores as narrow as inputs
      lambda N, D, i, s: ch01.solution_unfused_intensities(N, D, i, s)[:2],    # a kernel missing
      lambda N, D, i, s: (2 * D / s, 5 / (2 * s), 2 * D / s)]),                # N x d traffic left out
    (ch02.check_attention, ch02.solution_attention,
     [_wrong_attention_no_scale, _wrong_attention_no_mask, _wrong_attention_raises]),
    (ch02.check_max_seq_len, ch02.solution_max_seq_len,
     [lambda c, B, H, e, n: math.isqrt(c // (B * H * e)), lambda c, B, H, e, n: math.isqrt(c // (n * B * H * e)) + 1]),
    (ch02.check_unfused_traffic, ch02.solution_unfused_traffic,
     [lambda B, H, N, D, e: 3 * B * H * N * N * e, lambda B, H, N, D, e: (4 * B * H * N * N + 3 * B * H * N * D) * e]),
    (ch03.check_softmax, ch03.solution_softmax, [flashtut.naive_softmax, lambda x: torch.exp(x) / x.numel()]),
    (ch03.check_log_softmax, ch03.solution_log_softmax,
     [lambda x: torch.log(flashtut.safe_softmax(x)), lambda x: x - x.amax(dim=-1, keepdim=True)]),
    (ch03.check_exp_threshold, ch03.solution_exp_threshold,
     [lambda dt: math.log(torch.finfo(dt).max), lambda dt: 11.0859375]),
])
def test_checkers_pass_right_and_catch_wrong(check, right, wrongs):
    res = check(right)
    assert res.ok, res.message
    assert res.message.startswith("✓")
    for wrong in wrongs:
        bad = check(wrong)
        assert not bad.ok
        assert "✗" in bad.message


def test_checker_messages_name_positions_and_inputs():
    res = ch02.check_attention(_wrong_attention_no_scale)
    assert "at (" in res.message and "inputs" in res.message and res.bad_positions
    res = ch02.check_max_seq_len(lambda c, B, H, e, n: math.isqrt(c // (B * H * e)))
    assert "the inputs at those positions" in res.message
    res = ch03.check_softmax(flashtut.naive_softmax)
    assert "NaN or Inf" in res.message
    res = ch02.check_attention(_wrong_attention_raises)
    assert "NotImplementedError" in res.message


def test_library_functions_pass_their_own_checkers():
    # the chapters' solutions and the library agree, so either can be the reference
    assert ch02.check_attention(lambda q, k, v, c, s: flashtut.tiled_attention(q, k, v, c, s, 16, 16)).ok
    assert ch03.check_softmax(flashtut.safe_softmax).ok
    assert ch03.check_softmax(lambda x: flashtut.online_softmax(x, 7)).ok


# --- what chapters 01-03 say, tied to the code ------------------------------------------------------

NOTEBOOKS = __import__("pathlib").Path(__file__).resolve().parents[2] / "notebooks"


def _text(stem: str) -> str:
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    return " ".join(" ".join("".join(c["source"]) for c in nb["cells"]).split())


def test_gpu_table_halves_fit_and_carry_the_exp_rate():
    mem, comp = hardware.format_gpu_table(part="memory"), hardware.format_gpu_table(part="compute")
    assert mem.splitlines()[0].count("|") == 8 and comp.splitlines()[0].count("|") == 6
    assert "| T4 | 7.5 | 16 GB GDDR6 | 320 |" in mem and "| H200 SXM | 989.4 | 989.4 | 67 | 3.9 |" in comp
    with pytest.raises(ValueError, match="part"):
        hardware.format_gpu_table(part="wide")


def test_exp_rate_is_sixteen_per_clock_per_sm_at_the_tensor_rate_clock():
    for g in hardware.GPUS.values():
        clock = g.rated_clock_mhz or g.boost_clock_mhz
        # the datasheet's dense fp16 rate is a whole number of FLOP per clock per SM at that clock
        per_clock = g.fp16_tensor_tflops * 1e12 / (g.sm_count * clock * 1e6)
        assert per_clock == pytest.approx(round(per_clock / 1024) * 1024, rel=0.01), g.name
        assert g.exp_tera_per_s == pytest.approx(g.sm_count * 16 * clock / 1e6)
    h = hardware.GPUS["H100-SXM"]
    assert h.exp_tera_per_s == pytest.approx(3.9, abs=0.05)           # FlashAttention-3's figure
    # one exponential costs the time of the 2d FLOPs of a d = 128 dot product (chapter 06)
    assert (1 / h.exp_tera_per_s) / (2 * 128 / h.fp16_tensor_tflops) == pytest.approx(1.0, abs=0.01)


def test_chapter_01_reads_the_ridge_and_names_chapter_11_for_wgmma():
    text = _text("01_memory_hierarchy")
    qk = memory.naive_attention_kernels(4, 16, 4096, 128, torch.float16)[0]
    ridge = hardware.GPUS["H200-SXM"].ridge_point(torch.float16)
    assert f"{qk.intensity / ridge:.2f} of the ridge point" in text
    assert f"they do {qk.intensity:.0f} FLOP per byte against a ridge of {ridge:.0f}" in text
    assert f"holds them to {qk.intensity / ridge:.0%} of the peak" in text
    assert "just left of the ridge" not in text
    assert "straight from shared memory, chapter 11.)" in text


def test_chapter_01_roofline_caption_names_the_gpu_and_file():
    ceilings = results_data.load_roofline_data()
    assert ceilings["provenance"]["device"] == "NVIDIA H200"
    assert "Measured on an NVIDIA H200; data: `h200_roofline.json`." in _text("01_memory_hierarchy")


def test_naive_attention_lesson_is_the_library_on_what_it_covers():
    gen = torch.Generator().manual_seed(5)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5), (torch.float16, 2e-3)):
        for causal in (False, True):
            for nq, nk in ((37, 53), (53, 37), (29, 29)):
                q, k, v = (torch.randn(2, 3, n, 24, generator=gen, dtype=torch.float64).to(dtype)
                           for n in (nq, nk, nk))
                for scale in (None, 0.31):
                    mine = ch02.naive_attention_lesson(q, k, v, causal=causal, scale=scale)
                    ref = flashtut.naive_attention(q, k, v, causal=causal, scale=scale)
                    assert mine.dtype == ref.dtype and mine.shape == ref.shape
                    assert torch.allclose(mine.double(), ref.double(), atol=tol, rtol=tol), \
                        (dtype, causal, nq, nk, scale)
    # and it is what the chapter reveals
    assert "show_source(ch02.naive_attention_lesson)" in _text("02_naive_attention")


def test_naive_attention_lesson_differs_where_the_library_goes_further():
    # bottom-right alignment is the library's (chapter 12): the lesson's top-left mask must differ
    q, k, v = (torch.randn(1, 1, n, 8, dtype=torch.float64) for n in (5, 9, 9))
    top_left = ch02.naive_attention_lesson(q, k, v, causal=True)
    assert torch.allclose(top_left, flashtut.naive_attention(q, k, v, causal=True))
    assert not torch.allclose(top_left, flashtut.naive_attention(q, k, v, causal="bottom-right"))


def test_naive_softmax_overflow_is_nan_only_where_exp_overflowed():
    x = torch.tensor([12.0, 3.0, 11.5, 0.0], dtype=torch.float16)
    y = flashtut.naive_softmax(x)
    assert torch.isnan(y[[0, 2]]).all() and (y[[1, 3]] == 0).all()
    one = flashtut.naive_softmax(torch.tensor([100.0, 3.0, 0.0]))
    assert torch.isnan(one[0]) and (one[1:] == 0).all()
    assert "[nan, 0, ..., 0]" in " ".join(flashtut.naive_softmax.__doc__.split())
    text = _text("03_safe_softmax")
    assert "turns its whole row" not in text and "[\\text{nan}, 0, \\dots, 0]" in text


def test_safe_softmax_error_grows_with_the_distance_below_the_max():
    # chapter 03: the shift's rounding is absolute, so exp(x - m)'s relative error grows with |x - m|
    gen = torch.Generator().manual_seed(0)
    x = (25.0 * torch.randn(64, 400, generator=gen)).clamp(-40.0, 40.0)
    ref = torch.softmax(x.double(), dim=-1)
    gap = (x.amax(dim=-1, keepdim=True) - x).double()

    def worst(fn, lo, hi):
        rel = ((fn(x).double() - ref) / ref).abs() / 2 ** -24
        return rel[(gap >= lo) & (gap < hi)].max().item()
    near, far = worst(flashtut.safe_softmax, 0, 2), worst(flashtut.safe_softmax, 64, 80)
    assert near < 8 and far > 5 * near
    assert worst(flashtut.naive_softmax, 64, 80) < 8           # one rounding of exp(x), wherever x is
    assert "for the price of an ulp or two" not in _text("03_safe_softmax")

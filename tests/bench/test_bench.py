"""The benchmark harness (``python -m flashtut.bench``) on the CPU, at tiny sizes."""
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import flashtut
from flashtut.bench import cli, registry
from flashtut.bench.accuracy import Reference
from flashtut.costs.flops import attention_flops, tflops
from flashtut.bench.memory import peak_extra_memory
from flashtut.bench.provenance import collect
from flashtut.bench.registry import AUTOGRAD, Impl
from flashtut.bench.results import load_results, save_results
from flashtut.bench.sweeps import Case, run_memory, run_speed
from flashtut.bench.timing import time_cpu

FAST = ["--warmup-ms", "1", "--rep-ms", "3", "--no-progress", "--device", "cpu"]
MiB = 2**20


@pytest.fixture(autouse=True)
def one_thread():
    # the CI machine has 2 cores shared with other work: one torch thread keeps times steady
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "flashtut.bench", *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})


# ------------------------------------------------------------------------------------ CLI
def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("run", "memory", "roofline", "host", "list", "examples:", "python -m flashtut.figures plot"):
        assert word in out


@pytest.mark.parametrize("sub", ["list", "run", "memory", "roofline", "host"])
def test_each_subcommand_has_help(sub, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([sub, "--help"])
    assert e.value.code == 0
    assert "usage: python -m flashtut.bench " + sub in capsys.readouterr().out


def test_run_writes_checked_rows_with_provenance(tmp_path, capsys):
    out = tmp_path / "speed.json"
    rc = cli.main(["run", "--impl", "naive,tiled", "-N", "37,70", "--nk", "45", "-D", "16,40", "--heads", "2",
                   "--batch", "2", "--dtype", "float32,float64", "--causal", "both", "--scale", "0.3",
                   "--mode", "fwd,bwd", *FAST, "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    doc = json.loads(out.read_text())
    assert doc["schema"] == "flashtut.bench/1" and doc["kind"] == "speed"
    prov = doc["provenance"]
    assert prov["device"]["type"] == "cpu" and prov["device"]["name"]
    assert prov["versions"]["torch"] == torch.__version__ and prov["versions"]["python"]
    assert "triton" in prov["versions"] and "cupy" in prov["versions"]
    assert prov["command"].startswith("python -m flashtut.bench run --impl naive,tiled")
    assert prov["date"].startswith("20") and "git" in prov
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * 2 * 2 * 2 * 2          # impl x N x D x dtype x causal x mode
    for r in rows:
        assert r["status"] == "ok", r
        assert r["Nk"] == 45 and r["B"] == 2 and r["H"] == 2 and r["scale"] == 0.3
        assert r["ms"] > 0 and r["tflops"] > 0
        assert r["flops"] == attention_flops(2, 2, r["Nq"], 45, r["D"], r["causal"], r["mode"])
        names = {"o", "lse"} if (r["impl"], r["mode"]) == ("tiled", "fwd") else {"o"}
        if r["mode"] == "bwd":
            names = {"o", "dq", "dk", "dv"}
        assert set(r["err"]) == names
        limit = 1e-12 if r["dtype"] == "float64" else 1e-4
        assert max(r["err"].values()) < limit, r["err"]
        assert r["ref"]["dtype"] == "float64"
    for word in ("impl", "TFLOP/s", "naive", "tiled", "wrote 64 rows"):
        assert word in printed


@pytest.mark.parametrize("argv, message", [
    (["run", "--impl", "nope"], "unknown implementation 'nope'"),
    (["run", "--dtype", "float8"], "unknown dtype 'float8'"),
    (["run", "-N", "0"], "expected a positive integer, got 0"),
    (["run", "-N", "-5"], "expected a positive integer, got -5"),
    (["run", "--mode", "sideways"], "unknown mode 'sideways'"),
    (["run", "--scale", "0"], "expected a positive finite number"),
    (["run", "--scale", "inf"], "expected a positive finite number, got 'inf'"),
    (["run", "--scale", "nan"], "expected a positive finite number, got 'nan'"),
    (["run", "--warmup-ms", "inf"], "expected a positive finite number, got 'inf'"),
    (["run", "--warmup-ms", "1e300"], "expected at most 60000 ms"),
    (["run", "--rep-ms", "-1"], "expected a positive finite number, got '-1'"),
    (["run", "--ref-budget-gib", "nan"], "expected a positive finite number"),
    (["run", "--seed", str(2**64)], "expected a seed from 0 to 2**63 - 1"),
    (["run", "--seed", "-1"], "expected a seed from 0 to 2**63 - 1"),
    (["run", "--seed", "1.5"], "expected an integer seed, got '1.5'"),
    (["run", "--threads", str(10**9)], "expected at most 4096 threads"),
    (["memory", "--seed", str(2**70)], "expected a seed from 0 to 2**63 - 1"),
    (["roofline", "--warmup-ms", "inf"], "expected a positive finite number, got 'inf'"),
    (["roofline", "--copy-mib", "0"], "expected a positive integer, got 0"),
    (["host", "--calls", "-3"], "expected a positive integer, got -3"),
    (["run", "-N", str(2**40)], "expected a positive integer up to 2**31 - 1"),
    (["memory", "--n-max", str(10**20)], "expected a positive integer up to 2**31 - 1"),
    (["run", "--heads", "2", "--hidden", "64"], "not allowed with argument"),
    (["memory", "--n-min", "64", "--n-max", "32"], "--n-min (64) must not exceed --n-max (32)"),
    (["roofline", "--dtype", "int4"], "unknown matmul dtype 'int4'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_arguments_exit_nonzero_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code != 0
    assert message in capsys.readouterr().err


def test_bad_argument_from_the_real_entry_point():
    # the one test through `python -m flashtut.bench` itself: its exit status and message
    res = _cli("run", "--impl", "naive,warp-drive")
    assert res.returncode == 2
    assert "unknown implementation 'warp-drive'" in res.stderr and "Traceback" not in res.stderr


def test_unavailable_implementations_are_reported_not_crashed(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ladder = [n for n in registry.names() if n.startswith("cuda-v")][:1] or ["cuda-v1"]
    impls = ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "triton", "cuda", *ladder]
    out = tmp_path / "u.json"
    rc = cli.main(["run", "--impl", ",".join(impls), "-N", "33", "-D", "16", "--heads", "1", "--batch", "1",
                   "--dtype", "float32", "--causal", "no", *FAST, "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["impl"] for r in rows} == set(impls) and len(rows) == 2 * len(impls)
    for r in rows:
        assert r["status"] == "unavailable" and r["reason"] and r["ms"] is None
    for name in impls:
        assert f"{name}: unavailable" in text
    assert "CUDA" in text and "TRITON_INTERPRET=1" in text and "Traceback" not in text

    assert cli.main(["list", "--device", "cpu"]) == 0
    listing = capsys.readouterr().out
    assert "naive" in listing and "available" in listing and "sdpa-flash" in listing and "unavailable:" in listing


# -------------------------------------------------------------------------------- FLOPs
def test_flop_counts_follow_the_protocol():
    fwd = attention_flops(2, 3, 128, 128, 64)
    assert fwd == 4 * 2 * 3 * 128 * 128 * 64
    assert attention_flops(2, 3, 128, 128, 64, causal=True) == fwd / 2
    assert attention_flops(2, 3, 128, 128, 64, mode="bwd") == 2.5 * fwd
    assert attention_flops(2, 3, 128, 128, 64, causal=True, mode="bwd") == 1.25 * fwd
    assert attention_flops(1, 1, 100, 300, 16) == 4 * 100 * 300 * 16
    assert tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert tflops(1.0, None) is None
    with pytest.raises(ValueError, match="mode"):
        attention_flops(1, 1, 8, 8, 8, mode="both")
    with pytest.raises(ValueError, match="Nq"):
        attention_flops(1, 1, 0, 8, 8)


# ---------------------------------------------------------------- the correctness gate
def _skip_first_key(q, k, v, causal, scale):
    # a plausible bug: a loop over keys that starts at 1 (and a causal mask one key off)
    return flashtut.naive_attention(q, k[:, :, 1:], v[:, :, 1:], causal=causal, scale=scale)


def _scaled_grads(q, k, v, o, lse, do, causal, scale):
    dq, dk, dv = flashtut.tiled_attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale)
    return dq, dk, 1.5 * dv


def _explodes(q, k, v, causal, scale):
    raise RuntimeError("kernel exploded")


def _refuses(q, k, v, causal, scale):
    raise ValueError(f"head dim {q.shape[-1]} is not supported; accepted: 64, 128")


def _nan_output(q, k, v, causal, scale):
    o = flashtut.naive_attention(q, k, v, causal=causal, scale=scale)
    o[0, 0, 0, 0] = float("nan")
    return o


FAKES = [
    Impl("fake-wrong-fwd", "skips key 0", _skip_first_key, AUTOGRAD),
    Impl("fake-wrong-bwd", "right forward, dv 1.5x too large",
         lambda q, k, v, c, s: flashtut.tiled_attention(q, k, v, causal=c, scale=s), _scaled_grads,
         forward_lse=lambda q, k, v, c, s: flashtut.tiled_attention(q, k, v, causal=c, scale=s, return_lse=True)),
    Impl("fake-explodes", "raises an unexpected error", _explodes, AUTOGRAD),
    Impl("fake-refuses", "refuses the head dim", _refuses, AUTOGRAD),
    Impl("fake-nan", "one NaN in the output", _nan_output, AUTOGRAD),
]


def test_the_check_catches_wrong_implementations():
    cases = [Case(1, 2, 50, 50, 24, torch.float32, causal=False), Case(2, 1, 50, 70, 24, torch.float32, causal=True)]
    with registry.registered(FAKES[0]), registry.registered(FAKES[1]), registry.registered(FAKES[2]), \
            registry.registered(FAKES[3]), registry.registered(FAKES[4]):
        rows = run_speed([f.name for f in FAKES] + ["naive"], cases, device="cpu", warmup_ms=1, rep_ms=2,
                         progress=False)
    status = {}
    for r in rows:
        status.setdefault((r["impl"], r["mode"]), set()).add(r["status"])
    assert status[("fake-wrong-fwd", "fwd")] == {"failed"}
    assert status[("fake-wrong-fwd", "bwd")] == {"failed"}
    assert status[("fake-wrong-bwd", "fwd")] == {"ok"}
    assert status[("fake-wrong-bwd", "bwd")] == {"failed"}
    assert status[("fake-explodes", "fwd")] == {"error"}
    assert status[("fake-refuses", "fwd")] == {"unavailable"}
    assert status[("fake-nan", "fwd")] == {"failed"}
    assert status[("naive", "fwd")] == status[("naive", "bwd")] == {"ok"}
    for r in rows:
        if r["status"] != "ok":
            assert r["ms"] is None and r["tflops"] is None and r["reason"]
    bad_dv = [r for r in rows if r["impl"] == "fake-wrong-bwd" and r["mode"] == "bwd"][0]
    assert bad_dv["err"]["dv"] > bad_dv["tol"]["dv"] and bad_dv["err"]["dq"] <= bad_dv["tol"]["dq"]
    assert [r for r in rows if r["impl"] == "fake-nan"][0]["err"]["o"] is None or \
        [r for r in rows if r["impl"] == "fake-nan"][0]["err"]["o"] == float("inf")
    assert "kernel exploded" in [r for r in rows if r["impl"] == "fake-explodes"][0]["reason"]


def test_a_failed_check_makes_the_cli_exit_nonzero(capsys):
    with registry.registered(FAKES[0]):
        rc = cli.main(["run", "--impl", "fake-wrong-fwd", "-N", "40", "-D", "16", "--heads", "1", "--batch", "1",
                       "--dtype", "float32", "--causal", "no", "--mode", "fwd", *FAST])
    captured = capsys.readouterr()
    assert rc == 1
    assert "failed" in captured.out and "failed their check" in captured.err


def test_low_precision_rows_record_the_flashattention_criterion():
    case = Case(1, 2, 40, 40, 32, torch.bfloat16, causal=True)
    rows = run_speed(["naive"], [case], modes=("fwd", "bwd"), device="cpu", warmup_ms=1, rep_ms=2, progress=False)
    for r in rows:
        assert r["status"] == "ok"
        assert set(r["torch_lowp_err"]) <= set(r["err"]) and r["torch_lowp_err"]["o"] > 0
        assert r["fa_criterion"] is True      # upcast naive beats bfloat16 PyTorch by a wide margin


def test_reference_slices_batch_and_heads_within_its_budget(gen):
    q, k, v, do = (torch.randn(3, 4, 30, 16, generator=gen) for _ in range(4))
    ref = Reference(q, k, v, do, causal=False, scale=None, budget_bytes=6 * 30 * 30 * 8 * 6)
    assert (ref.b, ref.h) == (1, 4)
    o = flashtut.naive_attention(q, k, v)
    assert ref.check_forward(o)["passed"]
    wrong = o.clone()
    wrong[0, 3, 7, 2] += 0.5                   # inside the slice: caught
    assert not ref.check_forward(wrong)["passed"]


def test_sdpa_adapters_run_through_their_backend_context():
    # the SDPA entries are GPU-only; copies allowed on the CPU exercise the same adapter code
    # (backend context around the forward, backward by autograd); the flash and math backends
    # both have CPU kernels
    copies = [dataclasses.replace(registry.get(n), name=n + "-on-cpu", available=lambda d, t, D: (True, ""))
              for n in ("sdpa-flash", "sdpa-math")]
    cases = [Case(2, 1, 45, 45, 32, torch.float32, causal=True, scale=0.4), Case(1, 2, 64, 64, 64, torch.bfloat16)]
    with registry.registered(copies[0]), registry.registered(copies[1]):
        rows = run_speed([c.name for c in copies], cases, device="cpu", warmup_ms=1, rep_ms=2, progress=False)
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows), [r["reason"] for r in rows]
    assert all(r["fa_criterion"] for r in rows if r["dtype"] == "bfloat16")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's CPU interpreter")
def test_triton_is_registered_and_checked_through_the_interpreter():
    pytest.importorskip("triton")
    rows = run_speed(["triton"], [Case(1, 2, 40, 50, 16, torch.float16, causal=True)], device="cpu",
                     warmup_ms=1, rep_ms=1, progress=False)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["reason"] for r in rows]
    assert set(rows[1]["err"]) == {"o", "dq", "dk", "dv"} and rows[1]["fa_criterion"] is not None


def test_tiled_is_refused_above_its_size_limit_unless_forced():
    tiled = registry.get("tiled")
    big = Case(1, 1, 2500, 2100, 16, torch.float32)
    rows = run_speed(["tiled"], [big], modes=("fwd",), device="cpu", progress=False)
    assert rows[0]["status"] == "unavailable" and "--force" in rows[0]["reason"]
    assert tiled.check("cpu", torch.float32, 16, big.shape, force=True) is None


def test_registry_lookup_and_registration_errors():
    with pytest.raises(ValueError, match="unknown implementation 'nope'.*naive"):
        registry.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Impl("naive", "again", _skip_first_key))
    with pytest.raises(TypeError, match="Impl"):
        registry.register("naive")
    assert [i.name for i in registry.expand("sdpa")] == ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math"]
    assert [i.name for i in registry.expand(["naive,tiled", "naive"])] == ["naive", "tiled"]


# -------------------------------------------------------------------------------- timing
def test_timing_excludes_the_warm_up():
    calls = []

    def fn():
        if not calls:
            time.sleep(0.3)          # a first call that compiles or allocates
        calls.append(1)

    ms = time_cpu(fn, warmup_ms=1, rep_ms=5)
    assert ms < 50 and len(calls) >= 4


# -------------------------------------------------------------------------------- memory
def test_peak_extra_memory_is_plausible(gen):
    def alloc_32mib():
        return torch.randn(8 * MiB, generator=gen)        # 32 MiB of float32, touched

    got = peak_extra_memory(alloc_32mib, "cpu")
    assert 31 * MiB <= got <= 40 * MiB, got / MiB
    assert peak_extra_memory(lambda: torch.ones(16), "cpu") < 4 * MiB

    q, k, v = (torch.randn(1, 4, 1024, 32, generator=gen) for _ in range(3))
    naive = peak_extra_memory(lambda: flashtut.naive_attention(q, k, v), "cpu")
    tiled = peak_extra_memory(lambda: flashtut.tiled_attention(q, k, v), "cpu")
    assert naive >= 30 * MiB          # a 16 MiB float32 score matrix and its probabilities
    assert tiled < 8 * MiB, tiled / MiB


def test_out_of_memory_is_an_answer_not_a_crash():
    def oom():
        raise MemoryError("no room")

    def cuda_oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    assert peak_extra_memory(oom, "cpu") is None
    assert peak_extra_memory(cuda_oom, "cpu") is None
    with pytest.raises(ValueError):
        peak_extra_memory(lambda: (_ for _ in ()).throw(ValueError("not memory")), "cpu")

    def big_oom(q, k, v, causal, scale):
        if q.shape[2] >= 128:
            raise MemoryError("too big")
        return flashtut.naive_attention(q, k, v, causal=causal, scale=scale)

    with registry.registered(Impl("fake-small-only", "OOM from N=128", big_oom, AUTOGRAD)):
        rows = run_memory(["fake-small-only"], [64, 128, 256], B=1, H=1, D=16, dtype="float32",
                          device="cpu", progress=False)
    assert [r["status"] for r in rows] == ["ok", "oom", "skipped"]
    assert "N=128" in rows[2]["reason"]


def test_memory_cli_writes_rows(tmp_path, capsys):
    out = tmp_path / "mem.json"
    rc = cli.main(["memory", "--impl", "naive,tiled", "-N", "128,512", "-H", "2", "-D", "32",
                   "--mode", "fwd,bwd", "--dtype", "float32", "--no-progress", "--device", "cpu", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    doc = load_results(out)
    assert doc["kind"] == "memory" and doc["provenance"]["command"].startswith("python -m flashtut.bench memory")
    rows = doc["rows"]
    assert len(rows) == 8 and all(r["status"] == "ok" and r["peak_extra_bytes"] >= 0 for r in rows)
    naive512 = [r for r in rows if r["impl"] == "naive" and r["N"] == 512 and r["mode"] == "fwd"][0]
    assert naive512["peak_extra_bytes"] >= 3.5 * MiB      # two 2 MiB float32 matrices at least
    assert "peak extra MiB" in text


# ------------------------------------------------------------------------------ roofline
def test_roofline_measures_copy_and_matmul(tmp_path, capsys):
    out = tmp_path / "roof.json"
    rc = cli.main(["roofline", "--device", "cpu", "--copy-mib", "8", "--matmul-n", "96", "--dtype",
                   "float32,bfloat16,tf32", "--warmup-ms", "1", "--rep-ms", "3", "--out", str(out)])
    assert rc == 0
    rows = load_results(out)["rows"]
    copy = [r for r in rows if r["what"] == "copy"][0]
    assert copy["bytes"] == 2 * 8 * MiB and copy["gb_per_s"] > 0
    mm = {r["dtype"]: r for r in rows if r["what"] == "matmul"}
    assert mm["float32"]["tflops"] > 0 and mm["bfloat16"]["status"] == "ok"
    assert mm["tf32"]["status"] == "unavailable"


# ---------------------------------------------------------------------------------- plots
def _fake_gpu_rows():
    rows = []
    for impl, scale in (("sdpa-flash", 1.0), ("triton", 1.1), ("cuda", 0.8), ("cuda-v1", 0.05),
                        ("cuda-v2", 0.4), ("cuda-v3", 0.7), ("naive", 0.1)):
        for n in (512, 1024, 2048):
            for mode in ("fwd", "bwd"):
                rows.append({"kind": "speed", "impl": impl, "mode": mode, "dtype": "float16", "B": 16384 // n,
                             "H": 16, "Nq": n, "Nk": n, "N": n, "D": 128, "causal": False, "status": "ok",
                             "tflops": 300 * scale * (1 + n / 4096), "ms": 1.0})
    for impl, per_n, oom_at in (("naive", 80.0, 2048), ("triton", 0.05, None)):
        for n in (512, 1024, 2048, 4096):
            status = "ok" if oom_at is None or n < oom_at else ("oom" if n == oom_at else "skipped")
            rows.append({"kind": "memory", "impl": impl, "mode": "fwd", "N": n, "B": 1, "H": 16, "D": 128,
                         "dtype": "float16", "causal": False, "status": status,
                         "peak_extra_bytes": int(per_n * n * n / 512) if status == "ok" else None})
    rows += [{"kind": "roofline", "what": "copy", "bytes": 2 * 2**30, "ms": 0.5, "gb_per_s": 4300.0, "status": "ok"},
             {"kind": "roofline", "what": "matmul", "dtype": "bfloat16", "n": 8192, "tflops": 700.0, "status": "ok"}]
    return rows


def test_plot_writes_every_figure_from_json(tmp_path, capsys):
    from flashtut.figures.__main__ import main as figures_main

    src = save_results(tmp_path / "gpu.json", "speed", _fake_gpu_rows(), collect("cpu", ["run"]))
    outdir = tmp_path / "fig"
    rc = figures_main(["plot", str(src), "--out-dir", str(outdir), "--format", "png"])
    text = capsys.readouterr().out
    assert rc == 0
    names = sorted(p.name for p in outdir.iterdir())
    assert names == ["ladder_bwd.png", "ladder_fwd.png", "memory.png", "ratios_to_sdpa-flash.md", "roofline.png",
                     "speed_D128_bwd.png", "speed_D128_fwd.png"]
    for p in outdir.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    table = (outdir / "ratios_to_sdpa-flash.md").read_text()
    assert "triton / sdpa-flash" in table and "1.10" in table
    assert "wrote" in text


def test_plot_functions_return_figures(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from flashtut.figures import bench_plots as plot

    rows = _fake_gpu_rows()
    for fig in (plot.speed_figure(rows, D=128, mode="fwd"), plot.memory_figure(rows),
                plot.ladder_figure(rows), plot.ladder_figure(rows, causal=(False, True), others=("naive",)),
                plot.roofline_figure(rows, points=[("attention", 100.0)])):
        assert isinstance(fig, Figure)
    assert plot.roofs_from_rows(rows) == [("bfloat16", 700.0, 4300.0)]
    ratios = plot.ratio_table(rows)
    assert len(ratios) == 6 and ratios[0]["ratios"]["triton"] == pytest.approx(1.1)
    with pytest.raises(ValueError, match="D=64"):
        plot.speed_figure(rows, D=64)
    with pytest.raises(ValueError, match="causal"):
        plot.ladder_figure(rows, causal="yes")


def test_case_table_and_ratio_summary():
    from flashtut.bench.report import case_table, format_ratio_summary, ratio_summary

    def row(impl, D, causal, tflops, status="ok"):
        return dict(kind="speed", impl=impl, mode="bwd", dtype="float16", B=1, H=2, N=64, Nq=64, Nk=64, D=D,
                    causal=causal, tflops=tflops, status=status)

    rows = [row("base", D, c, 200.0) for D in (64, 128) for c in (False, True)]
    rows += [row("a", 64, False, 100.0), row("a", 64, True, 400.0), row("a", 128, False, 300.0),
             row("b", 128, False, None, "error"), row("c", 128, True, 220.0)]
    header, body = case_table(rows, {"A": "a", "per D": {64: "a", 128: "c"}}, baseline="base")
    assert header == ["D", "N", "dtype", "causal", "base TFLOP/s", "A", "per D"]
    assert body[0] == ["128", "64", "fp16", "no", "200", "300 (1.50)", "-"]
    assert body[1] == ["128", "64", "fp16", "yes", "200", "-", "220 (1.10)"]
    assert body[2][5:] == ["100 (0.50)", "100 (0.50)"] and len(body) == 4
    summary = ratio_summary(rows, ["a", "b"], baseline="base")
    assert [(s["D"], s["impl"], s["cases"]) for s in summary] == [(128, "a", 1), (64, "a", 2)]
    assert summary[1]["gmean"] == pytest.approx(1.0) and (summary[1]["min"], summary[1]["max"]) == (0.5, 2.0)
    assert format_ratio_summary(summary, {"a": "A"}) == ["D = 128: A 1.500 (1.50 to 1.50)",
                                                         "D = 64: A 1.000 (0.50 to 2.00)"]


def test_a_legacy_layout_is_refused_with_what_is_accepted(tmp_path):
    anchors = {"what": "old layout", "rows": [
        {"impl": "sdpa-flash", "dtype": "float16", "D": 64, "N": 1024, "B": 16, "H": 32, "causal": False,
         "fwd_tflops": 280.0, "bwd_tflops": 210.0}]}
    path = tmp_path / "anchors.json"
    path.write_text(json.dumps(anchors))
    with pytest.raises(ValueError, match="schema None, kind None; accepted: schema 'flashtut.bench/1'"):
        load_results(path)


# ------------------------------------------------------------- output paths and partial results
def _not_measured(monkeypatch):
    """Any measurement fails the test: a bad output path must be refused before measuring."""
    def boom(*a, **k):
        raise AssertionError("measured although the output path is unusable")
    for name in ("run_speed", "run_memory", "copy_bandwidth", "matmul_rate"):
        monkeypatch.setattr(cli, name, boom)


@pytest.mark.parametrize("sub", ["run", "memory", "roofline"])
@pytest.mark.parametrize("where", ["under-a-file", "a-folder", "trailing-slash"])
def test_unusable_out_paths_exit_2_before_measuring(sub, where, tmp_path, monkeypatch, capsys):
    _not_measured(monkeypatch)
    afile = tmp_path / "results.json"
    afile.write_text("{}")
    out = {"under-a-file": str(afile / "child.json"), "a-folder": str(tmp_path),
           "trailing-slash": str(tmp_path / "new") + "/"}[where]
    with pytest.raises(SystemExit) as e:
        cli.main([sub, "--device", "cpu", "--out", out])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--out" in err and ("is a file, not a folder" in err or "is a folder" in err), err


def test_figures_out_dir_that_is_a_file_exits_2(tmp_path, capsys):
    from flashtut.figures.__main__ import main as figures_main

    src = save_results(tmp_path / "gpu.json", "speed", _fake_gpu_rows(), collect("cpu", ["run"]))
    for out_dir, message in ((src, "is a file"), (src / "sub", "is a file, not a folder")):
        with pytest.raises(SystemExit) as e:
            figures_main(["plot", str(src), "--out-dir", str(out_dir)])
        assert e.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        figures_main(["plot", str(src), "--format", "gif"])
    assert e.value.code == 2 and "unknown format 'gif'" in capsys.readouterr().err


def test_what_was_measured_is_written_when_a_later_step_fails(tmp_path, monkeypatch):
    def broken_table(*a, **k):
        raise RuntimeError("the table printer broke after the sweep")
    monkeypatch.setattr(cli, "speed_table", broken_table)
    out = tmp_path / "partial.json"
    with pytest.raises(RuntimeError, match="table printer"):
        cli.main(["run", "--impl", "naive", "-N", "33", "-D", "16", "--heads", "1", "--batch", "1",
                  "--dtype", "float32", "--causal", "no", *FAST, "--out", str(out)])
    rows = load_results(out)["rows"]
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)


def test_roofline_rows_are_saved_as_they_are_measured(tmp_path, monkeypatch):
    out = tmp_path / "roof.json"
    real = cli.matmul_rate
    calls = []

    def second_fails(*a, **k):
        calls.append(a)
        if len(calls) == 2:
            assert len(load_results(out)["rows"]) == 2      # the copy and the first matmul are on disk
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(cli, "matmul_rate", second_fails)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["roofline", "--device", "cpu", "--dtype", "float32,float32", "--copy-mib", "1",
                  "--matmul-n", "32", "--warmup-ms", "1", "--rep-ms", "2", "--out", str(out)])
    assert [r["what"] for r in load_results(out)["rows"]] == ["copy", "matmul"]


@pytest.mark.parametrize("row, why", [
    ({"N": "big"}, "row 1: N: got 'big'; accepted: a positive integer"),
    ({"tflops": -1.0}, "row 1: tflops: got -1.0"),
    ({"mode": "sideways"}, "row 1: mode: got 'sideways'"),
    ({"impl": None}, "row 1: impl: got None"),
    ({"causal": "yes"}, "row 1: causal: got 'yes'"),
    ({"status": "ok", "tflops": None}, "row 1: tflops: missing"),
    ({"kind": "weather"}, "row 1: kind: got 'weather'"),
])
def test_plot_on_malformed_rows_names_the_row_without_a_traceback(row, why, tmp_path):
    good = {"kind": "speed", "impl": "naive", "mode": "fwd", "dtype": "float32", "B": 1, "H": 1, "N": 64,
            "Nq": 64, "Nk": 64, "D": 16, "causal": False, "status": "ok", "tflops": 0.1, "ms": 1.0}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": "flashtut.bench/1", "kind": "speed", "provenance": {}, "config": {},
                                "rows": [good, dict(good, **row)]}))
    res = subprocess.run([sys.executable, "-m", "flashtut.figures", "plot", str(path), "--out-dir",
                          str(tmp_path / "f")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert why in res.stderr and str(path) in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("content, why", [
    ("[1, 2]", "has no 'rows' list"),
    ("{\"rows\": \"x\"}", "has no 'rows' list"),
    ("not json", "is not valid JSON"),
    ("{\"schema\": \"flashtut.bench/1\", \"kind\": \"speed\", \"provenance\": 3, \"rows\": []}",
     "'provenance' must be an object"),
])
def test_plot_on_files_that_are_not_results(content, why, tmp_path):
    from flashtut.figures.__main__ import main as figures_main

    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as e:
        figures_main(["plot", str(path), "--out-dir", str(tmp_path / "f")])
    assert e.value.code == 2


# -------------------------------------------------------------------- presets of the retired scripts
def test_presets_carry_their_implementations(tmp_path, capsys):
    out = tmp_path / "ladder.json"
    rc = cli.main(["run", "--preset", "cuda-ladder", "-N", "33", "-D", "16", "--hidden", "16", "--tokens", "33",
                   "--dtype", "float32", *FAST, "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = load_results(out)["rows"]
    impls = {r["impl"] for r in rows}
    assert {"naive", "cuda", "sdpa-flash"} <= impls and {r["mode"] for r in rows} == {"fwd", "bwd"}
    assert all(r["status"] == "ok" for r in rows if r["impl"] == "naive")
    assert all(r["status"] == "unavailable" and r["reason"] for r in rows if r["impl"] != "naive")
    for name in ("triton-autotune", "triton-sweep", "cuda-tiles"):
        assert name in cli.PRESETS and cli.PRESETS[name]["impls"]


def test_the_tile_group_names_the_launch_parameters():
    tiles = registry.expand("cuda-tiles")
    names = [i.name for i in tiles]
    assert names[0] == "cuda-v3[w8,n64,mt1]" and len(names) == len(set(names)) >= 6
    impl = registry.get("cuda-v3[w4,n32,mt2]")
    assert impl.check("cpu", torch.float16, 128) and "CUDA GPUs only" in impl.check("cpu", torch.float16, 128)
    assert "not among TILE_CHOICES for D=64" in registry.get("cuda-v3[w4,n32,mt2]").check("cuda", torch.float16, 64)
    with pytest.raises(ValueError, match="unknown implementation"):
        registry.get("cuda-v3[w4,n32]")


def test_host_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit) as e:
        cli.main(["host"])
    assert e.value.code == 2 and "host needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_host_overhead_rows_on_gpu(tmp_path):
    out = tmp_path / "host.json"
    assert cli.main(["host", "--impl", "sdpa-flash", "--calls", "20", "--out", str(out)]) == 0
    rows = load_results(out)["rows"]
    assert [r["entry"] for r in rows] == ["sdpa-flash fwd", "sdpa-flash fwd+bwd"]
    assert all(0 < r["us_per_call"] < 1e5 for r in rows)


def test_provenance_is_hostname_free():
    prov = collect("cpu", ["run", "--impl", "naive"])
    assert prov["command"] == "python -m flashtut.bench run --impl naive"
    host = socket.gethostname()
    if len(host) > 4:
        assert host not in json.dumps(prov)


# ---------------------------------------------------------------------------------- tools/ and make
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tools_hold_no_second_harness_and_share_one_common_script():
    tools = os.path.join(ROOT, "tools")
    scripts = sorted(os.listdir(tools))
    assert sorted(n for n in scripts if n.endswith(".py")) == ["layout_only.py", "run_notebooks_plain.py",
                                                             "sanitizer_launches.py"]
    shells = [n for n in scripts if n.endswith(".sh") and n != "gpu_common.sh"]
    assert shells == ["gpu_check.sh"], "a script tied to one study belongs in experiments/<study>/"
    # the experiments' GPU scripts share the same common script, from the repository root
    studies = sorted(str(p.relative_to(ROOT)) for p in Path(ROOT, "experiments").rglob("*.sh"))
    assert studies
    for name in [os.path.join("tools", n) for n in shells] + studies:
        text = open(os.path.join(ROOT, name)).read()
        assert "gpu_common.sh" in text, f"{name} does not source tools/gpu_common.sh"
        assert not re.search(r"[Ii]ssues? [0-9]", text), f"{name} points at the issue tracker"
    check = open(os.path.join(tools, "gpu_check.sh")).read()
    for stage in ("tests", "sanitizer", "protocol"):
        assert f"want {stage}" in check and f"T_{stage.upper()}" in check, stage
    assert "pytest" in open(os.path.join(tools, "gpu_common.sh")).read()
    assert "memcheck" in check and "racecheck" in check and "sanitizer_launches.py" in open(
        os.path.join(tools, "gpu_common.sh")).read()


def test_every_phony_make_target_has_a_rule():
    text = open(os.path.join(ROOT, "Makefile")).read()
    phony = next(line for line in text.splitlines() if line.startswith(".PHONY:")).split(":", 1)[1].split()
    for target in phony:
        lines = text.splitlines()
        i = next((i for i, line in enumerate(lines) if line.startswith(f"{target}:")), None)
        assert i is not None, f"make {target}: no rule"
        has_prerequisites = lines[i].split(":", 1)[1].strip() != ""
        has_recipe = i + 1 < len(lines) and lines[i + 1].startswith("\t")
        assert has_prerequisites or has_recipe, f"make {target}: a target with nothing to do"


def test_the_data_readme_names_only_scripts_that_exist():
    import re

    readme = open(os.path.join(ROOT, "book", "data", "README.md")).read()
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        for line in block.strip().splitlines():
            if line.startswith("git checkout"):       # a past commit's own scripts
                continue
            for script in re.findall(r"tools/[\w.]+", line):
                assert os.path.exists(os.path.join(ROOT, script)), f"{line}: {script} does not exist"


def test_the_measuring_cli_and_its_tables_load_no_matplotlib():
    code = ("import sys, flashtut.bench.cli, flashtut.bench.report, flashtut.results_data; "
            "print('matplotlib' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr


def test_plot_of_rows_that_cannot_be_drawn_says_why(tmp_path, capsys):
    from flashtut.figures.__main__ import main as figures_main

    failed = {"kind": "speed", "impl": "naive", "mode": "fwd", "dtype": "float32", "B": 1, "H": 1, "N": 64,
              "Nq": 64, "Nk": 64, "D": 16, "causal": False, "status": "failed", "tflops": 0.1, "ms": 1.0}
    src = save_results(tmp_path / "f.json", "speed", [failed], collect("cpu", ["run"]))
    assert figures_main(["plot", str(src), "--out-dir", str(tmp_path / "out")]) == 1
    assert "nothing written: no successful fwd speed rows with D=16" in capsys.readouterr().err


def test_the_gpu_scripts_name_only_tests_and_modules_that_exist():
    """A moved test file or module turns a device call into a wasted one: catch it here, on the CPU."""
    import importlib.util
    import re

    tools = os.path.join(ROOT, "tools")
    for name in sorted(os.listdir(tools)):
        if not name.endswith(".sh"):
            continue
        text = open(os.path.join(tools, name)).read()
        for path in re.findall(r"\btests/[\w/]+\.py", text):
            assert os.path.exists(os.path.join(ROOT, path)), f"tools/{name}: {path} does not exist"
        for module in re.findall(r"python3? -m (flashtut[\w.]*)", text):
            assert importlib.util.find_spec(module) is not None, f"tools/{name}: no module {module}"


# ------------------------------------------------------------------ tensor-core instruction ceilings
def test_instruction_peak_checks_its_arguments_and_says_why_it_cannot_run_on_the_cpu():
    from flashtut.bench.roofline import instruction_peak

    with pytest.raises(ValueError, match="instruction must be one of mma.sync, wgmma"):
        instruction_peak("cpu", "hmma")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        instruction_peak("cpu", "mma.sync", "float32")
    row = instruction_peak("cpu", "wgmma")
    assert row["status"] == "unavailable" and "CUDA GPU" in row["reason"] and row["tflops"] is None


def test_instruction_rows_pass_the_results_check_and_malformed_ones_are_named():
    from flashtut.bench.results import check_row
    from flashtut.bench.roofline import instruction_peak

    row = instruction_peak("cpu", "mma.sync", "bfloat16")
    assert check_row(row) is None
    ok = dict(row, status="ok", tflops=648.5, ms=2.2)
    assert check_row(ok) is None
    assert "instruction" in check_row(dict(ok, instruction=None))
    assert "dtype" in check_row(dict(ok, dtype=None))
    assert "measured rate" in check_row(dict(ok, tflops=None))
    assert "'instruction'" in check_row(dict(ok, what="hmma"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_instruction_ceilings_are_below_the_datasheet_and_wgmma_above_mma_sync_on_hopper(dtype):
    from flashtut.bench.roofline import instruction_peak
    from flashtut.hardware import spec_for

    cap = torch.cuda.get_device_capability()
    if dtype == "bfloat16" and cap < (8, 0):
        pytest.skip("bfloat16 tensor cores need sm_80")
    mma = instruction_peak("cuda", "mma.sync", dtype, warmup_ms=5, rep_ms=20)
    assert mma["status"] == "ok", mma
    spec = spec_for(torch.cuda.get_device_name())
    if spec is not None:     # the datasheet is the fastest instruction at the boost clock
        peak = spec.peak_tflops(getattr(torch, dtype))
        assert 0.2 * peak < mma["tflops"] <= 1.05 * peak, (mma, peak)
    if cap[0] == 9:
        wg = instruction_peak("cuda", "wgmma", dtype, warmup_ms=5, rep_ms=20)
        assert wg["status"] == "ok" and wg["tflops"] > mma["tflops"], (wg, mma)


def test_every_command_accepts_no_progress_as_the_gpu_scripts_pass_it():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    for name, p in sub.choices.items():
        assert "--no-progress" in p._option_string_actions, name


def test_layout_only_tells_a_rewrap_from_a_change(tmp_path):
    import subprocess
    import sys

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    src = tmp_path / "m.py"
    src.write_text('def f(a, b):\n    """Add."""\n    return a + b  # the sum\n')
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", "m.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m")
    tool = os.path.join(ROOT, "tools", "layout_only.py")

    def check():
        return subprocess.run([sys.executable, tool, "HEAD", "m.py"], cwd=tmp_path, capture_output=True,
                              text=True).returncode

    src.write_text('def f(a,\n      b):\n    """Add."""\n    # the sum\n    return (a\n            + b)\n')
    assert check() == 0                                   # layout only
    src.write_text('def f(a, b):\n    """Add."""\n    return a - b  # the sum\n')
    assert check() == 1                                   # the code changed
    src.write_text('def f(a, b):\n    """Add."""\n    return a + b  # the total\n')
    assert check() == 1                                   # a comment was reworded


def test_rung_table_puts_each_rung_beside_its_profile():
    from flashtut.bench.report import rung_table

    def row(impl, tflops, D=128, causal=False):
        return dict(kind="speed", impl=impl, mode="fwd", dtype="float16", B=1, H=1, N=256, Nq=256, Nk=256,
                    D=D, causal=causal, tflops=tflops)

    rows = [row("base", 100.0), row("base", 50.0, causal=True), row("a", 90.0), row("a", 60.0, causal=True),
            row("b", 300.0, D=64), row("base", 100.0, D=64)]
    profile = [dict(impl="a", tensor_pipe_pct=41.04, registers=255,
                    top_stalls_per_issue={"wait": 2.0, "selected": 1.0, "barrier": 0.5, "dispatch": 0.1})]
    header, body = rung_table(rows, profile, {"a": "first change", "b": "second"}, D=128, baseline="base")
    assert header[0] == "rung" and "base" in header[2]
    gmean = (0.9 * 1.2) ** 0.5
    assert body[0] == ["a", "first change", f"{gmean:.3f} (0.90 to 1.20)", "41.0", "255", "wait 2.00, barrier 0.50"]
    assert body[1] == ["b", "second", "-", "-", "-", "-"]      # no D = 128 case, no profile


def test_the_sanitizer_stage_passes_its_arguments_and_names_its_logs(tmp_path):
    # tools/gpu_common.sh's sanitizer(), with stand-ins for compute-sanitizer and python3 that record their
    # arguments: the whole launcher's log is TOOL.log, a subset's (--defaults) TOOL_defaults.log
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, body in (("compute-sanitizer", 'echo "args: $*"; echo "ERROR SUMMARY: 0 errors"'),
                       ("python3", 'echo "$*" >> "$OUT/warm.txt"')):
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    out = tmp_path / "out"
    script = (f". {os.path.join(ROOT, 'tools', 'gpu_common.sh')}; sanitizer 20 memcheck; "
              "sanitizer 20 synccheck --defaults")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(out)}
    res = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert (out / "memcheck.log").read_text().startswith(
        "args: --tool memcheck --print-limit 20 python3 tools/sanitizer_launches.py\n")
    assert (out / "synccheck_defaults.log").read_text().startswith(
        "args: --tool synccheck --print-limit 20 python3 tools/sanitizer_launches.py --defaults\n")
    assert (out / "warm.txt").read_text().splitlines() == ["tools/sanitizer_launches.py",
                                                          "tools/sanitizer_launches.py --defaults"]
    log = (out / "run.log").read_text()
    assert "sanitizer memcheck rc=0" in log and "sanitizer synccheck --defaults rc=0" in log


def _shipped_stage() -> str:
    """tools/gpu_check.sh's stage `shipped`, from its `if want shipped` to its `fi`."""
    check = open(os.path.join(ROOT, "tools", "gpu_check.sh")).read()
    block = check[check.index("if want shipped"):]
    return block[:block.index("\nfi")]


def test_the_shipped_stage_times_the_protocol_as_its_data_file_was_made():
    # tools/gpu_check.sh's stage `shipped` writes cuda_protocol_h200.json: its arguments are the command
    # the file's provenance records, less the progress flag and the output path
    import re
    import shlex

    from flashtut.results_data import commands

    block = _shipped_stage().replace("\\\n", " ")
    stage = re.search(r"bench \S+ cuda-protocol (run .*?) --out ", block).group(1).split()
    made = shlex.split(dict((f, c) for f, _, c in commands())["cuda_protocol_h200.json"])
    assert made[:3] == ["python", "-m", "flashtut.bench"]
    out = made.index("--out")
    made = [a for a in made[3:out] + made[out + 2:] if a != "--no-progress"]
    assert stage == made, (stage, made)


def test_the_shipped_stage_fits_one_device_call():
    # a device call runs 600 s at most: the stage `shipped`'s default limits, each command's
    # `${T_..:-seconds}` times the times its loop runs it, leave room for machine_info and the copy back
    import re

    total = 0
    for line in _shipped_stage().splitlines():
        limits = [int(x) for x in re.findall(r"\$\{T_\w+:-(\d+)\}", line)]
        loop = re.match(r"\s*for \w+ in ([^;]+);", line)
        total += sum(limits) * (len(loop.group(1).split()) if loop else 1)
    assert 300 <= total <= 540, total

"""Bad inputs to the command lines ``python -m flashtut.bench`` and ``python -m flashtut.figures``: every
one exits with status 2 and one line naming what was wrong, before anything is measured or drawn."""
from __future__ import annotations

import json

import pytest
import torch

from flashtut.bench import cli, real_models, results, roofline, sweeps
from flashtut.figures import __main__ as figures_cli

CPU = not torch.cuda.is_available()


@pytest.fixture
def nothing_runs(monkeypatch):
    """Any measurement started is a test failure: the checks must come first."""
    def boom(*a, **k):
        raise AssertionError("measured before the arguments were checked")
    for module, name in ((sweeps, "run_speed"), (sweeps, "run_memory"), (cli, "run_speed"), (cli, "run_memory"),
                         (real_models, "run_real_models"), (roofline, "copy_bandwidth"), (cli, "copy_bandwidth"),
                         (cli, "matmul_rate"), (cli, "instruction_peak")):
        monkeypatch.setattr(module, name, boom)


def _refused(argv, capsys, main=cli.main) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("value", ["-1", "nan", "0", "inf", "1e9", "soon"])
def test_profile_timeout_must_be_a_positive_finite_limit(value, capsys, nothing_runs):
    line = _refused(["profile", "--timeout-s", value], capsys)
    assert "--timeout-s" in line and repr(value) in line or value in line


@pytest.mark.parametrize("argv, option", [
    (["profile", "-D", ","], "--head-dim"),
    (["profile", "--set", "ladder,bogus"], "--set"),
    (["profile", "--launch", "bogus", "64"], "--launch"),
    (["profile", "--launch", "ladder", "x"], "--launch"),
    (["run", "--mode", ","], "--mode"),
    (["run", "--dtype", ","], "--dtype"),
    (["run", "-N", ","], "--seqlen"),
    (["run", "-N", "1,-3"], "--seqlen"),
    (["run", "--scale", "inf"], "--scale"),
    (["run", "--ref-budget-gib", "1e308"], "--ref-budget-gib"),
    (["run", "--warmup-ms", "nan"], "--warmup-ms"),
    (["run", "--baseline", "bogus", "--impl", "naive", "-N", "17", "-D", "8"], "--baseline"),
    (["roofline", "--matmul-n", "2147483647"], "--matmul-n"),
    (["roofline", "--copy-mib", "2147483647"], "--copy-mib"),
    (["roofline", "--what", "bogus"], "--what"),
    (["roofline", "--dtype", "bogus"], "dtype"),
    (["memory", "--n-min", "64", "--n-max", "16"], "--n-min"),
    (["host", "--label", " "], "--label"),
    (["host", "--calls", "0"], "--calls"),
    (["sass", "--arch", "bogus"], "--arch"),
    (["sass", "--torch-lib", "/nonexistent/libtorch_cuda.so"], "--torch-lib"),
    (["sass", "--what", "triton", "--triton-cache", "default=/nonexistent"], "--triton-cache"),
    (["sass", "--part", "/nonexistent.json"], "--part"),
    (["list", "-D", "0"], "--head-dim"),
])
def test_bad_options_name_themselves_in_one_line(argv, option, capsys, nothing_runs):
    assert option in _refused(argv, capsys)


def test_sass_of_triton_needs_a_cache_to_read(capsys, nothing_runs):
    # it printed nothing and exited 0: a run that counted no kernel must not look like success
    line = _refused(["sass", "--what", "triton"], capsys)
    assert "--triton-cache" in line


def test_sass_cache_and_speed_paths_must_be_what_they_say(tmp_path, capsys, nothing_runs):
    a_file = tmp_path / "x.json"
    a_file.write_text("{}")
    assert "--triton-cache" in _refused(["sass", "--what", "triton", "--triton-cache", f"default={a_file}"], capsys)
    assert "--speed" in _refused(["sass", "--what", "cuda", "--speed", f"default={tmp_path}"], capsys)
    assert "--listings" in _refused(["sass", "--what", "cuda", "--listings", str(a_file)], capsys)


@pytest.mark.skipif(not CPU, reason="the CPU's interpreter rule")
def test_real_models_small_on_a_cpu_needs_the_interpreter(monkeypatch, capsys, nothing_runs):
    # every row came back "error" and the command exited 1: say what to do instead
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    line = _refused(["real-models", "--small"], capsys)
    assert "TRITON_INTERPRET=1" in line
    assert "--small" in _refused(["real-models"], capsys)


def _speed_doc(N) -> dict:
    row = {"kind": "speed", "impl": "naive", "B": 1, "H": 1, "N": N, "D": 8, "dtype": "float32", "causal": False,
           "mode": "fwd", "tflops": 1.0, "ms": 1.0, "status": "ok"}
    return {"schema": results.SCHEMA, "kind": "speed", "provenance": {}, "config": {}, "rows": [row]}


@pytest.mark.parametrize("N", [2**63, 2**70, 10**400])
def test_figures_plot_refuses_a_size_beyond_int64(N, tmp_path, capsys):
    # a matplotlib traceback before; now the row is refused where the file is read
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_speed_doc(N)))
    line = _refused(["plot", str(path), "--out-dir", str(tmp_path / "figs")], capsys, figures_cli.main)
    assert "N:" in line and "2**63 - 1" in line and "big.json" in line
    assert not (tmp_path / "figs").exists()


def test_figures_plot_still_draws_the_largest_valid_size(tmp_path, capsys):
    assert results.check_row(_speed_doc(2**63 - 1)["rows"][0]) is None
    assert results.check_row(_speed_doc(0)["rows"][0]) is not None

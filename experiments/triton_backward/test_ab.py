"""The gate of ``ab.py`` on the CPU, under the Triton interpreter, at tiny sizes: every candidate
passes on right kernels, and a candidate whose kernels are wrong fails. ``pytest
experiments/triton_backward`` (not collected by the default test run)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

import ab  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run; on a GPU use gpu.sh")


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(ab, "DEVICE", "cpu")
    monkeypatch.setattr(ab, "GATE_SHAPES", [(40, 29)])


def test_gate_passes_every_candidate(tiny, tmp_path):
    rows = ab.gate(64, True, "float16", list(ab.CANDIDATES), str(tmp_path), H=1, capability=(9, 0))
    assert [r["candidate"] for r in rows] == list(ab.CANDIDATES)
    assert all(r["passed"] for r in rows), [r["error"] for r in rows]
    assert all(ab.gate_results(str(tmp_path)).values())


def test_gate_fails_a_wrong_candidate(tiny, tmp_path, monkeypatch):
    from flashtut.triton import attention as A
    real = A._backward

    def wrong(*args, **kw):             # dK off by a small relative error: a kernel bug the gate must see
        dq, dk, dv = real(*args, **kw)
        return dq, dk * 1.01, dv
    monkeypatch.setattr(A, "_backward", wrong)
    rows = ab.gate(64, False, "float16", ["base"], str(tmp_path), H=1)
    assert not rows[0]["passed"]
    assert ab.gate_results(str(tmp_path)) == {("base", 64, False, "float16"): False}


@pytest.fixture
def cpu_timing(tiny, monkeypatch):
    """The timing parts on the CPU: wall-clock timer, SDPA's default backend, a protocol of 64 tokens."""
    import contextlib
    import time as _time

    def wall(fn):
        t0 = _time.perf_counter()
        fn()
        return (_time.perf_counter() - t0) * 1e3
    monkeypatch.setattr(ab, "_bench", wall)
    monkeypatch.setattr(ab, "_flash", contextlib.nullcontext)
    monkeypatch.setattr(ab, "TOKENS", 48)
    monkeypatch.setattr(ab, "HIDDEN", 32)


def test_time_grid_writes_results_rows_and_skips_what_failed_the_gate(cpu_timing, tmp_path):
    from flashtut.bench.results import load_results
    ab.gate(32, False, "float16", ["fused"], str(tmp_path), H=1)          # passes
    with open(tmp_path / "gate_fake.json", "w") as f:                     # a candidate that failed
        f.write('[{"candidate": "autotuned", "D": 32, "causal": false, "dtype": "float16", "passed": false}]')
    rows = ab.time_grid(["base", "fused", "autotuned", "deep"], 2, str(tmp_path), 600, dims=(32,), lengths=(48,),
                        dtypes=("float16",))
    got = {(r["candidate"], r["causal"]) for r in rows}
    # base always; fused passed; autotuned failed and deep never reached the gate (causal: no gate row at all)
    assert got == {(n, c) for n in ("sdpa-flash", "base", "fused") for c in (False, True)} - {("fused", True)}
    assert all(len(r["ms_rounds"]) == 2 and r["ratio"] > 0 for r in rows)
    doc = load_results(tmp_path / "triton_backward.json")
    assert doc["kind"] == "speed" and len(doc["rows"]) == len(rows)
    assert ab.main(["summary", "--out-dir", str(tmp_path)]) == 0


def test_fwd_guard_times_both_dtypes_and_the_unguarded_call(cpu_timing, tmp_path):
    rows = ab.fwd_guard(1, str(tmp_path), N=48, dims=(32,), dtypes={"float32": torch.float32, "float16": torch.float16})
    assert {r["impl"] for r in rows} == {"triton-fp16", "triton-bf16", "triton-bf16-no-guard", "sdpa-flash-fp16",
                                         "sdpa-flash-bf16"}
    assert len(rows) == 10 and (tmp_path / "fwd_guard.json").is_file()
    from flashtut.triton import attention as A
    assert A.raise_if_overflowed.__name__ == "raise_if_overflowed"      # the guard is back in place

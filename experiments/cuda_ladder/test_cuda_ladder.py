"""The ladder's runner (``pytest experiments/cuda_ladder``; outside the default test run)."""
from __future__ import annotations

import sys
from pathlib import Path

from flashtut.bench.results import load_results

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_ladder as cl  # noqa: E402


def test_the_cuda_ladder_tool_runs_its_phases_and_saves_them(monkeypatch, tmp_path):
    """Its phases were once lost in a merge: the tool ran, measured nothing and exited 0."""
    called = []
    row = dict(impl="sdpa-flash-bwd", D=64, N=4096, B=4, H=32, dtype="float16", causal=False,
               bwd_ms=1.0, bwd_tflops=200.0)
    monkeypatch.setattr(cl, "first_calls", lambda log: called.append("first") or [])
    monkeypatch.setattr(cl, "warm_cache", lambda: called.append("warm"))
    monkeypatch.setattr(cl, "check", lambda log: called.append("check") or [])
    monkeypatch.setattr(cl, "check_bwd", lambda log: called.append("check_bwd") or [])
    monkeypatch.setattr(cl, "bench", lambda log, Ns, Ds, bwd, fwd=True: called.append(("bench", Ds, fwd)) or [row])
    out = tmp_path / "ladder.json"
    monkeypatch.setattr(sys, "argv", ["cuda_ladder", "--bwd-only", "--out", str(out)])
    monkeypatch.setattr(cl, "collect", lambda device, argv: {"device": "test"})
    cl.main()
    assert called == ["warm", "check_bwd", ("bench", (128,), False), ("bench", (64,), False)]
    assert len(load_results(out)["rows"]) == 2

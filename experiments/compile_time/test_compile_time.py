"""The compile-time study's runner (run with ``pytest experiments/compile_time``; outside the default
test run)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from flashtut.bench import results

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_time  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
A100, T4 = (80, 166912), (75, 65536)


def test_compile_time_rows_name_every_build_of_a_first_call(monkeypatch):
    compiled = []
    monkeypatch.setattr(compile_time.cc, "nvrtc_cubin", lambda code, arch, defines: compiled.append(defines))
    rows = compile_time.nvrtc_rows([torch.bfloat16], [80, 256], 80, A100[1], log=lambda *a: None)
    assert all(results.check_row(r) is None for r in rows)
    steps = [(r["D"], r["step"]) for r in rows]
    for D in (80, 256):
        assert [s for d, s in steps if d == D] == ["forward", "preprocess", "dkdv", "dq_convert",
                                                  "all, one by one", "all, threads"]
    assert {d["HEAD_DIM"] for d in compiled} == {96, 256} and len(compiled) == 2 * 3 * 4
    skipped = compile_time.nvrtc_rows([torch.float16], [256], 75, T4[1], log=lambda *a: None)
    assert len(skipped) == 1 and skipped[0]["status"].startswith("skipped")


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU message")
def test_compile_time_needs_a_gpu():
    with pytest.raises(RuntimeError, match="GPU"):
        compile_time.main(["--no-first-call"])

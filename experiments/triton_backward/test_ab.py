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
    monkeypatch.setattr(ab, "ODD_SHAPE", (23, 37))


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

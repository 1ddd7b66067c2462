"""Chapters 07 and 08 build their kernels up in teaching cells before the library's version is
shown. The cells are the chapters' own code, so they are tested where they live: the test copies
the notebook cells that define them into a module (``@triton.jit`` reads a function's source
from its file), imports it, and runs each step on fresh random inputs against the float64
reference, on sizes that do not divide the blocks. The step that the chapter shows to be wrong
on ragged sizes must stay wrong there, or the page would demonstrate nothing.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

import flashtut

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = """\
import math

import torch
import triton
import triton.language as tl

import flashtut
from flashtut.cuda.models import mma_layout as ml
tdev = "cpu"
"""


def teaching_module(notebook: str, names: set[str], tmp_path: Path):
    """The code cells of ``notebook`` that define any of ``names`` at top level, as a module."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    chosen, found = [], set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        try:
            tree = ast.parse(source)
        except SyntaxError:                 # IPython-only syntax (%pip): not a teaching cell
            continue
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if defined & names:
            # only the definitions: the cell's own demonstration runs in the book build
            body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
            chosen.append("\n".join(ast.get_source_segment(source, n, padded=False)
                                    if not getattr(n, "decorator_list", None) else
                                    _with_decorators(source, n) for n in body))
            found |= defined
    assert names <= found, f"{notebook} defines no {sorted(names - found)}"
    path = tmp_path / f"teaching_{Path(notebook).stem}.py"
    path.write_text(PRELUDE + "\n\n" + "\n\n\n".join(chosen) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_decorators(source: str, node) -> str:
    lines = source.splitlines()
    return "\n".join(lines[node.decorator_list[0].lineno - 1:node.end_lineno])


def _naive(q, k, v, causal=False):
    return flashtut.naive_attention(*(t[None].double() for t in (q, k, v)), causal=causal)[0]


def _qkv(gen, n_q, n_k, d=16, bh=2, dtype=torch.float32):
    return tuple(torch.randn(bh, n, d, generator=gen, dtype=dtype) for n in (n_q, n_k, n_k))


# ------------------------------------------------------------------ chapter 07

CH07 = {"run", "max_error", "followed_by_data", "fwd_step1", "fwd_step2", "fwd_step3", "dkdv_step"}


@pytest.fixture(scope="module")
def ch07(tmp_path_factory):
    return teaching_module("07_triton.ipynb", CH07, tmp_path_factory.mktemp("ch07"))


def test_step1_is_right_when_the_lengths_divide_the_block(ch07, gen):
    q, k, v = _qkv(gen, 32, 48)
    o = ch07.run(ch07.fwd_step1, q, k, v)
    torch.testing.assert_close(o.double(), _naive(q, k, v), atol=1e-5, rtol=1e-5)
    assert ch07.max_error(o, q, k, v) < 1e-5


def test_step1_is_wrong_on_a_ragged_length_as_the_chapter_shows(ch07, gen):
    q, k, v = _qkv(gen, 32, 37)
    o = ch07.run(ch07.fwd_step1, q, ch07.followed_by_data(k), ch07.followed_by_data(v))
    assert ch07.max_error(o, q, k, v) > 1e-2


@pytest.mark.parametrize("n_q, n_k", [(32, 37), (37, 53), (50, 29), (5, 70)])
def test_step2_is_right_on_ragged_lengths(ch07, gen, n_q, n_k):
    q, k, v = _qkv(gen, n_q, n_k)
    o = ch07.run(ch07.fwd_step2, q, ch07.followed_by_data(k), ch07.followed_by_data(v))
    torch.testing.assert_close(o.double(), _naive(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(37, 53), (50, 29)])
def test_step3_is_right_causal_or_not_with_its_lse(ch07, gen, n_q, n_k, causal):
    q, k, v = _qkv(gen, n_q, n_k)
    o, lse = ch07.run(ch07.fwd_step3, q, ch07.followed_by_data(k), ch07.followed_by_data(v),
                      with_lse=True, CAUSAL=causal)
    torch.testing.assert_close(o.double(), _naive(q, k, v, causal), atol=1e-5, rtol=1e-5)
    ref_lse = flashtut.attention_lse(q[None].double(), k[None].double(), causal=causal)[0]
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_step3_causal_differs_from_non_causal(ch07, gen):
    # the CAUSAL switch must change the answer, or the test above could pass without a mask
    q, k, v = _qkv(gen, 37, 53)
    o_c = ch07.run(ch07.fwd_step3, q, k, v, with_lse=True, CAUSAL=True)[0]
    o_n = ch07.run(ch07.fwd_step3, q, k, v, with_lse=True, CAUSAL=False)[0]
    assert (o_c - o_n).abs().max() > 1e-2


@pytest.mark.parametrize("n_q, n_k", [(37, 53), (50, 29)])
def test_dkdv_step_matches_the_tiled_backward(ch07, gen, n_q, n_k):
    import triton

    q, k, v = _qkv(gen, n_q, n_k)
    do = torch.randn(q.shape, generator=gen)
    o, lse = ch07.run(ch07.fwd_step3, q, k, v, with_lse=True, CAUSAL=False)
    delta = (do * o).sum(-1)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    ch07.dkdv_step[(triton.cdiv(n_k, 16), 2)](q, k, v, do, lse, delta, dk, dv, n_q, n_k,
                                              16 ** -0.5, D=16, BM=16, BN=16)
    _, dk_ref, dv_ref = flashtut.tiled_attention_backward(
        *(t[None].double() for t in (q, k, v, o, lse, do)))
    torch.testing.assert_close(dk.double(), dk_ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dv.double(), dv_ref[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ chapter 08

CH08 = {"v1_block", "v1_forward", "warp_tile_attention"}


@pytest.fixture(scope="module")
def ch08(tmp_path_factory):
    return teaching_module("08_cuda.ipynb", CH08, tmp_path_factory.mktemp("ch08"))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(37, 21), (20, 45)])
def test_v1_thread_loop_is_attention(ch08, gen, n_q, n_k, causal):
    q, k, v = (t[0] for t in _qkv(gen, n_q, n_k, d=8, bh=1, dtype=torch.float64))
    o = ch08.v1_forward(q, k, v, causal=causal)
    torch.testing.assert_close(o.double(), _naive(q[None], k[None], v[None], causal)[0],
                               atol=1e-9, rtol=1e-9)


def test_v1_block_is_right_when_a_late_key_raises_the_maximum(ch08, gen):
    # larger keys come last: a loop that forgot to rescale would be wrong here
    q, k, v = (t[0] for t in _qkv(gen, 16, 40, d=8, bh=1, dtype=torch.float64))
    k[-5:] *= 6.0
    block = ch08.v1_block(q, k, v, 0, causal=False)
    torch.testing.assert_close(block.double(), _naive(q[None], k[None], v[None])[0][:16],
                               atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("d", [16, 32])
def test_warp_tile_attention_is_softmax_of_the_scores_times_v(ch08, gen, d):
    q, k, v = (torch.randn(16, d, generator=gen, dtype=torch.float64) for _ in range(3))
    o = ch08.warp_tile_attention(q, k, v)
    want = torch.softmax(q @ k.T / math.sqrt(d), dim=-1) @ v
    torch.testing.assert_close(o.double(), want, atol=1e-5, rtol=1e-5)

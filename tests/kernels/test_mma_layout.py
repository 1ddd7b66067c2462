"""The mma.sync / ldmatrix layout model (flashtut.cuda.models.mma_layout), checked on the CPU.

The fragment tables are the PTX ISA's; the checks are independent of them: every element of
each tile is held exactly once, the lane-by-lane product equals ``a @ b``, two accumulators
reinterpreted in place are the A operand of the next product, and the kernels' ldmatrix
addresses deliver exactly the fragments ``mma.sync`` expects. Wrong addresses must fail.
"""
from __future__ import annotations

import pytest
import torch

from flashtut.cuda.models import mma_layout as ml
from flashtut.exercises import ch08


def _tile(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("element, regs, halves, shape", [
    (ml.a_element, 4, 2, (16, 16)), (ml.b_element, 2, 2, (16, 8)),
    (lambda lane, i, _h: ml.c_element(lane, i), 4, 1, (16, 8))])
def test_every_element_is_held_by_exactly_one_lane_value(element, regs, halves, shape):
    seen = [element(lane, r, h) for lane in range(32) for r in range(regs) for h in range(halves)]
    assert sorted(seen) == [(i, j) for i in range(shape[0]) for j in range(shape[1])]


def test_a_layout_agrees_with_exercise_8_2():
    for lane in range(32):
        for reg in range(4):
            for half in (0, 1):
                assert ch08.solution_a_fragment_owner(*ml.a_element(lane, reg, half)) == (lane, reg, half)


def test_the_ptx_table_on_a_few_entries():
    # lane 5: g = 1, t = 1
    assert ml.a_element(5, 0, 0) == (1, 2) and ml.a_element(5, 3, 1) == (9, 11)
    assert ml.b_element(5, 0, 1) == (3, 1) and ml.b_element(5, 1, 0) == (10, 1)
    assert ml.c_element(5, 2) == (9, 2) and ml.c_element(31, 3) == (15, 7)


def test_load_and_store_round_trip(gen):
    c = _tile(gen, 16, 8)
    assert torch.equal(ml.store_c(ml.load_c(c)), c)
    a = _tile(gen, 16, 16)
    assert ml.load_a(a)[6, 2, 1] == a[ml.a_element(6, 2, 1)]


def test_lane_by_lane_mma_is_the_matrix_product(gen):
    a, b, c = _tile(gen, 16, 16), _tile(gen, 16, 8), _tile(gen, 16, 8)
    d = ml.mma_m16n8k16(ml.load_a(a), ml.load_b(b), ml.load_c(c))
    torch.testing.assert_close(ml.store_c(d).double(), a @ b + c, rtol=1e-5, atol=1e-5)


def test_mma_with_fragments_from_a_wrong_layout_is_wrong(gen):
    a, b = _tile(gen, 16, 16), _tile(gen, 16, 8)
    wrong_b = b.T.reshape(16, 8)[ml._B]                  # B read as if it were stored n-major
    d = ml.mma_m16n8k16(ml.load_a(a), wrong_b, ml.load_c(torch.zeros(16, 8)))
    assert (ml.store_c(d).double() - a @ b).abs().max() > 0.1


def test_two_accumulators_are_one_a_operand(gen):
    p = _tile(gen, 16, 16)
    a = ml.c_to_a(ml.load_c(p[:, :8]), ml.load_c(p[:, 8:]))
    assert torch.equal(a, ml.load_a(p))


def test_quad_reductions_reduce_each_row_group(gen):
    x = _tile(gen, 32, 2)
    want_max = x.reshape(8, 4, 2).amax(1).repeat_interleave(4, 0)
    want_sum = x.reshape(8, 4, 2).sum(1).repeat_interleave(4, 0)
    assert torch.equal(ml.quad_max(x), want_max)
    torch.testing.assert_close(ml.quad_sum(x), want_sum)
    assert torch.equal(ml.shfl_xor(torch.arange(32), 3)[:4], torch.tensor([3, 2, 1, 0]))


def test_ldmatrix_addresses_of_the_kernel_deliver_mma_fragments(gen):
    q, k, v = _tile(gen, 16, 16), _tile(gen, 16, 16), _tile(gen, 16, 16)
    a_addr = [ml.a_addresses(lane) for lane in range(32)]
    b_addr = [ml.b_addresses(lane) for lane in range(32)]
    assert torch.equal(ml.ldmatrix_x4(q, a_addr), ml.load_a(q))
    # K key-major: B = K^T; registers 0, 1 for keys 0-7, registers 2, 3 for keys 8-15
    kf = ml.ldmatrix_x4(k, b_addr)
    assert torch.equal(kf[:, 0:2], ml.load_b(k[0:8].T)) and torch.equal(kf[:, 2:4], ml.load_b(k[8:16].T))
    # V key-major, transposed on the way: B = V; registers 0, 1 for columns 0-7, 2, 3 for 8-15
    vf = ml.ldmatrix_x4(v, a_addr, trans=True)
    assert torch.equal(vf[:, 0:2], ml.load_b(v[:, 0:8])) and torch.equal(vf[:, 2:4], ml.load_b(v[:, 8:16]))
    # the A addresses for K (quarters in the other order) do not give K's fragments
    assert not torch.equal(ml.ldmatrix_x4(k, a_addr)[:, 0:2], ml.load_b(k[0:8].T))


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="lane must be an int in \\[0, 32\\)"):
        ml.a_element(32, 0, 0)
    with pytest.raises(ValueError, match="reg must be in 0..3"):
        ml.a_element(0, 4, 0)
    with pytest.raises(ValueError, match="tile must have shape \\(16, 8\\)"):
        ml.load_b(torch.zeros(8, 16))
    with pytest.raises(TypeError, match="tile must be a torch.Tensor"):
        ml.load_a([[0.0] * 16] * 16)
    with pytest.raises(ValueError, match="one \\(row, col\\) per lane"):
        ml.ldmatrix_x4(torch.zeros(16, 16), [(0, 0)] * 31)

"""Chapter 11b exercises: the backward's operand layouts and its order of work, checked on the CPU.

``check_dq_descriptors`` stores random dS^T and K tiles where bwd_hopper.cu puts them and reads every
element of both operands of dQ = dS K back through the reader's descriptors, the way the tensor cores read
them (:func:`flashtut.cuda.models.hopper_layout.operand_address`); ``check_step_order`` plays the reader's
order of one query block against the dependency graph of :mod:`flashtut.cuda.models.hopper_bwd`.
"""
from __future__ import annotations

import random

from ..cuda.models import hopper_bwd as hbm
from ..cuda.models import hopper_layout as hl
from .checker import CheckResult

#: where the checker's tiles sit: both 128 x 128 (two 64-query blocks of dS^T, two 64-column blocks of K)
DS_BASE, K_BASE = 0, 65536


def _tiles(seed: int = 11):
    rng = random.Random(seed)
    ds_t = [[rng.random() for _ in range(128)] for _ in range(128)]   # [key][query]
    k = [[rng.random() for _ in range(128)] for _ in range(128)]      # [key][head dim]
    smem = {DS_BASE + hl.tile_offset(r, c, 128): ds_t[r][c] for r in range(128) for c in range(128)}
    smem.update({K_BASE + hl.tile_offset(r, c, 128): k[r][c] for r in range(128) for c in range(128)})
    return ds_t, k, smem


def check_dq_descriptors(dq_descriptors) -> CheckResult:
    """Check ``dq_descriptors(kp, qb, cb, ds_base, k_base) -> (desc_a, desc_b)``: the wgmma descriptors of
    k-step ``kp`` (keys 16 kp to 16 kp + 15) of one consumer's 64 x 64 dQ = dS K, with A = dS of query block
    ``qb`` read from the dS^T tile at ``ds_base`` and B = K of head-dim block ``cb`` read from the K tile at
    ``k_base``; both tiles are ``[2][128 keys][64]`` with the 128-byte swizzle, as ``tile_offset`` stores
    them. Every element of both operands is read back through the descriptors, MN-major."""
    ds_t, k, smem = _tiles()
    cases = [(kp, qb, cb) for kp in range(8) for qb in range(2) for cb in range(2)]
    for kp, qb, cb in cases:
        try:
            desc_a, desc_b = dq_descriptors(kp, qb, cb, DS_BASE, K_BASE)
            for name, desc, want in (("A (dS)", desc_a, lambda m, kk: ds_t[16 * kp + kk][64 * qb + m]),
                                     ("B (K)", desc_b, lambda m, kk: k[16 * kp + kk][64 * cb + m])):
                for m in range(64):
                    for kk in range(16):
                        got = smem.get(hl.operand_address(int(desc), m, kk, "MN"))
                        if got != want(m, kk):
                            what = (f"dS[query {64 * qb + m}][key {16 * kp + kk}]" if name.startswith("A")
                                    else f"K[key {16 * kp + kk}][column {64 * cb + m}]")
                            return CheckResult(False, f"✗ dq_descriptors{(kp, qb, cb, DS_BASE, K_BASE)}: operand "
                                               f"{name}, element (mn={m}, k={kk}) reads "
                                               f"{'no element of a tile' if got is None else 'another element'}; "
                                               f"expected {what}", n_total=len(cases), bad_positions=[(kp, qb, cb)])
        except Exception as exc:  # noqa: BLE001 - the reader's code or a malformed descriptor: say which call
            return CheckResult(False, f"✗ dq_descriptors{(kp, qb, cb, DS_BASE, K_BASE)} failed: "
                               f"{type(exc).__name__}: {exc}", n_total=len(cases))
    return CheckResult(True, f"✓ dq_descriptors: every element of dS and K read back in all {len(cases)} "
                       "k-steps, query blocks and head-dim blocks", n_total=len(cases))


def check_step_order(step_order) -> CheckResult:
    """Check ``step_order() -> list of step names``: an order of the steps of one query block
    (``hopper_bwd.STEPS``) that keeps every dependency and issues the dQ product so that its add into
    global memory runs while dV and dK are still on the tensor cores (``hopper_bwd.in_flight_at``)."""
    try:
        order = list(step_order())
        hbm.check_order(order)
    except Exception as exc:  # noqa: BLE001 - a wrong order or the reader's code raising: both are answers
        return CheckResult(False, f"✗ step_order: {type(exc).__name__}: {exc}")
    running = hbm.in_flight_at(order, "add dQ")
    if not {"dV", "dK"} <= set(running):
        return CheckResult(False, "✗ step_order keeps every dependency, but when 'add dQ' is issued the tensor "
                           f"cores still run {running or 'nothing'}: the add of dQ waits alone. Issue the dQ "
                           "product before dV and dK.")
    return CheckResult(True, "✓ step_order: every step after its inputs, and dQ's add under dV and dK")

"""Chapter 11 exercises: the layout arithmetic of a Hopper kernel, checked on the CPU.

Each ``check_*`` calls the reader's function on every case (or a large sample) and compares it
with :mod:`flashtut.cuda.hopper_layout`; the :class:`~flashtut.exercises.checker.CheckResult`
names the first inputs where the two differ and what each gave.
"""
from __future__ import annotations

from ..cuda import hopper_layout as hl
from .checker import CheckResult


def _check_cases(name: str, fn, ref, cases, show: int = 3) -> CheckResult:
    bad = []
    for args in cases:
        want = ref(*args)
        try:
            got = fn(*args)
        except Exception as exc:  # the reader's code raised: say where, instead of a traceback wall
            return CheckResult(False, f"✗ {name}{args} raised {type(exc).__name__}: {exc}", n_total=len(cases))
        if isinstance(want, tuple) and isinstance(got, list):
            got = tuple(got)
        if got != want:
            bad.append((args, got, want))
    if not bad:
        return CheckResult(True, f"✓ {name}: all {len(cases)} cases match", n_total=len(cases))
    lines = [f"✗ {name}: {len(bad)} of {len(cases)} cases differ"]
    lines += [f"  {name}{args} = {got!r}, expected {want!r}" for args, got, want in bad[:show]]
    return CheckResult(False, "\n".join(lines), n_bad=len(bad), n_total=len(cases),
                       bad_positions=[args for args, _, _ in bad[:show]])


def check_tile_offset(tile_offset) -> CheckResult:
    """Check ``tile_offset(row, col, rows)``: the byte offset of 16-bit element ``(row, col)`` in a
    ``[cols / 64][rows][64]`` tile with the 128-byte swizzle, for tiles of 64 and 128 rows and 128
    columns (every element)."""
    cases = [(r, c, rows) for rows in (64, 128) for r in range(rows) for c in range(128)]
    return _check_cases("tile_offset", tile_offset, hl.tile_offset, cases)


def check_accumulator_owner(accumulator_owner) -> CheckResult:
    """Check ``accumulator_owner(row, col, n) -> (thread, register)`` for the 64 x ``n`` float32
    accumulator of ``wgmma.m64nNk16``, for n = 64 and 128 (every element)."""
    cases = [(r, c, n) for n in (64, 128) for r in range(64) for c in range(n)]
    return _check_cases("accumulator_owner", accumulator_owner, hl.accumulator_owner, cases)


def check_descriptor(encode) -> CheckResult:
    """Check ``encode(start, lbo, sbo) -> int``: the 64-bit wgmma matrix descriptor of an operand
    with the 128-byte swizzle and base offset 0, on the operands of rung W1 and on single fields."""
    cases = [(0, 16, 1024), (16, 0, 0), (0, 16, 0), (0, 0, 16), (1024, 16384, 1024), (262128, 16, 1024)]
    for ks in range(8):
        for wg in (0, 1):
            a, b = (hl.decode_descriptor(d) for d in hl.w1_qk_descriptors(ks, 128, 128, wg, 1024, 33792))
            cases += [(a["start"], a["lbo"], a["sbo"]), (b["start"], b["lbo"], b["sbo"])]
    return _check_cases("encode", encode, lambda s, l, b: hl.encode_descriptor(s, l, b, "128B"), cases)


def check_ring_slot(ring_slot) -> CheckResult:
    """Check ``ring_slot(i, stages) -> (stage, parity)``: the shared-memory stage of the ``i``-th
    tile in a ring of ``stages`` buffers, and the mbarrier phase parity its consumer waits on."""
    cases = [(i, s) for s in (1, 2, 3, 4, 5) for i in range(40)]
    return _check_cases("ring_slot", ring_slot, hl.ring_slot, cases)


def check_register_budget(registers) -> CheckResult:
    """Check ``registers(head_dim, block_n) -> int``: the 32-bit registers per thread that rung W1's
    S and O accumulators, the P fragments and the running max and sum need."""
    cases = [(d, n) for d in (64, 128) for n in (64, 128)]
    return _check_cases("registers", registers, lambda d, n: sum(hl.w1_register_budget(d, n).values()), cases)

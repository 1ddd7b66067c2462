"""Chapter 11 exercises: the layout arithmetic of a Hopper kernel, checked on the CPU.

Each ``check_*`` calls the reader's function on every case (or a large sample) and compares it
with :mod:`flashtut.cuda.models.hopper_layout`; the :class:`~flashtut.exercises.checker.CheckResult`
names the first inputs where the two differ and what each gave.
"""
from __future__ import annotations

from ..bench.sass import exp2_between_waits
from ..cuda.models import hopper_layout as hl
from ..cuda.models import hopper_schedule as hs
from .checker import CheckResult


def _plain(x):
    """A reader's answer as plain Python values where it holds one: NumPy and torch scalars (and
    0-d arrays) as numbers, lists and tuples walked. Anything else, arrays of several values
    included, stays as it is (and then equals no expected value)."""
    if isinstance(x, (list, tuple)):
        return tuple(_plain(y) for y in x)
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) == 0 and hasattr(x, "item"):
        try:
            return x.item()
        except Exception:  # noqa: BLE001 - not a value we can read: leave it, it will not match
            return x
    return x


def _same(got, want) -> bool:
    """``got == want`` that never raises: an array, a tensor or an object whose comparison is not
    a plain True is not equal, and neither is a bool standing for a number."""
    got = _plain(got)
    if isinstance(want, tuple):
        return (isinstance(got, tuple) and len(got) == len(want)
                and all(_same(g, w) for g, w in zip(got, want)))
    if isinstance(got, bool) != isinstance(want, bool) and not (got is None or want is None):
        return False
    try:
        result = got == want
    except Exception:  # noqa: BLE001 - a comparison that fails is a wrong answer, not a crash
        return False
    return result is True or (type(result).__name__ == "bool_" and bool(result))


def _check_cases(name: str, fn, ref, cases, show: int = 3) -> CheckResult:
    bad = []
    for args in cases:
        want = ref(*args)
        try:
            got = fn(*args)
        except Exception as exc:  # the reader's code raised: say where, instead of a traceback wall
            return CheckResult(False, f"✗ {name}{args} raised {type(exc).__name__}: {exc}", n_total=len(cases))
        if not _same(got, want):
            bad.append((args, got, want))
    if not bad:
        return CheckResult(True, f"✓ {name}: all {len(cases)} cases match", n_total=len(cases))
    lines = [f"✗ {name}: {len(bad)} of {len(cases)} cases differ"]
    lines += [f"  {name}{args} = {_short(got)}, expected {want!r}" for args, got, want in bad[:show]]
    return CheckResult(False, "\n".join(lines), n_bad=len(bad), n_total=len(cases),
                       bad_positions=[args for args, _, _ in bad[:show]])


def _short(value) -> str:
    text = repr(value).replace("\n", " ")
    kind = type(value).__name__
    if hasattr(value, "shape") and not isinstance(value, (int, float)):
        text = f"{kind} of shape {tuple(value.shape)}: {text}"
    return text if len(text) <= 80 else text[:77] + "..."


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


def check_exp2_poly(exp2) -> CheckResult:
    """Check ``exp2(x) -> array``: 2^x for a float32 array ``x <= 0`` computed as ``ft_exp2_poly``
    (kernels/ft_common.cuh) does, bit for bit: clamp at -127, round by adding 1.5 * 2^23, the cubic
    :func:`flashtut.cuda.models.exp2_poly.coefficients` for 2^f, 2^j through the exponent field. Bit for bit,
    so that ``np.exp2`` (or any other accurate exponential) does not pass: it is a different function,
    off by up to 7.5e-5 relative. The input must come back unchanged."""
    import numpy as np

    from ..cuda.models import exp2_poly as ep

    rng = np.random.default_rng(11)
    x = np.concatenate([np.array([0.0, -0.5, -1.5, -126.5, -127.0, -300.0, -np.inf], dtype=np.float32),
                        rng.uniform(-130, 0, 20000).astype(np.float32),
                        -rng.exponential(1.5, 20000).astype(np.float32)])
    before = x.copy()
    try:
        got = exp2(x)
    except Exception as exc:  # the reader's code raised: say where, instead of a traceback wall
        return CheckResult(False, f"✗ exp2 raised {type(exc).__name__}: {exc}", n_total=x.size)
    try:
        got = got.detach().cpu().numpy() if hasattr(got, "detach") else np.asarray(got)
    except Exception as exc:  # noqa: BLE001 - not something an array can be made of
        return CheckResult(False, f"✗ exp2 returned {type(got).__name__}, which is not an array of numbers "
                                  f"({type(exc).__name__}: {exc})", n_total=x.size)
    if not np.array_equal(x.view(np.uint32), before.view(np.uint32)):
        return CheckResult(False, "✗ exp2 changed its input array: compute into new arrays", n_total=x.size)
    if got.shape != x.shape or got.dtype != np.float32:
        return CheckResult(False, f"✗ exp2 returned {got.dtype} of shape {got.shape}, expected float32 of "
                                  f"shape {x.shape}", n_total=x.size)
    want = ep.exp2_poly(x)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    if bad.size == 0:
        return CheckResult(True, f"✓ exp2: all {x.size} values match the kernel's bits", n_total=x.size)
    lines = [f"✗ exp2: {bad.size} of {x.size} values differ from the kernel's"]
    lines += [f"  exp2({x[i]!r}) = {got[i]!r}, expected {want[i]!r}" for i in bad[:3]]
    return CheckResult(False, "\n".join(lines), n_bad=int(bad.size), n_total=x.size,
                       bad_positions=[float(x[i]) for i in bad[:3]])


def check_turn_ring(first_turn, after_slot) -> CheckResult:
    """Check the turn rules of W3's consumers, two (ping-pong) or three (``c3_turns``), by playing the
    kernel's barrier protocol with them (:mod:`flashtut.cuda.models.hopper_schedule`): ``first_turn(cw,
    consumers)``, the named barrier consumer ``cw`` arrives on before its first slot (None: none), and
    ``after_slot(cw, slot, n_tiles, consumers)``, the one it arrives on after its turn in slot ``slot``
    of ``n_tiles + 1`` (None: it gives no turn). Consumer w waits on barrier 1 + w. Every block shape
    (tile counts up to 4, every pattern of skipped tiles) must finish, under random interleavings,
    with the turns going round 0, 1 (, 2), 0 ..."""
    shapes = {2: hs.block_shapes(2, 4), 3: hs.block_shapes(3, 3)}
    total = sum(len(s) for s in shapes.values()) * 2
    for consumers, cases in shapes.items():
        for n_tiles, mine in cases:
            for seed in range(2):
                where = f"{consumers} consumers, {n_tiles} tiles, their own {list(mine)}"
                try:
                    trace = hs.simulate(n_tiles, mine, 2, seed, policy=(first_turn, after_slot))
                except hs.ScheduleError as exc:
                    return CheckResult(False, f"✗ {where}: {str(exc).split(': ', 1)[1]}", n_bad=1, n_total=total)
                except Exception as exc:  # the reader's code raised
                    return CheckResult(False, f"✗ {where}: your function raised {type(exc).__name__}: {exc}",
                                       n_bad=1, n_total=total)
                want = [(cw, s) for s in range(n_tiles + 1) for cw in range(consumers)]
                if trace.turns != want:
                    return CheckResult(False, f"✗ {where}: the turns went {trace.turns[:8]} ..., expected "
                                              f"{want[:8]} ...", n_bad=1, n_total=total)
    return CheckResult(True, f"✓ turn ring: all {total} runs finish, in turn", n_total=total)


def _synthetic_sass(rng, between: int) -> str:
    """A listing shaped like a W3-family build's SASS around its loop (cuobjdump's line format): slot 0's
    softmax and its wait for everything (``0x0``), then the loop's S_j and P V products, the wait for S_j
    (``0x1``) with ``between`` exponentials after it among other arithmetic, the wait for the P V, more
    exponentials and the epilogue's wait."""
    lines, addr = [], 0

    def emit(instr):
        nonlocal addr
        lines.append(f"        /*{addr:04x}*/                   {instr} ;                /* 0x{rng.getrandbits(64):016x} */")
        addr += 16

    def arithmetic(exps):
        ops = ["MUFU.EX2 R{}, R{}".format(rng.randrange(200), rng.randrange(200)) for _ in range(exps)]
        ops += [rng.choice(["FFMA R4, R5, R6, R7", "FMNMX R8, R9, R10, !PT", "MUFU.RCP R11, R12",
                            "FADD R13, R14, R15", "@P0 BRA 0x0a40", "SHFL.BFLY PT, R16, R17, 0x1, 0x1f"])
                for _ in range(rng.randrange(30))]
        rng.shuffle(ops)
        for op in ops:
            emit(op)

    emit("WARPGROUP.ARRIVE")
    emit("HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ, !UPT, gsb0")
    emit("WARPGROUP.DEPBAR.LE gsb0, 0x0")
    arithmetic(rng.randrange(67))                       # slot 0's softmax, outside the loop
    emit("WARPGROUP.ARRIVE")
    emit("HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT, gsb0")
    emit("HGMMA.64x64x16.F32 R88, R152, gdesc[UR12], R88, gsb0")
    emit("WARPGROUP.DEPBAR.LE gsb0, 0x1")
    arithmetic(between)
    emit("WARPGROUP.DEPBAR.LE gsb0, 0x0")
    arithmetic(rng.randrange(67))
    emit("@P1 BRA 0x0400")
    emit("WARPGROUP.DEPBAR.LE gsb0, 0x0")
    arithmetic(rng.randrange(4))
    emit("EXIT")
    return "\n".join(lines) + "\n"


def check_exp2_between_waits(count) -> CheckResult:
    """Check ``count(sass) -> int``: in the SASS of a W3-family build, the ``MUFU.EX2`` between the loop's
    wait for S_j (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) and the next wait (section 11.12), on 200 listings of
    that shape with from 0 to 66 exponentials there and others before and after."""
    import random

    rng = random.Random(1112)
    listings = [_synthetic_sass(rng, rng.randrange(67)) for _ in range(200)]
    bad = []
    for i, sass in enumerate(listings):
        want = exp2_between_waits(sass)
        try:
            got = count(sass)
        except Exception as exc:  # the reader's code raised: say where, instead of a traceback wall
            return CheckResult(False, f"✗ count raised {type(exc).__name__} on listing {i}: {exc}", n_total=len(listings))
        if not _same(got, want):
            bad.append((i, got, want))
    if not bad:
        return CheckResult(True, f"✓ count: all {len(listings)} listings match", n_total=len(listings))
    i, got, want = bad[0]   # a listing is long: say which and the two counts, not the text
    return CheckResult(False, f"✗ count: {len(bad)} of {len(listings)} listings differ\n  first listing that "
                              f"differs (number {i}): yours {_short(got)}, expected {want}",
                       n_bad=len(bad), n_total=len(listings), bad_positions=[i for i, _, _ in bad[:3]])


def check_query_blocks(query_blocks) -> CheckResult:
    """Check ``query_blocks(n_q, block_m, tail_first) -> [(first row, one past the last row), ...]``, the
    rows of each query block of a W3 grid in the order of the block index, the short block last or (with
    ``tail_first``) first, against :func:`flashtut.cuda.models.hopper_layout.query_blocks`: every ``n_q`` from 1
    to 400 and the protocol's lengths around 4096, blocks of 64, 128 and 192 rows, both orders."""
    cases = [(n, bm, tf) for n in (*range(1, 401), 4095, 4096, 4097) for bm in (64, 128, 192) for tf in (False, True)]
    return _check_cases("query_blocks", query_blocks, lambda *a: tuple(hl.query_blocks(*a)), cases)

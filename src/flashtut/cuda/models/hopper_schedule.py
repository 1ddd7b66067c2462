"""The barrier protocol of rungs W3 and W4 (``kernels/fwd_w3_pingpong.cu``, ``fwd_w4_persistent.cu``), simulated.

W3 is three warpgroups of one block: a producer that fills a ring of K and V stages with TMA copies,
and two consumers that take turns on the tensor cores. Whether they ever stop for good depends on
every barrier phase being completed by someone, which a GPU run shows only for the shapes it happens
to try, and a hang shows nothing at all. Here the same operations, in the kernel's order, run as
three processes under a scheduler that picks who goes next at random (and lands each TMA copy at a
random later moment), many times over, for every tile count and every pattern of skipped tiles a
block can meet. The simulation stops with a :class:`ScheduleError` if

* every process is blocked and no copy is in flight (a deadlock: a wait on a phase never completed);
* a warpgroup waits on an mbarrier phase that has already been overtaken (its parity would read as
  not complete again: the ABA hazard of a two-valued phase bit);
* a named barrier's generation receives two arrivals from one warpgroup (its thread count would be
  reached by one side), completes with nobody waiting on it, or is left half counted at exit;
* two consumers hold the tensor-core turn at once, or the turns do not go round 0, 1, 0, 1 ... (0, 1, 2,
  0 ... with three);
* a wgmma group reads a stage that does not hold its tile, a TMA copy overwrites a stage that an
  unfinished wgmma group reads, a stage is released before the wgmma reading it finished, or the
  softmax / rescale touches registers that an unfinished group writes or reads.

The mbarrier model follows the PTX ISA: a phase completes when its pending arrivals reach zero and
the transaction bytes announced with ``expect_tx`` have landed; ``try_wait.parity p`` succeeds once the
phase of parity ``p`` has completed, that is while the current phase's parity differs from ``p``. A
named barrier (``bar.sync`` / ``bar.arrive`` with a thread count, here 256) completes when that many
threads have arrived; ``bar.arrive`` does not wait, ``bar.sync`` does. A consumer warpgroup's four warps
act together here (the kernel's release barriers count 8 = 2 warpgroups x 4 warps).

The three-consumer build (``W3_CONSUMERS=3``, 192-row blocks at D = 64) runs the same operations with
three tile counts and release barriers of 12 arrivals, with no turns (``simulate(..., turns=False)``)
or, built with ``W3_C3_TURNS``, with turns in a ring: consumer w waits on barrier 1 + w, which the
consumer before it (2 before 0) completes with its ``bar.arrive``.

Rung W4 (``kernels/fwd_w4_persistent.cu``) runs W3's operations for a sequence of query blocks in one
block: :func:`simulate_persistent`. The ring's tile count carries on across query blocks (tile g in
stage g % S, phase g / S), the turns go on alternating, and the Q buffer is refilled for the next query
block once every consumer warp has released it (one more mbarrier, ``q_empty``) after its last Q K^T.
The number of each query block reaches the consumers through a shared-memory slot written before
``q_full``'s arrival; after the last block, ``q_full`` completes with no copy and the consumers leave.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

#: named barrier ids of the consumers' turns (0 is __syncthreads')
TURN = (1, 2, 3)
#: warps per consumer warpgroup: its arrivals on a release barrier
WARPS = 4


class ScheduleError(AssertionError):
    """The simulated schedule broke a rule (see the module docstring)."""


def block_shapes(consumers: int, max_tiles: int) -> list[tuple[int, tuple[int, ...]]]:
    """Every block a W3 build with ``consumers`` consumer warpgroups meets, up to ``max_tiles`` key tiles:
    ``(n_tiles, my_tiles)`` with each consumer's own count from 0 (rows past Nq) to n_tiles (causal: a
    lower warpgroup sees fewer)."""
    import itertools

    return [(n, mine) for n in range(max_tiles + 1) for mine in itertools.product(range(n + 1), repeat=consumers)]


def parity(j: int, stages: int) -> int:
    """The mbarrier parity of tile ``j``'s fill (or release) of its stage: ``W3_PARITY`` in the kernel."""
    return (j // stages) & 1


# ------------------------------------------------------------------ the kernel's operations, in order
# ("wait", bar, parity, phase)   mbarrier try_wait.parity until it succeeds; phase: the one meant
# ("arrive", bar, count)         plain arrivals (a warpgroup's warps releasing a stage)
# ("load", bar, buf, tile)       the producer's arrive.expect_tx and the TMA copy into buffer buf
# ("sync", id) / ("bar_arrive", id) / ("end_turn",)   named barriers; end_turn: a turn given to nobody
# ("issue", name, reads)         a wgmma group: name "S3" / "PV2", reads [(buf, tile)]
# ("wgmma_wait", n)              all but the n newest groups of this warpgroup are complete
# ("regs", what)                 ordinary instructions on the registers: "softmax S3", "rescale+pack"

def _producer_block(n_tiles: int, stages: int, kv0: int, it: int, persistent: bool):
    # one query block: its Q (W4: once the consumers released the last block's), then K_j and V_j of
    # every tile, each after the release of the tile ``stages`` earlier in its stage; kv0 counts the
    # block's K/V tiles before this query block, it the query blocks before it
    if persistent and it > 0:
        yield ("wait", "q_empty", (it - 1) & 1, it - 1)
    yield ("load", "q_full", "Q", it)
    for g in range(kv0, kv0 + n_tiles):
        s = g % stages
        if g >= stages:
            yield ("wait", f"k_empty{s}", parity(g, stages) ^ 1, g // stages - 1)
        yield ("load", f"k_full{s}", f"K{s}", g)
        if g >= stages:
            yield ("wait", f"v_empty{s}", parity(g, stages) ^ 1, g // stages - 1)
        yield ("load", f"v_full{s}", f"V{s}", g)


def producer_ops(n_tiles: int, stages: int):
    """The producer thread of ``flash_fwd_w3``: Q, then K_j and V_j of every tile, each after the release
    of the tile ``stages`` earlier in its stage."""
    yield from _producer_block(n_tiles, stages, 0, 0, False)


def persistent_producer_ops(blocks, stages: int):
    """The producer thread of ``flash_fwd_w4``: W3's loads for each query block of ``blocks`` (``(n_tiles,
    my_tiles)`` pairs) in turn, the ring's tile count carried on, each Q after the consumers' release;
    then q_full completed with no copy, which tells the consumers that no query block is left."""
    kv0 = 0
    for it, (n_tiles, _) in enumerate(blocks):
        yield from _producer_block(n_tiles, stages, kv0, it, True)
        kv0 += n_tiles
    # no query block left: once Q is released, q_full completes with no copy (the slot says -1)
    it = len(blocks)
    yield ("wait", "q_empty", (it - 1) & 1, it - 1)
    yield ("arrive", "q_full", 1)


def consumer_ops(cw: int, n_tiles: int, my_tiles: int, stages: int, consumers: int = 2, **knobs):
    """Consumer warpgroup ``cw`` of ``flash_fwd_w3`` with ``my_tiles`` of the block's ``n_tiles``.

    ``consumers``: how many there are (2, or 3 for ``W3_CONSUMERS=3``). ``turns``: they take turns on
    named barriers in a ring (always with two: ping-pong; with three: ``W3_C3_TURNS``); without it the
    same operations run with no turn taken or given.
    The other keywords break one rule each, for the tests that show the simulation catches it: ``prime``
    (the last consumer gives consumer 0 its first turn), ``final_arrive`` (the last consumer also gives a
    turn after its last slot), ``interleave_idle`` (skipped tiles released in their slots, not all before
    the idle turns), ``own_barriers`` (one barrier id per consumer), ``wait_before_release`` (wgmma_wait
    before a stage is released). ``policy``, a pair of functions, replaces the kernel's turn rules (for
    exercise 11.7): ``first(cw, consumers)``, the named barrier consumer ``cw`` arrives on before its
    first slot, or None; ``after(cw, slot, n_tiles, consumers)``, the one it arrives on after its turn
    in ``slot``, or None."""
    yield from _consumer_block(cw, n_tiles, my_tiles, stages, 0, 0, False, consumers, **knobs)


def persistent_consumer_ops(cw: int, blocks, stages: int, q_release: str = "after_last_s", **knobs):
    """Consumer warpgroup ``cw`` of ``flash_fwd_w4``: W3's operations for each query block of ``blocks``
    in turn (its own tile count ``my_tiles[cw]`` of each), releasing Q once its last Q K^T is complete.
    ``q_release`` breaks that rule for the tests: ``"never"``, or ``"at_issue"`` (before the wait)."""
    kv0 = 0
    for it, (n_tiles, my_tiles) in enumerate(blocks):
        yield from _consumer_block(cw, n_tiles, my_tiles[cw], stages, kv0, it, True, len(my_tiles),
                                   q_release=q_release, **knobs)
        kv0 += n_tiles
    yield ("wait", "q_full", len(blocks) & 1, len(blocks))   # the phase that says no block is left


def _consumer_block(cw: int, n_tiles: int, my_tiles: int, stages: int, kv0: int, it: int, persistent: bool,
                    consumers: int = 2, *, turns: bool = True, prime: bool = True, final_arrive: bool = False,
                    interleave_idle: bool = True, own_barriers: bool = True, wait_before_release: bool = True,
                    q_release: str = "after_last_s", policy=None):
    last = consumers - 1
    mine, nxt = (TURN[cw], TURN[(cw + 1) % consumers]) if own_barriers else (TURN[0], TURN[0])

    def end_turn(slot):
        if not turns:
            return
        if policy is not None:
            bid = policy[1](cw, slot, n_tiles, consumers)
        else:
            bid = nxt if cw != last or slot < n_tiles or final_arrive else None
        yield ("bar_arrive", bid) if bid is not None else ("end_turn",)

    def turn():
        if turns:
            yield ("sync", mine)

    def stage(j):   # the ring stage of the query block's tile j
        return (kv0 + j) % stages

    def release(kind, j):
        yield ("arrive", f"{kind}_empty{stage(j)}", WARPS)

    def full(kind, j):
        g = kv0 + j
        yield ("wait", f"{kind}_full{stage(j)}", parity(g, stages), g // stages)

    def release_q(when):
        if persistent and q_release == when:
            yield ("arrive", "q_empty", WARPS)

    first = policy[0](cw, consumers) if policy is not None else (TURN[0] if cw == last and prime else None)
    if turns and first is not None:
        yield ("bar_arrive", first)
    yield ("wait", "q_full", it & 1, it)
    if my_tiles > 0:
        yield from full("k", 0)
        yield from turn()
        yield ("issue", f"S{kv0}", [("Q", it), (f"K{stage(0)}", kv0)])
        if my_tiles == 1:
            yield from release_q("at_issue")
        yield from end_turn(0)
        if wait_before_release:
            yield ("wgmma_wait", 0)
        yield from release("k", 0)
        if my_tiles == 1:
            yield from release_q("after_last_s")
        yield ("regs", f"softmax S{kv0}")
        for j in range(1, my_tiles):
            yield from full("k", j)
            yield from full("v", j - 1)
            yield from turn()
            yield ("issue", f"S{kv0 + j}", [("Q", it), (f"K{stage(j)}", kv0 + j)])
            yield ("issue", f"PV{kv0 + j - 1}", [(f"V{stage(j - 1)}", kv0 + j - 1)])
            if j == my_tiles - 1:
                yield from release_q("at_issue")
            yield from end_turn(j)
            yield ("wgmma_wait", 1)
            yield from release("k", j)
            if j == my_tiles - 1:
                yield from release_q("after_last_s")
            yield ("regs", f"softmax S{kv0 + j}")
            yield ("wgmma_wait", 0)
            yield from release("v", j - 1)
            yield ("regs", "rescale+pack")
        yield from full("v", my_tiles - 1)
        yield from turn()
        yield ("issue", f"PV{kv0 + my_tiles - 1}", [(f"V{stage(my_tiles - 1)}", kv0 + my_tiles - 1)])
        yield from end_turn(my_tiles)
        yield ("wgmma_wait", 0)
        yield from release("v", my_tiles - 1)
    else:
        yield from release_q("after_last_s")
        yield from release_q("at_issue")

    def skipped(j):
        yield from full("k", j)
        yield from release("k", j)
        yield from full("v", j)
        yield from release("v", j)

    if not interleave_idle:
        for j in range(my_tiles, n_tiles):
            yield from skipped(j)
    for j in range(my_tiles, n_tiles + 1):
        if j > my_tiles or my_tiles == 0:
            yield from turn()
            yield from end_turn(j)
        if j < n_tiles and interleave_idle:
            yield from skipped(j)
    yield ("regs", "store")


# ------------------------------------------------------------------ the simulator

@dataclass
class _MBarrier:
    count: int
    pending: int
    phase: int = 0          # index of the phase in progress (completed phases: 0 .. phase - 1)
    tx: int = 0             # copies announced and not landed

    def complete_if_done(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count


@dataclass
class _Named:
    arrived: list = field(default_factory=list)   # (warpgroup, waits) of this generation
    waiting: set = field(default_factory=set)


@dataclass
class Trace:
    """What one simulated run did: the tensor-core turns in order ``[(consumer, slot)]``, the wgmma
    groups each consumer issued, and who moved at each step (``"producer"``, 0, 1 or ``"land"``)."""
    turns: list
    issued: dict
    picks: list


def simulate(n_tiles: int, my_tiles: tuple[int, ...], stages: int = 2, seed: int = 0, **knobs) -> Trace:
    """One run of ``flash_fwd_w3``'s block with the consumers' tile counts ``my_tiles`` (one per consumer:
    two, or three for the ``W3_CONSUMERS=3`` build), the next process picked at random (``seed``);
    ``knobs`` go to :func:`consumer_ops` (``turns=False``: the three-consumer build without turns).
    Raises :class:`ScheduleError`."""
    _check_block(n_tiles, my_tiles, stages)
    return _simulate([(n_tiles, tuple(my_tiles))], stages, seed, False, knobs)


def simulate_persistent(blocks, stages: int = 2, seed: int = 0, **knobs) -> Trace:
    """One run of a ``flash_fwd_w4`` block that walks the query blocks ``blocks``, each ``(n_tiles,
    my_tiles)`` as in :func:`simulate` (the same number of consumers in each); ``knobs`` go to
    :func:`persistent_consumer_ops`. Raises :class:`ScheduleError`."""
    blocks = [(n, tuple(mine)) for n, mine in blocks]
    if not blocks or len({len(mine) for _, mine in blocks}) != 1:
        raise ValueError(f"need at least one query block, each with the same number of consumers, got {blocks}")
    for n_tiles, mine in blocks:
        _check_block(n_tiles, mine, stages)
    return _simulate(blocks, stages, seed, True, knobs)


def _check_block(n_tiles, my_tiles, stages):
    if not all(0 <= t <= n_tiles for t in my_tiles) or stages < 2 or len(my_tiles) not in (2, 3):
        raise ValueError(f"need 0 <= my_tiles <= n_tiles, stages >= 2 and two or three consumers, "
                         f"got {my_tiles}, {n_tiles}, {stages}")


def _simulate(blocks, stages: int, seed: int, persistent: bool, knobs: dict) -> Trace:
    turns = knobs.get("turns", True)
    n_tiles, my_tiles = blocks[0]
    consumers = range(len(my_tiles))
    rng = random.Random(seed)
    bars = {"q_full": _MBarrier(1, 1)}
    for s in range(stages):
        for kind in "kv":
            bars[f"{kind}_full{s}"] = _MBarrier(1, 1)
            # every consumer warp releases every tile once (W3_CONSUMER_WARPS)
            bars[f"{kind}_empty{s}"] = _MBarrier(len(my_tiles) * WARPS, len(my_tiles) * WARPS)
    if persistent:
        bars["q_empty"] = _MBarrier(len(my_tiles) * WARPS, len(my_tiles) * WARPS)
    named = {i: _Named() for i in TURN}
    if persistent:
        procs = {"producer": persistent_producer_ops(blocks, stages)}
        for cw in consumers:
            procs[cw] = persistent_consumer_ops(cw, blocks, stages, **knobs)
    else:
        procs = {"producer": producer_ops(n_tiles, stages)}
        for cw in consumers:
            procs[cw] = consumer_ops(cw, n_tiles, my_tiles[cw], stages, len(my_tiles), **knobs)
    nxt = {name: next(gen, None) for name, gen in procs.items()}
    buffers = {}                                  # buf -> (tile, landed)
    in_flight = []                                # copies: (bar, buf, tile)
    groups = {cw: [] for cw in consumers}         # unfinished wgmma groups: (name, reads)
    in_turn = {cw: False for cw in consumers}
    turns, issued = [], {cw: [] for cw in consumers}
    blocked_sync = set()                          # consumers inside bar.sync, not yet released
    picks = []

    def fail(msg):
        where = f"blocks={blocks}" if persistent else f"n_tiles={n_tiles} my_tiles={my_tiles}"
        raise ScheduleError(f"{where} stages={stages} seed={seed}: {msg}")

    def arrive_on(table, bid, name, waits, count, released):
        # one arrival (and with ``waits`` a bar.sync) on named barrier ``bid``, whose generation completes
        # at ``count`` participants; ``released`` is called for each that waited
        gen = table[bid]
        who = f"consumer {name}" if isinstance(name, int) else name
        if any(w == name for w, _ in gen.arrived):
            fail(f"{who} arrives twice on named barrier {bid} in one generation")
        gen.arrived.append((name, waits))
        if waits:
            gen.waiting.add(name)
        if len(gen.arrived) == count:
            if not gen.waiting:
                fail(f"named barrier {bid} completed with nobody waiting on it")
            for w in gen.waiting:
                blocked_sync.discard(w)
                released(w)
            table[bid] = _Named()

    def named_arrive(cw, bid, waits):
        if bid not in named or bid not in TURN[:len(consumers)]:
            fail(f"consumer {cw} arrives on named barrier {bid!r}, on which no consumer waits")
        arrive_on(named, bid, cw, waits, 2, take_turn)   # 256 threads: two warpgroups

    def take_turn(cw):
        for other in consumers:
            if other != cw and in_turn[other]:
                fail(f"consumer {cw} takes the turn while consumer {other} holds it")
        in_turn[cw] = True
        turns.append((cw, sum(1 for c, _ in turns if c == cw)))

    def ready(name, op):
        kind = op[0]
        if name in blocked_sync:                  # inside bar.sync until its generation completes
            return False
        if kind == "wait":
            bar = bars[op[1]]
            if bar.phase > op[3] + 1:
                fail(f"{name} waits on phase {op[3]} of {op[1]}, which is already at phase {bar.phase}")
            return bar.phase % 2 != op[2]
        return True

    def run(name, op):
        kind = op[0]
        if kind == "load":
            bar, buf, tile = op[1:]
            for cw in consumers:
                if any(b == buf for _, reads in groups[cw] for b, _ in reads):
                    fail(f"the copy of tile {tile} into {buf} starts while a wgmma of consumer {cw} reads it")
            bars[bar].pending -= 1
            bars[bar].tx += 1
            buffers[buf] = (tile, False)
            in_flight.append((bar, buf, tile))
        elif kind == "arrive":
            bar = bars[op[1]]
            buf = op[1].replace("_empty", "").upper()
            if any(b == buf for _, reads in groups.get(name, ()) for b, _ in reads):
                fail(f"consumer {name} releases {buf} while its wgmma still reads it")
            bar.pending -= op[2]
            if bar.pending < 0:
                fail(f"{op[1]} received more arrivals than its count")
            bar.complete_if_done()
        elif kind == "sync":
            blocked_sync.add(name)
            named_arrive(name, op[1], True)
        elif kind == "bar_arrive":
            in_turn[name] = False
            named_arrive(name, op[1], False)
        elif kind == "end_turn":
            in_turn[name] = False
        elif kind == "issue":
            if turns and not in_turn[name]:
                fail(f"consumer {name} issues {op[1]} outside its turn")
            for buf, tile in op[2]:
                if buffers.get(buf) != (tile, True):
                    fail(f"{op[1]} of consumer {name} reads {buf}, which holds {buffers.get(buf)}, not tile {tile}")
            groups[name].append((op[1], op[2]))
            issued[name].append(op[1])
        elif kind == "wgmma_wait":
            del groups[name][:max(0, len(groups[name]) - op[1])]
        elif kind == "regs":
            live = [g for g, _ in groups[name]]
            target = op[1].split()[-1]
            if (op[1].startswith("softmax") and target in live) or (not op[1].startswith("softmax") and live):
                fail(f"consumer {name}: {op[1]} while wgmma groups {live} are unfinished")

    while True:
        movable = [n for n, op in nxt.items() if op is not None and ready(n, op)]
        choices = movable + (["land"] if in_flight else [])
        if not choices:
            if all(op is None for op in nxt.values()):
                break
            stuck = {n: ("inside bar.sync",) if n in blocked_sync else op for n, op in nxt.items() if op is not None}
            fail(f"deadlock: every process waits: {stuck}")
        pick = rng.choice(choices)
        picks.append(pick)
        if pick == "land":
            bar, buf, tile = in_flight.pop(rng.randrange(len(in_flight)))
            buffers[buf] = (tile, True)
            bars[bar].tx -= 1
            bars[bar].complete_if_done()
            continue
        run(pick, nxt[pick])
        nxt[pick] = next(procs[pick], None)

    for bid, gen in named.items():
        if gen.arrived:
            fail(f"named barrier {bid} is left with arrivals {gen.arrived} at exit")
    for cw in consumers:
        if groups[cw]:
            fail(f"consumer {cw} exits with unfinished wgmma groups {groups[cw]}")
    return Trace(turns, issued, picks)

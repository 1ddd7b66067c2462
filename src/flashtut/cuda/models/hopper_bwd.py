"""The Hopper backward's structure in plain Python (no GPU): what chapter 11b teaches and checks.

``kernels/bwd_hopper.cu`` gives each block 128 keys; its two consumer warpgroups own 64 each and walk the
query blocks of ``BM`` rows (128 at D = 64, 64 at D = 128). This module holds, for one such step:

* the dependency graph (``STEPS``): which product or register pass waits for which; the order in which
  each rung issues them (``issue_order``); a check that an order keeps every dependency
  (``check_order``); and which products are still on the tensor cores when a step is issued
  (``in_flight_at``);
* why the scores are computed transposed (``a_operand_in_place``);
* the operands the backward reads that the forward did not, as addresses and matrix descriptors:
  ``s_t_descriptors`` (S^T = K Q^T: the forward's Q K^T with the roles of the two tiles swapped),
  ``dkdv_b_descriptors`` (Q and dO read again from the same tiles, MN-major, for dK and dV),
  ``ds_store_offset`` (where each thread writes dS^T) and ``dq_descriptors`` (dQ = dS K, both operands
  MN-major);
* the costs of the ways to sum dQ over the key blocks (``dq_reduction``).

Addresses are bytes, elements 16-bit, tiles swizzled by 128 bytes as :mod:`.hopper_layout` models them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import hopper_layout as hl

#: keys per block (two consumer warpgroups of 64); rows of every 16-bit tile are 128 bytes
BLOCK_N = 128
CONSUMERS = 2


def block_m(head_dim: int) -> int:
    """Query rows per step: each consumer's dQ product is 64 x 64, so ``BM * D = 8192``."""
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128, got {head_dim!r}")
    return 8192 // head_dim


# ------------------------------------------------------------------ what waits for what

@dataclass(frozen=True)
class Step:
    """One step of a consumer's work on a query block: ``unit`` runs it (``"tma"``, ``"tensor"``,
    ``"registers"``, ``"shared"``, ``"barrier"`` or ``"global"``), ``deps`` must be done first."""
    name: str
    unit: str
    deps: tuple
    what: str


#: the steps of one query block for one consumer warpgroup, each with the steps it needs
STEPS = {s.name: s for s in (
    Step("load", "tma", (), "Q, dO, lse, Delta of the query block land in a stage"),
    Step("S^T", "tensor", ("load",), "S^T = K Q^T, recomputed"),
    Step("dP^T", "tensor", ("load",), "dP^T = V dO^T, recomputed"),
    Step("P^T", "registers", ("S^T",), "P^T = exp2(S^T c log2 e - lse2)"),
    Step("dS^T", "registers", ("P^T", "dP^T"), "dS^T = P^T (dP^T - Delta)"),
    Step("dV", "tensor", ("P^T",), "dV += P^T dO"),
    Step("dK", "tensor", ("dS^T",), "dK += dS^T Q"),
    Step("store dS^T", "shared", ("dS^T",), "dS^T into the shared tile dQ reads"),
    Step("barrier", "barrier", ("store dS^T",), "both consumers' dS^T are in"),
    Step("dQ", "tensor", ("barrier",), "dQ = dS K over the block's 128 keys"),
    Step("add dQ", "global", ("dQ",), "dQ added into the float32 buffer"),
    Step("release", "tma", ("dV", "dK"), "the stage's Q and dO go back to the producer"),
)}

#: the order each rung issues the steps in (bwd_hopper.cu: b1-b3 issue dV and dK, then dQ; b4 issues dQ
#: first, so that its add runs while dV and dK are on the tensor cores)
_B3 = ("load", "S^T", "dP^T", "P^T", "dS^T", "store dS^T", "dV", "dK", "barrier", "dQ", "release", "add dQ")
_B4 = ("load", "S^T", "dP^T", "P^T", "dS^T", "store dS^T", "barrier", "dQ", "dV", "dK", "add dQ", "release")
ISSUE_ORDER = {"b1": _B3, "b2": _B3, "b3": _B3, "b4": _B4}


def issue_order(rung: str) -> list[str]:
    """The steps of one query block in the order rung ``rung`` issues them."""
    if rung not in ISSUE_ORDER:
        raise ValueError(f"rung must be one of {sorted(ISSUE_ORDER)}, got {rung!r}")
    return list(ISSUE_ORDER[rung])


def check_order(order, steps=STEPS) -> None:
    """Raise ``ValueError`` unless ``order`` names every step of ``steps`` once, each after the steps
    it needs; the message names the first step issued before one of its inputs."""
    order = list(order)
    if sorted(order) != sorted(steps):
        missing, extra = set(steps) - set(order), set(order) - set(steps)
        raise ValueError(f"order must name each step once: missing {sorted(missing)}, unknown {sorted(extra)}"
                         + (", repeated" if len(order) != len(set(order)) else ""))
    done = set()
    for name in order:
        early = [d for d in steps[name].deps if d not in done]
        if early:
            raise ValueError(f"{name!r} is issued before {early[0]!r}, which it needs")
        done.add(name)


def depths(steps=STEPS) -> dict[str, int]:
    """The length of the longest chain of steps that leads to each step (``load``: 0)."""
    out: dict[str, int] = {}

    def depth(name):
        if name not in out:
            out[name] = 1 + max((depth(d) for d in steps[name].deps), default=-1)
        return out[name]

    for name in steps:
        depth(name)
    return out


def in_flight_at(order, name: str, steps=STEPS) -> list[str]:
    """The products still on the tensor cores when step ``name`` is issued in ``order``. A consumer waits
    with ``wgmma.wait_group``, which waits for every group but the newest ones, in issue order: to use a
    product it must wait for that product and every product issued before it, so only the products issued
    after the last one ``name`` depends on can still run."""
    order = list(order)
    check_order(order, steps)
    if name not in steps:
        raise ValueError(f"name must be a step of {sorted(steps)}, got {name!r}")
    before = order[:order.index(name)]

    def inputs(n):   # every step n depends on, directly or not
        return set(steps[n].deps).union(*(inputs(d) for d in steps[n].deps))

    needed = [i for i, s in enumerate(before) if s in inputs(name) and steps[s].unit == "tensor"]
    start = needed[-1] + 1 if needed else 0
    # a step that needs no product waits for none; the release of a stage waits for what read it
    return [s for s in before[start:] if steps[s].unit == "tensor"]


# ------------------------------------------------------------------ P^T and dS^T in registers

def a_operand_in_place(rows_are_keys: bool, n: int = 64) -> int:
    """How many of the 64 x ``n`` values of dV's A operand (P^T: rows = keys, the reduction over ``n``
    queries) a warpgroup finds already in the thread and register that must hold them, where the
    scores were computed as S^T = K Q^T (``rows_are_keys``, the kernel's choice) or as S = Q K^T, the
    forward's: thread t's A register ``reg`` of k-step ``kp`` packs its accumulator registers
    ``hopper_layout.p_register(kp, reg)``, so the value must be the one those registers hold."""
    if n not in (64, 128):
        raise ValueError(f"n must be 64 or 128, got {n!r}")
    hits = 0
    for t in range(hl.WARPGROUP_THREADS):
        for kp in range(n // 16):
            for reg in range(4):
                for half in (0, 1):
                    key, col = hl.a_fragment_element(t, reg, half)   # P^T[key, query]
                    query = 16 * kp + col
                    held = hl.accumulator_element(t, hl.p_register(kp, reg)[half], n)
                    hits += held == ((key, query) if rows_are_keys else (query, key))
    return hits


# ------------------------------------------------------------------ operands in shared memory

def s_t_descriptors(ks: int, head_dim: int, warpgroup: int, k_base: int = 0, q_base: int = 0) -> tuple[int, int]:
    """(A, B) descriptors of k-step ``ks`` of S^T = K Q^T (likewise dP^T = V dO^T): A is the warpgroup's 64
    rows of the 128-key K tile, B the ``BM``-row Q tile, both K-major (the head dim contiguous). It is the
    forward's S = Q K^T (``hopper_layout.w1_qk_descriptors``) with K in Q's place and Q in K's."""
    return hl.w1_qk_descriptors(ks, head_dim, block_m(head_dim), warpgroup, q_base=k_base, k_base=q_base)


def dkdv_b_descriptors(kp: int, head_dim: int, base: int = 0) -> list[tuple[int, int]]:
    """``[(first output column, descriptor)]`` of k-step ``kp`` (queries 16 kp..) of dV += P^T dO (and
    dK += dS^T Q): the B operand is the dO (Q) tile that S^T read K-major, read again MN-major: 16 query rows
    of 128 bytes, one descriptor per 64-column block of the head dim. It is the forward's V of O += P V
    (``hopper_layout.w1_pv_descriptors``) with queries in the place of keys."""
    return hl.w1_pv_descriptors(kp, head_dim, block_m(head_dim), split=True, v_base=base)


def ds_store_offset(thread: int, i: int, warpgroup: int) -> int:
    """The byte offset in the dS^T tile (``[BM / 64][128 keys][64 queries]``, 128-byte swizzle) at which
    consumer thread ``thread`` of ``warpgroup`` stores registers ``i``, ``i + 1`` (``i`` even) of its dS^T
    accumulator, as bwd_hopper.cu computes it: the part that depends on the thread in one value
    (``xrow``), then constants added and XORed (row r = 64 wg + 16 warp + g + 8 h has r % 8 = g)."""
    if not 0 <= thread < hl.WARPGROUP_THREADS or warpgroup not in (0, 1) or i < 0 or i % 2:
        raise ValueError(f"thread in [0, 128), warpgroup 0 or 1, i even and >= 0; got {thread}, {warpgroup}, {i}")
    warp, lane = divmod(thread, 32)
    g, t = divmod(lane, 4)
    xrow = (64 * warpgroup + 16 * warp + g) * hl.ROW_BYTES + (g << 4) + 4 * t
    return (xrow + 1024 * ((i // 2) % 2) + (i // 32) * (BLOCK_N * hl.ROW_BYTES)) ^ (((i // 4) % 8) << 4)


def dq_descriptors(kp: int, qb: int, cb: int, ds_base: int = 0, k_base: int = 0) -> tuple[int, int]:
    """(A, B) descriptors of k-step ``kp`` (keys 16 kp..) of a consumer's 64 x 64 dQ = dS K: A is dS, read
    MN-major from the dS^T tile (queries contiguous along its 128-byte rows; query block ``qb`` of 64 is
    ``128 x 128`` bytes on), B is K read MN-major from the K tile (head-dim block ``cb``). Both step 16 keys
    = 16 rows of 128 bytes; SBO 1024 steps 8 keys, LBO (the next 64 of M or N) is not used."""
    for name, x in (("kp", kp), ("qb", qb), ("cb", cb)):
        if not isinstance(x, int) or x < 0:
            raise ValueError(f"{name} must be a non-negative int, got {x!r}")
    step = kp * 16 * hl.ROW_BYTES
    a = ds_base + qb * BLOCK_N * hl.ROW_BYTES + step
    b = k_base + cb * BLOCK_N * hl.ROW_BYTES + step
    return hl.encode_descriptor(a, hl.ATOM_BYTES, hl.ATOM_BYTES), hl.encode_descriptor(b, hl.ATOM_BYTES, hl.ATOM_BYTES)


# ------------------------------------------------------------------ summing dQ

def dq_reduction(n_q: int, n_k: int, head_dim: int) -> dict[str, dict]:
    """What each way of summing dQ over the key blocks costs for one head of ``n_q`` queries and ``n_k``
    keys: per step of a block (one query block against 128 keys) the instructions that add, by how many
    threads, the float32 bytes added into memory, the matrix products per tile, and over the head the
    bytes added and the FLOPs relative to the five-product backward. Methods: ``"atomics"`` (rung b1:
    every consumer thread adds its 32 values by 8-byte ``red.global.add.v2.f32``), ``"tma reduce-add"``
    (b3, b4 and FlashAttention-3: the tile staged in shared memory, two bulk reduce-adds of 64 x 32 floats
    per consumer, issued by one thread) and ``"separate pass"`` (the deterministic mode: a second kernel
    per query block walks the keys, recomputes S and dP and writes dQ once)."""
    for name, x in (("n_q", n_q), ("n_k", n_k)):
        if not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    bm = block_m(head_dim)
    steps = math.ceil(n_q / bm) * math.ceil(n_k / BLOCK_N)
    tile = bm * head_dim * 4                                  # the float32 dQ of one step, both consumers
    per_thread = 64 * 64 // hl.WARPGROUP_THREADS              # each consumer's 64 x 64 over 128 threads
    added = steps * tile
    return {
        "atomics": {"adds per step": CONSUMERS * hl.WARPGROUP_THREADS * per_thread // 2,
                    "issued by": f"{CONSUMERS * hl.WARPGROUP_THREADS} threads", "bytes added per step": tile,
                    "products per tile": 5, "bytes added": added, "flops vs 5 products": 1.0,
                    "deterministic": False},
        "tma reduce-add": {"adds per step": CONSUMERS * 2, "issued by": f"{CONSUMERS} threads",
                           "bytes added per step": tile, "products per tile": 5, "bytes added": added,
                           "flops vs 5 products": 1.0, "deterministic": False},
        "separate pass": {"adds per step": 0, "issued by": "-", "bytes added per step": 0,
                          "products per tile": 7, "bytes added": 0, "flops vs 5 products": 7 / 5,
                          "deterministic": True},
    }


def dq_bytes_per_flop(head_dim: int) -> float:
    """Float32 bytes added into dQ per FLOP of the five products: a step adds ``BM x D`` floats and does
    five ``BM x 128 x D`` products, so ``4 / (5 * 2 * 128)`` whatever the head dim."""
    bm = block_m(head_dim)
    return bm * head_dim * 4 / (5 * 2 * bm * BLOCK_N * head_dim)

"""HBM traffic of attention, counted by walking each algorithm's loops.

A *schedule* lists, in execution order, every transfer between HBM (the GPU's main memory)
and on-chip SRAM that one ``(batch, head)`` of an algorithm makes: which tensor, which block
of rows, how many elements, read or written, and at which loop step. Summing a schedule gives
the traffic; chapter 05 draws the same schedules as diagrams, so the numbers in the text and
the pictures come from one place.

Three algorithms, after Dao et al. (2022):

* ``standard``: Algorithm 0 of the FlashAttention paper. ``S = Q K^T`` is written to HBM, read
  back for the softmax, ``P`` is written, read back for ``P V``: ``Theta(N d + N^2)`` traffic.
* ``flash1``: FlashAttention-1 loop order. The outer loop walks key/value blocks, the inner loop
  query blocks, so every query block's ``O``, ``l`` and ``m`` are read and rewritten once per key
  block: ``Theta(N^2 d / B_c) = Theta(N^2 d^2 / M)`` with ``B_c = M / (4 d)``.
* ``flash2``: FlashAttention-2 loop order (what ``flashtut.tiled_attention`` does). The outer
  loop walks query blocks; ``Q_i`` is read once, ``O_i`` and the log-sum-exp written once, and
  the inner loop streams all of ``K`` and ``V`` past it: ``Theta(N^2 d / B_r)``.

``count_slice_reads`` checks the model against the library: it runs a function on tensors
that count how many elements are sliced out of them, which for ``tiled_attention`` are exactly
its tile loads. ``saved_tensors`` lists what autograd keeps for a backward pass (chapter 06).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import torch

from .traffic import Traffic

ALGORITHMS = ("standard", "flash1", "flash2")
#: statistics kept per row (running max, running sum, log-sum-exp) are float32
STAT_TENSORS = frozenset({"m", "l", "lse"})


class Transfer(NamedTuple):
    """One HBM transfer: ``op`` is ``"read"`` or ``"write"``; ``tensor`` one of Q, K, V, O, S, P,
    m, l, lse; ``block`` the block index along the sequence (-1: the whole tensor); ``elements``
    its size; ``step`` the ``(outer, inner)`` loop indices of the tile being worked on (``None``
    outside the tile loops). A named tuple, because long schedules have millions of them."""
    op: str
    tensor: str
    block: int
    elements: int
    step: tuple | None = None


def _check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _visible(q_end: int, k_start: int, causal: bool) -> bool:
    """Whether a key block starting at ``k_start`` holds any key a query block ending (exclusive)
    at ``q_end`` may see (top-left causal alignment: key ``j`` visible to query ``i`` iff ``j <= i``)."""
    return (not causal) or k_start <= q_end - 1


def standard_schedule(n_q: int, n_k: int, d: int) -> Iterator[Transfer]:
    """Algorithm 0: three kernels, the ``Nq x Nk`` matrices make a round trip through HBM each."""
    for n in (("n_q", n_q), ("n_k", n_k), ("d", d)):
        _check_size(*n)
    yield Transfer("read", "Q", -1, n_q * d)      # kernel 1: S = Q K^T
    yield Transfer("read", "K", -1, n_k * d)
    yield Transfer("write", "S", -1, n_q * n_k)
    yield Transfer("read", "S", -1, n_q * n_k)    # kernel 2: P = softmax(S)
    yield Transfer("write", "P", -1, n_q * n_k)
    yield Transfer("read", "P", -1, n_q * n_k)    # kernel 3: O = P V
    yield Transfer("read", "V", -1, n_k * d)
    yield Transfer("write", "O", -1, n_q * d)


def flash1_schedule(n_q: int, n_k: int, d: int, block_m: int, block_n: int,
                    causal: bool = False) -> Iterator[Transfer]:
    """FlashAttention-1 order: outer loop over K/V blocks, inner over query blocks; ``O``, ``l``
    and ``m`` live in HBM between key blocks, so each visit reads and rewrites them."""
    for n in (("n_q", n_q), ("n_k", n_k), ("d", d), ("block_m", block_m), ("block_n", block_n)):
        _check_size(*n)
    q_blocks, k_blocks = _blocks(n_q, block_m), _blocks(n_k, block_n)
    for i, (q0, q1) in enumerate(q_blocks):       # O = 0, l = 0, m = -inf, initialised in HBM
        yield Transfer("write", "O", i, (q1 - q0) * d)
        yield Transfer("write", "l", i, q1 - q0)
        yield Transfer("write", "m", i, q1 - q0)
    for j, (k0, k1) in enumerate(k_blocks):
        visits = [(i, q0, q1) for i, (q0, q1) in enumerate(q_blocks) if _visible(q1, k0, causal)]
        if not visits:
            continue
        yield Transfer("read", "K", j, (k1 - k0) * d, (j, visits[0][0]))
        yield Transfer("read", "V", j, (k1 - k0) * d, (j, visits[0][0]))
        for i, q0, q1 in visits:
            rows = q1 - q0
            for name, n in (("Q", rows * d), ("O", rows * d), ("l", rows), ("m", rows)):
                yield Transfer("read", name, i, n, (j, i))
            for name, n in (("O", rows * d), ("l", rows), ("m", rows)):
                yield Transfer("write", name, i, n, (j, i))


def flash2_schedule(n_q: int, n_k: int, d: int, block_m: int, block_n: int,
                    causal: bool = False) -> Iterator[Transfer]:
    """FlashAttention-2 order: outer loop over query blocks, inner over K/V blocks; the output
    and its statistics stay on chip until the query block is done, then are written once."""
    for n in (("n_q", n_q), ("n_k", n_k), ("d", d), ("block_m", block_m), ("block_n", block_n)):
        _check_size(*n)
    for i, (q0, q1) in enumerate(_blocks(n_q, block_m)):
        rows = q1 - q0
        yield Transfer("read", "Q", i, rows * d, (i, 0))
        last = 0
        for j, (k0, k1) in enumerate(_blocks(n_k, block_n)):
            if not _visible(q1, k0, causal):      # causal block skipping: nothing visible here
                break
            yield Transfer("read", "K", j, (k1 - k0) * d, (i, j))
            yield Transfer("read", "V", j, (k1 - k0) * d, (i, j))
            last = j
        yield Transfer("write", "O", i, rows * d, (i, last))
        yield Transfer("write", "lse", i, rows, (i, last))


def schedule(algorithm: str, n_q: int, n_k: int, d: int, block_m: int = 64, block_n: int = 64,
             causal: bool = False) -> list[Transfer]:
    """The transfers of ``algorithm`` (``"standard"``, ``"flash1"`` or ``"flash2"``) for one
    ``(batch, head)``. The standard algorithm ignores the block sizes; for it ``causal`` changes
    nothing either, since the masked scores are still written and read."""
    if algorithm == "standard":
        return list(standard_schedule(n_q, n_k, d))
    if algorithm == "flash1":
        return list(flash1_schedule(n_q, n_k, d, block_m, block_n, causal))
    if algorithm == "flash2":
        return list(flash2_schedule(n_q, n_k, d, block_m, block_n, causal))
    raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")


def count(transfers, elem_bytes: int = 2, stat_bytes: int = 4, name: str = "schedule") -> Traffic:
    """Sum a schedule into elements read and written per tensor, and bytes, when matrices take
    ``elem_bytes`` per element (2: fp16/bf16) and the per-row statistics ``stat_bytes`` (float32)."""
    elem_bytes = _check_size("elem_bytes", elem_bytes)
    stat_bytes = _check_size("stat_bytes", stat_bytes)
    reads, writes = Counter(), Counter()
    for op, tensor, _, elements, _ in transfers:
        (reads if op == "read" else writes)[tensor] += elements

    def nbytes(counts):
        return sum(n * (stat_bytes if t in STAT_TENSORS else elem_bytes) for t, n in counts.items())

    return Traffic(name, bytes_read=nbytes(reads), bytes_written=nbytes(writes),
                   reads=dict(reads), writes=dict(writes))


def block_sizes_for_sram(sram_elements: int, d: int, algorithm: str = "flash1") -> tuple[int, int]:
    """Tile sizes for an SRAM of ``M = sram_elements`` elements, after FlashAttention-1:
    the block that stays on chip through the inner loop gets ``ceil(M / (4 d))`` rows, the
    block that streams past it ``min(ceil(M / (4 d)), d)`` rows. Then the resident pair
    (``K_j, V_j`` or ``Q_i, O_i``) takes ``M / 2``, the streamed pair at most ``M / 2`` and the
    score tile at most ``M / 4``: ``O(M)`` in all.

    ``flash1`` keeps K/V resident (``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``); ``flash2``
    keeps the query block resident, so the roles swap. Returns ``(block_m, block_n)``.
    Needs ``M >= 4 d`` (room for at least one row of each)."""
    _check_size("sram_elements", sram_elements)
    _check_size("d", d)
    if sram_elements < 4 * d:
        raise ValueError(f"sram_elements must be at least 4 * d = {4 * d} (one row each of Q, K, V "
                         f"and O), got {sram_elements}")
    big = math.ceil(sram_elements / (4 * d))
    small = min(big, d)
    if algorithm == "flash1":
        return small, big
    if algorithm == "flash2":
        return big, small
    raise ValueError(f"algorithm must be 'flash1' or 'flash2' for tile sizes, got {algorithm!r}")


def hbm_traffic(algorithm: str, n: int, d: int, sram_elements: int | None = None,
                causal: bool = False, block_m: int | None = None, block_n: int | None = None,
                elem_bytes: int = 2) -> Traffic:
    """Traffic of one ``(batch, head)`` with ``Nq = Nk = n``; flash tile sizes come from
    ``sram_elements`` (see ``block_sizes_for_sram``) unless both are given. Matrices take
    ``elem_bytes`` per element, the per-row statistics 4 (float32)."""
    if algorithm == "standard":
        return count(standard_schedule(n, n, d), elem_bytes, name=algorithm)
    if block_m is None or block_n is None:
        if sram_elements is None:
            raise ValueError("give sram_elements, or both block_m and block_n, for a flash algorithm")
        block_m, block_n = block_sizes_for_sram(sram_elements, d, algorithm)
    make = flash1_schedule if algorithm == "flash1" else flash2_schedule
    if algorithm not in ("flash1", "flash2"):
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    return count(make(n, n, d, block_m, block_n, causal), elem_bytes, name=algorithm)


def tile_footprint_elements(block_m: int, block_n: int, d: int) -> int:
    """On-chip elements a flash kernel holds at once: ``Q_i``, ``O_i`` (``block_m x d`` each),
    ``K_j``, ``V_j`` (``block_n x d`` each) and one ``block_m x block_n`` score tile."""
    return 2 * block_m * d + 2 * block_n * d + block_m * block_n


# --- checking the model against the library's own loop -------------------------------------

class _SliceCounter(torch.Tensor):
    """A tensor that adds the size of every slice taken from it to a shared counter.

    Results of all other operations are plain tensors, so only the tracked inputs count."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func is torch.Tensor.__getitem__ and isinstance(args[0], _SliceCounter):
            src = args[0]
            src._ft_counter[src._ft_name] += out.numel() if isinstance(out, torch.Tensor) else 1
        return out


def count_slice_reads(fn: Callable, **tensors) -> dict:
    """Call ``fn(**tensors)`` with each tensor replaced by one that counts the elements sliced
    out of it (``x[..., a:b]``), and return ``{name: elements}``.

    For a tiled loop every slice is one tile load from HBM, so this counts the loop's actual
    reads; compare them with ``count(schedule(...)).reads``."""
    counter: Counter = Counter()
    wrapped = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        w = t.as_subclass(_SliceCounter)
        w._ft_name = name
        w._ft_counter = counter
        counter[name] += 0
        wrapped[name] = w
    fn(**wrapped)
    return dict(counter)


# --- what the backward keeps: autograd's saved tensors -----------------------------------------

@dataclass(frozen=True)
class SavedTensor:
    """One distinct block of memory that autograd kept for the backward pass."""
    shape: tuple
    dtype: str
    bytes: int
    is_input: bool      # the memory of one of the call's tensor arguments (kept alive anyway)


def saved_tensors(fn: Callable, *args, **kwargs) -> tuple[object, list[SavedTensor]]:
    """Run ``fn(*args, **kwargs)`` and list the tensors autograd saves for its backward, through
    ``torch.autograd.graph.saved_tensors_hooks``. A storage saved by several operations (the
    probabilities are saved by both the softmax and the matmul after it) counts once. Returns
    ``(result, saved)``; give ``fn`` inputs with ``requires_grad=True``, or nothing is saved."""
    seen: dict = {}
    input_ptrs = {a.untyped_storage().data_ptr() for a in list(args) + list(kwargs.values())
                  if isinstance(a, torch.Tensor)}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen[ptr] = SavedTensor(tuple(t.shape), str(t.dtype).replace("torch.", ""),
                                    t.untyped_storage().nbytes(), ptr in input_ptrs)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn(*args, **kwargs)
    return result, list(seen.values())

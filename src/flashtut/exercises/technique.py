"""Watch *how* a reader's attention code computes, not only what it returns.

``watch`` runs a function under a PyTorch dispatch mode that sees every ATen operator it calls
and records, for the input tensors it is told about:

* each *read*: an operator (not a view) that consumes a view of an input; its size says whether
  the input was loaded block by block or whole;
* the largest tensor any operator produced, and the peak of tensors alive at once (what an
  Nq x Nk score matrix, or a list of all the score tiles, would show up in);
* which query rows and key rows meet in each matrix product: every tensor derived from an
  input carries the range of sequence rows it came from, so a product of a query tile with a
  key tile that lies wholly above the causal diagonal is caught even when its result is masked
  away afterwards;
* writes into an input (an in-place operator on a view of one).

The chapter 05 and 06 checkers turn these records into verdicts and messages.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from .checker import wrap

#: operators that allocate from an input's shape or dtype without reading its values
_NO_READ = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros",
                      "new_ones", "new_full", "new_empty_strided", "detach", "alias", "_unsafe_view",
                      "lift_fresh"})
_MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "mv"})


@dataclass
class Trace:
    """What ``watch`` saw. ``reads[name]`` lists the element count of every read of that input;
    ``whole_reads`` the reads larger than the allowed block, as ``(name, op, shape)``."""
    reads: dict
    whole_reads: list = field(default_factory=list)
    largest: tuple = (0, "", ())          # (elements, operator, shape)
    peak_live: int = 0                    # elements alive at once, inputs not counted
    masked_products: list = field(default_factory=list)   # (op, query rows, key rows)
    input_writes: list = field(default_factory=list)      # (name, op)

    def read_elements(self, name: str) -> int:
        return sum(self.reads.get(name, ()))


def _row_range(view: torch.Tensor, base: torch.Tensor) -> tuple[int, int] | None:
    """(first, last) sequence row (dim 2 of a contiguous ``(B, H, N, ...)`` input) that ``view``
    touches, from its strides and offset into ``base``'s storage."""
    if view.numel() == 0:
        return None
    idx = torch.arange(base.numel()).as_strided(view.shape, view.stride(),
                                               view.storage_offset() - base.storage_offset())
    inner = math.prod(base.shape[3:])
    rows = (idx // inner) % base.shape[2]
    return int(rows.min()), int(rows.max())


def _union(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return min(a[0], b[0]), max(a[1], b[1])


def watch(fn: Callable, inputs: dict, query_side=("q", "o", "do", "lse"),
          block_elements: dict | None = None, causal: bool = False):
    """Run ``fn()`` and return ``(result, Trace)``. ``inputs`` maps names to the contiguous
    tensors ``fn`` uses (each at least 3-D, sequence along dim 2); names in ``query_side`` index
    query rows, the others key rows. ``block_elements[name]``: the largest read of that input
    counted as one block (a larger one goes to ``whole_reads``). With ``causal``, products of
    rows with no visible pair (every key row after every query row) go to ``masked_products``."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    block_elements = block_elements or {}
    by_ptr = {t.untyped_storage().data_ptr(): (name, t) for name, t in inputs.items()}
    trace = Trace(reads={name: [] for name in inputs})
    origin: dict = {}               # id(tensor) -> (query rows, key rows) it was computed from
    live = {"now": 0}

    def forget(key, n):
        origin.pop(key, None)
        live["now"] -= n

    def remember(t, rows, n):
        key = id(t)
        if key in origin:                         # an in-place operator: same tensor, more rows
            q0, k0 = origin[key]
            origin[key] = (_union(q0, rows[0]), _union(k0, rows[1]))
            return
        origin[key] = rows
        live["now"] += n
        trace.peak_live = max(trace.peak_live, live["now"])
        weakref.finalize(t, forget, key, n)

    def rows_of(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr in by_ptr:
            name, base = by_ptr[ptr]
            r = _row_range(t, base)
            return (r, None) if name in query_side else (None, r)
        return origin.get(id(t), (None, None))

    class _Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            qr = kr = None
            for t in ins:
                a, b = rows_of(t)
                qr, kr = _union(qr, a), _union(kr, b)
            if func.is_view or name in _NO_READ:
                alias = func.is_view or name == "detach"   # same memory and rows as its input
                for t in outs:
                    if t.untyped_storage().data_ptr() in by_ptr:
                        continue
                    if alias:
                        remember(t, (qr, kr), 0)
                    else:                                  # a fresh allocation shaped like an input
                        if t.numel() > trace.largest[0]:
                            trace.largest = (t.numel(), name, tuple(t.shape))
                        remember(t, (None, None), t.numel())
                return out
            for t in ins:
                hit = by_ptr.get(t.untyped_storage().data_ptr())
                if hit is None:
                    continue
                trace.reads[hit[0]].append(t.numel())
                limit = block_elements.get(hit[0])
                if limit is not None and t.numel() > limit:
                    trace.whole_reads.append((hit[0], name, tuple(t.shape)))
            if func._schema.is_mutable:
                for t in ins:
                    hit = by_ptr.get(t.untyped_storage().data_ptr())
                    if hit is not None and any(o is t for o in outs):
                        trace.input_writes.append((hit[0], name))
            if causal and name in _MATMULS and qr is not None and kr is not None and kr[0] > qr[1]:
                trace.masked_products.append((name, qr, kr))
            for t in outs:
                if t.untyped_storage().data_ptr() in by_ptr:
                    continue
                if t.numel() > trace.largest[0]:
                    trace.largest = (t.numel(), name, tuple(t.shape))
                remember(t, (qr, kr), t.numel())
            return out

    with _Watch():
        result = fn()
    return result, trace


def private_copies(*tensors: torch.Tensor):
    """One contiguous copy per tensor for the reader's function and one kept aside, so that an
    answer that writes into its inputs is caught and cannot spoil the reference."""
    given = tuple(t.detach().clone().contiguous() for t in tensors)
    kept = tuple(t.detach().clone() for t in tensors)
    return given, kept


def mutated(names, given, kept) -> list[str]:
    """Names of the inputs whose values changed."""
    return [n for n, g, k in zip(names, given, kept) if not torch.equal(g.detach(), k)]


__all__ = ["Trace", "watch", "private_copies", "mutated", "wrap"]

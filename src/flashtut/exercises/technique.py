"""Watch *how* a reader's attention code computes, not only what it returns.

``watch`` runs a function under a PyTorch dispatch mode that sees every ATen operator it calls.
Every tensor element computed from an input carries, per element, where it came from, in
*shadow* tensors kept next to the real ones (one shadow per storage, so views, slices and
in-place writes share it as the real data does):

* **carry**, one channel per input: which row of that input the element holds a copy of
  (copies, ``cat``, ``stack``, ``clone``, indexing, ``.to()`` and integer views or
  conversions, ``.contiguous()``, elementwise arithmetic, sorts and ``topk`` through their
  indices, scatters and accumulating writes such as ``index_add`` or ``index_put(accumulate=
  True)``, running sums, and a product or sum in which a constant picks a single term, as
  ``torch.eye(n) @ k`` does, keep it; a matrix product of two inputs' data or a sum over many
  rows does not: the result is a new quantity). A tensor holding more than one block of an
  input's rows is a whole read of that input, whatever operator made it;
* **dependence** on query rows and on key rows (channels ``@q`` and ``@k``): a score
  ``q_i . k_j`` depends on query row ``i`` and key row ``j``. A tensor of such pairs over more
  than a block of key (or query) rows is a row (or column) of the score matrix, and with
  ``causal`` every pair above the diagonal outside the tiles a causal loop must compute is
  recorded;
* every *read* (a product, reduction or other computing operator that consumes carried data)
  with the number of input elements it consumed, reductions over more than a block of rows,
  the largest tensor made and the peak of tensors alive at once, writes into an input, the
  number of operators run;
* work taken out of torch: ``.numpy()`` or ``np.asarray`` of input data is refused at once
  (raises :class:`OutsideTorch`), and so are pulling more than a block of its values out as
  Python numbers (``.item()``, ``.tolist()``) and reaching its memory or running Python per
  element (``map_``, ``apply_``, ``data_ptr``, ``untyped_storage``: pickle and ``torch.save``
  go through it);
* work from outside the call: tensors of more than a block read or returned that the function
  neither made nor was given (globals, caches, the caller's copies), random draws, and what
  stays alive once it returned.

The chapter 04, 05 and 06 checkers turn these records into verdicts and messages.
"""
from __future__ import annotations

import gc
import math
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from .checker import wrap

NAN = float("nan")

#: operators that allocate from an input's shape or dtype without reading its values
_NO_READ = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros",
                      "new_ones", "new_full", "new_empty_strided", "empty", "zeros", "ones", "full",
                      "arange", "empty_strided", "scalar_tensor", "randn", "rand", "randn_like",
                      "rand_like", "linspace", "eye", "tril_indices", "triu_indices"})
#: operators whose outputs share their input's memory (beyond those PyTorch marks as views)
_ALIAS = frozenset({"_unsafe_view", "alias", "detach", "lift_fresh", "view"})
#: operators that move or select values without combining them: run on the shadows as they are
_MOVE = frozenset({"index_add", "index_add_", "index_reduce", "index_reduce_", "scatter_add",
                   "scatter_add_", "scatter_reduce", "scatter_reduce_", "_index_put_impl_", "clone",
                   "_to_copy", "copy", "copy_", "cat", "stack", "index_select", "gather",
                   "index", "index_put", "index_put_", "repeat", "flip", "roll", "constant_pad_nd",
                   "narrow_copy", "where", "take", "take_along_dim", "index_copy", "index_copy_",
                   "masked_select", "masked_scatter", "masked_scatter_", "scatter", "scatter_",
                   "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
                   "expand_copy", "permute_copy", "transpose_copy", "t_copy", "view_copy",
                   "slice_copy", "select_copy", "unsqueeze_copy", "squeeze_copy", "unfold_copy",
                   "_reshape_copy", "tril", "triu", "repeat_interleave", "unbind_copy", "split_copy",
                   "tile", "movedim", "pad", "reflection_pad1d", "replication_pad1d", "diag_embed", "diag",
                   "diagflat", "block_diag"})
#: moves that fill the rest of their output with zeros (which hold no input row)
_ZERO_FILLED = frozenset({"tril", "triu", "diag_embed", "diag", "diagflat", "block_diag"})
#: operators that overwrite their output with values that come from no input
_FILL = frozenset({"zero_", "fill_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
                   "geometric_", "cauchy_", "log_normal_"})
_MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "mv", "addmv", "vdot",
                      "addbmm", "_addmm_activation"})
#: reductions (their "dim" argument says over what) and row-wise operators of the same shape
_REDUCE = frozenset({"sum", "mean", "amax", "amin", "max", "min", "logsumexp", "prod", "var", "std",
                     "norm", "linalg_vector_norm", "argmax", "argmin", "nansum", "nanmean", "median",
                     "var_mean", "std_mean", "aminmax", "count_nonzero", "any", "all", "kthvalue"})
_ROWWISE = frozenset({"_softmax", "_log_softmax", "softmax", "log_softmax", "cumsum", "cumprod",
                      "logcumsumexp", "cummax", "cummin", "sort", "topk", "_safe_softmax"})
#: arguments that say where values go, not values (never replaced by shadows)
_INDEX_ARGS = frozenset({"index", "indices", "mask", "condition", "repeats", "offsets", "sorted_sequence"})
#: accumulating writes: where each value lands is what a copy records
_ACCUMULATE_AS_MOVE = {
    "index_add": lambda self, dim, index, source, alpha=1: torch.index_copy(self, dim, index, source),
    "index_add_": lambda self, dim, index, source, alpha=1: self.index_copy_(dim, index, source),
    "index_reduce": lambda self, dim, index, source, reduce, include_self=True:
        torch.index_copy(self, dim, index, source),
    "index_reduce_": lambda self, dim, index, source, reduce, include_self=True:
        self.index_copy_(dim, index, source),
    "scatter_add": lambda self, dim, index, src: torch.scatter(self, dim, index, src),
    "scatter_add_": lambda self, dim, index, src: self.scatter_(dim, index, src),
    "scatter_reduce": lambda self, dim, index, src, reduce, include_self=True: torch.scatter(self, dim, index, src),
    "scatter_reduce_": lambda self, dim, index, src, reduce, include_self=True: self.scatter_(dim, index, src),
    "index_put": lambda self, indices, values, accumulate=False: torch.index_put(self, indices, values),
    "index_put_": lambda self, indices, values, accumulate=False: self.index_put_(indices, values),
    "_index_put_impl_": lambda self, indices, values, accumulate=False, unsafe=False:
        self.index_put_(indices, values),
}
#: reductions and row-wise operators that also return where each value came from
_INDEXED = frozenset({"sort", "topk", "kthvalue", "max", "min", "median", "nanmedian", "mode", "cummax",
                      "cummin"})
#: running sums and products (a difference of neighbours recovers every term)
_SCANS = frozenset({"cumsum", "cumprod", "logcumsumexp"})
#: reductions that add their terms (an exact zero adds nothing)
_SUMS = frozenset({"sum", "nansum", "mean", "nanmean"})
#: operators that draw random numbers (an attention never does; a copy of the checker's inputs would)
_RANDOM = frozenset({"randn", "rand", "randint", "randperm", "normal", "normal_", "uniform_", "random_",
                     "bernoulli", "bernoulli_", "exponential_", "multinomial", "randn_like", "rand_like",
                     "randint_like", "poisson", "cauchy_", "log_normal_", "geometric_"})
#: Tensor methods that take values out of torch, where nothing can watch them any more
_NUMPY = frozenset({"numpy", "__array__", "__array_interface__"})
_PYTHON = frozenset({"tolist", "item"})
#: Tensor methods that reach the memory or run Python per element, where no operator is seen
_RAW = frozenset({"map_", "map2_", "apply_", "data_ptr", "untyped_storage", "storage", "_typed_storage",
                  "__dlpack__"})


#: whole reads and score rows after which the watch stops recording (the verdict is clear by then)
STOP_AFTER = 12


class OutsideTorch(RuntimeError):
    """Raised inside the watched function when it takes an input's values out of torch."""


@dataclass
class Trace:
    """What ``watch`` saw.

    ``reads[name]``: input elements consumed by each computing operator (a carried copy counts
    as the rows it holds); ``whole_reads``: ``(name, op, shape, rows)`` for every tensor that
    read or held more than a block of that input's rows; ``wide_scores``: ``(side, op, shape,
    rows)`` for tensors of scores over more than a block of key (``"k"``) or query (``"q"``)
    rows; ``hidden``: with ``causal``, a ``(Nq, Nk)`` bool matrix of the query/key pairs above
    the diagonal that were computed; ``wide_reductions``: ``(name, op, shape, rows)``, reductions
    over more than the allowed rows; ``key_reductions``: ``(op, shape)``, reductions of scores
    over key rows (a softmax, a row max or a row sum); ``outside``: messages for values taken out
    of torch; ``foreign``: ``(op, shape)`` for tensors of more than a block that the function read
    or returned without making them or being given them (globals, caches, the caller's copies);
    ``random``: random-number operators run; ``live_after``: elements of the tensors made during
    the call still alive after it (its result, what it saved or kept); ``n_ops``: operators run;
    ``stopped``: the watch stopped recording after
    ``STOP_AFTER`` whole reads or score rows (the rest of the records are then incomplete)."""
    reads: dict
    whole_reads: list = field(default_factory=list)
    largest: tuple = (0, "", ())          # (elements, operator, shape)
    peak_live: int = 0                    # elements alive at once, inputs not counted
    peak_scores: int = 0                  # elements of score tensors (query x key pairs) alive at once
    masked_products: list = field(default_factory=list)   # (op, query rows, key rows)
    input_writes: list = field(default_factory=list)      # (name, op)
    wide_scores: list = field(default_factory=list)
    hidden: torch.Tensor | None = None
    wide_reductions: list = field(default_factory=list)
    key_reductions: list = field(default_factory=list)
    outside: list = field(default_factory=list)
    foreign: list = field(default_factory=list)          # (op, shape): tensors from outside the call
    random: list = field(default_factory=list)           # operators that drew random numbers
    live_after: int = 0                   # elements still alive once the function returned
    n_ops: int = 0
    stopped: bool = False

    def read_elements(self, name: str) -> int:
        return sum(self.reads.get(name, ()))


def causal_allowed(Nq: int, Nk: int, block_m: int, block_n: int) -> torch.Tensor:
    """``(Nq, Nk)`` bool: the pairs a causal loop over ``block_m x block_n`` tiles computes, the
    tiles with a key block that starts before the query block ends (top-left aligned)."""
    i = torch.arange(Nq)
    j = torch.arange(Nk)
    q_end = torch.clamp((i // block_m + 1) * block_m, max=Nq)
    k_start = (j // block_n) * block_n
    return k_start[None, :] < q_end[:, None]


# --- shadows -----------------------------------------------------------------------------------

def _distinct(values: torch.Tensor, limit: int) -> int:
    """How many distinct finite values ``values`` holds; exact above ``limit``, a bound at or below."""
    v = values[torch.isfinite(values)]
    if v.numel() == 0:
        return 0
    lo, hi = float(v.min()), float(v.max())
    span = int(hi - lo) + 1
    if span <= limit:
        return span
    return int(torch.unique(v).numel())


def _dims(t: torch.Tensor, dim) -> list:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(t.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % max(t.dim(), 1) for d in dims})


def _consistent(sh: torch.Tensor, dims: list, keepdim: bool) -> torch.Tensor:
    """Over ``dims``: the row every element carries when they all carry the same one, else NaN."""
    if sh.dim() == 0 or not dims:
        return sh.clone()
    nan = torch.isnan(sh)
    lo = torch.where(nan, math.inf, sh).amin(dim=dims, keepdim=keepdim)
    hi = torch.where(nan, -math.inf, sh).amax(dim=dims, keepdim=keepdim)
    return torch.where(lo == hi, lo, torch.full_like(lo, NAN))


def _varies(sh: torch.Tensor, dims: list) -> bool:
    """Whether finite rows differ along ``dims`` somewhere."""
    if sh.dim() == 0 or not dims:
        return False
    nan = torch.isnan(sh)
    lo = torch.where(nan, math.inf, sh).amin(dim=dims)
    hi = torch.where(nan, -math.inf, sh).amax(dim=dims)
    return bool(((lo < hi) & torch.isfinite(lo) & torch.isfinite(hi)).any())


def _selected(sh: torch.Tensor, other: torch.Tensor, side: str) -> torch.Tensor:
    """Rows carried through a matrix product with a tensor that holds no input data: where
    ``other`` (``a`` of ``a @ b`` when ``side`` is ``"b"``) picks exactly one term of the sum
    (one nonzero, as ``torch.eye`` or a permutation does), the product copies that term."""
    nz = (other.detach() != 0).to(torch.float64)
    held = (~torch.isnan(sh)).to(torch.float64)
    val = torch.nan_to_num(sh, nan=0.0)
    if side == "b":
        count, hits, got = nz.sum(-1, keepdim=True), nz @ held, nz @ val
    else:
        count, hits, got = nz.sum(-2, keepdim=True), held @ nz, val @ nz
    return torch.where((count == 1) & (hits == 1), got, NAN)


def _fmax(values: list, shape) -> torch.Tensor:
    out = None
    for v in values:
        v = torch.broadcast_to(v, shape)
        out = v if out is None else torch.fmax(out, v)
    return out


def _arg(func, args, kwargs, name, default=None):
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i < len(args) else default
    return default


class _Shadows:
    """Shadow values per storage: ``{data_ptr: (itemsize, elements, {channel: flat float64})}``."""

    def __init__(self):
        self.by_ptr = {}

    @staticmethod
    def _key(t):
        return t.untyped_storage().data_ptr()

    def get(self, t) -> dict:
        if not _holds_data(t):
            return {}
        entry = self.by_ptr.get(self._key(t))
        if entry is None or entry[0] != t.element_size():
            return {}
        try:
            return {c: flat.as_strided(t.shape, t.stride(), t.storage_offset())
                    for c, flat in entry[2].items()}
        except RuntimeError:                       # a view this shadow cannot express
            return {}

    def _entry(self, t, channels):
        key = self._key(t)
        n = t.untyped_storage().nbytes() // t.element_size()
        entry = self.by_ptr.get(key)
        if entry is None or entry[0] != t.element_size() or entry[1] != n:
            entry = (t.element_size(), n, {})
            self.by_ptr[key] = entry
        for c in channels:
            if c not in entry[2]:
                entry[2][c] = torch.full((n,), NAN, dtype=torch.float64, device=t.device)
        return entry

    def set_fresh(self, t, channels: dict):
        """``t`` was just made: its storage holds ``channels`` (others nothing)."""
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        key = self._key(t)
        if not _holds_data(t) or not channels:
            self.by_ptr.pop(key, None)
            return
        self.by_ptr.pop(key, None)
        self.write(t, channels)

    def write(self, t, channels: dict):
        """Values were written into ``t`` (a view, perhaps): its elements now hold ``channels``."""
        if not _holds_data(t):
            return
        key = self._key(t)
        if not channels and key not in self.by_ptr:
            return
        entry = self._entry(t, channels)
        for c, flat in entry[2].items():
            view = flat.as_strided(t.shape, t.stride(), t.storage_offset())
            if c in channels:
                view.copy_(torch.broadcast_to(channels[c].to(view.device, torch.float64), t.shape))
            else:
                view.fill_(NAN)


def _holds_data(t) -> bool:
    """Whether ``t`` can hold a copy of input values: any dtype but bool (an integer view or
    conversion of the input's bits or of its scaled values is a copy too)."""
    return isinstance(t, torch.Tensor) and t.dtype != torch.bool and t.numel() > 0


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


def _row_shadow(t: torch.Tensor, seq_dim: int) -> torch.Tensor:
    shape = [1] * t.dim()
    shape[seq_dim] = t.shape[seq_dim]
    rows = torch.arange(t.shape[seq_dim], dtype=torch.float64, device=t.device).reshape(shape)
    return torch.broadcast_to(rows, t.shape)


# --- the watcher -------------------------------------------------------------------------------

def watch(fn: Callable, inputs: dict, query_side=("q", "o", "do", "lse"),
          block_elements: dict | None = None, causal: bool = False, *,
          block_rows: dict | None = None, reduce_rows: dict | None = None,
          pair_rows: tuple | None = None, blocks: tuple | None = None, seq_dims: dict | None = None,
          python_values: int | None = None, known=(), outside_limit: int | None = None):
    """Run ``fn()`` and return ``(result, Trace)``.

    ``inputs`` maps names to the contiguous tensors ``fn`` uses (sequence along dim 2 of a 4-D
    tensor, the last dim of a 1- or 2-D one, or ``seq_dims[name]``); names in ``query_side``
    index query rows, the others key rows. ``block_rows[name]``: the most rows of that input one
    tensor may read or hold (``block_elements[name]``, in elements, is accepted instead);
    ``reduce_rows[name]``: the most rows one reduction may cover; ``pair_rows = (bm, bn)``: the
    most query and key rows one tensor of scores may cover; with ``causal`` and ``blocks = (bm,
    bn)``, ``Trace.hidden`` marks the pairs above the diagonal that were computed.
    ``python_values``: how many copies of input values may leave torch as Python numbers
    (default: the smallest block of rows; a maximum or a sum of them is not a copy). ``known``:
    tensors made before the call that ``fn`` may read besides ``inputs`` (what a forward saved,
    for its backward); any other tensor from outside of more elements than the smallest block
    (or ``outside_limit``) is recorded in ``Trace.foreign``. ``fn``
    raising :class:`OutsideTorch` means it took input values out of torch; ``Trace.outside``
    says so as well."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seq_dims = dict(seq_dims or {})
    for name, t in inputs.items():
        seq_dims.setdefault(name, 2 if t.dim() >= 3 else t.dim() - 1)
    rows_limit = dict(block_rows or {})
    for name, n in (block_elements or {}).items():
        t = inputs[name]
        per_row = max(1, t.numel() // max(1, t.shape[seq_dims[name]]))
        rows_limit.setdefault(name, max(1, n // per_row // max(1, math.prod(t.shape[:seq_dims[name]]))))
    reduce_limit = dict(reduce_rows or {})
    if python_values is None:
        python_values = min(rows_limit.values()) if rows_limit else 64
    input_ptrs = {t.untyped_storage().data_ptr(): name for name, t in inputs.items()}
    outside_ok = {t.untyped_storage().data_ptr() for t in _tensors(list(known)) if t.numel()}
    made: set = set()                 # storages made during the call
    foreign_limit = min((rows_limit[n] * inputs[n].numel() // max(1, inputs[n].shape[seq_dims[n]])
                         for n in rows_limit if n in inputs), default=outside_limit)
    seen_foreign: set = set()

    def flag_foreign(op, ts):
        if foreign_limit is None:
            return
        for t in ts:
            if not _holds_data(t) or t.numel() <= foreign_limit:
                continue
            key = t.untyped_storage().data_ptr()
            if key in made or key in input_ptrs or key in outside_ok or key in seen_foreign:
                continue
            seen_foreign.add(key)
            trace.foreign.append((op, tuple(t.shape)))

    shadows = _Shadows()
    for name, t in inputs.items():
        side = "@q" if name in query_side else "@k"
        rows = _row_shadow(t, seq_dims[name])
        shadows.set_fresh(t, {name: rows, side: rows})
    carry_names = set(inputs)
    trace = Trace(reads={name: [] for name in inputs})
    if causal and blocks is not None:
        nq = max((t.shape[seq_dims[n]] for n, t in inputs.items() if n in query_side), default=0)
        nk = max((t.shape[seq_dims[n]] for n, t in inputs.items() if n not in query_side), default=0)
        trace.hidden = torch.zeros(nq, nk, dtype=torch.bool)
    live = {"now": 0, "python": 0, "scores": 0}
    holders: dict = {}              # storage -> [tensor objects alive, elements, scores?]

    def release(key):
        entry = holders.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del holders[key]
            live["now"] -= entry[1]
            if entry[2]:
                live["scores"] -= entry[1]

    def count_live(t, scores=False):
        """``t`` holds a fresh storage: count it alive until its last tensor object dies."""
        key = t.untyped_storage().data_ptr()
        if key in input_ptrs:
            return
        made.add(key)
        n = t.numel()
        if n > trace.largest[0]:
            trace.largest = (n, name_of["op"], tuple(t.shape))
        if key in holders:                      # a stale entry: that storage was freed and reused
            holders[key][0] = 1
        holders[key] = [1, n, scores]
        live["now"] += n
        trace.peak_live = max(trace.peak_live, live["now"])
        if scores:
            live["scores"] += n
            trace.peak_scores = max(trace.peak_scores, live["scores"])
        weakref.finalize(t, release, key)

    def count_alias(t):
        key = t.untyped_storage().data_ptr()
        if key in holders:
            holders[key][0] += 1
            weakref.finalize(t, release, key)

    name_of = {"op": ""}

    def substitute(x, c, mutated_ids):
        if _holds_data(x):
            sh = shadows.get(x).get(c)
            if sh is None:
                sh = torch.full(x.shape, NAN, dtype=torch.float64, device=x.device)
            elif id(x) in mutated_ids:
                sh = sh.clone()
            return sh
        if isinstance(x, (list, tuple)):
            return type(x)(substitute(y, c, mutated_ids) for y in x)
        return x

    def channels_for(func, name, args, kwargs, tensors, out, mutated, out_all=None):
        """The channels of ``out`` (one of ``out_all``) computed by ``func`` from ``tensors``'
        shadows."""
        shs = [shadows.get(t) for t in tensors]
        present = set().union(*shs) if shs else set()
        if not present or name in _FILL:
            return {}
        if name in _MOVE:
            result = {}
            if name == "_to_copy":
                return {c: s.clone() for c, s in shs[0].items()}
            ids = {id(t) for t in mutated}
            schema = func._schema.arguments
            for c in present:
                a = [x if i < len(schema) and schema[i].name in _INDEX_ARGS else substitute(x, c, ids)
                     for i, x in enumerate(args)]
                if name in _ZERO_FILLED:          # rows from 1, so that a filled 0 reads as no row
                    a = [[y + 1 for y in x] if isinstance(x, list) else x + 1 if _holds_data(x) else x
                         for x in a]
                if name == "where":              # a number in place of a tensor holds no row
                    a = [NAN if isinstance(x, (int, float)) else x for x in a]
                if name == "constant_pad_nd" and len(a) > 2:
                    a[2] = NAN
                k = {key: (v if key in _INDEX_ARGS else substitute(v, c, ids)) for key, v in kwargs.items()
                     if key not in ("dtype", "device", "layout", "pin_memory")}
                got = _ACCUMULATE_AS_MOVE.get(name, func)(*a, **k)
                got = _tensors(got)[0]
                if name in _ZERO_FILLED:
                    got = torch.where(got == 0, NAN, got - 1)
                if got.shape == out.shape:
                    result[c] = got
            return result
        if name in ("mv", "addmv"):              # a matrix times a column
            a, x = (args[0], args[1]) if name == "mv" else (args[1], args[2])
            col = channels_for(torch.ops.aten.mm.default, "mm", (a, x.unsqueeze(-1)), {}, [a, x],
                               out.unsqueeze(-1), [])
            return {c: v.squeeze(-1) for c, v in col.items()}
        if name in _MATMULS and name in ("mm", "bmm", "addmm", "baddbmm"):
            a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
            sa, sb = shadows.get(a), shadows.get(b)
            carry_a = any(c in carry_names for c in sa)
            carry_b = any(c in carry_names for c in sb)
            # probabilities (scores of query and key rows) weigh values: what they make is new,
            # even where a masked row keeps a single key
            score_a, score_b = ("@q" in sa and "@k" in sa), ("@q" in sb and "@k" in sb)
            result = {}
            for c in present:
                parts = []
                if c in sa and (c.startswith("@") or not carry_b):
                    parts.append(_consistent(sa[c], [sa[c].dim() - 1], False).unsqueeze(-1))
                    if c in carry_names and c not in sb and not score_b:   # b selects single columns: a copy
                        parts.append(_selected(sa[c], b, "a"))
                if c in sb and (c.startswith("@") or not carry_a):
                    parts.append(_consistent(sb[c], [sb[c].dim() - 2], False).unsqueeze(-2))
                    if c in carry_names and c not in sa and not score_a:   # a selects single rows (eye @ k): a copy
                        parts.append(_selected(sb[c], a, "b"))
                if name in ("addmm", "baddbmm"):
                    sc = shadows.get(args[0])
                    if c in sc:
                        parts.append(sc[c])
                if parts:
                    result[c] = _fmax(parts, out.shape)
            return result
        if name in _REDUCE or name in _ROWWISE:
            src = shs[0]
            dims = _dims(tensors[0], _arg(func, args, kwargs, "dim"))
            keepdim = bool(_arg(func, args, kwargs, "keepdim", False))
            outs = _tensors(out_all)
            if name in _INDEXED and len(outs) == 2 and not outs[1].is_floating_point():
                if out is not outs[0] or len(dims) != 1:
                    return {}                        # the indices: positions, not values
                idx = outs[1]
                if idx.dim() < tensors[0].dim():
                    idx = idx.unsqueeze(dims[0])
                return {c: torch.gather(s, dims[0], idx).reshape(out.shape) for c, s in src.items()}
            result = {}
            for c, s in src.items():
                if name in _SUMS and c in carry_names:   # a term that is exactly 0 adds nothing
                    s = torch.where(tensors[0] != 0, s, NAN)
                if name in _ROWWISE:
                    if c.startswith("@") or name in _SCANS:   # a scan's element i holds term i
                        result[c] = s if s.shape == out.shape else None
                else:
                    r = _consistent(s, dims, keepdim)
                    if r.shape == out.shape or r.numel() == out.numel():
                        result[c] = r.reshape(out.shape)
            return {c: v for c, v in result.items() if v is not None}
        if torch.Tag.pointwise in func.tags:
            result = {}
            for c in present:
                vals = [s[c] for s in shs if c in s]
                try:
                    result[c] = _fmax(vals, out.shape)
                except RuntimeError:
                    result[c] = _consistent(torch.cat([v.flatten() for v in vals]), [0], False).expand(out.shape)
            return result
        result = {}                                # anything else: only a row all inputs agree on
        for c in present:
            flat = torch.cat([s[c].flatten() for s in shs if c in s])
            result[c] = _consistent(flat, [0], False).expand(out.shape)
        return result

    def flag_output(name, t, ch):
        shape = tuple(t.shape)
        for c, s in ch.items():
            if c in rows_limit:
                n = _distinct(s, rows_limit[c])
                if n > rows_limit[c]:
                    trace.whole_reads.append((c, name, shape, n))
        if "@q" in ch and "@k" in ch:
            sq, sk = ch["@q"], ch["@k"]
            pair = ~torch.isnan(sq) & ~torch.isnan(sk)
            if bool(pair.any()):
                if pair_rows is not None:
                    for side, s, lim in (("k", sk, pair_rows[1]), ("q", sq, pair_rows[0])):
                        n = _distinct(torch.where(pair, s, NAN), lim)
                        if n > lim:
                            trace.wide_scores.append((side, name, shape, n))
                qs, ks = sq[pair], sk[pair]
                if trace.hidden is not None:
                    above = ks > qs
                    if bool(above.any()):
                        qi, kj = qs[above].long(), ks[above].long()
                        ok = (qi < trace.hidden.shape[0]) & (kj < trace.hidden.shape[1])
                        trace.hidden[qi[ok], kj[ok]] = True
                if causal and name in _MATMULS and bool(pair.all()):
                    qr = (int(qs.min()), int(qs.max()))
                    kr = (int(ks.min()), int(ks.max()))
                    if kr[0] > qr[1]:
                        trace.masked_products.append((name, qr, kr))

    def flag_storage(name, t):
        """After a write into (a view of) ``t``: does its whole storage now hold too many rows?"""
        key = t.untyped_storage().data_ptr()
        entry = shadows.by_ptr.get(key)
        if entry is None or key in input_ptrs:       # an input holds its own rows
            return
        for c, flat in entry[2].items():
            if c in rows_limit and c in carry_names:
                n = _distinct(flat, rows_limit[c])
                if n > rows_limit[c]:
                    base = t._base if t._base is not None else t
                    trace.whole_reads.append((c, name, tuple(base.shape), n))

    def flag_operands(name, func, args, kwargs, tensors):
        for t in tensors:
            for c, s in shadows.get(t).items():
                if c not in carry_names:
                    continue
                trace.reads[c].append(int((~torch.isnan(s)).sum()))
                if c in rows_limit:
                    n = _distinct(s, rows_limit[c])
                    if n > rows_limit[c]:
                        trace.whole_reads.append((c, name, tuple(t.shape), n))
        if (name in _REDUCE or name in _ROWWISE) and tensors:
            t = tensors[0]
            src = shadows.get(t)
            dims = _dims(t, _arg(func, args, kwargs, "dim"))
            for c, s in src.items():
                if c in reduce_limit:
                    n = _distinct(s, reduce_limit[c])
                    if n > reduce_limit[c]:
                        trace.wide_reductions.append((c, name, tuple(t.shape), n))
            if "@k" in src and "@q" in src:
                keys = torch.where(torch.isnan(src["@q"]), NAN, src["@k"])
                if _varies(keys, dims):
                    trace.key_reductions.append((name, tuple(t.shape)))

    def carried(t) -> int:
        """How many elements of ``t`` hold a copy of some input's values."""
        sh = [s for c, s in shadows.get(t).items() if c in carry_names]
        if not sh:
            return 0
        held = torch.zeros(t.shape, dtype=torch.bool)
        for s in sh:
            held |= ~torch.isnan(s)
        return int(held.sum())

    def outside(message):
        trace.outside.append(message)
        raise OutsideTorch(message)

    class _Values(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            fname = getattr(func, "__name__", "")
            if fname in _RAW and any(shadows.get(t) for t in _tensors(list(args))):
                outside(f"used Tensor.{fname} on values computed from the inputs: it reaches memory or runs "
                        f"Python per element where the checker sees no operator; use torch operators")
            if fname in _NUMPY and args and isinstance(args[0], torch.Tensor):
                names = [c for c in shadows.get(args[0]) if c in carry_names]
                if names or any(c.startswith("@") for c in shadows.get(args[0])):
                    outside(f"took values computed from {', '.join(names) or 'the inputs'} out of torch "
                            f"into NumPy (Tensor.{fname}): the checker can only watch torch operators, "
                            f"and a kernel never leaves them; do the work with torch tensors")
            elif fname == "tolist" and args and isinstance(args[0], torch.Tensor):
                n = carried(args[0])
                if n:
                    live["python"] += n
                    if live["python"] > python_values:
                        outside(f"took {live['python']:,} values computed from the inputs out of torch as "
                                f"Python numbers (Tensor.tolist): the checker can only watch torch "
                                f"operators; keep the work in torch tensors")
            return func(*args, **(kwargs or {}))

    class _Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            with torch._C.DisableTorchFunction():
                return self.record(func, args, kwargs, out)

        def record(self, func, args, kwargs, out):
            name = func.overloadpacket.__name__
            name_of["op"] = name
            trace.n_ops += 1
            if trace.stopped:
                return out
            if len(trace.whole_reads) + len(trace.wide_scores) >= STOP_AFTER:
                trace.stopped = True          # the verdict is clear; spare the time of watching on
                return out
            tensors = _tensors((args, tuple(kwargs.values())))
            outs = _tensors(out)
            if name in _RANDOM:
                trace.random.append(name)
            if not (func.is_view or name in _ALIAS):
                flag_foreign(name, tensors)
            arg_ptrs = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
            if name == "_local_scalar_dense":
                if carried(args[0]):
                    live["python"] += 1
                    if live["python"] > python_values:
                        outside(f"took {live['python']:,} values computed from the inputs out of torch as "
                                f"Python numbers (.item(), float()): the checker can only watch torch "
                                f"operators; keep the work in torch tensors")
                return out
            if func.is_view or name in _ALIAS:
                for t in outs:                   # same storage: the shadow is shared
                    count_alias(t)
                return out
            mutated = []
            if func._schema.is_mutable:
                for i, a in enumerate(func._schema.arguments):
                    if a.alias_info is not None and a.alias_info.is_write:
                        x = kwargs.get(a.name, args[i] if i < len(args) else None)
                        mutated += _tensors(x)
                for t in mutated:
                    hit = input_ptrs.get(t.untyped_storage().data_ptr())
                    if hit is not None:
                        trace.input_writes.append((hit, name))
            if name in _NO_READ:
                for t in outs:
                    if not any(t is m for m in mutated):
                        shadows.set_fresh(t, {})
                        count_live(t)
                return out
            computing = name not in _MOVE and name not in _FILL and torch.Tag.pointwise not in func.tags
            if computing:
                flag_operands(name, func, args, kwargs, tensors)
            for t in outs:
                if not _holds_data(t):
                    if not any(t is m for m in mutated) and t.numel():
                        shadows.set_fresh(t, {})
                        count_live(t)
                    continue
                ch = channels_for(func, name, args, kwargs, tensors, t, mutated, out)
                if any(t is m for m in mutated):
                    shadows.write(t, ch)
                    flag_storage(name, t)
                elif t.numel() and t.untyped_storage().data_ptr() in arg_ptrs:
                    continue                     # returned an argument (or a view of one) as is
                else:
                    shadows.set_fresh(t, ch)
                    count_live(t, "@q" in ch and "@k" in ch
                               and bool((~torch.isnan(ch["@q"]) & ~torch.isnan(ch["@k"])).any()))
                if ch:
                    flag_output(name, t, ch)
            return out

    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # tiny tensors: threads cost more than they give
    try:
        with _Values(), _Watch():
            result = fn()
        if not trace.stopped:         # once stopped, what it made is no longer recorded
            flag_foreign("returned", _tensors(result))
        gc.collect()                  # what the call left in reference cycles is not kept
        trace.live_after = live["now"]
    finally:
        torch.set_num_threads(threads)
    return result, trace


def run_watched(fn: Callable, inputs: dict, **kwargs):
    """``watch`` that answers instead of raising: ``(result, trace, message)``, the message
    saying that the reader's code raised (or left torch), or None."""
    try:
        result, trace = watch(fn, inputs, **kwargs)
    except OutsideTorch as exc:
        return None, None, f"your function {exc}"
    except Exception as exc:  # noqa: BLE001 - the reader's code raised: say so instead of a traceback wall
        return None, None, f"your function raised {type(exc).__name__}: {exc}"
    if trace.outside:                             # it caught our exception and went on
        return None, None, f"your function {trace.outside[0]}"
    return result, trace, None


def private_copies(*tensors: torch.Tensor):
    """One contiguous copy per tensor for the reader's function and one kept aside, so that an
    answer that writes into its inputs is caught and cannot spoil the reference."""
    given = tuple(t.detach().clone().contiguous() for t in tensors)
    kept = tuple(t.detach().clone() for t in tensors)
    return given, kept


def mutated(names, given, kept) -> list[str]:
    """Names of the inputs whose values changed."""
    return [n for n, g, k in zip(names, given, kept) if not torch.equal(g.detach(), k)]


__all__ = ["Trace", "OutsideTorch", "watch", "run_watched", "causal_allowed", "private_copies",
           "mutated", "wrap"]

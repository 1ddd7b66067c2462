"""A paged KV cache: one pool of fixed-size pages, a block table per sequence.

A contiguous cache reserves ``max_len`` positions for every sequence up front; a batch of
sequences of different lengths then wastes the difference, and a sequence cannot grow past its
reservation. PagedAttention (vLLM) borrows the operating system's answer: memory comes in pages
of ``page_size`` positions from one shared pool, and each sequence keeps a table of the pages it
holds, in order. Position ``p`` of sequence ``b`` lives in page ``block_table[b, p // page_size]``
at row ``p % page_size``. A sequence wastes at most one partly filled page, and pages go back to
the pool when it ends.

The pool is ``(num_pages, Hkv, page_size, D)`` per layer, the layout
:func:`flashtut.decode_attention` reads with a ``block_table``.
"""
from __future__ import annotations

import torch

from .checks import check_block, check_float_dtype, check_tensor
from .decode import gather_cache


class PagedKVCache:
    """Keys and values of ``layers`` layers for ``batch`` sequences, in a pool of ``num_pages``
    pages of ``page_size`` positions; each sequence may hold up to ``max_pages`` pages.

    * ``k``, ``v``: ``(layers, num_pages, kv_heads, page_size, head_dim)``;
      ``k[layer]`` is the pool :func:`flashtut.decode_attention` takes.
    * ``block_table``: int32 ``(batch, max_pages)`` on the cache's device (entries past a
      sequence's pages are 0 and never read).
    * ``seqlens``: int32 ``(batch,)`` on the device; ``lengths``: the same as Python ints.

    :meth:`append` writes new positions at the end of some sequences, taking pages from the pool as
    they fill; the lengths advance after the last layer's append. :meth:`release` returns a
    sequence's pages. Errors name the argument: a pool with no free page (``num_pages``), a
    sequence past its table (``max_pages``), a tensor of the wrong shape, dtype or device.
    """

    def __init__(self, num_pages: int, page_size: int, kv_heads: int, head_dim: int, batch: int,
                 max_pages: int | None = None, layers: int = 1, device=None, dtype=torch.float32):
        self.num_pages = check_block("num_pages", num_pages)
        self.page_size = check_block("page_size", page_size)
        self.batch = check_block("batch", batch)
        self.max_pages = self.num_pages if max_pages is None else check_block("max_pages", max_pages)
        self.layers = check_block("layers", layers)
        shape = (self.layers, self.num_pages, check_block("kv_heads", kv_heads), self.page_size,
                 check_block("head_dim", head_dim))
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.block_table = torch.zeros((self.batch, self.max_pages), dtype=torch.int32, device=self.k.device)
        self.seqlens = torch.zeros(self.batch, dtype=torch.int32, device=self.k.device)
        self.lengths = [0] * self.batch
        self.pages: list[list[int]] = [[] for _ in range(self.batch)]
        # pages handed out from the front; released ones come back at the end
        self._free = list(range(self.num_pages))

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def _seqs(self, seqs) -> list[int]:
        if seqs is None:
            return list(range(self.batch))
        if isinstance(seqs, int) and not isinstance(seqs, bool):
            seqs = [seqs]
        seqs = [int(s) for s in seqs]
        bad = [s for s in seqs if not 0 <= s < self.batch]
        if bad or len(set(seqs)) != len(seqs) or not seqs:
            raise ValueError(f"seqs must name distinct sequences 0 to {self.batch - 1}, got {seqs}")
        return seqs

    def reserve(self, seq: int, length: int) -> None:
        """Give sequence ``seq`` enough pages to hold ``length`` positions (taken from the pool;
        the table on the device is updated)."""
        need = -(-length // self.page_size)
        if need > self.max_pages:
            raise ValueError(f"max_pages: sequence {seq} needs {need} pages of {self.page_size} for "
                             f"{length} positions; its table holds {self.max_pages}")
        held = self.pages[seq]
        if need - len(held) > len(self._free):
            raise ValueError(f"num_pages: the pool of {self.num_pages} pages has {len(self._free)} free, "
                             f"and sequence {seq} needs {need - len(held)} more for {length} positions")
        new = [self._free.pop(0) for _ in range(need - len(held))]
        if new:
            self.block_table[seq, len(held):need] = torch.tensor(new, dtype=torch.int32)
            held.extend(new)

    def slots(self, seqs, n_new: int):
        """``(seq, page, row)`` long tensors of the ``n_new`` positions after the end of each of
        ``seqs``, in order (pages reserved as needed)."""
        seq_idx, page_idx, row_idx = [], [], []
        for s in seqs:
            self.reserve(s, self.lengths[s] + n_new)
            for p in range(self.lengths[s], self.lengths[s] + n_new):
                seq_idx.append(s)
                page_idx.append(self.pages[s][p // self.page_size])
                row_idx.append(p % self.page_size)
        dev = self.k.device
        return (torch.tensor(seq_idx, device=dev), torch.tensor(page_idx, device=dev),
                torch.tensor(row_idx, device=dev))

    def append(self, k: torch.Tensor, v: torch.Tensor, layer: int = 0, seqs=None, advance: bool | None = None):
        """Write ``k``, ``v`` ``(len(seqs), Hkv, T, D)`` (``seqs`` None: every sequence) as the
        next ``T`` positions of those sequences in ``layer``. The lengths advance by ``T`` after
        the last layer (``advance`` None), or as ``advance`` says."""
        seqs = self._seqs(seqs)
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t)
            check_float_dtype(name, t)
            want = (len(seqs), self.k.shape[2], None, self.k.shape[4])
            if t.dim() != 4 or any(w is not None and w != g for w, g in zip(want, t.shape)):
                raise ValueError(f"{name} must be (len(seqs), kv_heads, T, head_dim) = ({len(seqs)}, "
                                 f"{self.k.shape[2]}, T, {self.k.shape[4]}), got {tuple(t.shape)}")
            if t.device != self.k.device:
                raise ValueError(f"{name} must be on the cache's device {self.k.device}, got {t.device}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.layers:
            raise ValueError(f"layer must be an int from 0 to {self.layers - 1}, got {layer!r}")
        T = k.shape[2]
        _, page, row = self.slots(seqs, T)
        # (len(seqs) * T, Hkv, D) in the order of slots(): sequence by sequence, position by position
        self.k[layer][page, :, row] = k.transpose(1, 2).reshape(-1, k.shape[1], k.shape[3]).to(self.k.dtype)
        self.v[layer][page, :, row] = v.transpose(1, 2).reshape(-1, v.shape[1], v.shape[3]).to(self.v.dtype)
        if advance if advance is not None else layer == self.layers - 1:
            self.advance(T, seqs)

    def advance(self, n: int, seqs=None) -> None:
        """Count ``n`` more positions in each of ``seqs`` (after their keys and values were written)."""
        for s in self._seqs(seqs):
            self.reserve(s, self.lengths[s] + n)
            self.lengths[s] += n
        self.seqlens.copy_(torch.tensor(self.lengths, dtype=torch.int32))

    def release(self, seq: int) -> None:
        """Sequence ``seq`` ended: its pages go back to the pool, its length to 0."""
        (seq,) = self._seqs([seq])
        self._free.extend(self.pages[seq])
        self.pages[seq] = []
        self.lengths[seq] = 0
        self.block_table[seq] = 0
        self.seqlens[seq] = 0

    def gather(self, layer: int, seq: int):
        """The cached ``(k, v)`` of sequence ``seq`` in ``layer``, ``(Hkv, length, D)`` each, read
        through the table (for checking; the kernel never makes this copy)."""
        n = self.lengths[seq]
        return (gather_cache(self.k[layer], seq, n, self.block_table),
                gather_cache(self.v[layer], seq, n, self.block_table))


__all__ = ["PagedKVCache"]

"""Generation as a server runs it: a batch of prompts of different lengths, a paged KV cache, the
split-KV decode kernel, and the decode step captured in a CUDA graph.

* :class:`DecodeCache` is the model's cache for this loop. Each prompt is prefilled on its own
  (its keys and values written into its pages, attention by the model's backend); then every step
  feeds one new token per sequence, writes its key and value at each sequence's own position
  (computed on the device from ``cache_seqlens`` and the block table) and attends through
  :func:`flashtut.decode_attention`'s kernel. ``layout="dense"`` keeps the same loop over a
  contiguous ``(B, Hkv, max_len, D)`` cache, and ``kernel="sdpa"`` attends there with
  ``scaled_dot_product_attention`` (a mask hides each sequence's unused positions): the baseline.
* :func:`generate_batch` runs the loop. On a GPU the decode step is captured once in a CUDA graph
  (static shapes: the pool, the table and every buffer are allocated before the capture, and the
  kernel reads the lengths on the device) and replayed for every new token, so Python's
  per-launch overhead (a few microseconds times about 20 launches per layer) does not hide the
  kernel's time.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from ..checks import check_block, check_bool
from ..decode import decode_attention_reference
from ..paged_cache import PagedKVCache
from ..triton.decode import choose_num_splits, decode_launch
from .attention import attend
from .gpt import GPT
from .ids import check_token_ids

KERNELS = ("triton", "reference", "sdpa")
LAYOUTS = ("paged", "dense")


class DecodeCache:
    """The KV cache of :func:`generate_batch` for ``batch`` sequences of up to ``max_len`` tokens.

    ``layout``: ``"paged"`` (a :class:`flashtut.paged_cache.PagedKVCache` of ``page_size``-token
    pages; ``num_pages`` defaults to what ``batch * max_len`` needs) or ``"dense"``.
    ``kernel``: ``"triton"`` (the split-KV kernel, ``num_splits`` chosen from the batch, heads,
    ``max_len`` and the GPU when None), ``"reference"`` (the PyTorch split-KV) or ``"sdpa"``
    (dense only). Set :attr:`prefilling` to a sequence index to feed that sequence's prompt.
    """

    def __init__(self, config, batch: int, max_len: int, device=None, dtype=torch.float32,
                 layout: str = "paged", kernel: str = "triton", page_size: int = 64,
                 num_pages: int | None = None, num_splits: int | None = None):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        if kernel == "sdpa" and layout != "dense":
            raise ValueError("kernel 'sdpa' reads a dense cache: pass layout='dense'")
        if config.window is not None:
            raise ValueError(f"config.window = {config.window}: the decode kernel has no sliding window; "
                             "generate with flashtut.model.generate instead")
        self.layout, self.kernel = layout, kernel
        self.batch, self.max_len = check_block("batch", batch), check_block("max_len", max_len)
        page_size = check_block("page_size", page_size) if layout == "paged" else self.max_len
        per_seq = -(-self.max_len // page_size)
        self.pool = PagedKVCache(per_seq * self.batch if num_pages is None else num_pages, page_size,
                                 config.n_kv_head, config.head_dim, self.batch, per_seq,
                                 layers=config.n_layer, device=device, dtype=dtype)
        if layout == "dense":          # one page per sequence, page b for sequence b: a contiguous cache
            for b in range(self.batch):
                self.pool.reserve(b, self.max_len)
        self.scale = 1.0 / math.sqrt(config.head_dim)
        dev = self.pool.k.device
        if num_splits is None:
            num_splits = choose_num_splits(self.batch, config.n_kv_head, self.max_len, dev) \
                if dev.type == "cuda" else 1
        self.num_splits = check_block("num_splits", num_splits)
        self.prefilling: int | None = None
        self._after = self.pool.seqlens + 1
        self._keys = torch.arange(self.max_len, device=dev)

    @property
    def lengths(self) -> list[int]:
        return self.pool.lengths

    def positions(self, n_new: int, device) -> torch.Tensor:
        b = self.prefilling
        if b is not None:
            start = self.pool.lengths[b]
            return torch.arange(start, start + n_new, device=device)
        if n_new != 1:
            raise ValueError(f"a decode step feeds one token per sequence, got {n_new}; prefill one "
                             "sequence at a time (set prefilling)")
        # device tensors only from here on: the step is captured in a CUDA graph
        self._after = self.pool.seqlens + 1
        return self.pool.seqlens.long()[:, None]

    def attend(self, layer: int, q, k, v, backend, window=None):
        pool = self.pool
        b = self.prefilling
        if b is not None:
            if pool.lengths[b]:
                raise ValueError(f"sequence {b} already holds {pool.lengths[b]} "
                                 "tokens; prefill starts from an empty sequence")
            pool.append(k, v, layer=layer, seqs=[b], advance=False)
            return attend(q, k, v, backend)
        # one new key and value per sequence, at position seqlens[b]
        pos = pool.seqlens.long()
        page = pool.block_table.gather(1, (pos // pool.page_size)[:, None])[:, 0].long()
        row = pos % pool.page_size
        k_cache, v_cache = pool.k[layer], pool.v[layer]
        k_cache[page, :, row] = k[:, :, 0].to(k_cache.dtype)
        v_cache[page, :, row] = v[:, :, 0].to(v_cache.dtype)
        q = q.to(k_cache.dtype)
        table = pool.block_table
        if self.layout == "dense":     # page b is sequence b's whole cache
            k_cache, v_cache, table = k_cache[:self.batch], v_cache[:self.batch], None
        if self.kernel == "sdpa":
            return self._sdpa(q, k_cache, v_cache)
        if self.kernel == "reference":
            return decode_attention_reference(q, k_cache, v_cache, self._after, table,
                                              self.scale)
        return decode_launch(q, k_cache, v_cache, self._after, table, self.scale,
                             self.num_splits)

    def _sdpa(self, q, k, v):
        """SDPA over the dense cache: the ``H / Hkv`` query heads of a group become ``H / Hkv``
        query rows of one key/value head (exact for one new token), and a mask hides each
        sequence's positions past its length."""
        B, H, _, D = q.shape
        Hkv = k.shape[1]
        visible = (self._keys[None, :] < self._after[:, None])[:, None, None, :]    # (B, 1, 1, max_len)
        o = F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v,
                                           attn_mask=visible, scale=self.scale)
        return o.reshape(B, H, 1, D)

    def advance(self, n_new: int) -> None:
        b = self.prefilling
        if b is not None:
            self.pool.advance(n_new, [b])
        else:
            self.pool.seqlens.add_(1)          # on the device; count_step() keeps the host's count

    def count_step(self) -> None:
        """The host's record of a decode step (a graph replay runs no Python)."""
        for b in range(self.batch):
            self.pool.lengths[b] += 1

    def reserve_steps(self, steps: int) -> None:
        """Pages for ``steps`` more tokens of every sequence, taken before a graph is captured."""
        for b in range(self.batch):
            self.pool.reserve(b, min(self.max_len, self.pool.lengths[b] + steps))


def _prompts(prompts, vocab_size):
    if isinstance(prompts, torch.Tensor):
        check_token_ids("prompts", prompts, vocab_size)
        return list(prompts)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a (B, T) tensor or a non-empty list of 1-D token tensors, "
                        f"got {type(prompts).__name__}")
    return [check_token_ids(f"prompts[{i}]", p[None] if isinstance(p, torch.Tensor) and p.dim() == 1 else p,
                            vocab_size)[0] for i, p in enumerate(prompts)]


def _autocast(device, dtype):
    # no weight-cast cache: a CUDA graph must not capture casts that a cache would skip later
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype, cache_enabled=False)


@torch.no_grad()
def generate_batch(model: GPT, prompts, new_tokens: int, kernel: str = "triton", layout: str = "paged",
                   page_size: int = 64, cuda_graph: bool | None = None, dtype: torch.dtype | None = None,
                   num_splits: int | None = None, timings: dict | None = None) -> list[torch.Tensor]:
    """Greedy generation of ``new_tokens`` tokens after each prompt (a list of 1-D token tensors of
    any lengths, or a ``(B, T)`` tensor). Returns one 1-D tensor per sequence: prompt, then new
    tokens. The same tokens as :func:`flashtut.model.generate` (to rounding of near-ties).

    ``kernel``/``layout``/``page_size``/``num_splits``: the cache (:class:`DecodeCache`).
    ``cuda_graph``: capture the decode step once and replay it (default: on a CUDA device).
    ``dtype``: autocast dtype (None: the model's own). ``timings``, a dict, receives the seconds
    of the prefill, of the first step with the graph's capture (``"setup_s"``) and of the
    ``"steps"`` decode steps after it (``"decode_s"``).
    """
    new_tokens = check_block("new_tokens", new_tokens)
    seqs = _prompts(prompts, model.config.vocab_size)
    device = next(model.parameters()).device
    cuda_graph = device.type == "cuda" if cuda_graph is None else check_bool("cuda_graph", cuda_graph)
    if cuda_graph and device.type != "cuda":
        raise ValueError("cuda_graph=True needs the model on a CUDA device")
    model.eval()
    B = len(seqs)
    max_len = max(len(p) for p in seqs) + new_tokens
    cache = DecodeCache(model.config, B, max_len, device, dtype or next(model.parameters()).dtype,
                        layout=layout, kernel=kernel, page_size=page_size, num_splits=num_splits)
    clock = _Clock(device)
    out = [[p.to(device)] for p in seqs]
    first = []
    for b, p in enumerate(seqs):                      # prefill, one prompt at a time
        cache.prefilling = b
        with _autocast(device, dtype):
            logits, _ = model(p.to(device)[None], cache=cache)
        first.append(logits[0, -1].float().argmax())
    cache.prefilling = None
    tokens = torch.stack(first)[:, None]             # (B, 1): the input of the next step
    prefill_s = clock.lap()
    cache.reserve_steps(new_tokens)

    def step():
        with _autocast(device, dtype):
            logits, _ = model(tokens, cache=cache)
        tokens.copy_(logits[:, -1].float().argmax(dim=-1, keepdim=True))

    produced = [tokens.clone()]
    remaining = new_tokens - 1
    run = step
    if remaining:
        # one eager step first (a real step): it compiles the kernels, so neither that nor the
        # graph's capture is in the decode time. The capture records the next step without running
        # it; each replay is one step that feeds its own next input
        side = torch.cuda.Stream(device) if cuda_graph else None       # None: the stream as it is
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            step()
        if side is not None:
            torch.cuda.current_stream(device).wait_stream(side)
        cache.count_step()
        produced.append(tokens.clone())
        remaining -= 1
        if cuda_graph:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            run = graph.replay
    setup_s = clock.lap()
    for _ in range(remaining):
        run()
        cache.count_step()
        produced.append(tokens.clone())
    decode_s = clock.lap()
    if timings is not None:
        timings.update(prefill_s=prefill_s, setup_s=setup_s, decode_s=decode_s, steps=remaining)
    new = torch.cat(produced, dim=1)
    return [torch.cat([out[b][0], new[b]]) for b in range(B)]


class _Clock:
    """Wall time between laps, with the device drained at each."""

    def __init__(self, device):
        import time

        self._time, self._device = time.perf_counter, torch.device(device)
        self._sync()
        self._t = self._time()

    def _sync(self):
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def lap(self) -> float:
        self._sync()
        t, self._t = self._t, self._time()
        return self._t - t


# -- the measurement of chapter 12's serving loop ----------------------------------------------------

#: (label, kernel, layout, cuda_graph): what :func:`measure_serving` compares
SERVING_METHODS = (("sdpa dense", "sdpa", "dense", True),
                   ("triton paged", "triton", "paged", True),
                   ("triton paged, eager", "triton", "paged", False),
                   ("pytorch reference", "reference", "paged", False))


def mixed_lengths(batch: int, longest: int, seed: int = 0) -> list[int]:
    """``batch`` prompt lengths spread log-uniformly from ``longest / 16`` to ``longest`` (the last
    exactly ``longest``): a serving-like batch of very different requests."""
    gen = torch.Generator().manual_seed(seed)
    low = max(1, longest // 16)
    u = torch.rand(batch - 1, generator=gen).tolist()
    return [max(1, int(math.exp(math.log(low) + t * (math.log(longest) - math.log(low))))) for t in u] + [longest]


def serving_config():
    """The model the serving measurement runs: the attention shape of the decode benchmark (32 query
    heads over 8 key/value heads, D = 128) in a 2-layer GPT with a small MLP, so that at long
    prompts the step's time is the cache's, as in a large model's attention layers."""
    from .gpt import GPTConfig

    return GPTConfig(n_layer=2, d_model=4096, n_head=32, n_kv_head=8, mlp_ratio=1)


def measure_serving(device, prompts=(1024, 4096, 16384, 65536), batches=("1", "mixed-32"), config=None,
                    dtype=torch.bfloat16, new_tokens: int = 32, reference_tokens: int = 3, seed: int = 0,
                    methods=SERVING_METHODS, reference_max_tokens: int = 600_000, on_row=None) -> list[dict]:
    """Rows (``kind`` ``"model"``, ``section`` ``"generation"``) of decode tokens per second: for each
    prompt length and batch (``"1"``, or ``"mixed-N"``: ``N`` prompts of :func:`mixed_lengths`), each
    method of :data:`SERVING_METHODS` generates after the same prompts; the time of the decode steps
    (the prefill and the first step, which compiles the kernels and captures the graph, excluded)
    gives ``tokens_per_s = batch * steps / s``.
    The PyTorch reference runs ``reference_tokens`` tokens (it is slow; ``status`` ``"skipped"``
    where the batch caches more than ``reference_max_tokens`` tokens); ``same_tokens`` is the
    fraction of new tokens equal to the SDPA baseline's (greedy choices may differ at near-ties)."""
    from ..bench.memory import is_oom, release_cached

    for name, n in (("new_tokens", new_tokens), ("reference_tokens", reference_tokens)):
        if check_block(name, n) < 3:
            raise ValueError(f"{name} must be at least 3 (the first new token comes from the prefill, the "
                             f"second compiles the kernels untimed, the rest are timed), got {n}")
    device = torch.device(device)
    config = config or serving_config()
    model = GPT(config, attention_backend="sdpa", seed=seed).to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for batch in batches:
        for P in prompts:
            lengths = [P] if batch == "1" else mixed_lengths(int(batch.split("-")[1]), P, seed)
            prompt = [torch.randint(0, config.vocab_size, (n,), generator=gen) for n in lengths]
            baseline = None
            for label, kernel, layout, graph in methods:
                graph = graph and device.type == "cuda"      # the CPU (tests) runs every step eagerly
                n_new = reference_tokens if kernel == "reference" else new_tokens
                row = dict(kind="model", section="generation", backend="sdpa", method=label, layout=f"batch {batch}",
                           prompt=P, batch=len(lengths), cache_tokens=sum(lengths), new_tokens=n_new,
                           dtype=str(dtype).replace("torch.", ""), cuda_graph=graph)
                if kernel == "reference" and sum(lengths) > reference_max_tokens:
                    row.update(status="skipped", reason=f"over {reference_max_tokens} cached tokens")
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
                    continue
                try:
                    t = {}
                    out = generate_batch(model, prompt, n_new, kernel=kernel, layout=layout, cuda_graph=graph,
                                         timings=t)
                    new = torch.stack([o[-n_new:] for o in out])
                    if kernel == "sdpa":
                        baseline = new
                    if baseline is not None and kernel != "sdpa":
                        k = min(n_new, baseline.shape[1])
                        row["same_tokens"] = float((new[:, :k] == baseline[:, :k]).float().mean())
                    row.update(status="ok", ms=1e3 * t["decode_s"] / t["steps"],
                               tokens_per_s=len(lengths) * t["steps"] / t["decode_s"], prefill_s=t["prefill_s"],
                               setup_s=t["setup_s"])
                except Exception as e:                          # noqa: BLE001 - reported in the row
                    row.update(status="oom" if is_oom(e) else "error", error=f"{type(e).__name__}: {e}"[:300])
                release_cached(device)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows


__all__ = ["DecodeCache", "generate_batch", "measure_serving", "mixed_lengths", "serving_config", "KERNELS",
           "LAYOUTS", "SERVING_METHODS"]

"""``flashtut.model``: a small GPT whose attention is any of the book's implementations.

* :mod:`.gpt`: the model (rotary positions, grouped-query attention, RMSNorm, tied embeddings) and its KV cache
* :mod:`.attention`: the one place that calls attention, per backend (``naive``, ``sdpa``, ``tiled``,
  ``triton``, ``cuda``, or a function of your own)
* :mod:`.tokenizer`, :mod:`.corpus`: bytes as tokens; the book's own prose as the training text
* :mod:`.batching`: random windows, padded and packed batches, the FLOPs of each
* :mod:`.training`, :mod:`.generation`: AdamW training and evaluation; greedy generation with or without the cache
* :mod:`.paged_decoding`: serving-style generation: mixed prompts, a paged cache, the decode kernel, a CUDA graph
* :mod:`.measure`: the GPU measurement of chapter 12 (``python -m flashtut.model.measure --help``)

Example (CPU, seconds)::

    from flashtut import model as m
    tokens = m.load_corpus().tokens()
    gpt = m.GPT(m.GPTConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2), attention_backend="naive")
    losses = m.train(gpt, m.random_windows(tokens, batch=8, context=64, steps=30))
"""
from .attention import BACKENDS, REAL_MODEL_API, attend, attend_packed, attend_split_kv, backend_name
from .batching import model_flops, packed_batch, padded_batch, random_windows
from .corpus import Corpus, load_corpus
from .generation import generate
from .paged_decoding import DecodeCache, generate_batch
from .gpt import GPT, IGNORE_INDEX, GPTConfig, KVCache
from .tokenizer import ByteTokenizer
from .training import autocast_dtype, evaluate, train

__all__ = ["GPT", "GPTConfig", "KVCache", "IGNORE_INDEX", "BACKENDS", "REAL_MODEL_API", "attend", "attend_packed",
           "attend_split_kv", "backend_name", "ByteTokenizer", "Corpus", "load_corpus", "random_windows",
           "padded_batch", "packed_batch", "model_flops", "train", "evaluate", "autocast_dtype", "generate",
           "generate_batch", "DecodeCache"]

"""The library source the chapters display with ``show_source`` keeps every line within
``MAX_SHOWN_LINE`` characters: a longer line makes the listing box on the page scroll sideways.

``SHOWN`` lists the displayed objects by dotted name (a ``@triton.jit`` kernel is shown through its
Python function, ``.fn``); a listing added to a chapter belongs here too.
"""
from __future__ import annotations

import importlib
import inspect

import pytest

MAX_SHOWN_LINE = 88

# (module, attribute path within it; "" for the whole module)
SHOWN = [
    ("flashtut.exercises.ch02", "naive_attention_lesson"),
    ("flashtut.exercises.ch05", "solution_flash_forward"),
    ("flashtut.exercises.ch06", "solution_dv_tile"),
    ("flashtut.exercises.ch06", "solution_flash_backward"),
    ("flashtut.tiled", "tiled_attention_backward"),
    ("flashtut.triton.backward", "_dkdv_query_loop.fn"),
    ("flashtut.triton.backward", "bwd_dkdv_kernel.fn"),
    ("flashtut.triton.backward", "bwd_dq_kernel.fn"),
    ("flashtut.triton.backward", "bwd_preprocess_kernel.fn"),
    ("flashtut.exercises.ch07", "reference_window_key_range"),
    ("flashtut.exercises.ch07", "solution_preprocess"),
    ("flashtut.exercises.ch07", "window_attn_fwd"),
    ("flashtut.triton.configs", ""),
    ("flashtut.triton.forward", "_fwd_key_loop.fn"),
    ("flashtut.triton.forward", "attn_fwd_kernel.fn"),
    ("flashtut.triton.attention", "TritonAttention"),
    ("flashtut.triton.attention", "_forward"),
    ("flashtut.exercises.ch08", "solution_a_fragment_owner"),
    ("flashtut.exercises.ch08", "solution_one_thread_row"),
    ("flashtut.costs.flops", "attention_flops"),
    ("flashtut.decode", "_split_state"),
    ("flashtut.decode", "merge_attention_states"),
    ("flashtut.decode", "split_kv_attention"),
    ("flashtut.decode", "suggest_num_splits"),
    ("flashtut.model.attention", "attend"),
    ("flashtut.model.attention", "attend_packed"),
    ("flashtut.model.attention", "attend_split_kv"),
    ("flashtut.model.gpt", "Attention"),
    ("flashtut.model.gpt", "GPT.forward"),
    ("flashtut.model", "ByteTokenizer"),
    ("flashtut.model", "generate"),
    ("flashtut.model", "packed_batch"),
    ("flashtut.triton.decode_kernels", "decode_split_kernel.fn"),
    ("flashtut.triton.decode_kernels", "_merge_row.fn"),
    ("flashtut.triton.decode_kernels", "_tile_pages.fn"),
    ("flashtut.triton.decode", "decode_launch"),
    ("flashtut.decode", "decode_num_splits"),
    ("flashtut.model.paged_decoding", "DecodeCache.attend"),
]


def _resolve(module: str, path: str):
    obj = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def _name(entry) -> str:
    module, path = entry
    return f"{module}.{path}" if path else module


@pytest.mark.parametrize("entry", SHOWN, ids=[_name(e) for e in SHOWN])
def test_shown_source_lines_fit_the_listing(entry):
    if entry[0].startswith("flashtut.triton"):
        pytest.importorskip("triton")
    source = inspect.getsource(_resolve(*entry))
    long = [f"{len(line):4d}: {line}" for line in source.splitlines() if len(line) > MAX_SHOWN_LINE]
    assert not long, (f"{_name(entry)}: {len(long)} line(s) over {MAX_SHOWN_LINE} characters "
                      "scroll sideways on the page:\n" + "\n".join(long))

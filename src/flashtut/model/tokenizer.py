"""A byte-level tokenizer: each UTF-8 byte is one token, so the vocabulary is the 256 byte values,
nothing is ever out of vocabulary, and no training or download is needed."""
from __future__ import annotations

import numbers

import torch

from .ids import check_integer_dtype


class ByteTokenizer:
    """``encode(text)`` -> int64 tensor of the UTF-8 bytes; ``decode(ids)`` -> text (a
    multi-byte character cut in two decodes as U+FFFD)."""

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)

    def decode(self, ids) -> str:
        """The text of one sequence of ids: a 1-D tensor, a list of ints, or a batch of
        one, ``(1, T)`` (what :func:`flashtut.model.generate` returns)."""
        values = _one_sequence(ids)
        bad = [i for i in values if not 0 <= i < 256]
        if bad:
            raise ValueError(f"token ids must be bytes, 0 to 255, got {bad[:5]}")
        return bytes(values).decode("utf-8", errors="replace")


def _one_sequence(ids) -> list[int]:
    """``ids`` as a list of ints, after checking it is one sequence of integer ids."""
    if isinstance(ids, torch.Tensor):
        check_integer_dtype("ids", ids)
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1:
            raise ValueError(f"ids must be one sequence, (T,) or (1, T), got shape {tuple(ids.shape)}: "
                             "decode the rows of a batch one at a time")
        return ids.tolist()
    if not isinstance(ids, (list, tuple)):
        raise TypeError(f"ids must be a tensor or a list of ints, got {type(ids).__name__}")
    values = list(ids[0]) if len(ids) == 1 and isinstance(ids[0], (list, tuple)) else list(ids)
    wrong = [i for i in values if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
    if wrong:
        raise TypeError(f"ids must be ints, got {type(wrong[0]).__name__} {wrong[0]!r}")
    return [int(i) for i in values]


__all__ = ["ByteTokenizer"]

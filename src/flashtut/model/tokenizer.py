"""A byte-level tokenizer: each UTF-8 byte is one token, so the vocabulary is the 256 byte values,
nothing is ever out of vocabulary, and no training or download is needed."""
from __future__ import annotations

import torch


class ByteTokenizer:
    """``encode(text)`` -> int64 tensor of the UTF-8 bytes; ``decode(ids)`` -> text (a
    multi-byte character cut in two decodes as U+FFFD)."""

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)

    def decode(self, ids) -> str:
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in values if not 0 <= int(i) < 256]
        if bad:
            raise ValueError(f"token ids must be bytes, 0 to 255, got {bad[:5]}")
        return bytes(int(i) for i in values).decode("utf-8", errors="replace")


__all__ = ["ByteTokenizer"]

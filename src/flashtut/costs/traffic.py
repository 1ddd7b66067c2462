"""One record of work and device-memory traffic, shared by every cost model.

The same question comes up three times in the book: what a kernel (chapter 01's roofline, chapter
02's three unfused kernels), a traced PyTorch operator (chapters 02 and 03) or a whole loop schedule
(chapter 05's IO complexity) reads from and writes to device memory, and how much arithmetic it does
per byte. :class:`Traffic` answers all three; the per-tensor element counts are filled in where
the model counts tensor by tensor (the loop schedules of :mod:`flashtut.costs.io_complexity`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Traffic:
    """Work and device-memory traffic of one kernel, operator or schedule.

    ``bytes_read``/``bytes_written``: bytes moved between device memory and the chip;
    ``flops``: arithmetic done (0 where only traffic is counted); ``output``: a short description
    of what was written (a traced operator's output shape and dtype); ``reads``/``writes``: elements
    moved per tensor name, where the model counts tensor by tensor.
    """
    name: str
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    output: str = ""
    reads: Mapping[str, int] = field(default_factory=dict)
    writes: Mapping[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte of device-memory traffic."""
        return self.flops / self.bytes

    @property
    def elements(self) -> int:
        """Elements read plus written, summed over the per-tensor counts."""
        return sum(self.reads.values()) + sum(self.writes.values())

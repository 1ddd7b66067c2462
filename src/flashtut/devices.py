"""Which device to run on when the caller does not say: the GPU when torch sees one."""
from __future__ import annotations

import torch


def default_device() -> torch.device:
    """``cuda`` when torch sees a CUDA GPU, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")

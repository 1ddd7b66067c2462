"""The A/B runner (``pytest experiments/hopper_options``; outside the default test run)."""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hopper_ab  # noqa: E402

from flashtut.cuda import hopper_launch  # noqa: E402


def test_the_pageable_maps_stand_in_for_the_launchs_own():
    """hopper_ab swaps hopper_launch.tensor_maps for its pageable copy during a run: the stand-in must take
    every argument the launch passes (W4's counter, the TMA store's output map), with the same defaults."""
    ours, theirs = (inspect.signature(f) for f in (hopper_ab.pageable_tensor_maps, hopper_launch.tensor_maps))
    assert list(ours.parameters) == list(theirs.parameters)
    assert all(ours.parameters[n].default == theirs.parameters[n].default for n in ours.parameters)

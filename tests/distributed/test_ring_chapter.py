"""What chapter 14 draws and shows: its figures return figures from the numbers the package computes,
and the listings it displays fit the page."""
from __future__ import annotations

import inspect

import matplotlib

matplotlib.use("Agg")

import pytest

from flashtut.distributed import ring, ring_schedule, row_owner, training, work_per_rank
from flashtut.figures import ring_plots


def test_the_figures_draw_what_the_package_computes():
    steps = [ring_schedule(r, 3, 120, True) for r in range(3)]
    unit = max(s.pairs for rank in steps for s in rank)
    assert ring_plots.ring_timeline_figure([[(s.source, s.pairs / unit) for s in rank] for rank in steps], 0.5)
    panels = [(s, row_owner(24, 3, s), work_per_rank(24, 3, s, block=4)) for s in ("contiguous", "zigzag")]
    assert ring_plots.owner_figure(panels)
    assert ring_plots.merge_weights_figure([[1.0, 0.0], [0.4, 0.6]])


def test_row_owner_matches_the_cut():
    assert row_owner(8, 2, "zigzag") == [0, 0, 1, 1, 1, 1, 0, 0]
    assert row_owner(8, 2, "contiguous") == [0, 0, 0, 0, 1, 1, 1, 1]
    assert row_owner(6, 3, "striped") == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("fn", [ring.forward_step, ring.ring_forward, ring.ring_backward, training.train_step])
def test_shown_listings_fit_the_page(fn):
    # chapter 14 displays these with show_source: the listing box holds 88 characters
    long = [line for line in inspect.getsource(fn).splitlines() if len(line) > 88]
    assert not long, long

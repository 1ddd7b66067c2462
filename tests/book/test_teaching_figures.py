"""The figures and helpers added for teaching by building: each returns a figure, checks its
inputs, and the style table gives every implementation its own colour and marker."""
import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from flashtut.figures import bench_plots as bench_plot  # noqa: E402
from flashtut.figures import cuda_plots, online_softmax_plots, style  # noqa: E402


def test_every_implementation_has_its_own_colour_and_marker():
    colours = [c for c, _ in style.IMPL_STYLE.values()]
    markers = [m for _, m in style.IMPL_STYLE.values()]
    assert len(set(colours)) == len(colours) and len(set(markers)) == len(markers)
    seen = {bench_plot.impl_style(n)["color"] for n in style.IMPL_STYLE}
    assert len(seen) == len(style.IMPL_STYLE)
    # an unknown name gets a colour no known implementation uses
    assert bench_plot.impl_style("someone-else")["color"] not in colours
    assert bench_plot.impl_style("triton [H200]") == bench_plot.impl_style("triton")


def test_figures_have_an_opaque_background_and_dark_text():
    style.apply_style()
    assert matplotlib.rcParams["savefig.transparent"] is False
    assert matplotlib.colors.to_hex(matplotlib.rcParams["figure.facecolor"]) == "#ffffff"
    assert style.INK == "#333333"


@pytest.mark.parametrize("make", [
    lambda: cuda_plots.warp_tiles(128, 64, 4),
    lambda: cuda_plots.pipeline_timeline(4, 2),
    lambda: online_softmax_plots.accumulator_figure([1.0, 2.0], [0.5, 0.4], [0.5, 0.7], 0.4, 8),
])
def test_teaching_figures_return_figures(make):
    fig = make()
    assert isinstance(fig, Figure)
    plt.close(fig)


def test_teaching_figures_check_their_inputs():
    with pytest.raises(ValueError, match="block_m"):
        cuda_plots.warp_tiles(100, 64, 4)
    with pytest.raises(ValueError, match="warps must be a positive integer"):
        cuda_plots.warp_tiles(128, 64, 0)
    with pytest.raises(ValueError, match="stages must be at least 2"):
        cuda_plots.pipeline_timeline(4, 1)
    with pytest.raises(ValueError, match="buggy must be a non-empty list"):
        online_softmax_plots.accumulator_figure([1.0, 2.0], [0.5, 0.4], [0.5], 0.4, 8)
    with pytest.raises(ValueError, match="exact must be a finite number"):
        online_softmax_plots.accumulator_figure([1.0], [0.5], [0.5], float("nan"), 8)


def test_show_table_renders_markdown():
    from flashtut.notebook import show_table

    md = show_table(["a", "b|c"], [[1, "x|y"]]).data
    assert md.splitlines()[0].startswith("| a") and "x\\|y" in md and md.count("\n") == 2


def test_diagram_figures_return_figures():
    for make in (cuda_plots.ldmatrix_lanes, cuda_plots.backward_dataflow):
        fig = make()
        assert isinstance(fig, Figure)
        plt.close(fig)


def test_show_file_and_source_fold_under_a_summary():
    from flashtut.notebook import show_file, show_source
    from flashtut.softmax import safe_softmax

    plain = show_file("cuda/kernels/fwd_w2_tma.cu")
    folded = show_file("cuda/kernels/fwd_w2_tma.cu", collapsed="W2 <kernel>")
    html = folded.data
    # a <details> block with the summary escaped, holding the same highlighted listing
    assert html.startswith("<details><summary>W2 &lt;kernel&gt;</summary>") and html.endswith("</details>")
    assert plain._repr_html_() in html and "cp.async.bulk.tensor" in html
    assert "</details>" in show_source(safe_softmax, collapsed="source").data
    assert "<details>" not in show_source(safe_softmax)._repr_html_()  # unfolded without it


def test_ladder_figure_draws_the_hopper_rungs():
    rows = [{"kind": "speed", "impl": impl, "mode": "fwd", "dtype": "float16", "D": 128, "N": 4096,
             "B": 4, "H": 16, "causal": c, "tflops": t + 10 * c, "status": "ok"}
            for impl, t in (("sdpa-flash", 300.0), ("hopper-w1", 310.0), ("hopper-w2", 450.0),
                            ("cuda-mma", 290.0)) for c in (False, True)]
    fig = bench_plot.ladder_figure(rows, causal=(False, True), steps="hopper-", others=("sdpa-flash",))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["sdpa-flash", "hopper-w1", "hopper-w2"]          # cuda-mma not asked for
    plt.close(fig)
    with pytest.raises(ValueError, match=r"cuda-v\*"):                 # the default: chapter 8's steps
        bench_plot.ladder_figure(rows)


def test_measured_caption_names_the_gpu_and_the_files():
    from flashtut.notebook import measured_caption

    rows = [{"device": "NVIDIA H200", "source": "b.json"}, {"device": "NVIDIA H200", "source": "a.json"}]
    assert measured_caption(rows, "Median ms.").data == \
        "*Median ms. Measured on an NVIDIA H200; data: `a.json`, `b.json`.*"
    assert measured_caption([{"device": "Tesla T4", "source": "t.json"}]).data == \
        "*Measured on a Tesla T4; data: `t.json`.*"
    with pytest.raises(ValueError, match="rows"):
        measured_caption([])

"""What a reviewer reads off the plots: titles that agree with their axes, legends that cover
no data, labels inside the figure, and plot files named `<prefix>-<name>`."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from result_factory import make_result, sweep_result

from moebench.record.index import ResultIndex
from moebench.views.plots import make_plots, plot_filename, write_plots

ARMS = ("triton", "sglang", "cuda-gemm", "cuda-swapab", "cuda-fused")


def _drawn(plot):
    FigureCanvasAgg(plot.figure).draw()
    return plot.figure


def _plots(result):
    return {p.name: p for p in make_plots(ResultIndex(result))}


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.fixture(scope="module")
def run_plots():
    return _plots(make_result(shapes=("A8", "A128", "Q8"), arms=ARMS, rounds=3, samples=3))


@pytest.fixture(scope="module")
def sweep_plots():
    return _plots(sweep_result(ms=(1, 4, 16, 64), arms=ARMS, rounds=3, samples=3))


def test_the_bandwidth_title_says_what_the_axis_shows():
    as_fraction = _plots(make_result(rounds=2, samples=2))["bandwidth"].figure.axes[0]
    assert as_fraction.get_ylabel() == "% of measured read bandwidth"
    assert "% of the measured read bandwidth (4.30 TB/s)" in as_fraction.get_title().replace("\n", " ")
    in_tb = _plots(make_result(rounds=2, samples=2, read_bandwidth=None))["bandwidth"].figure.axes[0]
    assert in_tb.get_ylabel() == "TB/s" and "TB/s" in in_tb.get_title() and "%" not in in_tb.get_title()


@pytest.mark.parametrize("name", ["bandwidth", "A8-ratios", "Q8-ratios"])
def test_legends_cover_no_data(run_plots, name):
    fig = _drawn(run_plots[name])
    ax = fig.axes[0]
    (legend,) = fig.legends
    assert len(legend.get_texts()) >= 4
    assert not _overlaps(legend.get_window_extent(), ax.get_window_extent()), name


@pytest.mark.parametrize("name", ["sweep-A-duration", "sweep-A-speedup"])
def test_sweep_legends_cover_no_data(sweep_plots, name):
    fig = _drawn(sweep_plots[name])
    (legend,) = fig.legends
    assert not _overlaps(legend.get_window_extent(), fig.axes[0].get_window_extent())


def _inside(fig, artist) -> bool:
    box, page = artist.get_window_extent(), fig.bbox
    return box.x0 >= page.x0 - 0.5 and box.y0 >= page.y0 - 0.5 and box.x1 <= page.x1 + 0.5 \
        and box.y1 <= page.y1 + 0.5


def test_every_axis_label_title_and_legend_is_inside_its_figure(run_plots, sweep_plots):
    for name, plot in {**run_plots, **sweep_plots}.items():
        fig = _drawn(plot)
        for ax in fig.axes:
            for label in (ax.yaxis.label, ax.xaxis.label, ax.title):
                if label.get_text():
                    assert _inside(fig, label), f"{name}: {label.get_text()!r} is cut off"
        for legend in fig.legends:
            assert _inside(fig, legend), f"{name}: legend is cut off"


def test_the_speedup_axis_names_the_reference(sweep_plots):
    ax = sweep_plots["sweep-A-speedup"].figure.axes[0]
    assert ax.get_ylabel() == "speedup over triton (×)" and "range over rounds" in ax.get_title()


@pytest.mark.parametrize("prefix, name", [("stock", "stock-A8-samples.png"), ("stock-", "stock-A8-samples.png"),
                                          ("run_", "run_A8-samples.png"), ("", "A8-samples.png")])
def test_a_prefix_is_kept_apart_from_the_plot_name(prefix, name):
    assert plot_filename(prefix, "A8-samples", "png") == name


def test_a_model_shape_names_one_file_not_folders():
    assert plot_filename("run", "deepseek-v3/ep8/M8-samples", "png") == "run-deepseek-v3_ep8_M8-samples.png"
    assert plot_filename("", "sweep-kimi-k2/ep8-duration", "svg") == "sweep-kimi-k2_ep8-duration.svg"


def test_written_plots_carry_the_separated_prefix(tmp_path):
    written = write_plots(ResultIndex(make_result(shapes=("A8",), rounds=2, samples=2)), tmp_path, prefix="stock")
    names = sorted(p.name for w in written for p in w.paths)
    assert "stock-A8-samples.png" in names and "stock-bandwidth.svg" in names
    assert all(n.startswith("stock-") for n in names)


# --- one shape and fifteen: titles inside the figure, legends clear of every text ----------

FIFTEEN = tuple(2**i for i in range(15))


@pytest.fixture(scope="module", params=["one shape", "fifteen shapes"])
def plots_at_scale(request):
    if request.param == "one shape":
        return _plots(make_result(shapes=("A8",), arms=ARMS, rounds=2, samples=2))
    return _plots(sweep_result(ms=FIFTEEN, arms=ARMS, rounds=2, samples=2))


def _texts(fig):
    """Every title and axis text of a drawn figure, by what it is."""
    texts = {"suptitle": fig._suptitle} if fig._suptitle is not None else {}
    for i, ax in enumerate(fig.axes):
        texts.update({f"axes {i} title": ax.title, f"axes {i} x label": ax.xaxis.label,
                      f"axes {i} y label": ax.yaxis.label})
        for j, tick in enumerate(ax.get_xticklabels() + ax.get_yticklabels()):
            texts[f"axes {i} tick {j}"] = tick
    return {name: t for name, t in texts.items() if t.get_text() and t.get_visible()}


def test_titles_inside_and_legends_clear_of_text_at_one_shape_and_at_fifteen(plots_at_scale):
    assert "bandwidth" in plots_at_scale
    first = next(iter(plots_at_scale)).split("-")[0]  # per-shape plots are alike: the first shape's
    for name, plot in plots_at_scale.items():
        if name.split("-")[0] not in (first, "bandwidth", "sweep"):
            continue
        fig = _drawn(plot)
        renderer = fig.canvas.get_renderer()
        texts = _texts(fig)
        for label, text in texts.items():
            if "title" in label or label == "suptitle":
                assert _inside(fig, text), f"{name}: {label} {text.get_text()!r} is cut off"
        for legend in fig.legends:
            box = legend.get_window_extent(renderer)
            assert _inside(fig, legend), f"{name}: legend is cut off"
            for label, text in texts.items():
                assert not _overlaps(box, text.get_window_extent(renderer)), \
                    f"{name}: the legend lies over {label} {text.get_text()!r}"

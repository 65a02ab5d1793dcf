"""Braille plot widgets: roofline geometry, skipped points, selection, themes, sizes (Pilot at 80x24)."""

import html
import math
import random

import pytest
from textual.containers import Vertical

from tui.conftest import Harness
from magpie_tui.widgets.plot_canvas import Series
from magpie_tui.widgets.plots import (
    Histogram,
    LinePlot,
    RooflinePlot,
    RooflinePoint,
    ScatterLinePlot,
)


class SmallHarness(Harness):
    """The plot in a 40x12 box inside the terminal."""

    def compose(self):
        with Vertical():
            yield self._w


def screen_text(app) -> str:
    return html.unescape(app.export_screenshot()).replace("\xa0", " ")


PEAK = 1e14   # FLOP/s
BW = 1e12     # bytes/s -> ridge at 100 FLOP/byte


def roofline(points=(), **kw):
    return RooflinePlot({"matrix_bf16": PEAK}, BW, points, **kw)


def cell_style(strip, col):
    """Rich style of one rendered cell."""
    return next(iter(strip.crop(col, col + 1))).style


def column_roles(grid, col):
    return [grid.roles[r][col] for r in range(grid.height)]


# -- roofline geometry (layout only, no app) -------------------------------------------------------------------

def test_ridge_lands_in_the_expected_column():
    # x from 1 to 1e4 (log): the ridge at 100 is exactly half way across the plot area
    plot = roofline(x_range=(1, 1e4), y_range=(1e11, 1e15))
    assert plot.ridge == pytest.approx(100)
    grid = plot.layout_for(80, 24)
    expected_col = grid.plot_left + round((grid.plot_width * 2 - 1) / 2) // 2
    # peak 1e14 is three quarters up a 1e11..1e15 axis
    expected_row = grid.plot_top + round((grid.plot_height * 4 - 1) * 0.25) // 4
    assert grid.cell_of(100, PEAK) == (expected_col, expected_row)
    bottom = grid.plot_top + grid.plot_height
    # the dotted ridge marker runs from the ridge point down to the x axis in that column, and only there
    assert all(role == "ceiling" for role in column_roles(grid, expected_col)[expected_row:bottom])
    for other in (expected_col - 3, expected_col + 3):
        assert column_roles(grid, other)[bottom - 2] is None
    # the flat compute ceiling starts at the ridge: to its right the peak row is ceiling, far left it is not
    assert grid.roles[expected_row][expected_col + 5] == "ceiling"
    assert grid.roles[expected_row][grid.plot_left + 2] != "ceiling"


def test_memory_bound_point_lies_below_the_slope():
    plot = roofline([RooflinePoint(2.0, 5e11, "gemv", "MEMORY_BOUND"),
                     RooflinePoint(1000.0, 3e13, "gemm", "COMPUTE_BOUND")])
    grid = plot.layout_for(80, 24)
    col, row = grid.cell_of(2.0, 5e11)
    assert grid.roles[row][col] == "memory-bound"
    slope_rows = [r for r, role in enumerate(column_roles(grid, col)) if role == "ceiling"]
    assert slope_rows, "the bandwidth slope crosses the point's column"
    assert all(r < row for r in slope_rows)
    # the compute-bound point is right of the ridge and below the flat roof
    ccol, crow = grid.cell_of(1000.0, 3e13)
    rcol, rrow = grid.cell_of(plot.ridge, PEAK)
    assert grid.roles[crow][ccol] == "compute-bound"
    assert ccol > rcol and crow > rrow
    assert grid.roles[rrow][ccol] == "ceiling"


def test_bound_is_inferred_from_the_ridge_when_missing():
    plot = roofline([(1.0, 1e11, "left"), (1e4, 1e13, "right")])
    grid = plot.layout_for(80, 24)
    assert grid.roles[grid.cell_of(1.0, 1e11)[1]][grid.cell_of(1.0, 1e11)[0]] == "memory-bound"
    col, row = grid.cell_of(1e4, 1e13)
    assert grid.roles[row][col] == "compute-bound"
    assert plot.bound_of(0) == "MEMORY_BOUND" and plot.bound_of(1) == "COMPUTE_BOUND"


def test_invalid_points_are_skipped_and_counted():
    pts = [(0, 1e12, "zero-ai"), (10, -5, "neg-flops"), (float("nan"), 1e12, "nan"), (None, 1, "none"),
           (10, 1e12, "ok", "MEMORY_BOUND")]
    plot = roofline(pts)
    assert plot.skipped == 4
    assert len(plot.points) == 5
    grid = plot.layout_for(80, 24)
    assert "(4 skipped)" in grid.text_rows()[0]
    assert len({cell for cell in grid.cells_with_role("memory-bound")}) >= 1
    assert plot.select("zero-ai") is False and plot.selected is None
    assert plot.select(4) is True and plot.selected == 4


def test_only_invalid_points_and_no_peaks_is_no_data():
    plot = RooflinePlot(points=[(0, 0, "a"), (-1, 5, "b")])
    assert plot.skipped == 2
    text = plot.layout_for(60, 10).text()
    assert "no data" in text and "2 point(s)" in text
    assert "no data: no profile" in RooflinePlot(reason="no profile").layout_for(60, 10).text()


def test_several_ceilings_are_drawn_and_labelled():
    plot = RooflinePlot({"matrix_bf16": 989e12, "vector_fp32": 67e12}, {"HBM": 3.35e12},
                        [(30, 5e13, "attn", "MEMORY_BOUND")])
    text = plot.layout_for(100, 30).text()
    assert "matrix_bf16 989TFLOP/s" in text and "vector_fp32 67TFLOP/s" in text and "HBM 3.35TB/s" in text
    grid = plot.layout_for(100, 30)
    for peak in (989e12, 67e12):
        ridge_col, ridge_row = grid.cell_of(peak / 3.35e12, peak)
        assert grid.roles[ridge_row][ridge_col + 2] == "ceiling"


@pytest.mark.parametrize(("w", "h"), [(40, 12), (150, 40), (20, 6), (8, 3), (1, 1)])
def test_roofline_any_size(w, h):
    grid = roofline([(2, 5e11, "k", "MEMORY_BOUND")]).layout_for(w, h)
    assert len(grid.text_rows()) == h and all(len(r) == w for r in grid.text_rows())


# -- Pilot: mounting, screenshots, selection, themes -----------------------------------------------------------

POINTS = [RooflinePoint(0.5, 4e11, "gemv", "MEMORY_BOUND"), RooflinePoint(8, 5e12, "layernorm", "MEMORY_BOUND"),
          RooflinePoint(400, 6e13, "gemm_bf16", "COMPUTE_BOUND")]


async def test_roofline_mounts_and_screenshot_has_title_and_ticks():
    plot = roofline(POINTS)
    app = Harness(plot)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert plot.size == (80, 24)
        text = screen_text(app)
        assert "Roofline" in text
        assert "arithmetic intensity (FLOP/byte)" in text and "FLOP/s" in text
        grid = plot.grid
        x_labels = grid.text_rows()[grid.plot_top + grid.plot_height + 1].split()
        y_labels = [r.split("┤")[0].strip() for r in grid.text_rows() if "┤" in r]
        assert {"1", "10", "100"} <= set(x_labels)
        assert "100T" in y_labels and "1T" in y_labels
        for label in x_labels + y_labels:
            assert label in text


async def test_select_changes_the_rendered_cell():
    plot = roofline(POINTS)
    app = Harness(plot)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        col, row = plot.grid.cell_of(8, 5e12)
        assert plot.grid.roles[row][col] == "memory-bound"
        before_char = plot.grid.chars[row][col]
        before_style = plot.render_line(row)
        assert "layernorm" not in plot.plot_text()

        assert plot.select("layernorm") is True
        await pilot.pause()
        assert plot.selected == 1
        assert plot.grid.roles[row][col] == "selected"
        assert plot.grid.chars[row][col] == "⣿" != before_char
        assert "layernorm" in plot.plot_text()
        strip = plot.render_line(row)
        assert strip != before_style
        selected_style = plot.get_component_rich_style("plot--selected")
        assert cell_style(strip, col) == selected_style
        assert "layernorm" in screen_text(app)

        # moving the selection by index (as a table cursor does) moves the highlight
        plot.select(0)
        await pilot.pause()
        assert plot.grid.roles[row][col] == "memory-bound"
        gcol, grow = plot.grid.cell_of(0.5, 4e11)
        assert plot.grid.roles[grow][gcol] == "selected"
        plot.select(None)
        await pilot.pause()
        assert plot.grid.cells_with_role("selected") == []


async def test_theme_switch_rerenders():
    plot = roofline(POINTS)
    app = Harness(plot)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        col, row = plot.grid.cell_of(0.5, 4e11)
        dark = cell_style(plot.render_line(row), col)
        for theme in ("magpie-light", "magpie-high-contrast", "magpie-dark", "magpie-light"):
            app.theme = theme
            await pilot.pause()
            for y in range(plot.size.height):
                plot.render_line(y)
            assert "Roofline" in screen_text(app)
        light = cell_style(plot.render_line(row), col)
        assert light.color != dark.color
        assert light.color == plot.get_component_rich_style("plot--memory-bound").color


async def test_small_and_large_sizes():
    plot = roofline(POINTS)
    plot.styles.width = 40
    plot.styles.height = 12
    app = SmallHarness(plot)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert plot.size == (40, 12)
        text = plot.plot_text()
        assert text.splitlines()[0].startswith("Roofline")
        assert plot.grid.plot_height >= 4
        assert len([r for r in text.splitlines() if "┤" in r]) >= 2
    big = roofline(POINTS)
    app = Harness(big)
    async with app.run_test(size=(150, 40)) as pilot:
        await pilot.pause()
        assert big.size == (150, 40)
        assert "matrix_bf16" in screen_text(app)


async def test_resize_relayouts():
    plot = roofline(POINTS)
    app = Harness(plot)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert plot.grid.width == 80
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert (plot.grid.width, plot.grid.height) == (100, 30)
        assert len(plot.render_line(0).text) == 100


async def test_histogram_percentile_markers():
    rng = random.Random(7)
    values = [rng.lognormvariate(3, 0.3) for _ in range(3000)]
    hist = Histogram(values)
    app = Harness(hist)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "Latency" in text and "latency (ms)" in text
        pct = hist.percentile_values
        assert pct[50] < pct[90] < pct[99]
        for q in (50, 90, 99):
            assert f"p{q} " in text
        grid = hist.grid
        _edges, counts = hist.bins_for_width(80)
        assert sum(counts) == len(values) and 2 <= len(counts) <= 60
        for q, role in ((50, "series-2"), (90, "series-1"), (99, "series-3")):
            col = grid.cell_of(pct[q], 0)[0]
            bottom = grid.plot_top + grid.plot_height - 1
            # the marker line reaches the bottom, over the bars
            assert grid.roles[bottom][col] == role
        tick_labels = grid.text_rows()[grid.plot_top + grid.plot_height + 1].split()
        assert len(tick_labels) >= 3 and all(label in text for label in tick_labels)

        hist.set_values([], reason="run has no per-request latencies")
        await pilot.pause()
        assert "no data: run has no per-request latencies" in screen_text(app)


async def test_line_plot_sweep_labels():
    sweep = [(800, 20, "c=1"), (1500, 25, "c=2"), (2700, 33, "c=4"), (4200, 52, "c=8"), (5100, 95, "c=16")]
    plot = LinePlot(sweep, title="Sweep")
    app = Harness(plot)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "Sweep" in text and "throughput (tok/s)" in text and "latency (ms)" in text
        for _, _, label in sweep:
            assert label in text
        assert "1k" in text and "5k" in text
        grid = plot.grid
        col, row = grid.cell_of(2700, 33)
        assert grid.roles[row][col] == "series-0"
        plot.select(0, 2)
        await pilot.pause()
        assert plot.grid.roles[row][col] == "selected"
        # the label that was already next to the point is highlighted, not written twice
        assert plot.plot_text().count("c=4") == 1
        plot.set_sweeps({"vllm": sweep, "sglang": [(x * 1.1, y * 0.9, lab) for x, y, lab in sweep]})
        await pilot.pause()
        assert plot.selected == (0, 2)  # still a point of the new data: kept
        assert plot.grid.roles[row][col] != "series-0"
        assert plot.select(1, 9) is False and plot.selected is None
        assert "⣿ vllm" in plot.plot_text() and "⣿ sglang" in plot.plot_text()
        assert plot.grid.cells_with_role("series-1")


async def test_scatter_log_axes_and_empty_states():
    pts = [(10 ** (i / 4), 10 ** (i / 3)) for i in range(20)]
    plot = ScatterLinePlot([Series("kernels", pts)], title="Scatter", x_label="bytes", y_label="ns",
                           log_x=True, log_y=True)
    app = Harness(plot)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        grid = plot.grid
        assert grid.x_axis.log and grid.y_axis.log
        x_labels = grid.text_rows()[grid.plot_top + grid.plot_height + 1].split()
        assert {"1", "10", "100", "1k"} <= set(x_labels)
        assert "Scatter" in screen_text(app)
        plot.set_series([Series("bad", [(0, 1), (-2, 3)])])
        await pilot.pause()
        assert "no data" in plot.plot_text() and "log axis" in plot.plot_text()
        plot.set_series([], reason="nothing selected")
        await pilot.pause()
        assert plot.plot_text().strip() == "no data: nothing selected"
        assert "no data: nothing selected" in screen_text(app)


def test_scatter_selection_bounds():
    plot = ScatterLinePlot([Series("a", [(1, 1), (2, 2)]), Series("empty", []), Series("b", [(3, 1)])])
    assert plot.select(2, 0) is True and plot.selected == (2, 0)
    grid = plot.layout_for(60, 16)
    col, row = grid.cell_of(3, 1)
    assert grid.roles[row][col] == "selected"
    # an empty series in between keeps the later series' colour
    assert grid.roles[grid.cell_of(1, 1)[1]][grid.cell_of(1, 1)[0]] == "series-0"
    plot.select(None)
    assert plot.layout_for(60, 16).roles[row][col] == "series-2"
    assert plot.select(5, 0) is False and plot.selected is None
    assert plot.select(0, 9) is False


def test_large_roofline_selection_is_cheap_to_move():
    rng = random.Random(0)
    pts = [(10 ** rng.uniform(-1, 3), 10 ** rng.uniform(11, 14), f"k{i}", "") for i in range(5000)]
    plot = roofline(pts)
    grid = plot.layout_for(120, 40)
    assert math.isclose(plot.ridge, 100)
    assert len(grid.cells_with_role("memory-bound")) > 10 and len(grid.cells_with_role("compute-bound")) > 10

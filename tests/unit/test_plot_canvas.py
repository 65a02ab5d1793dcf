"""The Textual-free plot primitives: braille dots, lines, axes, ticks, histogram statistics and layout."""

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from magpie_tui.widgets.plot_canvas import (
    Axis,
    Bar,
    BrailleCanvas,
    PlotSpec,
    Series,
    braille_char,
    bresenham,
    clip_segment,
    dot_mask,
    format_si,
    format_tick,
    freedman_diaconis_bins,
    histogram,
    layout_plot,
    linear_ticks,
    log_ticks,
    percentile,
)

REPO = Path(__file__).resolve().parents[2]


# -- braille encoding ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("dots", "char"), [
    ([], "\u2800"),
    ([(0, 0)], "⠁"),               # dot 1
    ([(1, 0)], "⠈"),               # dot 4
    ([(0, 3)], "⡀"),               # dot 7
    ([(1, 3)], "⢀"),               # dot 8
    ([(0, 0), (0, 1), (0, 2)], "⠇"),  # left column without dot 7
    ([(0, 3), (1, 3)], "⣀"),       # bottom row
    ([(x, y) for x in (0, 1) for y in range(4)], "⣿"),
])
def test_braille_encoding_of_known_patterns(dots, char):
    assert braille_char(dot_mask(dots)) == char


def test_dot_outside_a_cell_is_rejected():
    with pytest.raises(ValueError):
        dot_mask([(2, 0)])


def test_canvas_pixels_land_in_the_right_cell_and_dot():
    c = BrailleCanvas(3, 2)
    assert (c.width_px, c.height_px) == (6, 8)
    assert c.set(3, 3, "a")           # cell (1, 0), right column, bottom dot
    assert c.set(0, 4, "b")           # cell (0, 1), left column, top dot
    assert not c.set(6, 0) and not c.set(0, 8) and not c.set(-1, 0)
    assert c.rows(blank=" ") == [" ⢀ ", "⠁  "]
    assert c.get(3, 3) and not c.get(2, 3)
    assert c.series_at(1, 0) == "a" and c.series_at(0, 1) == "b"


def test_last_writer_wins_the_cell_series():
    c = BrailleCanvas(1, 1)
    c.set(0, 0, "ceiling")
    c.set(1, 3, "point")
    assert c.series_at(0, 0) == "point"
    assert c.char(0, 0) == braille_char(0x01 | 0x80)


# -- lines -----------------------------------------------------------------------------------------------------

def test_bresenham_known_line_and_endpoints():
    assert bresenham(0, 0, 5, 2) == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)]
    back = bresenham(5, 2, 0, 0)
    assert back[0] == (5, 2) and back[-1] == (0, 0)


@pytest.mark.parametrize(("x0", "y0", "x1", "y1"), [(0, 0, 9, 3), (3, 7, 3, 0), (8, 1, 0, 6), (2, 2, 2, 2),
                                                      (0, 7, 7, 0)])
def test_bresenham_is_connected_and_hits_both_ends(x0, y0, x1, y1):
    pts = bresenham(x0, y0, x1, y1)
    assert pts[0] == (x0, y0) and pts[-1] == (x1, y1)
    assert len(pts) == max(abs(x1 - x0), abs(y1 - y0)) + 1
    for (ax, ay), (bx, by) in itertools.pairwise(pts):
        assert max(abs(ax - bx), abs(ay - by)) == 1


def test_canvas_line_sets_both_endpoints_and_clips():
    c = BrailleCanvas(5, 2)
    c.line(1, 1, 8, 6, "s")
    assert c.get(1, 1) and c.get(8, 6)
    # a line reaching far outside is clipped (and does not walk a million pixels)
    c2 = BrailleCanvas(5, 2)
    n = c2.line(-1e6, 0, 1e6, 0, "s")
    assert n == c2.width_px
    assert c2.line(-10, -10, -5, -5) == 0


def test_clip_segment():
    assert clip_segment(-10, 5, 20, 5, 0, 0, 9, 9) == (0, 5, 9, 5)
    assert clip_segment(-10, -10, -1, -1, 0, 0, 9, 9) is None


# -- axes and ticks --------------------------------------------------------------------------------------------

def test_linear_axis_maps_and_inverts():
    a = Axis(0, 100, 101)
    assert a.to_pixel(0) == 0 and a.to_pixel(100) == 100 and a.to_pixel(25) == 25
    y = Axis(0, 100, 101, invert=True)
    assert y.to_pixel(100) == 0 and y.to_pixel(0) == 100 and y.to_pixel(25) == 75
    for v in (0.0, 12.5, 73.0, 100.0):
        assert y.from_pixel(y.to_pixel(v)) == pytest.approx(v)
    assert a.pixel(150) is None


def test_log_axis_maps_decades_evenly_and_inverts():
    a = Axis(1, 1e4, 9, log=True)
    assert [a.to_pixel(v) for v in (1, 10, 100, 1000, 1e4)] == pytest.approx([0, 2, 4, 6, 8])
    assert a.from_pixel(6) == pytest.approx(1000)
    assert a.from_pixel(a.to_pixel(3.3)) == pytest.approx(3.3)
    assert a.pixel(0) is None and a.pixel(-5) is None
    y = Axis(1e9, 1e15, 25, log=True, invert=True)
    assert y.to_pixel(1e15) == pytest.approx(0) and y.to_pixel(1e12) == pytest.approx(12)


def test_log_axis_needs_positive_range():
    with pytest.raises(ValueError):
        Axis(0, 10, 10, log=True)


def test_degenerate_range_is_widened():
    a = Axis(5, 5, 10)
    assert a.lo < 5 < a.hi
    b = Axis(100, 100, 10, log=True)
    assert b.lo < 100 < b.hi


@pytest.mark.parametrize(("lo", "hi", "n", "expected"), [
    (0, 100, 6, [0, 20, 40, 60, 80, 100]),
    (0, 1, 5, [0, 0.5, 1]),
    (0.3, 7.1, 6, [2, 4, 6]),
    (-1, 1, 5, [-1, -0.5, 0, 0.5, 1]),
    (16, 99, 4, [20, 40, 60, 80]),
])
def test_linear_ticks_known_ranges(lo, hi, n, expected):
    assert linear_ticks(lo, hi, n) == pytest.approx(expected)


def test_linear_ticks_are_nice_and_inside():
    for lo, hi in [(0.013, 0.071), (123, 98765), (-50, 3), (1e-6, 3e-6)]:
        for n in (2, 4, 7, 10):
            ticks = linear_ticks(lo, hi, n)
            assert 1 <= len(ticks) <= n
            assert all(lo - 1e-12 <= t <= hi + 1e-12 for t in ticks)
            if len(ticks) > 1:
                step = ticks[1] - ticks[0]
                mantissa = step / 10 ** math.floor(math.log10(step))
                assert round(mantissa, 6) in (1, 2, 5, 10)


def test_integer_ticks():
    assert linear_ticks(0, 3, 8, integer=True) == [0, 1, 2, 3]


@pytest.mark.parametrize(("lo", "hi", "n", "expected"), [
    (0.01, 1000, 6, [0.01, 0.1, 1, 10, 100, 1000]),
    (0.01, 1000, 3, [0.01, 1, 100]),
    (1e9, 1e15, 4, [1e10, 1e12, 1e14]),
    (2, 9, 6, [2, 5]),
    (0.35, 3000, 8, [1, 10, 100, 1000]),
])
def test_log_ticks_known_ranges(lo, hi, n, expected):
    assert log_ticks(lo, hi, n) == pytest.approx(expected)


def test_log_tick_labels():
    a = Axis(0.01, 1e12, 200, log=True)
    labels = [label for _, label in a.tick_labels(20)]
    assert labels == ["1e-2", "0.1", "1", "10", "100", "1k", "10k", "100k", "1M", "10M", "100M", "1G", "10G",
                      "100G", "1T"]


def test_formatter_argument_and_label_text():
    a = Axis(0, 10, 50, formatter=lambda v: f"{v:g}ms", label="latency")
    assert [label for _, label in a.tick_labels(3)] == ["0ms", "5ms", "10ms"]
    assert a.label_text() == "latency"
    assert Axis(1, 10, 5, log=True, label="FLOP/s").label_text(show_scale=True) == "FLOP/s (log)"


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (0.01, "1e-2"), (0.1, "0.1"), (0.5, "0.5"), (10, "10"), (999.7, "1k"), (1000, "1k"),
    (2.5e6, "2.5M"), (999_999, "1M"), (1e9, "1G"), (3.35e12, "3.35T"), (-1500, "-1.5k"), (2.5e-3, "2.5e-3"),
])
def test_format_si(value, text):
    assert format_si(value) == text


def test_format_tick_uses_the_step():
    assert [format_tick(v, 500) for v in (0, 500, 1000, 1500, 2000)] == ["0", "500", "1k", "1.5k", "2k"]
    assert [format_tick(v, 0.25) for v in (0, 0.25, 0.5)] == ["0", "0.25", "0.5"]
    assert format_tick(0.02, 0.02) == "0.02"


# -- histogram statistics --------------------------------------------------------------------------------------

def test_percentile_matches_linear_interpolation():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 90) == 90
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    with pytest.raises(ValueError):
        percentile([], 50)


def test_freedman_diaconis_bins():
    values = [i / 1000 for i in range(1000)]  # IQR ~0.5, n^(-1/3) = 0.1 -> width ~0.1
    assert freedman_diaconis_bins(values) == 10
    assert freedman_diaconis_bins(values, max_bins=4) == 4
    assert freedman_diaconis_bins([3.0] * 50) == 1
    assert freedman_diaconis_bins([1.0]) == 1


def test_histogram_counts_everything():
    values = [1, 1, 2, 3, 3, 3, 10]
    edges, counts = histogram(values, 3)
    assert len(edges) == 4 and edges[0] == 1 and edges[-1] == 10
    assert counts == [6, 0, 1]
    assert sum(histogram([5.0] * 7, 4)[1]) == 7


# -- layout ----------------------------------------------------------------------------------------------------

def _spec():
    return PlotSpec(series=[Series("a", [(0, 0), (5, 50), (10, 100)], line=True),
                            Series("b", [(2, 80)], role="point", labels=["hot"])],
                    title="Demo", x_label="x units", y_label="y units")


def test_layout_has_title_ticks_labels_and_legend():
    grid = layout_plot(_spec(), 60, 16)
    text = grid.text()
    rows = grid.text_rows()
    assert len(rows) == 16 and all(len(r) == 60 for r in rows)
    assert rows[0].startswith("Demo") and "⣿ a" in rows[0] and "⣿ b" in rows[0]
    assert "y units" in text and "x units" in text and "hot" in text
    tick_row = rows[grid.plot_top + grid.plot_height + 1]
    assert tick_row.split() == [str(i) for i in range(11)]
    assert [r.split("┤")[0].strip() for r in rows if "┤" in r] == ["100", "80", "60", "40", "20", "0"]
    assert grid.roles[grid.plot_top + grid.plot_height][grid.plot_left] == "axis"
    # the series-0 line ends at its last point, drawn in its default role
    col, row = grid.cell_of(10, 100)
    assert grid.roles[row][col] == "series-0"


def test_layout_point_cells_and_selection():
    spec = _spec()
    grid = layout_plot(spec, 60, 16)
    col, row = grid.cell_of(2, 80)
    assert grid.roles[row][col] == "point"
    spec.selected = (1, 0)
    selected = layout_plot(spec, 60, 16)
    assert selected.roles[row][col] == "selected" and selected.chars[row][col] == "⣿"
    assert any(selected.roles[r][c] == "selected" and selected.chars[r][c] == "h"
               for r in range(16) for c in range(60))


def test_bars_fill_from_the_bottom():
    spec = PlotSpec(bars=[Bar(0, 1, 10), Bar(1, 2, 5)], x_range=(0, 2), y_range=(0, 10))
    grid = layout_plot(spec, 30, 10)
    bottom = grid.plot_top + grid.plot_height - 1
    left_col = grid.cell_of(0.25, 0)[0]
    right_col = grid.cell_of(1.75, 0)[0]
    assert grid.roles[bottom][left_col] == "series-0" and grid.roles[grid.plot_top][left_col] == "series-0"
    assert grid.roles[bottom][right_col] == "series-0" and grid.roles[grid.plot_top][right_col] is None


def test_message_and_no_data():
    grid = layout_plot(PlotSpec(message="no data: nothing ran"), 40, 5)
    assert grid.text_rows()[2].strip() == "no data: nothing ran"
    assert "no data" in layout_plot(PlotSpec(), 40, 5).text()


@pytest.mark.parametrize(("w", "h"), [(0, 0), (1, 1), (5, 2), (10, 3), (16, 5), (40, 12), (150, 40)])
def test_layout_any_size_has_exact_dimensions(w, h):
    grid = layout_plot(_spec(), w, h)
    assert len(grid.text_rows()) == h
    assert all(len(r) == w for r in grid.text_rows())


def test_optional_rows_are_dropped_when_short():
    grid = layout_plot(_spec(), 60, 8)
    assert grid.plot_height >= 3
    assert "Demo" in grid.text()  # the title is dropped last


def test_plot_canvas_does_not_import_textual():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('pc', {str(REPO / 'magpie_tui/widgets/plot_canvas.py')!r})\n"
            "mod = importlib.util.module_from_spec(spec); sys.modules['pc'] = mod; spec.loader.exec_module(mod)\n"
            "assert 'textual' not in sys.modules, 'plot_canvas imported textual'\n")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

"""Braille plotting primitives and plot layout, with no Textual import.

Everything here is pure: a :class:`BrailleCanvas` of 2x4 dots per terminal cell, an :class:`Axis` that maps
data to pixels (linear or log10) and picks "nice" ticks, a few statistics helpers for histograms, and
:func:`layout_plot`, which turns a :class:`PlotSpec` into a :class:`PlotGrid` of characters and *roles*.
A role is a short name (``"axis"``, ``"memory-bound"``, ``"series-2"``, ...) that the Textual widgets in
``plots.py`` map to the component class ``plot--<role>``; no colour is decided here.

Coordinates: pixels and cells both count from the top-left corner; ``x`` grows to the right and ``y`` grows
downwards. A y axis is therefore built with ``invert=True`` so that larger values sit higher up.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

Formatter = Callable[[float], str]

# -- braille ---------------------------------------------------------------------------------------------------

BRAILLE_BLANK = 0x2800
#: bit for the dot at (dx, dy) inside a cell is ``DOT_BITS[dy][dx]`` (Unicode dots 1-8).
DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
FULL_MASK = 0xFF


def braille_char(mask: int) -> str:
    """The braille character whose raised dots are the bits of ``mask`` (0 gives U+2800, 0xFF gives ``⣿``)."""
    return chr(BRAILLE_BLANK + (mask & 0xFF))


def dot_mask(dots: Iterable[tuple[int, int]]) -> int:
    """Bit mask of the dots ``(dx, dy)`` inside one cell (``dx`` in 0..1, ``dy`` in 0..3)."""
    mask = 0
    for dx, dy in dots:
        if not (0 <= dx < 2 and 0 <= dy < 4):
            raise ValueError(f"dot ({dx}, {dy}) is outside a 2x4 braille cell")
        mask |= DOT_BITS[dy][dx]
    return mask


def bresenham(x0: int, y0: int, x1: int, y1: int) -> list[tuple[int, int]]:
    """Integer pixels of the line from ``(x0, y0)`` to ``(x1, y1)``, both endpoints included, in order."""
    x0, y0, x1, y1 = int(x0), int(y0), int(x1), int(y1)
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx = 1 if x0 < x1 else -1
    sy = 1 if y0 < y1 else -1
    err = dx + dy
    out = []
    while True:
        out.append((x0, y0))
        if x0 == x1 and y0 == y1:
            return out
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            x0 += sx
        if e2 <= dx:
            err += dx
            y0 += sy


def clip_segment(x0: float, y0: float, x1: float, y1: float,
                 xmin: float, ymin: float, xmax: float, ymax: float) -> tuple[float, float, float, float] | None:
    """Liang-Barsky clipping of a segment to a rectangle; ``None`` when nothing of it is inside."""
    dx, dy = x1 - x0, y1 - y0
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, x0 - xmin), (dx, xmax - x0), (-dy, y0 - ymin), (dy, ymax - y0)):
        if p == 0:
            if q < 0:
                return None
            continue
        t = q / p
        if p < 0:
            if t > t1:
                return None
            t0 = max(t0, t)
        else:
            if t < t0:
                return None
            t1 = min(t1, t)
    return x0 + t0 * dx, y0 + t0 * dy, x0 + t1 * dx, y0 + t1 * dy


class BrailleCanvas:
    """A grid of ``width_cells`` x ``height_cells`` braille cells, i.e. ``2*width`` x ``4*height`` dots.

    Every cell also remembers a *series* (any hashable, usually a role name): the series of the last dot set
    in it wins. Dots outside the canvas are ignored, so callers may draw without clipping.
    """

    def __init__(self, width_cells: int, height_cells: int) -> None:
        self.width = max(0, int(width_cells))
        self.height = max(0, int(height_cells))
        self._mask = [[0] * self.width for _ in range(self.height)]
        self._series: list[list[object]] = [[None] * self.width for _ in range(self.height)]

    @property
    def width_px(self) -> int:
        return self.width * 2

    @property
    def height_px(self) -> int:
        return self.height * 4

    def in_bounds(self, x: int, y: int) -> bool:
        return 0 <= x < self.width_px and 0 <= y < self.height_px

    def set(self, x: int, y: int, series: object = None) -> bool:
        """Raise the dot at pixel ``(x, y)``; returns whether it was on the canvas."""
        x, y = int(x), int(y)
        if not self.in_bounds(x, y):
            return False
        col, dx = divmod(x, 2)
        row, dy = divmod(y, 4)
        self._mask[row][col] |= DOT_BITS[dy][dx]
        self._series[row][col] = series
        return True

    def get(self, x: int, y: int) -> bool:
        """Whether the dot at pixel ``(x, y)`` is raised."""
        if not self.in_bounds(int(x), int(y)):
            return False
        col, dx = divmod(int(x), 2)
        row, dy = divmod(int(y), 4)
        return bool(self._mask[row][col] & DOT_BITS[dy][dx])

    def line(self, x0: float, y0: float, x1: float, y1: float, series: object = None) -> int:
        """Bresenham line between two pixel positions (floats are rounded after clipping to the canvas).

        Returns the number of dots set.
        """
        if not all(math.isfinite(v) for v in (x0, y0, x1, y1)) or not self.width or not self.height:
            return 0
        clipped = clip_segment(x0, y0, x1, y1, 0, 0, self.width_px - 1, self.height_px - 1)
        if clipped is None:
            return 0
        ax, ay, bx, by = (round(v) for v in clipped)
        return sum(self.set(x, y, series) for x, y in bresenham(ax, ay, bx, by))

    def polyline(self, points: Sequence[tuple[float, float]], series: object = None) -> int:
        return sum(self.line(*a, *b, series=series) for a, b in itertools.pairwise(points))

    def vline(self, x: float, y0: float, y1: float, series: object = None, *, dotted: bool = False) -> int:
        """Vertical line at pixel column ``x``; ``dotted`` raises every other dot."""
        if not all(math.isfinite(v) for v in (x, y0, y1)):
            return 0
        x = round(x)
        lo = max(0, round(min(y0, y1)))
        hi = min(self.height_px - 1, round(max(y0, y1)))
        step = 2 if dotted else 1
        return sum(self.set(x, y, series) for y in range(lo, hi + 1, step))

    def block(self, x: float, y: float, series: object = None) -> int:
        """A 2x2-dot marker with its top-left dot at ``(x, y)`` (kept on the canvas at the edges)."""
        if not (math.isfinite(x) and math.isfinite(y)):
            return 0
        x = min(max(round(x), 0), self.width_px - 2)
        y = min(max(round(y), 0), self.height_px - 2)
        return sum(self.set(x + dx, y + dy, series) for dx in (0, 1) for dy in (0, 1))

    def blocks(self, positions: Iterable[tuple[float, float]], series: object = None) -> None:
        """:meth:`block` for many positions (the scatter hot path)."""
        wmax, hmax = self.width_px - 2, self.height_px - 2
        if wmax < 0 or hmax < 0:
            return
        masks, owners = self._mask, self._series
        for x, y in positions:
            if not (math.isfinite(x) and math.isfinite(y)):
                continue
            x = min(max(round(x), 0), wmax)
            y = min(max(round(y), 0), hmax)
            for yy in (y, y + 1):
                row, dy = divmod(yy, 4)
                bits = DOT_BITS[dy]
                for xx in (x, x + 1):
                    col, dx = divmod(xx, 2)
                    masks[row][col] |= bits[dx]
                    owners[row][col] = series

    def mask(self, col: int, row: int) -> int:
        return self._mask[row][col]

    def series_at(self, col: int, row: int) -> object:
        return self._series[row][col]

    def char(self, col: int, row: int) -> str:
        return braille_char(self._mask[row][col])

    def rows(self, blank: str | None = None) -> list[str]:
        """The canvas as text; empty cells become ``blank`` when given (else U+2800)."""
        out = []
        for row in self._mask:
            out.append("".join(blank if (blank is not None and not m) else braille_char(m) for m in row))
        return out

    def clear(self) -> None:
        for row in range(self.height):
            self._mask[row] = [0] * self.width
            self._series[row] = [None] * self.width


# -- numbers and ticks -----------------------------------------------------------------------------------------

_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _strip_zeros(text: str) -> str:
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _scientific(value: float, digits: int = 3) -> str:
    mantissa, exponent = f"{value:.{max(digits - 1, 0)}e}".split("e")
    return f"{_strip_zeros(mantissa)}e{int(exponent)}"


def format_si(value: float, digits: int = 3) -> str:
    """Short label: ``1k``, ``2.5M``, ``1G``, ``1T`` from 1000 up; ``10``, ``0.5`` in between; ``1e-2`` below 0.1."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    rounded = float(f"{value:.{digits}g}")
    a = abs(rounded)
    if a >= 1e21:
        return _scientific(value, digits)
    for scale, suffix in _SI:
        if a >= scale:
            return _strip_zeros(f"{rounded / scale:.{digits}g}") + suffix
    if a >= 0.1:
        return _strip_zeros(f"{rounded:.{digits}g}")
    return _scientific(value, digits)


def _decimals_for(step: float) -> int | None:
    """Smallest number of decimals that writes ``step`` exactly (None when more than 6 are needed)."""
    for d in range(7):
        if abs(round(step, d) - step) <= abs(step) * 1e-9:
            return d
    return None


def format_tick(value: float, step: float | None = None) -> str:
    """Label for a linear tick: SI prefixes, with as many decimals as the tick step needs (``1.5k``, ``0.25``)."""
    if step is None or not math.isfinite(step) or step <= 0 or not math.isfinite(value):
        return format_si(value)
    if abs(value) < step * 1e-6:
        return "0"
    scale, suffix = 1.0, ""
    a = max(abs(value), step)
    for s, p in _SI:
        if a >= s * (1 - 1e-9):
            scale, suffix = s, p
            break
    if scale == 1.0 and step < 1e-4:
        return format_si(value)
    decimals = _decimals_for(step / scale)
    if decimals is None:
        return format_si(value)
    return _strip_zeros(f"{value / scale:.{decimals}f}") + suffix


def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is at least ``raw``."""
    if not math.isfinite(raw) or raw <= 0:
        return 1.0
    exponent = math.floor(math.log10(raw))
    base = 10.0 ** exponent
    for m in (1, 2, 5, 10):
        if m * base >= raw * (1 - 1e-9):
            return m * base
    return 10 * base  # pragma: no cover - the loop always returns


def _next_nice(step: float) -> float:
    exponent = math.floor(math.log10(step) + 1e-9)
    m = round(step / 10.0 ** exponent)
    return {1: 2, 2: 5}.get(m, 10) * 10.0 ** exponent


def _clean(value: float, step: float) -> float:
    digits = max(0, -math.floor(math.log10(step))) + 3
    value = round(value, digits)
    return 0.0 if value == 0 else value


def linear_ticks(lo: float, hi: float, max_ticks: int = 6, *, integer: bool = False) -> list[float]:
    """At most ``max_ticks`` (at least 2 allowed) multiples of a 1/2/5 x 10^k step inside ``[lo, hi]``."""
    max_ticks = max(2, int(max_ticks))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [lo]
    # the densest 1/2/5 step that gives at most max_ticks ticks
    step = nice_step((hi - lo) / (2 * max_ticks))
    if integer:
        step = max(step, 1.0)
    while True:
        k0 = math.ceil(lo / step - 1e-9)
        k1 = math.floor(hi / step + 1e-9)
        if k1 - k0 + 1 <= max_ticks:
            break
        step = _next_nice(step)
    return [_clean(k * step, step) for k in range(k0, k1 + 1)]


def linear_step(ticks: Sequence[float]) -> float | None:
    return ticks[1] - ticks[0] if len(ticks) >= 2 else None


def log_ticks(lo: float, hi: float, max_ticks: int = 6) -> list[float]:
    """Powers of ten inside ``[lo, hi]`` (every n-th decade when there are too many); 1/2/5 steps inside a decade."""
    max_ticks = max(2, int(max_ticks))
    if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    e_lo = math.ceil(math.log10(lo) - 1e-9)
    e_hi = math.floor(math.log10(hi) + 1e-9)
    decades = list(range(e_lo, e_hi + 1))
    if len(decades) >= 2:
        stride = max(1, math.ceil(len(decades) / max_ticks))
        while True:
            picked = [e for e in decades if e % stride == 0]
            if len(picked) >= 2 or stride == 1:
                break
            stride -= 1
        return [10.0 ** e for e in picked]
    candidates = sorted(
        float(f"{m}e{e}") for e in range(e_lo - 1, e_hi + 2) for m in (1, 2, 5)
        if lo * (1 - 1e-9) <= float(f"{m}e{e}") <= hi * (1 + 1e-9)
    )
    if 2 <= len(candidates) <= max_ticks:
        return candidates
    if len(candidates) > max_ticks:
        stride = math.ceil(len(candidates) / max_ticks)
        return candidates[::stride]
    return [t for t in linear_ticks(lo, hi, max_ticks) if t > 0]


# -- axis ------------------------------------------------------------------------------------------------------

def data_range(values: Iterable[float], *, log: bool = False, pad: float = 0.05) -> tuple[float, float] | None:
    """``(lo, hi)`` covering the finite values (positive ones on a log axis), widened by ``pad`` of the span."""
    vals = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    if log:
        tlo, thi = math.log10(lo), math.log10(hi)
        if thi - tlo < 1e-12:
            tlo, thi = tlo - 0.5, thi + 0.5
        span = thi - tlo
        return 10.0 ** (tlo - pad * span), 10.0 ** (thi + pad * span)
    if hi - lo <= abs(hi) * 1e-12:
        d = abs(lo) * 0.1 or 1.0
        return lo - d, hi + d
    span = hi - lo
    return lo - pad * span, hi + pad * span


class Axis:
    """Maps data values in ``[lo, hi]`` to ``pixels`` pixel positions, linearly or in log10.

    ``to_pixel(lo)`` is 0 and ``to_pixel(hi)`` is ``pixels - 1`` (swapped when ``invert``, as for a y axis).
    """

    def __init__(self, lo: float, hi: float, pixels: int, *, log: bool = False, invert: bool = False,
                 label: str = "", formatter: Formatter | None = None, integer: bool = False) -> None:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"axis range must be finite, got ({lo}, {hi})")
        if log and (lo <= 0 or hi <= 0):
            raise ValueError(f"a log axis needs a positive range, got ({lo}, {hi})")
        if hi < lo:
            lo, hi = hi, lo
        if hi == lo:
            if log:
                lo, hi = lo / math.sqrt(10), hi * math.sqrt(10)
            else:
                d = abs(lo) * 0.1 or 1.0
                lo, hi = lo - d, hi + d
        self.lo, self.hi = float(lo), float(hi)
        self.pixels = max(1, int(pixels))
        self.log = log
        self.invert = invert
        self.label = label
        self.formatter = formatter
        self.integer = integer
        self._t_lo = self.transform(self.lo)
        self._t_span = self.transform(self.hi) - self._t_lo

    def transform(self, value: float) -> float:
        if self.log:
            return math.log10(value) if value > 0 else -math.inf
        return value

    def to_pixel(self, value: float) -> float:
        """Continuous pixel position (may fall outside ``[0, pixels-1]`` for values outside the range)."""
        f = (self.transform(value) - self._t_lo) / self._t_span
        p = f * (self.pixels - 1)
        return (self.pixels - 1) - p if self.invert else p

    def pixel(self, value: float) -> int | None:
        """Nearest pixel, or ``None`` when the value is off the axis (or not positive on a log axis)."""
        if not math.isfinite(value) or (self.log and value <= 0):
            return None
        p = round(self.to_pixel(value))
        return p if 0 <= p < self.pixels else None

    def from_pixel(self, pixel: float) -> float:
        """Inverse of :meth:`to_pixel`."""
        p = (self.pixels - 1) - pixel if self.invert else pixel
        f = p / (self.pixels - 1) if self.pixels > 1 else 0.0
        t = self._t_lo + f * self._t_span
        return 10.0 ** t if self.log else t

    def contains(self, value: float) -> bool:
        if not math.isfinite(value) or (self.log and value <= 0):
            return False
        return self.lo * (1 - 1e-12) <= value <= self.hi * (1 + 1e-12) if self.lo > 0 else self.lo <= value <= self.hi

    def ticks(self, max_ticks: int = 6) -> list[float]:
        if self.log:
            return log_ticks(self.lo, self.hi, max_ticks)
        return linear_ticks(self.lo, self.hi, max_ticks, integer=self.integer)

    def format(self, value: float, step: float | None = None) -> str:
        if self.formatter is not None:
            return self.formatter(value)
        if self.log:
            return format_si(value)
        return format_tick(value, step)

    def tick_labels(self, max_ticks: int = 6) -> list[tuple[float, str]]:
        ticks = self.ticks(max_ticks)
        step = None if self.log else linear_step(ticks)
        return [(t, self.format(t, step)) for t in ticks]

    def label_text(self, *, show_scale: bool = False) -> str:
        """The axis title; with ``show_scale``, ``" (log)"`` is appended on a log axis."""
        if show_scale and self.log:
            return f"{self.label} (log)" if self.label else "(log)"
        return self.label


# -- statistics for histograms ---------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (NumPy's default), ``q`` in 0..100."""
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        raise ValueError("percentile of no values")
    q = min(max(q, 0.0), 100.0)
    pos = (len(vals) - 1) * q / 100.0
    i = math.floor(pos)
    j = min(i + 1, len(vals) - 1)
    return vals[i] + (vals[j] - vals[i]) * (pos - i)


def freedman_diaconis_bins(values: Sequence[float], max_bins: int = 60) -> int:
    """Bin count from the Freedman-Diaconis width ``2 IQR n^(-1/3)``, capped to ``1..max_bins``.

    Falls back to Sturges' rule when the IQR is zero.
    """
    vals = [v for v in values if math.isfinite(v)]
    max_bins = max(1, int(max_bins))
    if len(vals) < 2:
        return 1
    lo, hi = min(vals), max(vals)
    if hi == lo:
        return 1
    iqr = percentile(vals, 75) - percentile(vals, 25)
    if iqr > 0:
        width = 2 * iqr * len(vals) ** (-1 / 3)
        bins = math.ceil((hi - lo) / width)
    else:
        bins = math.ceil(math.log2(len(vals))) + 1
    return max(1, min(max_bins, bins))


def histogram(values: Sequence[float], bins: int) -> tuple[list[float], list[int]]:
    """Equal-width ``bins`` over the data range: ``(edges, counts)``; the last bin includes its right edge."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return [], []
    bins = max(1, int(bins))
    lo, hi = min(vals), max(vals)
    if hi == lo:
        d = abs(lo) * 0.05 or 0.5
        lo, hi = lo - d, hi + d
    width = (hi - lo) / bins
    edges = [lo + i * width for i in range(bins)] + [hi]
    counts = [0] * bins
    for v in vals:
        i = min(int((v - lo) / width), bins - 1)
        counts[i] += 1
    return edges, counts


# -- plot description ------------------------------------------------------------------------------------------

@dataclass
class Series:
    """Points (and/or a polyline through them) drawn in one role.

    ``role`` names the style (``plot--<role>``); left empty, series ``i`` gets ``series-<i % 4>``.
    ``labels`` (one per point, empty strings allowed) are written next to the points when there is room.
    """

    name: str
    points: Sequence[tuple[float, float]] = ()
    role: str = ""
    line: bool = False
    markers: bool = True
    labels: Sequence[str] | None = None
    legend: bool = True


@dataclass
class Bar:
    """A filled bar from the bottom of the plot up to ``y``, spanning ``x0..x1``."""

    x0: float
    x1: float
    y: float
    role: str = "series-0"


@dataclass
class VMarker:
    """A vertical line at ``x`` from the bottom up to ``y_top`` (the top of the plot when None)."""

    x: float
    role: str = "axis"
    label: str = ""
    y_top: float | None = None
    dotted: bool = False


@dataclass
class Annotation:
    """Text near the data point ``(x, y)``; dropped when no free cells are found next to it."""

    x: float
    y: float
    text: str
    role: str = "label"
    prefer: str = "right"  # "right", "left", "above", "above-left" (right-aligned, ending at the point)


@dataclass
class PlotSpec:
    series: Sequence[Series] = ()
    title: str = ""
    x_label: str = ""
    y_label: str = ""
    log_x: bool = False
    log_y: bool = False
    x_range: tuple[float, float] | None = None
    y_range: tuple[float, float] | None = None
    x_formatter: Formatter | None = None
    y_formatter: Formatter | None = None
    x_integer: bool = False
    y_integer: bool = False
    x_extent: Sequence[float] = ()
    y_extent: Sequence[float] = ()
    bars: Sequence[Bar] = ()
    vmarkers: Sequence[VMarker] = ()
    annotations: Sequence[Annotation] = ()
    selected: tuple[int, int] | None = None
    selected_label: str | None = None
    legend: bool = True
    legend_extra: Sequence[tuple[str, str]] = ()
    message: str | None = None
    pad: float = 0.05


# -- layout ----------------------------------------------------------------------------------------------------

LEGEND_MARK = "⣿"
SELECTED_CHAR = braille_char(FULL_MASK)
MIN_PLOT_WIDTH = 4
MIN_PLOT_HEIGHT = 2


@dataclass
class PlotGrid:
    """A laid-out plot: ``chars[row][col]`` and ``roles[row][col]`` (None for unstyled blanks)."""

    width: int
    height: int
    chars: list[list[str]] = field(default_factory=list)
    roles: list[list[str | None]] = field(default_factory=list)
    plot_left: int = 0
    plot_top: int = 0
    plot_width: int = 0
    plot_height: int = 0
    x_axis: Axis | None = None
    y_axis: Axis | None = None
    message: str | None = None
    #: where each point label was written: ``(series, point) -> (col, row, length)``
    point_labels: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)
    #: the highlighted cell after :func:`apply_selection`
    selected_cell: tuple[int, int] | None = None

    def copy(self) -> PlotGrid:
        return PlotGrid(self.width, self.height, [list(r) for r in self.chars], [list(r) for r in self.roles],
                        self.plot_left, self.plot_top, self.plot_width, self.plot_height, self.x_axis,
                        self.y_axis, self.message, dict(self.point_labels), self.selected_cell)

    @classmethod
    def blank(cls, width: int, height: int) -> PlotGrid:
        width, height = max(0, width), max(0, height)
        return cls(width, height, [[" "] * width for _ in range(height)], [[None] * width for _ in range(height)])

    def put(self, col: int, row: int, char: str, role: str | None) -> None:
        if 0 <= col < self.width and 0 <= row < self.height:
            self.chars[row][col] = char
            self.roles[row][col] = role

    def put_text(self, col: int, row: int, text: str, role: str | None) -> None:
        for i, ch in enumerate(text):
            self.put(col + i, row, ch, role)

    def is_free(self, col: int, row: int, length: int) -> bool:
        """Whether ``length`` cells from ``(col, row)`` are blank and inside the plot area."""
        if row < self.plot_top or row >= self.plot_top + self.plot_height:
            return False
        if col < self.plot_left or col + length > self.plot_left + self.plot_width:
            return False
        return all(self.chars[row][c] == " " for c in range(col, col + length))

    def text_rows(self) -> list[str]:
        return ["".join(row) for row in self.chars]

    def text(self) -> str:
        return "\n".join(self.text_rows())

    def runs(self, row: int) -> list[tuple[str, str | None]]:
        """Row ``row`` as ``(text, role)`` runs of equal role."""
        out: list[tuple[str, str | None]] = []
        chars, roles = self.chars[row], self.roles[row]
        start = 0
        for col in range(1, self.width + 1):
            if col == self.width or roles[col] != roles[start]:
                out.append(("".join(chars[start:col]), roles[start]))
                start = col
        return out

    def cells_with_role(self, role: str) -> list[tuple[int, int]]:
        """``(col, row)`` of every cell drawn in ``role``."""
        return [(c, r) for r in range(self.height) for c in range(self.width) if self.roles[r][c] == role]

    def cell_of(self, x: float, y: float) -> tuple[int, int] | None:
        """Grid ``(col, row)`` of the data point ``(x, y)``, or None when it is off the plot."""
        if self.x_axis is None or self.y_axis is None:
            return None
        px, py = self.x_axis.pixel(x), self.y_axis.pixel(y)
        if px is None or py is None:
            return None
        return self.plot_left + px // 2, self.plot_top + py // 4


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"[: max(0, width)]


def _message_grid(width: int, height: int, message: str) -> PlotGrid:
    grid = PlotGrid.blank(width, height)
    grid.message = message
    if width <= 0 or height <= 0:
        return grid
    text = _truncate(message, width)
    grid.put_text(max(0, (width - len(text)) // 2), height // 2, text, "label")
    return grid


def no_data_message(reason: str | None = None) -> str:
    return f"no data: {reason}" if reason else "no data"


def _legend_items(spec: PlotSpec) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    if spec.legend:
        for i, s in enumerate(spec.series):
            if s.legend and s.name and (s.points or s.line):
                items.append((s.name, s.role or f"series-{i % 4}"))
        items.extend(spec.legend_extra)
    seen: set[tuple[str, str]] = set()
    return [it for it in items if not (it in seen or seen.add(it))]


def _legend_width(items: Sequence[tuple[str, str]]) -> int:
    return sum(len(name) + 2 for name, _ in items) + max(0, len(items) - 1) * 2


def _fit_legend(items: Sequence[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    out = list(items)
    while out and _legend_width(out) > width:
        out.pop()
    return out


def _draw_legend(grid: PlotGrid, row: int, items: Sequence[tuple[str, str]], right: int) -> None:
    col = right - _legend_width(items)
    for name, role in items:
        grid.put(col, row, LEGEND_MARK, role)
        grid.put_text(col + 2, row, name, "label")
        col += len(name) + 4


def _y_ticks(axis: Axis, plot_top: int, plot_height: int) -> list[tuple[int, str]]:
    best: list[tuple[int, str]] = []
    for max_ticks in range(min(8, max(2, plot_height // 2 + 1)), 1, -1):
        placed = []
        rows_seen: set[int] = set()
        ok = True
        for value, label in axis.tick_labels(max_ticks):
            p = axis.pixel(value)
            if p is None:
                continue
            row = plot_top + p // 4
            if row in rows_seen:
                ok = False
                break
            rows_seen.add(row)
            placed.append((row, label))
        if ok:
            return placed
        best = best or placed
    return best


def _x_ticks(axis: Axis, plot_left: int, plot_width: int, width: int) -> list[tuple[int, int, str]]:
    """``(tick column, label column, label)`` for the largest tick count whose labels do not collide."""
    fallback: list[tuple[int, int, str]] = []
    for max_ticks in range(min(12, max(2, plot_width // 4)), 1, -1):
        placed = []
        end = -2
        ok = True
        for value, label in axis.tick_labels(max_ticks):
            p = axis.pixel(value)
            if p is None:
                continue
            col = plot_left + p // 2
            start = min(max(0, col - (len(label) - 1) // 2), max(0, width - len(label)))
            if start <= end + 1:
                ok = False
                continue
            placed.append((col, start, label))
            end = start + len(label) - 1
        if ok:
            return placed
        if len(placed) > len(fallback):
            fallback = placed
    return fallback


def _place_annotation(grid: PlotGrid, col: int, row: int, text: str, role: str, prefer: str = "right",
                      force: bool = False) -> tuple[int, int] | None:
    """Write ``text`` next to cell ``(col, row)`` on free plot cells (``force`` writes it over data when no
    free place is found); returns where it starts, or None."""
    n = len(text)
    candidates = {
        "right": [(col + 1, row), (col - n, row), (col + 1, row - 1), (col - n, row - 1), (col + 1, row + 1)],
        "left": [(col - n, row), (col + 1, row), (col - n, row - 1), (col + 1, row - 1)],
        "above": [(col - n // 2, row - 1), (col + 1, row - 1), (col - n, row - 1), (col + 1, row)],
        "above-left": [(col - n + 1, row - 1), (col - n, row), (col - n + 1, row + 1)],
    }.get(prefer, [(col + 1, row)])
    for c, r in candidates:
        if grid.is_free(c, r, n):
            grid.put_text(c, r, text, role)
            return c, r
    if force:
        lo, hi = grid.plot_left, grid.plot_left + grid.plot_width - n
        c = min(max(col + 1, lo), max(lo, hi))
        r = row if grid.plot_top <= row < grid.plot_top + grid.plot_height else grid.plot_top
        grid.put_text(c, r, text[: grid.plot_width], role)
        return c, r
    return None


def layout_plot(spec: PlotSpec, width: int, height: int) -> PlotGrid:
    """Lay out ``spec`` in ``width`` x ``height`` cells: title and legend, y label, braille plot area with axes
    and tick labels, x label. Optional rows are dropped, in the order legend row, x label, y label, title,
    while the plot area would be smaller than about half of the height.

    The same as :func:`layout_base` followed by :func:`apply_selection`; callers that move a selection often
    keep the base grid and only re-apply the selection.
    """
    return apply_selection(layout_base(spec, width, height), spec)


def apply_selection(base: PlotGrid, spec: PlotSpec) -> PlotGrid:
    """A copy of ``base`` with ``spec.selected`` drawn as a full cell in role ``selected`` and its label
    (``spec.selected_label``, else the point's own label) in the same role, over the data if need be."""
    if spec.selected is None or base.x_axis is None:
        return base
    si, pi = spec.selected
    if not (0 <= si < len(spec.series) and 0 <= pi < len(spec.series[si].points)):
        return base
    cell = base.cell_of(*spec.series[si].points[pi])
    if cell is None:
        return base
    grid = base.copy()
    grid.selected_cell = cell
    grid.put(*cell, SELECTED_CHAR, "selected")
    labels = spec.series[si].labels
    own = labels[pi] if labels and pi < len(labels) else ""
    text = own if spec.selected_label is None else spec.selected_label
    placed = grid.point_labels.get((si, pi))
    if placed is not None and text == own:  # already written next to the point: restyle it
        col, row, n = placed
        for c in range(col, col + n):
            grid.roles[row][c] = "selected"
    elif text:
        _place_annotation(grid, *cell, text, "selected", "right", force=True)
    return grid


class _Unplottable(Exception):
    """Raised by a layout step when no plot fits or the data cannot be drawn; the message replaces the plot."""


@dataclass
class _Rows:
    """The row plan of a plot: which row each optional line of text went to (None when it was dropped), the
    plot area's rows, and where the legend is drawn (``"title"``, ``"ylabel"``, ``"row"`` or None)."""

    title: int | None
    legend: int | None
    ylabel: int | None
    plot_top: int
    plot_height: int
    xlabel: int | None
    legend_on: str | None


def layout_base(spec: PlotSpec, width: int, height: int) -> PlotGrid:
    """:func:`layout_plot` without the selection."""
    if width <= 0 or height <= 0:
        return PlotGrid.blank(width, height)
    if spec.message is not None:
        return _message_grid(width, height, spec.message)
    legend = _legend_items(spec)
    try:
        x_range, y_range = _data_ranges(spec)
        rows = _plan_rows(spec, legend, width, height)
        x_axis, y_axis, y_ticks, grid = _fit_axes(spec, x_range, y_range, rows, width, height)
    except _Unplottable as exc:
        return _message_grid(width, height, str(exc))
    _draw_axes(grid, x_axis, y_ticks)
    _blit(grid, _rasterize(spec, x_axis, y_axis, grid.plot_width, grid.plot_height))
    _draw_data_labels(grid, spec, y_axis)
    _draw_titles(grid, spec, rows, legend)
    return grid


def _data_ranges(spec: PlotSpec) -> tuple[tuple[float, float], tuple[float, float]]:
    """The x and y ranges: ``spec.x_range``/``y_range``, else what the data, bars, markers and extents span."""
    xs: list[float] = list(spec.x_extent)
    ys: list[float] = list(spec.y_extent)
    for s in spec.series:
        for x, y in s.points:
            xs.append(x)
            ys.append(y)
    for b in spec.bars:
        xs += [b.x0, b.x1]
        ys.append(b.y)
    for m in spec.vmarkers:
        xs.append(m.x)
    x_range = spec.x_range or data_range(xs, log=spec.log_x, pad=spec.pad)
    y_range = spec.y_range or data_range(ys, log=spec.log_y, pad=spec.pad)
    if x_range is None or y_range is None:
        raise _Unplottable(no_data_message())
    return x_range, y_range


def _legend_position(spec: PlotSpec, legend: Sequence[tuple[str, str]], width: int) -> str | None:
    """Where the legend would go with every row kept: on the title row or the y label row when it fits
    there, else a row of its own; None without a legend."""
    if not legend:
        return None
    if spec.title and len(spec.title) + 2 + _legend_width(legend) <= width:
        return "title"
    if spec.y_label and len(spec.y_label) + 2 + _legend_width(legend) <= width:
        return "ylabel"
    return "row"


def _plan_rows(spec: PlotSpec, legend: Sequence[tuple[str, str]], width: int, height: int) -> _Rows:
    """Choose the rows: drop the optional ones (legend row, x label, y label, title, in that order) while the
    plot area would have fewer than about half of the rows, then number what is left from the top."""
    legend_on = _legend_position(spec, legend, width)
    want = {"title": bool(spec.title), "ylabel": bool(spec.y_label), "xlabel": bool(spec.x_label),
            "legend": legend_on == "row"}

    def plot_rows() -> int:
        return height - 2 - sum(want.values())

    min_rows = max(3, (height - 2) // 2)
    for key in ("legend", "xlabel", "ylabel", "title"):
        if plot_rows() >= min_rows:
            break
        want[key] = False
    if legend_on == "title" and not want["title"]:
        legend_on = "row" if want["legend"] else None
    if legend_on == "ylabel" and not want["ylabel"]:
        legend_on = None
    if legend_on == "row" and not want["legend"]:
        legend_on = None

    plot_h = plot_rows()
    if plot_h < MIN_PLOT_HEIGHT:
        raise _Unplottable("plot area too small")

    row = 0
    title_row = ylabel_row = legend_row = None
    if want["title"]:
        title_row, row = row, row + 1
    if want["legend"]:
        legend_row, row = row, row + 1
    if want["ylabel"]:
        ylabel_row, row = row, row + 1
    # below the plot area: the axis row, the tick label row, then the x label
    xlabel_row = row + plot_h + 2 if want["xlabel"] else None
    return _Rows(title=title_row, legend=legend_row, ylabel=ylabel_row, plot_top=row, plot_height=plot_h,
                 xlabel=xlabel_row, legend_on=legend_on)


def _fit_axes(spec: PlotSpec, x_range: tuple[float, float], y_range: tuple[float, float], rows: _Rows,
              width: int, height: int) -> tuple[Axis, Axis, list[tuple[int, str]], PlotGrid]:
    """Build the y axis and its ticks, whose widest label sets the left gutter and so the plot width, then the
    x axis; returns both axes, the y ticks and a blank grid that knows the plot area and the axes."""
    plot_top, plot_h = rows.plot_top, rows.plot_height
    try:
        y_axis = Axis(*y_range, plot_h * 4, log=spec.log_y, invert=True, label=spec.y_label,
                      formatter=spec.y_formatter, integer=spec.y_integer)
    except ValueError as exc:
        raise _Unplottable(no_data_message(str(exc))) from None
    y_ticks = _y_ticks(y_axis, plot_top, plot_h)
    gutter = max((len(label) for _, label in y_ticks), default=0) + 1
    plot_left = gutter
    plot_w = width - gutter - 1
    if plot_w < MIN_PLOT_WIDTH:
        raise _Unplottable("plot area too small")
    try:
        x_axis = Axis(*x_range, plot_w * 2, log=spec.log_x, label=spec.x_label,
                      formatter=spec.x_formatter, integer=spec.x_integer)
    except ValueError as exc:
        raise _Unplottable(no_data_message(str(exc))) from None

    grid = PlotGrid.blank(width, height)
    grid.plot_left, grid.plot_top, grid.plot_width, grid.plot_height = plot_left, plot_top, plot_w, plot_h
    grid.x_axis, grid.y_axis = x_axis, y_axis
    return x_axis, y_axis, y_ticks, grid


def _draw_axes(grid: PlotGrid, x_axis: Axis, y_ticks: Sequence[tuple[int, str]]) -> None:
    """The y axis line left of the plot area and the x axis line below it, with their ticks and tick labels."""
    plot_left, plot_top, plot_w = grid.plot_left, grid.plot_top, grid.plot_width
    axis_col = plot_left - 1
    axis_row = plot_top + grid.plot_height
    tick_row = axis_row + 1
    for r in range(plot_top, axis_row):
        grid.put(axis_col, r, "│", "axis")
    grid.put(axis_col, axis_row, "└", "axis")
    for c in range(plot_left, plot_left + plot_w):
        grid.put(c, axis_row, "─", "axis")
    for r, label in y_ticks:
        grid.put(axis_col, r, "┤", "axis")
        grid.put_text(axis_col - len(label), r, label, "axis")
    for col, start, label in _x_ticks(x_axis, plot_left, plot_w, grid.width):
        grid.put(col, axis_row, "┴" if col == axis_col else "┬", "axis")
        grid.put_text(start, tick_row, label, "axis")


def _to_pixels(axis: Axis, log: bool) -> Callable[[float], float]:
    """``axis.to_pixel`` that gives NaN for values it cannot place (not finite, or not positive on a log axis)."""

    def to_pixel(v: float) -> float:
        return axis.to_pixel(v) if (v > 0 or not log) and math.isfinite(v) else math.nan

    return to_pixel


def _rasterize(spec: PlotSpec, x_axis: Axis, y_axis: Axis, plot_w: int, plot_h: int) -> BrailleCanvas:
    """Draw the data on a braille canvas of the plot area, later layers over earlier ones: bars, series lines,
    vertical markers, then series markers."""
    canvas = BrailleCanvas(plot_w, plot_h)
    px, py = _to_pixels(x_axis, spec.log_x), _to_pixels(y_axis, spec.log_y)
    _rasterize_bars(canvas, spec, px, py, y_axis.lo if not spec.log_y else 0)
    for i, s in enumerate(spec.series):
        role = s.role or f"series-{i % 4}"
        pixels = [(px(x), py(y)) for x, y in s.points]
        if s.line:
            canvas.polyline(pixels, role)
    bottom_px = canvas.height_px - 1
    for m in spec.vmarkers:
        x = px(m.x)
        if not math.isfinite(x) or not (-0.5 <= x <= canvas.width_px - 0.5):
            continue
        top = 0.0 if m.y_top is None else py(m.y_top)
        if math.isfinite(top):
            canvas.vline(x, top, bottom_px, m.role, dotted=m.dotted)
    for i, s in enumerate(spec.series):
        if s.markers:
            canvas.blocks([(px(x) - 0.5, py(y) - 0.5) for x, y in s.points if x_axis.contains(x)
                           and y_axis.contains(y)], s.role or f"series-{i % 4}")
    return canvas


def _rasterize_bars(canvas: BrailleCanvas, spec: PlotSpec, px: Callable[[float], float],
                    py: Callable[[float], float], floor: float) -> None:
    """Each bar as columns of dots from its top down to the bottom of the plot area, skipping bars that do
    not rise above ``floor``; a gap of one dot separates neighbouring bars at least 3 dots wide."""
    bottom_px = canvas.height_px - 1
    for bar in spec.bars:
        x0, x1, top = px(bar.x0), px(bar.x1), py(bar.y)
        if not all(math.isfinite(v) for v in (x0, x1, top)) or bar.y <= floor:
            continue
        a, b = round(min(x0, x1)), round(max(x0, x1))
        if b - a >= 3:
            b -= 1  # one dot of gap between neighbouring bars
        top = min(round(top), bottom_px)
        for x in range(max(a, 0), min(b, canvas.width_px - 1) + 1):
            canvas.vline(x, top, bottom_px, bar.role)


def _blit(grid: PlotGrid, canvas: BrailleCanvas) -> None:
    """Copy the canvas's non-blank cells into the plot area, each in the role of the series that drew it."""
    for r in range(grid.plot_height):
        for c in range(grid.plot_width):
            mask = canvas.mask(c, r)
            if mask:
                grid.put(grid.plot_left + c, grid.plot_top + r, braille_char(mask), str(canvas.series_at(c, r)))


def _draw_data_labels(grid: PlotGrid, spec: PlotSpec, y_axis: Axis) -> None:
    """Text on top of the data: vertical marker labels, point labels (recorded in ``grid.point_labels``),
    then annotations."""
    for m in spec.vmarkers:
        if m.label:
            col = grid.cell_of(m.x, y_axis.hi if m.y_top is None else m.y_top)
            if col is not None:
                _place_annotation(grid, col[0], col[1] if m.y_top is not None else grid.plot_top, m.label, m.role)
    for i, s in enumerate(spec.series):
        if not s.labels:
            continue
        for j, ((x, y), text) in enumerate(zip(s.points, s.labels)):
            cell = grid.cell_of(x, y)
            if text and cell is not None:
                at = _place_annotation(grid, *cell, text, "label")
                if at is not None:
                    grid.point_labels[(i, j)] = (*at, len(text))
    for a in spec.annotations:
        cell = grid.cell_of(a.x, a.y)
        if cell is not None and a.text:
            _place_annotation(grid, *cell, a.text, a.role, a.prefer)


def _draw_titles(grid: PlotGrid, spec: PlotSpec, rows: _Rows, legend: Sequence[tuple[str, str]]) -> None:
    """The title, y label and x label on the rows the plan kept, and the legend where the plan put it."""
    width = grid.width
    if rows.title is not None:
        grid.put_text(0, rows.title, _truncate(spec.title, width), "title")
    if rows.ylabel is not None:
        grid.put_text(0, rows.ylabel, _truncate(spec.y_label, width), "label")
    if rows.xlabel is not None:
        text = _truncate(spec.x_label, width)
        start = grid.plot_left + max(0, (grid.plot_width - len(text)) // 2)
        grid.put_text(min(start, width - len(text)), rows.xlabel, text, "label")
    if rows.legend_on == "title" and rows.title is not None:
        _draw_legend(grid, rows.title, _fit_legend(legend, width - len(spec.title) - 2), width)
    elif rows.legend_on == "ylabel" and rows.ylabel is not None:
        _draw_legend(grid, rows.ylabel, _fit_legend(legend, width - len(spec.y_label) - 2), width)
    elif rows.legend_on == "row" and rows.legend is not None:
        _draw_legend(grid, rows.legend, _fit_legend(legend, width), width)


"""Terminal plots for GPU performance data, drawn with braille dots (2x4 per cell).

The layout (axes, ticks, legend, dots) is computed by the Textual-free :mod:`plot_canvas`; the widgets here
turn its roles into styles through component classes (``plot--axis``, ``plot--memory-bound``, ...) whose
colours come only from theme variables in ``DEFAULT_CSS``. Layouts are cached per size and rebuilt when the
data, the selection or the size changes; styled lines are rebuilt when the theme or CSS changes.

- :class:`ScatterLinePlot`: generic series of points and/or polylines, optional log axes, a selected point.
- :class:`RooflinePlot`: log-log roofline with compute ceilings, bandwidth slope, ridge and kernels by bound.
- :class:`Histogram`: latency distribution with percentile markers.
- :class:`LinePlot`: throughput/latency sweeps, one labelled point per sweep value.
- :class:`CapacityPlot`: the levels an SLO capacity search tried, latency against throughput, passed
  and failed levels told apart by their labels (``✓``/``✗``) as well as colour, the SLO limit and the knee.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.theme import Theme
from textual.widget import Widget

from magpie_tui.widgets.plot_canvas import (
    Annotation,
    Bar,
    Formatter,
    PlotGrid,
    PlotSpec,
    Series,
    VMarker,
    apply_selection,
    data_range,
    format_si,
    freedman_diaconis_bins,
    histogram,
    layout_base,
    layout_plot,
    no_data_message,
    percentile,
)

__all__ = [
    "PLOT_COMPONENT_CLASSES",
    "CapacityPlot",
    "CapacityPoint",
    "Histogram",
    "LinePlot",
    "PlotBase",
    "RooflinePlot",
    "RooflinePoint",
    "ScatterLinePlot",
    "Series",
]

#: roles drawn by the layout -> component class ``plot--<role>``
PLOT_ROLES = ("axis", "label", "title", "point", "ceiling", "selected", "memory-bound", "compute-bound",
              "passed", "failed", "series-0", "series-1", "series-2", "series-3")
PLOT_COMPONENT_CLASSES = frozenset(f"plot--{role}" for role in PLOT_ROLES)


class PlotBase(Widget):
    """Base for the braille plots: caches the layout per size and renders it line by line.

    Subclasses implement :meth:`build_spec` and call :meth:`invalidate` when their data changes.
    """

    DEFAULT_CSS = """
    PlotBase {
        width: 1fr;
        height: 1fr;
        min-height: 4;
        & > .plot--axis { color: $muted; }
        & > .plot--label { color: $foreground; }
        & > .plot--title { color: $foreground; text-style: bold; }
        & > .plot--point { color: $plot-point; }
        & > .plot--ceiling { color: $plot-ceiling; }
        & > .plot--selected { color: $plot-selected; text-style: bold; }
        & > .plot--memory-bound { color: $memory-bound; }
        & > .plot--compute-bound { color: $compute-bound; }
        & > .plot--passed { color: $correct; }
        & > .plot--failed { color: $incorrect; text-style: bold; }
        & > .plot--series-0 { color: $primary; }
        & > .plot--series-1 { color: $accent; }
        & > .plot--series-2 { color: $success; }
        & > .plot--series-3 { color: $error; }
    }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = set(PLOT_COMPONENT_CLASSES)

    def __init__(self, *, title: str = "", x_label: str = "", y_label: str = "", reason: str | None = None,
                 name: str | None = None, id: str | None = None, classes: str | None = None,
                 disabled: bool = False) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self._title = title
        self._x_label = x_label
        self._y_label = y_label
        self._reason = reason
        self._spec: PlotSpec | None = None
        self._base: PlotGrid | None = None
        self._grid: PlotGrid | None = None
        self._strips: dict[int, Strip] = {}

    # -- labels ------------------------------------------------------------------------------------------------

    @property
    def title(self) -> str:
        return self._title

    @title.setter
    def title(self, value: str) -> None:
        self._title = value
        self.invalidate()

    @property
    def x_label(self) -> str:
        return self._x_label

    @x_label.setter
    def x_label(self, value: str) -> None:
        self._x_label = value
        self.invalidate()

    @property
    def y_label(self) -> str:
        return self._y_label

    @y_label.setter
    def y_label(self, value: str) -> None:
        self._y_label = value
        self.invalidate()

    @property
    def reason(self) -> str | None:
        """Why there is no data (shown as ``no data: <reason>``), or None."""
        return self._reason

    # -- layout ------------------------------------------------------------------------------------------------

    def build_spec(self, width: int, height: int) -> PlotSpec:
        """What to draw at this size, without the selection (subclasses)."""
        raise NotImplementedError

    def selection(self, spec: PlotSpec) -> tuple[tuple[int, int] | None, str | None]:
        """``((series, point), label)`` of the highlighted point in ``spec``; ``label`` None means the
        point's own label. The base class has no selection."""
        return None, None

    def _with_selection(self, spec: PlotSpec) -> PlotSpec:
        selected, label = self.selection(spec)
        return replace(spec, selected=selected, selected_label=label)

    def layout_for(self, width: int, height: int) -> PlotGrid:
        """Lay the plot out at any size, without caching (handy for tests and text export)."""
        return layout_plot(self._with_selection(self.build_spec(width, height)), width, height)

    @property
    def grid(self) -> PlotGrid:
        """The layout at the widget's current content size (the data layout is cached per size; moving the
        selection only redraws the highlight)."""
        width, height = self.size
        if self._base is None or self._spec is None or (self._base.width, self._base.height) != (width, height):
            self._spec = self.build_spec(width, height)
            self._base = layout_base(self._spec, width, height)
            self._grid = None
        if self._grid is None:
            self._grid = apply_selection(self._base, self._with_selection(self._spec))
            self._strips = {}
        return self._grid

    def plot_text(self) -> str:
        """The plot as plain text at the current size."""
        return self.grid.text()

    def invalidate(self) -> None:
        """Forget the layout and redraw (call after changing data)."""
        self._spec = self._base = self._grid = None
        self._strips = {}
        self.refresh()

    def invalidate_selection(self) -> None:
        """Redraw the highlight only (call after changing the selection)."""
        self._grid = None
        self._strips = {}
        self.refresh()

    # -- rendering ---------------------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._on_theme_changed)

    def _on_theme_changed(self, theme: Theme) -> None:
        self._strips = {}
        self.refresh()

    def on_resize(self) -> None:
        self._spec = self._base = self._grid = None
        self._strips = {}

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = {}

    def _role_style(self, role: str | None) -> Style:
        if role is None:
            return self.rich_style
        name = f"plot--{role}"
        if name not in PLOT_COMPONENT_CLASSES:
            name = "plot--point"
        return self.get_component_rich_style(name)

    def render_line(self, y: int) -> Strip:
        grid = self.grid
        if not 0 <= y < grid.height:
            return Strip.blank(self.size.width, self.rich_style)
        strip = self._strips.get(y)
        if strip is None:
            strip = Strip([Segment(text, self._role_style(role)) for text, role in grid.runs(y)], grid.width)
            self._strips[y] = strip
        return strip


def _series_role(index: int, series: Series) -> str:
    return series.role or f"series-{index % 4}"


class ScatterLinePlot(PlotBase):
    """Generic plot of :class:`Series` (points and/or polylines) with optional log axes.

    ``select(series_index, point_index)`` highlights one point in the ``plot--selected`` style and writes its
    label (from ``Series.labels``) next to it.
    """

    def __init__(self, series: Iterable[Series] = (), *, title: str = "", x_label: str = "", y_label: str = "",
                 log_x: bool = False, log_y: bool = False, x_range: tuple[float, float] | None = None,
                 y_range: tuple[float, float] | None = None, x_formatter: Formatter | None = None,
                 y_formatter: Formatter | None = None, legend: bool = True, reason: str | None = None,
                 name: str | None = None, id: str | None = None, classes: str | None = None,
                 disabled: bool = False) -> None:
        super().__init__(title=title, x_label=x_label, y_label=y_label, reason=reason, name=name, id=id,
                         classes=classes, disabled=disabled)
        self._series: list[Series] = list(series)
        self.log_x = log_x
        self.log_y = log_y
        self.x_range = x_range
        self.y_range = y_range
        self.x_formatter = x_formatter
        self.y_formatter = y_formatter
        self.legend = legend
        self._selected: tuple[int, int] | None = None

    @property
    def series(self) -> tuple[Series, ...]:
        return tuple(self._series)

    @property
    def selected(self) -> tuple[int, int] | None:
        """``(series_index, point_index)`` of the highlighted point, or None."""
        return self._selected

    def set_series(self, series: Iterable[Series], *, reason: str | None = None) -> None:
        """Replace all series; ``reason`` explains an empty plot. A selection that no longer exists is dropped."""
        self._series = list(series)
        self._reason = reason
        if self._selected is not None and not self._valid(*self._selected):
            self._selected = None
        self.invalidate()

    def set_scale(self, *, log_x: bool | None = None, log_y: bool | None = None) -> None:
        if log_x is not None:
            self.log_x = log_x
        if log_y is not None:
            self.log_y = log_y
        self.invalidate()

    def _valid(self, series_index: int, point_index: int) -> bool:
        return 0 <= series_index < len(self._series) and 0 <= point_index < len(self._series[series_index].points)

    def select(self, series_index: int | None, point_index: int = 0) -> bool:
        """Highlight a point (``None`` clears); returns whether that point exists."""
        if series_index is None:
            self.clear_selection()
            return False
        found = self._valid(series_index, point_index)
        new = (series_index, point_index) if found else None
        if new != self._selected:
            self._selected = new
            self.invalidate_selection()
        return found

    def clear_selection(self) -> None:
        if self._selected is not None:
            self._selected = None
            self.invalidate_selection()

    def selection(self, spec: PlotSpec) -> tuple[tuple[int, int] | None, str | None]:
        if self._selected is None:
            return None, None
        si, pi = self._selected
        kept = [i for i, s in enumerate(self._series) if s.points]
        return ((kept.index(si), pi) if si in kept else None), None

    def build_spec(self, width: int, height: int) -> PlotSpec:
        series = [s for s in self._series if s.points]
        if not series:
            return PlotSpec(message=no_data_message(self._reason))
        # keep each series' default role stable when empty ones are dropped
        roled = [Series(s.name, s.points, _series_role(i, s), s.line, s.markers, s.labels, s.legend)
                 for i, s in enumerate(self._series) if s.points]
        spec = PlotSpec(series=roled, title=self.title, x_label=self.x_label, y_label=self.y_label,
                        log_x=self.log_x, log_y=self.log_y, x_range=self.x_range, y_range=self.y_range,
                        x_formatter=self.x_formatter, y_formatter=self.y_formatter, legend=self.legend)
        for log, values in ((self.log_x, [x for s in series for x, _ in s.points]),
                            (self.log_y, [y for s in series for _, y in s.points])):
            if log and data_range(values, log=True) is None:
                return PlotSpec(message=no_data_message(self._reason or "no positive values on the log axis"))
        return spec


class LinePlot(ScatterLinePlot):
    """Sweeps: x = throughput (tok/s), y = latency (ms), a labelled point per sweep value joined by a line.

    ``points`` are ``(throughput, latency, label)`` such as ``(1520.0, 43.1, "c=4")``, in sweep order.
    """

    def __init__(self, points: Iterable[tuple[float, float, str]] = (), *, series_name: str = "sweep",
                 title: str = "", x_label: str = "throughput (tok/s)", y_label: str = "latency (ms)",
                 log_x: bool = False, log_y: bool = False, reason: str | None = None, name: str | None = None,
                 id: str | None = None, classes: str | None = None, disabled: bool = False) -> None:
        super().__init__(title=title, x_label=x_label, y_label=y_label, log_x=log_x, log_y=log_y, reason=reason,
                         name=name, id=id, classes=classes, disabled=disabled)
        self._series = self._to_series({series_name: list(points)})

    @staticmethod
    def _to_series(sweeps: Mapping[str, Iterable[tuple[float, float, str]]]) -> list[Series]:
        out = []
        for name, pts in sweeps.items():
            rows = [(float(p[0]), float(p[1]), str(p[2]) if len(p) > 2 else "") for p in pts]
            rows = [r for r in rows if math.isfinite(r[0]) and math.isfinite(r[1])]
            out.append(Series(name, [(x, y) for x, y, _ in rows], line=True, markers=True,
                              labels=[label for _, _, label in rows]))
        return out

    def set_points(self, points: Iterable[tuple[float, float, str]], *, series_name: str = "sweep",
                   reason: str | None = None) -> None:
        """One sweep: ``(throughput, latency, label)`` per sweep value."""
        self.set_series(self._to_series({series_name: list(points)}), reason=reason)

    def set_sweeps(self, sweeps: Mapping[str, Iterable[tuple[float, float, str]]], *,
                   reason: str | None = None) -> None:
        """Several sweeps to compare (colours ``plot--series-0`` ... ``-3`` in order)."""
        self.set_series(self._to_series(sweeps), reason=reason)


class CapacityPoint(NamedTuple):
    """One level a capacity search tried: its throughput (x), latency (y), label and outcome."""

    throughput: float
    latency: float
    label: str
    passed: bool


class CapacityPlot(ScatterLinePlot):
    """Latency against throughput for each level an SLO capacity search tried, joined in level order.

    Passed levels are labelled ``✓`` and failed ones ``✗`` (readable without colour), in the
    ``plot--passed`` / ``plot--failed`` styles; ``slo`` draws the limit as a level line and ``knee``
    (the throughput of the highest passing level) as a dotted vertical marker.
    """

    def __init__(self, points: Iterable[CapacityPoint] = (), *, slo: float | None = None, slo_label: str = "SLO",
                 knee: float | None = None, knee_label: str = "knee", title: str = "", x_label: str = "",
                 y_label: str = "", reason: str | None = None, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(title=title, x_label=x_label, y_label=y_label, reason=reason, name=name, id=id,
                         classes=classes)
        self.set_levels(points, slo=slo, slo_label=slo_label, knee=knee, knee_label=knee_label, reason=reason)

    def set_levels(self, points: Iterable[CapacityPoint], *, slo: float | None = None, slo_label: str = "SLO",
                   knee: float | None = None, knee_label: str = "knee", reason: str | None = None) -> None:
        pts = [p for p in points if math.isfinite(p.throughput) and math.isfinite(p.latency)]
        self.points = pts
        self.slo, self.knee, self.knee_label = slo, knee, knee_label
        passed = [p for p in pts if p.passed]
        failed = [p for p in pts if not p.passed]
        series = [
            Series("levels", [(p.throughput, p.latency) for p in pts], role="axis", line=True, markers=False,
                   legend=False),
            Series("passed ✓", [(p.throughput, p.latency) for p in passed], role="passed",
                   labels=[f"{p.label}✓" for p in passed]),
            Series("failed ✗", [(p.throughput, p.latency) for p in failed], role="failed",
                   labels=[f"{p.label}✗" for p in failed]),
        ]
        if slo is not None and pts:
            xs = [p.throughput for p in pts]
            series.append(Series(slo_label, [(min(xs), slo), (max(xs), slo)], role="ceiling", line=True,
                                 markers=False))
        self.set_series(series, reason=reason)

    def build_spec(self, width: int, height: int) -> PlotSpec:
        spec = super().build_spec(width, height)
        if spec.message:
            return spec
        spec = replace(spec, y_extent=(0.0,))  # latency from 0: the SLO line's height reads true
        if self.knee is None:
            return spec
        return replace(spec, vmarkers=[VMarker(self.knee, role="selected", label=self.knee_label, dotted=True)])


class RooflinePoint(NamedTuple):
    """One kernel on the roofline: arithmetic intensity (FLOP/byte), achieved FLOP/s, label, bound."""

    ai: float
    flops: float
    label: str = ""
    bound: str = ""


MEMORY_BOUND = "MEMORY_BOUND"
COMPUTE_BOUND = "COMPUTE_BOUND"
_BOUND_ROLES = {MEMORY_BOUND: "memory-bound", COMPUTE_BOUND: "compute-bound"}
_BOUND_NAMES = {"memory-bound": "memory", "compute-bound": "compute", "point": "other"}


def _as_point(p: Any) -> RooflinePoint:
    if isinstance(p, RooflinePoint):
        return p
    if isinstance(p, Mapping):
        ai = p.get("ai", p.get("arithmetic_intensity"))
        flops = p.get("flops", p.get("achieved_flops"))
        return RooflinePoint(_num(ai), _num(flops), str(p.get("label", p.get("name", "")) or ""),
                             str(p.get("bound", "") or ""))
    items = list(p)
    return RooflinePoint(_num(items[0]), _num(items[1]), str(items[2]) if len(items) > 2 else "",
                         str(items[3] or "") if len(items) > 3 else "")


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _normalise_bound(bound: str) -> str:
    b = bound.strip().upper().replace("-", "_").replace(" ", "_")
    if b in ("MEMORY", "MEM", "MEMORY_BOUND", "BANDWIDTH_BOUND"):
        return MEMORY_BOUND
    if b in ("COMPUTE", "COMPUTE_BOUND", "MATH_BOUND"):
        return COMPUTE_BOUND
    return ""


def _classify(point: RooflinePoint, ridge: float | None) -> str:
    bound = _normalise_bound(point.bound)
    if bound or ridge is None:
        return bound
    return MEMORY_BOUND if point.ai < ridge else COMPUTE_BOUND


def _positive(named: float | Mapping[str, float] | None, default_name: str) -> dict[str, float]:
    if named is None:
        return {}
    items = named.items() if isinstance(named, Mapping) else [(default_name, named)]
    return {str(k): float(v) for k, v in items if _num(v) > 0 and math.isfinite(_num(v))}


_UNSET: Any = object()


class RooflinePlot(PlotBase):
    """Log-log roofline.

    ``peak_compute`` is FLOP/s, one number or ``{"matrix_bf16": 989e12, "vector_fp32": 67e12}``;
    ``peak_bandwidth`` is bytes/s, one number or ``{"HBM": 3.35e12}``. ``points`` are :class:`RooflinePoint`,
    tuples ``(ai, flops, label, bound)`` or mappings with those keys; a point with non-positive (or missing)
    intensity or FLOP/s is skipped and counted in :attr:`skipped`. A point without a bound is classified
    against the highest ridge.
    """

    def __init__(self, peak_compute: float | Mapping[str, float] | None = None,
                 peak_bandwidth: float | Mapping[str, float] | None = None, points: Iterable[Any] = (), *,
                 title: str = "Roofline", x_label: str = "arithmetic intensity (FLOP/byte)",
                 y_label: str = "FLOP/s", x_range: tuple[float, float] | None = None,
                 y_range: tuple[float, float] | None = None, reason: str | None = None, name: str | None = None,
                 id: str | None = None, classes: str | None = None, disabled: bool = False) -> None:
        super().__init__(title=title, x_label=x_label, y_label=y_label, reason=reason, name=name, id=id,
                         classes=classes, disabled=disabled)
        self.x_range = x_range
        self.y_range = y_range
        self._ceilings: dict[str, float] = {}
        self._bandwidths: dict[str, float] = {}
        self._points: list[RooflinePoint] = []
        self._valid: list[bool] = []
        self._selected: int | None = None
        self._where: dict[int, tuple[int, int]] = {}  # point index -> (series, position) in the last spec
        self._apply(peak_compute, peak_bandwidth, points)

    # -- data --------------------------------------------------------------------------------------------------

    def _apply(self, peak_compute: Any, peak_bandwidth: Any, points: Any) -> None:
        if peak_compute is not _UNSET:
            self._ceilings = _positive(peak_compute, "peak")
        if peak_bandwidth is not _UNSET:
            self._bandwidths = _positive(peak_bandwidth, "")
        if points is not _UNSET:
            self._points = [_as_point(p) for p in points]
            self._valid = [math.isfinite(p.ai) and math.isfinite(p.flops) and p.ai > 0 and p.flops > 0
                           for p in self._points]
            self._selected = None

    def set_roofline(self, peak_compute: float | Mapping[str, float] | None = _UNSET,
                     peak_bandwidth: float | Mapping[str, float] | None = _UNSET, points: Iterable[Any] = _UNSET,
                     *, reason: str | None = None) -> None:
        """Replace any of the ceilings and points (arguments left out keep their value); clears the selection
        when points are given."""
        self._apply(peak_compute, peak_bandwidth, points)
        self._reason = reason
        self.invalidate()

    def set_points(self, points: Iterable[Any], *, reason: str | None = None) -> None:
        self.set_roofline(points=points, reason=reason)

    @property
    def points(self) -> tuple[RooflinePoint, ...]:
        """All points as given (skipped ones included, so indices match the caller's rows)."""
        return tuple(self._points)

    @property
    def skipped(self) -> int:
        """How many points were left out for a non-positive or missing intensity or FLOP/s."""
        return self._valid.count(False)

    @property
    def ceilings(self) -> dict[str, float]:
        return dict(self._ceilings)

    @property
    def bandwidths(self) -> dict[str, float]:
        return dict(self._bandwidths)

    @property
    def ridge(self) -> float | None:
        """Arithmetic intensity where the highest bandwidth meets the highest compute ceiling."""
        if not self._ceilings or not self._bandwidths:
            return None
        return max(self._ceilings.values()) / max(self._bandwidths.values())

    def bound_of(self, index: int) -> str:
        """``MEMORY_BOUND`` / ``COMPUTE_BOUND`` as given, else from the ridge; ``""`` when unknown."""
        if not self._valid[index]:
            return _normalise_bound(self._points[index].bound)
        return _classify(self._points[index], self.ridge)

    # -- selection ---------------------------------------------------------------------------------------------

    @property
    def selected(self) -> int | None:
        """Index (into :attr:`points`) of the highlighted point, or None."""
        return self._selected

    def select(self, label_or_index: str | int | None) -> bool:
        """Highlight a point by index or by label (first match); None clears. Returns whether a drawable
        point was selected (a skipped point cannot be)."""
        index: int | None = None
        if isinstance(label_or_index, str):
            index = next((i for i, p in enumerate(self._points) if p.label == label_or_index), None)
        elif label_or_index is not None:
            i = int(label_or_index)
            if -len(self._points) <= i < len(self._points):
                index = i % len(self._points)
        if index is not None and not self._valid[index]:
            index = None
        if index != self._selected:
            self._selected = index
            self.invalidate_selection()
        return index is not None

    def clear_selection(self) -> None:
        self.select(None)

    # -- layout ------------------------------------------------------------------------------------------------

    def build_spec(self, width: int, height: int) -> PlotSpec:
        valid = [(i, p) for i, p in enumerate(self._points) if self._valid[i]]
        title = self.title + (f" ({self.skipped} skipped)" if self.skipped else "")
        if not valid and not (self._ceilings or self._bandwidths):
            reason = self._reason
            if reason is None and self.skipped:
                reason = f"{self.skipped} point(s) with non-positive intensity or FLOP/s"
            return PlotSpec(message=no_data_message(reason))
        p_max = max(self._ceilings.values(), default=None)
        b_max = max(self._bandwidths.values(), default=None)
        ridge = self.ridge

        # x range: the points and a couple of decades either side of the ridge
        xs = [p.ai for _, p in valid]
        if ridge is not None:
            xs += [ridge / 30, ridge * 10]
        elif not xs:
            xs = [0.1, 1000.0]
        x_range = self.x_range or data_range(xs, log=True, pad=0.04)
        assert x_range is not None
        x_lo, x_hi = x_range

        ys = [p.flops for _, p in valid]
        if p_max is not None:
            ys += [p_max * 2.5]  # headroom for the ceiling labels
            ys.append(p_max / 100)
        if b_max is not None and p_max is None:
            ys += [b_max * x_lo, b_max * x_hi]
        y_range = self.y_range or data_range(ys, log=True, pad=0.03)
        if y_range is None:
            return PlotSpec(message=no_data_message(self._reason))

        series: list[Series] = []
        annotations: list[Annotation] = []
        vmarkers: list[VMarker] = []
        for name, bw in sorted(self._bandwidths.items(), key=lambda kv: kv[1]):
            end = (p_max / bw) if p_max is not None else x_hi
            series.append(Series(name, [(x_lo, bw * x_lo), (end, bw * end)], role="ceiling", line=True,
                                 markers=False, legend=False))
            # label the slope where it is on screen: half way (in log space) along its visible part
            start = max(x_lo, y_range[0] / bw)
            if start < min(end, x_hi):
                mid = math.sqrt(start * min(end, x_hi))
                annotations.append(Annotation(mid, bw * mid, f"{name} {format_si(bw)}B/s".strip(), "ceiling",
                                              "left"))
        for name, peak in sorted(self._ceilings.items(), key=lambda kv: -kv[1]):
            start = (peak / b_max) if b_max is not None else x_lo
            series.append(Series(name, [(start, peak), (x_hi, peak)], role="ceiling", line=True, markers=False,
                                 legend=False))
            annotations.append(Annotation(x_hi, peak, f"{name} {format_si(peak)}FLOP/s", "ceiling", "above-left"))
        if ridge is not None and p_max is not None:
            vmarkers.append(VMarker(ridge, "ceiling", y_top=p_max, dotted=True))

        groups: dict[str, list[int]] = {"memory-bound": [], "compute-bound": [], "point": []}
        for i, p in valid:
            groups[_BOUND_ROLES.get(_classify(p, ridge), "point")].append(i)
        self._where = {}
        for role, indices in groups.items():
            if not indices:
                continue
            self._where.update((i, (len(series), k)) for k, i in enumerate(indices))
            # point labels are not drawn (too many); the selected point's label is, by apply_selection
            series.append(Series(_BOUND_NAMES[role], [(self._points[i].ai, self._points[i].flops) for i in indices],
                                 role=role))
        spec = PlotSpec(series=series, title=title, x_label=self.x_label,
                        y_label=self.y_label, log_x=True, log_y=True, x_range=(x_lo, x_hi), y_range=y_range,
                        vmarkers=vmarkers, annotations=annotations,
                        legend_extra=[("roof", "ceiling")] if (self._ceilings or self._bandwidths) else [])
        if not valid:
            spec.title = title + " · " + no_data_message(self._reason or "no kernels")
        return spec

    def selection(self, spec: PlotSpec) -> tuple[tuple[int, int] | None, str | None]:
        if self._selected is None:
            return None, None
        return self._where.get(self._selected), self._points[self._selected].label


# percentile markers: p50 green, p90 orange, p99 red in the default themes (see DEFAULT_CSS)
_PERCENTILE_ROLES = ("series-2", "series-1", "series-3")


class Histogram(PlotBase):
    """Latency distribution (values in ms) with Freedman-Diaconis bins (capped by ``max_bins`` and by the
    width) and vertical markers at the ``percentiles`` (default p50, p90, p99)."""

    def __init__(self, values: Iterable[float] = (), *, title: str = "Latency", x_label: str = "latency (ms)",
                 y_label: str = "count", percentiles: Sequence[float] = (50, 90, 99), max_bins: int = 60,
                 unit: str = "ms", reason: str | None = None, name: str | None = None, id: str | None = None,
                 classes: str | None = None, disabled: bool = False) -> None:
        super().__init__(title=title, x_label=x_label, y_label=y_label, reason=reason, name=name, id=id,
                         classes=classes, disabled=disabled)
        self.percentiles = tuple(percentiles)
        self.max_bins = max(1, int(max_bins))
        self.unit = unit
        self._values: list[float] = []
        self._set(values)

    def _set(self, values: Iterable[float]) -> None:
        self._values = [v for v in (_num(v) for v in values) if math.isfinite(v)]

    def set_values(self, values: Iterable[float], *, reason: str | None = None) -> None:
        self._set(values)
        self._reason = reason
        self.invalidate()

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(self._values)

    @property
    def percentile_values(self) -> dict[float, float]:
        """``{50: p50, 90: p90, 99: p99}`` of the values (empty without data)."""
        if not self._values:
            return {}
        return {q: percentile(self._values, q) for q in self.percentiles}

    def bins_for_width(self, width: int) -> tuple[list[float], list[int]]:
        """``(edges, counts)`` used at a widget width of ``width`` cells (at least one cell per bin)."""
        cap = min(self.max_bins, max(1, width - 8))
        return histogram(self._values, freedman_diaconis_bins(self._values, cap))

    def build_spec(self, width: int, height: int) -> PlotSpec:
        if not self._values:
            return PlotSpec(message=no_data_message(self._reason))
        edges, counts = self.bins_for_width(width)
        bars = [Bar(edges[i], edges[i + 1], counts[i], "series-0") for i in range(len(counts)) if counts[i]]
        vmarkers = []
        legend = []
        for k, (q, value) in enumerate(self.percentile_values.items()):
            role = _PERCENTILE_ROLES[k % len(_PERCENTILE_ROLES)]
            name = f"p{q:g}"
            vmarkers.append(VMarker(value, role, label=name))
            legend.append((f"{name} {format_si(value)}{self.unit}", role))
        return PlotSpec(title=self.title, x_label=self.x_label, y_label=self.y_label, bars=bars,
                        x_range=(edges[0], edges[-1]), y_range=(0, max(counts) * 1.05), y_integer=True,
                        vmarkers=vmarkers, legend_extra=legend)

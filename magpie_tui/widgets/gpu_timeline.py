"""``GpuTimeline``: the GPU's time as lanes, one per device stream, kernels as bars and idle gaps
marked (``!`` where the gap analysis says the GPU waited on the host), with zoom and pan.

The lanes come from the profiler trace the run analysed when it is still on disk
(``lanes_from_trace``: every kernel and memcpy on its stream); otherwise from the gap analysis
alone (``lanes_from_gaps``: the device's recorded idle gaps, and the time between them as busy),
and the widget says which. One character cell covers ``(end - start) / width`` microseconds; a
cell shows what covers most of it, so a short kernel in a long cell is not lost: any kernel in a
cell beats idle time.

Keys: ``+``/``-`` zoom around the middle, ``left``/``right`` pan by a quarter view, ``0`` the
whole trace.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

__all__ = ["GpuTimeline", "Lane", "Span", "lanes_from_gaps", "lanes_from_trace"]

KINDS = ("kernel", "memcpy", "idle", "host")  # host: idle while the GPU waited on the host
_GLYPH = {"kernel": "█", "memcpy": "▓", "idle": "·", "host": "!", None: " "}
_RANK = {"kernel": 3, "memcpy": 2, "host": 1, "idle": 0}  # what a cell shows when several meet
_LABEL_WIDTH = 14


@dataclass(frozen=True, slots=True)
class Span:
    start_us: float
    end_us: float
    kind: str
    name: str = ""


@dataclass(slots=True)
class Lane:
    name: str
    spans: list[Span] = field(default_factory=list)

    def busy_us(self) -> float:
        return sum(s.end_us - s.start_us for s in self.spans if s.kind in ("kernel", "memcpy"))


def lanes_from_trace(path: Path) -> list[Lane]:
    """Kernel and memcpy events of a Chrome/PyTorch trace (``.json`` or ``.json.gz``), one lane
    per (device, stream), in time order. Blocking (reads the file): call it from a thread."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    lanes: dict[tuple[Any, Any], Lane] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        args = ev.get("args") or {}
        device, stream = args.get("device", ev.get("pid")), args.get("stream", ev.get("tid"))
        try:
            start, dur = float(ev["ts"]), float(ev.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError):
            continue
        lane = lanes.setdefault((device, stream), Lane(f"gpu{device} s{stream}"))
        lane.spans.append(Span(start, start + dur, "kernel" if ev["cat"] == "kernel" else "memcpy", str(ev.get("name"))))
    for lane in lanes.values():
        lane.spans.sort(key=lambda s: s.start_us)
    return [lanes[k] for k in sorted(lanes, key=lambda k: (str(k[0]), str(k[1])))]


def lanes_from_gaps(rows: Iterable[dict[str, Any]]) -> list[Lane]:
    """One lane per ``where`` of the gap analysis's idle gaps (``start_us``/``end_us``), the time
    between two gaps drawn as busy: all that is known without the trace."""
    by_where: dict[str, list[tuple[float, float, bool]]] = {}
    for row in rows:
        try:
            start, end = float(row["start_us"]), float(row["end_us"])
        except (KeyError, TypeError, ValueError):
            continue
        host = str(row.get("gpu_waited_on_host", "")).lower() == "true"
        by_where.setdefault(str(row.get("where") or "gpu"), []).append((start, end, host))
    lanes = []
    for where, gaps in by_where.items():
        gaps.sort()
        lane = Lane(where.replace(" (all streams)", ""))
        for i, (start, end, host) in enumerate(gaps):
            lane.spans.append(Span(start, end, "host" if host else "idle", "idle gap"))
            if i + 1 < len(gaps) and gaps[i + 1][0] > end:
                lane.spans.append(Span(end, gaps[i + 1][0], "kernel", "busy (between recorded gaps)"))
        lane.spans.sort(key=lambda s: s.start_us)
        lanes.append(lane)
    return lanes


def mark_idle(lanes: list[Lane], gap_rows: Iterable[dict[str, Any]]) -> list[Lane]:
    """Trace lanes with the gap analysis's idle gaps laid under them (a kernel still wins its cell)."""
    gaps = lanes_from_gaps(gap_rows)
    idle = [s for lane in gaps for s in lane.spans if s.kind in ("idle", "host")]
    for lane in lanes:
        lane.spans = sorted(lane.spans + idle, key=lambda s: s.start_us)
    return lanes


def cells(lane: Lane, start: float, end: float, width: int) -> list[str | None]:
    """The kind shown in each of ``width`` cells covering [start, end)."""
    out: list[str | None] = [None] * width
    if width <= 0 or end <= start:
        return out
    per_cell = (end - start) / width
    for span in lane.spans:
        if span.end_us <= start or span.start_us >= end:
            continue
        first = max(0, int((span.start_us - start) / per_cell))
        last = min(width - 1, int((min(span.end_us, end) - start - 1e-9) / per_cell))
        for i in range(first, last + 1):
            if out[i] is None or _RANK[span.kind] > _RANK[out[i]]:
                out[i] = span.kind
    return out


def _ticks(start: float, end: float, width: int) -> str:
    """An axis line: a time label every ~16 cells (us, ms or s, whichever reads best)."""
    line = [" "] * width
    span = end - start
    unit, scale = ("s", 1e6) if span >= 5e6 else ("ms", 1e3) if span >= 5e3 else ("us", 1.0)
    for x in range(0, max(1, width - 6), 16):
        text = f"|{(start + span * x / width) / scale:.4g}{unit}"
        for i, ch in enumerate(text[: width - x]):
            line[x + i] = ch
    return "".join(line)


class GpuTimeline(Widget, can_focus=True):
    """Lanes of GPU activity over time; see the module docstring."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("plus,equals_sign", "zoom(0.5)", "Zoom in", id="timeline.zoom_in"),
        Binding("minus", "zoom(2.0)", "Zoom out", id="timeline.zoom_out"),
        Binding("left", "pan(-0.25)", "Pan left", show=False, id="timeline.pan_left"),
        Binding("right", "pan(0.25)", "Pan right", show=False, id="timeline.pan_right"),
        Binding("0", "reset_zoom", "Whole trace", show=False, id="timeline.reset"),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "gpu-timeline--label", "gpu-timeline--axis", "gpu-timeline--kernel", "gpu-timeline--memcpy",
        "gpu-timeline--idle", "gpu-timeline--host",
    }

    DEFAULT_CSS = """
    GpuTimeline {
        height: auto;
        background: $surface;
        & > .gpu-timeline--label { color: $foreground; text-style: bold; }
        & > .gpu-timeline--axis { color: $text-muted; }
        & > .gpu-timeline--kernel { color: $compute-bound; }
        & > .gpu-timeline--memcpy { color: $memory-bound; }
        & > .gpu-timeline--idle { color: $muted; }
        & > .gpu-timeline--host { color: $warning; text-style: bold; }
        &:focus { background-tint: $foreground 5%; }
    }
    """

    view = reactive((0.0, 0.0), layout=False)

    def __init__(self, lanes: list[Lane] | None = None, source: str = "", *, name: str | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.lanes: list[Lane] = []
        self.source = source
        self.extent = (0.0, 0.0)
        self.set_lanes(lanes or [], source)

    def set_lanes(self, lanes: list[Lane], source: str = "") -> None:
        self.lanes = [lane for lane in lanes if lane.spans]
        self.source = source
        spans = [s for lane in self.lanes for s in lane.spans]
        self.extent = (min(s.start_us for s in spans), max(s.end_us for s in spans)) if spans else (0.0, 0.0)
        self.view = self.extent
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 3 + max(1, len(self.lanes))

    # -- zoom and pan ---------------------------------------------------------------------------
    def action_zoom(self, factor: float) -> None:
        start, end = self.view
        middle, half = (start + end) / 2, (end - start) * factor / 2
        full = self.extent[1] - self.extent[0]
        half = min(max(half, 0.5), full / 2) if full > 0 else half  # not below a microsecond a view
        self._set_view(middle - half, middle + half)

    def action_pan(self, fraction: float) -> None:
        start, end = self.view
        shift = (end - start) * fraction
        self._set_view(start + shift, end + shift)

    def action_reset_zoom(self) -> None:
        self.view = self.extent
        self.refresh()

    def _set_view(self, start: float, end: float) -> None:
        lo, hi = self.extent
        width = end - start
        if start < lo:
            start, end = lo, lo + width
        if end > hi:
            start, end = max(lo, hi - width), hi
        self.view = (start, end)
        self.refresh()

    # -- drawing --------------------------------------------------------------------------------
    def _style(self, part: str) -> Style:
        return self.get_component_rich_style(f"gpu-timeline--{part}")

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        plot = max(1, width - _LABEL_WIDTH)
        start, end = self.view
        base = self.rich_style
        if not self.lanes:
            return Strip([Segment("no GPU activity to draw (no trace, no idle gaps)".ljust(width)[:width], base)])
        if y == 0:
            shown = (end - start) / max(1.0, self.extent[1] - self.extent[0]) * 100
            title = f"{self.source} · view {shown:.0f}% of {(self.extent[1] - self.extent[0]) / 1e3:.4g} ms · +/- zoom"
            return Strip([Segment(title[:width].ljust(width), self._style("axis"))])
        if y == 1:
            return Strip([Segment(" " * _LABEL_WIDTH, base), Segment(_ticks(start, end, plot), self._style("axis"))])
        if y == 2 + len(self.lanes):
            legend = "█ kernel  ▓ memcpy  · idle  ! idle, GPU waited on the host"
            return Strip([Segment(legend[:width].ljust(width), self._style("axis"))])
        index = y - 2
        if not 0 <= index < len(self.lanes):
            return Strip.blank(width, base)
        lane = self.lanes[index]
        segments = [Segment(lane.name[: _LABEL_WIDTH - 1].ljust(_LABEL_WIDTH), self._style("label"))]
        for kind in cells(lane, start, end, plot):
            segments.append(Segment(_GLYPH[kind], self._style(kind) if kind else base))
        return Strip(segments).simplify()

"""``GpuTimeline``: the GPU's time as lanes, one per device stream, kernels as bars and idle gaps
marked (``!`` where the gap analysis says the GPU waited on the host), with zoom and pan.

The lanes come from the profiler trace the run analysed when it is still on disk
(``lanes_from_trace``: every kernel and memcpy on its stream); otherwise from the gap analysis
alone (``lanes_from_gaps``: the device's recorded idle gaps, and the time between them as busy),
and the widget says which. One character cell covers ``(end - start) / width`` microseconds; a
cell shows what covers most of it, so a short kernel in a long cell is not lost: any kernel in a
cell beats idle time.

Per inference stage (``show_stage``): the trace's step annotations (vLLM, SGLang, ATOM; see
``engine.trace.steps``) say which steps are prefill, decode or mixed, and each kernel belongs to
the step whose host range launched it (by the launch's correlation id). The view then opens on
one step of that stage (the one TraceLens analysed when known), ``n``/``N`` step through the
stage's steps, and kernels of other stages are drawn ``░``. Without the trace, the gap analysis's
step table (``gpu_idle_steps_rank*.csv``) gives the steps, each running until the next starts.

Keys: ``+``/``-`` zoom around the middle, ``left``/``right`` pan by a quarter view, ``0`` the
whole trace, ``n``/``N`` the next / previous step of the stage shown.
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

__all__ = ["GpuTimeline", "Lane", "Span", "Step", "lanes_from_gaps", "lanes_from_trace", "steps_from_gap_rows",
           "timeline_from_trace"]

# host: idle while the GPU waited on the host; other: GPU work of another stage than the one shown
KINDS = ("kernel", "memcpy", "idle", "host", "other")
_GLYPH = {"kernel": "█", "memcpy": "▓", "idle": "·", "host": "!", "other": "░", None: " "}
_RANK = {"kernel": 3, "memcpy": 2, "other": 1.5, "host": 1, "idle": 0}  # what a cell shows when several meet
# Step kinds (engine.trace.steps) by the stage names the analysis uses.
STAGE_OF_KIND = {"prefill": "prefill_only", "decode": "decode_only", "prefilldecode": "prefilldecode"}
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime")
_LABEL_WIDTH = 14


@dataclass(frozen=True, slots=True)
class Span:
    start_us: float
    end_us: float
    kind: str
    name: str = ""
    stage: str | None = None  # the inference stage of the step that launched it, when known


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step: its annotation name, stage (None for a step of no known kind), and the
    window the view shows for it (its kernels' span, or until the next step starts)."""

    name: str
    stage: str | None
    start_us: float
    end_us: float
    index: int  # its place among all the trace's steps, in time order (TraceLens's iteration number)


@dataclass(slots=True)
class Lane:
    name: str
    spans: list[Span] = field(default_factory=list)

    def busy_us(self) -> float:
        return sum(s.end_us - s.start_us for s in self.spans if s.kind in ("kernel", "memcpy"))


def lanes_from_trace(path: Path) -> list[Lane]:
    """Kernel and memcpy events of a Chrome/PyTorch trace (``.json`` or ``.json.gz``), one lane
    per (device, stream), in time order. Blocking (reads the file): call it from a thread."""
    return timeline_from_trace(path)[0]


def _time(ev: dict) -> tuple[float, float] | None:
    try:
        start = float(ev["ts"])
        return start, start + float(ev.get("dur") or 0.0)
    except (KeyError, TypeError, ValueError):
        return None


def _step_annotations(events: list) -> list[tuple[float, float, str, str | None]]:
    """(start, end, name, stage) of the step annotations, in time order; when some carry the
    detailed attention aggregates, only those (as ``engine.trace.steps.find_steps``)."""
    from engine.jobs.query import parse_step_annotation
    found = []
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "X" and ev.get("cat") == "user_annotation":
            info = parse_step_annotation(str(ev.get("name", "")))
            span = _time(ev)
            if info is not None and span is not None:
                found.append((span[0], span[1], info.name, STAGE_OF_KIND.get(info.kind), info.detailed))
    if any(detailed for *_, detailed in found):
        found = [f for f in found if f[4]]
    found.sort()
    return [(start, end, name, stage) for start, end, name, stage, _ in found]


def timeline_from_trace(path: Path) -> tuple[list[Lane], list[Step]]:
    """(lanes, steps) of a trace: each kernel and memcpy tagged with the stage of the step whose
    host range launched it (the launch and the kernel share a correlation id). Blocking."""
    import bisect
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError("no traceEvents list")
    annotations = _step_annotations(events)
    starts = [a[0] for a in annotations]

    def step_of(ts: float) -> int | None:
        i = bisect.bisect_right(starts, ts) - 1
        return i if i >= 0 and ts <= annotations[i][1] else None

    launched_in: dict[Any, int | None] = {}  # correlation id -> index of the step that launched it
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "X" and ev.get("cat") in _RUNTIME_CATS:
            corr = (ev.get("args") or {}).get("correlation")
            span = _time(ev)
            if corr is not None and span is not None:
                launched_in[corr] = step_of(span[0])
    lanes: dict[tuple[Any, Any], Lane] = {}
    windows: dict[int, list[float]] = {}
    gpu_cats = ("kernel", "gpu_memcpy", "gpu_memset")
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") not in gpu_cats:
            continue
        args = ev.get("args") or {}
        device, stream = args.get("device", ev.get("pid")), args.get("stream", ev.get("tid"))
        span = _time(ev)
        if span is None:
            continue
        step = launched_in.get(args.get("correlation"))
        stage = annotations[step][3] if step is not None else None
        if step is not None:
            window = windows.setdefault(step, [span[0], span[1]])
            window[0], window[1] = min(window[0], span[0]), max(window[1], span[1])
        lane = lanes.setdefault((device, stream), Lane(f"gpu{device} s{stream}"))
        lane.spans.append(Span(span[0], span[1], "kernel" if ev["cat"] == "kernel" else "memcpy", str(ev.get("name")),
                               stage))
    for lane in lanes.values():
        lane.spans.sort(key=lambda s: s.start_us)
    steps = [Step(name, stage, *(windows.get(i) or (start, end)), index=i)
             for i, (start, end, name, stage) in enumerate(annotations)]
    return [lanes[k] for k in sorted(lanes, key=lambda k: (str(k[0]), str(k[1])))], steps


def steps_from_gap_rows(rows: Iterable[dict[str, Any]], end_us: float | None = None) -> list[Step]:
    """Steps from the gap analysis's step table (``step``, ``start_us``): without the trace the
    GPU window of a step is not known, so each runs until the next starts (the last until
    ``end_us``, else for as long as the one before it)."""
    from engine.jobs.query import parse_step_annotation
    parsed = []
    for row in rows:
        try:
            start = float(row["start_us"])
        except (KeyError, TypeError, ValueError):
            continue
        info = parse_step_annotation(str(row.get("step") or ""))
        parsed.append((start, str(row.get("step") or ""), STAGE_OF_KIND.get(info.kind) if info else None))
    parsed.sort()
    steps = []
    for i, (start, name, stage) in enumerate(parsed):
        if i + 1 < len(parsed):
            end = parsed[i + 1][0]
        elif end_us is not None and end_us > start:
            end = end_us
        else:
            end = start + (start - parsed[i - 1][0] if i else 1.0)
        steps.append(Step(name, stage, start, end, index=i))
    return steps


def tag_stages(lanes: list[Lane], steps: list[Step]) -> list[Lane]:
    """Busy spans without a stage get the stage of the step window their start lies in."""
    import bisect
    starts = [s.start_us for s in steps]
    for lane in lanes:
        tagged = []
        for span in lane.spans:
            if span.stage is None and span.kind in ("kernel", "memcpy"):
                i = bisect.bisect_right(starts, span.start_us) - 1
                if i >= 0 and span.start_us < steps[i].end_us:
                    span = Span(span.start_us, span.end_us, span.kind, span.name, steps[i].stage)
            tagged.append(span)
        lane.spans = tagged
    return lanes


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


def cells(lane: Lane, start: float, end: float, width: int, stage: str | None = None) -> list[str | None]:
    """The kind shown in each of ``width`` cells covering [start, end); with ``stage``, GPU work
    of another known stage shows as ``other``."""
    out: list[str | None] = [None] * width
    if width <= 0 or end <= start:
        return out
    per_cell = (end - start) / width
    for span in lane.spans:
        if span.end_us <= start or span.start_us >= end:
            continue
        kind = span.kind
        if stage is not None and span.stage is not None and span.stage != stage and kind in ("kernel", "memcpy"):
            kind = "other"
        first = max(0, int((span.start_us - start) / per_cell))
        last = min(width - 1, int((min(span.end_us, end) - start - 1e-9) / per_cell))
        for i in range(first, last + 1):
            current = out[i]
            if current is None or _RANK[kind] > _RANK[current]:
                out[i] = kind
    return out


def _ticks(start: float, end: float, width: int) -> str:
    """An axis line: a time label every ~16 cells, in us, ms or s by the size of the times shown
    (not of the view: a 0.7 ms step at 61 ms reads 60.97ms, never 6.097e+04us), with as many
    decimals as the distance between two labels needs."""
    import math
    line = [" "] * width
    span = end - start
    unit, scale = ("s", 1e6) if end >= 1e7 else ("ms", 1e3) if end >= 1e4 else ("us", 1.0)
    between = span * 16 / max(1, width) / scale
    decimals = min(4, max(0, math.ceil(-math.log10(between)) + 1)) if between > 0 else 0
    for x in range(0, max(1, width - 6), 16):
        text = f"|{(start + span * x / width) / scale:.{decimals}f}{unit}"
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
        Binding("n", "step(1)", "Next step", show=False, id="timeline.next_step"),
        Binding("N", "step(-1)", "Prev step", show=False, id="timeline.previous_step"),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "gpu-timeline--label", "gpu-timeline--axis", "gpu-timeline--kernel", "gpu-timeline--memcpy",
        "gpu-timeline--idle", "gpu-timeline--host", "gpu-timeline--other",
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
        & > .gpu-timeline--other { color: $muted; }
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
        self.steps: list[Step] = []
        self.stage: str | None = None  # the stage shown (None: every step alike)
        self.step_at: int | None = None  # index into stage_steps() of the step in view
        self.set_lanes(lanes or [], source)

    def set_lanes(self, lanes: list[Lane], source: str = "", steps: list[Step] | None = None) -> None:
        self.lanes = [lane for lane in lanes if lane.spans]
        self.source = source
        self.steps = list(steps or [])
        spans = [s for lane in self.lanes for s in lane.spans]
        self.extent = (min(s.start_us for s in spans), max(s.end_us for s in spans)) if spans else (0.0, 0.0)
        self.view = self.extent
        self.step_at = None
        self.refresh(layout=True)

    # -- stages ---------------------------------------------------------------------------------
    def stage_steps(self) -> list[Step]:
        return [s for s in self.steps if self.stage is not None and s.stage == self.stage]

    def show_stage(self, stage: str | None, at_index: int | None = None) -> None:
        """Show ``stage``: its kernels drawn, the other stages' dimmed, the view on one of its
        steps (the one whose trace-wide index is ``at_index`` when it is the stage's, else the
        middle one)."""
        self.stage = stage
        steps = self.stage_steps()
        if not steps:
            self.step_at = None
            self.view = self.extent
        else:
            here = next((i for i, s in enumerate(steps) if s.index == at_index), len(steps) // 2)
            self._view_step(here)
        self.refresh()

    def _view_step(self, position: int) -> None:
        steps = self.stage_steps()
        self.step_at = position % len(steps)
        step = steps[self.step_at]
        pad = max((step.end_us - step.start_us) * 0.05, 0.5)
        self.view = (max(self.extent[0], step.start_us - pad), min(self.extent[1], step.end_us + pad))

    def action_step(self, direction: int) -> None:
        """``n``/``N``: the next / previous step of the stage shown (wrapping)."""
        steps = self.stage_steps()
        if not steps:
            self.notify("choose a stage with steps in this trace first" if self.steps else
                        "no step annotations in this trace: nothing to step through", severity="warning")
            return
        self._view_step((self.step_at if self.step_at is not None else -direction) + direction)
        self.refresh()

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
    def title_text(self) -> str:
        """The first line: which step of which stage is in view (or how much of the trace), and the keys."""
        start, end = self.view
        whole = self.extent[1] - self.extent[0]
        steps = self.stage_steps()
        if self.stage is not None and steps and self.step_at is not None:
            step = steps[self.step_at]
            where = (f"{self.stage}: step {self.step_at + 1} of {len(steps)} ({step.name[:48]}), "
                     f"{(step.end_us - step.start_us) / 1e3:.4g} ms · n/N step")
        elif self.stage is not None:
            where = (f"{self.stage}: no steps of this stage in the trace's annotations" if self.steps else
                     f"{self.stage}: the trace has no step annotations, every kernel is drawn")
        else:
            where = f"view {(end - start) / max(1.0, whole) * 100:.0f}% of {whole / 1e3:.4g} ms"
        return f"{where} · +/- zoom, 0 whole trace · {self.source}"

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
            return Strip([Segment(self.title_text()[:width].ljust(width), self._style("axis"))])
        if y == 1:
            return Strip([Segment(" " * _LABEL_WIDTH, base), Segment(_ticks(start, end, plot), self._style("axis"))])
        if y == 2 + len(self.lanes):
            legend = "█ kernel  ▓ memcpy  · idle  ! idle, GPU waited on the host"
            if self.stage is not None:
                legend += "  ░ another stage"
            return Strip([Segment(legend[:width].ljust(width), self._style("axis"))])
        index = y - 2
        if not 0 <= index < len(self.lanes):
            return Strip.blank(width, base)
        lane = self.lanes[index]
        segments = [Segment(lane.name[: _LABEL_WIDTH - 1].ljust(_LABEL_WIDTH), self._style("label"))]
        for kind in cells(lane, start, end, plot, self.stage):
            segments.append(Segment(_GLYPH[kind], self._style(kind) if kind else base))
        return Strip(segments).simplify()

"""Gap analysis (Magpie's top-k kernel time over a window, with the per-kernel min/max/std Magpie
computes and drops) and GPU idle analysis (what the name promises: idle intervals per stream,
the largest gaps with what the host was doing, and whether the GPU waited on the host)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from engine.trace.load import Event, Trace
from engine.trace.timeline import union_length
from engine.trace.tree import RUNTIME_CATS, EventTree

GAP_COLUMNS = ["Name", "Calls", "Self CUDA total (us)", "Avg time (us)", "% Total", "Input Shapes"]
# Ours, after Magpie's six so scripts reading those keep working.
GAP_EXTRA_COLUMNS = ["Min (us)", "Max (us)", "Std (us)", "Median (us)"]
DEFAULT_CATEGORIES = ("kernel", "gpu")
DEFAULT_IGNORE = ("gpu_user_annotation", "user_annotation")


@dataclass
class KernelAgg:
    name: str
    durations: list[float] = field(default_factory=list)
    shapes: dict[str, None] = field(default_factory=dict)  # insertion-ordered set

    @property
    def total(self) -> float:
        return math.fsum(self.durations)


@dataclass
class Window:
    start_pct: float
    end_pct: float
    t_min: float
    t_max: float

    @property
    def lo(self) -> float:
        return self.t_min + (self.t_max - self.t_min) * self.start_pct / 100.0

    @property
    def hi(self) -> float:
        return self.t_min + (self.t_max - self.t_min) * self.end_pct / 100.0

    def to_dict(self) -> dict:
        return {"start_pct": self.start_pct, "end_pct": self.end_pct, "t_min_us": self.t_min, "t_max_us": self.t_max,
                "window_start_us": self.lo, "window_end_us": self.hi}


def trace_window(trace: Trace, start_pct: float = 0.0, end_pct: float = 100.0) -> Window:
    if not 0.0 <= start_pct < end_pct <= 100.0:
        raise ValueError(f"window {start_pct}%..{end_pct}%: need 0 <= start < end <= 100")
    timed = [e for e in trace.events if e.ph != "M"]
    if not timed:
        raise ValueError(f"{trace.path}: no timed events")
    return Window(start_pct, end_pct, min(e.ts for e in timed), max(e.ts + e.dur for e in timed))


def _shape_text(dims: object) -> str:
    if not isinstance(dims, (list, tuple)):
        return ""
    parts = []
    for d in dims:
        if isinstance(d, (list, tuple)) and d:
            parts.append("[" + ",".join(str(x) for x in d) + "]")
    return "x".join(parts)


def _matches(cat: str, allow: Sequence[str], ignore: Sequence[str]) -> bool:
    c = cat.lower()
    if any(i.lower() in c for i in ignore):
        return False
    return any(a.lower() in c for a in allow) if allow else True


def aggregate_kernels(trace: Trace, window: Window, *, categories: Sequence[str] = DEFAULT_CATEGORIES,
                      ignore_categories: Sequence[str] = DEFAULT_IGNORE, min_duration_us: float = 0.0
                      ) -> dict[str, KernelAgg]:
    """Kernel time by name over the window. Events overlapping the window are kept whole
    (Magpie's rule); the window itself is clamped to the trace."""
    op_by_ext: dict = {}
    for e in trace.events:
        if e.cat == "cpu_op" and e.ext_id is not None:
            op_by_ext[e.ext_id] = e
    shape_cache: dict = {}  # formatted once per External id, and only for counted events

    def shape_of(ext: object) -> str:
        text = shape_cache.get(ext)
        if text is None:
            op = op_by_ext.get(ext)
            args = op.args if op is not None else None  # decoded here, only for ops that launched kernels
            text = shape_cache[ext] = _shape_text(args.get("Input Dims") if args else None)
        return text

    lo, hi = window.lo, window.hi
    out: dict[str, KernelAgg] = {}
    wanted: dict[str, bool] = {}  # per category: a handful of categories, many events
    for e in trace.events:
        if e.ph != "X":
            continue
        keep = wanted.get(e.cat)
        if keep is None:
            keep = wanted[e.cat] = _matches(e.cat, categories, ignore_categories)
        if not keep:
            continue
        if e.ts + e.dur < lo or e.ts > hi or e.dur < min_duration_us:
            continue
        agg = out.get(e.name)
        if agg is None:
            agg = out[e.name] = KernelAgg(e.name)
        agg.durations.append(e.dur)
        shape = shape_of(e.ext_id) if e.ext_id is not None else None
        if shape:
            agg.shapes[shape] = None
    return out


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def gap_rows(aggs: dict[str, KernelAgg], top_k: int, grand_total: float | None = None) -> list[list]:
    """Rows sorted by total time desc, truncated to top_k; % of ``grand_total`` (default: all kernels)."""
    total = grand_total if grand_total is not None else math.fsum(a.total for a in aggs.values())
    ranked = sorted(aggs.values(), key=lambda a: (-a.total, a.name))[:top_k]
    rows = []
    for a in ranked:
        d = sorted(a.durations)
        n = len(d)
        median = d[n // 2] if n % 2 else (d[n // 2 - 1] + d[n // 2]) / 2
        rows.append([a.name, n, round(a.total, 3), round(a.total / n, 3),
                     round(a.total / total * 100.0, 2) if total else 0.0, "; ".join(a.shapes),
                     round(d[0], 3), round(d[-1], 3), round(_std(d), 3), round(median, 3)])
    return rows


def merge_ranks(per_rank: dict[int, dict[str, KernelAgg]]) -> dict[str, KernelAgg]:
    merged: dict[str, KernelAgg] = {}
    for aggs in per_rank.values():
        for name, a in aggs.items():
            m = merged.get(name)
            if m is None:
                m = merged[name] = KernelAgg(name)
            m.durations.extend(a.durations)
            m.shapes.update(a.shapes)
    return merged


# ---------------------------------------------------------------------------------------- idle

@dataclass
class IdleGap:
    stream: str  # "device 0 / stream 7", or "device 0 (all streams)"
    start: float
    end: float
    before: str  # GPU event that ended the busy period
    after: str  # GPU event that starts after the gap
    host_bound: bool  # the launch of `after` was issued after the GPU went idle
    launch_delay_us: float | None  # when host-bound: launch time - gap start
    cpu_ops: list[str]  # top-level CPU ops running during the gap

    @property
    def duration(self) -> float:
        return self.end - self.start


def _gap_list(events: list[Event]) -> list[tuple[Event, Event, float, float]]:
    """(event before, event after, gap start, gap end) between busy periods of the given events."""
    events = sorted(events, key=lambda e: e.ts)
    gaps = []
    cur_end = None
    last = None
    for e in events:
        end = e.ts + e.dur
        if cur_end is not None and e.ts > cur_end:
            gaps.append((last, e, cur_end, e.ts))
        if cur_end is None or end > cur_end:
            cur_end, last = end, e
    return gaps


def _launch_of(ev: Event) -> Event | None:
    p = ev.parent
    return p if p is not None and p.cat in RUNTIME_CATS else None


def _host_activity(tree: EventTree, gaps: list[tuple[float, float]], limit: int = 5) -> list[list[str]]:
    """For each (lo, hi) gap, the names of top-level CPU ops overlapping it, in start order.
    One sweep: gaps and roots sorted by start, a heap of started roots keyed by their end."""
    import heapq
    roots = sorted(tree.cpu_roots, key=lambda e: e.ts)
    order = sorted(range(len(gaps)), key=lambda i: gaps[i][0])
    out: list[list[str]] = [[] for _ in gaps]
    active: list[tuple[float, float, int, str]] = []  # (end, start, uid, name)
    i = 0
    for gi in order:
        lo, hi = gaps[gi]
        while i < len(roots) and roots[i].ts < hi:
            r = roots[i]
            heapq.heappush(active, (r.ts + r.dur, r.ts, r.uid, r.name))
            i += 1
        while active and active[0][0] <= lo:  # ended before this gap, so before every later one
            heapq.heappop(active)
        out[gi] = [name for _, _, _, name in sorted(active, key=lambda a: a[1])[:limit]]
    return out


def idle_analysis(tree: EventTree, window: Window, *, top_n: int = 20, min_gap_us: float = 0.0) -> dict:
    """Idle intervals of each GPU stream and of each device (all its streams together), the
    largest device gaps with the host activity during them, and the host-bound share of idle."""
    lo, hi = window.lo, window.hi
    gpu = [e for e in tree.gpu_events if e.ts + e.dur >= lo and e.ts <= hi]
    by_stream: dict[tuple, list[Event]] = {}
    by_device: dict = {}
    for e in gpu:
        by_stream.setdefault((e.pid, e.tid), []).append(e)
        by_device.setdefault(e.pid, []).append(e)
    streams = []
    for (pid, tid), evs in sorted(by_stream.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        busy = union_length((x.ts, x.ts + x.dur) for x in evs)
        span = max(x.ts + x.dur for x in evs) - min(x.ts for x in evs)
        gaps = [g for g in _gap_list(evs) if g[3] - g[2] >= min_gap_us]
        streams.append({"device": pid, "stream": tid, "events": len(evs), "span_us": span, "busy_us": busy,
                        "idle_us": span - busy, "idle_pct": (span - busy) / span * 100.0 if span else 0.0,
                        "gaps": len(gaps), "largest_gap_us": max((g[3] - g[2] for g in gaps), default=0.0)})
    device_gaps: list[IdleGap] = []
    for pid, evs in by_device.items():
        for before, after, s, e in _gap_list(evs):
            if e - s < min_gap_us:
                continue
            launch = _launch_of(after)
            host_bound = launch is not None and launch.ts > s
            device_gaps.append(IdleGap(f"device {pid} (all streams)", s, e, before.name, after.name, host_bound,
                                       (launch.ts - s) if host_bound and launch is not None else None, []))
    for gap, names in zip(device_gaps, _host_activity(tree, [(g.start, g.end) for g in device_gaps])):
        gap.cpu_ops = names
    total_idle = math.fsum(g.duration for g in device_gaps)
    host_idle = math.fsum(g.duration for g in device_gaps if g.host_bound)
    largest = sorted(device_gaps, key=lambda g: -g.duration)[:top_n]
    return {"streams": streams, "largest_gaps": largest, "total_idle_us": total_idle,
            "host_bound_idle_us": host_idle,
            "host_bound_idle_pct": host_idle / total_idle * 100.0 if total_idle else 0.0,
            "gaps": device_gaps}


def step_launch_analysis(tree: EventTree, steps: Iterable[tuple[str, float, float]], gaps: list[IdleGap]) -> list[dict]:
    """Per step (name, start, end): CPU dispatch time (union of launch calls), GPU busy time of the
    GPU work its launches issued, idle time inside the step's GPU span, and how much of that idle
    was the GPU waiting for a launch. ``launch_bound`` when the CPU dispatch time is at least the
    GPU busy time: the host, not the GPU, set the pace."""
    import bisect
    runtime = sorted((e for e in tree.host_events if e.cat in RUNTIME_CATS), key=lambda e: e.ts)
    rt_starts = [e.ts for e in runtime]
    gaps_sorted = sorted(gaps, key=lambda g: g.start)
    gap_starts = [g.start for g in gaps_sorted]
    rows = []
    for name, s, e in steps:
        i, j = bisect.bisect_left(rt_starts, s), bisect.bisect_right(rt_starts, e)
        launches = runtime[i:j]
        dispatch = union_length((x.ts, x.ts + x.dur) for x in launches)
        work = [g for x in launches for g in (x.gpu_events or [])]
        if work:
            g_lo = min(g.ts for g in work)
            g_hi = max(g.ts + g.dur for g in work)
            busy = union_length((g.ts, g.ts + g.dur) for g in work)
        else:
            g_lo = g_hi = s
            busy = 0.0
        span = g_hi - g_lo
        k, m = bisect.bisect_left(gap_starts, g_lo), bisect.bisect_left(gap_starts, g_hi)
        inside = [g for g in gaps_sorted[k:m] if g.end <= g_hi]
        waited = math.fsum(g.duration for g in inside if g.host_bound)
        rows.append({"step": name, "start_us": s, "cpu_span_us": e - s, "launches": len(launches),
                     "cpu_dispatch_us": dispatch, "gpu_events": len(work), "gpu_span_us": span,
                     "gpu_busy_us": busy, "gpu_idle_us": span - busy, "gpu_waited_on_host_us": waited,
                     "launch_bound": bool(work) and dispatch >= busy})
    return rows

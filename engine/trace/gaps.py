"""Gap analysis (Magpie's top-k kernel time over a window, with the per-kernel min/max/std Magpie
computes and drops) and GPU idle analysis (what the name promises: idle intervals per stream,
the largest gaps with what the host was doing, and whether the GPU waited on the host)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from engine.trace.load import Trace
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
    timed = trace.kinds_where(lambda ph, cat: ph != "M")
    kind, ts, dur = trace.kind, trace.ts, trace.dur
    first = last = -1  # the first event with the smallest start, and with the largest end
    lo = hi = 0.0
    for uid in range(len(kind)):
        if timed[kind[uid]]:
            start = ts[uid]
            end = start + dur[uid]
            if first < 0 or start < lo:
                first, lo = uid, start
            if last < 0 or end > hi:
                last, hi = uid, end
    if first < 0:
        raise ValueError(f"{trace.path}: no timed events")
    return Window(start_pct, end_pct, trace.ts_of(first), trace.end_of(last))


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
    wanted = trace.kinds_where(lambda ph, cat: ph == "X" and _matches(cat, categories, ignore_categories))
    kind, ts, dur, names, name = trace.kind, trace.ts, trace.dur, trace.names, trace.name
    lo, hi = window.lo, window.hi
    out: dict[str, KernelAgg] = {}
    counted_ext: list = []  # External id of each counted event (None: none)
    for uid in range(len(kind)):
        if not wanted[kind[uid]]:
            continue
        start, d = ts[uid], dur[uid]
        if start + d < lo or start > hi or d < min_duration_us:
            continue
        n = names[name[uid]]
        agg = out.get(n)
        if agg is None:
            agg = out[n] = KernelAgg(n)
        agg.durations.append(trace.dur_of(uid))
        counted_ext.append((agg, trace.ext_of(uid)))
    # Input shapes from the cpu_op with the same External id (the last such op, as a dict would
    # keep), formatted once per id; only the ids of counted events are looked up.
    exts = {ext for _, ext in counted_ext if ext is not None}
    op_by_ext: dict = {}
    if exts:
        cpu_op = trace.kinds_where(lambda ph, cat: cat == "cpu_op")
        for uid in range(len(kind)):
            if cpu_op[kind[uid]]:
                ext = trace.ext_of(uid)
                if ext in exts:
                    op_by_ext[ext] = uid
    shape_cache: dict = {}
    for agg, ext in counted_ext:
        if ext is None:
            continue
        text = shape_cache.get(ext)
        if text is None:
            op = op_by_ext.get(ext)
            args = trace.args_of(op) if op is not None else None  # decoded here, only for ops that launched kernels
            text = shape_cache[ext] = _shape_text(args.get("Input Dims") if args else None)
        if text:
            agg.shapes[text] = None
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

@dataclass(slots=True)
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


def _gap_list(trace: Trace, uids: Sequence[int]) -> list[tuple[int, int, float, float]]:
    """(event before, event after, gap start, gap end) between busy periods of the given events
    (uids); the gap's ends as the JSON wrote them."""
    ts, dur = trace.ts, trace.dur
    gaps = []
    cur_end = None
    last = -1
    for uid in sorted(uids, key=ts.__getitem__):
        start = ts[uid]
        end = start + dur[uid]
        if cur_end is not None and start > cur_end:
            gaps.append((last, uid, trace.end_of(last), trace.ts_of(uid)))
        if cur_end is None or end > cur_end:
            cur_end, last = end, uid
    return gaps


def _first_min_start(trace: Trace, uids: Iterable[int]) -> float:
    """min(ts) as Python's min over the JSON values gives it: the first smallest, with its type."""
    ts = trace.ts
    return trace.ts_of(min(uids, key=ts.__getitem__))


def _first_max_end(trace: Trace, uids: Iterable[int]) -> float:
    ts, dur = trace.ts, trace.dur
    return trace.end_of(max(uids, key=lambda u: ts[u] + dur[u]))


def _intervals(trace: Trace, uids: Iterable[int]) -> list[tuple[float, float]]:
    ts, dur = trace.ts, trace.dur
    return [(ts[u], ts[u] + dur[u]) for u in uids]


def _host_activity(tree: EventTree, gaps: list[tuple[float, float]], limit: int = 5) -> list[list[str]]:
    """For each (lo, hi) gap, the names of top-level CPU ops overlapping it, in start order.
    One sweep: gaps and roots sorted by start, a heap of started roots keyed by their end."""
    import heapq
    trace = tree.trace
    ts, dur = trace.ts, trace.dur
    roots = sorted(tree.roots, key=ts.__getitem__)
    order = sorted(range(len(gaps)), key=lambda i: gaps[i][0])
    out: list[list[str]] = [[] for _ in gaps]
    active: list[tuple[float, float, int, str]] = []  # (end, start, uid, name)
    i = 0
    for gi in order:
        lo, hi = gaps[gi]
        while i < len(roots) and ts[roots[i]] < hi:
            r = roots[i]
            heapq.heappush(active, (ts[r] + dur[r], ts[r], r, trace.name_of(r)))
            i += 1
        while active and active[0][0] <= lo:  # ended before this gap, so before every later one
            heapq.heappop(active)
        out[gi] = [name for _, _, _, name in sorted(active, key=lambda a: a[1])[:limit]]
    return out


def idle_analysis(tree: EventTree, window: Window, *, top_n: int = 20, min_gap_us: float = 0.0) -> dict:
    """Idle intervals of each GPU stream and of each device (all its streams together), the
    largest device gaps with the host activity during them, and the host-bound share of idle."""
    trace = tree.trace
    ts, dur = trace.ts, trace.dur
    lo, hi = window.lo, window.hi
    by_stream: dict[tuple, list[int]] = {}
    by_device: dict = {}
    for g in tree.gpu_uids:
        if ts[g] + dur[g] >= lo and ts[g] <= hi:
            pid = trace.pid_of(g)
            by_stream.setdefault((pid, trace.tid_of(g)), []).append(g)
            by_device.setdefault(pid, []).append(g)
    streams = []
    for (pid, tid), uids in sorted(by_stream.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        busy = union_length(_intervals(trace, uids))
        span = _first_max_end(trace, uids) - _first_min_start(trace, uids)
        gaps = [g for g in _gap_list(trace, uids) if g[3] - g[2] >= min_gap_us]
        streams.append({"device": pid, "stream": tid, "events": len(uids), "span_us": span, "busy_us": busy,
                        "idle_us": span - busy, "idle_pct": (span - busy) / span * 100.0 if span else 0.0,
                        "gaps": len(gaps), "largest_gap_us": max((g[3] - g[2] for g in gaps), default=0.0)})
    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    device_gaps: list[IdleGap] = []
    for pid, uids in by_device.items():
        for before, after, s, e in _gap_list(trace, uids):
            if e - s < min_gap_us:
                continue
            launch = tree.parent[after]  # the runtime call that launched `after`, if any
            host_bound = launch >= 0 and runtime[trace.kind[launch]] and trace.ts[launch] > s
            device_gaps.append(IdleGap(f"device {pid} (all streams)", s, e, trace.name_of(before), trace.name_of(after),
                                       bool(host_bound), (trace.ts_of(launch) - s) if host_bound else None, []))
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
    trace = tree.trace
    ts = trace.ts
    is_runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    kind = trace.kind
    runtime = sorted((u for u in tree.host_order if is_runtime[kind[u]]), key=ts.__getitem__)
    rt_starts = [ts[u] for u in runtime]
    gaps_sorted = sorted(gaps, key=lambda g: g.start)
    gap_starts = [g.start for g in gaps_sorted]
    rows = []
    for name, s, e in steps:
        i, j = bisect.bisect_left(rt_starts, s), bisect.bisect_right(rt_starts, e)
        launches = runtime[i:j]
        dispatch = union_length(_intervals(trace, launches))
        work = [g for x in launches for g in tree.gpu_uids_of(x)]
        if work:
            g_lo = _first_min_start(trace, work)
            g_hi = _first_max_end(trace, work)
            busy = union_length(_intervals(trace, work))
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

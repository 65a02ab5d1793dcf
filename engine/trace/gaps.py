"""Gap analysis (Magpie's top-k kernel time over a window, with the per-kernel min/max/std Magpie
computes and drops) and GPU idle analysis (what the name promises: idle intervals per stream,
the largest gaps with what the host was doing, and whether the GPU waited on the host)."""

from __future__ import annotations

import math
from array import array
from operator import add, indexOf
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
    if len(kind):  # min/max over the whole columns, in C; good unless a metadata event holds one
        first = ts.index(min(ts))
        last = indexOf(map(add, ts, dur), max(map(add, ts, dur)))
        if timed[kind[first]] and timed[kind[last]]:
            return Window(start_pct, end_pct, trace.ts_of(first), trace.end_of(last))
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
    ts, dur, names, name = trace.ts, trace.dur, trace.names, trace.name
    lo, hi = window.lo, window.hi

    counted = array("i")  # the events counted, in trace order
    for uid in trace.uids_of(wanted):
        start, d = ts[uid], dur[uid]
        if not (start + d < lo or start > hi or d < min_duration_us):
            counted.append(uid)

    out: dict[str, KernelAgg] = {}
    exts: set = set()
    for uid in counted:
        n = names[name[uid]]
        agg = out.get(n)
        if agg is None:
            agg = out[n] = KernelAgg(n)
        agg.durations.append(trace.dur_of(uid))
        exts.add(trace.ext_of(uid))
    exts.discard(None)
    if not exts:
        return out
    # Input shapes from the cpu_op with the same External id (the last such op, as a dict would
    # keep); only the ids of counted events are looked up, and each distinct args text is
    # formatted once.
    cpu_op = trace.kinds_where(lambda ph, cat: cat == "cpu_op")
    args_by_ext: dict = {}  # External id -> the op's args (pool index)
    for uid in trace.uids_of(cpu_op):
        ext = trace.ext_of(uid)
        if ext in exts:
            args_by_ext[ext] = trace.args[uid]
    del exts
    shape_of_args: dict[int, str] = {}
    for uid in counted:
        ext = trace.ext_of(uid)
        pooled = args_by_ext.get(ext, -1) if ext is not None else -1
        if pooled < 0:
            continue
        text = shape_of_args.get(pooled)
        if text is None:
            args = trace.pooled_args(pooled)  # decoded here, only for ops that launched kernels
            text = shape_of_args[pooled] = _shape_text(args.get("Input Dims") if args else None)
        if text:
            out[names[name[uid]]].shapes[text] = None
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


class IdleGaps(Sequence):
    """The device gaps of ``idle_analysis`` (its ``"gaps"``), in columns: a trace has about one
    gap per kernel, and an object per gap cost ~250 bytes. ``gaps[i]`` is an ``IdleGap`` made on
    access; its start and end are the JSON's values (the end of ``before``, the start of ``after``)."""

    def __init__(self, tree: EventTree) -> None:
        self.tree = tree
        self.labels: list[str] = []  # per device
        self.device = array("I")  # index into labels
        self.before = array("i")  # uids
        self.after = array("i")
        self.start = array("d")
        self.end = array("d")
        self.host_bound = bytearray()
        self.launch = array("i")  # uid of the launch of `after` (-1: none)
        self.cpu_ops = array("i")  # index into op_lists
        self.op_lists: list[tuple[str, ...]] = []  # distinct cpu_ops lists

    def __len__(self) -> int:
        return len(self.before)

    def duration(self, i: int) -> float:
        return self.end[i] - self.start[i]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        t = self.tree.trace
        start, end = t.end_of(self.before[i]), t.ts_of(self.after[i])
        host_bound = bool(self.host_bound[i])
        return IdleGap(self.labels[self.device[i]], start, end, t.name_of(self.before[i]), t.name_of(self.after[i]),
                       host_bound, (t.ts_of(self.launch[i]) - start) if host_bound else None,
                       list(self.op_lists[self.cpu_ops[i]]))


def _gap_list(trace: Trace, uids: Sequence[int]) -> list[tuple[int, int]]:
    """(event before, event after) around each gap between busy periods of the given events (uids):
    the gap runs from the end of the one to the start of the other."""
    ts, dur = trace.ts, trace.dur
    gaps = []
    cur_end = None
    last = -1
    for uid in sorted(uids, key=ts.__getitem__):
        start = ts[uid]
        end = start + dur[uid]
        if cur_end is not None and start > cur_end:
            gaps.append((last, uid))
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


def _host_activity(tree: EventTree, gaps: IdleGaps, limit: int = 5) -> None:
    """For each gap, the names of top-level CPU ops overlapping it, in start order, into
    ``gaps.cpu_ops``. One sweep: gaps and roots sorted by start, a heap of started roots keyed
    by their end."""
    import heapq
    trace = tree.trace
    ts, dur = trace.ts, trace.dur
    roots = sorted(tree.roots, key=ts.__getitem__)
    interned: dict[tuple[str, ...], int] = {}
    gaps.cpu_ops = array("i", [0]) * len(gaps)
    active: list[tuple[float, float, int, str]] = []  # (end, start, uid, name)
    i = 0
    for gi in sorted(range(len(gaps)), key=gaps.start.__getitem__):
        lo, hi = gaps.start[gi], gaps.end[gi]
        while i < len(roots) and ts[roots[i]] < hi:
            r = roots[i]
            heapq.heappush(active, (ts[r] + dur[r], ts[r], r, trace.name_of(r)))
            i += 1
        while active and active[0][0] <= lo:  # ended before this gap, so before every later one
            heapq.heappop(active)
        names = tuple(name for _, _, _, name in sorted(active, key=lambda a: a[1])[:limit])
        k = interned.get(names)
        if k is None:
            k = interned[names] = len(gaps.op_lists)
            gaps.op_lists.append(names)
        gaps.cpu_ops[gi] = k


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
        pairs = _gap_list(trace, uids)
        lengths = [ts[after] - (ts[before] + dur[before]) for before, after in pairs]
        kept = [i for i, length in enumerate(lengths) if length >= min_gap_us]
        largest = 0.0
        if kept:  # the first longest gap, its length with the JSON's types
            before, after = pairs[max(kept, key=lengths.__getitem__)]
            largest = trace.ts_of(after) - trace.end_of(before)
        streams.append({"device": pid, "stream": tid, "events": len(uids), "span_us": span, "busy_us": busy,
                        "idle_us": span - busy, "idle_pct": (span - busy) / span * 100.0 if span else 0.0,
                        "gaps": len(kept), "largest_gap_us": largest})
        del pairs, lengths, kept
    del by_stream
    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    gaps = IdleGaps(tree)
    for pid, uids in by_device.items():
        device = len(gaps.labels)
        gaps.labels.append(f"device {pid} (all streams)")
        for before, after in _gap_list(trace, uids):
            s, e = ts[before] + dur[before], ts[after]
            if e - s < min_gap_us:
                continue
            launch = tree.parent[after]  # the runtime call that launched `after`, if any
            if launch >= 0 and not runtime[trace.kind[launch]]:
                launch = -1
            gaps.device.append(device)
            gaps.before.append(before)
            gaps.after.append(after)
            gaps.start.append(s)
            gaps.end.append(e)
            gaps.launch.append(launch)
            gaps.host_bound.append(launch >= 0 and ts[launch] > s)
    del by_device
    _host_activity(tree, gaps)
    durations = [gaps.duration(i) for i in range(len(gaps))]
    total_idle = math.fsum(durations)
    host_idle = math.fsum(d for d, bound in zip(durations, gaps.host_bound) if bound)
    largest = [gaps[i] for i in sorted(range(len(gaps)), key=lambda i: -durations[i])[:top_n]]
    return {"streams": streams, "largest_gaps": largest, "total_idle_us": total_idle,
            "host_bound_idle_us": host_idle,
            "host_bound_idle_pct": host_idle / total_idle * 100.0 if total_idle else 0.0,
            "gaps": gaps}


def step_launch_analysis(tree: EventTree, steps: Iterable[tuple[str, float, float]],
                         gaps: Sequence[IdleGap]) -> list[dict]:
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
    # (start, end, duration, host-bound) of each gap, by start
    if isinstance(gaps, IdleGaps):
        spans = sorted((gaps.start[i], gaps.end[i], gaps.duration(i), gaps.host_bound[i]) for i in range(len(gaps)))
    else:
        spans = sorted((g.start, g.end, g.duration, g.host_bound) for g in gaps)
    gap_starts = [g[0] for g in spans]
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
        waited = math.fsum(d for _, end, d, bound in spans[k:m] if end <= g_hi and bound)
        rows.append({"step": name, "start_us": s, "cpu_span_us": e - s, "launches": len(launches),
                     "cpu_dispatch_us": dispatch, "gpu_events": len(work), "gpu_span_us": span,
                     "gpu_busy_us": busy, "gpu_idle_us": span - busy, "gpu_waited_on_host_us": waited,
                     "launch_bound": bool(work) and dispatch >= busy})
    return rows

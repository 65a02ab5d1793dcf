"""Each GPU idle gap explained: what drained the queue, what the host was doing, how late the
next kernel started after its launch, and which stage of the run the gap belongs to.

The gaps are those of ``idle_analysis`` (each device, all its streams merged). A gap shorter
than the noise floor (5 us by default: the spacing of back-to-back kernels) is counted, not
classified. Per gap:

* ``drain``: ``sync_drain`` when a synchronising runtime call (``cudaDeviceSynchronize``,
  ``cudaStreamSynchronize``, ``cudaEventSynchronize``, a synchronous ``cudaMemcpy`` / ``cudaMemset``,
  the ``cu*`` and ``hip*`` equivalents) on one of the device's launching threads spans the gap's
  start: the host was blocked waiting for the queue to empty. ``no_sync`` otherwise.
* ``host``: what the device's launching threads did during the gap, by the largest share of
  its time: ``launching`` (runtime calls that enqueue GPU work: kernel and graph launches, async
  copies and memsets), ``runtime`` (other runtime / driver calls), ``cpu`` (host ops outside the
  runtime) or ``idle`` (nothing recorded).
* ``launch_to_start_us``: from the end of the launch call of the kernel that ends the gap (when
  the call returned, the work was queued) to that kernel's start; ``launch_call_us`` the call's own
  length; ``prequeued`` when that call returned before the gap began (the work was waiting in the
  queue while the GPU sat idle).
* ``cause``, one label: ``graph_unrecorded`` (inside a graph replay whose kernels are not in the
  trace: not idle, left out of the totals), ``sync_drain``, ``queued_not_started`` (pre-queued work
  that did not start: a dependency on another stream or event, or the launch path), ``launch_latency``
  (queued during the gap but started more than 25% of the gap after its launch call returned), else
  ``host_<host>``: the GPU waited for the host, which was launching, in the runtime, busy on the
  CPU, or idle.
* ``stage``: the kind of the step annotation (``prefill``, ``decode``, ``prefilldecode``) whose
  host span holds the launch of the kernel that ends the gap (or the gap's start), ``none`` without.
"""

from __future__ import annotations

import bisect
import math
from itertools import accumulate, compress, islice, repeat
from operator import add, ge, gt, mul, not_, sub
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from engine.trace.graphs import GraphReplays
from engine.trace.tree import RUNTIME_CATS, EventTree

NOISE_FLOOR_US = 5.0
LAUNCH_LATENCY_SHARE = 0.25
SYNC_SLACK_US = 1.0  # clocks: a sync may return a hair before the GPU's last event ends

CAUSES = ("graph_unrecorded", "sync_drain", "queued_not_started", "launch_latency", "host_launching",
          "host_runtime", "host_cpu", "host_idle")
HOST_CLASSES = ("launching", "runtime", "cpu", "idle")
CSV_COLUMNS = ["device", "start_us", "end_us", "duration_us", "before", "after", "cause", "drain", "sync_call",
               "host", "host_launching_us", "host_runtime_us", "host_cpu_us", "host_idle_us", "launch_call_us",
               "launch_to_start_us", "prequeued", "stage", "step"]

_VERSION = re.compile(r"_v\d+$|_ptsz$|_spt$")
_SYNC_EXACT = {"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemset", "cudaMemcpyToSymbol",
               "cudaMemcpyFromSymbol", "hipMemcpy", "hipMemcpy2D", "hipMemcpyDtoH", "hipMemcpyHtoD", "hipMemcpyDtoD",
               "hipMemset", "hipMemcpyWithStream", "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoD",
               "cuMemsetD8", "cuMemsetD32"}


def is_sync_call(name: str) -> bool:
    base = _VERSION.sub("", name)
    return "Synchronize" in base or base in _SYNC_EXACT


def is_launch_call(name: str) -> bool:
    base = _VERSION.sub("", name)
    return "Launch" in base or (base.endswith("Async") and ("Memcpy" in base or "Memset" in base))


class _Spans:
    """Disjoint intervals sorted by start, with running lengths: the length of their overlap with
    any interval in O(log n)."""

    __slots__ = ("starts", "ends", "cum", "labels")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.cum: list[float] = [0.0]
        self.labels: list[int] = []

    def add(self, s: float, e: float, label: int = -1) -> None:
        """Intervals must come in start order (they are merged here)."""
        if self.ends and s <= self.ends[-1]:
            if e > self.ends[-1]:
                self.cum[-1] += e - self.ends[-1]
                self.ends[-1] = e
            return
        self.starts.append(s)
        self.ends.append(e)
        self.cum.append(self.cum[-1] + (e - s))
        self.labels.append(label)

    @classmethod
    def union(cls, starts: list[float], ends: list[float]) -> "_Spans":
        """The union of intervals given in start order, merged with iterators (no Python loop per
        interval): a span ends where the running maximum of the ends falls before the next start."""
        out = cls()
        n = len(starts)
        if not n:
            return out
        reach = list(accumulate(ends, max))  # the furthest end so far
        breaks = list(compress(range(1, n), map(gt, islice(starts, 1, None), reach)))  # a new span starts here
        out.starts = [starts[0], *map(starts.__getitem__, breaks)]
        out.ends = [*map(reach.__getitem__, [b - 1 for b in breaks]), reach[-1]]
        out.cum = [0.0, *accumulate(map(sub, out.ends, out.starts))]
        out.labels = []
        return out

    def overlap(self, a: float, b: float) -> float:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, a)  # the first span ending after a
        j = bisect.bisect_left(starts, b)  # spans starting before b: [.., j)
        if i >= j:
            return 0.0
        total = self.cum[j] - self.cum[i]
        if starts[i] < a:
            total -= a - starts[i]
        if ends[j - 1] > b:
            total -= ends[j - 1] - b
        return total

    def containing(self, t: float, slack: float = 0.0) -> int:
        """Index of the span with start <= t <= end + slack, or -1."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and self.ends[i] + slack >= t:
            return i
        return -1


@dataclass
class IdleCauses:
    rows: list[list]  # CSV_COLUMNS, in gap start order (none kept when a sink took them)
    summary: dict


def _host_spans(tree: EventTree, threads: set[int]) -> tuple[_Spans, _Spans, _Spans, _Spans, list[str]]:
    """Unions of the given threads' launch calls, runtime calls, all host events, and sync calls.
    The host events are filtered and merged with iterators: a Python step per event cost a few
    percent of a whole analysis."""
    trace = tree.trace
    kind, name, ts, dur, pid, tid = trace.kind, trace.name, trace.ts, trace.dur, trace.pid, trace.tid
    width = len(trace.ids)
    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    launch_name = bytearray(is_launch_call(n) for n in trace.names)
    sync_name = bytearray(is_sync_call(n) for n in trace.names)
    hosts = tree.host_order  # by start
    keys = map(add, map(mul, map(pid.__getitem__, hosts), repeat(width)), map(tid.__getitem__, hosts))
    mine = list(compress(hosts, map(threads.__contains__, keys)))
    rt = list(compress(mine, map(runtime.__getitem__, map(kind.__getitem__, mine))))
    launch = list(compress(rt, map(launch_name.__getitem__, map(name.__getitem__, rt))))

    def spans(uids: list[int]) -> _Spans:
        starts = list(map(ts.__getitem__, uids))
        return _Spans.union(starts, list(map(add, starts, map(dur.__getitem__, uids))))

    sync = _Spans()
    sync_labels: list[str] = []
    label_of: dict[int, int] = {}
    for u in compress(rt, map(sync_name.__getitem__, map(name.__getitem__, rt))):
        n = name[u]
        lab = label_of.get(n)
        if lab is None:
            lab = label_of[n] = len(sync_labels)
            sync_labels.append(trace.names[n])
        sync.add(ts[u], ts[u] + dur[u], lab)
    return spans(launch), spans(rt), spans(mine), sync, sync_labels


def _stage_table(trace: Any, lo: float, hi: float, steps: Sequence | None) -> tuple[list[float], list[tuple]]:
    """Step starts, and (end, kind, name) of each step of the window, by start."""
    if steps is None:
        from engine.trace.steps import find_steps
        steps = find_steps(trace)
    kept = [s for s in steps if s.ts + s.dur >= lo and s.ts <= hi]
    return [s.ts for s in kept], [(s.ts + s.dur, s.kind, s.name) for s in kept]


def classify_idle_gaps(tree: EventTree, idle: dict, lo: float, hi: float, graphs: GraphReplays | None = None,
                       noise_floor_us: float = NOISE_FLOOR_US, steps: Sequence | None = None,
                       sink: Callable[[list], Any] | None = None) -> IdleCauses:
    """Every device gap of ``idle_analysis(...)["gaps"]`` explained (see the module's docstring).
    ``steps``: the trace's ``find_steps`` (found here when not given). ``sink`` (a csv writer's
    ``writerow``) takes each row as it is made, so that a trace with a gap per kernel does not hold
    them all; without one they are kept in ``rows``."""
    gaps = idle["gaps"]
    trace = tree.trace
    ts, dur, parent, pid_col, tid_col = trace.ts, trace.dur, tree.parent, trace.pid, trace.tid
    width = len(trace.ids)
    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    # Most gaps of a GPU-bound trace are under the floor: they are counted with iterators, and what
    # only the others need (launching threads, host spans, steps) is made only when there are some.
    lengths = list(map(sub, gaps.end, gaps.start))
    above = list(map(ge, lengths, repeat(noise_floor_us)))
    below = [len(lengths) - sum(above), math.fsum(compress(lengths, map(not_, above)))]
    order = sorted(compress(range(len(lengths)), above), key=gaps.start.__getitem__)
    threads: dict[Any, set[int]] = {}  # the launching threads of each device: their launches put GPU work on it
    step_starts: list[float] = []
    step_rest: list[tuple] = []
    if order:
        gpu = tree.gpu_uids
        linked = list(compress(gpu, map(ge, map(parent.__getitem__, gpu), repeat(0))))
        launchers = list(map(parent.__getitem__, linked))
        for dev, key in set(zip(map(pid_col.__getitem__, linked),
                                map(add, map(mul, map(pid_col.__getitem__, launchers), repeat(width)),
                                    map(tid_col.__getitem__, launchers)))):
            threads.setdefault(dev, set()).add(key)
        step_starts, step_rest = _stage_table(trace, lo, hi, steps)
    spans: dict[Any, tuple] = {}  # a device's host spans, made when its first gap above the floor needs them
    empty = (_Spans(), _Spans(), _Spans(), _Spans(), [])

    rows: list[list] = []
    emit = sink if sink is not None else rows.append
    by_cause = {c: [0, 0.0] for c in CAUSES}
    by_drain = {"sync_drain": [0, 0.0], "no_sync": [0, 0.0]}
    by_host = {h: [0, 0.0] for h in HOST_CLASSES}
    by_stage: dict[str, dict[str, float]] = {}
    excluded_us = 0.0
    for i in order:
        s, e = gaps.start[i], gaps.end[i]
        length = lengths[i]
        before, after = gaps.before[i], gaps.after[i]
        dev = pid_col[after]
        got = spans.get(dev)
        if got is None:
            got = spans[dev] = _host_spans(tree, threads[dev]) if dev in threads else empty
        launch, rt, host, sync, sync_labels = got
        inside_graph = graphs.excluded_overlap(trace.pid_of(after), s, e) if graphs is not None else 0.0
        k = sync.containing(s, SYNC_SLACK_US)
        drain = "sync_drain" if k >= 0 and sync.starts[k] <= s else "no_sync"
        sync_call = sync_labels[sync.labels[k]] if drain == "sync_drain" else ""
        in_launch = launch.overlap(s, e)
        in_rt = rt.overlap(s, e)
        in_host = host.overlap(s, e)
        shares = (in_launch, max(in_rt - in_launch, 0.0), max(in_host - in_rt, 0.0), max(length - in_host, 0.0))
        host_class = HOST_CLASSES[shares.index(max(shares))]
        lau = parent[after]
        if lau >= 0 and not runtime[trace.kind[lau]]:
            lau = -1
        call = dur[lau] if lau >= 0 else None
        latency = (ts[after] - ts[lau] - dur[lau]) if lau >= 0 else None
        prequeued = lau >= 0 and ts[lau] + dur[lau] <= s
        if inside_graph >= length * 0.5:
            cause = "graph_unrecorded"
        elif drain == "sync_drain":
            cause = "sync_drain"
        elif prequeued:
            cause = "queued_not_started"
        elif latency is not None and latency > LAUNCH_LATENCY_SHARE * length:
            cause = "launch_latency"
        else:
            cause = "host_" + host_class
        t_stage = ts[lau] if lau >= 0 else s
        j = bisect.bisect_right(step_starts, t_stage) - 1
        stage, step = ("none", "")
        if j >= 0 and step_rest[j][0] >= t_stage:
            stage, step = step_rest[j][1], step_rest[j][2]
        emit([trace.pid_of(after), trace.end_of(before), trace.ts_of(after), length, trace.name_of(before),
                     trace.name_of(after), cause, drain, sync_call, host_class, round(shares[0], 3),
                     round(shares[1], 3), round(shares[2], 3), round(shares[3], 3),
                     round(call, 3) if call is not None else "", round(latency, 3) if latency is not None else "",
                     prequeued, stage, step])
        c = by_cause[cause]
        c[0] += 1
        c[1] += length
        if cause == "graph_unrecorded":
            excluded_us += length
            continue
        by_drain[drain][0] += 1
        by_drain[drain][1] += length
        by_host[host_class][0] += 1
        by_host[host_class][1] += length
        st = by_stage.setdefault(stage, {})
        st[cause] = st.get(cause, 0.0) + length
    classified = math.fsum(v[1] for k, v in by_cause.items() if k != "graph_unrecorded")

    def table(d: dict) -> dict:
        return {k: {"gaps": n, "idle_us": round(us, 3), "pct": round(us / classified * 100.0, 2) if classified else 0.0}
                for k, (n, us) in d.items() if n}

    summary = {"noise_floor_us": noise_floor_us,
               "gaps_classified": sum(v[0] for k, v in by_cause.items() if k != "graph_unrecorded"),
               "idle_classified_us": round(classified, 3),
               "below_noise_floor": {"gaps": below[0], "idle_us": round(below[1], 3)},
               "graph_unrecorded": {"gaps": by_cause["graph_unrecorded"][0], "idle_us": round(excluded_us, 3)},
               "by_cause": table({k: v for k, v in by_cause.items() if k != "graph_unrecorded"}),
               "by_drain": table(by_drain), "by_host": table(by_host),
               "by_stage": {st: {k: round(v, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}
                            for st, d in by_stage.items()}}
    return IdleCauses(rows, summary)


def summary_line(rank: Any, summary: dict, top: int = 4) -> str:
    """One line for the terminal and the text summary."""
    ranked: Sequence = sorted(summary["by_cause"].items(), key=lambda kv: -kv[1]["idle_us"])[:top]
    parts = ", ".join(f"{k} {v['pct']:.0f}% ({v['idle_us'] / 1e3:.3f} ms)" for k, v in ranked)
    line = (f"rank {rank}: idle gaps >= {summary['noise_floor_us']:g} us: {summary['gaps_classified']} gaps, "
            f"{summary['idle_classified_us'] / 1e3:.3f} ms: {parts or 'none'}")
    g = summary["graph_unrecorded"]
    if g["gaps"]:
        line += (f"; {g['idle_us'] / 1e3:.3f} ms in {g['gaps']} gaps inside graph replays whose kernels are not in "
                 f"the trace, not counted as idle")
    return line

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
import re
from dataclasses import dataclass
from itertools import accumulate, compress, islice
from operator import gt, sub
from functools import partial
from typing import Any, Sequence, TextIO

import numpy as np

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
    rows: list[tuple]  # CSV_COLUMNS, device by device, each by start (none kept when written out)
    summary: dict


class _Columns:
    """Disjoint spans sorted by start as numpy columns, with running lengths (``_Spans`` for the
    classification, which asks about all gaps at once)."""

    __slots__ = ("starts", "ends", "cum")

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """The union of intervals given in start order: a span ends where the running maximum of
        the ends falls before the next start."""
        n = len(starts)
        if not n:
            self.starts = self.ends = np.zeros(0)
            self.cum = np.zeros(1)
            return
        reach = np.maximum.accumulate(ends)
        breaks = np.flatnonzero(starts[1:] > reach[:-1]) + 1
        self.starts = starts[np.concatenate(([0], breaks))]
        self.ends = reach[np.concatenate((breaks - 1, [n - 1]))]
        self.cum = np.concatenate(([0.0], np.cumsum(self.ends - self.starts)))


def _host_spans(tree: EventTree, threads: set[int]) -> tuple[_Columns, _Columns, _Columns, _Spans, list[str]]:
    """Unions of the given threads' launch calls, runtime calls, all host events, and sync calls,
    on numpy views of the trace's columns."""
    trace = tree.trace
    ts, dur = _np(trace.ts, np.float64), _np(trace.dur, np.float64)
    kind, name = _np(trace.kind, np.uint32), _np(trace.name, np.uint32)
    pid, tid = _np(trace.pid, np.uint32), _np(trace.tid, np.uint32)
    runtime = np.frombuffer(trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS), dtype=np.uint8).astype(bool)
    launch_name = np.frombuffer(bytearray(is_launch_call(n) for n in trace.names), dtype=np.uint8).astype(bool)
    sync_name = np.frombuffer(bytearray(is_sync_call(n) for n in trace.names), dtype=np.uint8).astype(bool)
    hosts = _np(tree.host_order, np.int32)  # by start
    keys = pid[hosts].astype(np.int64) * len(trace.ids) + tid[hosts]
    mine = hosts[np.isin(keys, np.fromiter(threads, dtype=np.int64))]
    rt = mine[runtime[kind[mine]]]
    launch = rt[launch_name[name[rt]]]

    def spans(uids: np.ndarray) -> _Columns:
        starts = ts[uids]
        return _Columns(starts, starts + dur[uids])

    sync = _Spans()
    sync_labels: list[str] = []
    label_of: dict[int, int] = {}
    for u in rt[sync_name[name[rt]]].tolist():
        n = trace.name[u]
        lab = label_of.get(n)
        if lab is None:
            lab = label_of[n] = len(sync_labels)
            sync_labels.append(trace.names[n])
        sync.add(trace.ts[u], trace.ts[u] + trace.dur[u], lab)
    return spans(launch), spans(rt), spans(mine), sync, sync_labels


def _stage_table(trace: Any, lo: float, hi: float, steps: Sequence | None) -> tuple[list[float], list[tuple]]:
    """Step starts, and (end, kind, name) of each step of the window, by start."""
    if steps is None:
        from engine.trace.steps import find_steps
        steps = find_steps(trace)
    kept = [s for s in steps if s.ts + s.dur >= lo and s.ts <= hi]
    return [s.ts for s in kept], [(s.ts + s.dur, s.kind, s.name) for s in kept]


def _np(column: Any, dtype: Any) -> np.ndarray:
    """A trace column (an ``array``) as a numpy view, no copy."""
    return np.frombuffer(column, dtype=dtype) if len(column) else np.zeros(0, dtype=dtype)


def classify_idle_gaps(tree: EventTree, idle: dict, lo: float, hi: float, graphs: GraphReplays | None = None,
                       noise_floor_us: float = NOISE_FLOOR_US, steps: Sequence | None = None,
                       out: TextIO | None = None) -> IdleCauses:
    """Every device gap of ``idle_analysis(...)["gaps"]`` explained (see the module's docstring).
    ``steps``: the trace's ``find_steps`` (found here when not given). ``out`` (a text file) gets
    the CSV, header first, a chunk of gaps at a time, so that a trace with a gap per kernel does not
    hold them all; without it the rows are kept in ``rows``. Rows come device by device, each
    device's by start. The gaps are classified a column at a time on numpy views of the trace's
    columns: a host-bound trace has a gap per kernel, and a Python step per gap and column cost as
    much as the rest of the analysis."""
    gaps = idle["gaps"]
    trace = tree.trace
    start, end = _np(gaps.start, np.float64), _np(gaps.end, np.float64)
    lengths = end - start
    above = lengths >= noise_floor_us
    below = [int(len(lengths) - np.count_nonzero(above)), float(lengths[~above].sum())]
    order = np.flatnonzero(above)
    order = order[np.argsort(start[order], kind="stable")]
    rows: list[list] = []
    if out is not None:
        out.write(",".join(CSV_COLUMNS) + "\r\n")
    emit = partial(_write_columns, out) if out is not None else (lambda columns: rows.extend(zip(*columns)))
    acc = _Totals()
    if len(order):
        parent, pid = _np(tree.parent, np.int32), _np(trace.pid, np.uint32)
        tid = _np(trace.tid, np.uint32)
        width = len(trace.ids)
        # the launching threads of each device: their launches put GPU work on it
        gpu = _np(tree.gpu_uids, np.int32)
        par = parent[gpu]
        linked = par >= 0
        dev_of = pid[gpu[linked]].astype(np.int64)
        launcher = par[linked]
        thread_of = pid[launcher].astype(np.int64) * width + tid[launcher]
        threads: dict[int, set[int]] = {}
        for key in np.unique(dev_of * (width * width + 1) + thread_of).tolist():
            threads.setdefault(key // (width * width + 1), set()).add(key % (width * width + 1))
        step_starts, step_rest = _stage_table(trace, lo, hi, steps)
        devs = pid[_np(gaps.after, np.int32)[order]]
        for dev in np.unique(devs).tolist():
            idx = order[devs == dev]
            none = _Columns(np.zeros(0), np.zeros(0))
            spans = _host_spans(tree, threads[dev]) if dev in threads else (none, none, none, _Spans(), [])
            for k in range(0, len(idx), _CHUNK):
                emit(_classify_chunk(tree, gaps, idx[k:k + _CHUNK], spans, graphs, step_starts, step_rest, acc))
    return IdleCauses(rows, acc.summary(noise_floor_us, below))


_CHUNK = 5000  # gaps classified (and their rows held) at a time
_STAGE_NONE = "none"


class _Totals:
    """Idle time and gap counts by cause, drain, host activity and stage."""

    def __init__(self) -> None:
        self.by_cause = {c: [0, 0.0] for c in CAUSES}
        self.by_drain = {"sync_drain": [0, 0.0], "no_sync": [0, 0.0]}
        self.by_host = {h: [0, 0.0] for h in HOST_CLASSES}
        self.by_stage: dict[str, dict[str, float]] = {}

    @staticmethod
    def _add(table: dict, labels: Sequence[str], codes: np.ndarray, lengths: np.ndarray) -> None:
        counts = np.bincount(codes, minlength=len(labels)).tolist()
        sums = np.bincount(codes, weights=lengths, minlength=len(labels)).tolist()
        for label, n, us in zip(labels, counts, sums):
            if n:
                t = table.setdefault(label, [0, 0.0])
                t[0] += n
                t[1] += us

    def add(self, cause: np.ndarray, drained: np.ndarray, host: np.ndarray, stage: np.ndarray,
            stage_names: list[str], lengths: np.ndarray) -> None:
        """Codes: ``cause`` into CAUSES, ``host`` into HOST_CLASSES, ``stage`` into ``stage_names``."""
        self._add(self.by_cause, CAUSES, cause, lengths)
        kept = cause != 0  # graph_unrecorded: not idle, in no other total
        self._add(self.by_drain, ("no_sync", "sync_drain"), drained[kept].astype(np.int64), lengths[kept])
        self._add(self.by_host, HOST_CLASSES, host[kept], lengths[kept])
        pair = stage[kept] * len(CAUSES) + cause[kept]
        sums = np.bincount(pair, weights=lengths[kept], minlength=len(stage_names) * len(CAUSES)).tolist()
        counts = np.bincount(pair, minlength=len(stage_names) * len(CAUSES)).tolist()
        for k, (n, us) in enumerate(zip(counts, sums)):
            if n:
                st = self.by_stage.setdefault(stage_names[k // len(CAUSES)], {})
                c = CAUSES[k % len(CAUSES)]
                st[c] = st.get(c, 0.0) + us

    def summary(self, noise_floor_us: float, below: list) -> dict:
        graph = self.by_cause["graph_unrecorded"]
        kept = {k: v for k, v in self.by_cause.items() if k != "graph_unrecorded"}
        classified = math.fsum(v[1] for v in kept.values())

        def table(d: dict) -> dict:
            return {k: {"gaps": n, "idle_us": round(us, 3),
                        "pct": round(us / classified * 100.0, 2) if classified else 0.0} for k, (n, us) in d.items() if n}

        return {"noise_floor_us": noise_floor_us, "gaps_classified": sum(v[0] for v in kept.values()),
                "idle_classified_us": round(classified, 3),
                "below_noise_floor": {"gaps": below[0], "idle_us": round(below[1], 3)},
                "graph_unrecorded": {"gaps": graph[0], "idle_us": round(graph[1], 3)},
                "by_cause": table(kept), "by_drain": table(self.by_drain), "by_host": table(self.by_host),
                "by_stage": {st: {k: round(v, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}
                             for st, d in self.by_stage.items()}}


def _overlaps(spans: _Columns, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How much of each [a[i], b[i]] the spans cover (``_Spans.overlap`` of every interval at once)."""
    if not len(spans.starts):
        return np.zeros(len(a))
    st, en, cum = spans.starts, spans.ends, spans.cum
    first = np.searchsorted(en, a, "right")  # the first span ending after a
    stop = np.searchsorted(st, b, "left")  # spans starting before b: [.., stop)
    head = np.maximum(a - np.append(st, np.inf)[first], 0.0)
    tail = np.maximum(en[stop - 1] - b, 0.0)
    return np.maximum(cum[stop] - cum[first] - head - tail, 0.0)  # none inside (first >= stop): 0


def _classify_chunk(tree: EventTree, gaps: Any, idx: np.ndarray, spans: tuple, graphs: GraphReplays | None,
                    step_starts: list[float], step_rest: list[tuple], acc: _Totals) -> list[list]:
    """The CSV columns of the gaps ``idx`` (one device's, by start), made a column at a time."""
    trace = tree.trace
    ts, dur = _np(trace.ts, np.float64), _np(trace.dur, np.float64)
    kind, parent = _np(trace.kind, np.uint32), _np(tree.parent, np.int32)
    launch, rt, host, sync, sync_labels = spans
    S, E = _np(gaps.start, np.float64)[idx], _np(gaps.end, np.float64)[idx]
    L = E - S
    B, A = _np(gaps.before, np.int32)[idx], _np(gaps.after, np.int32)[idx]
    n = len(idx)
    # what the host did: union overlaps, launch within runtime within all host events
    in_launch, in_rt, in_host = _overlaps(launch, S, E), _overlaps(rt, S, E), _overlaps(host, S, E)
    shares = np.stack([in_launch, np.maximum(in_rt - in_launch, 0.0), np.maximum(in_host - in_rt, 0.0),
                       np.maximum(L - in_host, 0.0)], axis=1)
    host_code = shares.argmax(axis=1)  # the first largest share
    # a sync call spanning the gap's start
    if sync.starts:
        K = np.searchsorted(np.asarray(sync.starts), S, "right") - 1
        drained = (K >= 0) & (np.asarray(sync.ends)[K] + SYNC_SLACK_US >= S)
        label_of = np.asarray(sync.labels)[K]
        sync_calls = [sync_labels[k] if d else "" for k, d in zip(label_of.tolist(), drained.tolist())]
    else:
        drained, sync_calls = np.zeros(n, dtype=bool), [""] * n
    # the launch of the kernel after the gap
    runtime = np.frombuffer(trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS), dtype=np.uint8)
    P = parent[A]
    has = P >= 0
    has[has] = runtime[kind[P[has]]].astype(bool)
    Pc = np.where(has, P, 0)
    call = np.where(has, dur[Pc], np.nan)
    latency = np.where(has, ts[A] - ts[Pc] - dur[Pc], np.nan)
    prequeued = has & (ts[Pc] + dur[Pc] <= S)
    if graphs is not None and graphs.excluded:
        ids, pid = trace.ids, trace.pid
        inside = np.array([graphs.excluded_overlap(ids[pid[a]], s, e) for a, s, e in zip(A.tolist(), S.tolist(),
                                                                                       E.tolist())])
    else:
        inside = np.zeros(n)
    cause = np.select([inside >= 0.5 * L, drained, prequeued, has & (latency > LAUNCH_LATENCY_SHARE * L)],
                      [0, 1, 2, 3], default=4 + host_code)
    # the step whose host span holds the launch (else the gap's start)
    stage_names = [_STAGE_NONE] + sorted({r[1] for r in step_rest})
    if step_starts:
        T = np.where(has, ts[Pc], S)
        J = np.searchsorted(np.asarray(step_starts), T, "right") - 1
        held = (J >= 0) & (np.asarray([r[0] for r in step_rest])[J] >= T)
        kind_code = np.asarray([stage_names.index(r[1]) for r in step_rest])
        stage = np.where(held, kind_code[J], 0)
        names_of_steps = [r[2] for r in step_rest]
        step_names = [names_of_steps[j] if h else "" for j, h in zip(J.tolist(), held.tolist())]
    else:
        stage, step_names = np.zeros(n, dtype=np.int64), [""] * n
    acc.add(cause, drained, host_code, stage, stage_names, L)

    # the rows' columns
    names, name_col, ids, pid = trace.names, trace.name, trace.ids, trace.pid
    a_list, b_list = A.tolist(), B.tolist()
    r3 = np.round(shares, 3)

    def text(values: np.ndarray) -> list:
        return ["" if v != v else v for v in np.round(values, 3).tolist()]  # NaN (no launch): empty

    return [list(map(ids.__getitem__, map(pid.__getitem__, a_list))), (ts[B] + dur[B]).tolist(), ts[A].tolist(),
            L.tolist(), list(map(names.__getitem__, map(name_col.__getitem__, b_list))),
            list(map(names.__getitem__, map(name_col.__getitem__, a_list))),
            np.asarray(CAUSES, dtype=object)[cause].tolist(),
            np.where(drained, "sync_drain", "no_sync").tolist(), sync_calls,
            np.asarray(HOST_CLASSES, dtype=object)[host_code].tolist(), *(r3[:, k].tolist() for k in range(4)),
            text(call), text(latency), prequeued.tolist(), np.asarray(stage_names, dtype=object)[stage].tolist(),
            step_names]


def _csv_text(value: str) -> str:
    """A CSV field as the csv module writes it (quoted only when it must be)."""
    if any(c in value for c in ',"\r\n'):
        return '"' + value.replace('"', '""') + '"'
    return value


_QUOTE = (0, 4, 5, 8, 18)  # the columns that may hold a comma: device, before, after, sync_call, step
_LINE = ",".join(["%s"] * len(CSV_COLUMNS)) + "\r\n"


def _write_columns(out: TextIO, columns: list[list]) -> None:
    """Rows given as columns, written as csv.writer writes them (minimal quoting, CRLF) at twice its
    speed: the text fields that may need quoting are quoted once per distinct value, each line is
    formatted in one operation (str of a float is its repr, as the csv module writes it)."""
    if not columns or not columns[0]:
        return
    columns = list(columns)
    for k in _QUOTE:
        quoted = {v: _csv_text(v) if isinstance(v, str) else v for v in set(columns[k])}
        columns[k] = list(map(quoted.__getitem__, columns[k]))
    out.writelines(map(_LINE.__mod__, zip(*columns)))


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

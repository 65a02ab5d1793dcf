"""GPU timeline (TraceLens ``gpu_timeline``): computation, exposed communication, exposed memcpy,
busy and idle time from the union of GPU-event intervals."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from engine.trace.load import Event, Trace
from engine.trace.tree import EventSeq

COMM_RE = re.compile(r"nccl|rccl|cross_device_reduce", re.IGNORECASE)
_ROCM_COPY = ("MEMORY_COPY_", "__amd_rocclr_copyBuffer")


_COMM_NAMES: dict[str, bool] = {}


def is_comm(e: Event) -> bool:
    if e.cat not in ("kernel", "gpu_memset"):
        return False
    hit = _COMM_NAMES.get(e.name)
    if hit is None:  # kernel names repeat thousands of times: search each once
        hit = _COMM_NAMES[e.name] = COMM_RE.search(e.name) is not None
    return hit


def is_memcpy(e: Event) -> bool:
    return e.cat == "gpu_memcpy" or (e.cat == "kernel" and e.name.startswith(_ROCM_COPY))


def _union_sorted(sorted_ivs: Iterable[tuple[float, float]]) -> float:
    """Length of the union of intervals given in start order: merged spans summed in time order
    (the arithmetic TraceLens's numbers come from)."""
    total = 0.0
    cs = ce = None
    for s, e in sorted_ivs:
        if ce is not None and s <= ce:
            if e > ce:
                ce = e
        else:
            if ce is not None:
                total += ce - cs  # type: ignore[operator]
            cs, ce = s, e
    if ce is not None:
        total += ce - cs  # type: ignore[operator]
    return total


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    return _union_sorted(sorted(intervals))


def busy_time(events: Iterable[Event]) -> float:
    return union_length((e.ts, e.ts + e.dur) for e in events)


def _uids(gpu_events: Sequence[Event]) -> tuple[Trace | None, Sequence[int]]:
    if isinstance(gpu_events, EventSeq):
        return gpu_events.trace, gpu_events.uids
    return (gpu_events[0].trace if gpu_events else None), [e.uid for e in gpu_events]


def gpu_timeline(gpu_events: Sequence[Event]) -> list[tuple[str, float, float]]:
    """Rows (type, time ms, percent of total) in TraceLens's order. Each bucket is sorted once;
    the unions of several buckets merge already sorted runs. Reads the trace's columns."""
    trace, uids = _uids(gpu_events)
    if trace is None or not uids:
        raise ValueError("No GPU events found in the trace")
    comp: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    mem: list[tuple[float, float]] = []
    bucket_of: dict[tuple[int, int], list] = {}  # (kind, name) -> its bucket: names repeat thousands of times
    kind, name_ix, ts, dur = trace.kind, trace.name, trace.ts, trace.dur
    for u in uids:
        key = (kind[u], name_ix[u])
        bucket = bucket_of.get(key)
        if bucket is None:
            ev = Event(trace, u)
            bucket = bucket_of[key] = mem if is_memcpy(ev) else comm if is_comm(ev) else comp
        start = ts[u]
        bucket.append((start, start + dur[u]))
    comp.sort()
    comm.sort()
    mem.sort()
    comp_t = _union_sorted(comp)
    cc = sorted(comp + comm)  # timsort merges the two sorted runs
    comp_comm = _union_sorted(cc)
    busy = _union_sorted(sorted(cc + mem))
    start = min(ts[u] for u in uids)
    end = max(ts[u] + dur[u] for u in uids)
    total = end - start
    values = [
        ("computation_time", comp_t),
        ("exposed_comm_time", comp_comm - comp_t),
        ("exposed_memcpy_time", busy - comp_comm),
        ("busy_time", busy),
        ("idle_time", total - busy),
        ("total_time", total),
        ("total_comm_time", _union_sorted(comm)),
        ("total_memcpy_time", _union_sorted(mem)),
    ]
    return [(name, v / 1000.0, (v / total * 100.0) if total else 0.0) for name, v in values]

"""The critical path of each step: the chain of host and device work that set the step's length.

A step runs from the start of its annotation (host) to the later of the annotation's end and the end
of the GPU work its launches issued. Its critical path is walked backwards from that end, always to
the dependency that finished last (the one the work waited for), as a longest path through the
step's dependency graph is (HTA's critical path analysis builds that graph; this walks it without
building it):

* a GPU event depends on the previous GPU event of its stream (streams run in order) and on its
  launch call: whichever finished later bound it. The previous event: the path stays on the GPU
  (the time between the two is ``gpu_wait``: queued work not yet started). The launch: the path
  moves to the host at the launch's return (the time from there to the kernel's start is
  ``launch_latency``).
* on the host, time runs back along the annotation's thread; a synchronising call there (see
  ``engine.trace.idle_causes.is_sync_call``) that a GPU event ended during waited for that event:
  the path moves to it (the sync's time after the event ended is ``sync_wait``). Host time is
  ``host_launch`` inside launch calls, ``host_other`` outside them.

The segments add up to the step's length (``path_us``); ``bound`` is ``gpu`` when GPU events make up
half of it or more, ``host`` otherwise.
"""

from __future__ import annotations

import bisect
from collections import Counter
from itertools import compress, islice, repeat
from operator import add, eq, mul
from typing import Any, Sequence

from engine.trace.idle_causes import _Spans, is_launch_call, is_sync_call
from engine.trace.tree import RUNTIME_CATS, EventTree

COLUMNS = ["step", "kind", "start_us", "path_us", "bound", "gpu_us", "gpu_wait_us", "launch_latency_us",
           "host_launch_us", "host_other_us", "sync_wait_us", "before_step_us", "kernels_on_path", "top_kernels"]
_SEGMENTS = ("gpu_us", "gpu_wait_us", "launch_latency_us", "host_launch_us", "host_other_us", "sync_wait_us",
             "before_step_us")


class _Thread:
    """One host thread: its runtime calls by start, its launch-call spans, its sync calls by end.
    Filtered with iterators, not a Python step per host event."""

    def __init__(self, tree: EventTree, key: int) -> None:
        trace = tree.trace
        kind, name, ts, dur, pid, tid = trace.kind, trace.name, trace.ts, trace.dur, trace.pid, trace.tid
        width = len(trace.ids)
        runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
        launch_name = bytearray(is_launch_call(n) for n in trace.names)
        sync_name = bytearray(is_sync_call(n) for n in trace.names)
        hosts = tree.host_order
        calls = list(compress(hosts, map(runtime.__getitem__, map(kind.__getitem__, hosts))))
        keys = map(add, map(mul, map(pid.__getitem__, calls), repeat(width)), map(tid.__getitem__, calls))
        self.calls: list[int] = list(compress(calls, map(eq, keys, repeat(key))))  # by start
        self.call_starts = list(map(ts.__getitem__, self.calls))
        launches = list(compress(self.calls, map(launch_name.__getitem__, map(name.__getitem__, self.calls))))
        starts = list(map(ts.__getitem__, launches))
        self.launch = _Spans.union(starts, list(map(add, starts, map(dur.__getitem__, launches))))
        syncs = sorted((ts[u] + dur[u], ts[u]) for u in
                       compress(self.calls, map(sync_name.__getitem__, map(name.__getitem__, self.calls))))
        self.sync_ends = [e for e, _ in syncs]
        self.sync_starts = [s for _, s in syncs]


class CriticalPaths:
    """What the walks of one trace share: each GPU event's predecessor on its stream, and the GPU
    events by end time."""

    def __init__(self, tree: EventTree) -> None:
        self.tree = tree
        trace = tree.trace
        ts, dur, pid, tid = trace.ts, trace.dur, trace.pid, trace.tid
        by_stream: dict[tuple[int, int], list[int]] = {}
        for g in tree.gpu_uids:
            by_stream.setdefault((pid[g], tid[g]), []).append(g)
        self.prev: dict[int, int] = {}
        for uids in by_stream.values():
            uids.sort(key=ts.__getitem__)
            self.prev.update(zip(islice(uids, 1, None), uids))
        gpu = tree.gpu_uids
        ends = list(map(add, map(ts.__getitem__, gpu), map(dur.__getitem__, gpu)))
        order = sorted(range(len(gpu)), key=ends.__getitem__)
        self.end_times = list(map(ends.__getitem__, order))
        self.end_uids = list(map(gpu.__getitem__, order))
        self.threads: dict[int, _Thread] = {}

    def thread(self, key: int) -> _Thread:
        th = self.threads.get(key)
        if th is None:
            th = self.threads[key] = _Thread(self.tree, key)
        return th

    def step(self, name: str, kind: str, uid: int, start: float, end: float) -> dict:
        """The critical path of the step annotated by event ``uid`` over [start, end]."""
        tree = self.tree
        trace = tree.trace
        ts, dur, parent = trace.ts, trace.dur, tree.parent
        th = self.thread(trace.pid[uid] * len(trace.ids) + trace.tid[uid])
        i, j = bisect.bisect_left(th.call_starts, start), bisect.bisect_right(th.call_starts, end)
        work = [g for u in th.calls[i:j] for g in tree.gpu_uids_of(u)]
        seg = dict.fromkeys(_SEGMENTS, 0.0)
        on_path: Counter = Counter()
        n_kernels = 0
        last = max(work, key=lambda g: ts[g] + dur[g]) if work else -1
        t_end = max(end, ts[last] + dur[last]) if work else end
        t = t_end
        at_gpu = bool(work) and ts[last] + dur[last] > end
        g = last
        for _ in range(4 * (len(work) + len(th.sync_ends)) + 16):
            if t <= start:
                break
            if at_gpu:
                k_start = ts[g]
                part = min(ts[g] + dur[g], t) - max(k_start, start)
                if part > 0:
                    seg["gpu_us"] += part
                    on_path[trace.name[g]] += part
                    n_kernels += 1
                t = max(k_start, start)
                if t <= start:
                    break
                p = self.prev.get(g, -1)
                p_end = ts[p] + dur[p] if p >= 0 else float("-inf")
                lau = parent[g]
                l_end = ts[lau] + dur[lau] if lau >= 0 else float("-inf")
                if p >= 0 and p_end >= l_end and p_end <= t:
                    seg["gpu_wait_us"] += t - max(p_end, start)
                    g, t = p, max(p_end, start)
                    continue
                if lau >= 0:  # a kernel may start before its launch call returns: then no latency
                    back = max(min(l_end, t), start)
                    seg["launch_latency_us"] += t - back
                    t = back
                    at_gpu = False
                    continue
                break  # neither a predecessor nor a launch: what is left is before_step_us
            # on the host at t: back to the last sync that ended by t
            k = bisect.bisect_right(th.sync_ends, t) - 1
            s_end = th.sync_ends[k] if k >= 0 else start
            if s_end <= start:
                self._host(th, seg, start, t)
                t = start
                break
            self._host(th, seg, s_end, t)
            s_start = th.sync_starts[k]
            m = bisect.bisect_right(self.end_times, s_end + 1.0) - 1  # the GPU event the sync waited for
            waited = self.end_uids[m] if m >= 0 and self.end_times[m] >= s_start else -1
            if waited >= 0:
                w_end = min(self.end_times[m], s_end)
                seg["sync_wait_us"] += s_end - w_end
                g, t, at_gpu = waited, w_end, True
            else:  # the sync did not wait for the GPU: host time like any other
                self._host(th, seg, max(s_start, start), s_end)
                t = max(s_start, start)
        if t > start:
            seg["before_step_us"] += t - start
        path = t_end - start
        gpu_share = seg["gpu_us"] / path if path > 0 else 0.0
        names = trace.names
        return {"step": name, "kind": kind, "start_us": start, "path_us": round(path, 3),
                "bound": "gpu" if gpu_share >= 0.5 else "host", **{k: round(v, 3) for k, v in seg.items()},
                "kernels_on_path": n_kernels,
                "top_kernels": "; ".join(names[n] for n, _ in on_path.most_common(3))}

    @staticmethod
    def _host(th: _Thread, seg: dict, a: float, b: float) -> None:
        if b <= a:
            return
        launch = th.launch.overlap(a, b)
        seg["host_launch_us"] += launch
        seg["host_other_us"] += (b - a) - launch


def step_critical_paths(tree: EventTree, steps: Sequence[Any], lo: float, hi: float) -> list[dict]:
    """One row (``COLUMNS``) per step annotation of the window (``find_steps``' StepInfo)."""
    kept = [s for s in steps if s.ts + s.dur >= lo and s.ts <= hi]
    if not kept:
        return []
    paths = CriticalPaths(tree)
    return [paths.step(s.name, s.kind, s.uid, s.ts, s.ts + s.dur) for s in kept]


def summary(rows: Sequence[dict]) -> dict:
    """Totals over the steps: how many each side bound, and the path's time by segment."""
    out: dict[str, Any] = {"steps": len(rows), "gpu_bound": sum(1 for r in rows if r["bound"] == "gpu"),
                           "host_bound": sum(1 for r in rows if r["bound"] == "host")}
    total = sum(r["path_us"] for r in rows)
    out["path_us"] = round(total, 3)
    out["segments_us"] = {k: round(sum(r[k] for r in rows), 3) for k in _SEGMENTS}
    by_kind: dict[str, dict] = {}
    for r in rows:
        d = by_kind.setdefault(r["kind"], {"steps": 0, "gpu_bound": 0, "host_bound": 0})
        d["steps"] += 1
        d[r["bound"] + "_bound"] += 1
    out["by_kind"] = by_kind
    return out


def summary_line(rank: Any, s: dict) -> str:
    seg = s["segments_us"]
    total = s["path_us"] or 1.0
    host = seg["host_launch_us"] + seg["host_other_us"]
    return (f"rank {rank}: critical path of {s['steps']} steps: {s['gpu_bound']} GPU-bound, {s['host_bound']} "
            f"host-bound; of {total / 1e3:.3f} ms, GPU {seg['gpu_us'] / total * 100:.0f}%, host "
            f"{host / total * 100:.0f}% (launch calls {seg['host_launch_us'] / total * 100:.0f}%), launch latency "
            f"{seg['launch_latency_us'] / total * 100:.0f}%, sync wait {seg['sync_wait_us'] / total * 100:.0f}%, "
            f"GPU queue wait {seg['gpu_wait_us'] / total * 100:.0f}%")

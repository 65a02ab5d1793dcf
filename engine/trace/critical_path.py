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
from typing import Any, Sequence

import numpy as np

from engine.trace.idle_causes import _np, _Spans, is_launch_call, is_sync_call
from engine.trace.tree import RUNTIME_CATS, EventTree

COLUMNS = ["step", "kind", "start_us", "path_us", "bound", "gpu_us", "gpu_wait_us", "launch_latency_us",
           "host_launch_us", "host_other_us", "sync_wait_us", "before_step_us", "kernels_on_path", "top_kernels"]
_SEGMENTS = ("gpu_us", "gpu_wait_us", "launch_latency_us", "host_launch_us", "host_other_us", "sync_wait_us",
             "before_step_us")


class _Thread:
    """One host thread: its runtime calls by start, its launch-call spans, its sync calls by end, and
    the GPU events its calls launched (by launch time, with their ends). Worked out on numpy views of
    the trace's columns, not a Python step per event."""

    def __init__(self, tree: EventTree, key: int) -> None:
        trace = tree.trace
        ts, dur = _np(trace.ts, np.float64), _np(trace.dur, np.float64)
        kind, name = _np(trace.kind, np.uint32), _np(trace.name, np.uint32)
        pid, tid = _np(trace.pid, np.uint32), _np(trace.tid, np.uint32)
        width = len(trace.ids)
        runtime = np.frombuffer(trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS), dtype=np.uint8).astype(bool)
        launch_name = np.frombuffer(bytearray(is_launch_call(n) for n in trace.names), dtype=np.uint8).astype(bool)
        sync_name = np.frombuffer(bytearray(is_sync_call(n) for n in trace.names), dtype=np.uint8).astype(bool)
        hosts = _np(tree.host_order, np.int32)  # by start
        calls = hosts[runtime[kind[hosts]]]
        calls = calls[pid[calls].astype(np.int64) * width + tid[calls] == key]
        launches = calls[launch_name[name[calls]]]
        self.launch = _Spans.union(ts[launches].tolist(), (ts[launches] + dur[launches]).tolist())
        syncs = calls[sync_name[name[calls]]]
        by_end = np.argsort(ts[syncs] + dur[syncs], kind="stable")
        self.sync_ends = (ts[syncs] + dur[syncs])[by_end].tolist()
        self.sync_starts = ts[syncs][by_end].tolist()
        # the GPU events launched from this thread, by launch time
        gpu = _np(tree.gpu_uids, np.int32)
        parent = _np(tree.parent, np.int32)[gpu]
        linked = parent >= 0
        gpu, parent = gpu[linked], parent[linked]
        mine = (pid[parent].astype(np.int64) * width + tid[parent] == key) & runtime[kind[parent]]
        gpu, parent = gpu[mine], parent[mine]
        order = np.argsort(ts[parent], kind="stable")
        self.work = gpu[order]
        self.work_launch = ts[parent][order]
        self.work_end = (ts[self.work] + dur[self.work])


class CriticalPaths:
    """What the walks of one trace share: each GPU event's predecessor on its stream, and the GPU
    events by end time."""

    def __init__(self, tree: EventTree) -> None:
        self.tree = tree
        trace = tree.trace
        ts, dur = _np(trace.ts, np.float64), _np(trace.dur, np.float64)
        gpu = _np(tree.gpu_uids, np.int32)
        stream = _np(trace.pid, np.uint32)[gpu].astype(np.int64) * len(trace.ids) + _np(trace.tid, np.uint32)[gpu]
        by_stream = gpu[np.lexsort((ts[gpu], stream))]  # stream by stream, each by start (ties: uid order)
        same = stream[np.lexsort((ts[gpu], stream))]
        same = same[1:] == same[:-1]
        self.prev: dict[int, int] = dict(zip(by_stream[1:][same].tolist(), by_stream[:-1][same].tolist()))
        ends = ts[gpu] + dur[gpu]
        by_end = np.argsort(ends, kind="stable")
        self.end_times = ends[by_end].tolist()
        self.end_uids = gpu[by_end].tolist()
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
        i, j = np.searchsorted(th.work_launch, start, "left"), np.searchsorted(th.work_launch, end, "right")
        n_work = int(j - i)  # the GPU events this step's launches issued
        seg = dict.fromkeys(_SEGMENTS, 0.0)
        on_path: dict[int, float] = {}
        n_kernels = 0
        last = int(th.work[i + int(np.argmax(th.work_end[i:j]))]) if n_work else -1
        t_end = max(end, ts[last] + dur[last]) if n_work else end
        t = t_end
        at_gpu = bool(n_work) and ts[last] + dur[last] > end
        g = last
        prev_of, name_col, inf = self.prev.get, trace.name, float("-inf")
        gpu_us = wait_us = 0.0
        for _ in range(4 * (n_work + len(th.sync_ends)) + 16):
            if t <= start:
                break
            if at_gpu:
                while True:  # along the GPU while a kernel's predecessor on its stream bound it
                    k_start = ts[g]
                    k_end = k_start + dur[g]
                    part = (k_end if k_end < t else t) - (k_start if k_start > start else start)
                    if part > 0:
                        gpu_us += part
                        n = name_col[g]
                        on_path[n] = on_path.get(n, 0.0) + part
                        n_kernels += 1
                    t = k_start if k_start > start else start
                    if t <= start:
                        break
                    p = prev_of(g, -1)
                    lau = parent[g]
                    l_end = ts[lau] + dur[lau] if lau >= 0 else inf
                    if p >= 0:
                        p_end = ts[p] + dur[p]
                        if l_end <= p_end <= t:
                            back = p_end if p_end > start else start
                            wait_us += t - back
                            g, t = p, back
                            continue
                    break
                if t <= start:
                    break
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
        seg["gpu_us"] += gpu_us
        seg["gpu_wait_us"] += wait_us
        path = t_end - start
        gpu_share = seg["gpu_us"] / path if path > 0 else 0.0
        names = trace.names
        return {"step": name, "kind": kind, "start_us": start, "path_us": round(path, 3),
                "bound": "gpu" if gpu_share >= 0.5 else "host", **{k: round(v, 3) for k, v in seg.items()},
                "kernels_on_path": n_kernels,
                "top_kernels": "; ".join(names[n] for n, _ in Counter(on_path).most_common(3))}

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

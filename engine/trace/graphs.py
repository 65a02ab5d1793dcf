"""CUDA/HIP graph replays in a trace, and the GPU time a replay whose kernels were not recorded
would have filled.

A graph launch (``cudaGraphLaunch``, ``hipGraphLaunch``, ``cuGraphLaunch``) runs every node of the
graph, so it puts at least one GPU event on the device; the profiler links each of them to the
launch by its correlation id. Under continuous replay the profiler's activity buffers overflow and
only some replays are recorded: a replay with no GPU event linked to it ran, but is invisible, and
the GPU looks idle where it was busy (TraceLens issue 728: 26% "idle" on a graph decode that was
99% busy). Where the GPU events carry a graph id (CUPTI's ``graph id`` / ``graph node id``), a replay
that recorded fewer distinct nodes than its graph showed in another replay is partial.

Where would the missing work have run? A stream runs its work in launch order, so a replay launched
at L ran after the GPU work launched before L finished and before the GPU work launched after L
started: the device's idle time between those two points is not idle, and is left out of it
(``GraphReplays.excluded``). A window that holds GPU events linked to no launch is not excluded:
those may be the replay's kernels, recorded without their link.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from engine.trace.tree import RUNTIME_CATS, EventTree

_GRAPH_ID_KEYS = ("graph id", "graphId", "graph_id")
_NODE_ID_KEYS = ("graph node id", "graphNodeId", "graph_node_id")


def is_graph_launch(name: str) -> bool:
    return "GraphLaunch" in name


@dataclass
class GraphReplays:
    """The graph launches of one trace within a window."""

    launches: int = 0
    recorded: int = 0  # replays with at least one GPU event linked
    empty: list[int] = field(default_factory=list)  # launch uids with no GPU event linked
    partial: list[int] = field(default_factory=list)  # fewer distinct nodes than their graph showed elsewhere
    kernels_min: int = 0  # GPU events per recorded replay
    kernels_max: int = 0
    graphs: int = 0  # distinct graph ids seen (0: the GPU events carry none)
    unlinked_windows: int = 0  # missing replays whose window holds unlinked GPU events: not excluded
    excluded: dict[Any, list[tuple[float, float]]] = field(default_factory=dict)  # device pid -> merged spans

    @property
    def missing(self) -> int:
        return len(self.empty) + len(self.partial)

    def excluded_overlap(self, pid: Any, start: float, end: float) -> float:
        """How much of [start, end] on device ``pid`` lies inside a missing replay's span."""
        spans = self.excluded.get(pid)
        if not spans:
            return 0.0
        i = bisect.bisect_right(spans, (start, float("inf"))) - 1
        i = max(i, 0)
        total = 0.0
        while i < len(spans) and spans[i][0] < end:
            lo, hi = spans[i]
            total += max(0.0, min(hi, end) - max(lo, start))
            i += 1
        return total

    def to_dict(self) -> dict:
        return {"launches": self.launches, "recorded": self.recorded, "empty": len(self.empty),
                "partial": len(self.partial), "kernels_per_recorded_replay": [self.kernels_min, self.kernels_max],
                "graph_ids": self.graphs, "missing_with_unlinked_gpu_events": self.unlinked_windows}


def _first(args: dict | None, keys: tuple[str, ...]) -> Any:
    if not args:
        return None
    for k in keys:
        if k in args:
            return args[k]
    return None


def graph_replays(tree: EventTree, lo: float, hi: float) -> GraphReplays:
    """The graph replays launched in [lo, hi] and, for those whose GPU events are missing, the
    spans of device time they occupied. Costs one pass over the host events; the spans are worked
    out only when a replay is missing."""
    trace = tree.trace
    out = GraphReplays()
    graph_names = bytearray(is_graph_launch(n) for n in trace.names)
    if not any(graph_names):  # the usual case: no pass over the events
        return out
    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    kind, name, ts = trace.kind, trace.name, trace.ts
    launches = [u for u in tree.host_order if graph_names[name[u]] and runtime[kind[u]] and lo <= ts[u] <= hi]
    out.launches = len(launches)
    if not launches:
        return out
    counts = []
    nodes_of_graph: dict[Any, set] = {}
    replay_nodes: list[tuple[int, Any, set]] = []
    for u in launches:
        gpu = tree.gpu_uids_of(u)
        if not len(gpu):
            out.empty.append(u)
            continue
        counts.append(len(gpu))
        gid, nodes = None, set()
        for g in gpu:
            args = trace.args_of(g)
            gid = _first(args, _GRAPH_ID_KEYS) if gid is None else gid
            node = _first(args, _NODE_ID_KEYS)
            if node is not None:
                nodes.add(node)
        if gid is not None and nodes:
            nodes_of_graph.setdefault(gid, set()).update(nodes)
            replay_nodes.append((u, gid, nodes))
    out.recorded = len(counts)
    out.kernels_min, out.kernels_max = (min(counts), max(counts)) if counts else (0, 0)
    out.graphs = len(nodes_of_graph)
    out.partial = [u for u, gid, nodes in replay_nodes if len(nodes) < len(nodes_of_graph[gid])]
    if out.missing:
        _exclusion_spans(tree, out)
    return out


def _exclusion_spans(tree: EventTree, out: GraphReplays) -> None:
    """For each missing replay: from the end of the GPU work launched before it to the start of the
    GPU work launched after it, on the device its neighbours ran on."""
    trace = tree.trace
    ts, dur, parent = trace.ts, trace.dur, tree.parent
    linked = sorted((ts[parent[g]], g) for g in tree.gpu_uids if parent[g] >= 0)
    by_device: dict[Any, list[tuple[float, int]]] = {}
    for lt, g in linked:
        by_device.setdefault(trace.pid_of(g), []).append((lt, g))
    all_times = [lt for lt, _ in linked]
    unlinked: dict[Any, list[float]] = {}
    for g in tree.gpu_uids:
        if parent[g] < 0:
            unlinked.setdefault(trace.pid_of(g), []).append(ts[g])
    for v in unlinked.values():
        v.sort()
    tables = {}
    for pid, rows in by_device.items():
        times = [lt for lt, _ in rows]
        prefix_end, best = [], float("-inf")
        for _, g in rows:
            best = max(best, ts[g] + dur[g])
            prefix_end.append(best)
        suffix_start, low = [0.0] * len(rows), float("inf")
        for i in range(len(rows) - 1, -1, -1):
            low = min(low, ts[rows[i][1]])
            suffix_start[i] = low
        tables[pid] = (times, prefix_end, suffix_start)
    spans: dict[Any, list[tuple[float, float]]] = {}
    for u in out.empty + out.partial:
        launch_ts = ts[u]
        gpu = tree.gpu_uids_of(u)
        if len(gpu):
            pid = trace.pid_of(gpu[0])
        elif linked:  # the device of the GPU work launched nearest before it (else after it)
            i = bisect.bisect_left(all_times, launch_ts)
            pid = trace.pid_of(linked[i - 1 if i > 0 else 0][1])
        else:
            continue
        times, prefix_end, suffix_start = tables[pid]
        i = bisect.bisect_left(times, launch_ts)  # work launched before this replay: [0, i)
        j = bisect.bisect_right(times, launch_ts)  # after it: [j, ...)
        start = prefix_end[i - 1] if i > 0 else None
        end = suffix_start[j] if j < len(times) else None
        if len(gpu):  # a partial replay: its own recorded events are inside the span
            start = min(start, min(ts[g] for g in gpu)) if start is not None else min(ts[g] for g in gpu)
            last = max(ts[g] + dur[g] for g in gpu)
            end = max(end, last) if end is not None else last
        if start is None or end is None or end <= start:
            continue
        if not len(gpu):
            starts = unlinked.get(pid, [])
            k = bisect.bisect_right(starts, start)
            if k < len(starts) and starts[k] < end:
                out.unlinked_windows += 1
                continue
        spans.setdefault(pid, []).append((start, end))
    for pid, items in spans.items():
        items.sort()
        merged: list[tuple[float, float]] = []
        for s, e in items:
            if merged and s <= merged[-1][1]:
                if e > merged[-1][1]:
                    merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        out.excluded[pid] = merged

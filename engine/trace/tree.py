"""The event tree as TraceLens's Trace2Tree builds it (tracelens-reference §1.3).

* Host call stacks: ``cpu_op``, ``cuda_runtime``, ``cuda_driver`` events sorted by start,
  one stack per (pid, tid); an event's parent is the innermost still-open event. An event that
  starts inside the stack top but ends after it ("bleed") becomes the top's sibling when the
  overlap is under 1 us, and is dropped from the tree otherwise.
* Launch -> GPU: a runtime/driver event links to the GPU event whose (pid, tid, key) equals the
  ``ac2g`` end flow's (pid, tid, id), where both flow ends must exist and key is ``correlation``
  (or ``External id`` on traces whose launches carry no correlation). Graph launches link every
  GPU event that carries their key.
* Every linked GPU event is appended to ``gpu_events`` of its launch and of all its ancestors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from engine.trace.load import Event, Trace

HOST_CATS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "hipGraphLaunch", "cudaGraphLaunch_v10000"})
BLEED_US = 1.0


@dataclass
class EventTree:
    trace: Trace
    link_key: str  # "correlation" or "External id"
    cpu_roots: list[Event] = field(default_factory=list)
    host_events: list[Event] = field(default_factory=list)  # in the tree, sorted by (ts, -dur)
    gpu_events: list[Event] = field(default_factory=list)  # every kernel/memcpy/memset, by uid
    dropped: list[Event] = field(default_factory=list)  # bled more than 1 us out of their parent

    @property
    def linked_gpu_events(self) -> list[Event]:
        return [e for e in self.gpu_events if e.linked]

    def ancestors(self, ev: Event) -> Iterable[Event]:
        p = ev.parent
        while p is not None:
            yield p
            p = p.parent

    def launcher_cpu_op(self, gpu: Event) -> Event | None:
        """The lowest cpu_op above a GPU event (TraceLens's 'kernel launcher' parent)."""
        for a in self.ancestors(gpu):
            if a.cat == "cpu_op" and a.name != "execute":
                return a
        return None


def _neg_dur(e: Event) -> float:
    return -e.dur


def _start(e: Event) -> float:
    return e.ts


def _link_key(events: list[Event]) -> str:
    for e in events:
        if e.cat in RUNTIME_CATS and "launch" in e.name.lower():
            return "correlation" if e.corr is not None else "External id"
    return "correlation"


def build_tree(trace: Trace) -> EventTree:
    events = trace.events
    tree = EventTree(trace=trace, link_key=_link_key(events))
    host = [e for e in events if e.ph == "X" and e.cat in HOST_CATS]  # in uid order
    # Order by (ts, longer first, uid) with two stable sorts on plain float keys: a key of tuples
    # for every host event costs tens of MB on a large trace.
    host.sort(key=_neg_dur)
    host.sort(key=_start)
    stacks: dict[tuple, list[Event]] = {}
    under_cpu_op: set[int] = set()  # uids of kept events that are or sit below a cpu_op
    kept: list[Event] = []
    for ev in host:
        stack = stacks.setdefault((ev.pid, ev.tid), [])
        ts = ev.ts
        while stack and stack[-1].ts + stack[-1].dur <= ts:
            stack.pop()
        end = ts + ev.dur
        dropped = False
        while stack:
            top = stack[-1]
            top_end = top.ts + top.dur
            if end <= top_end:
                break
            if top_end - ts < BLEED_US:  # a small bleed: a sibling of the top, not a child
                stack.pop()
                continue
            dropped = True
            break
        if dropped:
            tree.dropped.append(ev)
            continue
        parent = stack[-1] if stack else None
        ev.parent = parent
        if parent is not None:
            if parent.children is None:
                parent.children = []
            parent.children.append(ev)
        parent_under = parent is not None and parent.uid in under_cpu_op
        if ev.cat == "cpu_op":
            if not parent_under:
                tree.cpu_roots.append(ev)
            under_cpu_op.add(ev.uid)
        elif parent_under:
            under_cpu_op.add(ev.uid)
        stack.append(ev)
        kept.append(ev)
    tree.host_events = kept

    # Flows and GPU events, indexed for linking.
    key = tree.link_key
    starts: set = set()
    ends: dict = {}
    gpu_by_key: dict = {}
    gpu_by_value: dict = {}
    for e in events:
        if e.ph in ("s", "f") and e.cat == "ac2g":
            if e.ph == "s":
                starts.add(e.flow_id)
            else:
                ends[e.flow_id] = e
        elif e.cat in GPU_CATS and e.ph == "X":
            tree.gpu_events.append(e)
            value = e.corr if key == "correlation" else e.ext_id
            if value is not None:
                gpu_by_key[(e.pid, e.tid, value)] = e
                gpu_by_value.setdefault(value, []).append(e)

    for ev in kept:
        if ev.cat not in RUNTIME_CATS:
            continue
        value = ev.corr if key == "correlation" else ev.ext_id
        if value is None:
            continue
        if ev.name in GRAPH_LAUNCHES:
            children = gpu_by_value.get(value, [])
        else:
            f = ends.get(value)
            if value not in starts or f is None:
                continue
            child = gpu_by_key.get((f.pid, f.tid, f.flow_id))
            children = [child] if child is not None else []
        for g in children:
            if g.linked:
                continue
            g.linked = True
            g.parent = ev
            node: Event | None = ev
            while node is not None:
                if node.gpu_events is None:
                    node.gpu_events = []
                node.gpu_events.append(g)
                node = node.parent
    return tree

"""The event tree as TraceLens's Trace2Tree builds it (tracelens-reference §1.3).

* Host call stacks: ``cpu_op``, ``cuda_runtime``, ``cuda_driver`` events sorted by start,
  one stack per (pid, tid); an event's parent is the innermost still-open event. An event that
  starts inside the stack top but ends after it ("bleed") becomes the top's sibling when the
  overlap is under 1 us, and is dropped from the tree otherwise.
* Launch -> GPU: a runtime/driver event links to the GPU event whose (pid, tid, key) equals the
  ``ac2g`` end flow's (pid, tid, id), where both flow ends must exist and key is ``correlation``
  (or ``External id`` on traces whose launches carry no correlation). Graph launches link every
  GPU event that carries their key.
* A node's ``gpu_events`` are the GPU events linked to launches in its subtree, in launch order.

Storage is by uid, in ``array`` columns (about 20 bytes an event): the parent of every event,
and the kept host events in pre-order, thread by thread. A subtree is then a contiguous run of
that order, so a node's children and GPU events are read off two per-position columns instead of
being lists on every node.
"""

from __future__ import annotations

from array import array
from itertools import accumulate, groupby, repeat
from operator import add, mul
from typing import Iterable, Iterator, Sequence

from engine.trace.load import Event, Trace

HOST_CATS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "hipGraphLaunch", "cudaGraphLaunch_v10000"})
BLEED_US = 1.0


class EventSeq(Sequence):
    """Events given by their uids, as ``Event`` views made on access."""

    __slots__ = ("trace", "uids")

    def __init__(self, trace: Trace, uids: Sequence[int]) -> None:
        self.trace = trace
        self.uids = uids

    def __len__(self) -> int:
        return len(self.uids)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [Event(self.trace, u) for u in self.uids[i]]
        return Event(self.trace, self.uids[i])

    def __iter__(self) -> Iterator[Event]:
        t = self.trace
        return (Event(t, u) for u in self.uids)

    def __repr__(self) -> str:
        return f"EventSeq({len(self.uids)} events)"


class EventTree:
    """The tree of one trace (``build_tree``). uid-level reads for whole-trace passes, and
    ``Event`` views (``cpu_roots``, ``gpu_events``, ...) for everything else."""

    def __init__(self, trace: Trace, link_key: str) -> None:
        n = len(trace.kind)
        self.trace = trace
        self.link_key = link_key  # "correlation" or "External id"
        self.parent = array("i", [-1]) * n  # parent uid of every event, -1 for none
        self.host_order = array("i")  # kept host events by (ts, longer first, uid)
        self.roots = array("i")  # cpu_ops without a cpu_op above them, in host order
        self.dropped_uids = array("i")  # host events that bled more than 1 us out of their parent
        self.gpu_uids = array("i")  # every kernel/memcpy/memset, by uid
        # Kept host events grouped by thread, each thread's in host order, which is its pre-order:
        # a subtree is the run [pos, subtree_end[pos]).
        self.preorder = array("i")
        self.subtree_end = array("i")
        self.pos = array("i", [-1]) * n  # uid -> index in preorder (-1: not a kept host event)
        # Linked GPU events ordered by their launch's pre-order position (in link order within one
        # launch); those of the subtree at pos are linked[gpu_start[pos]:gpu_start[subtree_end[pos]]].
        self.linked = array("i")
        self.gpu_start = array("i")
        self._gpu_kind = trace.kinds_where(lambda ph, cat: ph == "X" and cat in GPU_CATS)

    # ---------------------------------------------------------------- uid-level reads

    def children_of(self, uid: int) -> list[int]:
        p = self.pos[uid]
        if p < 0:
            return []
        end, order = self.subtree_end, self.preorder
        out = []
        c = p + 1
        stop = end[p]
        while c < stop:
            out.append(order[c])
            c = end[c]
        return out

    def gpu_uids_of(self, uid: int) -> array:
        """uids of the GPU events linked under this host event (empty for any other event)."""
        p = self.pos[uid]
        if p < 0:
            return array("i")
        return self.linked[self.gpu_start[p]:self.gpu_start[self.subtree_end[p]]]

    def gpu_count(self, uid: int) -> int:
        p = self.pos[uid]
        return 0 if p < 0 else self.gpu_start[self.subtree_end[p]] - self.gpu_start[p]

    def is_linked(self, uid: int) -> bool:
        return self.parent[uid] >= 0 and bool(self._gpu_kind[self.trace.kind[uid]])

    def linked_gpu_uids(self) -> array:
        parent = self.parent
        return array("i", [g for g in self.gpu_uids if parent[g] >= 0])

    # ---------------------------------------------------------------- views

    def parent_event(self, uid: int) -> Event | None:
        p = self.parent[uid]
        return Event(self.trace, p) if p >= 0 else None

    def children_events(self, uid: int) -> list[Event] | None:
        kids = self.children_of(uid)
        return [Event(self.trace, c) for c in kids] if kids else None

    def gpu_events_of(self, uid: int) -> EventSeq | None:
        uids = self.gpu_uids_of(uid)
        return EventSeq(self.trace, uids) if uids else None

    @property
    def cpu_roots(self) -> EventSeq:
        return EventSeq(self.trace, self.roots)

    @property
    def host_events(self) -> EventSeq:
        return EventSeq(self.trace, self.host_order)

    @property
    def gpu_events(self) -> EventSeq:
        return EventSeq(self.trace, self.gpu_uids)

    @property
    def dropped(self) -> EventSeq:
        return EventSeq(self.trace, self.dropped_uids)

    @property
    def linked_gpu_events(self) -> EventSeq:
        return EventSeq(self.trace, self.linked_gpu_uids())

    def ancestors(self, ev: Event) -> Iterable[Event]:
        p = self.parent[ev.uid]
        while p >= 0:
            yield Event(self.trace, p)
            p = self.parent[p]

    def launcher_cpu_op(self, gpu: Event) -> Event | None:
        """The lowest cpu_op above a GPU event (TraceLens's 'kernel launcher' parent)."""
        t = self.trace
        p = self.parent[gpu.uid]
        while p >= 0:
            if t.cat_of(p) == "cpu_op" and t.name_of(p) != "execute":
                return Event(t, p)
            p = self.parent[p]
        return None


def _link_key(trace: Trace) -> str:
    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    launch_names: dict[int, bool] = {}
    kind, name = trace.kind, trace.name
    for uid in range(len(kind)):
        if runtime[kind[uid]]:
            is_launch = launch_names.get(name[uid])
            if is_launch is None:
                is_launch = launch_names[name[uid]] = "launch" in trace.names[name[uid]].lower()
            if is_launch:
                return "correlation" if trace.corr_of(uid) is not None else "External id"
    return "correlation"


def build_tree(trace: Trace) -> EventTree:
    """The trace's event tree. The trace refers to it (weakly) for its ``Event`` views' parent,
    children and gpu_events: keep the returned tree while using those."""
    tree = EventTree(trace, _link_key(trace))
    trace.tree = tree
    _host_stacks(trace, tree)
    _link_gpu(trace, tree)
    return tree


def _host_stacks(trace: Trace, tree: EventTree) -> None:
    kind, ts, dur = trace.kind, trace.ts, trace.dur
    host_kind = trace.kinds_where(lambda ph, cat: ph == "X" and cat in HOST_CATS)
    cpu_op_kind = trace.kinds_where(lambda ph, cat: cat == "cpu_op")
    host = trace.uids_of(host_kind)  # in uid order
    # Order by (ts, longer first, uid) with two stable sorts on plain float keys: a key of tuples
    # for every host event costs tens of MB on a large trace.
    host.sort(key=dur.__getitem__, reverse=True)  # reverse keeps equal keys in uid order
    host.sort(key=ts.__getitem__)
    # Then group by thread (stable again): each thread's stack runs over its own events, and
    # each thread's kept events, in this order, are its pre-order.
    thread = array("Q", map(add, map(mul, trace.pid, repeat(len(trace.ids))), trace.tid))  # (pid, tid) as one int
    by_thread = sorted(host, key=thread.__getitem__)

    parent, pos, preorder, subtree_end = tree.parent, tree.pos, tree.preorder, tree.subtree_end
    dropped = bytearray(len(kind))
    is_root = bytearray(len(kind))
    under_cpu_op = bytearray(len(kind))  # kept events that are or sit below a cpu_op
    kept = 0  # = len(preorder)
    for _, run in groupby(by_thread, key=thread.__getitem__):  # one thread at a time
        stack: list[int] = []  # open events, as positions in preorder
        stack_end: list[float] = []  # their end times
        for uid in run:
            start = ts[uid]
            while stack_end and stack_end[-1] <= start:
                subtree_end[stack.pop()] = kept
                stack_end.pop()
            end = start + dur[uid]
            bled = False
            while stack_end:
                top_end = stack_end[-1]
                if end <= top_end:
                    break
                if top_end - start >= BLEED_US:
                    bled = True
                    break
                subtree_end[stack.pop()] = kept  # a small bleed: a sibling of the top, not a child
                stack_end.pop()
            if bled:
                dropped[uid] = 1
                continue
            p = preorder[stack[-1]] if stack else -1
            parent[uid] = p
            parent_under = p >= 0 and under_cpu_op[p]
            if cpu_op_kind[kind[uid]]:
                is_root[uid] = not parent_under
                under_cpu_op[uid] = 1
            elif parent_under:
                under_cpu_op[uid] = 1
            stack.append(kept)
            stack_end.append(end)
            pos[uid] = kept
            preorder.append(uid)
            subtree_end.append(-1)
            kept += 1
        for p in stack:  # still open at the end of the trace
            subtree_end[p] = kept
    del by_thread, thread
    tree.host_order = array("i", [uid for uid in host if not dropped[uid]])
    tree.roots = array("i", [uid for uid in host if is_root[uid]])
    tree.dropped_uids = array("i", [uid for uid in host if dropped[uid]])


def _link_gpu(trace: Trace, tree: EventTree) -> None:
    """Link launches to GPU events (through the ac2g flow pair, or by key for graph launches)."""
    kind = trace.kind
    FLOW_START, FLOW_END, GPU = 1, 2, 3
    role = bytearray(FLOW_START if (ph, cat) == ("s", "ac2g") else FLOW_END if (ph, cat) == ("f", "ac2g")
                     else GPU if ph == "X" and cat in GPU_CATS else 0 for ph, cat in trace.kinds)
    key_of = trace.corr_of if tree.link_key == "correlation" else trace.ext_of
    # One dict for both ends of the flows: flow id -> 2 * (uid of its end event, -1 while none)
    # + (1 once its start was seen). A second table would cost as much again.
    flows: dict = {}
    gpu_by_value: dict = {}  # link key value -> GPU uid, or a list of uids (uid order) when several
    for uid in trace.uids_of(role):
        r = role[kind[uid]]
        if r == FLOW_START:
            fid = trace.flow_of(uid)
            flows[fid] = flows.get(fid, -2) | 1
        elif r == FLOW_END:
            fid = trace.flow_of(uid)
            flows[fid] = 2 * uid + (flows.get(fid, -2) & 1)
        else:
            tree.gpu_uids.append(uid)
            value = key_of(uid)
            if value is not None:
                seen = gpu_by_value.get(value)
                if seen is None:
                    gpu_by_value[value] = uid
                elif type(seen) is int:
                    gpu_by_value[value] = [seen, uid]
                else:
                    seen.append(uid)

    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    parent, pos, names, name, ids, pid, tid = tree.parent, tree.pos, trace.names, trace.name, trace.ids, trace.pid, trace.tid
    linked: list[int] = []
    launch_pos: list[int] = []
    for uid in tree.host_order:
        if not runtime[kind[uid]]:
            continue
        value = key_of(uid)
        if value is None:
            continue
        if names[name[uid]] in GRAPH_LAUNCHES:
            seen = gpu_by_value.get(value, ())
            children = [seen] if type(seen) is int else seen
        else:
            flow = flows.get(value, -2)
            if flow < 0 or not flow & 1:
                continue  # no end, or no start
            f = flow >> 1
            # The GPU event with the flow end's (pid, tid, id); the last one if several.
            seen = gpu_by_value.get(trace.flow_of(f), ())
            children = ()
            for g in ([seen] if type(seen) is int else reversed(seen)):
                if ids[pid[g]] == ids[pid[f]] and ids[tid[g]] == ids[tid[f]]:
                    children = (g,)
                    break
        for g in children:
            if parent[g] >= 0:
                continue  # already linked to an earlier launch
            parent[g] = uid
            linked.append(g)
            launch_pos.append(pos[uid])
    del flows, gpu_by_value
    # Linked events by launch position (a stable sort: link order within a launch), and where
    # each position's run starts.
    tree.linked = array("i", map(linked.__getitem__, sorted(range(len(linked)), key=launch_pos.__getitem__)))
    counts = [0] * (len(tree.preorder) + 1)
    for p in launch_pos:
        counts[p + 1] += 1
    tree.gpu_start = array("i", accumulate(counts))

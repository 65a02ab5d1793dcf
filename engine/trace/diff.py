"""Two torch-profiler traces side by side: per op and per kernel, time, calls, share and (on a GPU
trace with a known arch) the roofline figures, A against B, matched by name *and* call site.

One pass per trace (``profile_trace``): load, event tree, then one walk that gives every host event
its call site (``CallSites``: the chain of ``cpu_op`` names above it, under the chain of
``user_annotation`` spans that enclose its top-level op; step annotations and step counters such
as ``step_3`` or ``ProfilerStep#4`` are left out, so that the same op in two steps is one row),
and sums:

* **GPU trace** (launches linked to GPU events): an *op* is a kernel launcher, the lowest
  ``cpu_op`` above a GPU event (``execute`` passed through, as TraceLens does; a launch outside
  every op is its own op, named after the runtime call); its time is the sum of the durations of
  the GPU events it launched directly. A *kernel* is a GPU event keyed by its name and its
  launching op's call site. Times are GPU time; shares are of the trace's total GPU-event time.
  Roofline figures come from TraceLens's perf models (``engine.trace.perf_models``) per op call,
  summed over the calls of a row: TFLOPS/s = FLOPs / kernel time, GB/s = bytes / kernel time,
  % of roofline = roofline time / kernel time; only for ops with a model, and with an arch (from
  ``--gpu-arch`` or the trace's ``deviceProperties``) for the last.
* **CPU-only trace** (no GPU events: the built-in server on a CPU): there is no device timeline.
  An *op* is a top-level ``cpu_op`` (CPU time, its whole duration); a *kernel* is every ``cpu_op``
  with its self time (its duration less the ``cpu_op`` calls directly inside it: where the work
  is done, as the profiler's "self CPU" column). Shares are of the summed top-level time (ops) or
  self time (kernels). No roofline.

Rows are keyed by (name, call site), so the same op name called from two places stays two rows.
``diff_profiles`` matches the keys of A and B: rows in both (with A, B, delta and delta %), rows
only in A, rows only in B; movers are ordered by the absolute time delta. Two traces of different
kinds (one GPU, one CPU-only) are refused: their times measure different things.
"""

from __future__ import annotations

import gc
import math
import re
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from engine.trace.load import Trace, TraceError, load_trace
from engine.trace.tree import EventTree, build_tree

# Metrics of a row, in the order of the CSVs and the JSON (time first: what movers are ranked by).
METRICS = ("time_us", "calls", "avg_us", "share_pct", "tflops_s", "gb_s", "pct_roofline")
ROOFLINE_METRICS = ("tflops_s", "gb_s", "pct_roofline")
SEP = " > "  # between the frames of a call site, outermost first
_STEP_PREFIXES = ("ProfilerStep#", "magpie_args::")
# A step counter ("step_3", "iteration 12", "ProfilerStep#4"): numbered per step, so never a call site.
_COUNTER = re.compile(r"^[A-Za-z]+[_#\s-]?\d+$")


class TraceDiffError(TraceError):
    """Two traces that cannot be compared (a GPU trace against a CPU-only one, an empty trace)."""

    title = "trace diff"


# ----------------------------------------------------------------------------- one trace


@dataclass
class Row:
    """One (name, call site) of a trace: its summed time, calls, and the roofline sums of the
    calls that have a perf model (``model_us``: their kernel time)."""
    time_us: float = 0.0
    calls: int = 0
    flops: float = 0.0
    nbytes: float = 0.0
    roof_us: float = 0.0
    model_us: float = 0.0
    roof_model_us: float = 0.0  # kernel time of the modelled calls that have a roofline time

    def metrics(self, total_us: float) -> dict[str, Optional[float]]:
        m: dict[str, Optional[float]] = {
            "time_us": self.time_us, "calls": self.calls,
            "avg_us": self.time_us / self.calls if self.calls else None,
            "share_pct": 100.0 * self.time_us / total_us if total_us > 0 else None,
            "tflops_s": None, "gb_s": None, "pct_roofline": None}
        if self.model_us > 0:
            m["tflops_s"] = self.flops / (self.model_us * 1e-6) / 1e12
            m["gb_s"] = self.nbytes / (self.model_us * 1e-6) / 1e9 if self.nbytes > 0 else None
        if self.roof_model_us > 0:
            m["pct_roofline"] = 100.0 * self.roof_us / self.roof_model_us
        return m


Key = tuple[str, tuple[str, ...]]  # (name, call site: the frames above it, outermost first)


@dataclass
class TraceProfile:
    """What ``profile_trace`` keeps of one trace: a few hundred rows, never the events."""
    path: str
    events: int
    basis: str  # "gpu" (GPU-event time) or "cpu" (CPU time of the ops: a trace without GPU events)
    ops: dict[Key, Row]
    kernels: dict[Key, Row]
    ops_total_us: float
    kernels_total_us: float
    timeline: list[list] = field(default_factory=list)  # TraceLens gpu_timeline rows (type, time ms, percent)
    arch: Optional[str] = None
    roofline: bool = False  # whether any op had a perf model (the roofline columns mean something)
    elapsed_s: float = 0.0
    # Events counted by name for ``profile_trace(..., watch=)``: label -> count; and whether the
    # trace recorded Python frames (``python_function`` events, ``with_stack``).
    watched: dict[str, int] = field(default_factory=dict)
    python_stacks: bool = False


class CallSites:
    """Every kept host event's call site as an id into one table of (parent id, name index): the
    chain of ``cpu_op`` names above the event, under the ``user_annotation`` spans that enclose
    its top-level op. Interned: one dict look-up per event, strings only for the distinct sites."""

    def __init__(self, trace: Trace, tree: EventTree) -> None:
        self.trace = trace
        self.table: list[tuple[int, int]] = []  # id -> (parent id or -1, name index)
        self._ids: dict[tuple[int, int], int] = {}
        self._frames: dict[int, tuple[str, ...]] = {}
        n = len(trace.kind)
        self.site = array("i", [-1]) * n  # uid -> the id of (its call site + its own name); -1: none
        self._build(tree)

    def intern(self, parent: int, name: int) -> int:
        key = (parent, name)
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.table)
            self.table.append(key)
        return i

    def frames(self, site: int) -> tuple[str, ...]:
        """The names from the outermost frame down to (and with) this one."""
        hit = self._frames.get(site)
        if hit is None:
            parent, name = self.table[site]
            hit = (self.frames(parent) if parent >= 0 else ()) + (self.trace.names[name],)
            self._frames[site] = hit
        return hit

    def key(self, site: int) -> Key:
        f = self.frames(site)
        return f[-1], f[:-1]

    def _annotation_context(self, tree: EventTree) -> dict[int, int]:
        """uid of each top-level host event -> the site id of the annotation spans around it (-1: none)."""
        from engine.trace.steps import parse_step_annotation
        t = self.trace
        kind, name, ts, dur = t.kind, t.name, t.ts, t.dur
        ann_kind = t.kinds_where(lambda ph, cat: ph == "X" and cat == "user_annotation")
        keep: dict[int, bool] = {}

        def kept(i: int) -> bool:
            k = keep.get(i)
            if k is None:
                s = t.names[i]
                k = keep[i] = not (s.startswith(_STEP_PREFIXES) or _COUNTER.match(s) or parse_step_annotation(s))
            return k
        spans = [u for u in range(len(kind)) if ann_kind[kind[u]] and kept(name[u])]
        out: dict[int, int] = {}
        if not spans:
            return out
        tops = [u for u in tree.host_order if tree.parent[u] < 0]
        thread = lambda u: (t.pid[u], t.tid[u])  # noqa: E731
        by_thread: dict[tuple, list[tuple[float, int, int]]] = {}
        for u in spans:  # annotations first at equal start: a span opening with its first op encloses it
            by_thread.setdefault(thread(u), []).append((ts[u], 0, u))
        for u in tops:
            lst = by_thread.get(thread(u))
            if lst is not None:
                lst.append((ts[u], 1, u))
        for items in by_thread.values():
            items.sort(key=lambda x: (x[0], x[1], -dur[x[2]]))
            stack: list[tuple[float, int]] = []  # (end, site id) of the open spans
            for start, is_top, u in items:
                while stack and stack[-1][0] <= start:
                    stack.pop()
                if is_top:
                    if stack:
                        out[u] = stack[-1][1]
                    continue
                parent = stack[-1][1] if stack else -1
                stack.append((start + dur[u], self.intern(parent, name[u])))
        return out

    def _build(self, tree: EventTree) -> None:
        t = self.trace
        kind, name, parent, site = t.kind, t.name, tree.parent, self.site
        cpu_op = t.kinds_where(lambda ph, cat: cat == "cpu_op")
        context = self._annotation_context(tree)
        ctx = context.get
        intern = self.intern
        for uid in tree.preorder:  # parents before their children
            p = parent[uid]
            if p >= 0:
                base = site[p]
                # A launch (runtime event) under an op is not a frame of its own; only ops are.
                site[uid] = intern(base, name[uid]) if cpu_op[kind[uid]] else base
            else:
                site[uid] = intern(ctx(uid, -1), name[uid])


def profile_trace(path: Path | str, arch: Any = None, cancel: Any = None,
                  trace: Optional[Trace] = None, watch: Optional[Callable[[str], Optional[str]]] = None
                  ) -> TraceProfile:
    """One trace's ops and kernels by (name, call site). ``arch``: a ``--gpu-arch`` value (name or
    JSON file) or an arch dict; None: from the trace's ``deviceProperties`` when known.
    ``watch``: given each distinct event name, a label to count its events under (None: not
    counted); the counts land in ``watched`` (an annotation's calls, a Python function's frames)."""
    t0 = time.perf_counter()
    trace = trace if trace is not None else load_trace(path, cancel)
    if not len(trace.kind):
        raise TraceDiffError(f"{path}: no trace events (a torch-profiler trace is a {{\"traceEvents\": [...]}} "
                             "object or a list of events)")
    was = gc.isenabled()
    gc.disable()  # many small objects, no cycles (as in the report)
    try:
        tree = build_tree(trace)
        sites = CallSites(trace, tree)
        if len(tree.gpu_uids):  # GPU events, linked to their launches or not
            prof = _gpu_profile(trace, tree, sites, arch)
        else:
            prof = _cpu_profile(trace, tree, sites)
    finally:
        if was:
            gc.enable()
    prof.path, prof.events = str(path), len(trace.kind)
    prof.python_stacks = any(cat == "python_function" for _, cat in trace.kinds)
    if watch is not None:
        prof.watched = _count_names(trace, watch)
    prof.elapsed_s = round(time.perf_counter() - t0, 3)
    return prof


def _count_names(trace: Trace, watch: Callable[[str], Optional[str]]) -> dict[str, int]:
    """Host events (not the GPU-side copies of annotations) counted by the label ``watch`` gives their name."""
    labels = {i: lab for i, n in enumerate(trace.names) if (lab := watch(n)) is not None}
    out = dict.fromkeys(labels.values(), 0)
    if labels:
        host = trace.kinds_where(lambda ph, cat: ph == "X" and not cat.startswith("gpu_"))
        kind = trace.kind
        for uid, i in enumerate(trace.name):
            lab = labels.get(i)
            if lab is not None and host[kind[uid]]:
                out[lab] += 1
    return out


def _launcher(trace: Trace, tree: EventTree, g: int, cpu_op: bytearray, execute: int) -> int:
    """The op that launched GPU event ``g``: the lowest cpu_op above its launch (``execute``
    passed through), else the launch itself; -1 for an event no launch links to."""
    parent, kind, name = tree.parent, trace.kind, trace.name
    rt = parent[g]
    if rt < 0:
        return -1
    p = parent[rt]
    while p >= 0:
        if cpu_op[kind[p]] and name[p] != execute:
            return p
        p = parent[p]
    return rt


def _gpu_profile(trace: Trace, tree: EventTree, sites: CallSites, arch: Any) -> TraceProfile:
    from engine.trace.arch import resolve_arch
    from engine.trace.timeline import gpu_timeline
    arch_d = resolve_arch(arch, trace) if not isinstance(arch, dict) else arch
    name, dur, site = trace.name, trace.dur, sites.site
    cpu_op = trace.kinds_where(lambda ph, cat: cat == "cpu_op")
    try:
        execute = trace.names.index("execute")
    except ValueError:
        execute = -1
    unlinked = sites.intern(-1, _name_index(trace, "(no launch linked)"))
    by_kernel: dict[tuple[int, int], list] = {}  # (launcher site, kernel name) -> [us, calls]
    op_time: dict[int, float] = {}  # launcher uid -> direct GPU time
    total = 0.0
    for g in tree.gpu_uids:
        d = dur[g]
        total += d
        op = _launcher(trace, tree, g, cpu_op, execute)
        s = site[op] if op >= 0 else unlinked
        k = (s, name[g])
        acc = by_kernel.get(k)
        if acc is None:
            by_kernel[k] = [d, 1]
        else:
            acc[0] += d
            acc[1] += 1
        if op >= 0:
            op_time[op] = op_time.get(op, 0.0) + d
        else:
            op_time[-1 - g] = d  # an unlinked event: an op row of its own (negative: not a uid)
    kernels: dict[Key, Row] = {}
    for (s, nm), (us, calls) in by_kernel.items():
        r = kernels.setdefault((trace.names[nm], sites.frames(s)), Row())
        r.time_us += us
        r.calls += calls
    rep = _perf_report(tree, arch_d)
    ops: dict[Key, Row] = {}
    by_site: dict[int, Row] = {}
    modelled = False
    for op, us in op_time.items():
        s = site[op] if op >= 0 else unlinked
        r = by_site.get(s)
        if r is None:
            r = by_site[s] = Row()
        r.time_us += us
        r.calls += 1
        if op >= 0 and rep is not None:
            modelled |= _add_roofline(rep, op, r)
    for s, r in by_site.items():
        ops[sites.key(s)] = r
    tl = [list(x) for x in gpu_timeline(tree.linked_gpu_events)]
    return TraceProfile(path="", events=0, basis="gpu", ops=ops, kernels=kernels, ops_total_us=total,
                        kernels_total_us=total, timeline=tl, arch=(arch_d or {}).get("name"), roofline=modelled)


def _name_index(trace: Trace, text: str) -> int:
    """A name's index in the trace's table, added when absent (for rows no event is named after)."""
    try:
        return trace.names.index(text)
    except ValueError:
        trace.names.append(text)
        return len(trace.names) - 1


def _perf_report(tree: EventTree, arch: Optional[dict]) -> Any:
    from engine.trace.report import _Report
    return _Report(tree, arch, inference=False, python_frames=False)


def _add_roofline(rep: Any, op: int, row: Row) -> bool:
    """Add one op call's FLOPs, bytes and roofline time to its row (when its name has a perf
    model); whether it had one."""
    from engine.trace import perf_models as pm
    if pm.model_class(rep.trace.name_of(op)) is None:
        return False
    st, _kernels, busy = rep.perf(op, False)
    if not isinstance(st, pm.StaticMetrics) or not busy or busy <= 0:
        return False
    row.flops += st.gflops * 1e9
    row.nbytes += st.nbytes or 0.0
    row.model_us += busy
    if st.roof is not None:
        row.roof_us += st.roof
        row.roof_model_us += busy
    return True


def _cpu_profile(trace: Trace, tree: EventTree, sites: CallSites) -> TraceProfile:
    kind, dur, parent, site = trace.kind, trace.dur, tree.parent, sites.site
    cpu_op = trace.kinds_where(lambda ph, cat: cat == "cpu_op")
    ops_uids = [u for u in tree.preorder if cpu_op[kind[u]]]
    inner = {}  # op uid -> the summed durations of the ops directly inside it
    for uid in ops_uids:
        p = parent[uid]
        if p >= 0:
            inner[p] = inner.get(p, 0.0) + dur[uid]

    def rows(pairs: Any) -> tuple[dict[Key, Row], float]:
        by_site: dict[int, Row] = {}
        total = 0.0
        for uid, us in pairs:
            r = by_site.get(site[uid])
            if r is None:
                r = by_site[site[uid]] = Row()
            r.time_us += us
            r.calls += 1
            total += us
        return {sites.key(s): r for s, r in by_site.items()}, total

    ops, ops_total = rows((u, dur[u]) for u in tree.roots)  # the top-level ops: their whole duration
    # A "kernel" on the CPU: an op's self time (its duration less the ops inside it), where the work is.
    kernels, k_total = rows((u, max(0.0, dur[u] - inner.get(u, 0.0))) for u in ops_uids)
    return TraceProfile(path="", events=0, basis="cpu", ops=ops, kernels=kernels, ops_total_us=ops_total,
                        kernels_total_us=k_total)


# ----------------------------------------------------------------------------- A against B


def _delta(a: Optional[float], b: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    if a is None or b is None:
        return None, None
    d = b - a
    return d, (100.0 * d / a if a else None)


@dataclass
class DiffRow:
    name: str
    stack: tuple[str, ...]
    status: str  # "both", "only_a", "only_b"
    a: dict[str, Optional[float]]
    b: dict[str, Optional[float]]

    @property
    def time_delta(self) -> float:
        return (self.b.get("time_us") or 0.0) - (self.a.get("time_us") or 0.0)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "stack": list(self.stack), "status": self.status}
        for m in METRICS:
            a, b = self.a.get(m), self.b.get(m)
            if a is None and b is None:
                continue
            d, p = _delta(a, b)
            if self.status != "both" and m in ("time_us", "calls"):  # only in one: the delta is all of it
                d = (b or 0) - (a or 0)
            out[m] = {"a": _num(a), "b": _num(b), "delta": _num(d), "pct": _num(p)}
        return out


def _num(v: Optional[float]) -> Optional[float]:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return round(v, 6) if isinstance(v, float) else v


_EMPTY: dict[str, Optional[float]] = {}


def diff_rows(a: dict[Key, Row], b: dict[Key, Row], total_a: float, total_b: float) -> list[DiffRow]:
    """Every key of A and B, largest absolute time delta first (then the larger time, then the name)."""
    rows = []
    for key in a.keys() | b.keys():
        ra, rb = a.get(key), b.get(key)
        status = "both" if ra is not None and rb is not None else "only_a" if ra is not None else "only_b"
        rows.append(DiffRow(key[0], key[1], status, ra.metrics(total_a) if ra is not None else _EMPTY,
                            rb.metrics(total_b) if rb is not None else _EMPTY))
    rows.sort(key=lambda r: (-abs(r.time_delta), -max(r.a.get("time_us") or 0, r.b.get("time_us") or 0),
                             r.name, r.stack))
    return rows


@dataclass
class TraceDiff:
    a: TraceProfile
    b: TraceProfile
    ops: list[DiffRow]
    kernels: list[DiffRow]
    tags: tuple[str, str] = ("A", "B")

    @property
    def basis(self) -> str:
        return self.a.basis

    def timeline(self) -> list[dict]:
        ta = {r[0]: r[1] for r in self.a.timeline}
        tb = {r[0]: r[1] for r in self.b.timeline}
        out = []
        for k in list(ta) + [k for k in tb if k not in ta]:
            d, p = _delta(ta.get(k), tb.get(k))
            out.append({"type": k, "a_ms": _num(ta.get(k)), "b_ms": _num(tb.get(k)), "delta_ms": _num(d),
                        "pct": _num(p)})
        return out

    def totals(self) -> dict[str, Any]:
        def pair(a: float, b: float) -> dict:
            d, p = _delta(a, b)
            return {"a": _num(a), "b": _num(b), "delta": _num(d), "pct": _num(p)}

        def count(rows: list[DiffRow], status: str) -> int:
            return sum(1 for r in rows if r.status == status)
        return {
            "time_us": pair(self.a.kernels_total_us, self.b.kernels_total_us),
            "ops_time_us": pair(self.a.ops_total_us, self.b.ops_total_us),
            "op_calls": pair(sum(r.calls for r in self.a.ops.values()), sum(r.calls for r in self.b.ops.values())),
            "kernel_calls": pair(sum(r.calls for r in self.a.kernels.values()),
                                 sum(r.calls for r in self.b.kernels.values())),
            "ops": {"both": count(self.ops, "both"), "only_a": count(self.ops, "only_a"),
                    "only_b": count(self.ops, "only_b")},
            "kernels": {"both": count(self.kernels, "both"), "only_a": count(self.kernels, "only_a"),
                        "only_b": count(self.kernels, "only_b")},
        }

    def section(self, rows: list[DiffRow], limit: int) -> dict[str, Any]:
        """movers (every row, largest |time delta| first), and the rows only in A / only in B
        (largest time first), each cut at ``limit`` rows (the CSVs have them all)."""
        only_a = sorted((r for r in rows if r.status == "only_a"), key=lambda r: -(r.a.get("time_us") or 0))
        only_b = sorted((r for r in rows if r.status == "only_b"), key=lambda r: -(r.b.get("time_us") or 0))
        return {"movers": [r.to_dict() for r in rows[:limit]],
                "only_a": [r.to_dict() for r in only_a[:limit]],
                "only_b": [r.to_dict() for r in only_b[:limit]],
                "rows": len(rows), "unchanged": sum(1 for r in rows if r.status == "both" and r.time_delta == 0
                                                    and r.a.get("calls") == r.b.get("calls"))}

    def report(self, limit: int = 20) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "time_unit": "us of GPU-event time" if self.basis == "gpu" else "us of CPU time (a trace without GPU events)",
            "tags": list(self.tags),
            "a": _side(self.a), "b": _side(self.b),
            "roofline": self.a.roofline or self.b.roofline,
            "totals": self.totals(),
            "gpu_timeline": self.timeline(),
            "ops": self.section(self.ops, limit),
            "kernels": self.section(self.kernels, limit),
        }


def _side(p: TraceProfile) -> dict[str, Any]:
    return {"path": p.path, "events": p.events, "basis": p.basis, "arch": p.arch, "ops": len(p.ops),
            "kernels": len(p.kernels), "time_us": _num(p.kernels_total_us), "elapsed_s": p.elapsed_s}


def diff_profiles(a: TraceProfile, b: TraceProfile, tags: tuple[str, str] = ("A", "B")) -> TraceDiff:
    if a.basis != b.basis:
        kinds = {"gpu": "a GPU trace", "cpu": "a CPU-only trace (no GPU events)"}
        raise TraceDiffError(f"{a.path} is {kinds[a.basis]}, {b.path} is {kinds[b.basis]}: their times measure "
                             "different things and are not compared")
    return TraceDiff(a, b, diff_rows(a.ops, b.ops, a.ops_total_us, b.ops_total_us),
                     diff_rows(a.kernels, b.kernels, a.kernels_total_us, b.kernels_total_us), tags)


def diff_traces(path_a: Path | str, path_b: Path | str, arch: Any = None, cancel: Any = None,
                log: Callable[[str], None] = lambda s: None) -> TraceDiff:
    """Load and profile each trace (one after the other: only one trace's columns are held at a
    time), then match them."""
    a = profile_trace(path_a, arch, cancel)
    log(f"A: {a.events} events, {len(a.ops)} ops, {len(a.kernels)} kernels ({a.elapsed_s:.2f} s) {path_a}")
    b = profile_trace(path_b, arch, cancel)
    log(f"B: {b.events} events, {len(b.ops)} ops, {len(b.kernels)} kernels ({b.elapsed_s:.2f} s) {path_b}")
    return diff_profiles(a, b)


# ----------------------------------------------------------------------------- CSVs (TraceLens compare shape)


def _csv_rows(rows: list[DiffRow], tags: tuple[str, str], roofline: bool, sides: str) -> tuple[list[str], list[list]]:
    """Key columns (name, call_stack), then ``<metric>__<tagB>_diff`` / ``_pct``, then
    ``<tag>::<metric>`` (TraceLens ``compare_perf_reports_pytorch``). ``sides``: "ab" (intersect
    and the full sheet), "a" (only in the baseline), "b" (only in the variant)."""
    metrics = [m for m in METRICS if roofline or m not in ROOFLINE_METRICS]
    ta, tb = tags
    cols = ["name", "call_stack", "status"]
    if sides == "ab":
        for m in metrics:
            cols += [f"{m}__{tb}_diff", f"{m}__{tb}_pct"]
    for tag, side in ((ta, "a"), (tb, "b")):
        if side in sides:
            cols += [f"{tag}::{m}" for m in metrics]
    out = []
    for r in rows:
        line: list[Any] = [r.name, SEP.join(r.stack), r.status]
        if sides == "ab":
            for m in metrics:
                d, p = _delta(r.a.get(m), r.b.get(m))
                line += [d, p]
        for side in sides:
            vals = r.a if side == "a" else r.b
            line += [vals.get(m) for m in metrics]
        out.append(line)
    return cols, out


def write_csvs(diff: TraceDiff, out_dir: Path) -> list[Path]:
    """``gpu_timeline.csv`` (GPU traces), and for ``ops_summary`` and ``kernel_summary``: the whole
    sheet (every row, movers first), ``_intersect_<B>``, ``_only_baseline_<B>``, ``_only_variant_<B>``."""
    from engine.trace.csvout import write_csv
    out_dir.mkdir(parents=True, exist_ok=True)
    ta, tb = diff.tags
    roofline = diff.a.roofline or diff.b.roofline
    paths = []
    if diff.basis == "gpu":
        p = out_dir / "gpu_timeline.csv"
        write_csv(p, ["type", f"time ms__{tb}_diff", f"time ms__{tb}_pct", f"{ta}::time ms", f"{tb}::time ms"],
                  [[r["type"], r["delta_ms"], r["pct"], r["a_ms"], r["b_ms"]] for r in diff.timeline()])
        paths.append(p)
    for sheet, rows in (("ops_summary", diff.ops), ("kernel_summary", diff.kernels)):
        for suffix, sel, sides in (("", rows, "ab"),
                                   (f"_intersect_{tb}", [r for r in rows if r.status == "both"], "ab"),
                                   (f"_only_baseline_{tb}", sorted((r for r in rows if r.status == "only_a"),
                                                                    key=lambda r: -(r.a.get("time_us") or 0)), "a"),
                                   (f"_only_variant_{tb}", sorted((r for r in rows if r.status == "only_b"),
                                                                   key=lambda r: -(r.b.get("time_us") or 0)), "b")):
            cols, body = _csv_rows(sel, diff.tags, roofline, sides)
            p = out_dir / f"{sheet}{suffix}.csv"
            write_csv(p, cols, body)
            paths.append(p)
    return paths


# ----------------------------------------------------------------------------- terminal lines


def _fmt(v: Optional[float], spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def summary_lines(report: dict, top: int = 10) -> list[str]:
    """The diff as plain lines: totals, the largest movers of ops and kernels, the only-in lists."""
    t = report["totals"]
    unit = "GPU time" if report["basis"] == "gpu" else "CPU time"
    tt = t["time_us"]
    lines = [f"A: {report['a']['path']}", f"B: {report['b']['path']}",
             f"total {unit}: {_fmt(tt['a'], '.1f')} us -> {_fmt(tt['b'], '.1f')} us "
             f"({_fmt(tt['delta'], '+.1f')} us, {_fmt(tt['pct'], '+.2f')}%)"]
    for what in ("ops", "kernels"):
        c = t[what]
        lines.append(f"{what}: {c['both']} in both, {c['only_a']} only in A, {c['only_b']} only in B")
    for what in ("ops", "kernels"):
        sec = report[what]
        lines.append("")
        lines.append(f"largest {what} movers (B - A):")
        for r in sec["movers"][:top]:
            lines.append("  " + _row_line(r))
        for side, label in (("only_a", "only in A"), ("only_b", "only in B")):
            if sec[side]:
                lines.append(f"{what} {label}:")
                for r in sec[side][:top]:
                    lines.append("  " + _row_line(r))
    return lines


def _row_line(r: dict) -> str:
    tm, calls = r.get("time_us", {}), r.get("calls", {})
    where = f"  [{SEP.join(r['stack'])}]" if r["stack"] else ""
    pct = tm.get("pct")
    rel = {"only_a": "only A", "only_b": "only B"}.get(r.get("status"), "-") if pct is None else f"{pct:+.1f}%"
    return (f"{_fmt(tm.get('delta'), '+10.1f')} us {rel:>8}  "
            f"{_fmt(tm.get('a'), '.1f')} -> {_fmt(tm.get('b'), '.1f')} us, calls {_fmt(calls.get('a'), 'd')} -> "
            f"{_fmt(calls.get('b'), 'd')}  {r['name']}{where}")

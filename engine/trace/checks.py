"""Self-checks of a trace analysis: the numbers of the reports reconciled with the trace they
came from, so that a report a broken or partial recording would make misleading says so.

Four checks on every rank:

* ``kernel_time``: the kernel time the gap analysis reports, stream by stream, against the busy time
  of that stream (the union of its GPU events' intervals). Kernels on one stream run one after
  another, so a report total above the stream's busy time counts time twice (overlapping events: a
  recording artefact, or overlapping launches such as programmatic dependent launch). The report's
  total must be the trace's GPU events in the window, less only what the options left out. On the
  rank whose GPU timeline is reported (TraceLens's, built from the GPU events linked to a launch):
  the timeline's busy time against the union of every GPU event; GPU events linked to no launch are
  missing from the TraceLens reports.
* ``kernel_counts``: calls per kernel name in the report against a count of the event tree's GPU
  events in the same window.
* ``graph_replays``: CUDA/HIP graph launches whose GPU events are missing from the trace
  (``engine.trace.graphs``); the idle time inside them is not idle, and how much is said.
* ``steps_with_gpu_work``: with step annotations, the share of steps whose launches put no GPU
  event in the trace, and whether one GPU event holds most of the kernel time (TraceLens issue 972:
  30 of 32 decode steps without a GPU event, reported as 0.04% idle).

And each TraceLens report against its own GPU timeline (``tracelens_report``, TraceLens's sanity
check): the perf report's kernel time is at least the timeline's computation + memcpy time, and
``kernel_summary``'s calls per name equal the trace's linked kernels.

A check is ``passed`` (it says what it compared, with the numbers), ``failed`` (its warning goes
into the report, the text summary and onto the terminal) or ``skipped`` (nothing to compare).
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import compress, repeat
from operator import add, and_, eq, ge, le, lt, mul, not_
from typing import Any, Iterable, Sequence

from engine.trace.gaps import IdleGaps, KernelAgg, _matches
from engine.trace.graphs import GraphReplays
from engine.trace.timeline import union_length
from engine.trace.tree import GPU_CATS, RUNTIME_CATS, EventTree

STREAM_SLACK = 1e-3  # a stream's kernel sum may exceed its busy time by 0.1% + 1 us (clock rounding)
MISSING_SHARE = 0.01  # GPU time missing from a report beyond 1% fails
EMPTY_STEPS_SHARE = 0.5  # more than half the steps without a GPU event fails
DOMINANT_SHARE = 0.5  # one GPU event over half the kernel time of 4 or more steps fails


def _check(name: str, rank: Any, status: str, compared: str, numbers: dict, warning: str | None = None) -> dict:
    return {"check": name, "rank": rank, "status": status, "compared": compared, "numbers": numbers,
            "warning": warning}


def _us(v: float) -> str:
    return f"{v:,.1f} us" if v < 1e4 else f"{v / 1e3:,.3f} ms"


def _counted_streams(tree: EventTree, lo: float, hi: float, categories: Sequence[str], ignore: Sequence[str],
                     min_duration_us: float, whole: bool = False
                     ) -> tuple[dict, list[int], Counter, Counter, list[int], float, int]:
    """The GPU events of the window as the gap analysis counts them: per stream (their uids), the
    other events the options count (no kernel, copy or memset: on no GPU stream), per name (counted,
    and all GPU events of the window), the largest event, the time and number of GPU events left out
    by the options. ``whole``: the window is the whole trace (nothing to filter)."""
    trace = tree.trace
    kind, ts, dur, name, pid, tid = trace.kind, trace.ts, trace.dur, trace.name, trace.pid, trace.tid
    wanted = trace.kinds_where(lambda ph, cat: ph == "X" and _matches(cat, categories, ignore))
    gpu = trace.kinds_where(lambda ph, cat: ph == "X" and cat in GPU_CATS)
    # Filtered with iterators (no Python step per event): in the window, then counted by the options;
    # the usual case (the whole trace, every GPU event counted) skips both filters.
    gpu_uids = tree.gpu_uids
    if whole:
        in_window = gpu_uids
    else:
        starts = list(map(ts.__getitem__, gpu_uids))
        inside = map(and_, map(ge, map(add, starts, map(dur.__getitem__, gpu_uids)), repeat(lo)),
                     map(le, starts, repeat(hi)))
        in_window = list(compress(gpu_uids, inside))
    tree_names: Counter = Counter(map(name.__getitem__, in_window))
    if min_duration_us <= 0 and all(wanted[k] for k in range(len(trace.kinds)) if gpu[k]):
        counted, left, counted_names = in_window, [], tree_names
    else:
        keep = list(map(and_, map(wanted.__getitem__, map(kind.__getitem__, in_window)),
                        map(ge, map(dur.__getitem__, in_window), repeat(min_duration_us))))
        counted = list(compress(in_window, keep))
        left = list(compress(in_window, map(not_, keep)))
        counted_names = Counter(map(name.__getitem__, counted))
    left_out_us, left_out = math.fsum(map(dur.__getitem__, left)), len(left)
    largest = max(counted, key=dur.__getitem__) if len(counted) else -1
    width = len(trace.ids)
    keys = list(map(add, map(mul, map(pid.__getitem__, counted), repeat(width)), map(tid.__getitem__, counted)))
    streams = set(keys)
    per_stream: dict[tuple[int, int], list[int]] = {}
    if len(streams) <= 16:  # a pass with iterators per stream
        for key in streams:
            per_stream[divmod(key, width)] = list(compress(counted, map(eq, keys, repeat(key))))
    else:
        for u, key in zip(counted, keys):
            per_stream.setdefault(divmod(key, width), []).append(u)
    others: list[int] = []
    extra = [k for k in range(len(trace.kinds)) if wanted[k] and not gpu[k]]
    if extra:  # events the options count that are no kernel, copy or memset: one more pass, for them only
        extra_kinds = bytearray(len(trace.kinds))
        for k in extra:
            extra_kinds[k] = 1
        for u in trace.uids_of(extra_kinds):
            start, d = ts[u], dur[u]
            if not (start + d < lo or start > hi or d < min_duration_us):
                others.append(u)
                counted_names[name[u]] += 1
    return per_stream, others, counted_names, tree_names, [largest] if largest >= 0 else [], left_out_us, left_out


def kernel_time_check(rank: Any, tree: EventTree, aggs: dict[str, KernelAgg], idle: dict, per_stream: dict,
                      others: Sequence[int], left_out_us: float, left_out: int, timeline_rows: Sequence | None) -> dict:
    trace = tree.trace
    ts, dur = trace.ts, trace.dur
    report_us = math.fsum(a.total for a in aggs.values())
    report_n = sum(len(a.durations) for a in aggs.values())
    busy_of = {(s["device"], s["stream"]): (s["busy_us"], s["events"]) for s in idle["streams"]}
    counted_us = 0.0
    counted_n = 0
    over: list[tuple[str, float, float]] = []
    streams = 0
    busy_total = 0.0
    for (p, t), uids in per_stream.items():
        s_sum = math.fsum(map(dur.__getitem__, uids))
        counted_us += s_sum
        counted_n += len(uids)
        key = (trace.ids[p], trace.ids[t])
        busy, events = busy_of.get(key, (None, None))
        if busy is None or events != len(uids):  # the options leave some of this stream's events out
            busy = union_length((ts[u], ts[u] + dur[u]) for u in uids)
        streams += 1
        busy_total += busy
        if s_sum > busy * (1 + STREAM_SLACK) + 1.0:
            over.append((f"device {key[0]} / stream {key[1]}", s_sum, busy))
    if others:  # counted by the options, on no GPU stream: in the totals only
        counted_us += math.fsum(dur[u] for u in others)
        counted_n += len(others)
    numbers: dict[str, Any] = {"report_kernel_us": report_us, "report_events": report_n,
                               "trace_counted_us": counted_us, "trace_counted_events": counted_n,
                               "streams": streams, "streams_busy_union_us": busy_total,
                               "left_out_by_options_us": left_out_us, "left_out_by_options_events": left_out}
    problems: list[str] = []
    if over:
        over.sort(key=lambda o: -(o[1] - o[2]))
        where, s_sum, busy = over[0]
        numbers["streams_over_busy"] = [{"stream": w, "kernel_us": a, "busy_us": b} for w, a, b in over]
        problems.append(f"on {len(over)} stream(s) the report counts more kernel time than the stream was busy "
                        f"({where}: {_us(s_sum)} of kernels in {_us(busy)} busy): GPU events overlap on one stream, "
                        f"so the overlap is counted twice (a recording artefact, or overlapping launches such as "
                        f"programmatic dependent launch): per-kernel times add up to more than the GPU's time")
    if report_n != counted_n or abs(report_us - counted_us) > max(1.0, MISSING_SHARE * counted_us):
        problems.append(f"the report counts {report_n} events, {_us(report_us)}, but the trace has {counted_n} GPU "
                        f"events, {_us(counted_us)}, in the window")
    compared = (f"report kernel time {_us(report_us)} ({report_n} events) = the trace's GPU events in the window "
                f"{_us(counted_us)} ({counted_n}); on each of {streams} stream(s) at most its busy time "
                f"(union {_us(busy_total)})")
    if left_out:
        compared += f"; {left_out} GPU events ({_us(left_out_us)}) left out by the options (categories, min duration)"
    if timeline_rows:
        tl = {row[0]: row[1] * 1000.0 for row in timeline_rows}
        unlinked = list(compress(tree.gpu_uids, map(lt, map(tree.parent.__getitem__, tree.gpu_uids), repeat(0))))
        numbers["timeline_busy_us"] = tl.get("busy_time", 0.0)
        numbers["unlinked_gpu_events"] = len(unlinked)
        if unlinked:
            all_busy = union_length((ts[g], ts[g] + dur[g]) for g in tree.gpu_uids)
            missing = all_busy - tl.get("busy_time", 0.0)
            numbers["all_gpu_events_busy_us"] = all_busy
            numbers["unlinked_gpu_us"] = math.fsum(dur[g] for g in unlinked)
            if missing > max(1.0, MISSING_SHARE * all_busy):
                problems.append(f"{len(unlinked)} GPU events ({_us(numbers['unlinked_gpu_us'])}) are linked to no "
                                f"launch: the TraceLens reports leave them out, and its GPU timeline counts "
                                f"{_us(tl.get('busy_time', 0.0))} busy where the GPU events cover {_us(all_busy)}")
            compared += (f"; GPU timeline busy {_us(tl.get('busy_time', 0.0))} vs every GPU event "
                         f"{_us(all_busy)} ({len(unlinked)} linked to no launch)")
        else:
            compared += (f"; GPU timeline busy {_us(tl.get('busy_time', 0.0))}: every one of "
                         f"{len(tree.gpu_uids)} GPU events is linked to its launch")
    if problems:
        return _check("kernel_time", rank, "failed", compared, numbers, "; ".join(problems))
    return _check("kernel_time", rank, "passed", compared, numbers)


def kernel_counts_check(rank: Any, tree: EventTree, aggs: dict[str, KernelAgg], counted_names: Counter,
                        tree_names: Counter) -> dict:
    names = tree.trace.names
    tree_counts = {names[n]: c for n, c in counted_names.items()}
    report_counts = {n: len(a.durations) for n, a in aggs.items()}
    diff = sorted(((n, report_counts.get(n, 0), tree_counts.get(n, 0)) for n in set(report_counts) | set(tree_counts)
                   if report_counts.get(n, 0) != tree_counts.get(n, 0)), key=lambda d: -abs(d[1] - d[2]))
    numbers = {"kernel_names": len(report_counts), "report_events": sum(report_counts.values()),
               "tree_events": sum(tree_counts.values()), "tree_names_in_window": len(tree_names),
               "mismatched_names": len(diff)}
    compared = (f"calls of each of {len(report_counts)} kernel names in the report against the event tree's GPU "
                f"events ({sum(report_counts.values())} vs {sum(tree_counts.values())})")
    if diff:
        numbers["mismatches"] = [{"name": n, "report": a, "tree": b} for n, a, b in diff[:20]]
        shown = "; ".join(f"{n[:60]}: report {a}, tree {b}" for n, a, b in diff[:3])
        return _check("kernel_counts", rank, "failed", compared, numbers,
                      f"{len(diff)} kernel name(s) have a different number of calls in the report than GPU events "
                      f"in the trace ({shown})")
    return _check("kernel_counts", rank, "passed", compared, numbers)


def excluded_idle_us(gaps: IdleGaps, graphs: GraphReplays) -> float:
    """Device idle (every gap, whatever its length) that lies inside a missing replay's span."""
    if not graphs.excluded:
        return 0.0
    trace = gaps.tree.trace
    return math.fsum(graphs.excluded_overlap(trace.pid_of(gaps.after[i]), gaps.start[i], gaps.end[i])
                     for i in range(len(gaps)))


def graph_check(rank: Any, graphs: GraphReplays, idle: dict, excluded_us: float) -> dict:
    numbers = {**graphs.to_dict(), "idle_us": idle["total_idle_us"], "idle_excluded_us": excluded_us,
               "idle_adjusted_us": idle["total_idle_us"] - excluded_us}
    if not graphs.launches:
        return _check("graph_replays", rank, "skipped", "no CUDA/HIP graph launch in the window", numbers)
    compared = (f"{graphs.launches} graph launches: {graphs.recorded} with GPU events in the trace "
                f"({graphs.kernels_min}..{graphs.kernels_max} per replay)"
                + (f", {graphs.graphs} graph ids" if graphs.graphs else ""))
    if not graphs.missing:
        return _check("graph_replays", rank, "passed", compared + ", none missing", numbers)
    parts = []
    if graphs.empty:
        parts.append(f"{len(graphs.empty)} of {graphs.launches} graph replays have no GPU event in the trace")
    if graphs.partial:
        parts.append(f"{len(graphs.partial)} recorded fewer nodes than their graph has")
    why = ("the profiler did not record them" if not graphs.unlinked_windows else
           "not recorded, or recorded without the correlation that links them to their launch")
    warning = (", ".join(parts) + f" ({why}): {_us(excluded_us)} of the {_us(idle['total_idle_us'])} idle lies "
               f"inside those replays and is not idle; idle without it {_us(idle['total_idle_us'] - excluded_us)}")
    if graphs.unlinked_windows:
        warning += (f"; {graphs.unlinked_windows} of them have GPU events linked to no launch where they ran "
                    "(perhaps their own), so their time was not excluded")
    return _check("graph_replays", rank, "failed", compared, numbers, warning)


def steps_check(rank: Any, steps: Sequence[dict], largest: Iterable[int], tree: EventTree, report_us: float,
                graphs: GraphReplays) -> dict:
    n = len(steps)
    if not n:
        return _check("steps_with_gpu_work", rank, "skipped", "no step annotations in the window", {"steps": 0})
    empty = sum(1 for s in steps if not s["gpu_events"])
    numbers: dict[str, Any] = {"steps": n, "steps_without_gpu_events": empty}
    problems = []
    compared = f"{n - empty} of {n} steps launched GPU events that are in the trace"
    if n >= 2 and empty > EMPTY_STEPS_SHARE * n:
        why = (" (graph replays without their kernels: see graph_replays)" if graphs.empty else
               " (the profiler dropped them, or the window holds no real steps)")
        problems.append(f"{empty} of {n} steps have no GPU event in the trace{why}: the kernel and idle numbers "
                        f"describe the other {n - empty} step(s) only")
    trace = tree.trace
    for u in largest:
        share = trace.dur[u] / report_us if report_us else 0.0
        numbers["largest_gpu_event"] = {"name": trace.name_of(u), "dur_us": trace.dur_of(u),
                                        "share_of_kernel_time": share}
        compared += f"; the largest GPU event is {share * 100:.1f}% of the kernel time"
        if n >= 4 and share > DOMINANT_SHARE:
            problems.append(f"one GPU event ({trace.name_of(u)[:80]}, {_us(trace.dur[u])}) is {share * 100:.1f}% "
                            f"of the kernel time of {n} steps: a malformed event, or a window that is not steady state")
    if problems:
        return _check("steps_with_gpu_work", rank, "failed", compared, numbers, "; ".join(problems))
    return _check("steps_with_gpu_work", rank, "passed", compared, numbers)


def profiler_steps(trace: Any, lo: float, hi: float) -> list[tuple[str, float, float]]:
    """torch.profiler's own step ranges (``ProfilerStep#N``) of the window, for the step check of a
    trace without inference step annotations (a training loop). The names table is looked at first:
    no pass over the events when there are none."""
    wanted = {i for i, n in enumerate(trace.names) if n.startswith("ProfilerStep#")}
    if not wanted:
        return []
    annotation = trace.kinds_where(lambda ph, cat: ph == "X" and cat == "user_annotation")
    kind, name, ts, dur = trace.kind, trace.name, trace.ts, trace.dur
    out = [(trace.names[name[u]], ts[u], ts[u] + dur[u]) for u in range(len(kind))
           if name[u] in wanted and annotation[kind[u]] and ts[u] + dur[u] >= lo and ts[u] <= hi]
    out.sort(key=lambda s: s[1])
    return out


def run_checks(rank: Any, tree: EventTree, lo: float, hi: float, aggs: dict[str, KernelAgg], idle: dict,
               steps: Sequence[dict], graphs: GraphReplays, *, categories: Sequence[str], ignore: Sequence[str],
               min_duration_us: float, timeline_rows: Sequence | None = None, whole: bool = False
               ) -> tuple[list[dict], float]:
    """The four checks of one rank, and the idle time excluded as inside missing graph replays.
    ``whole``: the window [lo, hi] is the whole trace."""
    if not len(tree.gpu_uids):
        return _without_gpu_events(rank, tree, steps, graphs, idle), 0.0
    per_stream, others, counted_names, tree_names, largest, left_us, left_n = _counted_streams(
        tree, lo, hi, categories, ignore, min_duration_us, whole)
    excluded = excluded_idle_us(idle["gaps"], graphs)
    report_us = math.fsum(a.total for a in aggs.values())
    return [kernel_time_check(rank, tree, aggs, idle, per_stream, others, left_us, left_n, timeline_rows),
            kernel_counts_check(rank, tree, aggs, counted_names, tree_names),
            graph_check(rank, graphs, idle, excluded),
            steps_check(rank, steps, largest, tree, report_us, graphs)], excluded


def _launch_calls(tree: EventTree) -> int:
    from engine.trace.idle_causes import is_launch_call
    trace = tree.trace
    runtime = trace.kinds_where(lambda ph, cat: cat in RUNTIME_CATS)
    launch = bytearray(is_launch_call(n) for n in trace.names)
    kind, name = trace.kind, trace.name
    return sum(1 for u in tree.host_order if runtime[kind[u]] and launch[name[u]])


def _without_gpu_events(rank: Any, tree: EventTree, steps: Sequence[dict], graphs: GraphReplays, idle: dict) -> list:
    """A trace without one GPU event: a CPU-only run when nothing was launched either (nothing to
    reconcile), a recording that lost all GPU activity when launch calls are there."""
    launches = _launch_calls(tree)
    graph = graph_check(rank, graphs, idle, 0.0)
    if not launches:
        why = "the trace has no GPU event and no launch call (a CPU-only run): nothing to reconcile"
        return [_check(name, rank, "skipped", why, {"gpu_events": 0, "launch_calls": 0})
                for name in ("kernel_time", "kernel_counts")] + [graph, _check(
                    "steps_with_gpu_work", rank, "skipped", why, {"steps": len(steps), "gpu_events": 0})]
    warning = (f"the trace has {launches} launch calls but not one GPU event: the profiler recorded no GPU "
               "activity, so there is no kernel time, idle time or roofline to report")
    numbers = {"gpu_events": 0, "launch_calls": launches}
    return [_check("kernel_time", rank, "failed", f"{launches} launch calls against 0 GPU events", numbers, warning),
            _check("kernel_counts", rank, "skipped", "no GPU event to count", numbers), graph,
            steps_check(rank, steps, [], tree, 0.0, graphs)]


def tracelens_report_check(rank: Any, label: str, tables: dict, tree: EventTree | None) -> dict:
    """A TraceLens report against its own GPU timeline (TraceLens's sanity check): the kernel time of
    the perf report (``unified_perf_summary``, every op that launched computation or copies;
    collectives are reported apart) is at least the timeline's computation plus memcpy time (a sum of
    kernel times is never below their union), and, where ``kernel_summary`` is written, its calls per
    kernel name equal the linked kernels of the trace the report was made from."""
    name = f"tracelens_report ({label})"
    tl = tables.get("gpu_timeline")
    unified = tables.get("unified_perf_summary")
    if tl is None or unified is None or not len(unified):
        return _check(name, rank, "skipped", "no perf summary or GPU timeline in this report", {})
    times = {row[0]: row[1] * 1000.0 for row in tl.rows}
    kernel_us = math.fsum(v for v in unified.column("Kernel Time (µs)_sum") if isinstance(v, (int, float)))
    floor = times.get("computation_time", 0.0) + times.get("total_memcpy_time", 0.0)
    numbers: dict[str, Any] = {"perf_report_kernel_us": kernel_us, "ops": len(unified),
                               "timeline_computation_us": times.get("computation_time", 0.0),
                               "timeline_memcpy_us": times.get("total_memcpy_time", 0.0),
                               "timeline_busy_us": times.get("busy_time", 0.0)}
    compared = (f"perf report kernel time {_us(kernel_us)} ({len(unified)} op rows) >= the GPU timeline's "
                f"computation + memcpy {_us(floor)}")
    problems = []
    if kernel_us < floor * (1 - MISSING_SHARE) - 1.0:
        blank = sorted({str(n) for n, kt in zip(unified.column("name"), unified.column("Kernel Time (µs)_sum"))
                        if not isinstance(kt, (int, float)) or kt != kt or kt == 0})
        numbers["op_rows_without_kernel_time"] = blank[:20]
        why = (f"op rows whose kernel time the report left out: {', '.join(blank[:4])}"
               + (f" and {len(blank) - 4} more" if len(blank) > 4 else "")
               + " (their perf model did not take the op's arguments, e.g. a GEMM recorded without input shapes)"
               if blank else "kernels no op row accounts for")
        problems.append(f"the perf report holds {_us(kernel_us)} of kernel time but its GPU timeline counts "
                        f"{_us(floor)} of computation and copies: {_us(floor - kernel_us)} of GPU work is in no "
                        f"op of the report ({why})")
    if tree is not None:  # graph replays of this report's trace whose kernels are missing: its idle is not idle
        from engine.trace.gaps import idle_analysis, trace_window
        from engine.trace.graphs import graph_replays
        graphs = graph_replays(tree, float("-inf"), float("inf"))  # no pass over the events without graphs
        if graphs.missing:
            excluded = excluded_idle_us(idle_analysis(tree, trace_window(tree.trace))["gaps"], graphs)
            idle_us = times.get("idle_time", 0.0)
            numbers.update(graph_launches=graphs.launches, graph_replays_missing=graphs.missing,
                           timeline_idle_us=idle_us, idle_inside_unrecorded_graph_replays_us=excluded)
            problems.append(f"{graphs.missing} of {graphs.launches} graph replays in this report's trace have no GPU "
                            f"event (or fewer nodes than their graph): its GPU timeline's idle {_us(idle_us)} holds "
                            f"{_us(excluded)} inside them, which is not idle")
    ks = tables.get("kernel_summary")
    if ks is not None and tree is not None:
        report_counts: Counter = Counter()
        for k, n in zip(ks.column("Kernel name"), ks.column("Kernel duration (µs)_count")):
            report_counts[k] += int(n)
        trace = tree.trace
        kernel_kind = trace.kinds_where(lambda ph, cat: cat == "kernel")
        linked: Counter = Counter(trace.name_of(g) for g in tree.gpu_uids
                                  if tree.parent[g] >= 0 and kernel_kind[trace.kind[g]])
        diff = sorted(((k, report_counts.get(k, 0), linked.get(k, 0)) for k in set(report_counts) | set(linked)
                       if report_counts.get(k, 0) != linked.get(k, 0)), key=lambda d: -abs(d[1] - d[2]))
        numbers["kernel_summary_calls"] = sum(report_counts.values())
        numbers["linked_kernels"] = sum(linked.values())
        compared += (f"; kernel_summary calls per kernel name against the trace's linked kernels "
                     f"({sum(report_counts.values())} vs {sum(linked.values())})")
        if diff:
            numbers["mismatches"] = [{"name": k, "report": a, "tree": b} for k, a, b in diff[:20]]
            problems.append(f"{len(diff)} kernel name(s) have a different number of calls in kernel_summary than "
                            f"linked kernels in the trace (" + "; ".join(f"{k[:60]}: report {a}, tree {b}"
                                                                         for k, a, b in diff[:3]) + ")")
    if problems:
        return _check(name, rank, "failed", compared, numbers, "; ".join(problems))
    return _check(name, rank, "passed", compared, numbers)


def checks_section(checks: list[dict]) -> dict:
    failed = [c for c in checks if c["status"] == "failed"]
    return {"passed": not failed, "failed": len(failed), "checks": checks,
            "warnings": [f"rank {c['rank']}: {c['check']}: {c['warning']}" for c in failed]}


def check_lines(section: dict) -> list[str]:
    """Terminal / text-summary lines: each failed check's warning, and what each passing one compared."""
    out = []
    for c in section.get("checks", []):
        if c["status"] == "failed":
            out.append(f"WARNING trace check {c['check']} (rank {c['rank']}): {c['warning']}")
        elif c["status"] == "passed":
            out.append(f"trace check {c['check']} (rank {c['rank']}) passed: {c['compared']}")
    return out

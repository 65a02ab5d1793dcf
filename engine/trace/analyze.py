"""``magpie benchmark --trace-dir``: gap analysis, GPU idle analysis, GPU timeline and the
TraceLens-compatible reports (pytorch mode, or per inference stage when the trace carries step
annotations), written into the run's workspace, with the report sections the benchmark report
reuses (``gap_analysis``, ``tracelens_analysis``)."""

from __future__ import annotations

import csv
import gc
import os
import threading
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from engine.runs.provenance import trace_provenance
from engine.runs.schema import SCHEMA_VERSION, StageState
from engine.runs.workspace import Workspace
from engine.trace import critical_path
from engine.trace.checks import check_lines, checks_section, profiler_steps, run_checks, tracelens_report_check
from engine.trace.discover import discover_traces
from engine.trace.forked import ForkedCall
from engine.trace.gaps import (
    DEFAULT_CATEGORIES, DEFAULT_IGNORE, GAP_COLUMNS, GAP_EXTRA_COLUMNS, aggregate_kernels, gap_rows, idle_analysis,
    merge_ranks, step_launch_analysis, trace_window,
)
from engine.trace.graphs import graph_replays
from engine.trace.idle_causes import classify_idle_gaps, summary_line
from engine.trace.load import Trace, TraceCancelled, load_trace
from engine.trace.timeline import gpu_timeline
from engine.trace.tree import EventTree, build_tree

STAGES = ("prefilldecode", "decode_only", "prefill_only")


class StageTimes:
    """Wall-clock seconds by stage of the analysis, summed over ranks and inference stages:
    ``with times("load"): ...``. The report keeps them as ``stage_times_s`` (what a slow
    analysis spent its time on; ``--timings`` prints them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stage = ""
        self._t0 = 0.0

    def __call__(self, stage: str) -> "StageTimes":
        self._stage = stage
        return self

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.seconds[self._stage] = self.seconds.get(self._stage, 0.0) + time.perf_counter() - self._t0

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}


@dataclass
class TraceAnalysisOptions:
    top_k: int = 20
    start_pct: float = 0.0
    end_pct: float = 100.0
    min_duration_us: float = 0.0
    categories: Sequence[str] = DEFAULT_CATEGORIES
    ignore_categories: Sequence[str] = DEFAULT_IGNORE
    rank_csv: bool = True
    find_kernel_sources: bool = False
    kernel_source_repos: Sequence[Path] = ()
    gpu_arch: Optional[str] = None
    stages: Sequence[str] = STAGES
    tracelens: bool = True
    isl: Optional[int] = None
    osl: Optional[int] = None
    conc: Optional[int] = None
    random_range_ratio: Optional[float] = None
    num_steps: int = 32

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["kernel_source_repos"] = [str(p) for p in self.kernel_source_repos]
        d["categories"], d["ignore_categories"] = list(self.categories), list(self.ignore_categories)
        d["stages"] = list(self.stages)
        return d


@dataclass
class AnalysisResult:
    report: dict
    top_rows: list[list]
    idle: dict = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    exit_code: int = 0


def _write_csv(path: Path, header: list[str], rows: list[list], comments: Sequence[str] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        for c in comments:
            fh.write(f"# {c}\n")
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def _source_columns(rows: list[list], repos: Sequence[Path]) -> tuple[list[str], list[list], list[str]]:
    from engine.sources.finder import find_kernel_sources, to_columns
    matches = find_kernel_sources([r[0] for r in rows], [Path(p) for p in repos])
    cols: list[str] = []
    extra = []
    for r in rows:
        c = to_columns(matches[r[0]])
        cols = list(c)
        extra.append([c[k] for k in cols])
    comments = ["Repository Path Mappings: " + "; ".join(f"$REPO_DIR={p}" for p in repos),
                "Source columns come from a static index of the repositories above (nothing cloned); "
                "check 'confidence' and 'confidence_reason' before trusting a mapping."]
    return cols, [r + e for r, e in zip(rows, extra)], comments


def _gap_section(per_rank_aggs: dict[int, dict], traces: list[tuple[int, Path]], opts: TraceAnalysisOptions,
                 out_dir: Path, windows: dict) -> tuple[dict, list[list]]:
    merged = merge_ranks(per_rank_aggs)
    grand = sum(a.total for aggs in per_rank_aggs.values() for a in aggs.values())
    rows = gap_rows(merged, opts.top_k, grand)
    header = GAP_COLUMNS + GAP_EXTRA_COLUMNS
    comments: list[str] = []
    out_rows = rows
    if opts.find_kernel_sources:
        src_cols, out_rows, comments = _source_columns(rows, opts.kernel_source_repos)
        header = header + src_cols
    files = [str(_write_csv(out_dir / "gap_analysis.csv", header, out_rows, comments))]
    if opts.rank_csv:
        for rank, aggs in per_rank_aggs.items():
            rrows = gap_rows(aggs, opts.top_k)
            files.append(str(_write_csv(out_dir / f"gap_analysis_rank{rank}.csv", GAP_COLUMNS + GAP_EXTRA_COLUMNS, rrows)))
    section = {
        "enabled": True, "output_dir": str(out_dir), "output_files": files,
        "traces": {str(r): str(p) for r, p in traces}, "ranks": [r for r, _ in traces],
        "window": windows, "top_k": opts.top_k, "min_duration_us": opts.min_duration_us,
        "categories": list(opts.categories), "ignore_categories": list(opts.ignore_categories),
        "total_kernel_time_us": grand,
        "top_kernels": [dict(zip(GAP_COLUMNS + GAP_EXTRA_COLUMNS, r)) for r in rows],
    }
    return section, rows


def _idle_files(rank: int, idle: dict, steps: list[dict], out_dir: Path) -> list[str]:
    files = [_write_csv(out_dir / f"gpu_idle_streams_rank{rank}.csv",
                        ["device", "stream", "events", "span_us", "busy_us", "idle_us", "idle_pct", "gaps", "largest_gap_us"],
                        [[s[k] for k in ("device", "stream", "events", "span_us", "busy_us", "idle_us", "idle_pct", "gaps",
                                         "largest_gap_us")] for s in idle["streams"]]),
             _write_csv(out_dir / f"gpu_idle_gaps_rank{rank}.csv",
                        ["where", "start_us", "end_us", "duration_us", "before", "after", "gpu_waited_on_host",
                         "launch_delay_us", "cpu_ops_during_gap"],
                        [[g.stream, g.start, g.end, g.duration, g.before, g.after, g.host_bound, g.launch_delay_us,
                          "; ".join(g.cpu_ops)] for g in idle["largest_gaps"]])]
    if steps:
        keys = list(steps[0])
        files.append(_write_csv(out_dir / f"gpu_idle_steps_rank{rank}.csv", keys, [[s[k] for k in keys] for s in steps]))
    return [str(f) for f in files]


def _steps_for(found: list, window) -> list[tuple[str, float, float]]:
    steps = [s for s in found if s.ts + s.dur >= window.lo and s.ts <= window.hi]
    return [(s.name, s.ts, s.ts + s.dur) for s in steps]


def _tracelens_section(trace: Trace, tree: EventTree, ws_root: Path, split_dir: Path, opts: TraceAnalysisOptions,
                       log: Callable[[str], None], rank: Any = 0, times: Optional[StageTimes] = None,
                       split_job: Optional[_BackgroundSplit] = None) -> dict:
    from engine.trace.arch import resolve_arch
    from engine.trace.csvout import write_csvs
    from engine.trace.report import pytorch_report
    from engine.trace.steps import find_steps
    times = times or StageTimes()
    section: dict[str, Any] = {"enabled": True, "rank0_trace": str(trace.path), "errors": [], "warnings": [],
                               "output_dir": str(ws_root / "tracelens"), "stage_results": {}, "phase_picks": {},
                               "output_files": [], "checks": []}
    arch = resolve_arch(opts.gpu_arch, trace)
    section["gpu_arch"] = (arch or {}).get("name")
    if arch is None:
        section["warnings"].append("no GPU arch (give --gpu-arch NAME|FILE.json, or record deviceProperties): "
                                   "the roofline columns are left out")
    steps = find_steps(trace)
    if not steps:
        section["analysis_mode"] = "pytorch"
        out = ws_root / "tracelens_rank0_csvs"
        with times("tracelens report"):
            tables = pytorch_report(tree, arch)
            section["checks"].append(tracelens_report_check(rank, "pytorch", tables, tree))
        with times("tracelens CSVs"):
            section["output_files"] = [str(p) for p in write_csvs(tables, out)]
        section["output_dir"] = str(out)
        log(f"tracelens (pytorch mode): {len(tables)} tables -> {out}")
        return section
    from engine.trace.roofline_simple import simple_csv_name, write_roofline_simple
    from engine.trace.split import pick_stage_steps, split_trace
    section["analysis_mode"] = "inference"
    section["analysis_stages"] = list(opts.stages)
    section["split_dir"] = str(split_dir)
    if split_job is not None:  # started earlier, in a child process: what is left of it
        with times("tracelens split (waited for)"):
            split = split_job.result()
        times.seconds["tracelens split"] = split_job.child_s or 0.0
    else:
        with times("tracelens split"):
            split = split_trace(trace, split_dir, num_steps=opts.num_steps, conc=opts.conc, osl=opts.osl,
                                ratio=opts.random_range_ratio, output_path_base=ws_root)
    picks = pick_stage_steps(split.rows, opts.conc)
    for stage in opts.stages:
        row = picks.get(stage)
        result: dict[str, Any] = {"stage": stage, "trace_path": None, "output_dir": None, "files": [],
                                  "simple_summary_file": None, "error": None, "phase_pick": row}
        if row is None:
            result["error"] = f"no single step of stage {stage} with GPU work in the trace"
            section["stage_results"][stage] = result
            continue
        step_path = Path(row["output_path"])
        step_path = step_path if step_path.is_absolute() else ws_root / step_path
        result["trace_path"] = str(step_path)
        out = ws_root / "tracelens" / stage
        with times("tracelens stage load+tree"):
            step_trace = load_trace(step_path)
            step_tree = build_tree(step_trace)
        with times("tracelens report"):
            tables = pytorch_report(step_tree, arch, inference=True, group_by_num_kernels=True,
                                    group_by_parent_module=True)
            section["checks"].append(tracelens_report_check(rank, stage, tables, step_tree))
        with times("tracelens CSVs"):
            result["files"] = [str(p) for p in write_csvs(tables, out)]
            result["output_dir"] = str(out)
            simple = ws_root / "tracelens" / simple_csv_name(stage, opts.isl, opts.osl, opts.conc)
            result["simple_summary_file"] = str(write_roofline_simple(out, simple))
        section["stage_results"][stage] = result
        section["phase_picks"][stage] = row
        section["output_files"] += result["files"] + [result["simple_summary_file"]]
        log(f"tracelens stage {stage}: step {row.get('idx')} -> {out}")
    return section


class _BackgroundSplit:
    """The inference split (``split_trace``) run in a forked child while this process goes on with
    the idle analysis, the checks and the critical path: on two cores the split's time (the step
    traces re-encoded and compressed) mostly overlaps theirs. The child shares the loaded trace
    copy-on-write and sends back the ``SplitResult`` (or the exception) pickled through a pipe.
    Where fork is missing, or other threads run in this process (fork would copy their locks
    half-held), the split runs here when its result is asked for, as it did before."""

    def __init__(self, trace: Trace, split_dir: Path, opts: TraceAnalysisOptions, ws_root: Path) -> None:
        self.args = (trace, split_dir)
        self.kwargs = dict(num_steps=opts.num_steps, conc=opts.conc, osl=opts.osl, ratio=opts.random_range_ratio,
                           output_path_base=ws_root)
        self.workers = 1
        self.child: Optional[ForkedCall] = None
        self.child_s: Optional[float] = None  # the split's own time, in the child
        if not hasattr(os, "fork") or threading.active_count() > 1:
            return
        self.workers = 2  # in the child: half the files there, half in a child of its own
        self.child = ForkedCall(self._split, "the trace split's process")

    @property
    def pid(self) -> int:
        """The child's pid while it runs; 0 without a child or once its result is read."""
        return self.child.pid if self.child is not None else 0

    def _split(self) -> Any:
        from engine.trace.split import split_trace
        return split_trace(*self.args, **self.kwargs, workers=self.workers)

    def result(self) -> Any:
        """The ``SplitResult``; raises what the split raised."""
        if self.child is None:
            t0 = time.perf_counter()
            try:
                return self._split()
            finally:
                self.child_s = time.perf_counter() - t0
        try:
            return self.child.result()
        finally:
            self.child_s = self.child.seconds

    def stop(self) -> None:
        """End the child if it still runs (the analysis failed or was cancelled before its result)."""
        if self.child is not None:
            self.child.stop()


def summary_lines(report: dict) -> list[str]:
    """The self-checks (each failed one as a WARNING line, each passing one with what it compared) and
    the idle gaps by cause, per rank: the text summary, and what the command line prints."""
    lines = check_lines(report.get("trace_checks") or {})
    gap = report.get("gap_analysis") or {}
    for rank, causes in (gap.get("idle_causes") or {}).items():
        if causes["gaps_classified"] or causes["graph_unrecorded"]["gaps"]:
            lines.append(summary_line(rank, causes))
    for rank, paths in (gap.get("critical_path") or {}).items():
        lines.append(critical_path.summary_line(rank, paths))
    return lines


def _split_dir(ws: Workspace) -> Path:
    return (ws.root / "torch_trace" / "trace_split") if (ws.root / "torch_trace").is_dir() else ws.path("trace_split")


def _start_split(trace: Trace, ws: Workspace, opts: TraceAnalysisOptions) -> Optional[_BackgroundSplit]:
    """The inference split of the TraceLens section, started now in the background where that
    section will split: a trace with step annotations whose GPU arch resolves."""
    from engine.trace.arch import resolve_arch
    from engine.trace.steps import find_steps
    try:
        resolve_arch(opts.gpu_arch, trace)
    except Exception:  # the section fails before its split: so does this
        return None
    if not find_steps(trace):
        return None
    return _BackgroundSplit(trace, _split_dir(ws), opts, ws.root)


def _may_link(trace: Trace) -> bool:
    """The trace has GPU events and flow events (what the tree links launches to kernels by)."""
    from engine.trace.tree import GPU_CATS
    return any(trace.kinds_where(lambda ph, cat: ph == "X" and cat in GPU_CATS)) and \
        any(trace.kinds_where(lambda ph, cat: ph in ("s", "f")))


def _stop_if_cancelled(cancel: Any, where: str) -> None:
    if cancel is not None and cancel.cancelled:
        raise TraceCancelled(f"trace analysis cancelled {where} ({cancel.reason or 'cancelled'})")


def run_trace_analysis(target: Path, opts: TraceAnalysisOptions, ws: Workspace,
                       log: Callable[[str], None] = lambda s: None, cancel: Any = None) -> AnalysisResult:
    """The analysis of ``target``'s traces. ``cancel`` (a ``CancelToken``) is looked at while each
    trace loads and between the stages: ``TraceCancelled`` once it is set."""
    started: list[_BackgroundSplit] = []
    try:
        return _analyse(target, opts, ws, log, cancel, started)
    finally:
        for job in started:  # a split still running after a failure or a cancel
            job.stop()


def _analyse(target: Path, opts: TraceAnalysisOptions, ws: Workspace, log: Callable[[str], None], cancel: Any,
             started: list[_BackgroundSplit]) -> AnalysisResult:
    from engine.trace.steps import find_steps
    t0 = time.perf_counter()
    times = StageTimes()
    split_job: Optional[_BackgroundSplit] = None
    traces = discover_traces(target)
    ws.events.emit("stage", stage="discover", state=StageState.SUCCESS, traces=[str(p) for _, p in traces])
    gap_dir = ws.path("gap_analysis")
    per_rank: dict[int, dict] = {}
    windows: dict = {}
    idle_by_rank: dict = {}
    steps_by_rank: dict = {}
    timeline_rows = None
    idle_files: list[str] = []
    checks: list[dict] = []
    causes_by_rank: dict = {}
    paths_by_rank: dict = {}
    excluded_by_rank: dict = {}
    rank0_trace = rank0_tree = None
    for rank, path in traces:
        _stop_if_cancelled(cancel, f"before loading rank {rank}")
        ws.events.emit("stage", stage=f"load rank {rank}", state=StageState.RUNNING, trace=str(path))
        with times("load"):
            trace = load_trace(path, cancel)
        is_rank0 = rank0_trace is None
        if is_rank0 and opts.tracelens and _may_link(trace):
            # The split reads only the trace: started now, it overlaps every stage below (stopped
            # there if the tree links no GPU event to a launch after all).
            split_job = _start_split(trace, ws, opts)
            started += [split_job] if split_job is not None else []
        with times("kernels"):
            window = trace_window(trace, opts.start_pct, opts.end_pct)
            windows[str(rank)] = window.to_dict()
            per_rank[rank] = aggregate_kernels(trace, window, categories=opts.categories,
                                               ignore_categories=opts.ignore_categories,
                                               min_duration_us=opts.min_duration_us)
        with times("tree"):
            gc.disable()
            try:
                tree = build_tree(trace)
            finally:
                gc.enable()
        with times("idle"):
            idle = idle_analysis(tree, window)
            found_steps = find_steps(trace)
            steps = step_launch_analysis(tree, _steps_for(found_steps, window), idle["gaps"])
            idle_by_rank[rank], steps_by_rank[rank] = idle, steps
            idle_files += _idle_files(rank, idle, steps, gap_dir)
        if is_rank0:
            rank0_trace, rank0_tree = trace, tree
            linked = tree.linked_gpu_events
            if not linked and split_job is not None:  # its files would be of a section that is not written
                try:
                    split_job.result()  # (its own child writes files too: let both finish, then remove them)
                except Exception:
                    pass
                shutil.rmtree(_split_dir(ws), ignore_errors=True)
                split_job = None
            if linked:
                with times("timeline"):
                    timeline_rows = gpu_timeline(linked)
        with times("idle causes"):
            graphs = graph_replays(tree, window.lo, window.hi)
            causes_file = gap_dir / f"gpu_idle_causes_rank{rank}.csv"
            gap_dir.mkdir(parents=True, exist_ok=True)
            with open(causes_file, "w", newline="", encoding="utf-8") as fh:  # rows written as they are made
                causes = classify_idle_gaps(tree, idle, window.lo, window.hi, graphs, steps=found_steps, out=fh)
            idle_files.append(str(causes_file))
            causes_by_rank[rank] = {**causes.summary, "file": str(causes_file)}
        with times("checks"):
            check_steps = steps or step_launch_analysis(tree, profiler_steps(trace, window.lo, window.hi), idle["gaps"])
            rank_checks, excluded_by_rank[rank] = run_checks(
                rank, tree, window.lo, window.hi, per_rank[rank], idle, check_steps, graphs, categories=opts.categories,
                ignore=opts.ignore_categories, min_duration_us=opts.min_duration_us,
                timeline_rows=timeline_rows if is_rank0 else None, whole=opts.start_pct == 0 and opts.end_pct == 100)
            checks += rank_checks
        with times("critical path"):
            path_rows = critical_path.step_critical_paths(tree, found_steps, window.lo, window.hi) \
                if len(tree.gpu_uids) else []  # a CPU-only run's steps: the host's alone
        if path_rows:
            path_file = _write_csv(gap_dir / f"critical_path_rank{rank}.csv", critical_path.COLUMNS,
                                   [[r[k] for k in critical_path.COLUMNS] for r in path_rows])
            idle_files.append(str(path_file))
            paths_by_rank[rank] = {**critical_path.summary(path_rows), "file": str(path_file)}
        ws.events.emit("stage", stage=f"load rank {rank}", state=StageState.SUCCESS, events=len(trace.events))
        log(f"rank {rank}: {len(trace.events)} events, {len(tree.gpu_events)} GPU events ({path})")
    _stop_if_cancelled(cancel, "after loading the traces")
    n_kernels = sum(len(a.durations) for aggs in per_rank.values() for a in aggs.values())
    with times("gap CSVs"):
        gap, rows = _gap_section(per_rank, traces, opts, gap_dir, windows)
    gap["idle"] = {str(r): {"total_idle_us": i["total_idle_us"], "host_bound_idle_us": i["host_bound_idle_us"],
                            "host_bound_idle_pct": i["host_bound_idle_pct"],
                            "launch_bound_steps": sum(1 for s in steps_by_rank[r] if s["launch_bound"]),
                            "steps": len(steps_by_rank[r]),
                            "idle_inside_unrecorded_graph_replays_us": excluded_by_rank[r],
                            "idle_without_unrecorded_graph_replays_us": i["total_idle_us"] - excluded_by_rank[r]}
                   for r, i in idle_by_rank.items()}
    gap["idle_causes"] = {str(r): c for r, c in causes_by_rank.items()}
    if paths_by_rank:
        gap["critical_path"] = {str(r): c for r, c in paths_by_rank.items()}
    gap["output_files"] += idle_files
    if timeline_rows:
        gap["gpu_timeline"] = {name: {"time_ms": ms, "percent": pct} for name, ms, pct in timeline_rows}
    report: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "mode": "trace_analysis", "target": str(target),
                              "gap_analysis": gap,
                              "options": opts.to_dict(), "provenance": trace_provenance(ws.root)}
    tl: dict[str, Any] = {"enabled": False}
    _stop_if_cancelled(cancel, "before TraceLens")
    if opts.tracelens and rank0_trace is not None and rank0_tree is not None:
        if not rank0_tree.linked_gpu_events and not n_kernels:
            # A CPU-only run: no GPU roofline exists to report. Said, not an error of the analysis.
            tl = {"enabled": True, "errors": [], "skipped": "the trace has no GPU kernels (a CPU-only run): there is "
                                                            "no GPU roofline to report"}
        elif not rank0_tree.linked_gpu_events:
            tl = {"enabled": True, "errors": ["No GPU events found in the trace: no launch links to a GPU event "
                                              "(a trace recorded without ac2g flow events)"]}
        else:
            try:
                split_dir = _split_dir(ws)
                tl = _tracelens_section(rank0_trace, rank0_tree, ws.root, split_dir, opts, log, rank=traces[0][0],
                                        times=times, split_job=split_job)
            except Exception as exc:  # the gap analysis above is still worth its files
                import traceback
                (ws.logs_dir / "tracelens_error.log").write_text(traceback.format_exc())
                tl = {"enabled": True, "errors": [f"{type(exc).__name__}: {exc}"]}
    report["tracelens_analysis"] = tl
    report["trace_checks"] = checks_section(checks + tl.pop("checks", []))
    report["elapsed_s"] = round(time.perf_counter() - t0, 3)
    report["stage_times_s"] = times.to_dict()
    report["summary_lines"] = summary_lines(report)
    report["trace_checks"]["summary_file"] = str(ws.write_text("trace_analysis_summary.txt",
                                                               "\n".join(report["summary_lines"]) + "\n"))
    return AnalysisResult(report=report, top_rows=rows, idle=idle_by_rank, steps=steps_by_rank.get(traces[0][0], []),
                          exit_code=0 if n_kernels else 1)

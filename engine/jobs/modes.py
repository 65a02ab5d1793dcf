"""One entry point per mode: a typed request and a run folder in, the whole life cycle done.

``run_analyze``, ``run_compare``, ``run_benchmark`` and ``run_trace`` each create (or take) the
workspace, record the request and the effective config, emit ``run_started``, do the work,
write the report and ``summary.txt`` whatever happened (a crash, a timeout or a cancel keeps the
states really reached), emit ``run_finished`` and close the event log. The command line, the
workbench (through the job API) and the MCP server call these and nothing else.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from engine.jobs.requests import (
    REQUEST_FILE, BenchmarkRequest, KernelRequest, LoopRequest, PreparedBenchmark, PreparedKernels, PreparedLoop,
    PreparedTrace, TraceRequest,
)
from engine.runs.labels import run_label
from engine.runs.process import CancelToken
from engine.runs.schema import BENCHMARK_REPORT, SCHEMA_VERSION, TRACE_ANALYSIS_REPORT, report_name_for_mode
from engine.runs.state import benchmark_figures, kernel_figures, kernel_verdicts
from engine.runs.workspace import Workspace

EXIT_OK, EXIT_FAIL, EXIT_CANCELLED = 0, 1, 130
EXIT_NOT_JUDGED = 2  # nothing could be judged on this machine (as a configuration error: fix, then rerun)

# An event listener: called in this process with each event dict as it is written. It is a
# convenience for a front end in the same process; the run folder's events.jsonl is the contract.
EventSink = Callable[[dict], None]


@dataclass
class JobOutcome:
    """What a mode returns: the exit code the command line would give, the run's final state,
    its folder and its report (as written). ``display`` holds rich renderables for a terminal in
    the same process; it does not cross a process boundary."""
    exit_code: int
    state: str
    workspace: Path
    report_name: str
    report: dict
    display: list = field(default_factory=list, repr=False)
    details: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "display": [], "details": None}


def _begin(ws: Workspace, request: Any, sink: Optional[EventSink], config_name: str, config: dict,
           request_name: str = REQUEST_FILE, **started: Any) -> None:
    """Record the request and the effective config, then ``run_started`` with the run's title
    (``run_label`` of that config: what every list calls the run, the same as ``run_title`` of
    the prepared request told at submission)."""
    if sink is not None:
        ws.events.listeners.append(sink)
    ws.write_text(request_name, request.to_json() + "\n")
    ws.write_yaml(config_name, config)
    if started.get("label"):
        started.setdefault("title", run_label(config, started["label"]))
    ws.events.emit("run_started", pid=os.getpid(), workspace=str(ws.root), **started)


def _benchmark_config(prepared: PreparedBenchmark) -> dict:
    """The effective config a benchmark records (config.yaml)."""
    return {"benchmark": prepared.config.model_dump(by_alias=True), "overrides": prepared.overrides,
            "warnings": prepared.warnings}


def run_title(prepared: Any) -> Optional[str]:
    """What every list will call the run of ``prepared`` (engine.runs.labels.run_label of the
    config it will record), known before its process starts; None for a trace analysis or a loop,
    which keep their folder name's label."""
    if isinstance(prepared, PreparedKernels):
        return run_label(prepared.plan.effective_config(), kernel_workspace_label(prepared.plan))
    if isinstance(prepared, PreparedBenchmark):
        return run_label(_benchmark_config(prepared), prepared.label)
    if hasattr(prepared, "points"):  # engine.cluster.batch.PreparedBatch
        return run_label(prepared.effective_config(), prepared.label)
    return None


def _end(ws: Workspace, state: str, code: int, report_name: str, **extra: Any) -> None:
    ws.events.emit("run_finished", state=state, exit_code=code, report=report_name, **extra)
    ws.events.close()


# --------------------------------------------------------------------------- analyze / compare
def kernel_workspace_label(plan: Any) -> str:
    if plan.mode == "compare" and plan.baseline_index is not None:
        return plan.kernels[plan.baseline_index].id
    return plan.kernels[0].id if plan.kernels else plan.mode


def _not_judged(o: Any) -> bool:
    """Only a failure of the machine (no GPU, out of memory, a missing tool) kept ``o`` from a verdict."""
    return bool(o.environment) and not o.correctness.errors and not o.rejections


def _kernel_exit_code(plan: Any, outcomes: list, cancelled: bool) -> int:
    if cancelled:
        return EXIT_CANCELLED
    if plan.mode == "analyze":
        if all(o.correct for o in outcomes):
            return EXIT_OK
        return EXIT_NOT_JUDGED if not any(o.correct for o in outcomes) and all(map(_not_judged, outcomes)) else EXIT_FAIL
    base = outcomes[plan.baseline_index]
    if not base.correct:
        return EXIT_NOT_JUDGED if _not_judged(base) else EXIT_FAIL
    if plan.settings.perf_enabled and not [o for o in outcomes if o.timing]:
        return EXIT_FAIL
    return EXIT_OK


def run_analyze(request: KernelRequest, output_dir: Union[Path, str, None] = None, **kw: Any) -> JobOutcome:
    if request.mode != "analyze":
        raise ValueError(f"run_analyze got a {request.mode} request")
    return _run_kernels(request, output_dir, **kw)


def run_compare(request: KernelRequest, output_dir: Union[Path, str, None] = None, **kw: Any) -> JobOutcome:
    if request.mode != "compare":
        raise ValueError(f"run_compare got a {request.mode} request")
    return _run_kernels(request, output_dir, **kw)


def _run_kernels(request: KernelRequest, output_dir: Union[Path, str, None], *, cancel: Optional[CancelToken] = None,
                 sink: Optional[EventSink] = None, workspace: Optional[Workspace] = None,
                 prepared: Optional[PreparedKernels] = None, detect_gpu: Optional[Callable[[], Any]] = None
                 ) -> JobOutcome:
    from engine.kernels.pipeline import Evaluator, Machine
    from engine.kernels.report import build_analyze_report, build_compare_report, render_text
    prepared = prepared or request.prepare()
    plan = prepared.plan
    cancel = cancel or CancelToken()
    if detect_gpu is None:
        from engine.hw.detect import detect_gpu
    gpu_info = detect_gpu()
    ws = workspace or workspace_for(prepared, output_dir)
    _begin(ws, request, sink, "config.yaml", plan.effective_config(), mode=plan.mode,
           kernels=[k.id for k in plan.kernels], label=kernel_workspace_label(plan))
    started = time.time()
    if plan.environment == "local":
        evaluator = Evaluator(plan, ws, Machine.from_gpu_info(gpu_info), cancel)
    else:  # the same stages, run on a Ray cluster or inside a container image
        from engine.cluster.evaluators import evaluator_for
        evaluator = evaluator_for(plan, ws, Machine.from_gpu_info(gpu_info), cancel)
    outcomes = evaluator.outcomes
    state, error = "failed", None
    try:
        outcomes = evaluator.run()
        state = "cancelled" if cancel.cancelled else "completed"
    except BaseException as exc:  # the report is still written, with what was reached
        state = "cancelled" if isinstance(exc, KeyboardInterrupt) or cancel.cancelled else "failed"
        error = f"{type(exc).__name__}: {exc}"
        (ws.logs_dir / "engine_error.log").write_text(traceback.format_exc())
        if not isinstance(exc, Exception):
            cancel.cancel("interrupted")
    finally:
        build = build_compare_report if plan.mode == "compare" else build_analyze_report
        build = getattr(evaluator, "build_report", None) or build  # Ray: same-GPU speedups
        gpu_dict = gpu_info.to_dict() if gpu_info is not None else None
        report, renderables = build(plan, outcomes, state, str(ws.root), gpu_dict,
                                    degenerate=getattr(evaluator, "degenerate", None))
        report["execution_time"] = round(time.time() - started, 3)
        if error:
            report["error"] = error
        if cancel.cancelled:
            report["cancel_reason"] = cancel.reason
        code = _kernel_exit_code(plan, outcomes, cancel.cancelled)
        if state == "failed" and code == EXIT_OK:
            code = EXIT_FAIL
        report["exit_code"] = code
        name = report_name_for_mode(plan.mode)
        ws.write_json(name, report)
        display = renderables + ([f"error: {error}"] if error else []) + [f"workspace: {ws.root}"]
        ws.write_text("summary.txt", render_text(display))
        _emit_verdicts(ws, plan, report)
        figures = kernel_figures(report)  # the verdicts and the winner: what every front end shows after the end
        _end(ws, state, code, name, **({"figures": figures.model_dump(exclude_none=True)} if figures else {}))
    return JobOutcome(code, state, ws.root, name, report, display=display)


def _emit_verdicts(ws: Workspace, plan: Any, report: dict) -> None:
    """Each kernel's end as a ``done`` stage event (its verdict, its speedup), from the report as
    written: the live per-kernel view ends where the report does."""
    index = {k.id: k.index for k in plan.kernels}
    for kernel, verdict, speedup in kernel_verdicts(report):
        ws.events.emit("stage", kernel=kernel, index=index.get(kernel), stage="done", state="SUCCESS",
                       verdict=verdict, **({"speedup": speedup} if speedup is not None else {}))


# --------------------------------------------------------------------------- benchmark
def run_benchmark(request: BenchmarkRequest, output_dir: Union[Path, str, None] = None, *,
                  cancel: Optional[CancelToken] = None, sink: Optional[EventSink] = None,
                  workspace: Optional[Workspace] = None, prepared: Optional[PreparedBenchmark] = None,
                  log: Callable[[str], None] = lambda s: None) -> JobOutcome:
    from engine.bench.run import run_benchmark as drive
    prepared = prepared or request.prepare()
    if not isinstance(prepared, PreparedBenchmark):  # a batch: each point a run of its own
        from engine.cluster.batch_run import run_batch
        ws = workspace or workspace_for(prepared, output_dir)
        _begin(ws, request, sink, "config.yaml", prepared.effective_config(), mode="benchmark", label=prepared.label)
        code, state = EXIT_FAIL, "failed"
        report: dict = {}
        try:
            code, state, report = run_batch(prepared, ws, cancel or CancelToken(), log, run_benchmark)
        finally:
            _end(ws, state, code, BENCHMARK_REPORT)
        return JobOutcome(code, state, ws.root, BENCHMARK_REPORT, report,
                          display=[(ws.root / "summary.txt").read_text()] if (ws.root / "summary.txt").is_file() else [])
    cfg = prepared.config
    cancel = cancel or CancelToken()
    ws = workspace or workspace_for(prepared, output_dir)
    _begin(ws, request, sink, "config.yaml", _benchmark_config(prepared), mode="benchmark", label=prepared.label)
    log(f"magpie benchmark: workspace {ws.root}")
    code, state, report = EXIT_FAIL, "failed", {}
    try:
        code, report = drive(cfg, ws, cancel, overrides=prepared.overrides, warnings=prepared.warnings, log=log)
        state = report.get("state", "failed")
    finally:
        figures = benchmark_figures(report)  # the report's own numbers: what every front end shows after the end
        _end(ws, state, code, BENCHMARK_REPORT, **({"figures": figures.model_dump(exclude_none=True)} if figures else {}))
    return JobOutcome(code, state, ws.root, BENCHMARK_REPORT, report, display=_benchmark_display(ws, report))


def _benchmark_display(ws: Workspace, report: dict) -> list[str]:
    """summary.txt, or the summary made from the report in memory when the file could not be written
    (a full disk): what was measured still reaches the terminal."""
    from engine.bench.run import summary_text
    try:
        return [(ws.root / "summary.txt").read_text()]
    except OSError:
        return [summary_text(report)] if report.get("framework") else []


# --------------------------------------------------------------------------- trace analysis
def run_trace(request: TraceRequest, output_dir: Union[Path, str, None] = None, *,
              cancel: Optional[CancelToken] = None, sink: Optional[EventSink] = None,
              workspace: Optional[Workspace] = None, prepared: Optional[PreparedTrace] = None,
              log: Callable[[str], None] = lambda s: None) -> JobOutcome:
    from engine.trace.analyze import run_trace_analysis
    from engine.trace.load import TraceCancelled, TraceError
    prepared = prepared or request.prepare()
    target, opts = prepared.target, prepared.options
    ws = workspace or workspace_for(prepared, output_dir)
    request_name = request_file_for(ws.root)
    name = TRACE_ANALYSIS_REPORT
    _begin(ws, request, sink, "config.yaml" if request_name == REQUEST_FILE else "trace_analysis_config.yaml",
           {"mode": "trace_analysis", "trace_dir": str(target), "options": opts.to_dict()},
           request_name=request_name, mode="trace_analysis", target=str(target))

    def failed(exc: BaseException, error: str, state: str = "failed", code: int = EXIT_FAIL) -> dict:
        from engine.runs.provenance import trace_provenance
        report = {"schema_version": SCHEMA_VERSION, "mode": "trace_analysis", "target": str(target),
                  "state": state, "error": error, "provenance": trace_provenance(ws.root)}
        if state == "cancelled":
            report["cancel_reason"] = (cancel.reason if cancel is not None and cancel.cancelled else "") or error
        ws.write_json(name, report)
        _end(ws, state, code, name, error=str(exc))
        return report

    try:
        result = run_trace_analysis(target, opts, ws, log, cancel=cancel)
    except (TraceCancelled, KeyboardInterrupt) as exc:  # a SIGTERM / Ctrl-C: the report says cancelled
        error = str(exc) or "interrupted"
        report = failed(exc, error, "cancelled", EXIT_CANCELLED)
        return JobOutcome(EXIT_CANCELLED, "cancelled", ws.root, name, report, display=[f"cancelled: {error}"])
    except (FileNotFoundError, ValueError, TraceError) as exc:
        report = failed(exc, str(exc))
        return JobOutcome(EXIT_FAIL, "failed", ws.root, name, report, display=[f"error: {exc}"])
    except BaseException as exc:
        failed(exc, f"{type(exc).__name__}: {exc}")
        raise
    result.report["workspace_dir"] = str(ws.root)
    result.report["state"] = "completed" if result.exit_code == 0 else "failed"
    ws.write_json(name, result.report)
    _end(ws, result.report["state"], result.exit_code, name)
    return JobOutcome(result.exit_code, result.report["state"], ws.root, name, result.report, details=result)


# --------------------------------------------------------------------------- trace diff
def run_trace_diff(request: Any, output_dir: Union[Path, str, None] = None, *,
                   cancel: Optional[CancelToken] = None, sink: Optional[EventSink] = None,
                   workspace: Optional[Workspace] = None, prepared: Any = None,
                   log: Callable[[str], None] = lambda s: None) -> JobOutcome:
    """``magpie benchmark --trace-diff A B``: each side's trace profiled (engine.trace.diff), the two
    matched by op/kernel name and call site, into a new run folder: ``trace_diff_report.json``, the
    TraceLens-shaped comparison CSVs under ``trace_diff/`` and ``summary.txt``. A trace that cannot
    be read, or two that cannot be compared, fail the run with exit code 2 (nothing was judged)."""
    from engine.runs.provenance import trace_provenance
    from engine.runs.schema import TRACE_DIFF_REPORT
    from engine.trace.diff import diff_traces, summary_lines, write_csvs
    from engine.trace.load import TraceCancelled, TraceError
    prepared = prepared or request.prepare()
    ws = workspace or workspace_for(prepared, output_dir)
    name = TRACE_DIFF_REPORT
    a, b = str(prepared.a), str(prepared.b)
    _begin(ws, request, sink, "config.yaml", {"mode": "trace_diff", "a": a, "b": b, "top_k": request.top_k,
                                              "gpu_arch": request.gpu_arch, "warnings": prepared.warnings},
           mode="trace_diff", target=f"{a} {b}")
    started = time.perf_counter()
    base: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "mode": "trace_diff", "a": {"path": a},
                            "b": {"path": b}, "warnings": prepared.warnings}
    code, state, error = EXIT_OK, "completed", None
    report: dict[str, Any] = {}
    try:
        diff = diff_traces(prepared.a, prepared.b, request.gpu_arch, cancel, log)
        files = write_csvs(diff, ws.path("trace_diff"))
        report = {**base, **diff.report(request.top_k), "output_files": [str(p) for p in files]}
    except (TraceCancelled, KeyboardInterrupt) as exc:
        code, state, error = EXIT_CANCELLED, "cancelled", str(exc) or "interrupted"
    except (TraceError, ValueError, OSError) as exc:  # a file that is not a trace, two that do not compare
        code, state, error = EXIT_NOT_JUDGED, "failed", str(exc)
    except BaseException as exc:
        code, state, error = EXIT_FAIL, "failed", f"{type(exc).__name__}: {exc}"
        (ws.logs_dir / "engine_error.log").write_text(traceback.format_exc())
        raise
    finally:
        report = report or dict(base)
        report.update(state=state, workspace_dir=str(ws.root), elapsed_s=round(time.perf_counter() - started, 3),
                      provenance=trace_provenance(ws.root))
        if error is not None:
            report["error"] = error
        if state == "cancelled":
            report["cancel_reason"] = (cancel.reason if cancel is not None and cancel.cancelled else "") or error
        ws.write_json(name, report)
        lines = [f"error: {error}"] if error is not None else summary_lines(report, request.top_k)
        ws.write_text("summary.txt", "\n".join(lines + [f"workspace: {ws.root}"]) + "\n")
        _end(ws, state, code, name, **({"error": error} if error is not None else {}))
    return JobOutcome(code, state, ws.root, name, report, display=lines)


# --------------------------------------------------------------------------- optimization loop
def run_optimize(request: LoopRequest, output_dir: Union[Path, str, None] = None, *,
                 cancel: Optional[CancelToken] = None, sink: Optional[EventSink] = None,
                 workspace: Optional[Workspace] = None, prepared: Optional[PreparedLoop] = None,
                 log: Callable[[str], None] = lambda s: None) -> JobOutcome:
    """Start or resume a loop (engine.loop.run); each of its steps is a run of the modes above, through
    the ``run_request`` handed to it (the loop never imports this module)."""
    from engine.loop.run import run_loop
    from engine.loop.schema import LOOP_FILE
    prepared = prepared or request.prepare()
    ws = workspace or workspace_for(prepared, output_dir)
    if sink is not None:
        ws.events.listeners.append(sink)
    ws.write_text(request_file_for(ws.root, request), request.to_json() + "\n")
    code, state, loop = run_loop(prepared, ws, log, cancel or CancelToken(), run_request=run_request)  # the steps' runs
    return JobOutcome(code, state, ws.root, LOOP_FILE, loop)


# --------------------------------------------------------------------------- shared
def request_file_for(run_dir: Path, request: Any = None) -> str:
    """Where a run folder records its request: ``request.json``; for a trace analysed into the
    folder of the benchmark that recorded it (which has its own config and request), or for the
    resume of a loop, a name of its own."""
    if isinstance(request, LoopRequest):
        return "resume_request.json" if request.resume else REQUEST_FILE
    return "trace_analysis_request.json" if (run_dir / "config.yaml").exists() else REQUEST_FILE


def workspace_for(prepared: Any, output_dir: Union[Path, str, None]) -> Workspace:
    """The run folder a prepared request writes into (created here, never reused, except a trace
    analysed into the folder of the benchmark that recorded it)."""
    if isinstance(prepared, PreparedKernels):
        return Workspace.create(output_dir or "./results", prepared.plan.mode, kernel_workspace_label(prepared.plan))
    if isinstance(prepared, PreparedBenchmark):
        return Workspace.create(output_dir or "./results", "benchmark", prepared.label)
    if hasattr(prepared, "points"):  # engine.cluster.batch.PreparedBatch
        return Workspace.create(output_dir or "./results", "benchmark", prepared.label)
    if isinstance(prepared, PreparedTrace):
        from engine.trace.discover import workspace_of
        existing = workspace_of(prepared.target) if output_dir is None and prepared.request.into_recording_run \
            else None
        if existing is not None:
            return Workspace(existing)
        return Workspace.create(output_dir or "./results", "trace", prepared.target.stem.split(".")[0])
    from engine.jobs.requests import PreparedTraceDiff
    if isinstance(prepared, PreparedTraceDiff):
        return Workspace.create(output_dir or "./results", "tracediff", prepared.b.name.split(".")[0])
    if isinstance(prepared, PreparedLoop):
        if prepared.resume_dir is not None:
            return Workspace(prepared.resume_dir)
        return Workspace.create(output_dir or "./results", "loop", prepared.label)
    raise TypeError(f"not a prepared request: {type(prepared).__name__}")


MODES: dict[str, Callable[..., JobOutcome]] = {
    "analyze": run_analyze, "compare": run_compare, "benchmark": run_benchmark, "trace": run_trace,
    "trace_diff": run_trace_diff,
    "optimize": run_optimize,
}


def run_request(request: Any, output_dir: Union[Path, str, None] = None, **kw: Any) -> JobOutcome:
    """The mode's entry point for any request."""
    return MODES[request.mode](request, output_dir, **kw)

"""Run an analyze or compare plan in a workspace; the report is written whatever happens."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from engine.kernels.pipeline import Evaluator, KernelOutcome, Machine
from engine.kernels.plan import Plan
from engine.kernels.report import build_analyze_report, build_compare_report, render_text
from engine.runs.process import CancelToken
from engine.runs.workspace import Workspace

EXIT_OK, EXIT_FAIL, EXIT_CANCELLED = 0, 1, 130


def workspace_label(plan: Plan) -> str:
    if plan.mode == "compare" and plan.baseline_index is not None:
        return plan.kernels[plan.baseline_index].id
    return plan.kernels[0].id if plan.kernels else plan.mode


def exit_code(plan: Plan, outcomes: list[KernelOutcome], report: dict, cancelled: bool) -> int:
    if cancelled:
        return EXIT_CANCELLED
    if plan.mode == "analyze":
        return EXIT_OK if all(o.correct for o in outcomes) else EXIT_FAIL
    base = outcomes[plan.baseline_index]
    if not base.correct:
        return EXIT_FAIL
    measured = [o for o in outcomes if o.timing]
    if plan.settings.perf_enabled and not measured:
        return EXIT_FAIL
    return EXIT_OK


def run_plan(plan: Plan, output_dir: Path | str, cancel: CancelToken, *,
             detect_gpu: Optional[Callable[[], Any]] = None,
             show: Optional[Callable[[list[Any]], None]] = None,
             on_event: Optional[Callable[[dict], None]] = None) -> tuple[int, Workspace, dict]:
    """Create the workspace, evaluate, write report + summary.txt. Returns (exit code, workspace, report)."""
    if detect_gpu is None:
        from engine.hw.detect import detect_gpu
    gpu_info = detect_gpu()
    machine = Machine.from_gpu_info(gpu_info)
    ws = Workspace.create(output_dir, plan.mode, workspace_label(plan))
    if on_event is not None:
        ws.events.listeners.append(on_event)
    ws.write_yaml("config.yaml", plan.effective_config())
    ws.events.emit("run_started", mode=plan.mode, pid=os.getpid(), workspace=str(ws.root),
                   kernels=[k.id for k in plan.kernels], label=workspace_label(plan))
    started = time.time()
    evaluator = Evaluator(plan, ws, machine, cancel)
    outcomes = evaluator.outcomes
    state = "failed"
    error: Optional[str] = None
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
        gpu_dict = gpu_info.to_dict() if gpu_info is not None else None
        report, renderables = build(plan, outcomes, state, str(ws.root), gpu_dict,
                                    degenerate=getattr(evaluator, "degenerate", None))
        report["execution_time"] = round(time.time() - started, 3)
        if error:
            report["error"] = error
        if cancel.cancelled:
            report["cancel_reason"] = cancel.reason
        code = exit_code(plan, outcomes, report, cancel.cancelled)
        if state == "failed" and code == EXIT_OK:
            code = EXIT_FAIL
        report["exit_code"] = code
        name = "compare_report.json" if plan.mode == "compare" else "analyze_report.json"
        ws.write_json(name, report)
        text = render_text(renderables + [f"workspace: {ws.root}"])
        ws.write_text("summary.txt", text)
        ws.events.emit("run_finished", state=state, exit_code=code, report=name)
        ws.events.close()
        if show is not None:
            show(renderables + [f"workspace: {ws.root}"])
    return code, ws, report

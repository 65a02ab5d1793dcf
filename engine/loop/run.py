"""``magpie optimize``: the optimization loop as a chain of steps, each a run of the modes.

baseline (the clean benchmark, >= 3 repeats) -> profiled (its profiled twin, derived here) ->
bottlenecks (the ranked per-stage table of ``engine.loop.bottlenecks``) -> harness, candidates,
integrate (``engine.loop.kernel_steps``) -> rebenchmark, verdict (``engine.loop.verdict``).
When no candidate is correct and faster, integrate and rebenchmark are skipped with that reason
and the verdict says so. Exit codes: 0 a proven gain (or the ``--until`` step reached), 3 the loop
ended without one (the verdict says which check failed), 1 a step failed, 130 cancelled.

The steps see the loop through ``engine.loop.context`` (``LoopContext``, which ``Loop``
fulfils; ``LoopError`` and the helpers the steps share), so the step modules sit below this one.
The loop starts its runs through the modes' ``run_request`` that the optimize mode
(``engine.jobs.modes.run_optimize``) hands to ``run_loop``: it never imports the job layer above it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from engine.config.yamlfile import ConfigError, load_yaml_file
from engine.errors import MagpieError
from engine.loop.bottlenecks import BOTTLENECKS_FILE, analyze_trace, top_replaceable
# LoopError, profiled_twin and config_diff: importable from here as before.
from engine.loop.context import LoopError, RunRequest, _metrics, config_diff, profiled_twin  # noqa: F401
from engine.loop.results import (
    BenchmarkStepResult,
    BottlenecksResult,
    CandidatesResult,
    HarnessResult,
    IntegrateResult,
    Metric,
    ProfiledResult,
    StepResult,
    StepResultT,
    VerdictResult,
    step_result,
    written_result,
)
from engine.loop.schema import LOOP_FILE, MIN_REPEATS, STEP_NAMES, LoopFile, LoopStep, load_loop_file, new_loop_file
from engine.loop.window import describe as describe_window
from engine.runs.process import CancelToken, process_start_time
from engine.runs.schema import BENCHMARK_REPORT
from engine.runs.workspace import Workspace, atomic_write_json

PROFILED_CONFIG = "profiled_config.yaml"
EXIT_NO_GAIN = 3
AFTER_NO_WINNER = ("integrate", "rebenchmark")  # skipped when the candidates step found no winner


class Loop:
    """A loop folder's chain of steps (``engine.loop.context.LoopContext`` to its steps).
    ``run_request``: the modes' entry point (``engine.jobs.modes.run_request``), given by the
    optimize mode; every benchmark and compare of a step runs through it."""

    def __init__(self, root: Path, loop: LoopFile, ws: Workspace, log: Callable[[str], None],
                 cancel: Optional[CancelToken] = None, *, run_request: RunRequest) -> None:
        self.root, self.loop, self.ws, self.log = root, loop, ws, log
        self.cancel = cancel or CancelToken()
        self.run_request = run_request

    # ------------------------------------------------------------------ bookkeeping
    def save(self) -> None:
        atomic_write_json(self.root / LOOP_FILE, self.loop.to_dict())

    def _set(self, step: LoopStep, **fields: Any) -> None:
        for k, v in fields.items():
            setattr(step, k, v)
        self.save()

    def set_run_dir(self, step: LoopStep, rel: str) -> None:
        self._set(step, run_dir=rel)

    def result_of(self, name: str, model: type[StepResultT]) -> StepResultT:
        """The typed result of an earlier step (``engine.loop.results``, read as any front end reads it)."""
        result = step_result(self.loop.step(name))
        if not isinstance(result, model):
            raise TypeError(f"the {name} step's result is a {type(result).__name__}, not a {model.__name__}")
        return result

    def run(self, until: Optional[str]) -> tuple[int, str]:
        self.loop.until = until
        self.ws.events.emit("run_started", pid=os.getpid(), workspace=str(self.root), mode="loop", label=self.loop.label)
        code, state = 0, "completed"
        try:
            for name in STEP_NAMES:
                step = self.loop.step(name)
                if step.state in ("done", "skipped"):
                    continue
                if name in AFTER_NO_WINNER and not (cand := self.result_of("candidates", CandidatesResult)).winner:
                    self._set(step, state="skipped", reason=f"no winner: {cand.stopped}")
                    continue
                if not self._run_step(step):
                    code, state = (130, "cancelled") if self.cancel.cancelled else (1, "failed")
                    break
                if until == name:
                    break
            verdict = self.loop.step("verdict")
            if code == 0 and verdict.state == "done" and not self.result_of("verdict", VerdictResult).success:
                code = EXIT_NO_GAIN
        except BaseException:
            state, code = "failed", 1
            raise
        finally:
            self.ws.events.emit("run_finished", state=state, exit_code=code, report=LOOP_FILE,
                                figures=self._figures(code))
            self.ws.events.close()
        return code, state

    def _figures(self, code: int) -> dict:
        """How far the loop got, for run_finished: the steps settled (done, or skipped for a reason
        the loop gives) out of all, and the end in words."""
        settled = self.loop.settled_steps()
        verdict = next((s for s in self.loop.steps if s.name == "verdict"), None)  # never a KeyError in a finally
        outcome = ("no proven gain" if code == EXIT_NO_GAIN else
                   "proven gain" if code == 0 and verdict is not None and verdict.state == "done" else None)
        return {"steps_done": settled, "steps_total": len(self.loop.steps),
                **({"outcome": outcome} if outcome else {})}

    def _run_step(self, step: LoopStep) -> bool:
        self.log(f"magpie optimize: step {step.name}")
        index = STEP_NAMES.index(step.name)
        self.ws.events.emit("stage", stage=step.name, state="RUNNING", index=index)
        self.ws.events.emit("progress", done=index, total=len(STEP_NAMES), phase=f"step {index + 1}/{len(STEP_NAMES)}: "
                            f"{step.name}")
        self._set(step, state="running", pid=os.getpid(), start_time=process_start_time(os.getpid()),
                  started=time.time(), finished=None, error=None, reason=None, attempts=step.attempts + 1, result={})
        try:
            result = written_result(step.name, STEPS[step.name](self, step))  # strict: a malformed result fails here
        except Exception as exc:
            msg = exc.message if isinstance(exc, MagpieError) else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ConfigError):
                msg = "; ".join(exc.problems)
            self._set(step, state="failed", finished=time.time(), error=msg)
            self.ws.events.emit("stage", stage=step.name, state="FAILED", index=index)
            self.log(f"magpie optimize: step {step.name} failed: {msg}")
            return False
        self._set(step, state="done", finished=time.time(), result=result)
        self.ws.events.emit("stage", stage=step.name, state="SUCCESS", index=index)
        self.log(f"magpie optimize: step {step.name} done ({step.elapsed_s:.1f} s)")
        return True

    def benchmark(self, step: LoopStep, config: str, flags: dict, folder: Optional[str] = None,
                  record: bool = True) -> tuple[Any, Any]:
        """One benchmark run of ``config`` into ``<loop>/<folder or step>/``; a LoopError unless it completed."""
        from engine.jobs.requests import BenchmarkRequest
        request = BenchmarkRequest(benchmark_config=config, flags=flags)
        prepared = request.prepare()
        for o in prepared.overrides:
            if o.get("flag") == "--repeats":
                o["flag"] = "magpie optimize (at least 3 repeats)"
        ws = Workspace.create(self.root / (folder or step.name), "benchmark", prepared.label)
        if record:
            self._set(step, run_dir=str(ws.root.relative_to(self.root)))
        outcome = self.run_request(request, cancel=self.cancel, workspace=ws, prepared=prepared, log=self.log)
        if outcome.exit_code != 0 or outcome.state != "completed":
            errors = outcome.report.get("errors") or outcome.report.get("error") or ""
            raise LoopError(f"the {step.name} benchmark ended {outcome.state} (exit {outcome.exit_code}): {errors} "
                            f"(see {ws.root}/summary.txt)")
        return prepared, outcome

    # ------------------------------------------------------------------ steps
    def _step_baseline(self, step: LoopStep) -> BenchmarkStepResult:
        from engine.config.benchmark import load_benchmark_config
        cfg, _ = load_benchmark_config(self.loop.config, [])
        flags = {"repeats": MIN_REPEATS} if cfg.client.repeats < MIN_REPEATS else {}
        prepared, outcome = self.benchmark(step, self.loop.config, flags)
        self.loop.overrides = prepared.overrides
        report_path = outcome.workspace / BENCHMARK_REPORT
        digest = hashlib.sha256(report_path.read_bytes()).hexdigest()
        os.chmod(report_path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # the baseline is kept as measured
        return BenchmarkStepResult(report=str(report_path.relative_to(self.root)), report_sha256=digest,
                                   repeats=prepared.config.client.repeats, overrides=prepared.overrides,
                                   metrics=_metrics(outcome.report))

    def _step_profiled(self, step: LoopStep) -> ProfiledResult:
        baseline_cfg = self.run_config(self.loop.step("baseline").run_dir)
        twin = profiled_twin(self.clean_yaml())
        twin_path = self.root / PROFILED_CONFIG
        twin_path.write_text("# The profiled twin of " + self.loop.config + ", derived by magpie optimize.\n"
                             + yaml.safe_dump(twin, sort_keys=False), encoding="utf-8")
        prepared, outcome = self.benchmark(step, str(twin_path), {})
        diff = config_diff(baseline_cfg, prepared.config.model_dump(by_alias=True))
        traces = sorted((outcome.workspace / "torch_trace").glob("*.pt.trace.json*"))
        if not traces:
            raise LoopError(f"the profiled run wrote no trace into {outcome.workspace / 'torch_trace'}")
        return ProfiledResult(config=PROFILED_CONFIG, config_diff=diff,
                              traces=[str(t.relative_to(self.root)) for t in traces], metrics=_metrics(outcome.report),
                              note="profiling perturbs latency: these numbers diagnose, the baseline's measure")

    def clean_yaml(self) -> dict:
        """The clean benchmark YAML of ``-b`` as written (plain data)."""
        return load_yaml_file(self.loop.config) or {}

    def run_config(self, run_dir: Optional[str]) -> dict:
        """The effective ``benchmark`` config a step's run recorded (its config.yaml)."""
        cfg = load_yaml_file(self.root / str(run_dir) / "config.yaml")
        return cfg["benchmark"]

    def _step_bottlenecks(self, step: LoopStep) -> BottlenecksResult:
        import json
        prof = self.loop.step("profiled")
        traces = self.result_of("profiled", ProfiledResult).traces
        if prof.state != "done" or not traces:
            raise LoopError("the profiled step has no trace to analyse")
        folder = self.root / step.name
        folder.mkdir(parents=True, exist_ok=True)
        self._set(step, run_dir=step.name)
        table = analyze_trace(self.root / traces[0])
        report = json.loads((self.root / str(prof.run_dir) / BENCHMARK_REPORT).read_text())
        table["profiled_run"] = prof.run_dir
        table["gap_analysis"] = {k: (report.get("gap_analysis") or {}).get(k) for k in ("total_kernel_time_us",
                                                                                      "top_kernels", "idle")}
        table["tracelens_errors"] = (report.get("tracelens_analysis") or {}).get("errors", [])
        atomic_write_json(folder / BOTTLENECKS_FILE, table)
        window = describe_window(table["window"])
        self.log(f"magpie optimize: bottleneck window: {window}")
        if not table["python_stacks"]["recorded"]:
            self.log("magpie optimize: the trace has no Python stacks: rows are mapped by name or call-site annotation only")
        top = top_replaceable(table)
        stages = {st: [f"{r['name']} {r['share_pct']:.1f}%" + (f" ({r['bound']}-bound, {r['roofline_pct']:.0f}% of roofline)"
                                                              if r.get("roofline_pct") is not None else "")
                       for r in tab["rows"][:3]]
                  for st, tab in table["stages"].items()}
        if top is None:
            raise LoopError("no row of the bottleneck table maps to a replaceable registry op "
                            f"(see {folder / BOTTLENECKS_FILE})")
        return BottlenecksResult(
            table=f"{step.name}/{BOTTLENECKS_FILE}", device=table["device"], top_by_stage=stages, window=window,
            python_stacks=table["python_stacks"]["recorded"],
            top_replaceable={"registry_op": top["registry_op"], "share_pct": top["share_pct"], "calls": top["calls"],
                             "confidence": top["mapping"]["confidence"],
                             "lines": [f"{ln['file']}:{ln['line']} {ln['function']} {ln['share_pct']:.0f}%"
                                       for ln in top["mapping"]["lines"]]})


# ---------------------------------------------------------------------------- entry points
def run_loop(prepared: Any, ws: Workspace, log: Callable[[str], None],
             cancel: Optional[CancelToken] = None, *, run_request: RunRequest) -> tuple[int, str, dict]:
    """Start (``prepared.config``) or resume (``prepared.resume_dir``) a loop in ``ws``: the
    engine.jobs ``optimize`` mode, which gives the modes' ``run_request`` for the steps' runs.
    Returns (exit code, run state, the loop file as a dict)."""
    request = prepared.request
    if prepared.resume_dir is not None:
        loop = load_loop_file(ws.root)
        for step in loop.steps:
            if step.state == "running":
                if step.pid is not None and step.pid != os.getpid() and step.process_alive(ws.root):
                    raise LoopError(f"step {step.name} is running in process {step.pid}", hint="wait for it, or stop it")
                step.state, step.reason = "pending", f"restarted: the process {step.pid} that ran it is gone"
            elif step.state == "failed":
                step.state, step.reason = "pending", "restarted after a failure"
        _resume_options(loop, request)
        log(f"magpie optimize: resuming {ws.root}")
    else:
        loop = new_loop_file(str(prepared.config), prepared.label, time.time())
        loop.kernel, loop.library = request.kernel, request.library
        loop.candidates = [str(Path(c).expanduser().resolve()) for c in request.candidates]
        log(f"magpie optimize: loop {ws.root}")
    runner = Loop(ws.root, loop, ws, log, cancel, run_request=run_request)
    runner.save()
    code, state = runner.run(request.until)
    return code, state, runner.loop.to_dict()


def _resume_options(loop: LoopFile, request: Any) -> None:
    """A resume may name the op and candidates only while the steps that use them have not run."""
    wanted = {"kernel": request.kernel, "candidates": [str(Path(c).expanduser().resolve()) for c in request.candidates]
              or None, "library": None if request.library else False}
    used_by = {"kernel": "harness", "candidates": "candidates", "library": "candidates"}
    for key, value in wanted.items():
        if value is None or value == getattr(loop, key):
            continue
        if loop.step(used_by[key]).state == "done":
            raise LoopError(f"--{key} on resume: the {used_by[key]} step already ran with {getattr(loop, key)!r}",
                            hint="start a new loop for another choice")
        setattr(loop, key, value)


def format_status(loop_dir: str) -> str:
    root = Path(loop_dir).expanduser().resolve()
    loop = load_loop_file(root)
    lines = [f"loop {root}", f"config {loop.config}"]
    for i, s in enumerate(loop.steps, 1):
        state = s.state
        if state == "running" and s.pid is not None and not s.process_alive(root):
            state = f"running (process {s.pid} is gone: --resume restarts it)"
        elapsed = f"{s.elapsed_s:.1f} s" if s.elapsed_s is not None else "-"
        detail = s.error or s.reason or _short(s)
        lines.append(f"{i}. {s.name:<12} {state:<10} {elapsed:>9}  {s.run_dir or '-'}  {detail}")
    verdict = loop.step("verdict")
    typed = step_result(verdict)
    if verdict.state == "done" and isinstance(typed, VerdictResult) and typed.end_to_end:
        from engine.loop.verdict import verdict_lines
        lines += verdict_lines(typed)[1:]
    return "\n".join(lines)


def _short(step: LoopStep) -> str:
    r = step_result(step)
    if isinstance(r, HarnessResult) and r.op:
        first = r.shapes[0].args if r.shapes else ""
        return f"kernels.{r.op} at {len(r.shapes)} call shape(s): {first}"
    if isinstance(r, CandidatesResult) and "rows" in step.result:
        verdicts = ", ".join(f"{row.id} {row.verdict}" for row in r.rows if row.id != "baseline")
        return (f"winner {r.winner}" if r.winner else str(r.stopped)) + (f" ({verdicts})" if verdicts else "")
    if isinstance(r, IntegrateResult) and r.kernels:
        return ", ".join(f"kernels.{k} = {v}" for k, v in r.kernels.items())
    if isinstance(r, VerdictResult) and r.decided:
        return ("SUCCESS: " if r.success else "") + str(r.message)
    if isinstance(r, BottlenecksResult) and r.top_replaceable is not None:
        t = r.top_replaceable
        called = f", called from {', '.join(t.lines[:2])}" if t.lines else ""
        window = f"; window {r.window}" if r.window else ""
        return f"top replaceable: {t.registry_op} {t.share_pct or 0.0:.1f}% ({r.device}){called}{window}"
    if isinstance(r, ProfiledResult) and "config_diff" in step.result:
        return "diff: " + ", ".join((d.field or "").removeprefix("benchmark.") for d in r.config_diff)
    m = r.metrics.get("output_throughput") if isinstance(r, BenchmarkStepResult) else None
    if isinstance(m, Metric) and m.mean is not None:
        return f"output {m.mean:.1f} tok/s over {r.repeats} repeats"
    return ""


def _steps() -> dict[str, Callable[[Loop, LoopStep], StepResult]]:
    from engine.loop.kernel_steps import step_candidates, step_harness, step_integrate
    from engine.loop.verdict import step_rebenchmark, step_verdict
    return {"baseline": Loop._step_baseline, "profiled": Loop._step_profiled, "bottlenecks": Loop._step_bottlenecks,
            "harness": step_harness, "candidates": step_candidates, "integrate": step_integrate,
            "rebenchmark": step_rebenchmark, "verdict": step_verdict}


STEPS = _steps()


def loop_plan_lines(prepared: Any, output_dir: Optional[str]) -> list[str]:
    """What ``magpie optimize --dry-run`` prints: the steps, the clean benchmark's plan and what its
    profiled twin changes (a resumed loop: its status and the step it goes on from)."""
    from engine.bench.plan import benchmark_plan, format_plan
    from engine.jobs.requests import BenchmarkRequest
    req = prepared.request
    if prepared.resume_dir is not None:
        loop = load_loop_file(prepared.resume_dir)
        nxt = next((s.name for s in loop.steps if s.state != "done"), None)
        return [format_status(str(prepared.resume_dir)),
                f"resume: from step {nxt}" if nxt else "resume: every step is done; nothing would run"]
    lines = [f"optimize loop on {prepared.config}: steps {', '.join(STEP_NAMES)}"
             + (f" (until {req.until})" if req.until else ""),
             f"kernel: {req.kernel or 'the top replaceable row of the bottleneck table'}; candidates: "
             f"{', '.join(req.candidates) or 'none given'}{' + the bundled library' if req.library else ''}",
             f"loop folder: {output_dir or './results'}/optimize_{prepared.label}_<YYYYmmdd_HHMMSS>_<id>/",
             "baseline and re-benchmark (clean):"]
    clean = BenchmarkRequest(benchmark_config=prepared.config).prepare(plan_only=True)
    lines += format_plan(benchmark_plan(clean, "<loop folder>"), "  ")
    raw = load_yaml_file(prepared.config)
    lines.append("profiled twin (diagnostic; differs from the clean run only in):")
    twin = profiled_twin(raw)
    for d in config_diff(raw.get("benchmark") or {}, twin.get("benchmark") or {}):
        lines.append(f"  {d['field']}: {d['clean']!r} -> {d['profiled']!r}")
    return lines

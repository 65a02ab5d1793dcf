"""Benchmark, trace and loop tools: benchmark, benchmark_batch, batch_status, gap_analysis, trace_diff,
list_benchmark_results, get_benchmark_result, compare_benchmark_reports, suggest_optimizations,
roofline_table, optimize, optimize_status, optimize_resume."""

import csv
import difflib
import json
import secrets
import time
from pathlib import Path
from typing import Any, Optional

import anyio
import yaml
from mcp.server.mcpserver import Context

from engine.jobs import BenchmarkRequest, LoopRequest, TraceDiffRequest, TraceRequest
from engine.jobs import query as safeio  # the safe reads: a FIFO or a device is refused, never waited on
from engine.jobs.api import JobError
from engine.jobs.query import RunCatalog, RunInfo, read_new_events
from engine.jobs.requests import REQUEST_FILE, BenchmarkOverrides, mcp_names
from engine.mcp import results as res
from engine.mcp.confine import COMMAND_KEYS  # noqa: F401 - the keys of an inline config that are command lines
from engine.mcp.jobs import describe, run_file_uri
from engine.mcp.security import AccessRefused
from engine.mcp.server import State, add_tool, dump_yaml, wait_with_progress
from engine.runs.schema import BENCHMARK_REPORT

BATCH_NOTE = ("the points are one batch job (magpie benchmark --batch) run by a detached process: it outlives "
              "this server, and batch_status(batch_id) or job_status(batch_id) on any server of this results root "
              "follows it; each point's run folder is <batch run_dir>/points/<label>")
# A point that can no longer change: its run wrote its end, or the batch's process is gone.
POINT_ENDED = ("completed", "failed", "cancelled", "lost")


# The benchmark tool's override arguments (a batch item may carry them beside benchmark_config):
# the override model's fields, under Magpie's MCP names where they differ (gap_analysis_enabled).
FLAG_ARGS = tuple(mcp_names())


def benchmark_flags(state: State, values: dict, where: str = "") -> BenchmarkOverrides:
    """The overrides of ``BenchmarkRequest`` from the tool's arguments (Magpie's MCP names);
    empty strings are "not given", like an absent flag. sweep, goodput and find_capacity take the
    command line's item syntax (``KEY=V1,V2``, ``KEY:MS``)."""
    given = {field: (None if values.get(arg) == "" else values.get(arg)) for arg, field in mcp_names().items()}
    prefix = f"{where}." if where else ""
    if given["dataset_path"]:
        given["dataset_path"] = str(state.path(given["dataset_path"], f"{prefix}dataset_path"))
    flags = BenchmarkOverrides.build(given, where=where or "arguments")
    state.confine.flags(flags.model_dump(), where)  # tokenizer, model, gpu_arch: a local path lies under a root
    return flags


class Batches:
    """benchmark_batch's batches: each one batch job (``BenchmarkRequest(batch=...)``, as ``magpie
    benchmark --batch`` runs it) whose batch YAML lies in ``<results>/.mcp/batches/<stamp>/mcp.yaml``.
    The batch id is the job id (the run folder's name): the folder is the truth, so a server started
    later finds the batch under its results root and reads each point's state from it."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.folder = state.results / ".mcp" / "batches"

    def submit(self, requests: list[tuple[Any, Path]], environment: Optional[str], ray_address: str) -> dict:
        """One batch job of the checked points (``_batch_request``); nothing starts when the batch
        itself does not pass."""
        points = [{"config": str(cfg), "flags": req.flags.given()} for req, cfg in requests]
        # A folder of its own, so that the batch run is named benchmark_batch-mcp_<time>_<id>.
        folder = self.folder / f"{time.strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(3)}"
        folder.mkdir(parents=True)
        batch_file = folder / "mcp.yaml"
        batch_file.write_text(dump_yaml({"batch": points}))
        request = BenchmarkRequest(batch=str(batch_file), environment=environment, ray_address=ray_address or None)
        prepared = request.prepare()
        self.state.confine.prepared(prepared, "configs")
        job = self.state.book.submit(request, self.state.results, prepared)
        return {**self.status(job, prepared.effective_config()), "batch_file": str(batch_file)}

    def find(self, batch_id: str) -> Any:
        if not batch_id or "/" in batch_id or batch_id.startswith("."):
            raise AccessRefused(f"batch_id {batch_id!r}: not a batch id")
        try:
            job = self.state.book.find(batch_id)
        except JobError:
            raise res.ResultError(f"no batch {batch_id!r} under {self.state.results}",
                                  hint="a batch id is the job id benchmark_batch returned") from None
        path = job.run_dir / REQUEST_FILE
        request = self._json(path, batch_id) if path.is_file() else {}
        if request.get("mode") != "benchmark" or not request.get("batch"):
            raise res.ResultError(f"{batch_id}: not a benchmark batch (its request names no batch file)",
                                  hint="job_status follows any other job")
        return job

    def status(self, job: Any, planned: Optional[dict] = None) -> dict:
        """``planned``: the batch's effective config, as its process will write it to config.yaml."""
        info = describe(job)
        rows, environment = self._points(job.run_dir, info["state"], planned)
        return {"batch_id": job.id, **info, "environment": environment, "parallel": environment == "ray",
                "submitted": len(rows), "failed": sum(r["state"] in ("failed", "cancelled", "lost") for r in rows),
                "points": len(rows), "jobs": rows, "note": BATCH_NOTE}

    def _json(self, path: Path, batch_id: str) -> dict:
        return self.state.read_json(path, f"batch_id {batch_id} {path.name}")

    def _points(self, run_dir: Path, batch_state: str, planned: Optional[dict] = None) -> tuple[list[dict], str]:
        """Each point's state: the batch report's once written; before, each point's own run folder
        (``points/<label>``: running, then its end), ``queued`` before it has one; on Ray, the task's
        state from cluster.json. A point not ended when the batch's process is gone is ``lost``."""
        name = run_dir.name
        report_path = run_dir / BENCHMARK_REPORT
        report = self._json(report_path, name) if report_path.is_file() else {}
        if report.get("batch") and isinstance(report.get("points"), list):
            return [{"index": r.get("index"), "label": r.get("label"), "state": r.get("state"),
                     "run_dir": r.get("folder"), "benchmark_config": r.get("benchmark_config"),
                     "flags": r.get("flags"), "exit_code": r.get("exit_code"), "error": r.get("error"),
                     "metrics": r.get("metrics")} for r in report["points"]], report.get("run_environment") or "local"
        config = self._yaml(run_dir / "config.yaml", name) or planned or {}  # written when its process starts
        if config.get("points"):
            rows = [{"index": p.get("index"), "label": p.get("label"), "state": "queued", "run_dir": None,
                     "benchmark_config": p.get("benchmark_config"), "flags": p.get("flags")}
                    for p in config["points"]]
            environment = config.get("environment") or "local"
        else:  # not started yet: the points as the batch file lists them
            request = self._json(run_dir / REQUEST_FILE, name)
            batch = self._yaml(self.state.path(str(request["batch"]), f"batch_id {name} batch file"), name)
            rows = [{"index": i, "label": None, "state": "queued", "run_dir": None,
                     "benchmark_config": (p.get("config") if isinstance(p, dict) else p),
                     "flags": (p.get("flags") if isinstance(p, dict) else {})}
                    for i, p in enumerate(batch.get("batch") or [])]
            environment = request.get("environment") or "local"
        tasks = {}
        if (run_dir / "cluster.json").is_file():
            tasks = {t.get("key"): t for t in self._json(run_dir / "cluster.json", name).get("tasks") or []}
        for row in rows:
            folder = run_dir / "points" / str(row["label"])
            if row["label"] and (folder / "events.jsonl").is_file():
                self.state.file(folder / "events.jsonl", f"batch_id {name} point {row['index']}")
                point = RunInfo(path=folder)
                read_new_events(point)
                row.update(state=point.state, run_dir=str(folder), progress=point.progress_text)
                if point.error:
                    row["error"] = point.error
            elif f"point_{row['label']}" in tasks:  # a Ray task: submitted, finished, failed, cancelled
                task_state = tasks[f"point_{row['label']}"].get("state")
                row["state"] = "completed" if task_state == "finished" else task_state
            if batch_state == "lost" and row["state"] not in POINT_ENDED:
                row["state"] = "lost"
        return rows, environment

    def _yaml(self, path: Path, name: str) -> dict:
        if not path.is_file():
            return {}
        self.state.file(path, f"batch_id {name} {path.name}")
        try:
            data = yaml.safe_load(safeio.read_text(path, safeio.MAX_SMALL_TEXT_BYTES, path.name))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise res.ResultError(f"{path}: cannot read ({exc})") from None
        return data if isinstance(data, dict) else {}


def _old_batch(state: State, batch_id: str) -> Optional[dict]:
    """A batch an earlier version of this server queued point by point (.mcp/batches/<id>.json):
    each point's state read from its job."""
    path = state.results / ".mcp" / "batches" / f"{batch_id}.json"
    if "/" in batch_id or batch_id.startswith(".") or not path.is_file():
        return None
    record = state.read_json(path, f"batch_id {batch_id}")
    for point in record.get("jobs") or []:
        if point.get("job_id"):
            point["state"] = describe(state.book.find(point["job_id"]))["state"]
    return record


def register(app: Any, state: State) -> None:  # noqa: C901 - one closure per tool
    batches = Batches(state)
    max_wait = state.options.max_wait_s

    def benchmark(framework: str = "", model: str = "", precision: str = "", run_mode: str = "",
                  tp: Optional[int] = None, concurrency: Optional[int] = None, input_len: Optional[int] = None,
                  output_len: Optional[int] = None, torch_profiler: Optional[bool] = None,
                  tracelens: Optional[bool] = None, gap_analysis_enabled: Optional[bool] = None,
                  docker_image: str = "", gpu_arch: str = "", timeout_seconds: Optional[float] = None,
                  output_dir: str = "", benchmark_config: str = "", num_prompts: Optional[int] = None,
                  request_rate: Optional[float] = None, burstiness: Optional[float] = None,
                  range_ratio: Optional[float] = None, vllm_range_ratio: Optional[float] = None,
                  warmup: Optional[int] = None, repeats: Optional[int] = None,
                  sweep: Optional[list[str]] = None, base_url: str = "", seed: Optional[int] = None,
                  goodput: Optional[list[str]] = None, prefix_len: Optional[int] = None, endpoint: str = "",
                  tokenizer: str = "", vocab_size: Optional[int] = None, http_client: str = "",
                  dataset_name: str = "", dataset_path: str = "", custom_output_len: Optional[int] = None,
                  multi_turn: Optional[bool] = None, session_mode: str = "", session_header: Optional[str] = None,
                  session_block_size: Optional[int] = None, num_sessions: Optional[int] = None,
                  session_turns: Optional[int] = None, system_prompt_len: Optional[int] = None,
                  session_delay: Optional[float] = None, subagents: Optional[int] = None,
                  sharegpt_output_len: Optional[int] = None, duration: Optional[float] = None,
                  warmup_seconds: Optional[float] = None, cooldown_seconds: Optional[float] = None,
                  find_capacity: Optional[list[str]] = None, goodput_target: Optional[float] = None,
                  capacity_over: str = "", capacity_max: Optional[float] = None, capacity_mode: str = "",
                  capacity_search: str = "", capacity_steps: Optional[int] = None,
                  ramp_window: Optional[float] = None, ramp_min_requests: Optional[int] = None,
                  ramp_hold: Optional[float] = None, reset_prefix_cache: Optional[bool] = None, event_loop: str = "",
                  client_procs: Optional[int] = None, batch: str = "", environment: str = "", ray_address: str = "") -> dict:
        """Benchmark a serving framework (vllm, sglang, atom, builtin) or a YAML (benchmark_config, Magpie's
        benchmark: format); every argument given overrides the YAML and is recorded as an override. Returns a job
        id at once; progress (requests done/total, live tok/s and latencies) through job_status. sweep takes
        'KEY=V1,V2' items, goodput and find_capacity 'ttft:MS' items, as the command line. batch: a batch YAML
        (magpie benchmark --batch), its points run locally or, with environment ray, as Ray tasks."""
        flags = benchmark_flags(state, locals())
        cfg = str(state.path(benchmark_config, "benchmark_config")) if benchmark_config else None
        if cfg:
            state.confine.benchmark_file(Path(cfg), "benchmark_config")
        batch_file = state.path(batch, "batch") if batch else None
        if batch_file is not None:
            state.confine.batch_file(batch_file, "batch")
        request = BenchmarkRequest(benchmark_config=cfg, framework=framework or None, flags=flags,
                                   batch=str(batch_file) if batch_file else None,
                                   environment=environment or None, ray_address=ray_address or None)
        prepared = request.prepare()
        # An image given here is the caller's: the engine's own for the framework, or --allow-commands.
        state.confine.prepared(prepared, "benchmark", image_from="docker_image" if flags.docker_image else None)
        job = state.book.submit(request, state.output_dir(output_dir), prepared)
        return {**describe(job), "warnings": prepared.warnings, "overrides": prepared.overrides,
                "next": "poll job_status(job_id, wait_s=5); job_result(job_id) when finished"}

    def benchmark_batch(configs: list[dict], parallel: bool = False, ray_cluster_address: str = "",
                        ray_shared_storage_path: str = "") -> dict:
        """Several benchmarks as one batch job (magpie benchmark --batch). Each item is either
        {"benchmark_config": PATH, ...benchmark tool arguments} or a Magpie BenchmarkConfig mapping (framework,
        model, envs, ...). Every item is checked before any starts. Returns batch_id (the batch's job id) at once
        with the points (jobs: index, label, state); the job is a detached process that outlives this server, so
        batch_status(batch_id) on this or a later server follows each point (state, run_dir), job_status(batch_id)
        the batch, and job_result(batch_id) is the batch report. Without parallel the points run one after another
        on this host; with parallel (or a ray_cluster_address) they are Ray tasks, each holding tp of Ray's GPU
        resource on one node."""
        if ray_shared_storage_path:
            raise AccessRefused("ray_shared_storage_path: results come back through Ray's object store",
                                hint="leave it unset; shared storage is scheduler.ray.shared_storage in a batch YAML")
        if not configs:
            raise AccessRefused("configs: give at least one benchmark")
        requests = [_batch_request(state, i, item) for i, item in enumerate(configs)]
        environment = "ray" if (parallel or ray_cluster_address) else None  # else the batch's own choice (local)
        return {**batches.submit(requests, environment, ray_cluster_address),
                "next": "poll batch_status(batch_id) for the points (job_status(batch_id, wait_s=5) for the batch); "
                        "job_result(batch_id) is the batch report"}

    def batch_status(batch_id: str) -> dict:
        """The points of a benchmark_batch (batch_id: its job id), from the batch's run folder: each point's
        state (queued, running, completed, failed, cancelled; lost when the batch's process died first), its
        run_dir once it has started (a run folder for get_benchmark_result) and, when the batch is over, its
        metrics. Any server on the same results root finds the batch, also after the one that started it exited."""
        old = _old_batch(state, batch_id)
        if old is not None:
            return old
        return batches.status(batches.find(batch_id))

    async def gap_analysis(trace_dir: str, ctx: Context, start_pct: float = 0.0, end_pct: float = 100.0,
                           top_k: int = 20, min_duration_us: float = 0.0, categories: Optional[list[str]] = None,
                           ignore_categories: Optional[list[str]] = None, output_dir: str = "",
                           generate_clamped_traces: bool = False, find_kernel_sources: bool = False,
                           kernel_source_repos: Optional[list[str]] = None, gpu_arch: str = "", stages: str = "all",
                           rank_csv: bool = True, wait_s: float = 3.0) -> dict:
        """Gap analysis (top GPU kernels in a window of the trace, GPU idle split by cause), TraceLens-style
        stage and roofline reports, and with find_kernel_sources the source file of each kernel in the given
        local repositories. A job: waits up to wait_s (at most 5) and returns the report when done, else the
        job id. categories default to kernel and gpu, as on the command line."""
        if generate_clamped_traces:
            raise AccessRefused("generate_clamped_traces: clamped trace export is not provided",
                                hint="use start_pct/end_pct to analyse a window of the trace")
        target = state.path(trace_dir, "trace_dir")
        if target.is_dir():
            state.confine.files_under(target, "trace_dir")  # a trace that links out of the roots is not read
        repos = [str(p) for p in state.roots.resolve_all(kernel_source_repos or [], "kernel_source_repos")]
        for i, repo in enumerate(repos):
            state.confine.files_under(Path(repo), f"kernel_source_repos[{i}]")
        state.confine.named(gpu_arch, "gpu_arch")
        request = TraceRequest(trace_dir=str(target), stages=stages, top_k=top_k, start_pct=start_pct,
                               end_pct=end_pct, min_duration_us=min_duration_us, categories=categories,
                               ignore_categories=ignore_categories, rank_csv=rank_csv,
                               find_kernel_sources=find_kernel_sources, kernel_source_repos=repos,
                               gpu_arch=gpu_arch or None)

        def start() -> Any:
            from engine.jobs.query import workspace_of
            # Into the benchmark run that recorded the trace, as the command line does; else a new run.
            out = None if (not output_dir and workspace_of(target) is not None) else state.output_dir(output_dir)
            return state.book.submit(request, out)
        job = await anyio.to_thread.run_sync(start)
        info = await wait_with_progress(ctx, job, max(0.0, min(float(wait_s), max_wait)))
        if info["state"] == "completed":
            info["report"] = await anyio.to_thread.run_sync(job.result)
        return info

    async def trace_diff(a: str, b: str, ctx: Context, top_k: int = 20, gpu_arch: str = "", output_dir: str = "",
                         wait_s: float = 3.0) -> dict:
        """Two torch-profiler traces (files, folders of traces or benchmark run folders; a the baseline, b the
        variant) compared per op and per kernel, matched by name and call site: time, calls, share of GPU time
        and roofline figures with a, b, delta and delta %, the largest movers first, and the rows only in a or
        only in b (magpie benchmark --trace-diff A B). A job: waits up to wait_s (at most 5) and returns the
        report when done, else the job id; the run folder holds trace_diff_report.json and the CSVs."""
        paths = []
        for name, value in (("a", a), ("b", b)):
            target = state.path(value, name)
            if target.is_dir():
                state.confine.files_under(target, name)
            paths.append(str(target))
        state.confine.named(gpu_arch, "gpu_arch")
        request = TraceDiffRequest(a=paths[0], b=paths[1], top_k=top_k, gpu_arch=gpu_arch or None)
        job = await anyio.to_thread.run_sync(lambda: state.book.submit(request, state.output_dir(output_dir)))
        info = await wait_with_progress(ctx, job, max(0.0, min(float(wait_s), max_wait)))
        if info["state"] in ("completed", "failed"):
            info["report"] = await anyio.to_thread.run_sync(job.result)
        return info

    def list_benchmark_results(output_dir: str = "", limit: int = 20) -> dict:
        """Benchmark runs under a results folder (default the server's), newest first, with Magpie's keys."""
        folder = state.output_dir(output_dir)
        catalog = RunCatalog([folder])
        catalog.refresh()
        runs = [r for r in catalog.sorted_runs() if r.mode == "benchmark" and state.roots.contains(r.path.resolve())]

        def read(path: Path) -> dict:
            try:
                return state.read_json(path, f"{path.parent.name}/{path.name}")
            except AccessRefused:
                return {"errors": [f"{path.name} links out of the allowed roots: not read"]}
        rows = [{**res.benchmark_summary(r.path, read), "job_state": r.state} for r in runs[:max(1, limit)]]
        return {"output_dir": str(folder), "total_found": len(runs), "showing": len(rows), "runs": rows}

    def get_benchmark_result(workspace_dir: str, include_kernel_summary: bool = True, include_raw_result: bool = False,
                             include_tracelens_files: bool = True) -> dict:
        """A benchmark run's report (workspace_dir: a path or a job id): config, throughput, latency, summary text,
        torch traces, and every TraceLens output, the inference-mode tracelens/ stage folders included."""
        run_dir = state.run_dir(workspace_dir, "workspace_dir")
        path = run_dir / BENCHMARK_REPORT
        report = state.read_json(path, f"workspace_dir {BENCHMARK_REPORT}") if path.is_file() else None
        if report is None:
            raise res.ResultError(f"{run_dir}: no {BENCHMARK_REPORT} (yet)", hint="job_status says whether it still runs")
        out = {k: v for k, v in report.items() if k not in ("result", "repeats", "sweep", "kernel_summary")}
        if include_kernel_summary:
            out["kernel_summary"] = report.get("kernel_summary")
        if include_raw_result:
            out.update({k: report.get(k) for k in ("result", "repeats", "sweep")})
        out["summary_text"] = state.read_text(run_dir / "summary.txt", "workspace_dir summary.txt")
        out["workspace_dir"] = str(run_dir)
        traces = run_dir / "torch_trace"
        out["torch_trace_files"] = sorted(p.relative_to(run_dir).as_posix() for p in traces.rglob("*")
                                          if p.is_file()) if traces.is_dir() else []
        if include_tracelens_files:
            out["tracelens_files"] = res.tracelens_files(run_dir)
        out["resources"] = [run_file_uri(run_dir, rel) for rel in res.run_files(run_dir, limit=200,
                                                                                 inside=state.roots.contains)]
        return out

    def compare_benchmark_reports(workspace_dirs: list[str], labels: Optional[list[str]] = None,
                                  output_dir: str = "", export_format: str = "csv",
                                  allow_different_workloads: bool = False) -> dict:
        """Per-metric deltas of each report against the first (workspace dirs, job ids or report files), with
        the noise verdict of magpie benchmark --compare-reports: a delta inside the run-to-run 95% interval is
        a tie; without repeats the noise is unknown. Runs are compared only when they measured the same
        workload (the effective configs and reports differ in nothing but the server's kernels); otherwise the
        result is refused (success false, refused true) with every difference listed, unless
        allow_different_workloads is true: then the differences come with each comparison."""
        from engine.jobs.query import compare_runs
        if len(workspace_dirs) < 2:
            raise AccessRefused("workspace_dirs: give at least two runs")
        if labels and len(labels) != len(workspace_dirs):
            raise AccessRefused(f"labels: {len(labels)} labels for {len(workspace_dirs)} runs")
        if export_format not in ("csv", "json"):
            raise AccessRefused(f"export_format {export_format!r}: csv or json")
        sides = [_report_side(state, w, f"workspace_dirs[{i}]") for i, w in enumerate(workspace_dirs)]
        names = labels or [p.parent.name for p, _r in sides]
        comparisons = []
        for i in range(1, len(sides)):
            cmp = compare_runs(sides[0][0], sides[i][0], allow_different_workloads=allow_different_workloads)
            comparisons.append({"a": names[0], "b": names[i], "refused": cmp.refused, "message": cmp.message(),
                                "differences": [d.to_dict() for d in cmp.differences], "notes": cmp.notes,
                                "deltas": cmp.deltas})
        refused = [c for c in comparisons if c["refused"]]
        if refused:
            return {"success": False, "refused": True, "baseline": names[0], "reports": [str(p) for p, _r in sides],
                    "comparisons": comparisons, "output_files": [],
                    "errors": [f"{c['a']} vs {c['b']}: {c['message']}" for c in refused],
                    "hint": "pass allow_different_workloads=true to compare them anyway; every difference is then "
                            "returned with the deltas"}
        folder = state.output_dir(output_dir) if output_dir else state.results / "comparisons"
        folder = folder / f"comparison_{time.strftime('%Y%m%d_%H%M%S')}"
        folder.mkdir(parents=True, exist_ok=True)
        files = [str(_export(folder, comparisons, export_format))]
        return {"success": True, "refused": False, "baseline": names[0], "reports": [str(p) for p, _r in sides],
                "comparisons": comparisons, "output_dir": str(folder), "output_files": files, "errors": [],
                "note": "noise 'unknown': a side without repeats has no run-to-run spread to compare against"}

    def suggest_optimizations(analysis_result: Optional[dict] = None, workspace_dir: str = "", top: int = 5) -> dict:
        """Suggestions grounded in measured analysis output, never invented: from a run with TraceLens roofline
        CSVs and gap analysis (workspace_dir: path or job id), each op's roofline bound, % of roofline and time
        share, plus GPU idle that waits on the host; or from one analyze result object (analysis_result)."""
        if bool(analysis_result) == bool(workspace_dir):
            raise AccessRefused("give analysis_result (one analyze result) or workspace_dir (a profiled run)")
        if analysis_result:
            if "results" in analysis_result and "kernel_id" not in analysis_result:
                raise AccessRefused("analysis_result is a whole analyze_report.json (results[] wrapped): pass one "
                                    "element of its results list")
            return res.suggest_from_kernel_result(analysis_result)
        run_dir = state.run_dir(workspace_dir, "workspace_dir")
        rows = res.roofline_rows(run_dir, check=state.file)
        report_path = res.report_in(run_dir)
        report = state.read_json(report_path, f"workspace_dir {report_path.name}") if report_path else {}
        items = res.suggest_from_roofline(rows, max(1, top)) + res.suggest_from_gaps(report)
        out = {"workspace_dir": str(run_dir), "suggestions": items, "roofline_rows_read": len(rows),
               "method": res.HEADROOM_NOTE}
        if not items:
            out["note"] = ("no roofline CSVs or gap analysis in this run: profile it (benchmark with tracelens, or "
                           "gap_analysis on its torch_trace) first")
        return out

    def roofline_table(workspace_dir: str, stage: str = "", top: int = 20) -> dict:
        """The compact roofline rows (TraceLens *_kernel_roofline_simple.csv) of a run, largest kernel time
        first: op, stage, time share, roofline bound, % of roofline, achieved TFLOP/s and TB/s."""
        run_dir = state.run_dir(workspace_dir, "workspace_dir")
        rows = res.roofline_rows(run_dir, stage or None, check=state.file)
        keep = ("stage", "op_name", "param_signature", "operation_count", "kernel_time_ms_sum", "time_pct",
                "roofline_bound", "pct_roofline_mean", "arithmetic_intensity_flops_per_byte", "achieved_tflops_mean",
                "achieved_tbps_mean", "compute_spec", "has_perf_model", "file")
        return {"workspace_dir": str(run_dir), "total": len(rows),
                "rows": [{k: r.get(k) for k in keep} for r in rows[:max(1, top)]],
                "files": sorted({r["file"] for r in rows})}

    def optimize(benchmark_config: str, until: str = "", kernel: str = "", candidates: Optional[list[str]] = None,
                 library: bool = True, output_dir: str = "") -> dict:
        """Start the optimization loop on a clean benchmark YAML: baseline, profiled twin, bottlenecks, harness,
        candidates, correctness-gated compare, integration, re-benchmark, verdict. Returns the loop's job id at
        once; until stops after a step; optimize_status shows the chain."""
        config = state.path(benchmark_config, "benchmark_config")
        state.confine.benchmark_file(config, "benchmark_config")
        chosen = state.roots.resolve_all(candidates or [], "candidates")
        for i, c in enumerate(chosen):
            if c.is_dir():
                state.confine.files_under(c, f"candidates[{i}]")
        request = LoopRequest(benchmark_config=str(config), until=until or None, kernel=kernel or None,
                              candidates=[str(p) for p in chosen], library=library)
        job = state.book.submit(request, state.output_dir(output_dir))
        return {**describe(job), "loop_dir": str(job.run_dir)}

    def optimize_resume(loop_dir: str, until: str = "") -> dict:
        """Continue a loop where it stopped (a killed step restarts); a job like optimize."""
        folder = state.run_dir(loop_dir, "loop_dir")
        _check_loop(state, folder)
        job = state.book.submit(LoopRequest(resume=str(folder), until=until or None), None)
        return {**describe(job), "loop_dir": str(folder)}

    def optimize_status(loop_dir: str) -> dict:
        """The loop's chain of steps (state, time, run folder, result) as loop.json records it."""
        from engine.jobs.query import format_status
        folder = state.run_dir(loop_dir, "loop_dir")
        loop = state.read_json(folder / "loop.json", "loop_dir loop.json")
        return {"loop_dir": str(folder), "status_text": format_status(str(folder)), "loop": loop}

    for fn in (benchmark, benchmark_batch, batch_status, gap_analysis, trace_diff, list_benchmark_results, get_benchmark_result,
               compare_benchmark_reports, suggest_optimizations, roofline_table, optimize, optimize_resume,
               optimize_status):
        add_tool(app, fn)


def _batch_request(state: State, index: int, item: dict) -> tuple[BenchmarkRequest, Path]:
    where = f"configs[{index}]"
    if not isinstance(item, dict):
        raise AccessRefused(f"{where}: expected a mapping")
    if "benchmark_config" in item:
        rest = {k: v for k, v in item.items() if k != "benchmark_config"}
        cfg = state.path(str(item["benchmark_config"]), f"{where}.benchmark_config")
        state.confine.benchmark_file(cfg, f"{where}.benchmark_config")
        framework = rest.pop("framework", None)
        unknown = sorted(set(rest) - set(FLAG_ARGS))
        if unknown:
            close = {k: difflib.get_close_matches(k, FLAG_ARGS, n=1) for k in unknown}
            raise AccessRefused(f"{where}: unknown argument(s) " + ", ".join(
                f"{k} (did you mean {close[k][0]}?)" if close[k] else k for k in unknown),
                hint="the benchmark tool's arguments are accepted beside benchmark_config")
        request = BenchmarkRequest(benchmark_config=str(cfg), framework=framework, flags=benchmark_flags(state, rest, where))
        image_from = f"{where}.docker_image" if request.flags.docker_image else None
    else:
        body = item.get("benchmark", item)
        # Commands, code (a kernel override that is not a bundled one, an image not the engine's: checked
        # once prepared, on the effective framework) and every path it names.
        state.confine.benchmark_body(body, where, inline=True)
        cfg = state.scratch("configs")
        cfg = cfg.with_name(f"batch_{cfg.name}")
        cfg.write_text(dump_yaml({"benchmark": body}))
        request = BenchmarkRequest(benchmark_config=str(cfg))
        image_from = f"{where}.docker_image"  # the whole config is the caller's, its image too
    state.confine.prepared(request.prepare(), where, image_from)  # every point checked before any starts
    return request, cfg


def _report_side(state: State, value: str, argument: str) -> tuple[Path, dict]:
    p = Path(value)
    if p.suffix == ".json":
        path = state.path(value, argument)
    else:
        path = state.run_dir(value, argument) / BENCHMARK_REPORT
    report = state.read_json(path, argument)
    if (path.parent / "config.yaml").exists():
        state.file(path.parent / "config.yaml", f"{argument} config.yaml")  # the comparison reads it too
    side = report.get("repeats") or report.get("result")
    if not side:
        raise res.ResultError(f"{path}: no measured result in this report (state: {report.get('state')})")
    return path, side


def _export(folder: Path, comparisons: list[dict], fmt: str) -> Path:
    if fmt == "json":
        target = folder / "comparison.json"
        target.write_text(json.dumps(comparisons, indent=2))
        return target
    target = folder / "comparison.csv"
    with open(target, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "metric", "a_value", "b_value", "delta", "rel_delta", "ci95_low", "ci95_high", "noise",
                    "verdict"])
        for c in comparisons:
            for metric, d in c["deltas"].items():
                ci = d["delta_ci95"] or [None, None]
                w.writerow([c["a"], c["b"], metric, d["a"], d["b"], d["delta"], d["rel_delta"], ci[0], ci[1],
                            d["noise"], d["verdict"]])
    return target


def _check_loop(state: State, folder: Path) -> None:
    """What a loop to resume names (loop.json: the clean config and the candidates) lies under a root."""
    loop = state.read_json(folder / "loop.json", "loop_dir loop.json")
    if loop.get("config"):
        config = state.path(str(loop["config"]), "loop_dir loop.json config")
        if config.is_file():
            state.confine.benchmark_file(config, "loop_dir loop.json config")
    for i, c in enumerate(loop.get("candidates") or []):
        path = state.path(str(c), f"loop_dir loop.json candidates[{i}]")
        if path.is_dir():
            state.confine.files_under(path, f"loop_dir loop.json candidates[{i}]")


__all__ = ["register"]

"""``magpie benchmark --batch FILE.yaml``: many benchmark points, one batch report.

A batch file lists benchmark configs, or sweeps one config over flag values, or both::

    batch:
      - builtin_tiny_cpu.yaml                  # a benchmark YAML (paths: from this file's folder)
      - config: builtin_tiny_cpu.yaml
        flags: {concurrency: 8, tp: 2}         # the command line's overrides, by their names
    sweep:
      config: vllm_llama3.1-8b_h200.yaml
      flags: {num_prompts: 200}
      over: {concurrency: [8, 16, 32]}         # every combination is a point
    scheduler:
      environment: ray                         # or local: the points one after another here
      ray: {address: "HOST:6379"}

Each point is checked like ``magpie benchmark -b`` before anything runs (an error names the
batch file and the point). On Ray each point is one task holding ``tp`` GPUs (one task's
resources always come from one node); locally the points run in order. Every point gets its
own folder under ``points/`` (its benchmark_report.json, logs, traces), and the batch's
``benchmark_report.json`` compares them. A failed task is a failed point; a cancel stops the
running points (their reports say cancelled) and the ones not started.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field

from engine.cluster.settings import RaySettings
from engine.config.overrides import BenchmarkOverrides
from engine.config.yamlfile import ConfigError, format_loc, load_located_yaml
from engine.runs.schema import SCHEMA_VERSION

EXIT_OK, EXIT_FAIL, EXIT_CANCELLED = 0, 1, 130
# The metrics the batch table shows side by side (the point reports keep all of them).
COMPARED = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
            "median_itl_ms", "median_e2el_ms", "completed", "failed")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatchPoint(_Strict):
    config: str
    flags: dict[str, Any] = Field(default_factory=dict)


class BatchSweep(_Strict):
    config: str
    flags: dict[str, Any] = Field(default_factory=dict)
    over: dict[str, list[Any]]


class BatchScheduler(_Strict):
    environment: Optional[str] = Field(None, pattern="^(local|ray)$")
    ray: Optional[RaySettings] = None


class BatchFile(_Strict):
    batch: list[Any] = Field(default_factory=list)
    sweep: Optional[BatchSweep] = None
    scheduler: BatchScheduler = Field(default_factory=BatchScheduler)


@dataclass
class PreparedBatch:
    request: Any
    label: str
    points: list[Any]  # BenchmarkRequest, one a point
    prepared: list[Any]  # their PreparedBenchmark
    environment: str = "local"
    ray: Optional[RaySettings] = None
    batch_file: Optional[str] = None
    warnings: list[str] = field(default_factory=list)
    overrides: list[dict] = field(default_factory=list)

    def effective_config(self) -> dict:
        return {"mode": "benchmark", "batch_file": self.batch_file, "environment": self.environment,
                "scheduler": {"ray": self.ray.model_dump()} if self.ray else None,
                "points": [{"index": i, "label": _point_label(i, p), "benchmark_config": r.benchmark_config,
                            "flags": r.flags.given(),
                            "benchmark": p.config.model_dump(by_alias=True)}
                           for i, (r, p) in enumerate(zip(self.points, self.prepared))],
                "warnings": self.warnings}


def _point_label(i: int, prepared: Any) -> str:
    load = prepared.config.workload()
    return f"{i:02d}_{prepared.label}_tp{load.tp}_c{load.concurrency}"


def _resolve(base: Path, path: str) -> str:
    p = Path(path).expanduser()
    return str((p if p.is_absolute() else base / p).resolve())


def _points_of(data: BatchFile, base: Path, where: str, doc: Any = None) -> list[tuple[str, str, dict]]:
    """(where, config path, flags) of every point, in the file's order; flags that are no override
    are named with their file:line (``doc``) and the nearest valid one."""
    out = []
    problems: list[str] = []

    def check(flags: dict, loc: tuple) -> None:
        try:
            BenchmarkOverrides.build(flags, where=format_loc(loc),
                                     locate=(lambda key: doc.where(loc + (key,))) if doc is not None else None)
        except ConfigError as exc:
            problems.extend(exc.problems if doc is not None else [f"{where}: {p}" for p in exc.problems])
    for i, item in enumerate(data.batch):
        at = f"{where}: batch[{i}]"
        if isinstance(item, str):
            out.append((at, _resolve(base, item), {}))
        elif isinstance(item, dict):
            try:
                pt = BatchPoint.model_validate(item)
            except Exception as exc:
                raise ConfigError([f"{at}: {exc}"]) from None
            check(pt.flags, ("batch", i, "flags"))
            out.append((at, _resolve(base, pt.config), dict(pt.flags)))
        else:
            raise ConfigError([f"{at}: give a benchmark YAML path or a mapping with config: and flags:"])
    if data.sweep is not None:
        sw = data.sweep
        keys = list(sw.over)
        check(sw.flags, ("sweep", "flags"))
        check({k: None for k in keys}, ("sweep", "over"))
        if not keys or any(not v for v in sw.over.values()):
            raise ConfigError([f"{where}: sweep.over: give each key a non-empty list of values"])
        for j, values in enumerate(itertools.product(*(sw.over[k] for k in keys))):
            out.append((f"{where}: sweep point {j} ({dict(zip(keys, values))})", _resolve(base, sw.config),
                        {**sw.flags, **dict(zip(keys, values))}))
    if problems:
        raise ConfigError(problems)
    return out


def prepare_batch(request: Any, plan_only: bool = False) -> PreparedBatch:
    """Every point checked before a folder exists; the environment and its Ray settings."""
    from engine.jobs.requests import BenchmarkRequest
    cli_flags = request.flags.given()
    warnings: list[str] = []
    scheduler = BatchScheduler()
    if request.batch:
        doc = load_located_yaml(request.batch)
        if not isinstance(doc.data, dict):
            raise ConfigError([f"{request.batch}:1: expected a mapping with batch: and/or sweep:"])
        try:
            data = BatchFile.model_validate(doc.data)
        except Exception as exc:
            raise ConfigError([f"{request.batch}: {exc}"]) from None
        specs = _points_of(data, doc.path.resolve().parent, str(request.batch), doc)
        if not specs:
            raise ConfigError([f"{request.batch}: no points: add a batch: list or a sweep:"])
        if request.benchmark_config:
            warnings.append(f"-b {request.benchmark_config} ignored: the batch file gives the points")
        scheduler = data.scheduler
        label = f"batch-{Path(request.batch).stem}"
    else:
        if not request.benchmark_config:
            raise ConfigError(["magpie benchmark -e ray: give -b CONFIG.yaml (one point) or --batch FILE.yaml"])
        specs = [("command line", str(Path(request.benchmark_config).expanduser().resolve()), {})]
        label = f"batch-{Path(request.benchmark_config).stem}"
    points, prepared, problems = [], [], []
    magpie_ray = _magpie_ray_configs(specs, cli_flags)
    for where, config, flags in specs:
        point_flags = {**flags, **cli_flags}
        if config in magpie_ray:
            # Magpie's run_mode ray: the point is a Ray task, and its server a process of that node.
            point_flags["run_mode"] = "local"
        point = BenchmarkRequest(benchmark_config=config, framework=request.framework, flags=point_flags)
        try:
            prepared.append(point._prepare_one(plan_only))
            points.append(point)
        except ConfigError as exc:
            problems += [f"{where}: {p}" for p in exc.problems]
    if problems:
        raise ConfigError(problems)
    environment = request.environment or scheduler.environment or \
        ("ray" if scheduler.ray is not None or magpie_ray else "local")
    ray = None
    if environment == "ray":
        from engine.extras import require_extra
        require_extra("ray", "running benchmark points on Ray (-e ray)")
        ray = scheduler.ray or _ray_from_magpie(magpie_ray)
        if request.ray_address:
            ray = ray.model_copy(update={"address": request.ray_address})
    return PreparedBatch(request=request, label=label, points=points, prepared=prepared, environment=environment,
                         ray=ray, batch_file=str(Path(request.batch).resolve()) if request.batch else None,
                         warnings=warnings + [w for p in prepared for w in p.warnings])


def _magpie_ray_configs(specs: list[tuple[str, str, dict]], cli_flags: dict) -> dict[str, Any]:
    """The points whose YAML says Magpie's ``run_mode: ray`` (and no flag says another mode): config
    path -> its ``ray_config`` (None when the YAML has none)."""
    from engine.config.benchmark import load_benchmark_config
    out: dict[str, Any] = {}
    for _where, config, flags in specs:
        if {**flags, **cli_flags}.get("run_mode"):
            continue
        try:
            cfg, _doc = load_benchmark_config(config)
        except ConfigError:
            continue  # reported with the point's other problems
        if cfg.run_mode == "ray":
            out[config] = cfg.ray_config
    return out


def _ray_from_magpie(magpie_ray: dict[str, Any]) -> RaySettings:
    """RaySettings from the first Magpie ``ray_config`` (its cluster_address, shared storage, CPUs)."""
    for rc in magpie_ray.values():
        if rc is not None:
            return RaySettings.model_validate(rc.ray_settings())
    return RaySettings()


# ---------------------------------------------------------------------- running
def _point_row(i: int, prepared: Any, request: Any) -> dict:
    return {"index": i, "label": _point_label(i, prepared), "benchmark_config": request.benchmark_config,
            "flags": request.flags.given(),
            "tp": prepared.config.workload().tp, "state": "pending", "exit_code": None,
            "folder": None, "node": None, "error": None, "metrics": {}}


def _fill(row: dict, report: dict) -> None:
    result = report.get("result") or {}
    row["metrics"] = {k: result.get(k) for k in COMPARED if k in result}
    row["success"] = report.get("success")
    row["errors"] = list(report.get("errors") or [])[:5]


def run_batch(prepared: PreparedBatch, ws: Any, cancel: Any, log: Callable[[str], None]) -> tuple[int, str, dict]:
    started = time.time()
    rows = [_point_row(i, p, r) for i, (p, r) in enumerate(zip(prepared.prepared, prepared.points))]
    error = None
    cluster = None
    try:
        if prepared.environment == "ray":
            cluster = _run_on_ray(prepared, ws, cancel, rows, log)
        else:
            _run_here(prepared, ws, cancel, rows, log)
    except Exception as exc:  # the report still says which points got where
        error = f"{type(exc).__name__}: {exc}"
    for row in rows:
        if row["state"] == "pending":
            row["state"] = "cancelled" if cancel.cancelled else "failed"
            row["error"] = row["error"] or (f"not reached: run {cancel.reason}" if cancel.cancelled else error)
    states = [r["state"] for r in rows]
    state = "cancelled" if cancel.cancelled else ("completed" if all(s == "completed" for s in states) else "failed")
    code = EXIT_CANCELLED if cancel.cancelled else (EXIT_OK if state == "completed" else EXIT_FAIL)
    report = {"schema_version": SCHEMA_VERSION, "mode": "benchmark", "batch": True, "state": state,
              "success": state == "completed", "exit_code": code, "run_environment": prepared.environment,
              "batch_file": prepared.batch_file, "workspace_dir": str(ws.root), "points": rows,
              "compared_metrics": list(COMPARED), "warnings": prepared.warnings,
              "execution_time": round(time.time() - started, 3)}
    from engine.runs.provenance import batch_provenance
    report["provenance"] = batch_provenance(ws.root)
    if error:
        report["error"] = error
    if cancel.cancelled:
        report["cancel_reason"] = cancel.reason
    if cluster is not None:
        report["cluster"] = cluster
    ws.write_json("benchmark_report.json", report)
    ws.write_text("summary.txt", render_batch(report))
    return code, state, report


def _share_servers(prepared: PreparedBatch) -> set[int]:
    """server_lifecycle in a local batch: a point that would stop its server (cleanup: true) keeps it
    for the points after it, which use it when their server settings are the same; the indexes of
    the points changed so. The batch stops those servers at its end (``_stop_shared``)."""
    enabled = [i for i, p in enumerate(prepared.prepared) if p.config.server_lifecycle.enabled]
    changed = set()
    for i in enabled[:-1]:
        cfg = prepared.prepared[i].config
        if cfg.server_lifecycle.cleanup:
            cfg.server_lifecycle.cleanup = False
            prepared.prepared[i].warnings.append("server_lifecycle: the server is kept for the next points of the batch "
                                                 "(the batch stops it at its end)")
            changed.add(i)
    return changed


def _stop_shared(prepared: PreparedBatch, folders: dict[int, str]) -> None:
    """Stop the servers the batch kept for its own points (never one a point was asked to keep)."""
    from engine.bench import lifecycle
    dirs = {lifecycle.pid_dir(p.config.server_lifecycle.pid_dir) for p in prepared.prepared
            if p.config.server_lifecycle.enabled}
    mine = set(folders.values())
    for folder in dirs:
        for path, rec in lifecycle.records(folder):
            if rec.get("kept_by_run") in mine:
                lifecycle.stop_kept(rec)
                path.unlink(missing_ok=True)


def _run_here(prepared: PreparedBatch, ws: Any, cancel: Any, rows: list[dict], log: Callable[[str], None]) -> None:
    from engine.jobs.modes import run_benchmark
    from engine.runs.workspace import Workspace
    shared = _share_servers(prepared)
    folders: dict[int, str] = {}
    try:
        for row, point, ready in zip(rows, prepared.points, prepared.prepared):
            if cancel.cancelled:
                break
            folder = ws.path("points", row["label"])
            folder.mkdir(parents=True, exist_ok=True)
            if row["index"] in shared:
                folders[row["index"]] = str(folder)
            row["state"] = "running"
            ws.events.emit("progress", phase="batch", done=row["index"], total=len(rows), point_index=row["index"])
            outcome = run_benchmark(point, cancel=cancel, workspace=Workspace(folder), log=log, prepared=ready)
            row.update(state=outcome.state, exit_code=outcome.exit_code, folder=str(folder))
            _fill(row, outcome.report)
    finally:
        if folders:
            _stop_shared(prepared, folders)
    ws.events.emit("progress", phase="batch", done=sum(r["state"] != "running" for r in rows), total=len(rows))


def _run_on_ray(prepared: PreparedBatch, ws: Any, cancel: Any, rows: list[dict], log: Callable[[str], None]) -> dict:
    import ray

    from engine.cluster.ray_eval import TaskBoard, connect, largest_node
    from engine.cluster.raytasks import benchmark_point_task, pack_dir
    s = prepared.ray
    cluster = connect(s)
    board = TaskBoard(ws.root, cluster, s, ws.events)
    most = largest_node(ray.nodes(), s.gpu_resource)
    uploads: dict[str, Any] = {}
    by_key = {}
    for row, point in zip(rows, prepared.points):
        bundles = []
        if not s.shared_storage:
            folder = str(Path(point.benchmark_config).parent)
            if folder not in uploads:
                uploads[folder] = ray.put(pack_dir(Path(folder)))
            bundles = [(folder, uploads[folder])]
        key = f"point_{row['label']}"
        by_key[key] = row
        if row["tp"] > most:  # Ray would keep it pending for ever
            row["state"] = "failed"
            row["error"] = (f"needs tp={row['tp']} of {s.gpu_resource} on one node; the largest node of the cluster "
                            f"has {most:g}")
            continue
        shared = str(ws.path("points", row["label"])) if s.shared_storage else None
        board.submit(key, benchmark_point_task, {"request": point, "bundles": bundles, "shared_root": shared},
                     {s.gpu_resource: row["tp"]}, {"point": row["index"], "kind": "benchmark"})
        row["state"] = "submitted"
    log(f"magpie benchmark: {len(rows)} point(s) submitted to Ray ({cluster['address']})")
    done = 0
    while board.pending:
        if cancel.cancelled:
            board.cancel(cancel.reason or "cancelled")
        for key, result, err in board.next_done():
            row = by_key[key]
            done += 1
            folder = None
            if err is not None:
                row["state"] = "cancelled" if type(err).__name__ == "TaskCancelledError" else "failed"
                row["error"] = f"Ray task: {type(err).__name__}: {str(err).strip()[-800:]}"
            elif result.get("skipped"):
                row["state"], row["error"] = "cancelled", f"not started: {result.get('reason')}"
            else:
                folder = board.take_files(result, ws.path("points", row["label"]))
                row.update(state=result["state"], exit_code=result["exit_code"], node=result["node"])
                _fill(row, result["report"])
            row["folder"] = folder
            board.finish(key, result, err, folder)
            ws.events.emit("progress", phase="batch", done=done, total=len(rows), point_index=row["index"])
            log(f"  point {row['label']}: {row['state']}")
    return {**cluster, "file": "cluster.json"}


def render_batch(report: dict) -> str:
    head = ["point", "state", "tp"] + [m for m in COMPARED]
    lines = [f"magpie benchmark batch ({report['run_environment']}): {len(report['points'])} point(s), state {report['state']}",
             "  ".join(head)]
    for r in report["points"]:
        vals = [r["label"], r["state"], str(r["tp"])]
        for m in COMPARED:
            v = r["metrics"].get(m)
            vals.append("-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))
        lines.append("  ".join(vals))
        if r.get("error"):
            lines.append(f"    {r['error'].strip().splitlines()[0]}")
    lines.append(f"workspace: {report['workspace_dir']}")
    return "\n".join(lines) + "\n"

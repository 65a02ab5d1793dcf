"""Running a prepared batch (``engine.cluster.batch``): its points one after another here, or as
Ray tasks, each a run of the benchmark mode in a folder of its own under ``points/``; then the
batch's ``benchmark_report.json`` and ``summary.txt`` that compare them.

The benchmark mode of one point is given by the caller (``run_point``: ``engine.jobs.modes``
passes its ``run_benchmark``), so the batch runs below the modes and never imports them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from engine.cluster.batch import PreparedBatch, _point_label
from engine.runs.schema import SCHEMA_VERSION

EXIT_OK, EXIT_FAIL, EXIT_CANCELLED = 0, 1, 130
# The metrics the batch table shows side by side (the point reports keep all of them).
COMPARED = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
            "median_itl_ms", "median_e2el_ms", "completed", "failed")
# The benchmark mode for one point: run_point(request, cancel=, workspace=, log=, prepared=) -> its outcome
# (exit_code, state, report), as engine.jobs.modes.run_benchmark.
PointRunner = Callable[..., Any]


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


def run_batch(prepared: PreparedBatch, ws: Any, cancel: Any, log: Callable[[str], None],
              run_point: PointRunner) -> tuple[int, str, dict]:
    started = time.time()
    rows = [_point_row(i, p, r) for i, (p, r) in enumerate(zip(prepared.prepared, prepared.points))]
    error = None
    cluster = None
    try:
        if prepared.environment == "ray":
            cluster = _run_on_ray(prepared, ws, cancel, rows, log, run_point)
        else:
            _run_here(prepared, ws, cancel, rows, log, run_point)
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


def _run_here(prepared: PreparedBatch, ws: Any, cancel: Any, rows: list[dict], log: Callable[[str], None],
              run_point: PointRunner) -> None:
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
            outcome = run_point(point, cancel=cancel, workspace=Workspace(folder), log=log, prepared=ready)
            row.update(state=outcome.state, exit_code=outcome.exit_code, folder=str(folder))
            _fill(row, outcome.report)
    finally:
        if folders:
            _stop_shared(prepared, folders)
    ws.events.emit("progress", phase="batch", done=sum(r["state"] != "running" for r in rows), total=len(rows))


def _run_on_ray(prepared: PreparedBatch, ws: Any, cancel: Any, rows: list[dict], log: Callable[[str], None],
                run_point: PointRunner) -> dict:
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
        board.submit(key, benchmark_point_task, {"request": point, "run": run_point, "bundles": bundles,
                                                      "shared_root": shared},
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

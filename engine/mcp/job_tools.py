"""Job tools: status, result, cancel, list, and Magpie's Ray task tools mapped onto them."""

from pathlib import Path
from typing import Any, Optional

import anyio
from mcp.server.mcpserver import Context

from engine.jobs.query import CancelRefused, RunInfo
from engine.mcp.jobs import describe
from engine.mcp.results import ResultError
from engine.mcp.server import State, add_tool, wait_with_progress


def register(app: Any, state: State) -> None:
    max_wait = state.options.max_wait_s

    async def job_status(job_id: str, ctx: Context, wait_s: float = 0.0) -> dict:
        """State and progress of a job (a run folder name). wait_s (at most 5) waits for it to finish,
        sending progress notifications meanwhile; it returns early when the job ends."""
        job = await anyio.to_thread.run_sync(state.book.find, job_id)
        return await wait_with_progress(ctx, job, max(0.0, min(float(wait_s), max_wait)))

    def job_result(job_id: str, include_report: bool = True) -> dict:
        """The job's report as written (analyze_report.json, compare_report.json, benchmark_report.json,
        trace_analysis_report.json, loop.json), with its state; report is null while it runs."""
        job = state.book.find(job_id)
        out = describe(job)
        # Every file read back must resolve inside the roots: a report or summary.txt that links out
        # of them is refused by name, never read.
        report = None
        path = RunInfo(path=job.run_dir, report_name=Path(out["report"]).name if out.get("report") else None).report_path
        if path is not None:
            try:
                report = state.read_json(path, f"{job_id}/{path.name}")
            except ResultError:
                report = None  # being written, or not JSON: as job.result() says
        if report is None and out["mode"] == "loop" and (job.run_dir / "loop.json").is_file():
            report = state.read_json(job.run_dir / "loop.json", f"{job_id}/loop.json")
        out["report"] = report if include_report else None
        out["summary_text"] = state.read_text(job.run_dir / "summary.txt", f"{job_id}/summary.txt")
        return out

    def job_cancel(job_id: str, reason: str = "cancelled through MCP") -> dict:
        """Cancel a running job: its processes are stopped and its report is still written (state
        cancelled, with the states each stage reached)."""
        job = state.book.find(job_id)
        before = describe(job)
        if before["finished"]:
            return {**before, "cancelled": False, "message": f"already finished ({before['state']})"}
        try:
            message = state.book.cancel(job, reason)
        except CancelRefused as exc:
            return {**before, "cancelled": False, "message": str(exc)}
        return {**describe(job), "cancelled": True, "message": message}

    def job_list(limit: int = 20, mode: Optional[str] = None, state_filter: Optional[str] = None) -> dict:
        """Runs under the server's results folders, newest first (mode: analyze, compare, benchmark,
        trace, loop; state_filter: running, completed, failed, cancelled, lost)."""
        jobs = state.book.list(limit=max(1, min(limit, 500)), mode=mode, state=state_filter)
        return {"total": len(jobs), "results_dirs": [str(d) for d in state.book.results_dirs], "jobs": jobs}

    for fn in (job_status, job_result, job_cancel, job_list):
        add_tool(app, fn)

    # Magpie's Ray task tools, for its skill: a task id is a job id here. The cluster arguments are
    # accepted for compatibility; jobs run on this host (see docs/mcp.md).
    def ray_task_status(task_id: str, ray_cluster_address: str = "", ray_shared_storage_path: str = "") -> dict:
        """Magpie's ray_task_status: the status of a job (task_id = job_id), RUNNING/SUCCEEDED/FAILED/UNKNOWN."""
        _no_cluster(ray_cluster_address, ray_shared_storage_path)
        info = describe(state.book.find(task_id))
        status = {"running": "RUNNING", "pending": "RUNNING", "completed": "SUCCEEDED"}.get(
            info["state"], "FAILED" if info["finished"] else "UNKNOWN")
        return {"task_id": task_id, "status": status, "job": info}

    def ray_task_result(task_id: str, ray_cluster_address: str = "", ray_shared_storage_path: str = "") -> dict:
        """Magpie's ray_task_result: the job's report plus _task_id."""
        _no_cluster(ray_cluster_address, ray_shared_storage_path)
        out = job_result(task_id)
        return {**(out["report"] or {"status": out["state"], "hint": "not finished; poll ray_task_status"}),
                "_task_id": task_id}

    def ray_task_cancel(task_id: str, ray_cluster_address: str = "", ray_shared_storage_path: str = "") -> dict:
        """Magpie's ray_task_cancel: cancel the job."""
        _no_cluster(ray_cluster_address, ray_shared_storage_path)
        out = job_cancel(task_id)
        return {"task_id": task_id, "cancelled": out["cancelled"], "message": out["message"]}

    def ray_task_list(ray_cluster_address: str = "", ray_shared_storage_path: str = "") -> dict:
        """Magpie's ray_task_list: the jobs, as {total, tasks[{task_id, status}]}."""
        _no_cluster(ray_cluster_address, ray_shared_storage_path)
        jobs = state.book.list(limit=100)
        return {"total": len(jobs), "tasks": [{"task_id": j["job_id"], "status": j["state"]} for j in jobs]}

    for fn in (ray_task_status, ray_task_result, ray_task_cancel, ray_task_list):
        add_tool(app, fn)


def _no_cluster(address: str, storage: str) -> None:
    from engine.mcp.security import AccessRefused
    if address or storage:
        raise AccessRefused("ray_cluster_address / ray_shared_storage_path: this server runs jobs on its own host",
                            hint="leave them empty; start the server on the node that should run the work")

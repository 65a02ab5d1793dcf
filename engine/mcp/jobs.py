"""The server's view of jobs: submit through the job API, find a job again by its id, and describe
it the same way to every tool.

A job id is its run folder's name. The folder is the truth (engine/jobs/api.py), so a job started
by an earlier server, or from the command line, is found by scanning the results folders this
server writes to; jobs this server started are also held with their execution, so their state and
cancel go through the executor.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Optional

from engine.errors import MagpieError
from engine.jobs import Job, attach, submit
from engine.jobs.api import JobError
from engine.jobs.query import FINISHED_STATES, RunCatalog, RunInfo, read_new_events
from engine.mcp.security import AccessRefused

EXECUTOR = "local-process"  # a detached child: a job outlives the tool call and the server


class JobBook:
    def __init__(self, results_dirs: list[Path], cwd: Path, roots: Any = None) -> None:
        self._lock = threading.Lock()
        self.results_dirs: list[Path] = list(results_dirs)
        self.cwd = cwd
        self.roots = roots  # security.Roots: a run folder (and its event files) must resolve inside them
        self.jobs: dict[str, Job] = {}

    def _inside(self, path: Path) -> bool:
        return self.roots is None or self.roots.contains(path.resolve())

    def check_run_dir(self, run_dir: Path, job_id: str) -> None:
        """A run folder found under a results folder is used only when it, and the files its state
        is read from, resolve inside the roots: a link out of them is refused by name."""
        for p in (run_dir, run_dir / "events.jsonl", run_dir / "job.json"):
            if os.path.lexists(p) and not self._inside(p):
                raise AccessRefused(f"job_id {job_id}: {p} resolves to {p.resolve()}, outside the allowed roots",
                                    hint="a run folder that links out of the roots is not read; remove the link")

    def remember_dir(self, folder: Path) -> None:
        with self._lock:
            if folder not in self.results_dirs:
                self.results_dirs.append(folder)

    def submit(self, request: Any, output_dir: Optional[Path], prepared: Any = None) -> Job:
        """``prepared``: the tool's own ``request.prepare()`` (the one it confined), run as it is."""
        if output_dir is not None:
            self.remember_dir(output_dir)
        job = submit(request, output_dir, executor=EXECUTOR, cwd=self.cwd, prepared=prepared)
        with self._lock:
            self.jobs[job.id] = job
        self.remember_dir(job.run_dir.parent)
        return job

    def find(self, job_id: str) -> Job:
        """A job by its id (the run folder's name); JobError naming the folders searched."""
        job_id = job_id.strip()
        with self._lock:
            job = self.jobs.get(job_id)
            dirs = list(self.results_dirs)
        if job is not None:
            return job
        if job_id and "/" not in job_id and job_id not in (".", ".."):
            for d in dirs:
                if (d / job_id).is_dir():
                    self.check_run_dir(d / job_id, job_id)
                    job = attach(d / job_id)
                    with self._lock:
                        self.jobs[job_id] = job
                    return job
        raise JobError(f"no job {job_id!r} under {', '.join(map(str, dirs))}",
                       hint="job ids are run folder names, as analyze/compare/benchmark/optimize and job_list return")

    def cancel(self, job: Job, reason: str, start_wait_s: float = 120.0) -> str:
        """Cancel a job; the message says how. A job whose process has not yet said run_started is
        cancelled as soon as it does: a signal that arrives before the child has installed its
        handlers would end it without a report."""
        if describe(job)["state"] != "pending":
            job.cancel(reason)
            return "cancel sent; poll job_status for the final state"

        def when_started() -> None:
            deadline = time.monotonic() + start_wait_s
            while time.monotonic() < deadline:
                state = describe(job)["state"]
                if state != "pending":
                    if state == "running":
                        try:
                            job.cancel(reason)
                        except MagpieError:
                            pass  # it finished in between
                    return
                time.sleep(0.05)
        threading.Thread(target=when_started, daemon=True, name=f"magpie-mcp-cancel-{job.id}").start()
        return "the job had not started yet: the cancel is sent as soon as its process is ready"

    def list(self, limit: int = 20, mode: Optional[str] = None, state: Optional[str] = None) -> list[dict]:
        catalog = RunCatalog(self.results_dirs)
        catalog.refresh()
        out = []
        for info in catalog.sorted_runs():
            if not (self._inside(info.path) and self._inside(info.path / "events.jsonl")):
                continue  # a link out of the roots: not listed
            if mode and info.mode != mode:
                continue
            if state and info.state != state:
                continue
            out.append({"job_id": info.name, "mode": info.mode, "label": info.label, "state": info.state,
                        "progress": info.progress_text, "run_dir": str(info.path), "started": info.started,
                        "exit_code": info.exit_code})
            if len(out) >= limit:
                break
        return out


def describe(job: Job) -> dict:
    """What job_status returns: state, progress, folder, and the report's name once written."""
    p = job.progress()
    info = RunInfo(path=job.run_dir)  # the report name and the error, from the same events
    read_new_events(info)
    out: dict[str, Any] = {
        "job_id": job.id, "state": p.state, "finished": p.state in FINISHED_STATES or p.state == "lost",
        "mode": info.mode, "stage": p.stage, "done": p.done, "total": p.total,
        "elapsed_s": round(p.elapsed_s, 3) if p.elapsed_s is not None else None, "run_dir": str(job.run_dir),
    }
    if info.live:
        out["live"] = info.live
    # The typed run state (engine.runs.state) and its one line, as the workbench shows them.
    out["progress"] = info.progress_text
    out["status"] = info.status.to_dict()
    if info.exit_code is not None:
        out["exit_code"] = info.exit_code
    if info.error:
        out["error"] = info.error
    report = info.report_path
    if report is not None:
        out["report"] = str(report)
        out["report_uri"] = run_file_uri(job.run_dir, report.name)
    return out


def run_file_uri(run_dir: Path, rel: str) -> str:
    return f"magpie://runs/{run_dir.name}/{rel}"

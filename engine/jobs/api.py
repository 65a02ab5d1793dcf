"""The job API: submit a request, get a job whose run folder is the truth.

    job = submit(KernelRequest(mode="compare", kernel_config="k.yaml"), "./results")
    job.id, job.run_dir          # known at once: the folder exists before the work starts
    job.state(), job.progress()  # read from the folder's events.jsonl
    job.wait(); job.result()     # the report, as written
    job.cancel()                 # the report is still written, state "cancelled"
    attach(job.run_dir)          # the same job from another process, after the caller went away

Where the work runs is an executor looked up by name in ``EXECUTORS``: ``in-process`` and
``local-process`` (``engine.jobs.executors``), ``ray`` and ``container``
(``engine.cluster.executors``), registered here like any other with ``register_executor``. The
modes below know none of them; an executor knows the modes, never this module.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from engine.cluster.executors import ContainerExecutor, RayExecutor
from engine.errors import MagpieError
# The executors of this machine and their helpers, importable from here as before.
from engine.jobs.executors import (  # noqa: F401
    CANCEL_SIGNALS, Execution, Executor, InProcessExecutor, LocalProcessExecutor, cancel_signals_held,
    console_log_path, engine_env, release_cancel_signals,
)
from engine.jobs.modes import JobOutcome, request_file_for, run_title, workspace_for
from engine.jobs.requests import parse_request, save_prepared
from engine.runs.catalog import FINISHED_STATES, RunInfo, cancel_run, process_gone, read_new_events, run_gone
from engine.runs.process import CancelToken, install_signal_handlers
from engine.runs.state import RunStatus, status_text

JOB_FILE = "job.json"
JOB_SCHEMA_VERSION = 1


class JobError(MagpieError):
    title = "job"


def cancel_on_signals() -> CancelToken:
    """A cancel token that SIGINT, SIGTERM and SIGHUP set (a second Ctrl-C stops at once): for a
    front end that runs a request in its own main thread (``run_request(..., cancel=...)``); the
    report is still written, state "cancelled"."""
    token = CancelToken()
    install_signal_handlers(token)
    return token


# --------------------------------------------------------------------------- where work runs
# The executors by name: the two of this machine (engine.jobs.executors) and the cluster's, which
# are registered here like any other (Ray and docker load only when a job uses them).
EXECUTORS: dict[str, Any] = {"in-process": InProcessExecutor, "local-process": LocalProcessExecutor}


def register_executor(name: str, factory: Any) -> None:
    """Plug in an executor (container, Ray): ``factory(**options)`` returns an ``Executor``."""
    EXECUTORS[name] = factory


register_executor("ray", RayExecutor)
register_executor("container", ContainerExecutor)


# --------------------------------------------------------------------------- the job
@dataclass
class Progress:
    state: str
    stage: str
    done: Optional[int]
    total: Optional[int]
    elapsed_s: Optional[float]
    text: str = ""  # the run state in one line, as the workbench shows it (engine.runs.state)
    status: Optional[RunStatus] = None


class Job:
    """A run, by its folder. With an ``execution`` (this process submitted it) state and cancel go
    through the executor too; attached (``attach``) they come from the folder and the pid."""

    def __init__(self, run_dir: Path, execution: Optional[Execution] = None) -> None:
        self.run_dir = Path(run_dir)
        self.execution = execution
        self._info = RunInfo(path=self.run_dir)

    @property
    def id(self) -> str:
        return self.run_dir.name

    @property
    def record(self) -> dict:
        try:
            from engine.safeio import MAX_SMALL_TEXT_BYTES, read_json
            return read_json(self.run_dir / JOB_FILE, MAX_SMALL_TEXT_BYTES, "job.json")  # never a FIFO's wait
        except (OSError, ValueError):
            return {}

    @property
    def pid(self) -> Optional[int]:
        if self.execution is not None and self.execution.pid is not None:
            return self.execution.pid
        self._refresh()
        return self._info.pid if self._info.pid is not None else self.record.get("pid")

    def _refresh(self) -> RunInfo:
        read_new_events(self._info)
        return self._info

    def state(self) -> str:
        """pending (submitted, not started), running, completed, failed, cancelled, or lost
        (the process is gone and never said it finished)."""
        info = self._refresh()
        if info.is_finished:
            return info.state
        if self.execution is not None:
            if self.execution.alive():
                return info.state
            self._refresh()
            return info.state if info.is_finished else "lost"
        if self._process_gone() is not None:
            self._refresh()
            return info.state if info.is_finished else "lost"
        return info.state

    def _process_gone(self) -> Optional[str]:
        """Why the job's recorded process is no longer it (None while it is, or none is known): the
        pid of run_started, else the one job.json recorded at submission, each checked with the
        start time recorded beside it (a reused pid is another process)."""
        if self._info.pid is not None:
            return run_gone(self._info)
        record = self.record
        pid = record.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            return None
        start = record.get("start_time")
        pgid = record.get("pgid")
        return process_gone(pid, start if isinstance(start, int) else None, pgid if isinstance(pgid, int) else None,
                            self.run_dir / "events.jsonl")

    def progress(self) -> Progress:
        info = self._refresh()
        state = self.state()
        status = info.status.model_copy(update={"state": state})  # "lost" is the job's word, not the catalog's yet
        return Progress(state, info.stage, info.done, info.total, info.elapsed(), status_text(status), status)

    def result(self) -> Optional[dict]:
        """The report once written (None before)."""
        info = self._refresh()
        path = info.report_path
        if path is None:
            return None
        try:
            from engine.safeio import read_json
            return read_json(path)  # a regular file under the report size cap
        except (OSError, ValueError):
            return None

    def wait(self, timeout: Optional[float] = None, poll_s: float = 0.1) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.execution is not None:
            self.execution.wait(timeout)
        while self.state() not in FINISHED_STATES:
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
        return self.state()

    def cancel(self, reason: str = "cancelled") -> None:
        if self.execution is not None:
            self.execution.cancel(reason)
            return
        info = self._refresh()
        cancel_run(info)

    @property
    def outcome(self) -> Optional[JobOutcome]:
        """In-process only: the mode's return value."""
        return getattr(self.execution, "outcome", None)


def submit(request: Any, output_dir: Union[Path, str, None] = None, *, executor: Union[str, Executor] = "local-process",
           prepared: Any = None, **executor_options: Any) -> Job:
    """Check the request (a ConfigError before anything starts), make its run folder, start it.
    ``prepared``: the caller's ``request.prepare()`` (a front end that showed it first), used as
    it is; the executor's process gets it too, so that a launch prepares once."""
    if isinstance(request, dict):
        request = parse_request(request)
    if isinstance(executor, str):
        try:
            factory = EXECUTORS[executor]
        except KeyError:
            raise JobError(f"unknown executor {executor!r}", hint=f"one of {', '.join(sorted(EXECUTORS))}") from None
        executor = factory(**executor_options)
    if hasattr(executor, "adapt_request"):  # ray / container: the request names its environment
        request = executor.adapt_request(request)
    if prepared is None or getattr(prepared, "request", None) != request:  # none, or of another request
        prepared = request.prepare()
    ws = workspace_for(prepared, output_dir)
    run_dir = ws.root
    title = run_title(prepared)
    if title:  # what every list calls the run from now on, before its process has started
        ws.events.emit("submitted", title=title)
    ws.events.close()  # the executor's process opens its own
    request_file = request_file_for(run_dir, request)
    (run_dir / request_file).write_text(request.to_json() + "\n")
    save_prepared(run_dir, request_file, prepared)
    execution = executor.start(request, run_dir, request_file, prepared)
    record = {"schema_version": JOB_SCHEMA_VERSION, "id": run_dir.name, "mode": request.mode,
              "executor": executor.name, "pid": execution.pid,
              **{k: v for k, v in (getattr(execution, "identity", None) or {}).items() if k != "pid"},
              "host": socket.gethostname(),
              "submitted": round(time.time(), 3), "request": request_file, **getattr(executor, "record", {})}
    from engine.runs.workspace import atomic_write_json
    atomic_write_json(run_dir / JOB_FILE, record)
    return Job(run_dir, execution)


def attach(run_dir: Union[Path, str]) -> Job:
    """The job of an existing run folder (from any process)."""
    run_dir = Path(run_dir).expanduser().resolve()
    if not (run_dir / "events.jsonl").exists() and not (run_dir / JOB_FILE).exists():
        raise JobError(f"{run_dir}: not a run folder (no events.jsonl or {JOB_FILE})",
                       hint="give the folder a run wrote under the results root")
    return Job(run_dir)

"""Where a job's work runs, on this machine: the executor protocol (``Executor.start`` returns an
``Execution``), ``in-process`` (a thread of the caller) and ``local-process`` (a detached child in
its own session and process group that outlives the caller).

These run the modes (``engine.jobs.modes.run_request``) and know nothing of the job API above
them: ``engine.jobs.api`` keeps the registry of executors by name, these two and the Ray and
container executors of ``engine.cluster.executors`` (which drive their jobs with these two).
What crosses to an executor is plain data: the request (JSON), the run folder's path, a cancel
that is a call or a signal, never a closure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Protocol

from engine.jobs.modes import JobOutcome, run_request
from engine.runs.process import CancelToken, engine_pythonpath, process_identity


class Execution(Protocol):
    """A started job, as its executor sees it."""
    pid: Optional[int]

    def alive(self) -> bool: ...

    def cancel(self, reason: str) -> None: ...

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        """The exit code once finished, None while it still runs after ``timeout`` seconds."""
        ...


class Executor(Protocol):
    name: str

    def start(self, request: Any, run_dir: Path, request_file: str, prepared: Any) -> Execution: ...


# --------------------------------------------------------------------------- in-process
class _ThreadExecution:
    def __init__(self, request: Any, run_dir: Path, prepared: Any) -> None:
        from engine.runs.workspace import Workspace
        self.pid: Optional[int] = os.getpid()
        self.identity = process_identity()
        self.token = CancelToken()
        self.outcome: Optional[JobOutcome] = None
        self.error: Optional[BaseException] = None
        ws = Workspace(run_dir)

        def work() -> None:
            try:
                self.outcome = run_request(request, cancel=self.token, workspace=ws, prepared=prepared)
            except BaseException as exc:  # kept for wait(); the mode already wrote its report
                self.error = exc
        self.thread = threading.Thread(target=work, name=f"magpie-job-{run_dir.name}", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def cancel(self, reason: str) -> None:
        self.token.cancel(reason)

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        self.thread.join(timeout)
        if self.thread.is_alive():
            return None
        return self.outcome.exit_code if self.outcome is not None else 1


class InProcessExecutor:
    """The work runs on a thread of this process: for tests, notebooks and an MCP server that
    wants results in memory. It ends with its process."""
    name = "in-process"

    def start(self, request: Any, run_dir: Path, request_file: str, prepared: Any) -> Execution:
        return _ThreadExecution(request, run_dir, prepared)


# --------------------------------------------------------------------------- detached local process
def console_log_path(output_dir: Path, pid: int, started: float) -> Path:
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(started))
    return output_dir / ".console" / f"{stamp}_{pid}.log"


class _ProcessExecution:
    def __init__(self, proc: subprocess.Popen, console_log: Path, argv: list[str]) -> None:
        self.process, self.console_log, self.argv = proc, console_log, argv
        self.pid: Optional[int] = proc.pid
        # Read while the child is ours and not reaped: its pid cannot have been reused yet.
        self.identity = process_identity(proc.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def cancel(self, reason: str) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)  # the child's handler cancels and writes its report

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def engine_env() -> dict[str, str]:
    """The environment of an engine child: importable even from a source checkout that is not installed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = engine_pythonpath(env.get("PYTHONPATH"))
    return env


CANCEL_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


@contextlib.contextmanager
def cancel_signals_held() -> Iterator[None]:
    """Start children with the cancel signals blocked (the mask survives exec): a cancel sent
    before the child has installed its handlers waits for them instead of killing it without a
    report. The child unblocks them once its handlers are in (``release_cancel_signals``)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {getattr(signal, name) for name in CANCEL_SIGNALS}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)  # this thread only, for the fork
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def release_cancel_signals() -> None:
    """In a child: deliver the cancel signals held since its start (to the handlers now installed)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {getattr(signal, name) for name in CANCEL_SIGNALS})


class LocalProcessExecutor:
    """A detached child (``python -m engine.jobs.child RUN_DIR``): a new session, so a terminal
    hang-up or Ctrl-C in the front end does not reach it; console output to
    ``<results>/.console/<stamp>_<pid>.log``; it keeps going when the caller exits."""
    name = "local-process"

    def __init__(self, python: str = sys.executable, cwd: Optional[Path] = None) -> None:
        self.python, self.cwd = python, cwd

    def start(self, request: Any, run_dir: Path, request_file: str, prepared: Any) -> Execution:
        console_dir = run_dir.parent / ".console"
        console_dir.mkdir(parents=True, exist_ok=True)
        argv = [self.python, "-m", "engine.jobs.child", str(run_dir), request_file]
        started = time.time()
        pending = console_dir / f".starting_{os.getpid()}_{int(started * 1e6)}.log"
        with open(pending, "wb") as out, cancel_signals_held():
            proc = subprocess.Popen(argv, cwd=str(self.cwd or Path.cwd()), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=engine_env(), start_new_session=True)
        final = console_log_path(run_dir.parent, proc.pid, started)
        os.replace(pending, final)  # the child keeps writing to the same open file
        return _ProcessExecution(proc, final, argv)

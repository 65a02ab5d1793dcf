"""Child processes: each in its own process group, with a timeout, logged to files.

A run never kills anything it did not start: on timeout, cancel or normal exit we
signal only the child's own process group (its pid is the group id because the
child starts a new session).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

# A command is either a shell command line (quotes, pipes and && work) or an argv list.
Command = Union[str, Sequence[str]]

_POLL_S = 0.05
_TERM_GRACE_S = 3.0
_TAIL_CHARS = 4000


class CancelToken:
    """Set once by a signal handler or a caller; every running child is stopped."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        if not self._event.is_set():
            self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])


def engine_pythonpath(current: Optional[str]) -> str:
    """A child's PYTHONPATH with this checkout first, so ``import engine`` works in it even when
    the engine runs from a source checkout that is not installed (and from any working dir)."""
    return _SOURCE_ROOT + (os.pathsep + current if current else "")


def install_signal_handlers(cancel: CancelToken) -> None:
    """SIGINT, SIGTERM and SIGHUP cancel the run (its report is still written); a second Ctrl-C
    stops at once. Only in the main thread of the process that runs the mode."""
    def handler(signum, _frame):
        if cancel.cancelled and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now (the report is still written)
        cancel.cancel("cancelled by SIGINT" if signum == signal.SIGINT else f"cancelled by signal {signum}")
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, handler)


@dataclass
class ProcessResult:
    command: str
    cwd: str
    returncode: int | None
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False
    stdout_path: Path | None = None
    stderr_path: Path | None = None
    error: str | None = None  # the command could not be started at all
    stdout: str = field(default="", repr=False)
    stderr: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (self.timed_out or self.cancelled or self.error)

    def stderr_tail(self, chars: int = _TAIL_CHARS) -> str:
        text = self.stderr.strip() or self.stdout.strip()
        return text[-chars:]

    def describe_failure(self) -> str:
        if self.error:
            return f"could not start `{self.command}`: {self.error}"
        if self.cancelled:
            return f"`{self.command}` was cancelled after {self.duration_s:.1f} s"
        if self.timed_out:
            return f"`{self.command}` timed out after {self.duration_s:.1f} s (process group killed)"
        return f"`{self.command}` exited with code {self.returncode}"

    def to_dict(self) -> dict:
        return {
            "command": self.command,
            "cwd": self.cwd,
            "returncode": self.returncode,
            "duration_s": round(self.duration_s, 4),
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "error": self.error,
            "stdout_log": str(self.stdout_path) if self.stdout_path else None,
            "stderr_log": str(self.stderr_path) if self.stderr_path else None,
        }


def command_text(cmd: Command) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(list(cmd))


def _argv(cmd: Command) -> list[str]:
    if isinstance(cmd, str):
        shell = shutil.which("bash") or "/bin/sh"
        return [shell, "-c", cmd]
    return [str(a) for a in cmd]


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process_group(proc: subprocess.Popen, grace_s: float = _TERM_GRACE_S) -> None:
    """SIGTERM the child's own group (its pid is the group id: it started a new session), then
    SIGKILL whatever is left of the group after ``grace_s``."""
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc.pid, signal.SIGKILL)
    proc.wait()


def run_process(
    cmd: Command,
    *,
    cwd: Path | str,
    log_stem: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    cancel: CancelToken | None = None,
) -> ProcessResult:
    """Run ``cmd`` in its own process group; stdout/stderr go to ``<log_stem>.stdout.log``/``.stderr.log``."""
    log_stem = Path(log_stem)
    log_stem.parent.mkdir(parents=True, exist_ok=True)
    out_path = log_stem.with_name(log_stem.name + ".stdout.log")
    err_path = log_stem.with_name(log_stem.name + ".stderr.log")
    text = command_text(cmd)
    full_env = dict(os.environ)
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    result = ProcessResult(command=text, cwd=str(cwd), returncode=None, duration_s=0.0,
                           stdout_path=out_path, stderr_path=err_path)
    start = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(_argv(cmd), cwd=str(cwd), env=full_env, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            result.error = str(exc)
            err.write(f"could not start: {exc}\n".encode())
            return result
        try:
            while True:
                try:
                    proc.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if cancel is not None and cancel.cancelled:
                    result.cancelled = True
                    stop_process_group(proc)
                    break
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    result.timed_out = True
                    stop_process_group(proc)
                    break
        except BaseException:
            # KeyboardInterrupt or anything else in the parent: never leave the group running.
            stop_process_group(proc)
            raise
        # Grandchildren left in the group (background jobs of a shell) are ours too.
        _kill_group(proc.pid, signal.SIGKILL)
    result.duration_s = time.monotonic() - start
    result.returncode = proc.returncode
    result.stdout = out_path.read_text(errors="replace")
    result.stderr = err_path.read_text(errors="replace")
    return result

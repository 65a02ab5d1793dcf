"""Child processes: each in its own process group, with a timeout, logged to files.

A run never kills anything it did not start: on timeout, cancel or normal exit we
signal only the child's own process group (its pid is the group id because the
child starts a new session).

A process killed outright (SIGKILL, a Ray worker cancelled with ``force``, the OOM killer)
runs no cleanup of its own, and a child in its own session outlives it. So every group a
process starts is also told to a watchdog (``GroupWatchdog``): a small process of its own,
reading a pipe from its parent, that stops the groups still registered when that pipe
closes, that is, when the parent is gone, however it went.

A process recorded by a run (its pid in ``run_started``, a loop step's pid) is named by its pid
*and* its start time (``process_start_time``) with its process group: a pid alone names whichever
process the kernel gave it to last. ``same_process`` checks both; ``signal_proven`` pins the
process (a pidfd) before checking whatever proof the caller asks for, so a signal never reaches
a process that only inherited the number.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union

# A command is either a shell command line (quotes, pipes and && work) or an argv list.
Command = Union[str, Sequence[str]]

_POLL_S = 0.05
# The parent of every command and worker (Linux): it stops what escapes the process group.
REAPER = Path(__file__).with_name("reaper.py")
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
    # Processes that left the command's group, outlived their parent and were stopped (reaper.py).
    escaped: list[dict] = field(default_factory=list)

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
            "escaped_processes": [{"pid": e.get("pid"), "command": str(e.get("command", ""))[:300]}
                                  for e in self.escaped[:20]],
        }


def command_text(cmd: Command) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(list(cmd))


def _argv(cmd: Command) -> list[str]:
    if isinstance(cmd, str):
        shell = shutil.which("bash") or "/bin/sh"
        return [shell, "-c", cmd]
    return [str(a) for a in cmd]


def not_runnable(argv: Sequence[str], env: Mapping[str, str], cwd: Path | str) -> Optional[str]:
    """Why ``argv[0]`` cannot be executed, as ``Popen`` would say it, or None. Asked before the
    command starts under ``reaper.py``, where the failure would otherwise be an exit code 127."""
    exe = str(argv[0]) if argv else ""
    if not exe:
        return "no command"
    if os.sep in exe:
        path = exe if os.path.isabs(exe) else os.path.join(str(cwd), exe)
        if not os.path.exists(path):
            return f"[Errno 2] No such file or directory: {exe!r}"
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return f"[Errno 13] Permission denied: {exe!r}"
        return None
    if shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
        return f"[Errno 2] No such file or directory: {exe!r}"
    return None


def supervised(argv: Sequence[str], record: Optional[Path], stop_with: Optional[int] = None,
               go_fd: Optional[int] = None) -> list[str]:
    """``argv`` run under ``reaper.py``: a descendant that leaves the command's process group
    (``setsid``) and outlives its parent is stopped and written to ``record`` (JSON lines). With
    ``stop_with`` (this process's pid), the command is also stopped when that process is gone;
    with ``go_fd`` (an inherited pipe's read end) it starts once a byte arrives there."""
    argv = [str(a) for a in argv]
    if not is_supervised_here():
        return argv
    extra = ["--stop-with", str(stop_with)] if stop_with else []
    extra += ["--go-fd", str(go_fd)] if go_fd is not None else []
    return [sys.executable, "-I", "-S", str(REAPER), str(record or ""), *extra, "--", *argv]


def is_supervised_here() -> bool:
    """Whether ``supervised`` wraps commands on this system (Linux: a child subreaper)."""
    return sys.platform.startswith("linux")


def read_escaped(record: Optional[Path]) -> list[dict]:
    """The processes ``reaper.py`` found outliving their parent (and stopped), from ``record``."""
    import json
    found = []
    try:
        with open(record, encoding="utf-8", errors="replace") as f:
            for line in f.read(1 << 20).splitlines():
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
    except (OSError, TypeError):
        pass
    return [e for e in found if isinstance(e, dict)]


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# The watchdog: forks once (so it is not a direct child of the parent, which Ray kills on a
# worker's exit), then keeps the registered groups until its stdin closes and stops them.
_WATCHDOG_SCRIPT = r"""
import os, signal, sys, time
if os.fork():
    os._exit(0)
groups = set()
for line in sys.stdin.buffer:
    op, _, pgid = line.strip().partition(b" ")
    if pgid.isdigit():
        (groups.add if op == b"+" else groups.discard)(int(pgid))
groups.discard(os.getpgrp())  # never its own
def alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False
for sig, wait_s in ((signal.SIGTERM, float(sys.argv[1])), (signal.SIGKILL, 0.0)):
    for pgid in list(groups):
        try:
            os.killpg(pgid, sig)
        except OSError:
            groups.discard(pgid)
    deadline = time.monotonic() + wait_s
    while groups and time.monotonic() < deadline and any(alive(g) for g in groups):
        time.sleep(0.05)
"""


class GroupWatchdog:
    """One per process, started on first use: ``watch(pgid)`` when a child group starts,
    ``forget(pgid)`` when it has been stopped. If this process dies first, the watchdog sees
    its pipe close and stops (SIGTERM, then SIGKILL after the grace) every group still watched."""

    def __init__(self, grace_s: float = _TERM_GRACE_S) -> None:
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._pipe = None
        self._owner = 0  # the pid that started it: a forked child starts its own
        self.starter_pid = 0  # the watchdog's group (its starter's pid), never one to stop

    def _ensure(self):
        if self._pipe is not None and self._owner == os.getpid():
            return self._pipe
        starter = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHDOG_SCRIPT, str(self.grace_s)],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        self.starter_pid = starter.pid
        starter.wait()  # the forked watchdog holds the pipe's read end; its starter is reaped here
        self._pipe, self._owner = starter.stdin, os.getpid()
        return self._pipe

    def _send(self, op: str, pgid: int) -> None:
        if os.name != "posix":
            return
        with self._lock:
            for _attempt in range(2):  # a watchdog that died (killed by hand) is started again
                try:
                    pipe = self._ensure()
                    pipe.write(f"{op} {pgid}\n".encode())
                    pipe.flush()
                    return
                except (BrokenPipeError, OSError):
                    self._pipe = None

    def ready(self) -> None:
        """Start the watchdog now, before the child: a child that starts first could outlive a
        parent killed while the watchdog was still starting."""
        if os.name == "posix":
            with self._lock:
                try:
                    self._ensure()
                except OSError:
                    self._pipe = None

    def watch(self, pgid: int) -> None:
        self._send("+", pgid)

    def forget(self, pgid: int) -> None:
        if self._pipe is not None:
            self._send("-", pgid)


WATCHDOG = GroupWatchdog()


def _own_children() -> set[int]:
    kids: set[int] = set()
    for f in Path("/proc/self/task").glob("*/children"):
        try:
            kids.update(int(x) for x in f.read_text().split())
        except (OSError, ValueError):
            pass
    return kids


@contextlib.contextmanager
def child_groups_watched(interval_s: float = 0.25) -> Iterator[None]:
    """While inside (Linux): every child of this process that leads a process group of its own,
    whoever started it (the Python harness, a benchmark's server, not only ``run_process``), is
    registered with the watchdog within ``interval_s`` and forgotten once it has been reaped. For
    a process that may be killed outright while it runs them: a Ray task's worker."""
    if os.name != "posix" or not Path("/proc/self/task").is_dir():
        yield
        return
    WATCHDOG.ready()
    stop = threading.Event()
    own_group = os.getpgrp()
    watched: set[int] = set()

    def scan() -> None:
        while True:
            kids = _own_children()
            for pid in kids - watched:
                try:
                    leads = os.getpgid(pid) == pid
                except OSError:
                    continue
                if leads and pid not in (own_group, WATCHDOG.starter_pid):
                    WATCHDOG.watch(pid)
                    watched.add(pid)
            for pid in watched - kids:
                WATCHDOG.forget(pid)
                watched.discard(pid)
            if stop.wait(interval_s):
                return
    thread = threading.Thread(target=scan, daemon=True, name="magpie-child-groups")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


# --------------------------------------------------------------------------- process identity
# A pid names a process only while it runs: once it has ended the kernel hands the number to the
# next process. What a run records is therefore the pid *with* the process's start time (and its
# process group); a pid whose start time differs is another process, never the run's.

def process_start_time(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), None when
    it does not exist, is a zombie or cannot be read (no /proc: identity cannot be checked)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # fields[0] is field 3 (state); field 22 is fields[19]
    if len(fields) < 20 or fields[0] == "Z":
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def process_group(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except (OSError, ValueError):
        return None


def process_identity(pid: Optional[int] = None) -> dict[str, int]:
    """``pid``, ``start_time`` and ``pgid`` of a process (this one by default); the keys that
    cannot be read are left out."""
    pid = os.getpid() if pid is None else pid
    out = {"pid": pid}
    start, group = process_start_time(pid), process_group(pid)
    if start is not None:
        out["start_time"] = start
    if group is not None:
        out["pgid"] = group
    return out


def same_process(pid: int, start_time: Optional[int], pgid: Optional[int] = None) -> bool:
    """True when ``pid`` is still the process recorded with ``start_time`` (and, when recorded, in
    process group ``pgid``). False for a reused pid, a process that is gone or a zombie, and when
    no start time was recorded or none can be read: identity unproven is not identity."""
    if start_time is None:
        return False
    now = process_start_time(pid)
    if now is None or now != start_time:
        return False
    if pgid is not None:
        group = process_group(pid)
        if group is not None and group != pgid:
            return False
    return True


def holds_open_for_writing(pid: int, path: Path | str) -> Optional[bool]:
    """Whether process ``pid`` has the file ``path`` open for writing (Linux: ``/proc/PID/fd``
    and the flags in ``/proc/PID/fdinfo``), compared by device and inode, not by name. None when
    that cannot be read (no /proc, another user's process)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    key = (st.st_dev, st.st_ino)
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except FileNotFoundError:
        return False if Path("/proc/self/fd").is_dir() else None
    except OSError:
        return None
    for name in names:
        try:
            s = os.stat(f"{fd_dir}/{name}")
        except OSError:
            continue
        if (s.st_dev, s.st_ino) != key:
            continue
        try:
            info = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("flags:"):
                if int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY:
                    return True
                break
    return False


def signal_proven(pid: int, sig: int, proof: Callable[[], Optional[str]]) -> Optional[str]:
    """Send ``sig`` to ``pid`` only if ``proof()`` (None: proven; else why not) holds for the
    process that has that pid. On Linux the process is pinned first (a pidfd), so a pid reused
    between the proof and the signal cannot receive it. Returns None when sent, else the reason."""
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return f"process {pid} is not running"
        except OSError:
            fd = None  # a kernel without pidfds: the proof and the signal are a few microseconds apart
    try:
        why = proof()
        if why:
            return why
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return f"process {pid} ended"
    except PermissionError:
        return f"process {pid} belongs to another user; not signalled"
    finally:
        if fd is not None:
            os.close(fd)
    return None


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


# A command's output kept in its log: the first and the last this many bytes of each stream, the
# bytes between them counted (a kernel printing a gigabyte must not fill the disk or the memory).
LOG_HEAD_BYTES = 8 << 20
LOG_TAIL_BYTES = 8 << 20


class _CappedLog(threading.Thread):
    """Copies a child's pipe into its log file: the head as it comes, the tail kept in memory and
    written at the end, the middle counted and named in one line."""

    def __init__(self, fd: int, path: Path) -> None:
        super().__init__(name=f"log-{path.name}", daemon=True)
        self.fd, self.path = fd, path
        self.dropped = 0

    def run(self) -> None:
        from collections import deque
        head_left = LOG_HEAD_BYTES
        tail: deque[bytes] = deque()
        tail_bytes = 0
        with open(self.path, "ab") as out:
            while True:
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                if head_left:
                    out.write(chunk[:head_left])
                    chunk, head_left = chunk[head_left:], max(0, head_left - len(chunk))
                if chunk:
                    tail.append(chunk)
                    tail_bytes += len(chunk)
                    while tail and tail_bytes - len(tail[0]) >= LOG_TAIL_BYTES:
                        tail_bytes -= len(tail[0])
                        self.dropped += len(tail.popleft())
            rest = b"".join(tail)
            if len(rest) > LOG_TAIL_BYTES:
                self.dropped += len(rest) - LOG_TAIL_BYTES
                rest = rest[-LOG_TAIL_BYTES:]
            if self.dropped:
                out.write(f"\n[magpie: {self.dropped} bytes of output left out here: the first {LOG_HEAD_BYTES} "
                          f"and the last {LOG_TAIL_BYTES} bytes are kept]\n".encode())
            out.write(rest)
        os.close(self.fd)


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
    escaped_path = log_stem.with_name(log_stem.name + ".escaped.jsonl")
    text = command_text(cmd)
    full_env = dict(os.environ)
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    result = ProcessResult(command=text, cwd=str(cwd), returncode=None, duration_s=0.0,
                           stdout_path=out_path, stderr_path=err_path)
    start = time.monotonic()
    out_path.write_bytes(b"")
    err_path.write_bytes(b"")
    with contextlib.ExitStack() as stack:
        WATCHDOG.ready()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        escaped_path.unlink(missing_ok=True)
        try:
            argv = _argv(cmd)
            if not Path(cwd).is_dir():
                raise FileNotFoundError(2, "No such file or directory", str(cwd))
            why = not_runnable(argv, full_env, cwd)
            if why:
                raise OSError(why)
            # The command waits for a byte on go_r until the watchdog knows its group: a kill of
            # this process (a Ray worker cancelled with force) in between would leave it running.
            go_r, go_w = os.pipe() if is_supervised_here() else (-1, -1)
            try:
                proc = subprocess.Popen(supervised(argv, escaped_path, go_fd=go_r if go_r >= 0 else None),
                                        cwd=str(cwd), env=full_env, stdout=out_w, stderr=err_w,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        pass_fds=(go_r,) if go_r >= 0 else ())
            except BaseException:
                if go_r >= 0:
                    os.close(go_r)
                    os.close(go_w)
                raise
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            result.error = str(exc)
            err_path.write_bytes(f"could not start: {exc}\n".encode())
            return result
        WATCHDOG.watch(proc.pid)
        if go_r >= 0:
            os.close(go_r)
            try:
                os.write(go_w, b"1")
            except OSError:  # the command's launcher (the reaper) is gone already: it runs nothing
                pass
            os.close(go_w)
        os.close(out_w)  # the child holds the write ends now
        os.close(err_w)
        readers = [_CappedLog(out_r, out_path), _CappedLog(err_r, err_path)]
        for r in readers:
            r.start()
        # The logs are complete once the group is gone (a grandchild that escaped the group and
        # still holds a pipe is not waited for long).
        stack.callback(lambda: [r.join(timeout=5.0) for r in readers])
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
            WATCHDOG.forget(proc.pid)
            raise
        # Grandchildren left in the group (background jobs of a shell) are ours too.
        _kill_group(proc.pid, signal.SIGKILL)
        WATCHDOG.forget(proc.pid)
    result.duration_s = time.monotonic() - start
    result.returncode = proc.returncode
    result.stdout = out_path.read_text(errors="replace")  # at most the kept head and tail
    result.stderr = err_path.read_text(errors="replace")
    result.escaped = read_escaped(escaped_path)
    return result

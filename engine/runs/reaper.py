"""The parent of every command and kernel worker a run starts (Linux): it runs the real command as
its only child and stops whatever escapes it.

A process group is not a fence: a child can ``fork``, call ``setsid`` and fork again, and the
grandchild then belongs to no group the run knows, so stopping the group leaves it running (and
burning the CPU beside the next kernel's timing). This process declares itself a child
subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): the kernel then hands it every descendant whose
parent ends, in whatever session or group it put itself. Any child other than the command is
such an orphan and is stopped as soon as it is seen (polled every 0.2 s) and, at the latest,
when the command ends; each one is written to the record file (one JSON line: pid, command
line, when) so the run can say so. The command's exit status is passed on unchanged (a command
killed by a signal ends this process by the same signal).

Stdlib only, run as ``python -I -S reaper.py RECORD [--stop-with PID] [--go-fd FD] -- ARGV...``: it starts in
milliseconds and imports nothing from the environment it supervises. With ``--stop-with PID`` it
also stops the command once its own parent is no longer PID (the launcher died, however it died:
a server started for one run must not outlive it). Where ``prctl`` is not available it still
runs the command and sweeps what it can see.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.2
_TERM_GRACE_S = 1.0


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def own_children() -> set[int]:
    kids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return kids
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                kids.update(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return kids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Reaper:
    def __init__(self, record: str, argv: list[str], stop_with: int = 0, start=None, go_fd: int = -1) -> None:
        self.record, self.argv, self.stop_with = record, argv, stop_with
        # With a go fd, the command starts only once the launcher writes a byte there (it has told
        # its watchdog about this group first); end of file (the launcher died) starts nothing.
        self.go_fd = go_fd
        # Instead of exec'ing argv, the child runs start() and exits with what it returns: the
        # fork server's workers, which have their imports already (engine.kernels.forkserver).
        self.start = start
        self.orphaned = False
        self.child = 0
        self.status: int | None = None
        self.seen: set[int] = set()

    def _note(self, pid: int) -> None:
        if pid in self.seen:
            return
        self.seen.add(pid)
        import json  # only when there is something to record: start-up stays short
        line = json.dumps({"pid": pid, "command": _cmdline(pid), "at": time.time()})
        sys.stderr.write(f"[magpie: process {pid} outlived its parent and is stopped: {_cmdline(pid) or '?'}]\n")
        sys.stderr.flush()
        if self.record:
            try:
                with open(self.record, "a") as f:
                    f.write(line + "\n")
            except OSError:
                pass

    def _reap(self, block: bool) -> None:
        """Collect every child that has ended; the command's own status is kept."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self.status = status
                if block:
                    return

    def _signal_orphan(self, pid: int, sig: int) -> None:
        # An orphan that made its own session leads its own group: the group goes with it. One
        # that stayed in ours is signalled alone (the group is ours and the command's).
        try:
            pgid = os.getpgid(pid)
        except OSError:
            return
        try:
            if pgid != os.getpgrp() and pgid == pid:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            pass

    def sweep(self, grace_s: float) -> None:
        """Stop every child but the command: SIGTERM, then SIGKILL after ``grace_s``; repeated,
        because stopping one orphan can hand its own children to us."""
        for _round in range(50):
            self._reap(block=False)
            orphans = own_children() - {self.child if self.status is None else -1}
            if not orphans:
                return
            for pid in orphans:
                self._note(pid)
                self._signal_orphan(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                self._reap(block=False)
                if not (own_children() & orphans):
                    break
                time.sleep(0.02)
            for pid in own_children() & orphans:
                self._signal_orphan(pid, signal.SIGKILL)
            time.sleep(0.02)

    def _wait_for_go(self) -> bool:
        """True once the launcher says go (or when it gives no go fd); False when it died first."""
        if self.go_fd < 0:
            return True
        try:
            go = os.read(self.go_fd, 1)
        except OSError:
            go = b""
        os.close(self.go_fd)
        return bool(go)

    def run(self) -> int:
        become_subreaper()
        if not self._wait_for_go():
            return 1
        forwarded = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}

        early: list[int] = []  # came while the command was being started

        def forward(signum, _frame):
            if not self.child:
                early.append(signum)
                return
            # The group usually got it too; one sent to this pid alone must still reach the command.
            if self.status is None:
                try:
                    os.kill(self.child, signum)
                except OSError:
                    pass
        for sig in forwarded:
            signal.signal(sig, forward)
        # Blocked across the fork: one that reached the new child before it put the defaults back
        # would run this process's handler there, or be dropped with Python's pending signals.
        signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
        pid = os.fork()
        if pid == 0:
            for sig in forwarded:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
            if self.start is not None:
                os._exit(self.start())
            try:
                os.execvp(self.argv[0], self.argv)
            except OSError as exc:
                sys.stderr.write(f"could not start {self.argv[0]}: {exc}\n")
                os._exit(127)
        self.child = pid
        signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
        for signum in early:
            forward(signum, None)
        # The command holds its own copies of whatever was passed down (a worker's pipes): ours
        # would keep a pipe open after the command died and hide its end from the parent.
        os.closerange(3, 65536)
        try:  # wakes the moment the command ends (Linux 5.3+); else a plain poll
            waker = os.pidfd_open(pid)
        except (AttributeError, OSError):
            waker = None
        while self.status is None:
            self._reap(block=False)
            if self.status is not None:
                break
            if own_children() - {self.child}:
                self.sweep(_TERM_GRACE_S)
            if self.stop_with and not self.orphaned and os.getppid() != self.stop_with:
                self.orphaned = True  # the launcher is gone: stop the command as it would have
                sys.stderr.write(f"[magpie: the launching process {self.stop_with} is gone; stopping]\n")
                sys.stderr.flush()
                try:
                    os.killpg(os.getpgrp(), signal.SIGTERM)  # the command's group (ours): its own children too
                except OSError:
                    pass
            if waker is not None:
                select.select([waker], [], [], _POLL_S)
            else:
                time.sleep(_POLL_S)
        self.sweep(_TERM_GRACE_S)
        status = self.status
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return 128 + sig
        return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def main(args: list[str]) -> int:
    stop_with, go_fd = 0, -1
    while len(args) >= 3 and args[1] in ("--stop-with", "--go-fd"):
        if args[1] == "--stop-with":
            stop_with = int(args[2])
        else:
            go_fd = int(args[2])
        args = [args[0]] + args[3:]
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: reaper.py RECORD [--stop-with PID] [--go-fd FD] -- ARGV...\n")
        return 2
    return Reaper(args[0], args[2:], stop_with, go_fd=go_fd).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

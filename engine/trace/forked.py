"""``ForkedCall``: a function run in a forked child of this process, its return value (or the
exception it raised) sent back pickled through a pipe. The child shares this process's memory
copy-on-write (a loaded trace is not copied), dies with the run on SIGINT/SIGTERM, and leaves
without this process's exit handlers. The caller checks that fork is there and safe (no other
threads) before it asks for one."""

from __future__ import annotations

import os
import pickle
import signal
import time
from typing import Any, Callable


class ForkedCall:
    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.what = what  # for the error of a child that ended without a result
        self.seconds: float | None = None  # fn's own time, in the child
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: call, send the outcome, exit
            code = 0
            try:
                os.close(read_fd)
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)  # dies with the run (the parent also ends it)
                t0 = time.perf_counter()
                try:
                    outcome: tuple = ("ok", fn(), time.perf_counter() - t0)
                except Exception as exc:  # handed to the parent, which raises it where it would have
                    outcome = ("error", exc, time.perf_counter() - t0)
                try:
                    data = pickle.dumps(outcome)
                except Exception as exc:  # an exception that cannot be pickled: its text
                    data = pickle.dumps(("error", RuntimeError(f"{type(outcome[1]).__name__}: {exc}"), outcome[2]))
                with os.fdopen(write_fd, "wb") as fh:
                    fh.write(data)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pid, self.fd = pid, read_fd

    def result(self) -> Any:
        """What the function returned; raises what it raised."""
        with os.fdopen(self.fd, "rb") as fh:
            data = fh.read()
        self.fd = -1
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if not data:
            raise RuntimeError(f"{self.what} ended without a result (wait status {status})")
        state, value, self.seconds = pickle.loads(data)
        if state == "error":
            raise value
        return value

    def stop(self) -> None:
        """End the child if it still runs (the caller failed or was cancelled before the result)."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

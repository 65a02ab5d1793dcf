"""``ForkedCall``: a function run in a forked child of this process, its return value (or the
exception it raised) sent back pickled through a pipe. The child shares this process's memory
copy-on-write (a loaded trace is not copied), dies with the run on SIGINT/SIGTERM, and leaves
without this process's exit handlers. The caller checks that fork is there and safe (no other
threads) before it asks for one. With ``first_message``, the child can also send one message
ahead of its result (``first``), which the caller reads while the child goes on."""

from __future__ import annotations

import os
import pickle
import signal
import struct
import time
from typing import Any, Callable


class ForkedCall:
    def __init__(self, fn: Callable[..., Any], what: str, *, first_message: bool = False) -> None:
        """``first_message``: ``fn`` is called with ``send_first(data)``, which sends ``data`` at
        once, ahead of the result (an empty message is sent for it if ``fn`` sends none)."""
        self.what = what  # for the error of a child that ended without a result
        self.seconds: float | None = None  # fn's own time, in the child
        self.first_message, self._first_read = first_message, False
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: call, send the outcome, exit
            code = 0
            try:
                os.close(read_fd)
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)  # dies with the run (the parent also ends it)
                with os.fdopen(write_fd, "wb") as out:
                    sent = False

                    def send_first(data: bytes) -> None:
                        nonlocal sent
                        if not sent:
                            sent = True
                            out.write(struct.pack("<I", len(data)) + data)
                            out.flush()
                    t0 = time.perf_counter()
                    try:
                        outcome: tuple = ("ok", fn(send_first) if first_message else fn(), time.perf_counter() - t0)
                    except Exception as exc:  # handed to the parent, which raises it where it would have
                        outcome = ("error", exc, time.perf_counter() - t0)
                    if first_message:
                        send_first(b"")
                    try:
                        data = pickle.dumps(outcome)
                    except Exception as exc:  # an exception that cannot be pickled: its text
                        data = pickle.dumps(("error", RuntimeError(f"{type(outcome[1]).__name__}: {exc}"), outcome[2]))
                    out.write(data)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pid, self.fh = pid, os.fdopen(read_fd, "rb")

    def first(self) -> bytes:
        """The child's first message (``first_message``); b"" when it ended without one."""
        self._first_read = True
        head = self.fh.read(4)
        return self.fh.read(struct.unpack("<I", head)[0]) if len(head) == 4 else b""

    def result(self) -> Any:
        """What the function returned; raises what it raised."""
        if self.first_message and not self._first_read:
            self.first()
        # Unpickled from the pipe as it is read: the pickled bytes of a large result (a trace's
        # columns) are never held beside the objects made from them.
        with self.fh:
            try:
                outcome = pickle.load(self.fh)
            except (EOFError, pickle.UnpicklingError):  # nothing, or a result cut short
                outcome = None
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if outcome is None:
            raise RuntimeError(f"{self.what} ended without a result (wait status {status})")
        state, value, self.seconds = outcome
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
        if not self.fh.closed:
            self.fh.close()

"""A live tail of a log file that another process writes.

The file is polled every ``interval`` seconds. A thread worker reads what is new (at most
``chunk_bytes``, decoded and formatted in the thread) and posts it as one ``LinesRead``
message; the widget appends it on the event loop in one ``write_lines`` call: at 10k
lines/s that is a few hundred lines per call, never a call (or a worker) per line.
Back-pressure: the next read starts only once the last chunk was appended, so a huge or
fast log is shown a bounded chunk at a time (straight after each other while behind) and
never floods the message queue. The widget keeps the last ``max_lines``; the file keeps all.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.message import Message
from textual.widgets import Log

from magpie_tui.bridge import FileTail


class RunLog(Log):
    DEFAULT_CSS = """
    RunLog { background: $surface; }
    """

    class LinesRead(Message):
        """A chunk read by the thread worker, for the widget that asked for it."""

        bubble = False

        def __init__(self, tail: FileTail, lines: list[str], more: bool) -> None:
            super().__init__()
            self.tail = tail
            self.lines = lines
            self.more = more  # the read stopped at chunk_bytes: read again at once

    def __init__(self, path: Path | None = None, *, interval: float = 0.05, max_lines: int = 20_000,
                 chunk_bytes: int = 1 << 20, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=max_lines, highlight=False, auto_scroll=True, id=id, classes=classes)
        self.interval = interval
        self.chunk_bytes = chunk_bytes
        self.tail: FileTail | None = None
        self.lines_shown = 0
        self._reading = False  # a read is in flight (its LinesRead not handled yet)
        self._note: str | None = None
        if path is not None:
            self.follow(path)

    def follow(self, path: Path) -> None:
        """Show ``path`` from (near) its start and keep following it."""
        self.clear()
        self.lines_shown = 0
        self.tail = FileTail(path)
        if self.tail.skipped_bytes:
            note = f"[{self.tail.skipped_bytes / 1e6:.1f} MB earlier in {path}]"
            if self.is_mounted:
                self.write_line(note)
            else:
                self._note = note  # Log.write_line starts a worker: not before the widget runs
        if self.is_mounted:
            self.drain()

    def on_mount(self) -> None:
        if self._note is not None:
            self.write_line(self._note)
            self._note = None
        self.set_interval(self.interval, self.drain)
        self.drain()

    def drain(self) -> None:
        """Start a read of what was appended, unless one is in flight (back-pressure)."""
        if self.tail is None or self._reading:
            return
        self._reading = True
        self._read(self.tail)

    def format_lines(self, lines: list[str]) -> list[str]:
        """The display form of raw lines; runs in the reading thread."""
        return lines

    @work(thread=True, exclusive=True, group="run-log-read", exit_on_error=False,
          description="read the log's new bytes")
    def _read(self, tail: FileTail) -> None:
        lines: list[str] = []
        try:
            lines = self.format_lines(tail.read_lines(self.chunk_bytes))
        finally:  # always answer, so the next read can start
            self.post_message(self.LinesRead(tail, lines, tail.more))

    def on_run_log_lines_read(self, message: LinesRead) -> None:
        message.stop()
        self._reading = False
        if message.tail is not self.tail:
            self.drain()  # followed another file meanwhile: that chunk is not this file's
            return
        if message.lines:
            self.write_lines(message.lines)
            self.lines_shown += len(message.lines)
        if message.more:
            self.drain()  # behind: the thread reads the next chunk while this one is painted

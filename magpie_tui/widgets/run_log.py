"""A live tail of a log file that another process writes.

The file is polled every ``interval`` seconds and everything new goes to the ``Log`` in
one ``write_lines`` call: at 10k lines/s that is a few hundred lines per call, never a
call (or a worker) per line. The widget keeps the last ``max_lines``; the file keeps all.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Log

from magpie_tui.bridge import FileTail


class RunLog(Log):
    DEFAULT_CSS = """
    RunLog { background: $surface; }
    """

    def __init__(self, path: Path | None = None, *, interval: float = 0.05, max_lines: int = 20_000,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=max_lines, highlight=False, auto_scroll=True, id=id, classes=classes)
        self.interval = interval
        self.tail: FileTail | None = None
        self.lines_shown = 0
        if path is not None:
            self.follow(path)

    def follow(self, path: Path) -> None:
        """Show ``path`` from (near) its start and keep following it."""
        self.clear()
        self.lines_shown = 0
        self.tail = FileTail(path)
        if self.tail.skipped_bytes:
            self.write_line(f"[{self.tail.skipped_bytes / 1e6:.1f} MB earlier in {path}]")

    def on_mount(self) -> None:
        self.set_interval(self.interval, self.drain)

    def drain(self) -> int:
        if self.tail is None:
            return 0
        lines = self.tail.read_lines()
        if lines:
            self.write_lines(lines)
            self.lines_shown += len(lines)
        return len(lines)

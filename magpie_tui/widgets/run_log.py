"""A live tail of a log file that another process writes.

The file is polled every ``interval`` seconds. A thread worker reads what is new (at most
``chunk_bytes``, decoded and formatted in the thread) and posts it as one ``LinesRead``
message; the widget appends it on the event loop in one ``write_lines`` call: at 10k
lines/s that is a few hundred lines per call, never a call (or a worker) per line.
Back-pressure: the next read starts only once the last chunk was appended, so a huge or
fast log is shown a bounded chunk at a time (straight after each other while behind) and
never floods the message queue. The widget keeps the last ``max_lines``; the file keeps all.

Wrapping (``wrap``; Textual's ``Log`` cannot wrap): the widget keeps the raw lines beside the rows
it shows, and with wrapping on shows each line cut into rows of the widget's width (again when the
width changes, or wrapping is switched, keeping the line at the top in view). Searches look at
the raw lines (``raw_lines``) and map them to rows (``row_of``, ``line_at``), so a match is found
where the wrap cut it, and following the end works either way.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from pathlib import Path

from rich.cells import cell_len, chop_cells
from rich.segment import Segment
from textual import events, work
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Log

from magpie_tui.bridge import FileTail


class RunLog(Log):
    COMPONENT_CLASSES = {"run-log--match"}
    DEFAULT_CSS = """
    RunLog { background: $surface; }
    RunLog > .run-log--match { background: $accent 40%; text-style: bold; }
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
        # The rows shown are pruned here, a raw line at a time (with wrapping, a line is several rows).
        super().__init__(max_lines=None, highlight=False, auto_scroll=True, id=id, classes=classes)
        self.keep_lines = max_lines
        self.interval = interval
        self.chunk_bytes = chunk_bytes
        self.tail: FileTail | None = None
        self.lines_shown = 0
        self.wrap = False
        self._raw: list[str] = []  # the lines kept, as read
        self._rows: list[int] = []  # with wrapping: how many rows each raw line takes
        self._wrap_width = 0  # the width the rows were cut for
        self._reading = False  # a read is in flight (its LinesRead not handled yet)
        self._note: str | None = None
        self._match: int | None = None  # the raw line a search found (mark_line), drawn marked
        self._match_rows: tuple[tuple, range] = ((), range(0))  # its rows, and what they were worked out for
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
                self.add_lines([note])
            else:
                self._note = note  # Log.write_line starts a worker: not before the widget runs
        if self.is_mounted:
            self.drain()

    def on_mount(self) -> None:
        if self._note is not None:
            self.add_lines([self._note])
            self._note = None
        self.set_interval(self.interval, self.drain)
        self.drain()

    # -- the lines kept and the rows shown ------------------------------------------------------
    @property
    def raw_lines(self) -> list[str]:
        """The lines kept, as read (one per line of the file, wrapped or not)."""
        return self._raw

    def clear(self):
        self._raw, self._rows = [], []
        return super().clear()

    def add_lines(self, lines: list[str]) -> None:
        """Append lines as read: kept raw, shown wrapped or not; the oldest beyond ``keep_lines`` go."""
        self._raw.extend(lines)
        if self.wrap and self._wrap_width < 0:  # hidden since wrapping was switched on: cut when shown
            if self.keep_lines is not None and len(self._raw) > self.keep_lines:
                del self._raw[:len(self._raw) - self.keep_lines]
            return
        if self.wrap:
            rows, counts = self._cut(lines, self._width_for_wrap())
            self._rows.extend(counts)
            self.write_lines(rows)
        else:
            self.write_lines(lines)
        excess = len(self._raw) - self.keep_lines if self.keep_lines is not None else 0
        if excess > 0:
            drop = sum(self._rows[:excess]) if self.wrap else excess
            del self._raw[:excess]
            if self.wrap:
                del self._rows[:excess]
            self.max_lines = max(0, len(self._lines) - drop)
            self._prune_max_lines()
            self.max_lines = None
            self.virtual_size = self.virtual_size.with_height(len(self._lines))
            self.refresh()

    def row_of(self, index: int) -> int:
        """The first row that raw line ``index`` is shown on."""
        if not self.wrap:
            return index
        return sum(self._rows[:index])

    def line_at(self, row: int) -> int:
        """The raw line shown on ``row``."""
        if not self.wrap:
            return row
        return max(0, bisect_right(list(accumulate(self._rows)), row))

    def mark_line(self, index: int | None) -> None:
        """Draw raw line ``index`` marked (a search's match: where the log cannot scroll it to
        the top, near its end, the eye finds it), or none."""
        self._match = index
        self._render_line_cache.clear()
        self.refresh()

    def _marked_rows(self) -> range:
        if self._match is None:
            return range(0)
        key = (self._match, len(self._raw), self.wrap, self._wrap_width)
        if self._match_rows[0] != key:
            start = self.row_of(self._match)
            rows = self._rows[self._match] if self.wrap and self._match < len(self._rows) else 1
            self._match_rows = (key, range(start, start + rows))
        return self._match_rows[1]

    def _render_line(self, y: int, scroll_x: int, width: int):
        strip = super()._render_line(y, scroll_x, width)
        if self._match is not None and y < len(self._lines) and y in self._marked_rows():
            marked = self.get_component_rich_style("run-log--match")
            strip = Strip(Segment.apply_style(iter(strip), post_style=marked), strip.cell_length)
        return strip

    def set_wrap(self, wrap: bool) -> None:
        """Wrap long lines at the widget's width, or show them whole (scroll sideways); the line at
        the top stays in view, and the end is followed as before."""
        if wrap == self.wrap:
            return
        top = self.line_at(int(self.scroll_y))
        self.wrap = wrap
        self._show_all(top)

    def _width_for_wrap(self) -> int:
        # The rows leave room for the vertical scrollbar, so that its coming never cuts them.
        return max(8, self.content_region.width - self.styles.scrollbar_size_vertical)

    @staticmethod
    def _cut(lines: list[str], width: int) -> tuple[list[str], list[int]]:
        rows: list[str] = []
        counts: list[int] = []
        for line in lines:
            line = line.expandtabs()
            pieces = chop_cells(line, width) if cell_len(line) > width else [line]
            rows.extend(pieces)
            counts.append(len(pieces))
        return rows, counts

    def _show_all(self, top: int) -> None:
        """Show every raw line again (wrapped or not) with raw line ``top`` at the top, unless following.
        A log in a hidden tab has no width to wrap at: it is cut when it is shown (``on_resize``)."""
        if self.wrap and not self.content_region.width:
            self._wrap_width = -1  # not cut yet
            return
        raw = self._raw
        super().clear()
        self._raw = raw
        if self.wrap:
            self._wrap_width = self._width_for_wrap()
            rows, self._rows = self._cut(raw, self._wrap_width)
        else:
            rows, self._rows = raw, []
        self.write_lines(rows, scroll_end=False)
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        else:
            self.scroll_to(x=0, y=self.row_of(min(top, max(0, len(raw) - 1))), animate=False, immediate=True)

    def on_show(self) -> None:
        # Lines read while the tab was hidden could not scroll a view of no size: a log that
        # follows its end shows the end when it comes into view.
        if self.auto_scroll:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True, x_axis=False)

    def on_resize(self, event: events.Resize) -> None:
        if self.wrap and self._width_for_wrap() != self._wrap_width:
            self._show_all(self.line_at(int(self.scroll_y)) if self._wrap_width >= 0 else len(self._raw))

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
            self.add_lines(message.lines)
            self.lines_shown += len(message.lines)
        if message.more:
            self.drain()  # behind: the thread reads the next chunk while this one is painted

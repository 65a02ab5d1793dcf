"""The one module that knows both sides: engine run folders and files in, Textual messages out.

* ``RunsWatcher`` polls the run catalog and posts ``RunsChanged`` when something changed. Its
  polls back off while nothing changes, and most of them look only at the results folders'
  own mtimes and the runs still going: an idle workbench over thousands of finished runs costs
  about what it costs over none. It blocks, so the app calls it from a thread worker, never on
  the event loop; ``post_message`` is thread-safe.
* ``FileTail`` follows a log file that another process writes, in batches: the UI asks
  for new lines a few times a second, never once per line, from a thread worker, and at most
  ``max_bytes`` per call (back-pressure: the next read waits until the lines were shown).
* ``watch_configs`` turns file-system changes under the project into ``ConfigsChanged``.
"""

from __future__ import annotations

import codecs
import re
import threading
import time
from pathlib import Path
from typing import Iterable

from engine.jobs.query import RunCatalog, open_regular
from magpie_tui.messages import ConfigsChanged, RunsChanged

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
WATCHED_SUFFIXES = {".yaml", ".yml", ".py", ".cu", ".cuh", ".hip", ".cpp", ".cc", ".h", ".hpp"}


class FileTail:
    """Reads what was appended to a file since the last call, as display lines.

    Bytes are decoded incrementally (a UTF-8 character split across reads stays whole),
    ANSI sequences are stripped (the file keeps them), and a ``\\r`` progress redraw keeps
    only the text after the last carriage return.
    """

    def __init__(self, path: Path, start_at_end: bool = False, max_initial_bytes: int = 4 << 20) -> None:
        self.path = path
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self.offset = 0
        self.lines_read = 0
        self.skipped_bytes = 0
        self.more = False  # the last read stopped at max_bytes: there is more to read now
        if path.exists():
            size = path.stat().st_size
            # A huge log starts near its end: the full file stays on disk for toolong/less.
            self.offset = size if start_at_end else max(0, size - max_initial_bytes)
            self.skipped_bytes = self.offset
        self._drop_partial_first_line = self.offset > 0 and not start_at_end

    def read_lines(self, max_bytes: int = 8 << 20) -> list[str]:
        """New complete lines, from at most ``max_bytes`` of the file. Blocking: call it from a
        thread, and from one thread at a time."""
        self.more = False
        try:
            with open_regular(self.path) as fh:  # a FIFO or a device is refused, never waited on
                fh.seek(self.offset)
                data = fh.read(max_bytes)
        except OSError:
            return []
        if not data:
            return []
        self.more = len(data) == max_bytes
        self.offset += len(data)
        if self._drop_partial_first_line:
            # Started mid-file: the first line is cut, so it is not shown.
            cut = data.find(b"\n")
            if cut < 0:
                return []
            data = data[cut + 1:]
            self._drop_partial_first_line = False
        text = self._partial + self._decoder.decode(data)
        parts = text.split("\n")
        self._partial = parts.pop()
        lines = [clean_line(p) for p in parts]
        self.lines_read += len(lines)
        return lines

    @property
    def pending(self) -> str:
        """The unfinished last line (a progress bar being redrawn, a prompt)."""
        return clean_line(self._partial)


def clean_line(text: str) -> str:
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" in text:
        text = text.rstrip("\r")
        text = text.rsplit("\r", 1)[-1]
    return text


class RunsWatcher:
    """Polls the catalog; posts ``RunsChanged`` to ``target`` when something changed.

    ``poll`` blocks (directory scans, events-file reads): call it from a thread worker. The
    ``RunInfo`` objects are updated in place by later polls, so a screen holding one sees it
    change; a lock keeps two polls from folding the same events twice.

    Idle costs stay flat however many runs the results folders hold. Most polls are quick
    checks (``RunCatalog.refresh(finished=False)``): a stat of each results folder, which is
    listed again only when its mtime moved, and reads of the runs still going. Finished runs,
    whose events files no longer grow, are looked at again by a full refresh (a stat of each
    events file), every ``FULL_MIN`` seconds at first, then twice as long each time up to
    ``FULL_MAX``. ``due`` tells the app's tick whether a poll is due: every tick (``fast``)
    while something changes or the user acts, then at most ``SLOW`` apart, so a new run or a
    live run's new events still show within about a second. ``poke`` (the user pressed a key
    or clicked) brings back the fast tick and the first full interval.
    """

    SLOW = 1.0  # seconds between quick checks once nothing changes
    FULL_MIN = 5.0  # seconds between full refreshes after a change of pace (start, a key pressed)
    FULL_MAX = 30.0  # ... and at most, while nobody acts

    def __init__(self, roots: Iterable[Path], target, fast: float = 0.5, clock=time.monotonic) -> None:
        self.catalog = RunCatalog(roots)
        self.target = target
        # run folder -> its label (RunInfo.label), once fixed: recorded by the run, or read once
        # from the config.yaml of a folder written before runs recorded it
        self.titles: dict[Path, str] = {}
        self._first = True
        self._lock = threading.Lock()
        self._told: set[str] = set()  # skipped-folder notes already shown
        self.fast = fast
        self.clock = clock  # seconds, monotonic: when polls are due
        self.every = fast  # seconds from one poll to the next, now
        self.full_every = self.FULL_MIN  # ... and from one full refresh to the next
        self.polls = self.full_polls = 0
        self._last_poll = self._last_full = self._poked = float("-inf")

    def due(self, now: float | None = None) -> bool:
        """Whether the next poll is due (``now``: ``clock()``). Half a fast tick of slack:
        the app's timer ticks every ``fast`` seconds, never exactly on time."""
        now = self.clock() if now is None else now
        return now - self._last_poll >= self.every - self.fast / 2

    def poke(self) -> None:
        """The user acted: poll at the next tick, and soon look at finished runs again."""
        self._poked = self.clock()
        self.every = self.fast
        self.full_every = self.FULL_MIN

    def poll(self, full: bool | None = None) -> None:
        """One look at the results folders: a full refresh when one is due (or ``full``), else the
        quick check."""
        with self._lock:
            now, first = self.clock(), self._first
            if full is None:
                full = first or now - self._last_full >= self.full_every - self.fast / 2
            self.polls += 1
            if full:
                self.full_polls += 1
                self._last_full = now
            changed = self.catalog.refresh(finished=full)
            self._tell_skipped()
            gone = self.catalog.gone  # deleted or archived folders leave the list too
            for path in gone:
                self.titles.pop(path, None)
            if changed or gone or self._first:
                self._first = False
                self.target.post_message(RunsChanged(self.catalog.sorted_runs(), changed))
            # A run's label is the title it recorded at launch (``RunInfo.label``). Folders
            # written before runs recorded one get it from their config.yaml, after the list is
            # out (hundreds of config reads must not delay it), a bounded slice per poll; the
            # runs that got one are posted as changed. A run that has not started yet waits: its
            # first events name it, and its config.yaml may not be written yet.
            titled = []
            if len(self.titles) < len(self.catalog.runs):
                deadline = time.monotonic() + 0.25
                for info in self.catalog.sorted_runs():
                    if info.path in self.titles:
                        continue
                    if info.titled:
                        self.titles[info.path] = info.label
                        continue
                    if info.state == "pending":
                        continue
                    info.label = self.titles[info.path] = run_title(info)
                    info.titled = True
                    titled.append(info)
                    if time.monotonic() > deadline:
                        break
            if titled:
                self.target.post_message(RunsChanged(self.catalog.sorted_runs(), titled))
            # The pace: back to every tick on a change, slower while nothing changes.
            busy = changed or gone or titled or self._poked >= now - self.SLOW
            self.every = self.fast if busy else min(self.every * 2, max(self.fast, self.SLOW))
            if full and not first and self._poked < now:
                self.full_every = min(self.full_every * 2, self.FULL_MAX)
            self._last_poll = now

    def _tell_skipped(self) -> None:
        """A folder the scan left out (its events.jsonl a FIFO, a device...) is said once."""
        notify = getattr(self.target, "notify", None)
        for note in self.catalog.skipped.values():
            if note not in self._told:
                self._told.add(note)
                if callable(notify):
                    notify(note, title="Runs", severity="warning", timeout=10)


async def watch_configs(root: Path, target, stop_event=None, debounce_ms: int = 300) -> None:
    """Post ``ConfigsChanged`` for config and source files changed under ``root``."""
    from watchfiles import awatch

    def interesting(_change, path: str) -> bool:
        p = Path(path)
        return p.suffix.lower() in WATCHED_SUFFIXES and not any(
            part.startswith(".") or part in ("results", "__pycache__", "node_modules") for part in p.parts[-6:-1])

    async for changes in awatch(root, watch_filter=interesting, debounce=debounce_ms, stop_event=stop_event,
                                recursive=True, ignore_permission_denied=True):
        target.post_message(ConfigsChanged({Path(p) for _c, p in changes}))


def run_title(info) -> str:
    """The label of a run folder written before runs recorded theirs at launch: the engine's
    ``run_label`` of its ``config.yaml`` (engine.jobs.query.recorded_run_label), else its folder name's label.
    Blocking (a small YAML read): called from the scan thread."""
    from engine.jobs.query import recorded_run_label
    return recorded_run_label(info.path, info.label)

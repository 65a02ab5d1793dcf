"""Every run under the results folders, read from the run-folder contract alone.

A run is a folder with an ``events.jsonl``. Its state comes from the events the run
wrote (``run_started``, ``stage``, ``progress``, ``run_finished``), so runs started from
the command line, from another workbench session, or before a crash all show up the
same way. ``RunCatalog.refresh`` reads only the bytes appended since the last call, and only
from events files whose size moved; ``refresh(finished=False)`` looks only at what can change
without a results folder's mtime moving (runs still going), so polling many runs stays cheap.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from engine.errors import MagpieError
from engine.runs.process import holds_open_for_writing, same_process, signal_proven
from engine.runs.schema import (
    FINISHED_RUN_STATES, REPORT_FILES, CapacityLevel, Event, ProgressEvent, RunFigures, RunFinished, RunStarted,
    RunState, RunSubmitted, StageEvent, parse_event,
)
from engine.runs.state import (CapacityStep, LiveMetrics, LiveSample, RunProgress, RunStatus, add_sample,
                               benchmark_figures, capacity_step, kernel_figures, progress_from_event, status_text)
from engine.runs.state import KernelProgress, fold_kernel_stage

REPORT_NAMES = REPORT_FILES  # the old name, kept for importers
_NAME = re.compile(r"^(?P<mode>[a-z]+)_(?P<label>.+)_(?P<date>\d{8})_(?P<time>\d{6})_(?P<unique>[0-9a-f]+)$")
# Finished states as runs write them; "lost" is ours: the process is gone and never said it finished.
FINISHED_STATES = FINISHED_RUN_STATES


@dataclass
class RunInfo:
    path: Path
    mode: str = "?"
    # What every list calls the run (engine.runs.labels): the title the run recorded at launch;
    # until one is read (or in a folder written before runs recorded it) its folder name's label.
    label: str = ""
    titled: bool = False  # ``label`` is the run's recorded title, not its folder name's label
    state: str = RunState.PENDING
    started: Optional[float] = None
    finished: Optional[float] = None
    last_event: Optional[float] = None
    pid: Optional[int] = None
    start_time: Optional[int] = None  # the process's identity beside its pid (run_started)
    pgid: Optional[int] = None
    stage: str = ""
    done: Optional[int] = None
    total: Optional[int] = None
    live: dict = field(default_factory=dict)  # a benchmark's running numbers (failed, tok/s, p50s)
    # The typed state every front end shows (engine.runs.state): progress, live numbers, the
    # capacity levels tried, and the report's figures once finished.
    progress: RunProgress = field(default_factory=RunProgress)
    live_metrics: Optional[LiveMetrics] = None
    history: list[LiveSample] = field(default_factory=list)  # the last minute of live numbers (sparklines)
    capacity: list[CapacityStep] = field(default_factory=list)
    figures: Optional[RunFigures] = None
    kernels: list = field(default_factory=list)  # analyze / compare: the kernel ids, in order
    # analyze / compare: each kernel's stage, step and verdict (engine.runs.state.KernelProgress)
    kernel_rows: dict[str, KernelProgress] = field(default_factory=dict)
    exit_code: Optional[int] = None
    report_name: Optional[str] = None
    error: Optional[str] = None
    events_read: int = 0
    _offset: int = field(default=0, repr=False)
    _partial: bytes = field(default=b"", repr=False)
    _dropping: bool = field(default=False, repr=False)  # inside an events.jsonl line too long to be an event
    _figures_read: bool = field(default=False, repr=False)  # figures looked up in the report (old runs)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def report_path(self) -> Optional[Path]:
        """The report in the run folder: the name run_finished gave (a file name of the folder, never a
        path elsewhere), else the first of the known report names present."""
        name = self.report_name
        if name and Path(name).name == name and name not in (".", "..") and (self.path / name).exists():
            return self.path / name
        for name in REPORT_NAMES:
            if (self.path / name).exists():
                return self.path / name
        return None

    def elapsed(self, now: Optional[float] = None) -> Optional[float]:
        if self.started is None:
            return None
        end = self.finished if self.finished is not None else (now if now is not None else time.time())
        return max(0.0, end - self.started)

    @property
    def status(self) -> RunStatus:
        """The run's typed state (engine.runs.state), as every front end shows it."""
        return RunStatus.model_construct(state=self.state, mode=self.mode, stage=self.stage, progress=self.progress,
                                         kernels=self.kernel_progress,
                                         live=self.live_metrics, history=self.history, capacity=self.capacity,
                                         figures=self.figures,
                                         exit_code=self.exit_code, error=self.error)

    @property
    def kernel_progress(self) -> list[KernelProgress]:
        """Each kernel's stage (analyze / compare), in the order the run listed them; empty when the
        run has written no kernel stage yet."""
        if not any(r.state is not None or r.stage != "waiting" for r in self.kernel_rows.values()):
            return []
        order = {k: i for i, k in enumerate(self.kernels)}
        return sorted(self.kernel_rows.values(), key=lambda r: (order.get(r.kernel, len(order)), r.kernel))

    @property
    def progress_text(self) -> str:
        """``status_text`` of the run's state: the one line the workbench, the job API and MCP show."""
        return status_text(self.status)

    def apply(self, event: Event | dict[str, Any]) -> bool:
        """Fold one event (a model of engine.runs.schema, or a raw record) into the state.
        Returns False, changing nothing, for a record that does not match its model."""
        ev = parse_event(event) if isinstance(event, dict) else event
        if ev is None:
            return False
        if ev.ts is not None:
            self.last_event = ev.ts
        if isinstance(ev, RunSubmitted):
            if ev.title:
                self.label, self.titled = ev.title, True
        elif isinstance(ev, RunStarted):
            self.state = RunState.RUNNING
            if self.started is None:  # a resumed run (a loop) runs again, but it began when it first started
                self.started = self.last_event
            self.finished = self.exit_code = self.figures = None
            self.mode = ev.mode or self.mode
            self.pid, self.start_time, self.pgid = ev.pid, ev.start_time, ev.pgid
            if ev.title:
                self.label, self.titled = ev.title, True
            elif ev.label and not self.titled:
                self.label = ev.label
            self.kernels = list(ev.kernels or [])
            self.kernel_rows = {k: KernelProgress(kernel=k, index=i) for i, k in enumerate(self.kernels)}
        elif isinstance(ev, RunFinished):
            self.state = ev.state or RunState.COMPLETED
            self.finished = self.last_event
            self.exit_code = ev.exit_code
            self.report_name = ev.report or self.report_name
            self.error = ev.error or self.error
            self.figures = ev.figures
        elif isinstance(ev, StageEvent):
            self.stage = f"{ev.kernel}: {ev.stage}" if ev.kernel else ev.stage
            if ev.state:
                self.stage += f" {ev.state.lower()}"
            if ev.kernel:  # kernels go in parallel: each one's own stage (status_text sums them up)
                fold_kernel_stage(self.kernel_rows, ev)
        elif isinstance(ev, ProgressEvent):
            if ev.done is not None and ev.total is not None:
                self.done, self.total = ev.done, ev.total
            self.live = {k: getattr(ev, k) for k in ("completed", "failed", "never_sent", "output_tok_s",
                                                      "ttft_p50_ms", "tpot_p50_ms") if getattr(ev, k) is not None}
            before, same_repeat = self.live_metrics, ev.repeat is not None and ev.repeat + 1 == self.progress.repeat
            self.progress, self.live_metrics = progress_from_event(ev, self.progress)
            if self.live_metrics is not None:
                self.history = add_sample(self.history, self.live_metrics, ev.ts, before if same_repeat else None)
            if ev.phase:
                self.stage = ev.phase
        elif isinstance(ev, CapacityLevel):
            self.capacity.append(capacity_step(ev))
        return True


def parse_run_name(name: str) -> tuple[str, str]:
    """(mode, label) from ``<mode>_<label>_<YYYYmmdd>_<HHMMSS>_<unique>``."""
    m = _NAME.match(name)
    if not m:
        return "?", name
    return m["mode"], m["label"]


def process_alive(pid: int) -> bool:
    """Whether some process has this pid now: not whether it is a run's (see ``run_gone``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _has_proc() -> bool:
    return Path("/proc/self/stat").is_file()


def process_gone(pid: int, start_time: Optional[int], pgid: Optional[int], events_file: Path) -> Optional[str]:
    """None while the process recorded for a run (or a loop step) is still that process, else why
    it is not. With a start time (every run folder written since it is recorded) the pid must still
    have that start time (and process group): a reused pid is another process. Without one (a run
    folder from before), only a process that holds the run's ``events.jsonl`` open for writing, as
    the engine process of that folder does for its whole life, counts as the run's: a pid alone
    proves nothing. Where /proc cannot be read (macOS), a live pid is all there is to go on."""
    if not _has_proc():
        return None if process_alive(pid) else f"process {pid} ended without writing run_finished"
    if not process_alive(pid):
        return f"process {pid} ended without writing run_finished"
    if start_time is not None:
        if same_process(pid, start_time, pgid):
            return None
        return (f"process {pid} ended without writing run_finished (pid {pid} now belongs to another "
                "process: its start time differs from the one recorded)")
    if holds_open_for_writing(pid, events_file):
        return None
    return (f"process {pid} is not this run's (no start time recorded, and it does not hold the run's "
            "events.jsonl open): the run's process ended without writing run_finished")


def run_gone(info: "RunInfo") -> Optional[str]:
    """``process_gone`` for a run's recorded process; None too when no pid is known yet."""
    if info.pid is None:
        return None
    return process_gone(info.pid, info.start_time, info.pgid, info.path / "events.jsonl")


RACY_S = 2.0  # a folder modified this recently may change again within its mtime's granularity


@dataclass
class _Listing:
    """What the last look at one results folder found."""
    stamp: Optional[tuple[int, int, int]]  # the folder's (device, inode, mtime); None: look again next time
    runs: list[Path]
    others: list[Path]  # sub-folders that were no run yet
    notes: dict[Path, str]


def _stamp(folder: Path) -> tuple[Optional[tuple[int, int, int]], float]:
    try:
        st = os.stat(folder)
    except OSError:
        return None, 0.0
    return (st.st_dev, st.st_ino, st.st_mtime_ns), st.st_mtime


class RunCatalog:
    """The runs found under some results folders, kept up to date by ``refresh()``."""

    def __init__(self, roots: Iterable[Path]) -> None:
        self.roots = [Path(r).expanduser().resolve() for r in roots]
        self.runs: dict[Path, RunInfo] = {}
        # Folders the last scan left out, with why (an events.jsonl that is a FIFO, a device...).
        self.skipped: dict[Path, str] = {}
        self.gone: list[Path] = []  # run folders the last refresh dropped (deleted, archived)
        self._listings: dict[Path, _Listing] = {}
        self._live: list[RunInfo] = []  # the runs not finished at the end of the last refresh
        self._sizes: dict[Path, int] = {}  # events-file sizes the last listing saw on the way
        self._synced = False  # ``runs`` holds what the listings hold (a refresh that raised may not)

    def run_folders(self) -> list[Path]:
        from engine.runs.scan import find_run_folders
        skipped: dict[Path, str] = {}
        found = find_run_folders(self.roots, skipped)
        self.skipped = skipped
        return found

    def _list(self, relist: bool) -> bool:
        """Bring ``refresh``'s listings up to date; whether any run folder came or went.
        ``relist=False``: a root whose own mtime has not moved since it was listed (no entry
        added, removed or renamed) is not listed again; only its sub-folders that were no run
        yet are looked at again (a run's ``events.jsonl`` comes after its folder). A root
        modified less than ``RACY_S`` before it was listed is listed again next time: a change
        in the same clock tick would leave its mtime as it was."""
        from engine.runs.scan import is_run_folder, scan_root
        moved = False
        skipped: dict[Path, str] = {}
        self._sizes = {}
        for root in self.roots:
            listing = self._listings.get(root)
            stamp, mtime = _stamp(root)
            if relist or listing is None or stamp is None or stamp != listing.stamp:
                notes: dict[Path, str] = {}
                known = {str(p): p for p in listing.runs + listing.others} if listing is not None else None
                runs, others = scan_root(root, notes, self._sizes, known)
                trusted = stamp if stamp is not None and time.time() - mtime >= RACY_S else None
                moved = moved or listing is None or runs != listing.runs
                listing = self._listings[root] = _Listing(trusted, runs, others, notes)
            elif listing.others:
                still: list[Path] = []
                for folder in listing.others:
                    listing.notes.pop(folder, None)
                    if is_run_folder(folder, listing.notes, self._sizes):
                        listing.runs.append(folder)
                        moved = True
                    else:
                        still.append(folder)
                listing.others = still
            skipped.update(listing.notes)
        self.skipped = skipped
        return moved

    def refresh(self, finished: bool = True) -> list[RunInfo]:
        """Rescan; return the runs that changed (new ones included). An events file is opened
        only when its size says it grew.

        ``finished=False`` is the cheap check a poller makes between full ones: results folders
        are listed again only where their own mtime moved, and only new runs and runs that had
        not finished are read, so its cost does not grow with the finished runs kept. A finished
        run's events file does not grow (a resumed loop's does: it shows at the next full
        refresh), and a run whose events file was removed from a folder that stays is dropped
        then too."""
        from engine.runs.scan import events_grew
        changed: list[RunInfo] = []
        self.gone = []
        moved = self._list(relist=finished) or not self._synced
        self._synced = False
        if moved:
            seen = {folder for root in self.roots for folder in self._listings[root].runs}
            self.gone = [p for p in self.runs if p not in seen]
            for gone in self.gone:
                del self.runs[gone]
            for root in self.roots:
                for folder in self._listings[root].runs:
                    if folder not in self.runs:
                        mode, label = parse_run_name(folder.name)
                        info = self.runs[folder] = RunInfo(path=folder, mode=mode, label=label)
                        changed.append(info)
                        self._live.append(info)  # read by the next quick check, whatever happens below
        self._synced = True
        if finished:
            check = list(self.runs.values())
        else:
            check = [info for info in self._live if self.runs.get(info.path) is info]
        for info in check:
            size = self._sizes.get(info.path)  # seen by the listing: no second stat
            grew = events_grew(info) if size is None else size != info._offset
            if grew and read_new_events(info) and info not in changed:
                changed.append(info)
            if info.state == RunState.RUNNING and info.pid is not None:
                why = run_gone(info)
                if why is not None:
                    # Gone without run_finished: killed hard, the machine went down, or the pid
                    # now names another process.
                    read_new_events(info)  # it may have finished between the two reads
                    if info.state == RunState.RUNNING:
                        info.state = RunState.LOST
                        info.error = why
                        if info not in changed:
                            changed.append(info)
        if finished or changed or self.gone:
            self._live = [info for info in self.runs.values() if not info.is_finished]
        return changed

    def sorted_runs(self) -> list[RunInfo]:
        """Newest first."""
        return sorted(self.runs.values(), key=lambda r: (r.started or _mtime(r.path)), reverse=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def read_new_events(info: RunInfo) -> bool:
    """Apply the events appended since the last read; a half-written last line waits for its end.
    Read in bounded chunks from a regular file only (engine.runs.scan): never blocks on a FIFO."""
    from engine.runs.scan import decode_event_line, read_appended_lines
    changed = False
    for line in read_appended_lines(info):
        record = decode_event_line(line)
        if record is None:
            continue
        try:
            event = parse_event(record)
        except ValueError:
            continue  # a corrupt line never hides the rest of the run
        if event is not None and info.apply(event):  # None: a record that does not match its model
            info.events_read += 1
            changed = True
    if changed and info.is_finished and info.figures is None and not info._figures_read:
        info._figures_read = True
        info.figures = figures_from_report(info)
    return changed


def figures_from_report(info: RunInfo) -> Optional[RunFigures]:
    """The headline figures of a finished run whose ``run_finished`` carries none (a run recorded
    before it did), read once from its report; None where there is no report to read."""
    from engine.safeio import read_json
    path = info.report_path
    if path is None or info.mode not in ("benchmark", "compare", "analyze"):
        return None
    try:
        report = read_json(path)  # a regular file of a report's size only: never a FIFO or a device
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict):
        return None
    return benchmark_figures(report) if info.mode == "benchmark" else kernel_figures(report)


class CancelRefused(MagpieError, RuntimeError):
    """A run that cannot be cancelled (finished, or no process proven to be the run's to signal)."""

    title = "cannot cancel run"


def cancel_run(info: RunInfo) -> None:
    """Ask a running run to stop: SIGTERM to its own process, which cancels its children's
    process groups and still writes its report (state ``cancelled``).

    The signal goes only to a process proven to be the run's: the pid recorded in ``run_started``
    with the same start time (and process group), which also holds the run's ``events.jsonl``
    open for writing, as the engine process of a run does from start to finish. The process is
    pinned (a pidfd) before that proof, so a pid reused in between never gets the signal. A pid
    that now names another process (the MCP server, another user's run, a ``sleep``) is never
    signalled, whatever the events file says; nor is the caller's own process."""
    if info.is_finished:
        raise CancelRefused(f"{info.name} has already finished ({info.state})")
    if info.pid is None:
        raise CancelRefused(f"{info.name}: no process id in events.jsonl, so it cannot be signalled")
    pid = info.pid
    if pid == os.getpid():
        raise CancelRefused(f"{info.name}: its recorded process {pid} is this process; not signalled")
    events = info.path / "events.jsonl"

    def proof() -> Optional[str]:
        why = run_gone(info)
        if why is not None:
            return f"{info.name}: {why}; not signalled"
        held = holds_open_for_writing(pid, events)
        if held is None:
            return (f"{info.name}: cannot check that process {pid} is the run's (its open files cannot be read "
                    "here); not signalled")
        if not held:
            return (f"{info.name}: process {pid} does not hold the run's events.jsonl open, so it is not the run's "
                    "process; not signalled")
        return None
    why = signal_proven(pid, signal.SIGTERM, proof)
    if why is not None:
        raise CancelRefused(why if why.startswith(info.name) else f"{info.name}: {why}")

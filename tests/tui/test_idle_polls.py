"""The runs watcher's idle cost does not grow with the finished runs kept: idle polls leave
finished runs' events files alone, and a new run or a live run's new event still shows on the
next poll, which is due within about a second (a fake clock drives the pace)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import engine.runs.scan as scan
from engine.runs.workspace import Workspace
from magpie_tui.bridge import RunsWatcher

N_FINISHED = 120


class Target:
    def __init__(self) -> None:
        self.messages: list = []
        self.notes: list[str] = []

    def post_message(self, message) -> None:
        self.messages.append(message)

    def notify(self, text, **_kw) -> None:
        self.notes.append(text)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingOs:
    """``os`` for engine.runs.scan, counting the stats and opens of events files."""

    def __init__(self) -> None:
        self.stats: list[str] = []
        self.path = os.path

    def __getattr__(self, name):
        return getattr(os, name)

    def stat(self, path, *args, **kwargs):
        if str(path).endswith(scan.EVENTS_FILE):
            self.stats.append(str(path))
        return os.stat(path, *args, **kwargs)


@pytest.fixture
def touched(monkeypatch):
    """(stats, opens): the events files engine.runs.scan stat'ed and opened."""
    counting = CountingOs()
    opens: list[str] = []
    real_open = scan.open_regular

    def open_regular(path, *args, **kwargs):
        opens.append(str(path))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(scan, "os", counting)
    monkeypatch.setattr(scan, "open_regular", open_regular)
    return counting.stats, opens


def finished_runs(root: Path, n: int) -> list[Path]:
    """``n`` finished run folders, as the engine leaves them; the results folder's mtime set a
    minute back (a folder modified just now is listed again until its mtime can be trusted)."""
    root.mkdir(parents=True)
    folders = []
    for i in range(n):
        folder = root / f"compare_old{i:03d}_20261201_120000_{i:06x}"
        folder.mkdir()
        events = [{"ts": 1.0, "event": "run_started", "mode": "compare", "pid": 1, "label": f"old{i}"},
                  {"ts": 2.0, "event": "run_finished", "state": "completed", "exit_code": 0}]
        (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        folders.append(folder)
    old = time.time() - 60
    os.utime(root, (old, old))
    return folders


def tick(watcher: RunsWatcher, clock: Clock) -> bool:
    """One tick of the app's timer: the clock moves on by ``fast``; a poll if one is due."""
    clock.now += watcher.fast
    if watcher.due():
        watcher.poll()
        return True
    return False


def test_idle_polls_leave_finished_runs_alone_and_slow_down(tmp_path, touched):
    stats, opens = touched
    root = tmp_path / "results"
    finished = finished_runs(root, N_FINISHED)
    clock, target = Clock(), Target()
    watcher = RunsWatcher([root], target, fast=0.5, clock=clock)
    watcher.poll()
    assert len(watcher.catalog.runs) == N_FINISHED and len(watcher.titles) == N_FINISHED
    assert all(info.state == "completed" for info in watcher.catalog.runs.values())
    del stats[:], opens[:]
    messages = len(target.messages)

    ticks = 40  # 20 s of idle at the fast tick
    polls = sum(tick(watcher, clock) for _ in range(ticks))
    assert polls <= ticks // 2 + 1  # at most one poll a second once nothing changes
    assert watcher.every == RunsWatcher.SLOW
    assert 1 <= watcher.full_polls - 1 <= 2  # the full refreshes, besides the first
    assert opens == []  # no events file grew: none was opened
    # Finished runs' events files are stat'ed by the full refreshes only, once each per refresh.
    files = {str(f / "events.jsonl") for f in finished}
    assert len([s for s in stats if s in files]) == (watcher.full_polls - 1) * N_FINISHED
    assert set(stats) - files <= {str(root / "events.jsonl")}  # is the results folder itself a run?
    assert len(target.messages) == messages  # nothing changed, nothing posted

    # A new run shows on the next poll, due within a second.
    ws = Workspace.create(root, "benchmark", "late")
    ws.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(ws.root), label="late")
    waited = 0.0
    while ws.root not in watcher.catalog.runs:
        assert waited < 1.0, "the new run did not show within a second"
        tick(watcher, clock)
        waited += watcher.fast
    info = watcher.catalog.runs[ws.root]
    assert info.state == "running" and target.messages[-1].changed[0] is info
    assert watcher.every == watcher.fast  # something changed: every tick again

    # Idle again; then the running run's new event shows on the next poll, within a second.
    for _ in range(10):
        tick(watcher, clock)
    assert watcher.every == RunsWatcher.SLOW
    del opens[:]
    ws.events.emit("progress", phase="measure", done=3, total=10)
    waited = 0.0
    while info.done != 3:
        assert waited < 1.0, "the live run's event did not show within a second"
        tick(watcher, clock)
        waited += watcher.fast
    assert opens and set(opens) == {str(ws.root / "events.jsonl")}  # only the live run was read
    ws.events.emit("run_finished", state="completed", exit_code=0)
    ws.events.close()


def test_a_key_brings_back_the_fast_tick_and_a_finished_run_that_grows_shows_at_a_full_refresh(tmp_path):
    root = tmp_path / "results"
    finished = finished_runs(root, 3)
    clock = Clock()
    watcher = RunsWatcher([root], Target(), fast=0.5, clock=clock)
    watcher.poll()
    for _ in range(10):
        tick(watcher, clock)
    while not tick(watcher, clock):
        pass  # until the tick that polled
    assert watcher.every == RunsWatcher.SLOW and not watcher.due(clock.now + watcher.fast)  # idle: every other tick
    watcher.poke()
    assert watcher.due(clock.now + watcher.fast)  # the user acted: a poll at the next tick
    assert watcher.full_every == RunsWatcher.FULL_MIN

    # A finished run written to again (a resumed loop): seen by the next full refresh, and
    # full refreshes come at most FULL_MAX apart.
    with open(finished[0] / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"ts": 3.0, "event": "run_started", "mode": "compare", "pid": 1}) + "\n")
    info = watcher.catalog.runs[finished[0]]
    waited, fulls = 0.0, watcher.full_polls
    while info.state == "completed":
        assert waited <= RunsWatcher.FULL_MAX, "a finished run that grew was never looked at again"
        tick(watcher, clock)
        waited += watcher.fast
    assert watcher.full_polls == fulls + 1
    assert info.state == "lost"  # pid 1 is not the run's process


def test_quick_checks_still_refuse_a_fifo_events_file(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    root = tmp_path / "results"
    finished_runs(root, 2)
    clock, target = Clock(), Target()
    watcher = RunsWatcher([root], target, fast=0.5, clock=clock)
    watcher.poll()
    # A folder made first and its events.jsonl after it (as a run does), here a FIFO: the quick
    # check looks at the new folder again and leaves it out with a note, never opening the FIFO.
    folder = root / "compare_fifo_20261201_120000_fff000"
    folder.mkdir()
    tick(watcher, clock)
    os.mkfifo(folder / "events.jsonl")
    for _ in range(4):
        tick(watcher, clock)
    assert folder not in watcher.catalog.runs and len(watcher.catalog.runs) == 2
    assert any("compare_fifo_" in note and "a FIFO" in note for note in target.notes)


async def test_a_key_in_the_workbench_brings_back_the_fast_tick(project):
    from tui.conftest import build_app
    from tui.test_app import SIZE
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        watcher = app.runs_watcher
        pokes: list[float] = []
        poke = watcher.poke
        watcher.poke = lambda: (pokes.append(watcher.clock()), poke())
        await pilot.press("2")
        assert pokes  # seen by the app before any widget: the watcher's pace is the unit tests' above

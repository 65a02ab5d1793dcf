"""The workbench's file I/O runs in thread workers and reaches screens through signals."""

from __future__ import annotations

import os
import threading

from textual.screen import Screen
from textual.widgets import Static
from tui.conftest import build_app
from tui.test_app import SIZE, open_runs, wait_for

from engine.runs.workspace import Workspace
from magpie_tui.messages import RunsChanged
from magpie_tui.widgets.run_log import RunLog


async def test_a_run_folder_created_after_start_shows_up_through_the_scan_worker(project):
    app = build_app(project)
    scan_threads: set[int] = set()
    poll = app.runs_watcher.poll

    def recording_poll() -> None:
        scan_threads.add(threading.get_ident())
        poll()

    app.runs_watcher.poll = recording_poll
    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        ws = Workspace.create(project / "results", "benchmark", "late")
        ws.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(ws.root), label="late")
        table = app.screen.query_one("#runs-table")
        await wait_for(pilot, lambda: str(ws.root) in table.visible_keys())
        assert table.get_row(str(ws.root))["state"] == "running"
        assert scan_threads and threading.get_ident() not in scan_threads  # never on the event loop


class Listener(Screen):
    """A screen that only listens to the app's runs signal."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[RunsChanged] = []

    def compose(self):
        yield Static("listening")

    def on_mount(self) -> None:
        self.app.runs_signal.subscribe(self, self.heard.append)


async def test_a_subscribed_screen_is_notified_of_new_runs(project):
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        listener = Listener()
        await app.push_screen(listener)
        await wait_for(pilot, lambda: listener.is_running)
        ws = Workspace.create(project / "results", "compare", "heard")
        ws.events.emit("run_started", mode="compare", pid=os.getpid(), workspace=str(ws.root), label="heard")
        await wait_for(pilot, lambda: any(info.path == ws.root for m in listener.heard for info in m.changed))
        assert any(info.label == "heard" for info in listener.heard[-1].runs)


async def test_a_large_log_is_shown_in_bounded_chunks_without_blocking(project):
    log_file = project / "big.log"
    log_file.write_text("".join(f"line {i} " + "x" * 90 + "\n" for i in range(60_000)))  # ~6 MB
    app = build_app(project)
    sizes: list[int] = []

    class CountingLog(RunLog):
        def on_run_log_lines_read(self, message: RunLog.LinesRead) -> None:
            # Textual also calls RunLog's handler (each class in the MRO gets the message).
            sizes.append(sum(len(line.encode()) + 1 for line in message.lines))

    async with app.run_test(size=SIZE) as pilot:
        log = CountingLog(log_file, chunk_bytes=64 << 10, max_lines=100_000)
        await app.screen.mount(log)
        await wait_for(pilot, lambda: log.lines[-1:] == ["line 59999 " + "x" * 90], timeout=60)
        assert log.lines[0].startswith("[") and "MB earlier" in log.lines[0]  # the first 2 MB skipped
        # A chunk is at most 64 KiB read, plus the line the previous chunk cut (101 bytes here).
        assert max(sizes) <= (64 << 10) + 101 and len(sizes) > 10

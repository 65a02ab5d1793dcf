"""``WorkbenchApp``: the workbench's App. It owns the long-lived parts (the runs watcher, the
config watcher, processes it started), so switching screens never loses or cancels anything.

Blocking work stays off the event loop: the catalog scan runs in a thread worker (one at a
time, group ``runs-catalog``) that posts ``RunsChanged``, at the pace ``RunsWatcher.due`` sets
(every tick while things change or the user acts, slower while idle); reports are read in a
thread worker before their screen is built. Screens hear about changes through ``runs_signal`` and
``configs_signal`` (``textual.signal.Signal``), which they subscribe to when they mount.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from textual import events, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.signal import Signal
from textual.worker import Worker

from engine.jobs.query import RunInfo
from magpie_tui.bridge import RunsWatcher, watch_configs
from magpie_tui.messages import ConfigsChanged, RunsChanged
from magpie_tui.settings import Settings
from magpie_tui.themes import DEFAULT_THEME, load_themes, semantic_defaults, stylesheet

if TYPE_CHECKING:
    from magpie_tui.launching import StartedRun


class WorkbenchApp(App):
    TITLE = "Magpie workbench"
    CSS_PATH = [stylesheet("app.tcss")]
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("1", "show_side('configs')", "Configs", id="app.configs"),
        Binding("2", "show_side('runs')", "Runs", id="app.runs"),
        Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
        Binding("f1", "help", "Help", show=False, id="app.help_f1"),
        Binding("ctrl+t", "cycle_theme", "Theme", show=False, id="app.cycle_theme"),
        Binding("colon", "command_palette", "Commands", key_display=":", id="app.palette"),
        Binding("q", "back", "Back", show=False, id="app.back"),
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True),
        # Priority: the focus moves when the app reads the key, not after the field it leaves has
        # handled the keys typed before it, so a fast "1 Tab 7" fills two fields, not one with 17.
        Binding("tab", "focus_next", "Next field", show=False, id="app.focus_next", priority=True),
        Binding("shift+tab", "focus_previous", "Previous field", show=False, id="app.focus_previous",
                priority=True),
    ]

    MODES = {"configs": lambda: _configs_screen(), "runs": lambda: _runs_screen()}

    def __init__(self, settings: Settings, *, poll_interval: float = 0.5, watch_files: bool = True) -> None:
        super().__init__()
        self.settings = settings
        self.poll_interval = poll_interval
        self.watch_files = watch_files
        self.runs: list[RunInfo] = []
        self.started: dict[int, StartedRun] = {}  # pid -> processes this session started
        self.runs_watcher = RunsWatcher(settings.results_dirs, self, fast=poll_interval)
        self._scan: Worker | None = None  # the catalog scan in flight, if any
        # Fan-out to screens: subscribe on mount, e.g. ``app.runs_signal.subscribe(self, self.runs_changed)``.
        self.runs_signal: Signal[RunsChanged] = Signal(self, "runs-changed")
        self.configs_signal: Signal[ConfigsChanged] = Signal(self, "configs-changed")
        self.theme_problems: list[str] = []
        self._stop_watch: asyncio.Event | None = None
        self.animation_level = "none"  # over SSH every byte counts
        # A run just launched from here: the Runs list selects it as soon as its folder appears.
        self.select_next: StartedRun | None = None
        # What a screen looked like when it closed (filter, sort, stage, tab), by (screen, run folder).
        self.view_state: dict[tuple[str, Path], dict] = {}
        self._frozen_at = 0  # how many runs were listed when the heap was last frozen (_freeze_heap)

    # -- themes -------------------------------------------------------------------------------
    def get_theme_variable_defaults(self) -> dict[str, str]:
        return semantic_defaults()

    def _register_themes(self) -> None:
        themes, self.theme_problems = load_themes([self.settings.user_theme_dir])
        for theme in themes:
            self.register_theme(theme)
        wanted = self.settings.theme
        if wanted not in self.available_themes:
            self.theme_problems.append(f"theme {wanted!r} not found; using {DEFAULT_THEME}")
            wanted = DEFAULT_THEME
        self.theme = wanted

    def watch_theme(self, theme: str) -> None:
        if self.is_mounted and theme != self.settings.theme:
            try:
                self.settings.save_theme(theme)
            except OSError as exc:
                self.notify(f"theme not saved: {exc}", severity="warning")

    def action_cycle_theme(self) -> None:
        ours = sorted(name for name in self.available_themes if name.startswith("magpie-"))
        self.theme = ours[(ours.index(self.theme) + 1) % len(ours)] if self.theme in ours else ours[0]

    # -- life cycle ---------------------------------------------------------------------------
    def on_mount(self) -> None:
        self._register_themes()
        if self.settings.keymap:
            self.set_keymap(self.settings.keymap)
        for problem in self.settings.problems + self.theme_problems:
            self.notify(problem, severity="warning", timeout=10)
        self._poll_runs()
        self.set_interval(self.poll_interval, self._poll_runs)
        if self.watch_files:
            self._stop_watch = asyncio.Event()
            self.run_worker(self._watch_configs(), name="config-watcher", group="watchers", exit_on_error=False)
        if hasattr(signal, "SIGHUP"):
            # The terminal went away (SSH drop): exit instead of spinning; runs keep going.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._hangup)
        self.switch_mode("configs")

    def _hangup(self) -> None:
        self.exit(return_code=129)

    async def _watch_configs(self) -> None:
        await watch_configs(self.settings.project_dir, self, stop_event=self._stop_watch)

    def _poll_runs(self) -> None:
        for pid, started in list(self.started.items()):
            if started.process.poll() is not None:  # reap: no zombies while the app runs
                del self.started[pid]
        # Back-pressure: a slow scan (many runs, a slow disk) skips ticks instead of piling up;
        # while nothing changes, the watcher skips ticks too (``RunsWatcher.due``).
        if (self._scan is None or self._scan.is_finished) and self.runs_watcher.due():
            self._scan = self.scan_runs()

    @work(thread=True, exclusive=True, group="runs-catalog", name="runs-scan", exit_on_error=False,
          description="scan the results folders and read new events")
    def scan_runs(self) -> None:
        """Blocking: a stat of every results folder (listed again when it changed) and reads of the
        runs still going; now and then every events file is stat'ed too (``RunsWatcher``). The
        watcher posts ``RunsChanged`` (thread-safe) when something changed."""
        self.runs_watcher.poll()

    async def on_event(self, event: events.Event) -> None:
        # A key or a click, seen before any widget: the runs scan picks up its fast pace again.
        if isinstance(event, (events.Key, events.MouseDown, events.MouseScrollDown, events.MouseScrollUp)) \
                and not event.is_forwarded:
            self.runs_watcher.poke()
        await super().on_event(event)

    def on_runs_changed(self, message: RunsChanged) -> None:
        self.runs = message.runs
        # Every subscribed screen gets the same snapshot, visible or not.
        self.runs_signal.publish(message)
        if len(self.runs) >= self._frozen_at * 2 + 100:
            self.call_after_refresh(self._freeze_heap)

    def _freeze_heap(self) -> None:
        """The runs listed (and the rows drawn for them) live as long as the app: out of the
        garbage collector's full passes, which otherwise walk all of them every few seconds (a
        200 ms pause with 2,000 runs, felt as a key that waits). Again when the runs doubled."""
        self._frozen_at = len(self.runs)
        gc.freeze()

    def on_configs_changed(self, message: ConfigsChanged) -> None:
        self.configs_signal.publish(message)

    async def action_quit(self) -> None:
        if self._stop_watch is not None:
            self._stop_watch.set()
        self.exit()

    def action_show_side(self, mode: str) -> None:
        """``1``/``2``: the Configs tree or the Runs list itself, never whatever was last opened
        on that side (an old diff, a report): what the key names is what the user sees."""
        self.switch_mode(mode)
        while len(self.screen_stack) > 1:
            self.pop_screen()

    def show_started(self, started: StartedRun) -> None:
        """After a launch: the Runs list, with the new run selected once its folder appears."""
        self.track_started(started)
        self.select_next = started
        self.action_show_side("runs")

    def action_back(self) -> None:
        """``q``: what ``esc`` does where it is pressed (back one level, close a dialog), as in k9s
        and lazygit; on the Configs tree or the Runs list itself, how to quit instead."""
        if len(self.screen_stack) > 1:
            self.simulate_key("escape")
        else:
            self.notify("q goes back one level; this is the top: ctrl+q quits", timeout=3)

    def action_help(self) -> None:
        from magpie_tui.screens.help import HelpScreen
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    # -- runs ---------------------------------------------------------------------------------
    def run_by_path(self, path: Path) -> RunInfo | None:
        return self.runs_watcher.catalog.runs.get(path)

    def track_started(self, started: StartedRun) -> None:
        self.started[started.pid] = started

    def open_run(self, info: RunInfo) -> None:
        """The run screen, or for an optimization loop (mode ``loop``) the loop's chain."""
        if info.mode == "loop":
            self.open_loop(info.path)
            return
        from magpie_tui.screens.run import RunScreen
        self.push_screen(RunScreen(info))

    def open_loop(self, path: Path, tab: str | None = None) -> None:
        from magpie_tui.screens.loop import LoopScreen
        self.push_screen(LoopScreen(path, tab=tab))

    def open_report(self, info: RunInfo, compare_with: RunInfo | None = None) -> None:
        """The report screen that fits the run's mode; its files are read in a thread worker.
        A loop's report is its verdict, on the loop screen. ``compare_with``: a second benchmark
        run shown side by side (B) once the report is up."""
        if info.mode == "loop":
            self.open_loop(info.path, tab="tab-verdict")
            return
        self._read_report(info, compare_with)

    @work(thread=True, exclusive=True, group="report-files", exit_on_error=False,
          description="read a run's report files")
    def _read_report(self, info: RunInfo, compare_with: RunInfo | None = None) -> None:
        from magpie_tui.screens.reports import read_report_files
        files = read_report_files(info)
        self.call_from_thread(self._show_report, info, files, compare_with)

    def _show_report(self, info: RunInfo, files, compare_with: RunInfo | None = None) -> None:
        from magpie_tui.screens.reports import open_report_screen
        screen = open_report_screen(self, info, files)
        if screen is not None:
            self.push_screen(screen)
            if compare_with is not None and hasattr(screen, "compare_with"):
                screen.call_after_refresh(screen.compare_with, compare_with)

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Configs", "Browse and validate configs", lambda: self.switch_mode("configs"))
        yield SystemCommand("Runs", "Every run under the results folders", lambda: self.switch_mode("runs"))
        yield SystemCommand("Help", "Key bindings and their ids", self.action_help)
        yield SystemCommand("Next theme", "Cycle the Magpie themes (saved)", self.action_cycle_theme)
        # The actions of the screen in front, by their footer names.
        for binding in getattr(screen, "BINDINGS", []):
            if isinstance(binding, Binding) and binding.description and binding.id:
                yield SystemCommand(binding.description, f"{binding.id} ({binding.key})",
                                    lambda action=binding.action, target=screen: self.call_later(
                                        target.run_action, action))
        for info in self.runs[:20]:
            yield SystemCommand(f"Open run {info.name}", f"{info.state} {info.mode} {info.label}",
                                lambda info=info: self.open_run(info))

    def on_unmount(self) -> None:
        # Runs we started keep going (they are detached); just stop watching them.
        self.started.clear()
        if self._frozen_at:  # what the app froze can be collected again once it is gone
            gc.unfreeze()


def _configs_screen():
    from magpie_tui.screens.configs import ConfigsScreen
    screen = ConfigsScreen()
    # ConfigsScreen has a ``configs_changed`` handler but does not subscribe itself: subscribe it
    # here, once it runs (call_later's callback is handled after its mount).
    screen.call_later(_subscribe_configs, screen)
    return screen


def _subscribe_configs(screen) -> None:
    screen.app.configs_signal.subscribe(screen, screen.configs_changed)


def _runs_screen():
    from magpie_tui.screens.runs import RunsScreen
    return RunsScreen()


def run_app(settings: Settings) -> int:
    app = WorkbenchApp(settings)
    app.run()
    code = app.return_code or 0
    if code == 129:
        os._exit(0)  # hung-up terminal: nothing more to print to
    return code

"""Runs: every run under the results folders, live — including runs started from the
command line or from an earlier workbench session."""

from __future__ import annotations

import time
from datetime import datetime

from rich.text import Text
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from engine.runs.catalog import CancelRefused, RunInfo, cancel_run
from magpie_tui.errors import error_text
from magpie_tui.messages import RunsChanged

COLUMNS = (("state", "State"), ("mode", "Mode"), ("label", "Label"), ("progress", "Progress"),
           ("elapsed", "Elapsed"), ("started", "Started"), ("folder", "Folder"))


# Theme variable that colours each state (resolved from the active theme when drawn).
STATE_VARIABLES = {"running": "running", "completed": "correct", "failed": "incorrect", "lost": "incorrect",
                   "timeout": "incorrect", "cancelled": "muted", "pending": "muted"}


def theme_style(app, variable: str, bold: bool = False) -> str:
    """A Rich style string from a theme variable, for widgets that draw Rich text."""
    colour = app.theme_variables.get(variable, "")
    return f"bold {colour}".strip() if bold else colour


def format_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_cell(info: RunInfo) -> str:
    """Live progress while running; afterwards what the run ended with."""
    if not info.is_finished:
        return info.progress_text or "-"
    if info.error:
        return info.error
    if info.done is not None and info.total:
        return f"{info.done}/{info.total} · exit {info.exit_code}"
    return f"exit {info.exit_code}" if info.exit_code is not None else "-"


def format_started(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S") if ts else "-"


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter,o", "open_run", "Open", id="runs.open"),
        Binding("r", "open_report", "Report", id="runs.report"),
        Binding("c", "cancel_run", "Cancel run", id="runs.cancel"),
    ]

    def compose(self):
        yield Header()
        yield Static("", id="runs-summary")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.sub_title = ", ".join(str(d) for d in self.app.settings.results_dirs)
        self._fill(self.app.runs)
        self.app.runs_signal.subscribe(self, self.runs_changed)
        self.set_interval(1.0, self._tick)
        self.watch(self.app, "theme", lambda _theme: self._fill(self.app.runs, force=True), init=False)
        table.focus()

    def on_unmount(self) -> None:
        self.app.runs_signal.unsubscribe(self)

    def runs_changed(self, message: RunsChanged) -> None:
        """``app.runs_signal``'s callback: a new snapshot from the catalog scan."""
        if self.is_mounted:
            self._fill(message.runs, changed=message.changed)

    def _row(self, info: RunInfo, now: float) -> list:
        style = theme_style(self.app, STATE_VARIABLES.get(info.state, "muted"), bold=info.state == "running")
        return [Text(info.state, style=style), info.mode, info.label, progress_cell(info),
                format_elapsed(info.elapsed(now)), format_started(info.started), info.name]

    def _fill(self, runs: list[RunInfo], force: bool = False, changed: list[RunInfo] | None = None) -> None:
        """Rebuild the table when the set or order of runs changed; otherwise update the cells of
        ``changed`` (every run when None): with hundreds of runs, a live one's progress must not
        rewrite every row."""
        table = self.query_one(DataTable)
        now = time.time()
        wanted = [str(r.path) for r in runs]
        existing = [str(k.value) for k in table.rows]
        if existing != wanted or force:
            current = existing[table.cursor_row] if existing and 0 <= table.cursor_row < len(existing) else None
            table.clear()
            for info in runs:
                table.add_row(*self._row(info, now), key=str(info.path))
            if current in wanted:
                table.move_cursor(row=wanted.index(current), animate=False)
        else:
            for info in runs if changed is None else changed:
                if str(info.path) not in table.rows:
                    continue
                for (key, _label), value in zip(COLUMNS, self._row(info, now)):
                    table.update_cell(str(info.path), key, value)
        running = sum(1 for r in runs if r.state == "running")
        self.query_one("#runs-summary", Static).update(
            f"{len(runs)} runs, {running} running — enter: open, r: report, c: cancel")

    def _tick(self) -> None:
        now = time.time()
        table = self.query_one(DataTable)
        for info in self.app.runs:
            if info.state == "running" and str(info.path) in table.rows:
                table.update_cell(str(info.path), "elapsed", format_elapsed(info.elapsed(now)))

    def selected_run(self) -> RunInfo | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = list(table.rows)[table.cursor_row].value
        return next((r for r in self.app.runs if str(r.path) == key), None)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open_run()

    def action_open_run(self) -> None:
        info = self.selected_run()
        if info is not None:
            self.app.open_run(info)

    def action_open_report(self) -> None:
        info = self.selected_run()
        if info is not None:
            self.app.open_report(info)

    def action_cancel_run(self) -> None:
        from magpie_tui.screens.confirm import ConfirmScreen
        info = self.selected_run()
        if info is None:
            return
        if info.is_finished:
            self.notify(f"{info.name} has already finished ({info.state}).", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                try:
                    cancel_run(info)
                    self.notify(f"cancelling {info.name} (its report will say so)")
                except CancelRefused as exc:
                    self.notify(error_text(exc), severity="error")
        self.app.push_screen(ConfirmScreen(f"Cancel {info.name}?\nIts children are stopped and the report "
                                           "is written with state 'cancelled'."), answered)

"""Runs: every run under the results folders, live — including runs started from the
command line or from an earlier workbench session.

The list is a ``DataGrid``: ``/`` filters it, ``s`` (or a header click) sorts by the highlighted
column, ``space`` marks runs (two marked benchmark runs, or two compare runs, side by side with
``v``; ``u`` clears the marks), ``R`` re-runs the highlighted run with its recorded config,
``D``/``A`` delete or archive a finished run after asking, ``y``/``Y`` copy its folder or its
command line.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from textual import work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Input, Static

from engine.errors import MagpieError
from engine.jobs import attach
from engine.jobs.query import RunInfo, headline_numbers, status_text
from magpie_tui.errors import error_text
from magpie_tui.messages import RunsChanged
from magpie_tui.widgets.data_grid import Column, DataGrid
from magpie_tui.widgets.footer import KeysFooter

# Row colour per state (a DataGrid row class, resolved from the active theme when drawn).
STATE_CLASSES = {"running": "running", "completed": "correct", "completed_with_errors": "incorrect",
                 "failed": "incorrect", "lost": "incorrect",
                 "timeout": "incorrect", "cancelled": "muted", "pending": "muted"}
# Kept for importers that colour Rich text by state.
STATE_VARIABLES = STATE_CLASSES


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
    """Live progress while running; afterwards what the run ended with (the run's one state,
    engine.runs.state: the same text as the Run screen's header, the job API and MCP). A running
    benchmark's tok/s, TTFT and TPOT have columns of their own, so its counts lead here."""
    return status_text(info.status, numbers=False) or "-"


def format_rate(value: float) -> str:
    """Output tok/s in at most 5 cells: ``1494``, ``12.3k``."""
    return f"{value / 1e3:.1f}k" if value >= 1e4 else f"{value:.0f}"


def format_ms(value: float) -> str:
    """A latency in at most 6 cells: ``4.65ms``, ``45.5ms``, ``254ms``, ``1.23s``, ``12.3s``."""
    if value < 1:
        return f"{value:.2f}ms"
    for scaled, unit in ((value, "ms"), (value / 1e3, "s")):
        text = f"{scaled:.3g}"
        if "e" not in text:  # 999.7 reads 1e+03: a second then
            return text + unit
    return f"{value / 1e3:.0f}s"


def format_started(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S") if ts else "-"


# The folder names the run (like k9s's NAME): it comes early and stays put when the list scrolls
# sideways. A benchmark's TTFT, TPOT (p50) and output tok/s have columns of their own (live while it
# runs, the report's once finished), beside the label: "how is TTFT/TPOT?" is answered at any width.
# Below ~200 columns the columns the folder name already tells (its mode prefix, its start time) step
# aside, then Elapsed. Still too wide, the folder, label and progress give up width together; below
# ~102 columns the folder steps aside too, so that at 80 columns each row shows its state, label,
# TTFT, TPOT, tok/s and progress (the label tells runs apart; `y` copies the folder's full path).
RUN_COLUMNS = [
    Column("mark", "✓", width=1, min_width=1),
    Column("state", "State", max_width=9),
    Column("folder", "Folder", max_width=60, squeeze_to=26, ellipsis="middle", drop_order=4, drop_last=True),
    Column("mode", "Mode", max_width=14, drop_order=1),
    Column("label", "Label", max_width=38, squeeze_to=16),
    Column("ttft", "TTFT", "number", fmt=format_ms, max_width=6),
    Column("tpot", "TPOT", "number", fmt=format_ms, max_width=6),
    Column("tok_s", "tok/s", "number", fmt=format_rate, max_width=7),
    # A compare's or a loop's progress (its winner, its outcome) runs over the TTFT, TPOT and tok/s
    # it leaves empty: at 80 columns 'winner one_pass 7.65x (95% CI 5.57–9.38)' reads whole.
    Column("progress", "Progress", max_width=44, squeeze_to=14, spill_left=("ttft", "tpot", "tok_s")),
    Column("elapsed", "Elapsed", "number", fmt=format_elapsed, min_width=7, drop_order=3),
    Column("started", "Started", "number", fmt=format_started, min_width=14, drop_order=2),
]


def run_row(info: RunInfo, now: float, marked: bool) -> dict[str, Any]:
    status = info.status  # built once a row: the progress text and the numbers both read it
    tok_s, ttft, tpot = headline_numbers(status)
    return {"mark": "✓" if marked else "", "state": info.state, "mode": info.mode, "label": info.label,
            "ttft": ttft, "tpot": tpot, "tok_s": tok_s,
            "progress": status_text(status, numbers=False) or "-", "elapsed": info.elapsed(now),
            "started": info.started, "folder": info.name}


def confirm_cancel(screen: Screen, info: RunInfo) -> None:
    """Cancel ``info`` after a yes from the user (every screen that cancels goes through here)."""
    from magpie_tui.screens.confirm import ConfirmScreen
    if info.is_finished:
        screen.notify(f"{info.name} has already finished ({info.state}).", severity="warning")
        return

    def answered(yes: bool | None) -> None:
        if yes:
            try:
                attach(info.path).cancel()
                screen.notify(f"cancelling {info.name} (its report will say so)")
            except MagpieError as exc:  # CancelRefused: finished, or no process proven to be the run's
                screen.notify(error_text(exc), severity="error")
    screen.app.push_screen(ConfirmScreen(f"Cancel {info.name}?\nIts children are stopped and the report "
                                         "is written with state 'cancelled'.", yes="Cancel run"), answered)


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter", "open_run", "Open", key_display="enter", id="runs.open"),
        Binding("o", "open_run", "Open", show=False, id="runs.open_o"),
        Binding("r", "open_report", "Report", id="runs.report"),
        Binding("slash", "focus_filter", "Filter", id="runs.filter"),
        Binding("c", "cancel_run", "Cancel", id="runs.cancel"),
        Binding("space", "toggle_mark", "Mark", show=False, id="runs.mark"),
        Binding("u", "clear_marks", "Clear marks", show=False, id="runs.clear_marks"),
        Binding("v", "compare_marked", "Compare marked", show=False, id="runs.compare_marked"),
        Binding("R", "rerun", "Re-run", show=False, id="runs.rerun"),
        Binding("D", "delete_run", "Delete", show=False, id="runs.delete"),
        Binding("A", "archive_run", "Archive", show=False, id="runs.archive"),
        Binding("y", "copy_path", "Copy path", show=False, id="runs.copy_path"),
        Binding("Y", "copy_command", "Copy command", show=False, id="runs.copy_command"),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="runs.clear_filter"),
    ]
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter); enter is the grid's.
    FOOTER_KEYS = ("grid.select", "runs.report", "runs.filter", "runs.cancel", "grid.sort")

    def __init__(self) -> None:
        super().__init__()
        self.marked: set[Path] = set()
        # Each run's row as last built, with what it was built from (``_row``): a refresh of
        # thousands of runs builds again only the rows of runs that changed.
        self._rows: dict[Path, tuple[tuple, dict[str, Any]]] = {}
        self._stale = False  # a snapshot came while another screen was in front

    def compose(self):
        yield Header()
        yield Static("", id="runs-summary")
        yield Input(placeholder="filter: state, mode, label, folder (enter: back to the list, esc: clear)",
                    id="runs-filter", compact=True)
        yield DataGrid(RUN_COLUMNS, row_class=lambda row: STATE_CLASSES.get(row["state"], "muted"),
                       fixed_columns=3, filter_columns=["state", "mode", "label", "progress", "folder"],
                       select_label="Open", id="runs-table")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

    def on_mount(self) -> None:
        self.sub_title = ", ".join(str(d) for d in self.app.settings.results_dirs)
        self.query_one("#runs-filter", Input).display = False
        self._fill(self.app.runs)
        self.app.runs_signal.subscribe(self, self.runs_changed)
        self.set_interval(1.0, self._tick)
        grid = self.query_one(DataGrid)
        grid.move_cursor_to_column("state")  # s sorts by a column that tells runs apart, not the mark
        grid.focus()

    def on_unmount(self) -> None:
        self.app.runs_signal.unsubscribe(self)

    def on_screen_resume(self) -> None:
        if self._stale:
            self._fill(self.app.runs)
        self._select_launched()

    def runs_changed(self, message: RunsChanged) -> None:
        """``app.runs_signal``'s callback: a new snapshot from the catalog scan. Behind another
        screen (a run, a report) the list is filled when it is shown again, not on every
        snapshot: the keys of the screen in front wait for no list they cannot see."""
        if not self.is_mounted:
            return
        if self.is_current:
            self._fill(message.runs)
        else:
            self._stale = True

    def _fill(self, runs: list[RunInfo]) -> None:
        """The rows, in the catalog's order (newest first) unless the user sorted; the cursor
        stays on its run (rows are keyed by folder)."""
        grid = self.query_one(DataGrid)
        now = time.time()
        self.marked &= {r.path for r in runs}
        self._stale = False
        grid.set_rows([self._row(r, now) for r in runs], keys=[str(r.path) for r in runs])
        if len(self._rows) > len(runs):  # runs deleted or archived
            paths = {r.path for r in runs}
            self._rows = {p: built for p, built in self._rows.items() if p in paths}
        self._show_summary(runs)
        self._select_launched()

    def _row(self, info: RunInfo, now: float) -> dict[str, Any]:
        """``run_row``, built again only when the run changed (an event read, its state, label or
        error, its mark); a run still going gets its elapsed time anew."""
        marked = info.path in self.marked
        basis = (info.events_read, info.state, info.label, info.error, marked)
        built = self._rows.get(info.path)
        if built is None or built[0] != basis:
            row = run_row(info, now, marked)
            self._rows[info.path] = (basis, row)
            return row
        row = built[1]
        if not info.is_finished:
            row = {**row, "elapsed": info.elapsed(now)}
        return row

    def _show_summary(self, runs: list[RunInfo]) -> None:
        """The line above the list: counts, a sort by a column too wide to show, the main keys."""
        grid = self.query_one(DataGrid)
        running = sum(1 for r in runs if r.state == "running")
        shown = grid.visible_count
        counts = f"{len(runs)} runs, {running} running" + (f", {shown} shown" if shown != len(runs) else "")
        marks = ""
        if self.marked:
            hidden = len(self.marked) - len(self._marked_shown())
            marks = f", {len(self.marked)} marked" + (f" ({hidden} hidden by the filter)" if hidden else "")
        note = f" · {grid.hidden_sort_note}" if grid.hidden_sort_note else ""
        # The hints that fit the line, least needed first out; "?: every key" stays (it finds the rest).
        head, hints = f"{counts}{marks}{note} — ", ["enter: open", "space: mark, v: compare two", "R: re-run"]
        room = (self.size.width or self.app.size.width) - 2
        while hints and len(head) + len(" · ".join(hints + ["?: every key"])) > room:
            hints.pop()
        self.query_one("#runs-summary", Static).update(head + " · ".join(hints + ["?: every key"]))

    def on_data_grid_sorted(self, event: DataGrid.Sorted) -> None:
        self._show_summary(self.app.runs)

    def on_data_grid_columns_fitted(self, event: DataGrid.ColumnsFitted) -> None:
        self._show_summary(self.app.runs)

    def _select_launched(self) -> None:
        """After a launch from this session: put the cursor on the new run once it is listed."""
        started = self.app.select_next
        if started is None or not self.is_mounted:
            return
        match = next((r for r in self.app.runs if r.pid == started.pid or
                      (started.run_dir is not None and r.path == Path(started.run_dir).resolve())), None)
        grid = self.query_one(DataGrid)
        if match is not None:
            if not grid.move_cursor_to_key(str(match.path)):  # hidden by a filter: show it
                self._set_filter("")
                grid.move_cursor_to_key(str(match.path))
            self.app.select_next = None

    def _tick(self) -> None:
        if not self.is_current:
            return
        if any(r.state == "running" for r in self.app.runs):
            self._fill(self.app.runs)

    def selected_run(self) -> RunInfo | None:
        key = self.query_one(DataGrid).cursor_row_key
        return next((r for r in self.app.runs if str(r.path) == key), None) if key is not None else None

    def on_data_grid_row_selected(self, event: DataGrid.RowSelected) -> None:
        event.stop()
        self.action_open_run()

    # -- filter -------------------------------------------------------------------------------
    def action_focus_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "runs-filter":
            self.query_one(DataGrid).set_filter(event.value)
            self._fill(self.app.runs)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "runs-filter":  # keep the filter, back to the list
            event.input.display = bool(event.value)
            self.query_one(DataGrid).focus()

    def action_clear_filter(self) -> None:
        self._set_filter("")
        self.query_one(DataGrid).focus()

    def _set_filter(self, text: str) -> None:
        box = self.query_one("#runs-filter", Input)
        box.value = text
        box.display = bool(text)
        self.query_one(DataGrid).set_filter(text)

    # -- actions on the highlighted run ------------------------------------------------------------
    def action_open_run(self) -> None:
        info = self.selected_run()
        if info is not None:
            self.app.open_run(info)

    def action_open_report(self) -> None:
        info = self.selected_run()
        if info is not None:
            self.app.open_report(info)

    def action_cancel_run(self) -> None:
        info = self.selected_run()
        if info is not None:
            confirm_cancel(self, info)

    def action_toggle_mark(self) -> None:
        info = self.selected_run()
        if info is None:
            return
        self.marked ^= {info.path}
        self._fill(self.app.runs)

    def action_clear_marks(self) -> None:
        if self.marked:
            self.marked.clear()
            self._fill(self.app.runs)

    def _marked_shown(self) -> list[RunInfo]:
        """The marked runs the filter lets through: what ``v`` acts on."""
        shown = {str(k) for k in self.query_one(DataGrid).visible_keys()}
        return [r for r in self.app.runs if r.path in self.marked and str(r.path) in shown]

    def action_compare_marked(self) -> None:
        marked = self._marked_shown()
        if len(marked) != 2:
            hidden = len(self.marked) - len(marked)
            self.notify(f"mark exactly two runs (space) to compare them; {len(marked)} marked and shown"
                        + (f", {hidden} more hidden by the filter (esc clears it, u clears the marks)" if hidden else ""),
                        severity="warning")
            return
        a, b = sorted(marked, key=lambda r: r.started or 0.0)  # the older one is A
        missing = [r.name for r in (a, b) if not r.report_path]
        if missing:
            self.notify(f"no report yet in {', '.join(missing)} ({a.state}, {b.state}): compare needs both "
                        "reports", severity="warning")
            return
        kinds = {a.mode, b.mode}
        if kinds == {"benchmark"}:
            self.app.open_report(a, compare_with=b)
        elif kinds <= {"compare", "analyze"}:
            self._open_kernel_pair(a, b)
        else:
            self.notify(f"side by side works for two benchmark runs or two compare runs; marked: {a.mode} "
                        f"and {b.mode}", severity="warning")

    @work(thread=True, exclusive=True, group="report-files", exit_on_error=False,
          description="read two compare reports")
    def _open_kernel_pair(self, a: RunInfo, b: RunInfo) -> None:
        from engine.runs.schema import load_report
        from magpie_tui.screens.compare_runs import CompareRunsScreen
        try:
            report_a, report_b = load_report(a.report_path), load_report(b.report_path)
        except ValueError as exc:  # names the file and the field that failed
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.app.call_from_thread(self.app.push_screen, CompareRunsScreen(a, report_a, b, report_b))

    def action_copy_path(self) -> None:
        info = self.selected_run()
        if info is not None:
            self.app.copy_to_clipboard(str(info.path))
            self.notify(f"copied {info.path}")

    def _plan_rerun(self, info: RunInfo, write: bool = False):
        from magpie_tui.rerun import plan_rerun
        settings = self.app.settings
        return plan_rerun(info, settings.launch_results_dir, write=write, project_dir=settings.project_dir)

    def action_copy_command(self) -> None:
        info = self.selected_run()
        if info is not None:
            self._prepare_rerun(info, copy=True)

    def action_rerun(self) -> None:
        info = self.selected_run()
        if info is not None:
            self._prepare_rerun(info, copy=False)

    @work(thread=True, exclusive=True, group="rerun-plan", exit_on_error=False,
          description="work out how to re-run a run")
    def _prepare_rerun(self, info: RunInfo, copy: bool) -> None:
        """Blocking: reads the run's config or report and, without a config, searches the project's
        kernel configs; then asks (``R``) or copies the command line (``Y``) on the event loop."""
        from magpie_tui.rerun import RerunError
        try:
            plan = self._plan_rerun(info)
        except RerunError as exc:  # says why the folder is not enough and what to do instead
            self.app.call_from_thread(self.notify, str(exc), severity="warning", timeout=12)
            return
        self.app.call_from_thread(self._copy_command if copy else self._ask_rerun, info, plan)

    def _copy_command(self, info: RunInfo, plan) -> None:
        command = f"magpie {' '.join(plan.argv()[3:])}"
        self.app.copy_to_clipboard(command)
        self.notify(f"copied: {command}")

    def _ask_rerun(self, info: RunInfo, plan) -> None:
        from magpie_tui.screens.confirm import ConfirmScreen
        question = (f"Run {info.name} again?\nConfig: {plan.source}.\n"
                    f"$ magpie {' '.join(plan.argv()[3:])}")
        self.app.push_screen(ConfirmScreen(question, yes="Start"),
                             lambda yes: self._start_rerun(info) if yes else None)

    @work(thread=True, exclusive=True, group="rerun-plan", exit_on_error=False, description="start a re-run")
    def _start_rerun(self, info: RunInfo) -> None:
        from magpie_tui.launching import start_run
        from magpie_tui.rerun import RerunError
        try:
            plan = self._plan_rerun(info, write=True)
            started = start_run(plan.request, plan.output_dir)
        except (RerunError, MagpieError, OSError) as exc:
            self.app.call_from_thread(self.notify, error_text(exc) if isinstance(exc, MagpieError) else str(exc),
                                      severity="error")
            return
        self.app.call_from_thread(self._rerun_started, started)

    def _rerun_started(self, started) -> None:
        self.notify(f"started pid {started.pid}: {' '.join(started.argv[3:5])}")
        self.app.show_started(started)

    def action_delete_run(self) -> None:
        self._remove("delete")

    def action_archive_run(self) -> None:
        self._remove("archive")

    def _remove(self, how: str) -> None:
        from magpie_tui.screens.confirm import ConfirmScreen
        info = self.selected_run()
        if info is None:
            return
        if not info.is_finished:
            self.notify(f"{info.name} is {info.state}: cancel it first", severity="warning")
            return
        where = info.path.parent / ".archive"
        question = (f"Delete {info.name}?\nThe folder and everything in it is removed." if how == "delete" else
                    f"Archive {info.name}?\nIt moves to {where} (hidden from the list, kept on disk).")
        self.app.push_screen(ConfirmScreen(question, yes=how.capitalize()),
                             lambda yes: self._remove_folder(info.path, how) if yes else None)

    @work(thread=True, group="runs-remove", exit_on_error=False, description="delete or archive a run folder")
    def _remove_folder(self, path: Path, how: str) -> None:
        import shutil
        try:
            if how == "delete":
                shutil.rmtree(path)
            else:
                (path.parent / ".archive").mkdir(exist_ok=True)
                shutil.move(str(path), str(path.parent / ".archive" / path.name))
        except OSError as exc:
            self.app.call_from_thread(self.notify, f"could not {how} {path.name}: {exc}", severity="error")
            return
        self.app.call_from_thread(self.notify, f"{how}d {path.name}")

"""Run: the live log tail, the events, and when done the report summary."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from textual import work
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Header, Input, Select, Static, TabbedContent, TabPane

from engine.jobs.launch import find_console_log
from engine.jobs.query import MAX_SMALL_TEXT_BYTES, RunInfo, read_text, stage_line, status_text
from magpie_tui.messages import RunsChanged
from magpie_tui.screens.runs import format_elapsed, format_ms, format_rate
from magpie_tui.screens.tabs import cycle_tab, tab_bindings
from magpie_tui.widgets.footer import KeysFooter
from magpie_tui.widgets.kernel_stages import KernelStages
from magpie_tui.widgets.live_panel import LivePanel
from magpie_tui.widgets.run_log import RunLog


def log_files(info: RunInfo) -> list[Path]:
    """The run's logs, the most useful first: the console, the server, then the rest (newest first)."""
    found: list[Path] = []
    console = find_console_log(info.path.parent, info.pid)
    if console is not None:
        found.append(console)
    if (info.path / "server.log").exists():
        found.append(info.path / "server.log")
    rest = [p for p in (info.path / "logs").rglob("*") if p.is_file()] if (info.path / "logs").is_dir() else []
    rest.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return found + rest


def format_event(line: str) -> str:
    """One readable line per event: its time and kind, then what matters most about it (a
    benchmark's progress leads with done/total, TTFT, TPOT p50 and output tok/s, a kernel's stage
    with its kernel, stage and step, so they are in view at 80 columns), then the rest as key=value."""
    try:
        event = json.loads(line)
    except ValueError:
        return line
    if not isinstance(event, dict):
        return line
    ts = event.pop("ts", None)
    when = datetime.fromtimestamp(ts).strftime("%H:%M:%S") if isinstance(ts, (int, float)) else "--:--:--"
    kind = event.pop("event", "?")
    lead = _progress_lead(event) if kind == "progress" else _stage_lead(event) if kind == "stage" else []
    fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("workspace", "argv"))
    return " ".join(p for p in (f"{when} {kind:<12}", " · ".join(lead), fields) if p)


def _progress_lead(event: dict) -> list[str]:
    """``888/1200``, ``TTFT 45.5ms``, ``TPOT 4.65ms``, ``1494 tok/s``: taken out of ``event``."""
    def number(key: str) -> float | None:
        value = event.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            del event[key]
            return float(value)
        return None
    lead = []
    done, total = event.get("done"), event.get("total")
    if isinstance(done, int) and isinstance(total, int):
        del event["done"], event["total"]
        lead.append(f"{done}/{total}")
    for key, name in (("ttft_p50_ms", "TTFT"), ("tpot_p50_ms", "TPOT")):
        value = number(key)
        if value is not None:
            lead.append(f"{name} {format_ms(value)}")
    rate = number("output_tok_s")
    if rate is not None:
        lead.append(f"{format_rate(rate)} tok/s")
    return lead


# The fields a kernel's stage line (engine stage_line) says in its own words.
_STAGE_FIELDS = ("kernel", "index", "stage", "state", "step", "steps", "detail", "verdict", "speedup", "backend")


def _stage_lead(event: dict) -> list[str]:
    """A kernel's stage as the console writes it, ``[one_pass] timing round 3/10 (6 calls)``,
    ``[one_pass] done: faster (7.65x)``: its step was past 80 columns as key=value. Taken out of
    ``event``; what else it carries (a median) follows."""
    line = stage_line({**event, "event": "stage"})
    if not line:
        return []
    for key in _STAGE_FIELDS:
        event.pop(key, None)
    return [line.strip()]


class EventsLog(RunLog):
    """events.jsonl, one readable line per event (formatted in the reading thread)."""

    def format_lines(self, lines: list[str]) -> list[str]:
        return [format_event(line) for line in lines]


class RunScreen(Screen):
    BINDINGS = [
        Binding("escape", "back", "Back", id="run.back"),
        Binding("r", "open_report", "Report", id="run.report"),
        Binding("c", "cancel_run", "Cancel run", id="run.cancel"),
        Binding("l", "next_log", "Next log", id="run.next_log"),
        Binding("slash", "search_log", "Search", id="run.search"),
        Binding("n", "search_next", "Next match", show=False, id="run.search_next"),
        Binding("N", "search_previous", "Previous match", show=False, id="run.search_previous"),
        Binding("f", "toggle_follow", "Follow", show=False, id="run.follow"),
        Binding("w", "toggle_wrap", "Wrap", id="run.wrap"),
    ] + tab_bindings("run")
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("run.back", "run.report", "run.cancel", "run.next_tab", "run.search", "run.next_log", "run.wrap")

    def action_next_tab(self) -> None:
        cycle_tab(self, 1)

    def action_previous_tab(self) -> None:
        cycle_tab(self, -1)

    def __init__(self, info: RunInfo) -> None:
        super().__init__()
        self.info = info
        self.logs = log_files(info)
        self._scanning = False  # a log/summary scan is in flight
        self._search_text = ""  # the log search (/), and the line of its last match
        self._search_at: int | None = None
        self._wrap = False  # w: long log lines wrap

    def compose(self):
        yield Header()
        yield Static("", id="run-status")
        live = LivePanel(id="run-live")  # a benchmark's live numbers, above everything else
        live.display = self.info.mode == "benchmark"
        yield live
        search = Input(placeholder="search the log shown (enter: first match below, n/N: next/previous, esc: close)",
                       id="log-search", compact=True)
        # Shown by /. Hidden it is also disabled: auto-focus looks at visibility, not display.
        search.disabled = True
        with Horizontal(id="log-search-bar") as bar:
            bar.display = False
            yield search
            yield Static("", id="log-search-where")  # the match, beside the text: never over the log
        with TabbedContent(id="run-tabs"):
            if self.info.mode in ("analyze", "compare"):  # each kernel's stage as it goes, first
                with TabPane("Kernels", id="tab-kernels"):
                    yield KernelStages(id="run-kernels")
            with TabPane("Log", id="tab-log"):
                yield Select([(self._label(p), str(p)) for p in self.logs], prompt="no log yet",
                             value=str(self.logs[0]) if self.logs else Select.NULL, id="log-choice", compact=True)
                yield RunLog(self.logs[0] if self.logs else None, id="run-log")
            with TabPane("Events", id="tab-events"):
                yield EventsLog(self.info.path / "events.jsonl", id="run-events")
            with TabPane("Summary", id="tab-summary"):
                yield Static("", id="run-summary")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

    def _label(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.info.path))
        except ValueError:
            return f"console ({path.name})"

    # -- the log shown: search and follow -----------------------------------------------------
    def _shown_log(self) -> RunLog | None:
        active = self.query_one("#run-tabs", TabbedContent).active
        found = self.query({"tab-log": "#run-log", "tab-events": "#run-events"}.get(active, "#none"))
        return found.first() if found else None

    def action_toggle_follow(self) -> None:
        log = self._shown_log()
        if log is not None:
            log.auto_scroll = not log.auto_scroll
            if log.auto_scroll:
                log.scroll_end(animate=False)
            self.notify("following the log's end" if log.auto_scroll else "stopped following: the view stays put",
                        timeout=2)

    def action_toggle_wrap(self) -> None:
        """``w``: long lines of the logs (the log and the events) wrap at the screen's width, or
        show whole (scroll sideways). Search and follow work either way."""
        self._wrap = not self._wrap
        for log in self.query(RunLog):
            log.set_wrap(self._wrap)
        self.notify("long lines wrap" if self._wrap else "long lines whole: scroll sideways", timeout=2)

    def action_search_log(self) -> None:
        box = self.query_one("#log-search", Input)
        self._show_search(True)
        box.focus()

    def _show_search(self, shown: bool) -> None:
        self.query_one("#log-search-bar").display = shown
        self.query_one("#log-search", Input).disabled = not shown
        if not shown:  # the match is no longer marked
            for log in self.query(RunLog):
                log.mark_line(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "log-search":
            event.stop()
            self._search_text, self._search_at = event.value, None
            self._show_search(bool(event.value))
            log = self._shown_log()
            if log is not None:
                log.focus()
            self._find(1, from_top_of_view=True)

    def action_back(self) -> None:
        """esc (and q): close the search box when it has the focus, else back to where the run was opened."""
        box = self.query_one("#log-search", Input)
        if box.has_focus:
            self._show_search(False)
            log = self._shown_log()
            if log is not None:
                log.focus()
            return
        self.app.pop_screen()

    def action_search_next(self) -> None:
        self._find(1)

    def action_search_previous(self) -> None:
        self._find(-1)

    def _find(self, step: int, from_top_of_view: bool = False) -> None:
        """Scroll the log shown to the next line (``step`` 1) or the previous one (-1) that holds the
        search text, case-insensitive, wrapping around; following stops so the match stays in view."""
        text, log = self._search_text, self._shown_log()
        if not text or log is None:
            return
        needle, lines = text.lower(), log.raw_lines  # lines as read: a match a wrap cut is still one
        hits = [i for i, line in enumerate(lines) if needle in line.lower()]
        where = self.query_one("#log-search-where", Static)
        if not hits:
            where.update(f"not in the {len(lines)} lines shown")
            return
        # From the last match while it is in view (n after n: a match near the end, where the log
        # cannot scroll it to the top, would be found again), else from the top of the view.
        top = log.line_at(int(log.scroll_y))
        bottom = log.line_at(int(log.scroll_y) + max(0, log.scrollable_content_region.height - 1))
        if not from_top_of_view and self._search_at is not None and top <= self._search_at <= bottom:
            here = self._search_at
        else:
            here = top - (1 if from_top_of_view else 0)
        if step > 0:
            index = next((i for i in hits if i > here), hits[0])
        else:
            index = next((i for i in reversed(hits) if i < here), hits[-1])
        log.auto_scroll = False
        log.scroll_to(y=log.row_of(index), animate=False)
        log.mark_line(index)
        self._search_at = index
        where.update(f"line {index + 1} · match {hits.index(index) + 1} of {len(hits)} · f: follow")

    def on_mount(self) -> None:
        self.sub_title = self.info.name
        self.call_after_refresh(self._refresh_status)  # the tab panes mount after the screen
        self.set_interval(1.0, self._refresh_status)
        self.app.runs_signal.subscribe(self, self.runs_changed)

    def on_unmount(self) -> None:
        self.app.runs_signal.unsubscribe(self)

    def runs_changed(self, message: RunsChanged) -> None:
        """``app.runs_signal``'s callback."""
        for info in message.changed:
            if info.path == self.info.path:
                self.info = info
        if self.is_mounted:
            self._refresh_status()

    def _refresh_status(self) -> None:
        if not self.query("#run-summary"):
            return  # still mounting
        info = self.info
        parts = [info.state, info.mode, info.label, format_elapsed(info.elapsed(time.time()))]
        # The Runs list's text, plus the report's figures. A running benchmark's numbers are in its
        # live view below, whole; here its line would be cut at 80 columns.
        running_benchmark = info.mode == "benchmark" and not info.is_finished
        progress = "" if running_benchmark else status_text(info.status, detail=True)
        if progress:
            parts.append(progress)
        if info.error and info.error not in progress:
            parts.append(info.error)
        status = self.query_one("#run-status", Static)
        status.update("  ·  ".join(p for p in parts if p))
        for kernels in self.query("#run-kernels").results(KernelStages):
            kernels.show(info)
        live = self.query_one("#run-live", LivePanel)
        live.display = info.mode == "benchmark"
        if live.display:
            live.show(info)
        for state in ("running", "completed", "failed", "lost", "cancelled"):
            # completed_with_errors: the numbers are there, the run is not a success: shown as a failure
            status.set_class(info.state == state or (state == "failed" and info.state == "completed_with_errors"),
                             f"-{state}")
        if not self._scanning:  # one scan at a time; a slow disk skips ticks
            self._scanning = True
            self._scan_files(info)

    @work(thread=True, exclusive=True, group="run-files", exit_on_error=False,
          description="look for the run's logs and summary")
    def _scan_files(self, info: RunInfo) -> None:
        """Blocking (a glob of the logs, a read of summary.txt): off the event loop."""
        fresh: list[Path] | None = None
        summary: str | None = None
        try:
            fresh = log_files(info)
            if info.is_finished:
                try:
                    summary = read_text(info.path / "summary.txt", MAX_SMALL_TEXT_BYTES, "summary.txt", errors="replace")
                except OSError:
                    summary = None
        finally:
            self.app.call_from_thread(self._show_files, info, fresh, summary)

    def _show_files(self, info: RunInfo, fresh: list[Path] | None, summary: str | None) -> None:
        self._scanning = False
        if fresh is None or not self.query("#run-summary"):
            return
        if fresh != self.logs:  # a log appeared (the server started, a kernel began)
            self.logs = fresh
            choice = self.query_one("#log-choice", Select)
            current = None if choice.is_blank() else choice.value
            choice.set_options([(self._label(p), str(p)) for p in fresh])
            if current is not None and current in {str(p) for p in fresh}:
                choice.value = current
            elif fresh:
                choice.value = str(fresh[0])
        if info.is_finished and summary is not None:
            self.query_one("#run-summary", Static).update(summary)
        elif info.is_finished:
            self.query_one("#run-summary", Static).update(f"{info.state}: no summary.txt was written"
                                                          + (f" ({info.error})" if info.error else ""))
        else:
            self.query_one("#run-summary", Static).update("the summary appears when the run finishes")

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "log-choice" and not event.select.is_blank():
            log = self.query_one("#run-log", RunLog)
            path = Path(str(event.value))
            if log.tail is None or log.tail.path != path:
                log.follow(path)

    def action_next_log(self) -> None:
        if not self.logs:
            return
        choice = self.query_one("#log-choice", Select)
        names = [str(p) for p in self.logs]
        current = names.index(choice.value) if not choice.is_blank() and choice.value in names else -1
        choice.value = names[(current + 1) % len(names)]

    def action_open_report(self) -> None:
        self.app.open_report(self.info)

    def action_cancel_run(self) -> None:
        """Asks first, as the Runs list does: a cancel cannot be undone."""
        from magpie_tui.screens.runs import confirm_cancel
        confirm_cancel(self, self.info)

"""Diff: the baseline kernel against a candidate, side by side or unified, with in-line
changes; mark candidates and launch a compare of just those (``--only``)."""

from __future__ import annotations

from pathlib import Path

from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Header, SelectionList, Static
from textual.widgets.selection_list import Selection

from engine.errors import MagpieError
from engine.jobs.launch import command_line, form_request
from magpie_tui.errors import error_text
from magpie_tui.launching import start_run
from magpie_tui.widgets.diff_view import DiffView
from magpie_tui.widgets.footer import KeysFooter


def config_kernels(config: Path) -> tuple[str | None, dict[str, Path]]:
    """(baseline id, {kernel id: first source file}) of a kernel config, as the engine plans it."""
    from engine.jobs.query import config_kernels as kernels_of
    return kernels_of(config)


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"cannot read {path}: {exc}\n"


class DiffScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="diff.back"),
        Binding("c", "launch_compare", "Compare marked", id="diff.compare"),
        Binding("tab", "focus_next", "Switch pane", show=False, id="diff.focus"),
    ]
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("diff.back", "diff.compare", "diff.toggle_split", "diff.next_hunk")

    def __init__(self, config: Path, baseline: str | None, sources: dict[str, Path],
                 candidate: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.baseline = baseline
        self.sources = sources
        others = [k for k in sources if k != baseline]
        self.current = candidate if candidate in others else (others[0] if others else None)

    @classmethod
    def for_config(cls, config: Path, candidate: str | None = None, baseline: str | None = None) -> DiffScreen:
        """``baseline``: the kernel a run compared against (its ``--baseline``); default the config's."""
        config_baseline, sources = config_kernels(config)
        return cls(config, baseline if baseline in sources else config_baseline, sources, candidate)

    def compose(self):
        base_path = self.sources.get(self.baseline) if self.baseline else None
        cand_path = self.sources.get(self.current) if self.current else None
        yield Header()
        yield Static(self._title(), id="diff-title", classes="report-title")
        with Horizontal():
            with Vertical(id="diff-candidates"):
                yield Static("space: mark · c: compare marked", classes="report-note")
                yield SelectionList(*[Selection(k, k, False) for k in self.sources if k != self.baseline],
                                    id="candidate-list")
            yield DiffView(str(base_path or "baseline"), _read(base_path), str(cand_path or "candidate"),
                           _read(cand_path), id="diff-view")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

    def _title(self) -> str:
        if not self.sources:
            return f"{self.config}: no kernels with source files (or the config has problems)"
        return f"{self.config.name}: baseline {self.baseline} vs {self.current or '-'}"

    def on_mount(self) -> None:
        self.sub_title = str(self.config)
        if self.current is not None:
            options = self.query_one(SelectionList)
            ids = [k for k in self.sources if k != self.baseline]
            options.highlighted = ids.index(self.current)
        self.query_one(DiffView).focus()

    def on_selection_list_selection_highlighted(self, event: SelectionList.SelectionHighlighted) -> None:
        kid = event.selection.value
        if kid != self.current:
            self.show_candidate(kid)

    def show_candidate(self, kid: str) -> None:
        self.current = kid
        base_path = self.sources.get(self.baseline) if self.baseline else None
        cand_path = self.sources.get(kid)
        self.query_one(DiffView).set_texts(str(base_path), _read(base_path), str(cand_path), _read(cand_path))
        self.query_one("#diff-title", Static).update(self._title())

    def marked(self) -> list[str]:
        return list(self.query_one(SelectionList).selected)

    def action_launch_compare(self) -> None:
        chosen = self.marked() or ([self.current] if self.current else [])
        if not chosen:
            self.notify("mark one or more candidates (space) first", severity="warning")
            return
        output = self.app.settings.launch_results_dir
        try:
            req = form_request("compare", self.config, only=chosen, baseline=self.baseline)
        except MagpieError as exc:
            self.notify(error_text(exc), severity="error")
            return
        from magpie_tui.screens.confirm import ConfirmScreen
        # A compare takes minutes of timing runs: ask first, showing exactly what would start.
        question = (f"Start a compare of {', '.join(chosen)} against {self.baseline}?\n"
                    f"$ magpie {' '.join(command_line(req, output)[3:])}")
        self.app.push_screen(ConfirmScreen(question, yes="Start"),
                             lambda yes: self._start_compare(req, output, chosen) if yes else None)

    def _start_compare(self, req, output: Path, chosen: list[str]) -> None:
        try:
            started = start_run(req, output)
        except MagpieError as exc:
            self.notify(error_text(exc), severity="error")
            return
        except OSError as exc:
            self.notify(f"could not start: {exc}", severity="error")
            return
        self.app.track_started(started)
        self.notify(f"compare of {', '.join(chosen)} against {self.baseline} started (pid {started.pid})")

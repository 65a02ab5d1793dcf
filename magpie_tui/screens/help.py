"""Help: the keys of the screen it was opened from (and of the widget that had focus there),
then the ones that work everywhere; ``a`` lists every screen's keys. Each with its id, the name
to remap it by."""

from __future__ import annotations

import os
from pathlib import Path

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from magpie_tui.settings import config_path

# The widgets and screens whose bindings the full list shows; imported lazily to avoid cycles.
_BINDING_OWNERS = (
    "widgets.data_grid.DataGrid", "widgets.diff_view.DiffView", "widgets.gpu_timeline.GpuTimeline",
    "screens.configs.ConfigsScreen", "screens.launch.LaunchScreen", "screens.runs.RunsScreen",
    "screens.run.RunScreen", "screens.loop.LoopScreen", "screens.reports.CompareReportScreen",
    "screens.compare_runs.CompareRunsScreen", "screens.reports.BenchmarkReportScreen",
    "screens.roofline.RooflineScreen", "screens.kernel.KernelScreen", "screens.diff.DiffScreen",
)

_KEY_NAMES = {"slash": "/", "question_mark": "?", "space": "space", "escape": "esc", "left_square_bracket": "[",
              "right_square_bracket": "]", "enter": "enter"}


def key_text(keys: str) -> str:
    """``slash`` -> ``/``, ``f1,question_mark`` -> ``f1 ?``: keys as they are typed."""
    return " ".join(_KEY_NAMES.get(k.strip(), k.strip()) for k in keys.split(","))


def settings_file_hint() -> str:
    """Where the keymap lives, as the user would type it (``~`` for the home folder)."""
    path = config_path()
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return "$MAGPIE_TUI_CONFIG" if os.environ.get("MAGPIE_TUI_CONFIG") else str(path)


def _rows_of(where: str, cls, keymap: dict[str, str], seen: set[str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for binding in getattr(cls, "BINDINGS", []):
        if isinstance(binding, Binding) and binding.id and binding.id not in seen:
            seen.add(binding.id)  # a binding inherited or shared by two screens is listed once
            rows.append((where, binding.id, key_text(keymap.get(binding.id, binding.key)), binding.description))
    return rows


def _keymap(app) -> dict[str, str]:
    settings = getattr(app, "settings", None)
    return settings.keymap if settings is not None else {}


def all_bindings(app) -> list[tuple[str, str, str, str]]:
    """(where, id, keys, description) for the app and every screen, with the user's remaps applied."""
    import importlib
    keymap = _keymap(app)
    sources = [("app", type(app))]
    for dotted in _BINDING_OWNERS:
        module, _, name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(f"magpie_tui.{module}"), name)
        except (ImportError, AttributeError):
            continue
        sources.append((module.rsplit(".", 1)[-1], cls))
    seen: set[str] = set()
    return [row for where, cls in sources for row in _rows_of(where, cls, keymap, seen)]


def screen_bindings(app, screen) -> list[tuple[str, str, str, str]]:
    """The keys that work on ``screen`` now: its own, those of the widget focused on it and of
    that widget's containers, then the app's."""
    keymap = _keymap(app)
    seen: set[str] = set()
    name = type(screen).__name__.replace("Screen", "").lower() or "screen"
    rows = _rows_of(name, type(screen), keymap, seen)
    node = screen.focused
    while node is not None and node is not screen:
        rows += _rows_of(type(node).__name__, type(node), keymap, seen)
        node = node.parent
    return rows + _rows_of("everywhere", type(app), keymap, seen)


class HelpTable(DataTable):
    """The keys' table: ``j``/``k``/``g``/``G`` move as in every other table."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False, id="help.cursor_down"),
        Binding("k", "cursor_up", "Up", show=False, id="help.cursor_up"),
        Binding("g", "scroll_top", "First row", show=False, id="help.first_row"),
        Binding("G", "scroll_bottom", "Last row", show=False, id="help.last_row"),
    ]


class HelpScreen(ModalScreen):
    BINDINGS = [
        Binding("escape,q,f1,question_mark", "app.pop_screen", "Close", id="help.close"),
        Binding("a", "toggle_all", "All screens", id="help.all"),
    ]

    def __init__(self, screen=None) -> None:
        super().__init__()
        self.for_screen = screen
        self.showing_all = screen is None

    def compose(self):
        with VerticalScroll(id="help-dialog"):
            yield Static("", id="help-title", classes="report-title")
            yield HelpTable(id="help-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Where", "Keys", "Action", "Id")
        self._fill()
        table.focus(scroll_visible=False)  # j/k/g/G move the table; the title stays in view

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        rows = all_bindings(self.app) if self.showing_all else screen_bindings(self.app, self.for_screen)
        table.add_rows([(where, keys, action, binding_id) for where, binding_id, keys, action in rows])
        scope = "every screen" if self.showing_all else "this screen, then everywhere"
        other = "" if self.for_screen is None else (" · a: this screen only" if self.showing_all else
                                                    " · a: every screen")
        self.query_one("#help-title", Static).update(
            f"Keys of {scope}{other} · esc or q closes · : or ctrl+p: command palette. Remap a key by its id under "
            f"'keymap:' in {settings_file_hint()}, e.g. 'runs.cancel: ctrl+x'.")

    def action_toggle_all(self) -> None:
        if self.for_screen is None:
            return
        self.showing_all = not self.showing_all
        self._fill()

"""Help: every key binding with its id (the name to remap it by) and where the keymap lives."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from magpie_tui.settings import config_path

# The widgets and screens whose bindings the help lists; imported lazily to avoid cycles.
_BINDING_OWNERS = (
    "widgets.data_grid.DataGrid", "widgets.diff_view.DiffView",
    "screens.configs.ConfigsScreen", "screens.launch.LaunchScreen", "screens.runs.RunsScreen",
    "screens.run.RunScreen", "screens.loop.LoopScreen", "screens.reports.CompareReportScreen",
    "screens.reports.BenchmarkReportScreen",
    "screens.roofline.RooflineScreen", "screens.kernel.KernelScreen", "screens.diff.DiffScreen",
)


def all_bindings(app) -> list[tuple[str, str, str, str]]:
    """(where, id, keys, description) for the app and every screen, with the user's remaps applied."""
    import importlib
    keymap = getattr(app, "settings", None).keymap if getattr(app, "settings", None) else {}
    rows = []
    sources = [("app", type(app))]
    for dotted in _BINDING_OWNERS:
        module, _, name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(f"magpie_tui.{module}"), name)
        except (ImportError, AttributeError):
            continue
        sources.append((module.rsplit(".", 1)[-1], cls))
    for where, cls in sources:
        for binding in getattr(cls, "BINDINGS", []):
            if isinstance(binding, Binding) and binding.id:
                rows.append((where, binding.id, keymap.get(binding.id, binding.key), binding.description))
    return rows


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,f1", "app.pop_screen", "Close", id="help.close")]

    def compose(self):
        with VerticalScroll(id="help-dialog"):
            yield Static(
                "Magpie workbench — keys. ctrl+p opens the command palette. Remap any key by its id in "
                f"{config_path()} under 'keymap:', e.g. 'runs.cancel: ctrl+x'. Esc goes back.",
                classes="report-title")
            yield DataTable(id="help-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Where", "Id", "Keys", "Action")
        table.add_rows(all_bindings(self.app))

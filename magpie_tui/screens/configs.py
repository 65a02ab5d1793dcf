"""Configs: kernel, compare and benchmark YAML files and kernel sources under the project,
previewed with highlighting and validated live by the engine (file:line errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DirectoryTree, Footer, Header, Static

from engine.runs.launch import ConfigCheck, check_config
from magpie_tui.bridge import WATCHED_SUFFIXES
from magpie_tui.messages import ConfigsChanged
from magpie_tui.widgets.code_view import CodeView

_SKIP_DIRS = {"results", "__pycache__", "node_modules", ".git", "build", "dist"}


class ConfigTree(DirectoryTree):
    """Folders, YAML configs and kernel sources; hidden folders and results are left out."""

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        for path in paths:
            if path.name.startswith(".") or path.name in _SKIP_DIRS or path.name.endswith(".egg-info"):
                continue
            if path.is_dir() or path.suffix.lower() in WATCHED_SUFFIXES:
                yield path


class ConfigsScreen(Screen):
    BINDINGS = [
        Binding("l", "launch", "Launch", id="configs.launch"),
        Binding("d", "diff", "Diff kernels", id="configs.diff"),
        Binding("f5", "reload", "Reload", id="configs.reload"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.selected: Path | None = None
        self.check: ConfigCheck | None = None
        self._seen: set[Path] = set()

    def compose(self):
        yield Header()
        with Horizontal(id="configs-body"):
            yield ConfigTree(self.app.settings.project_dir, id="config-tree")
            with Vertical(id="config-detail"):
                yield Static("Select a config or a kernel source.", id="config-status")
                yield Static("", id="config-problems")
                yield CodeView(id="config-source")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = str(self.app.settings.project_dir)
        self.query_one(ConfigTree).focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        self.select(event.path)

    def on_tree_node_highlighted(self, event) -> None:
        data = getattr(event.node, "data", None)
        path = getattr(data, "path", None)
        if path is not None and Path(path).is_file():
            self.select(Path(path))

    def select(self, path: Path) -> None:
        self.selected = path
        self.check = check_config(path)
        self._show_check()
        self.query_one(CodeView).show(path, _first_problem_line(self.check))

    def _show_check(self) -> None:
        check = self.check
        status = self.query_one("#config-status", Static)
        problems = self.query_one("#config-problems", Static)
        if check is None:
            return
        rel = _relative(check.path, self.app.settings.project_dir)
        if check.kind in ("kernel", "benchmark"):
            state = "valid" if check.ok else f"{len(check.problems)} problem(s)"
            modes = f" — l: {' / '.join(check.modes)}" if check.modes else ""
            kernels = f" — kernels: {', '.join(check.kernel_ids)}" if check.kernel_ids else ""
            status.update(f"{rel}: {check.kind} config, {state}{kernels}{modes}")
        else:
            status.update(f"{rel}: {check.kind}")
        status.set_class(check.ok, "-valid")
        status.set_class(not check.ok, "-invalid")
        lines = [f"error: {p}" for p in check.problems] + [f"warning: {w}" for w in check.warnings]
        problems.update("\n".join(lines))
        problems.display = bool(lines)

    def configs_changed(self, message: ConfigsChanged) -> None:
        if self.selected is not None and self.selected in message.paths:
            if self.selected.exists():
                self.select(self.selected)  # re-validate what the user is looking at
            else:
                self.query_one("#config-status", Static).update(f"{self.selected}: deleted")
        # New or deleted files change the tree; edits to known files do not.
        if any(not p.exists() or p not in self._seen for p in message.paths):
            self.query_one(ConfigTree).reload()
        self._seen.update(p for p in message.paths if p.exists())

    def action_reload(self) -> None:
        self.query_one(ConfigTree).reload()
        if self.selected is not None and self.selected.exists():
            self.select(self.selected)

    def action_launch(self) -> None:
        from magpie_tui.screens.launch import LaunchScreen
        if self.check is None or not self.check.modes:
            self.notify("Select a kernel or benchmark config to launch.", severity="warning")
            return
        if not self.check.ok:
            self.notify("Fix the config's problems first (listed above the source).", severity="error")
            return
        self.app.push_screen(LaunchScreen(self.check), self._launched)

    def _launched(self, started) -> None:
        if started is None:
            return
        self.app.track_started(started)
        self.notify(f"started pid {started.pid}: {' '.join(started.argv[3:5])}")
        self.app.switch_mode("runs")

    def action_diff(self) -> None:
        from magpie_tui.screens.diff import DiffScreen
        if self.check is None or self.check.kind != "kernel" or len(self.check.kernel_ids) < 2:
            self.notify("Select a compare config (two or more kernels) to diff its kernels.", severity="warning")
            return
        self.app.push_screen(DiffScreen.for_config(self.check.path))


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _first_problem_line(check: ConfigCheck) -> int | None:
    """The line of the first problem in this file, from its ``file:line:`` prefix."""
    prefix = f"{check.path}:"
    for problem in check.problems:
        if problem.startswith(prefix):
            rest = problem[len(prefix):].split(":", 1)[0]
            if rest.isdigit():
                return int(rest)
    return None

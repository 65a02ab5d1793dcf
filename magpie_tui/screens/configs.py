"""Configs: kernel, compare and benchmark YAML files and kernel sources under the project,
previewed with highlighting and validated live by the engine (file:line errors)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DirectoryTree, Header, Static

from engine.jobs.query import ConfigCheck, check_config, is_run_folder
from magpie_tui.bridge import WATCHED_SUFFIXES
from magpie_tui.messages import ConfigsChanged
from magpie_tui.widgets.code_view import CodeView
from magpie_tui.widgets.footer import KeysFooter

_SKIP_DIRS = {"results", "__pycache__", "node_modules", ".git", "build", "dist"}


class ConfigTree(DirectoryTree):
    """Folders, YAML configs and kernel sources; hidden folders, results and run folders (a
    run's files are its record, listed on the Runs screen) are left out. ``j``/``k``/``g``/``G``
    move as in every table."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False, id="tree.cursor_down"),
        Binding("k", "cursor_up", "Up", show=False, id="tree.cursor_up"),
        Binding("g,home", "first_line", "First line", show=False, id="tree.first_line"),
        Binding("G,end", "last_line", "Last line", show=False, id="tree.last_line"),
    ]

    def action_first_line(self) -> None:
        self.cursor_line = 0

    def action_last_line(self) -> None:
        self.cursor_line = self.last_line

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        for path in paths:
            if path.name.startswith(".") or path.name in _SKIP_DIRS or path.name.endswith(".egg-info"):
                continue
            if path.is_dir():
                if not is_run_folder(path):
                    yield path
            elif path.suffix.lower() in WATCHED_SUFFIXES:
                yield path


    def render_label(self, node, base_style, style):
        """A name too long for the tree loses part of its middle, chosen so that it stays apart from
        every sibling: ``builtin_1b_gpu.yaml``, ``builtin_8b_gpu.yaml`` and ``builtin_tiny_cpu.yaml``
        cut at the middle all read ``builtin_…pu.yaml`` at 80 columns; here each keeps what tells it
        apart (``builtin_t…cpu.yaml``)."""
        text = super().render_label(node, base_style, style)
        depth, parent = 0, node.parent
        while parent is not None:
            depth, parent = depth + 1, parent.parent
        room = self.scrollable_content_region.width - max(0, depth - (0 if self.show_root else 1)) * self.guide_depth
        name = str(node.label)
        over = text.cell_len - room
        if over <= 0 or room < 10 or len(name) < 8:
            return text
        prefix = len(text.plain) - len(name)  # the folder/file icon
        keep = max(4, len(name) - over - 1)  # the name's characters that fit, beside the ellipsis
        siblings = [str(n.label) for n in node.parent.children] if node.parent is not None else []
        left = elision_split(name, keep, siblings)
        right = keep - left
        return Text.assemble(text[:prefix + left], ("…", base_style), text[len(text.plain) - right:])


_WORD_ENDS = "_-. "


def elision_split(name: str, keep: int, siblings: list[str]) -> int:
    """How many of ``keep`` characters of ``name`` stay in front of the ellipsis (the rest stay at
    its end): a split that no sibling's name also begins and ends with, then one that cuts at word
    ends (``_``, ``-``, ``.``), then the most even one."""
    others = [s for s in siblings if s != name]

    def score(left: int) -> tuple:
        head, tail = name[:left], name[len(name) - (keep - left):]
        unique = not any(o.startswith(head) and o.endswith(tail) and len(o) > keep for o in others)
        words = (name[left - 1] in _WORD_ENDS) + (name[len(name) - (keep - left) - 1] in _WORD_ENDS)
        return unique, words, -abs(2 * left - keep)

    return max(range(1, keep), key=score)


class ConfigsScreen(Screen):
    BINDINGS = [
        Binding("l", "launch", "Launch", id="configs.launch"),
        Binding("d", "diff", "Diff kernels", id="configs.diff"),
        Binding("e", "edit", "Edit", id="configs.edit"),
        Binding("y", "copy_path", "Copy path", show=False, id="configs.copy_path"),
        Binding("f5", "reload", "Reload", id="configs.reload"),
    ]
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("configs.launch", "configs.diff", "configs.edit", "configs.reload")

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
                with VerticalScroll(id="config-problems"):  # every problem, scrollable, never cut
                    yield Static("", id="config-problems-text")
                yield CodeView(id="config-source")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

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
        if check is None:
            return
        status.update(status_line(check, self.app.settings.project_dir))
        status.set_class(check.ok, "-valid")
        status.set_class(not check.ok, "-invalid")
        # Paths under the project are shown relative to it: absolute ones wrap at 80 columns.
        root = f"{self.app.settings.project_dir}/"
        lines = [f"error: {p}".replace(root, "") for p in check.problems] + \
                [f"warning: {w}".replace(root, "") for w in check.warnings]
        self.query_one("#config-problems-text", Static).update("\n".join(lines))
        self.query_one("#config-problems").display = bool(lines)

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
        if self.check is not None and self.check.kind == "yaml" and self.check.problems:
            self.notify("This file is not valid YAML: fix the error shown above the source first.", severity="error")
            return
        if self.check is not None and self.check.kind == "run record":
            self.notify("This is a run's recorded config: re-run it from the Runs screen (2, then R).",
                        severity="warning")
            return
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
        self.notify(f"started pid {started.pid}: {' '.join(started.argv[3:5])}")
        self.app.show_started(started)

    def action_copy_path(self) -> None:
        if self.selected is not None:
            self.app.copy_to_clipboard(str(self.selected))
            self.notify(f"copied {self.selected}")

    def action_edit(self) -> None:
        """The selected file in ``$VISUAL``/``$EDITOR`` (the terminal is handed over), then
        validated again: what the editor saved is what the status line shows."""
        from magpie_tui.editor import edit_file
        if self.selected is None:
            self.notify("Select a file to edit.", severity="warning")
            return
        problem = edit_file(self.app, self.selected, _first_problem_line(self.check) if self.check else None)
        if problem:
            self.notify(problem, severity="error")
        if self.selected.exists():
            self.select(self.selected)

    def action_diff(self) -> None:
        from magpie_tui.screens.diff import DiffScreen
        if self.check is None or self.check.kind != "kernel" or len(self.check.kernel_ids) < 2:
            self.notify("Select a compare config (two or more kernels) to diff its kernels.", severity="warning")
            return
        self.app.push_screen(DiffScreen.for_config(self.check.path))


def status_line(check: ConfigCheck, project: Path) -> str:
    """What the file is and whether it is usable, in the words of what to do next."""
    rel = _relative(check.path, project)
    if check.kind in ("kernel", "benchmark"):
        state = "valid" if check.ok else f"{len(check.problems)} problem(s)"
        modes = f" — l: {' / '.join(check.modes)}" if check.modes else ""
        kernels = f" — kernels: {', '.join(check.kernel_ids)}" if check.kernel_ids else ""
        return f"{rel}: {check.kind} config, {state}{kernels}{modes}"
    if check.kind == "yaml":
        return f"{rel}: not valid YAML — fix the error below" if check.problems else \
            f"{rel}: YAML, not a kernel or benchmark config (no 'kernels:' or 'benchmark:' key)"
    if check.kind == "run record":
        return f"{rel}: the config a run recorded — open the run on the Runs screen (2), R re-runs it"
    return f"{rel}: {check.kind}"


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

"""The workbench's own settings: the project folder, where runs are found, the theme and
key remaps. Stored in ``$MAGPIE_TUI_CONFIG`` or ``$XDG_CONFIG_HOME/magpie/tui.yaml``.

Example file::

    theme: magpie-light
    results_dirs: [results, /scratch/me/magpie-results]
    keymap:
      app.runs: f2          # binding id -> key(s)
      runs.cancel: ctrl+x
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from engine.errors import MagpieError
from engine.jobs.query import ConfigError, atomic_write_text, read_yaml


def config_path() -> Path:
    explicit = os.environ.get("MAGPIE_TUI_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "magpie" / "tui.yaml"


class SettingsError(MagpieError, ValueError):
    """A settings file value that cannot be used; the message names the file and the key."""

    title = "settings problem"


@dataclass
class Settings:
    project_dir: Path
    results_dirs: list[Path] = field(default_factory=list)
    theme: str = "magpie-dark"
    keymap: dict[str, str] = field(default_factory=dict)
    file: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def launch_results_dir(self) -> Path:
        """Where runs started from the workbench write their folders: the first ``results`` folder
        watched (recorded-run folders such as ``examples/runs`` are only read)."""
        named = [d for d in self.results_dirs if d.name == "results"]
        return named[0] if named else (self.results_dirs[0] if self.results_dirs else self.project_dir / "results")

    @property
    def user_theme_dir(self) -> Path:
        return (self.file or config_path()).parent / "themes"

    def save_theme(self, theme: str) -> None:
        """Persist the theme choice, keeping everything else in the file as it was."""
        self.theme = theme
        path = self.file or config_path()
        data: dict = {}
        if path.exists():
            try:
                loaded = read_yaml(path, what="a settings file")
                data = loaded if isinstance(loaded, dict) else {}
            except ConfigError:
                return  # never overwrite a file we could not read
        data["theme"] = theme
        atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))


def load_settings(project_dir: Path | str, results_dirs: list[Path] | None = None, file: Path | None = None) -> Settings:
    """Settings for a project folder. A broken settings file is reported, never fatal."""
    project = Path(project_dir).expanduser().resolve()
    path = file or config_path()
    settings = Settings(project_dir=project, file=path)
    data: dict = {}
    if path.exists():
        try:
            loaded = read_yaml(path, what="a settings file")
        except ConfigError as exc:
            settings.problems.append(f"{path}: not read ({exc}); using defaults")
            loaded = {}
        if loaded is not None and not isinstance(loaded, dict):
            settings.problems.append(f"{path}: expected a mapping (theme:, results_dirs:, keymap:); using defaults")
            loaded = {}
        data = loaded or {}
    unknown = set(data) - {"theme", "results_dirs", "keymap"}
    if unknown:
        settings.problems.append(f"{path}: unknown key(s) {sorted(unknown)}; allowed: theme, results_dirs, keymap")
    if isinstance(data.get("theme"), str):
        settings.theme = data["theme"]
    keymap = data.get("keymap") or {}
    if isinstance(keymap, dict):
        settings.keymap = {str(k): str(v) for k, v in keymap.items()}
    else:
        settings.problems.append(f"{path}: keymap must map binding ids to keys, e.g. 'runs.cancel: ctrl+x'")
    dirs = results_dirs if results_dirs else [Path(d) for d in (data.get("results_dirs") or [])]
    resolved = [(d if Path(d).is_absolute() else project / d).expanduser().resolve() for d in dirs]
    if not resolved:
        resolved = default_results_dirs(project)
    settings.results_dirs = resolved
    return settings


def default_results_dirs(project: Path) -> list[Path]:
    """``<project>/results`` plus every folder one or two levels down that holds run folders
    (``examples/runs`` holds the demo's recorded runs)."""
    found = [project / "results"]
    if _holds_runs(project):
        found.insert(0, project)
    for pattern in ("*", "*/*"):
        for p in sorted(project.glob(pattern)):
            if p.is_dir() and p not in found and not any(part.startswith(".") for part in p.parts[-2:]) \
                    and (p.name == "results" or _holds_runs(p)):
                found.append(p)
    return found


def _holds_runs(folder: Path) -> bool:
    try:
        return any((child / "events.jsonl").is_file() for child in folder.iterdir() if child.is_dir())
    except OSError:
        return False

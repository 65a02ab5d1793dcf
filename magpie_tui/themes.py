"""Load the workbench themes from ``themes/*.yaml`` (and the user's theme folder).

The YAML files are the only place colours are written down; this module turns them
into Textual ``Theme`` objects.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Iterable

from textual.theme import Theme

from engine.errors import MagpieError
from engine.jobs.query import ConfigError, read_yaml

DEFAULT_THEME = "magpie-dark"
_THEME_FIELDS = ("primary", "secondary", "accent", "warning", "error", "success", "foreground",
                 "background", "surface", "panel", "boost", "dark", "luminosity_spread", "text_alpha", "ansi")


class ThemeFileError(MagpieError, ValueError):
    """A theme file that cannot be used; the message names the file."""

    title = "theme file problem"
    hint = "see themes/magpie-dark.yaml for a complete theme"


def theme_from_file(path: Path) -> Theme:
    try:
        data = read_yaml(path, what="a theme file") or {}
    except ConfigError as exc:  # not valid YAML, or not a file to read (a FIFO, too large)
        raise ThemeFileError(str(exc)) from exc
    if not isinstance(data, dict) or "name" not in data or "primary" not in data:
        raise ThemeFileError(f"{path}: a theme needs at least 'name' and 'primary' (see themes/magpie-dark.yaml)")
    unknown = set(data) - set(_THEME_FIELDS) - {"name", "variables"}
    if unknown:
        raise ThemeFileError(f"{path}: unknown field(s) {sorted(unknown)}; allowed: name, variables, "
                             + ", ".join(_THEME_FIELDS))
    fields = {k: data[k] for k in _THEME_FIELDS if k in data}
    variables = {str(k): str(v) for k, v in (data.get("variables") or {}).items()}
    return Theme(name=str(data["name"]), variables=variables, **fields)


def builtin_theme_files() -> list[Path]:
    folder = resources.files("themes")
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml"))


def stylesheet(name: str) -> Path:
    """Path of a ``.tcss`` file shipped in ``themes/``."""
    return Path(str(resources.files("themes").joinpath(name)))


def load_themes(extra_dirs: Iterable[Path] = ()) -> tuple[list[Theme], list[str]]:
    """Built-in themes plus any ``*.yaml`` in ``extra_dirs``; problems come back as messages."""
    themes: list[Theme] = []
    problems: list[str] = []
    files = builtin_theme_files()
    for folder in extra_dirs:
        if folder.is_dir():
            files.extend(sorted(folder.glob("*.yaml")))
    for path in files:
        try:
            themes.append(theme_from_file(path))
        except ThemeFileError as exc:
            problems.append(str(exc))
    return themes, problems


def semantic_defaults() -> dict[str, str]:
    """The dark theme's semantic variables: the fallback for themes that do not define them."""
    for path in builtin_theme_files():
        if path.stem == DEFAULT_THEME:
            return dict(theme_from_file(path).variables)
    return {}

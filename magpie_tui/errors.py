"""How the workbench shows an engine error: the same title, message, details and hint the command
line prints (``engine.errors.format_error``), in a notification or a preview pane."""

from __future__ import annotations

from engine.errors import MagpieError, format_error


def error_text(exc: MagpieError) -> str:
    return format_error(exc).removeprefix("error: ")

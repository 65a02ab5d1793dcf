"""One error family for everything the engine refuses or cannot do.

Every error a user or a front end should see derives from ``MagpieError``: a ``title`` (what
kind of failure, a few words), the message (what happened, naming the file, the field or the
command), and a ``hint`` (what to do about it). The command line prints them one way
(``format_error``), the workbench shows them one way, and a machine client (the MCP server) gets
``to_dict()``. Errors of Python or of a library that reach a front end unwrapped are bugs.
"""

from __future__ import annotations

from typing import Any, Optional


class MagpieError(Exception):
    """Base of the engine's errors. Subclasses set ``title`` and may set a default ``hint``."""

    title = "error"
    hint: Optional[str] = None

    def __init__(self, message: str = "", *, title: Optional[str] = None, hint: Optional[str] = None) -> None:
        super().__init__(message)
        if title is not None:
            self.title = title
        if hint is not None:
            self.hint = hint

    @property
    def message(self) -> str:
        return str(self)

    def details(self) -> list[str]:
        """Further lines (a problem list, say); empty by default."""
        return []

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "title": self.title, "message": self.message,
                "details": self.details(), "hint": self.hint}


def format_error(exc: MagpieError) -> str:
    """The command line's rendering: ``error: <title>: <message>``, the details indented, the hint last."""
    head = f"error: {exc.title}" + (f": {exc.message}" if exc.message else "")
    lines = [head] + [f"  {d}" for d in exc.details()]
    if exc.hint:
        lines.append(f"hint: {exc.hint}")
    return "\n".join(lines)

"""``e``: open a file in the user's editor (``$VISUAL``, then ``$EDITOR``, then ``vi``) with the
terminal handed over to it, and come back to the workbench when it exits."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from textual.app import SuspendNotSupported

# Editors that take ``+LINE`` before the file to open it at that line.
_PLUS_LINE = {"vi", "vim", "nvim", "view", "nano", "emacs", "emacsclient", "micro", "kak", "hx", "joe", "mg"}


def editor_command(path: Path, line: int | None = None, environ: dict[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    words = shlex.split(env.get("VISUAL") or env.get("EDITOR") or "vi")
    if line and Path(words[0]).name in _PLUS_LINE:
        words.append(f"+{line}")
    return words + [str(path)]


def _run(command: list[str], headless: bool) -> tuple[int | None, str | None]:
    """(exit code, problem); never raises, so a suspended terminal is always given back."""
    try:
        if headless:
            return subprocess.run(command, check=False, stdin=subprocess.DEVNULL, capture_output=True).returncode, None
        return subprocess.run(command, check=False).returncode, None
    except FileNotFoundError:
        return None, f"editor {command[0]!r} not found: set $EDITOR (e.g. export EDITOR=nano)"
    except OSError as exc:
        return None, f"cannot start editor {command[0]!r}: {exc}"


def edit_file(app, path: Path, line: int | None = None) -> str | None:
    """Run the editor on ``path`` and wait for it; None when it exited cleanly, else what went
    wrong (the editor is missing, or it exited with an error)."""
    command = editor_command(path, line)
    try:
        with app.suspend():
            code, problem = _run(command, headless=False)
    except SuspendNotSupported:
        # No terminal to hand over (a headless run, e.g. a test): run it without one.
        code, problem = _run(command, headless=True)
    if problem is None and code != 0:
        problem = f"{shlex.join(command)} exited with {code}"
    return problem

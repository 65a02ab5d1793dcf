"""The results-folder scan behind ``RunCatalog``: which folders are runs, and reading what a run
appended to its ``events.jsonl``, without trusting what is in the folders.

A name in a results folder can be anything: a FIFO called ``events.jsonl`` (an ``open`` that
never returns), a symlink to ``/dev/zero`` (a read that never ends), a file of one endless line.
A folder whose ``events.jsonl`` is not a regular file is skipped, with a note saying why, and the
rest of the scan goes on; events are read in bounded chunks from a file opened without blocking,
and a "line" longer than any event is dropped, not held.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Iterable

from engine.safeio import NotRegularFile, file_kind, open_regular

EVENTS_FILE = "events.jsonl"
READ_CHUNK = 4 << 20  # bytes of events.jsonl read at a time
MAX_EVENT_LINE = 1 << 20  # an events.jsonl line longer than this is no event: dropped unread

log = logging.getLogger(__name__)
_noted: set[tuple[str, str]] = set()  # (folder, note) already logged: said once per process


def events_file_problem(folder: Path | str) -> str | None:
    """Why ``folder/events.jsonl`` cannot be a run's events file (None when it is a regular
    file, or when there is none: then the folder is just not a run)."""
    path = os.path.join(folder, EVENTS_FILE)
    try:
        st = os.stat(path)  # follows a symlink: its target must be a regular file
    except FileNotFoundError:
        if os.path.islink(path):
            return f"{path}: a symlink to nothing"
        return None
    except OSError as exc:
        return f"{path}: cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(st.st_mode):
        return None
    return f"{path}: {file_kind(st.st_mode)}, not a regular file"


def _note(folder: Path, problem: str, notes: dict[Path, str] | None) -> None:
    note = f"skipped {folder}: {problem}"
    if notes is not None:
        notes[folder] = note
    if (str(folder), problem) not in _noted:
        _noted.add((str(folder), problem))
        log.info(note)


def find_run_folders(roots: Iterable[Path], notes: dict[Path, str] | None = None) -> list[Path]:
    """The run folders under ``roots`` (a root can itself be a run): folders with a regular
    ``events.jsonl``. A folder whose ``events.jsonl`` is a FIFO, a device, a directory or a
    dangling link is left out, its note put in ``notes`` (folder -> text) and logged once."""
    found: list[Path] = []
    for root in roots:
        root = Path(root)
        problem = events_file_problem(root)
        if problem is None and os.path.exists(os.path.join(root, EVENTS_FILE)):
            found.append(root)  # the root is itself a run
            continue
        if problem is not None:
            _note(root, problem, notes)
        try:
            children = list(os.scandir(root))
        except OSError:
            continue
        for entry in children:
            if entry.name.startswith("."):
                continue
            try:
                if not entry.is_dir():
                    continue
            except OSError:
                continue
            if not os.path.lexists(os.path.join(entry.path, EVENTS_FILE)):
                continue
            problem = events_file_problem(entry.path)
            if problem is None:
                found.append(Path(entry.path))
            else:
                _note(Path(entry.path), problem, notes)
    return found


def read_appended_lines(info: Any) -> Iterable[bytes]:
    """The complete lines appended to ``info.path/events.jsonl`` since ``info._offset``, read a
    chunk at a time; ``info._offset``, ``info._partial`` (a half-written last line waits for its
    end) and ``info._dropping`` (inside an overlong line) advance as it goes. Nothing for a file
    that is not a regular file (``info.error`` says so) or cannot be read."""
    path = Path(info.path) / EVENTS_FILE
    try:
        fh = open_regular(path)
    except NotRegularFile as exc:
        if not info.error:
            info.error = str(exc)
        return
    except OSError:
        return
    with fh:
        fh.seek(info._offset)
        while True:
            chunk = fh.read(READ_CHUNK)
            if not chunk:
                return
            info._offset += len(chunk)
            data = info._partial + chunk
            lines = data.split(b"\n")
            info._partial = lines.pop()  # b"" when the chunk ended with a newline
            if info._dropping:
                if lines:
                    lines.pop(0)  # the end of a line too long to be an event
                    info._dropping = False
                else:
                    info._partial = b""  # still inside it
            if len(info._partial) > MAX_EVENT_LINE:
                info._partial, info._dropping = b"", True
            yield from lines
            if len(chunk) < READ_CHUNK:
                return


def decode_event_line(line: bytes) -> Any:
    """The JSON object of one events.jsonl line; None for a blank or corrupt line."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None  # a corrupt line never hides the rest of the run
    return record if isinstance(record, dict) else None


__all__ = ["EVENTS_FILE", "MAX_EVENT_LINE", "READ_CHUNK", "decode_event_line", "events_file_problem",
           "find_run_folders", "read_appended_lines"]

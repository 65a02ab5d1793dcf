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
        found.extend(scan_root(Path(root), notes)[0])
    return found


def scan_root(root: Path, notes: dict[Path, str] | None = None, sizes: dict[Path, int] | None = None,
              known: dict[str, Path] | None = None) -> tuple[list[Path], list[Path]]:
    """One results folder: (its run folders, its other sub-folders). ``root`` itself is the one
    run when it holds a regular ``events.jsonl``. The other sub-folders are where a run may yet
    appear (a run's folder is made before its ``events.jsonl``): ``is_run_folder`` looks again.
    ``sizes`` gets each run's events-file size, seen on the way (see ``is_run_folder``);
    ``known`` (path text -> Path) gives back the Paths of a listing before, for the same folders."""
    problem = events_file_problem(root)
    if problem is None and os.path.exists(os.path.join(root, EVENTS_FILE)):
        return [root], []  # the root is itself a run
    if problem is not None:
        _note(root, problem, notes)
    try:
        children = list(os.scandir(root))
    except OSError:
        return [], []
    runs: list[Path] = []
    others: list[Path] = []
    for entry in children:
        if entry.name.startswith("."):
            continue
        try:
            if not entry.is_dir():
                continue
        except OSError:
            continue
        folder = known.get(entry.path) if known is not None else None
        if folder is None:
            folder = Path(entry.path)
        (runs if is_run_folder(folder, notes, sizes) else others).append(folder)
    return runs, others


def is_run_folder(folder: Path, notes: dict[Path, str] | None = None, sizes: dict[Path, int] | None = None) -> bool:
    """Whether ``folder`` holds a regular ``events.jsonl``; one that is a FIFO, a device, a
    directory or a dangling link makes it no run, with a note in ``notes``. One ``stat`` for a
    run; ``sizes`` (folder -> bytes), when given, gets its events file's size from it."""
    path = os.path.join(str(folder), EVENTS_FILE)
    try:
        st = os.stat(path)  # follows a symlink: its target must be a regular file
    except OSError:
        if not os.path.lexists(path):
            return False  # no events.jsonl (yet): no run
    else:
        if stat.S_ISREG(st.st_mode):
            if sizes is not None:
                sizes[folder] = st.st_size
            return True
    problem = events_file_problem(folder)
    if problem is None:  # it changed between the two looks
        return os.path.exists(path)
    _note(Path(folder), problem, notes)
    return False


def events_grew(info: Any) -> bool:
    """Whether ``info.path/events.jsonl`` may hold bytes not read yet: its size is not the
    offset read up to, or it is no regular file (the read then says why), or it cannot be
    stat'ed. One ``stat``, no ``open``: an events file that did not grow is not opened."""
    try:
        st = os.stat(os.path.join(info.path, EVENTS_FILE))
    except OSError:
        return True
    return not stat.S_ISREG(st.st_mode) or st.st_size != info._offset


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


__all__ = ["EVENTS_FILE", "MAX_EVENT_LINE", "READ_CHUNK", "decode_event_line", "events_file_problem", "events_grew",
           "find_run_folders", "is_run_folder", "read_appended_lines", "scan_root"]

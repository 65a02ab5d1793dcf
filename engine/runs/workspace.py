"""The run folder: ``<output-dir>/<mode>_<label>_<YYYYmmdd_HHMMSS>_<unique>/``.

It holds ``config.yaml`` (effective config), ``events.jsonl`` (one JSON object a
line, flushed as written so a watcher sees it live), ``logs/`` and the report,
which is always written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from pydantic import ValidationError

from engine.runs.process import process_identity
from engine.runs.schema import EVENT_MODELS, SCHEMA_VERSION


def sanitize_label(label: str, max_len: int = 40) -> str:
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-._")
    return (clean or "run")[:max_len]


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def write_error(path: Path | str, exc: OSError, what: str = "") -> str:
    """A write that failed, said by file and errno: ``PATH: cannot write[ WHAT]: [Errno 28] No space ...``."""
    return f"{path}: cannot write{' ' + what if what else ''}: [Errno {exc.errno}] {exc.strerror}"


class EventLog:
    """Append-only ``events.jsonl``; safe to call from worker threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8", buffering=1)
        # In-process observers (the CLI's progress lines); the file is the contract for others.
        self.listeners: list[Callable[[dict], None]] = []
        # The first write that failed (a full disk): later events still reach the listeners, and the
        # run's report says the event log is incomplete.
        self.write_error: Optional[str] = None

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event. A known kind (``engine.runs.schema.EVENT_MODELS``) is validated
        through its model first, so a field of the wrong type fails here, in the writer, and
        never reaches a reader; unknown kinds pass through. The line holds the fields as given
        (the model is a check, not a rewrite); ``run_started`` also gets ``schema_version`` and,
        with its ``pid``, that process's ``start_time`` and ``pgid`` (the process that has the pid
        as the event is written; writers name their own), so that readers can tell the run's
        process from a later one given the same pid."""
        if event == "run_started":
            fields.setdefault("schema_version", SCHEMA_VERSION)
            pid = fields.get("pid")
            if isinstance(pid, int) and not isinstance(pid, bool):
                for key, value in process_identity(pid).items():
                    fields.setdefault(key, value)
        record = {"ts": round(time.time(), 6), "event": event, **fields}
        model = EVENT_MODELS.get(event)
        if model is not None:
            try:
                model.model_validate(record)
            except ValidationError as exc:
                raise ValueError(f"event {event!r} does not match {model.__name__}: {exc}") from None
        line = json.dumps(record, default=str)
        with self._lock:
            if not self._fh.closed and self.write_error is None:
                try:
                    self._fh.write(line + "\n")
                except OSError as exc:
                    self.write_error = write_error(self.path, exc)
            for listener in self.listeners:
                listener(record)

    def close(self) -> None:
        with self._lock:
            try:
                self._fh.close()
            except OSError as exc:  # the last buffered line could not be written
                self.write_error = self.write_error or write_error(self.path, exc)


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs_dir = root / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(root / "events.jsonl")

    @classmethod
    def create(cls, output_dir: Path | str, mode: str, label: str) -> "Workspace":
        """Make a new, never-reused folder: the random suffix keeps two runs in one second apart."""
        base = Path(output_dir).expanduser().resolve()
        base.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
        while True:
            name = f"{mode}_{sanitize_label(label)}_{stamp}_{secrets.token_hex(3)}"
            try:
                (base / name).mkdir()  # fails if it exists: no two runs share a folder
            except FileExistsError:
                continue
            return cls(base / name)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def log_stem(self, *parts: str) -> Path:
        stem = self.logs_dir.joinpath(*(sanitize_label(p, 80) for p in parts))
        stem.parent.mkdir(parents=True, exist_ok=True)
        return stem

    def write_json(self, name: str, obj: Any) -> Path:
        target = self.root / name
        atomic_write_json(target, obj)
        return target

    def write_text(self, name: str, text: str) -> Path:
        target = self.root / name
        atomic_write_text(target, text)
        return target

    def write_yaml(self, name: str, obj: Any) -> Path:
        target = self.root / name
        atomic_write_text(target, yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
        return target

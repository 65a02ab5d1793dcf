"""App-wide messages from the bridge, named as past-tense events."""

from __future__ import annotations

from pathlib import Path

from textual.message import Message

from engine.jobs.query import RunInfo


class RunsChanged(Message):
    """Runs appeared or changed state; ``runs`` is the full, newest-first list."""

    def __init__(self, runs: list[RunInfo], changed: list[RunInfo]) -> None:
        super().__init__()
        self.runs = runs
        self.changed = changed

    def can_replace(self, message: Message) -> bool:
        """Only the latest snapshot matters; the runs this one says changed go along with it
        (``message`` is the newer one, waiting behind this one)."""
        if not isinstance(message, RunsChanged):
            return False
        newer = {info.path for info in message.changed}
        message.changed = message.changed + [info for info in self.changed if info.path not in newer]
        return True


class ConfigsChanged(Message):
    """Files under the project folder changed on disk."""

    def __init__(self, paths: set[Path]) -> None:
        super().__init__()
        self.paths = paths

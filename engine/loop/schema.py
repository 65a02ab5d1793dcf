"""``loop.json``: the chain of an optimization loop (``magpie optimize``), a typed, versioned run file.

The loop folder ``<results>/loop_<label>_<stamp>_<hex>/`` holds ``loop.json``, its own
``events.jsonl`` (``run_started`` / ``run_finished``, so the run catalog lists the loop) and one
folder per step that ran, each an ordinary run workspace of its mode (``baseline/benchmark_...``)
or a plain folder for a step that is an analysis (``bottlenecks/``). ``loop.json`` is rewritten
atomically after every state change; a loop killed mid-step leaves that step ``running`` with
the pid (and start time) of a process that is gone, which ``--status`` reports and ``--resume``
restarts; a pid now held by another process (its start time differs) counts as gone.

Models allow extra keys and carry ``schema_version`` (1), as the run files of
``engine/runs/schema.py`` do; a file without the key is version 0 and still loads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Final, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.errors import MagpieError

LOOP_FILE: Final = "loop.json"
LOOP_SCHEMA_VERSION: Final = 1
MIN_REPEATS: Final = 3  # the baseline and the re-benchmark run at least this many times

# The chain, in order (issue 13): each step consumes what the ones before it wrote.
STEP_NAMES: Final = ("baseline", "profiled", "bottlenecks", "harness", "candidates", "integrate", "rebenchmark",
                     "verdict")
StepState = Literal["pending", "running", "done", "failed", "waiting", "skipped"]


class LoopFileError(MagpieError):
    title = "loop file"


class LoopStep(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    state: StepState = "pending"
    run_dir: Optional[str] = None  # relative to the loop folder
    pid: Optional[int] = None  # the loop process that ran (or runs) the step
    start_time: Optional[int] = None  # that process's start time (engine.runs.process): its identity beside the pid
    started: Optional[float] = None  # epoch seconds
    finished: Optional[float] = None
    result: dict[str, Any] = Field(default_factory=dict)  # a short summary; the step's folder has the rest
    error: Optional[str] = None
    reason: Optional[str] = None  # why it is pending/skipped/waiting
    attempts: int = 0

    @property
    def elapsed_s(self) -> Optional[float]:
        if self.started is None:
            return None
        return (self.finished or time.time()) - self.started

    def process_gone(self, loop_root: Path) -> Optional[str]:
        """None while the process recorded for this step is still that process (pid and start
        time; a step written before start times were kept: a process holding the loop's
        events.jsonl open for writing), else why not. A reused pid never counts as the step's."""
        if self.pid is None:
            return "no process recorded"
        from engine.runs.catalog import process_gone
        return process_gone(self.pid, self.start_time, None, Path(loop_root) / "events.jsonl")

    def process_alive(self, loop_root: Path) -> bool:
        return self.process_gone(loop_root) is None


class LoopFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    schema_version: int = Field(0, ge=0)
    kind: Literal["optimize_loop"] = "optimize_loop"
    config: str  # the clean benchmark YAML (-b), absolute
    label: str = ""
    created: Optional[float] = None
    until: Optional[str] = None
    overrides: list[dict[str, Any]] = Field(default_factory=list)  # what the loop changed in the clean config
    kernel: Optional[str] = None  # --kernel OP (None: the top replaceable row)
    candidates: list[str] = Field(default_factory=list)  # --candidates: user files or folders, absolute
    library: bool = True  # the bundled library's candidates too
    steps: list[LoopStep]

    def settled_steps(self) -> int:
        """Steps the loop is through: done, or skipped for a reason it gives (the count every front
        end shows as ``n/8 steps``)."""
        return sum(1 for s in self.steps if s.state in ("done", "skipped"))

    def step(self, name: str) -> LoopStep:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


def new_loop_file(config: str, label: str, created: float) -> LoopFile:
    return LoopFile(schema_version=LOOP_SCHEMA_VERSION, config=config, label=label, created=created,
                    steps=[LoopStep(name=n) for n in STEP_NAMES])


def load_loop_file(path: Path) -> LoopFile:
    """The loop file of a loop folder (or the file itself); a LoopFileError naming the field otherwise."""
    path = Path(path)
    if path.is_dir():
        path = path / LOOP_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LoopFileError(f"{path}: cannot read the loop file ({exc.strerror})",
                            hint="give the loop folder that magpie optimize printed") from None
    except ValueError as exc:
        raise LoopFileError(f"{path}: not JSON ({exc})") from None
    try:
        return LoopFile.model_validate(data)
    except ValidationError as exc:
        raise LoopFileError(f"{path}: not a loop file: {exc}") from None

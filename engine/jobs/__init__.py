"""Runs as jobs: typed requests (``requests``), one entry point per mode (``modes``), the
executors of this machine (``executors``), the job API and its registry of executors (``api``),
what a front end needs around a launch (``launch``) and the read-only questions front ends ask
(``query``). Front ends use these and nothing below them
(tests/unit/test_import_rule.py holds them to it).

The names below load their module when first used, so that ``import engine.jobs.query`` (a
workbench starting, ``magpie --help``) does not load every mode."""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    **dict.fromkeys(("EXECUTORS", "Job", "JobError", "attach", "cancel_on_signals", "register_executor", "submit"),
                    "engine.jobs.api"),
    **dict.fromkeys(("JobOutcome", "run_analyze", "run_benchmark", "run_compare", "run_optimize", "run_request",
                     "run_trace", "run_trace_diff"), "engine.jobs.modes"),
    **dict.fromkeys(("BenchmarkRequest", "KernelRequest", "LoopRequest", "TraceDiffRequest", "TraceRequest",
                     "parse_request"),
                    "engine.jobs.requests"),
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)  # read from its module: a patch there is seen


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))

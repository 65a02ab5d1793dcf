"""What a step of the optimization loop is given: the loop as its steps see it (``LoopContext``,
which ``engine.loop.run.Loop`` fulfils), the loop's error, and the helpers the steps share.

The steps (the first three in ``engine.loop.run``, then ``kernel_steps`` and ``verdict``) import
this module, never the chain that runs them, so the loop's modules import each other in one
direction only: ``context`` < ``kernel_steps`` < ``verdict`` < ``run``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TypeVar

from engine.errors import MagpieError
from engine.loop.schema import LoopFile, LoopStep
from engine.runs.process import CancelToken
from engine.runs.workspace import Workspace

_SUMMARY_KEYS = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms",
                 "median_e2el_ms", "failed")
# The modes' entry point, as the optimize mode hands it to the loop (engine.jobs.modes.run_request):
# run_request(request, output_dir=None, *, cancel=, workspace=, prepared=, log=) -> JobOutcome.
RunRequest = Callable[..., Any]
_T = TypeVar("_T")


class LoopError(MagpieError):
    title = "optimization loop"


class LoopContext(Protocol):
    """The running loop, as a step uses it."""
    root: Path  # the loop folder
    loop: LoopFile  # loop.json, as it stands
    ws: Workspace
    log: Callable[[str], None]
    cancel: CancelToken
    run_request: RunRequest  # every benchmark and compare of a step runs through it

    def set_run_dir(self, step: LoopStep, rel: str) -> None: ...

    def benchmark(self, step: LoopStep, config: str, flags: dict, folder: Optional[str] = None,
                  record: bool = True) -> tuple[Any, Any]:
        """One benchmark run of ``config`` into ``<loop>/<folder or step>/``: (prepared, outcome)."""
        ...

    def clean_yaml(self) -> dict: ...

    def run_config(self, run_dir: Optional[str]) -> dict: ...

    def result_of(self, name: str, model: type[_T]) -> _T:
        """The typed result of an earlier step."""
        ...


def _metrics(report: dict) -> dict:
    rep = report.get("repeats") or {}
    res = report.get("result") or {}
    out = {}
    for k in _SUMMARY_KEYS:
        if isinstance(rep.get(k), dict):
            out[k] = {"mean": rep[k].get("mean"), "ci95": rep[k].get("ci95")}
        elif k in res:
            out[k] = res[k]
    return out


def profiled_twin(raw: dict) -> dict:
    """The clean YAML with the profiler (with Python stacks) and the inference-stage analysis on;
    nothing else of the workload changes (repeats go to 1: the twin diagnoses, its latencies are
    never compared)."""
    twin = copy.deepcopy(raw)
    bench = twin.setdefault("benchmark", {})
    prof = bench.setdefault("profiler", {}) or {}
    bench["profiler"] = prof
    tp = prof.setdefault("torch_profiler", {}) or {}
    prof["torch_profiler"] = tp
    tp["enabled"] = True
    tp.setdefault("num_steps", 64)  # the profiler stops by itself: a long trace takes minutes to export
    # Python stacks: the bottleneck table names the model lines behind each row. vLLM (>= 0.13, the
    # --profiler-config its launcher passes) reads it as torch_profiler_with_stack, SGLang as
    # SGLANG_PROFILE_WITH_STACK; the built-in server's profiler always records them.
    tp.setdefault("with_stack", True)
    tl = prof.setdefault("tracelens", {}) or {}
    prof["tracelens"] = tl
    tl.update({"enabled": True, "analysis_mode": "inference", "analysis_stages": "all", "export_format": "csv"})
    gap = bench.setdefault("gap_analysis", {}) or {}
    bench["gap_analysis"] = gap
    gap["enabled"] = True
    client = bench.setdefault("client", {}) or {}
    bench["client"] = client
    client["repeats"] = 1
    return twin


def _flatten(d: Any, prefix: str = "") -> dict:
    if isinstance(d, dict):
        out: dict = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def config_diff(clean: dict, profiled: dict) -> list[dict]:
    """Every effective-config key that differs between the two runs, as {field, clean, profiled}."""
    a, b = _flatten(clean), _flatten(profiled)
    return [{"field": f"benchmark.{k}", "clean": a.get(k), "profiled": b.get(k)}
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]

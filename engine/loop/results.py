"""Typed step results of an optimization loop (``LoopStep.result`` in ``loop.json``).

The loop writes each step's result as plain JSON (``engine.loop.run``, ``kernel_steps``,
``verdict``); these models read it back for every front end. Readers must never fail on a
``loop.json`` written by another version, so the models are lenient: a field whose value does
not match its type reads as unset (None, or an empty list), a list item that is not an object
reads as an empty item, and keys the model does not know are kept (``extra="allow"``).

    from engine.loop.results import step_result
    verdict = step_result(loop.step("verdict"))     # -> VerdictResult
    for check in verdict.checks:
        print(check.name, check.ok)
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

__all__ = ["Number", "Metric", "FieldChange", "BenchmarkStepResult", "ProfiledResult", "TopReplaceable",
           "BottlenecksResult", "HarnessResult", "CandidateRow", "CandidatesResult", "IntegrateResult",
           "KernelAfter", "RebenchmarkResult", "KernelGain", "EndToEndRow", "VerdictCheck", "VerdictResult",
           "StepResult", "RESULT_MODELS", "step_result"]


def _finite(value: Any) -> float:
    """A finite int or float (never a bool, a string or NaN) as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("not a finite number")
    return float(value)


def _exact(kind: type) -> Any:
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"not a {kind.__name__}")
        return value
    return BeforeValidator(check)


Number = Annotated[float, BeforeValidator(_finite)]
Text = Annotated[str, _exact(str)]
Flag = Annotated[bool, _exact(bool)]
Count = Annotated[int, _exact(int)]


def _pair(value: Any) -> list[float]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("not a [low, high] pair")
    return [_finite(v) for v in value]


Interval = Annotated[list[float], BeforeValidator(_pair)]


class _Lenient(BaseModel):
    """A model that reads what it can: fields that fail their type are left unset."""
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="wrap")
    @classmethod
    def _drop_what_does_not_fit(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, dict):
            data = {}
        try:
            return handler(data)
        except ValidationError as exc:
            bad = {err["loc"][0] for err in exc.errors() if err["loc"]}
            return handler({k: v for k, v in data.items() if k not in bad})


def _items(value: Any) -> list:
    """A list field: anything else reads as empty (each item is then read by its own model)."""
    return value if isinstance(value, list) else []


Items = BeforeValidator(_items)


class Metric(_Lenient):
    """A metric over the repeats: mean and 95% interval."""
    mean: Optional[Number] = None
    ci95: Optional[Interval] = None


class FieldChange(_Lenient):
    field: Optional[Text] = None


class BenchmarkStepResult(_Lenient):
    """baseline (and the metrics part of profiled and rebenchmark)."""
    report: Optional[Text] = None
    repeats: Optional[Count] = None
    metrics: dict[str, Union[Metric, Number]] = {}

    @model_validator(mode="before")
    @classmethod
    def _metrics_are_a_mapping(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("metrics"), dict):
            data = {k: v for k, v in data.items() if k != "metrics"}
        return data


class ProfiledResult(BenchmarkStepResult):
    config_diff: Annotated[list[FieldChange], Items] = []


class TopReplaceable(_Lenient):
    registry_op: Optional[Text] = None
    share_pct: Optional[Number] = None
    calls: Optional[Number] = None
    confidence: Optional[Text] = None


class BottlenecksResult(_Lenient):
    device: Optional[Text] = None
    top_replaceable: Optional[TopReplaceable] = None

    @model_validator(mode="before")
    @classmethod
    def _top_is_an_object(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("top_replaceable"), dict):
            data = {k: v for k, v in data.items() if k != "top_replaceable"}
        return data


class HarnessResult(_Lenient):
    op: Optional[Text] = None
    file: Optional[Text] = None
    shapes: Annotated[list[Any], Items] = []


class CandidateRow(_Lenient):
    id: Optional[Text] = None
    origin: Optional[Text] = None
    correct: Optional[Flag] = None
    verdict: Optional[Text] = None
    speedup: Optional[Number] = None
    ci95: Optional[Interval] = None
    median_ms: Optional[Number] = None
    reason: Optional[Text] = None
    source: Optional[Text] = None


class CandidatesResult(_Lenient):
    op: Optional[Text] = None
    compare_run: Optional[Text] = None
    winner: Optional[Text] = None
    stopped: Optional[Text] = None
    rows: Annotated[list[CandidateRow], Items] = []

    @property
    def decided(self) -> bool:
        """Whether the step said who won, or that none did (a result written before it ran has neither)."""
        return "winner" in self.model_fields_set or bool(self.stopped)


class IntegrateResult(_Lenient):
    kernels: dict[str, Any] = {}
    changed: Annotated[list[Any], Items] = []

    @model_validator(mode="before")
    @classmethod
    def _kernels_are_a_mapping(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("kernels"), dict):
            data = {k: v for k, v in data.items() if k != "kernels"}
        return data


class KernelAfter(_Lenient):
    share_pct: Optional[Number] = None


class RebenchmarkResult(BenchmarkStepResult):
    kernel_after: Optional[KernelAfter] = None

    @model_validator(mode="before")
    @classmethod
    def _after_is_an_object(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("kernel_after"), dict):
            data = {k: v for k, v in data.items() if k != "kernel_after"}
        return data


class KernelGain(_Lenient):
    op: Optional[Text] = None
    winner: Optional[Text] = None
    speedup: Optional[Number] = None
    ci95: Optional[Interval] = None


class EndToEndRow(_Lenient):
    metric: Optional[Text] = None
    baseline_mean: Optional[Number] = None
    baseline_ci95: Optional[Interval] = None
    new_mean: Optional[Number] = None
    new_ci95: Optional[Interval] = None
    delta_pct: Optional[Number] = None
    verdict: Optional[Text] = None


class VerdictCheck(_Lenient):
    name: Optional[Text] = None
    ok: Optional[Flag] = None
    detail: Optional[Text] = None


class VerdictResult(_Lenient):
    success: Optional[Flag] = None
    message: Optional[Text] = None
    kernel: Optional[KernelGain] = None
    end_to_end: Annotated[list[EndToEndRow], Items] = []
    checks: Annotated[list[VerdictCheck], Items] = []
    top_bottleneck_after: Optional[Text] = None

    @model_validator(mode="before")
    @classmethod
    def _kernel_is_an_object(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("kernel"), dict):
            data = {k: v for k, v in data.items() if k != "kernel"}
        return data

    @property
    def decided(self) -> bool:
        """Whether the verdict was written (``success`` set, true or false)."""
        return "success" in self.model_fields_set


StepResult = Union[BenchmarkStepResult, ProfiledResult, BottlenecksResult, HarnessResult, CandidatesResult,
                   IntegrateResult, RebenchmarkResult, VerdictResult]
RESULT_MODELS: dict[str, type[_Lenient]] = {
    "baseline": BenchmarkStepResult, "profiled": ProfiledResult, "bottlenecks": BottlenecksResult,
    "harness": HarnessResult, "candidates": CandidatesResult, "integrate": IntegrateResult,
    "rebenchmark": RebenchmarkResult, "verdict": VerdictResult,
}


def step_result(step: Any) -> Optional[_Lenient]:
    """The typed result of a ``LoopStep`` (None for a step name this version does not know)."""
    model = RESULT_MODELS.get(step.name)
    return model.model_validate(step.result if isinstance(step.result, dict) else {}) if model else None

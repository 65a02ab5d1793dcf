"""Typed step results of an optimization loop (``LoopStep.result`` in ``loop.json``).

Each step builds its result through its model and ``loop.json`` records ``written()`` of it; every
front end reads it back through the same model. The two directions differ on purpose:

- Writing (keyword construction, ``CandidatesResult(op=..., rows=[...])``) is strict: a value of
  the wrong type, a list that is not a list, or a key the model does not know (a misspelling) is a
  ``ValidationError`` at the writer, in the step that wrote it.
- Reading (``model_validate``, ``step_result``) is lenient: readers must never fail on a
  ``loop.json`` written by another version, so a field whose value does not match its type reads
  as unset (None, or an empty list), a list item that is not an object reads as an empty item, and
  keys the model does not know are kept (``extra="allow"``).

``written()`` is the plain JSON of exactly the keys the writer gave, in its order (numbers keep
their int/float kind), so ``loop.json`` keeps the shape it had when the steps wrote free dicts.

    from engine.loop.results import step_result
    verdict = step_result(loop.step("verdict"))     # -> VerdictResult
    for check in verdict.checks:
        print(check.name, check.ok)
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Optional, TypeVar, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

__all__ = ["Number", "Metric", "FieldChange", "BenchmarkStepResult", "ProfiledResult", "TopReplaceable",
           "BottlenecksResult", "HarnessShape", "HarnessRow", "HarnessResult", "CandidateRow", "LeftOutCandidate",
           "CandidatesResult", "IntegrateResult", "KernelAfter", "TopAfter", "InterleavedRound", "RebenchmarkResult",
           "KernelGain", "EndToEndRow", "VerdictCheck", "TraceMover", "TraceDiffSummary", "KernelCalls", "Engagement",
           "VerdictResult", "StepResult", "StepResultT", "RESULT_MODELS",
           "step_result", "written_result"]

_STRICT = "loop_result_write"  # the validation context key of the strict (writing) path


def _strict(info: Optional[ValidationInfo]) -> bool:
    return bool(info is not None and isinstance(info.context, dict) and info.context.get(_STRICT))


def _finite(value: Any) -> Any:
    """A finite int or float (never a bool, a string or NaN), kept as given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _exact(kind: type) -> Any:
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"not a {kind.__name__}")
        return value
    return BeforeValidator(check)


Number = Annotated[Union[int, float], BeforeValidator(_finite)]
Text = Annotated[str, _exact(str)]
Flag = Annotated[bool, _exact(bool)]
Count = Annotated[int, _exact(int)]


def _pair(value: Any) -> list:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("not a [low, high] pair")
    return [_finite(v) for v in value]


Interval = Annotated[list[Union[int, float]], BeforeValidator(_pair)]


class _Lenient(BaseModel):
    """A model that reads what it can (fields that fail their type are left unset) and is built
    strictly: keyword construction rejects wrong types and unknown keys, nested models too."""
    model_config = ConfigDict(extra="allow")
    # Keys a subclass inherits for reading but its step never writes (refused when building).
    _not_written: ClassVar[frozenset[str]] = frozenset()
    _order: list[str] = PrivateAttr(default_factory=list)  # the writer's key order

    def __init__(self, /, **data: Any) -> None:
        __tracebackhide__ = True
        self.__pydantic_validator__.validate_python(data, self_instance=self, context={_STRICT: True})
        self._order = list(data)

    # Not a custom __init__ to pydantic (as RootModel's): validating a nested model (reading, or
    # building its parent) goes on through the validator and its context, never through this.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @model_validator(mode="wrap")
    @classmethod
    def _drop_what_does_not_fit(cls, data: Any, handler: Any, info: ValidationInfo) -> Any:
        if _strict(info):
            if isinstance(data, cls):
                return data
            if not isinstance(data, dict):
                raise ValueError(f"{cls.__name__}: not an object ({type(data).__name__})")
            unknown = [k for k in data if k not in cls.model_fields or k in cls._not_written]
            if unknown:
                raise ValueError(f"{cls.__name__}: unknown key(s) {', '.join(map(repr, unknown))}; it has "
                                 f"{', '.join(k for k in cls.model_fields if k not in cls._not_written)}")
            return handler(data)
        if not isinstance(data, dict):
            data = {}
        try:
            return handler(data)
        except ValidationError as exc:
            bad = {err["loc"][0] for err in exc.errors() if err["loc"]}
            return handler({k: v for k, v in data.items() if k not in bad})

    def written(self) -> dict[str, Any]:
        """The result as ``loop.json`` records it: the keys the writer set, in its order."""
        data = self.model_dump(exclude_unset=True)
        order = [k for k in self._order if k in data]
        return {**{k: data[k] for k in order}, **{k: v for k, v in data.items() if k not in order}}


def _items(value: Any, info: ValidationInfo) -> Any:
    """A list field: read, anything else is empty (each item is then read by its own model)."""
    return value if isinstance(value, list) or _strict(info) else []


Items = BeforeValidator(_items)


def _object_or_unset(*names: str) -> Any:
    """A before-validator that reads a nested-object field that is not an object as unset (a
    nested model would read it as an empty object); writing leaves that to the field's type."""
    def drop(cls: Any, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and not _strict(info):
            data = {k: v for k, v in data.items() if k not in names or isinstance(v, dict)}
        return data
    return model_validator(mode="before")(classmethod(drop))


class Metric(_Lenient):
    """A metric over the repeats: mean and 95% interval."""
    mean: Optional[Number] = None
    ci95: Optional[Interval] = None


class FieldChange(_Lenient):
    """A config field that differs: clean vs the profiled twin (``profiled``) or the integrated
    config (``integrated``)."""
    field: Optional[Text] = None
    clean: Any = None
    profiled: Any = None
    integrated: Any = None


class BenchmarkStepResult(_Lenient):
    """baseline (and the metrics part of profiled and rebenchmark)."""
    report: Optional[Text] = None  # the benchmark report, relative to the loop folder
    report_sha256: Optional[Text] = None
    repeats: Optional[Count] = None
    overrides: Annotated[list[dict[str, Any]], Items] = []  # what the loop changed in the clean config
    metrics: dict[str, Union[Metric, Number, None]] = {}  # a mean and interval over repeats, or one run's value

    _metrics_are_a_mapping = _object_or_unset("metrics")


class ProfiledResult(BenchmarkStepResult):
    _not_written: ClassVar[frozenset[str]] = frozenset({"report", "report_sha256", "repeats", "overrides"})
    config: Optional[Text] = None  # the profiled twin's YAML, relative to the loop folder
    config_diff: Annotated[list[FieldChange], Items] = []
    traces: Annotated[list[Text], Items] = []
    note: Optional[Text] = None


class TopReplaceable(_Lenient):
    registry_op: Optional[Text] = None
    share_pct: Optional[Number] = None
    calls: Optional[Number] = None
    confidence: Optional[Text] = None
    lines: Annotated[list[Text], Items] = []  # "file:line function share%"


class BottlenecksResult(_Lenient):
    table: Optional[Text] = None  # bottlenecks.json, relative to the loop folder
    device: Optional[Text] = None
    top_by_stage: dict[str, list[Text]] = {}
    window: Optional[Text] = None
    python_stacks: Optional[Flag] = None
    top_replaceable: Optional[TopReplaceable] = None

    _top_is_an_object = _object_or_unset("top_replaceable")


class HarnessShape(_Lenient):
    args: Optional[Text] = None
    share_pct: Optional[Number] = None


class HarnessRow(_Lenient):
    """The bottleneck row the harness was built for."""
    rank: Optional[Count] = None
    share_pct: Optional[Number] = None
    calls: Optional[Number] = None
    confidence: Optional[Text] = None
    method: Optional[Text] = None


class HarnessResult(_Lenient):
    op: Optional[Text] = None
    file: Optional[Text] = None
    implementation: Optional[Text] = None
    shapes: Annotated[list[HarnessShape], Items] = []
    scalars: Annotated[list[Any], Items] = []
    row: Optional[HarnessRow] = None
    device: Optional[Text] = None

    _row_is_an_object = _object_or_unset("row")


class CandidateRow(_Lenient):
    id: Optional[Text] = None
    source: Optional[Text] = None
    origin: Optional[Text] = None
    correct: Optional[Flag] = None
    verdict: Optional[Text] = None
    speedup: Optional[Number] = None
    ci95: Optional[Interval] = None
    median_ms: Optional[Number] = None
    reason: Optional[Text] = None


class LeftOutCandidate(_Lenient):
    id: Optional[Text] = None
    path: Optional[Text] = None
    origin: Optional[Text] = None
    description: Optional[Text] = None
    reason: Optional[Text] = None


class CandidatesResult(_Lenient):
    op: Optional[Text] = None
    compare_run: Optional[Text] = None
    winner: Optional[Text] = None
    winner_path: Optional[Text] = None
    speedup: Optional[Number] = None
    ci95: Optional[Interval] = None
    rows: Annotated[list[CandidateRow], Items] = []
    left_out: Annotated[list[LeftOutCandidate], Items] = []
    stopped: Optional[Text] = None
    report: Optional[Text] = None

    @property
    def decided(self) -> bool:
        """Whether the step said who won, or that none did (a result written before it ran has neither)."""
        return "winner" in self.model_fields_set or bool(self.stopped)


class IntegrateResult(_Lenient):
    config: Optional[Text] = None  # the integrated YAML, relative to the loop folder
    framework: Optional[Text] = None
    kernels: dict[str, Text] = {}
    changed: Annotated[list[FieldChange], Items] = []
    # framework vllm: the out-of-tree plugin (engine.loop.vllm_plugin) and where it was installed
    plugin: Optional[dict[str, Any]] = None
    site: Optional[Text] = None
    server_python: Optional[Text] = None
    install_argv: Annotated[list[Text], Items] = []
    check: Optional[dict[str, Any]] = None
    vllm_plugins: Optional[Text] = None

    _kernels_are_a_mapping = _object_or_unset("kernels", "plugin", "check")


class KernelAfter(_Lenient):
    """The integrated op's row in the profiled run after integration."""
    share_pct: Optional[Number] = None
    avg_us: Optional[Number] = None
    calls: Optional[Number] = None
    time_us: Optional[Number] = None


class TopAfter(_Lenient):
    name: Optional[Text] = None
    registry_op: Optional[Text] = None
    share_pct: Optional[Number] = None


class InterleavedRound(_Lenient):
    """One round of the re-benchmark: the clean config and the integrated one, one run each, in
    ``order``; run folders and reports relative to the loop folder."""
    index: Optional[Count] = None
    order: Annotated[list[Text], Items] = []  # ["baseline", "winner"] or the other way round
    baseline_run: Optional[Text] = None
    baseline_report: Optional[Text] = None
    winner_run: Optional[Text] = None
    winner_report: Optional[Text] = None


class RebenchmarkResult(BenchmarkStepResult):
    _not_written: ClassVar[frozenset[str]] = frozenset({"report_sha256", "overrides"})
    profiled_run: Optional[Text] = None
    kernel_after: Optional[KernelAfter] = None
    top_after: Optional[TopAfter] = None
    profiled_note: Optional[Text] = None
    # The baseline and the winner benchmarked in turn (ABBA...), one run each a round; a loop.json
    # of an earlier version has none (the winner alone, its repeats against the first baseline).
    rounds: Annotated[list[InterleavedRound], Items] = []

    _after_is_an_object = _object_or_unset("kernel_after", "top_after")


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
    delta: Optional[Number] = None
    delta_pct: Optional[Number] = None
    delta_ci95: Optional[Interval] = None
    noise: Optional[Text] = None
    verdict: Optional[Text] = None


class VerdictCheck(_Lenient):
    name: Optional[Text] = None
    ok: Optional[Flag] = None
    detail: Optional[Text] = None


class TraceMover(_Lenient):
    """One row of the trace diff (engine.trace.diff): an op or kernel at its call site, before
    (the profiled baseline) and after (the profiled run with the winner)."""
    name: Optional[Text] = None
    stack: Annotated[list[Text], Items] = []
    status: Optional[Text] = None  # both, only_a (before only), only_b (after only)
    before_us: Optional[Number] = None
    after_us: Optional[Number] = None
    delta_us: Optional[Number] = None
    delta_pct: Optional[Number] = None
    calls_before: Optional[Count] = None
    calls_after: Optional[Count] = None


class TraceDiffSummary(_Lenient):
    """The profiled baseline's trace against the profiled run's after integration: the largest
    movers (the whole diff is in ``report``, with its CSVs beside it)."""
    report: Optional[Text] = None  # trace_diff_report.json, relative to the loop folder
    before: Optional[Text] = None  # the traces, relative to the loop folder
    after: Optional[Text] = None
    basis: Optional[Text] = None  # gpu (GPU-event time) or cpu (CPU time of the ops)
    total_before_us: Optional[Number] = None
    total_after_us: Optional[Number] = None
    total_delta_pct: Optional[Number] = None
    top_ops: Annotated[list[TraceMover], Items] = []
    top_kernels: Annotated[list[TraceMover], Items] = []
    kernels_only_before: Optional[Count] = None
    kernels_only_after: Optional[Count] = None
    error: Optional[Text] = None  # why there is no diff


class KernelCalls(_Lenient):
    name: Optional[Text] = None  # the kernel (on a CPU: the leaf op) with its path below the op's call site
    calls: Optional[Count] = None


class Engagement(_Lenient):
    """Proof that the winner ran in the profiled run after integration: the kernels under the op's
    call site (``magpie_kernel::<op>``) after and before, and the winner's function among the
    trace's Python frames."""
    ok: Optional[Flag] = None
    op: Optional[Text] = None
    winner: Optional[Text] = None
    function: Optional[Text] = None  # the winner's function as its Python frames name it (file: function)
    annotation: Optional[Text] = None
    calls_before: Optional[Count] = None  # calls of the op (its annotation spans)
    calls_after: Optional[Count] = None
    kernels_before: Annotated[list[KernelCalls], Items] = []
    kernels_after: Annotated[list[KernelCalls], Items] = []
    winner_frames_before: Optional[Count] = None  # None: the trace has no Python frames
    winner_frames_after: Optional[Count] = None
    detail: Optional[Text] = None


class VerdictResult(_Lenient):
    success: Optional[Flag] = None
    regression: Optional[Flag] = None
    message: Optional[Text] = None
    kernel: Optional[KernelGain] = None
    end_to_end: Annotated[list[EndToEndRow], Items] = []
    checks: Annotated[list[VerdictCheck], Items] = []
    kernel_after: Optional[KernelAfter] = None
    top_bottleneck_after: Optional[Text] = None
    top_changed: Optional[Flag] = None
    # The first baseline (the loop's reference) against the baseline of the interleaved rounds.
    drift: Optional[EndToEndRow] = None
    # The largest end-to-end throughput gain (%) the kernel's share of the profiled time and its
    # speedup (the interval's upper end) allow by Amdahl's law; None when either is unknown.
    gain_bound_pct: Optional[Number] = None
    # The profiled traces before and after integration compared (engine.trace.diff), and whether
    # the winner's own kernels ran in the one after (a check of its own too: "winner engaged").
    trace_diff: Optional[TraceDiffSummary] = None
    engagement: Optional[Engagement] = None

    _kernel_is_an_object = _object_or_unset("kernel", "kernel_after", "drift", "trace_diff", "engagement")

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


StepResultT = TypeVar("StepResultT", bound=_Lenient)


def step_result(step: Any) -> Optional[_Lenient]:
    """The typed result of a ``LoopStep`` (None for a step name this version does not know)."""
    model = RESULT_MODELS.get(step.name)
    return model.model_validate(step.result if isinstance(step.result, dict) else {}) if model else None


def written_result(name: str, result: Any) -> dict[str, Any]:
    """What step ``name`` returned, as ``loop.json`` records it: an instance of the step's model
    (built strictly), or a mapping, built through the model here; a ``ValidationError`` names a
    wrong type or an unknown key."""
    model = RESULT_MODELS[name]
    if isinstance(result, dict):
        result = model(**result)
    if type(result) is not model:
        raise TypeError(f"step {name} returned a {type(result).__name__}, not a {model.__name__}")
    return result.written()

"""Typed, versioned run files: the events of ``events.jsonl`` and the report files.

One model per event kind and one per report, imported by the writers (the engine) and the
readers (the run catalog, the workbench, the job API). The contract stays Magpie's: the keys
written are exactly the keys Magpie users' scripts read, and every model allows extra keys
(``extra="allow"``), so a new key never breaks an old reader and a reader never drops a key it
does not know.

Versions: writers stamp ``schema_version`` (:data:`SCHEMA_VERSION`, now 1) into ``run_started``
and into every report. A file without the key is version 0 (run folders written before this
module) and loads with the same models. A required key that is missing or renamed fails
validation with a message that names the field, instead of a silent ``None`` from ``.get``.

State strings live here too (:class:`StageState`, :class:`RunState`): plain ``str`` constants,
so the bytes written are what they always were.

Example::

    from engine.runs.schema import load_report, CompareReport
    report = load_report(run_dir / "compare_report.json")   # -> CompareReport
    for k in report.kernel_results:
        print(k.kernel_id, k.correct, k.verdict, k.speedup)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "SCHEMA_VERSION", "StageState", "RunState", "Verdict", "FINISHED_RUN_STATES",
    "ANALYZE_REPORT", "COMPARE_REPORT", "BENCHMARK_REPORT", "TRACE_ANALYSIS_REPORT", "REPORT_FILES",
    "KERNEL_REPORTS", "report_name_for_mode",
    "RunFile", "Event", "RunSubmitted", "RunStarted", "StageEvent", "ProgressEvent", "RunFinished", "Figure", "RunFigures",
    "CapacityLevel", "EVENT_MODELS", "parse_event",
    "validate_event", "Timing", "KernelResult", "AnalyzeReport", "CompareResults", "CompareReport",
    "Baseline", "BenchResult", "RepeatStat", "SweepPoint", "BenchDataset", "BenchEnvironment", "BenchmarkReport",
    "TraceAnalysisReport", "Report", "REPORT_MODELS", "RunFileError", "load_report", "parse_report",
]

SCHEMA_VERSION: Final = 1


# ----------------------------------------------------------------------------- state strings

class StageState:
    """States of a stage (``stage`` events, a kernel's ``*_state`` keys). Upper case for
    finished stages (Magpie's), lower case while in progress."""
    SUCCESS: Final = "SUCCESS"
    FAILED: Final = "FAILED"
    SKIPPED: Final = "SKIPPED"
    CANCELLED: Final = "CANCELLED"
    RUNNING: Final = "running"
    STOPPING: Final = "stopping"


class RunState:
    """States of a whole run (``run_finished.state``, a report's ``state``). ``pending`` and
    ``lost`` are the catalog's own: no events yet / the process ended without ``run_finished``."""
    PENDING: Final = "pending"
    RUNNING: Final = "running"
    COMPLETED: Final = "completed"
    # The measurement completed, a stage after it did not (a profiled run's trace analysis): the
    # numbers stand, the run is not a success.
    COMPLETED_WITH_ERRORS: Final = "completed_with_errors"
    FAILED: Final = "failed"
    CANCELLED: Final = "cancelled"
    TIMEOUT: Final = "timeout"
    LOST: Final = "lost"


FINISHED_RUN_STATES: Final = frozenset({RunState.COMPLETED, RunState.COMPLETED_WITH_ERRORS, RunState.FAILED,
                                        RunState.CANCELLED, RunState.TIMEOUT, RunState.LOST})


class Verdict:
    """A compare report's per-kernel ``verdict``."""
    BASELINE: Final = "baseline"
    FASTER: Final = "faster"
    TIE: Final = "tie"
    SLOWER: Final = "slower"
    REJECTED: Final = "rejected"
    INCORRECT: Final = "incorrect"
    CANCELLED: Final = "cancelled"
    NOT_MEASURED: Final = "not measured"


# ----------------------------------------------------------------------------- file names

ANALYZE_REPORT: Final = "analyze_report.json"
COMPARE_REPORT: Final = "compare_report.json"
BENCHMARK_REPORT: Final = "benchmark_report.json"
TRACE_ANALYSIS_REPORT: Final = "trace_analysis_report.json"
TRACE_DIFF_REPORT: Final = "trace_diff_report.json"
# In the order a run folder is searched for its report when run_finished names none.
REPORT_FILES: Final = (COMPARE_REPORT, ANALYZE_REPORT, BENCHMARK_REPORT, TRACE_ANALYSIS_REPORT, TRACE_DIFF_REPORT)
KERNEL_REPORTS: Final = frozenset({COMPARE_REPORT, ANALYZE_REPORT})
_BY_MODE = {"analyze": ANALYZE_REPORT, "compare": COMPARE_REPORT, "benchmark": BENCHMARK_REPORT,
            "trace_analysis": TRACE_ANALYSIS_REPORT, "trace_diff": TRACE_DIFF_REPORT}


def report_name_for_mode(mode: str) -> str:
    """The report file a run of ``mode`` (analyze, compare, benchmark, trace_analysis) writes."""
    return _BY_MODE[mode]


# ----------------------------------------------------------------------------- base

class RunFile(BaseModel):
    """Base of every run-file model: extra keys are kept, and ``schema_version`` is 0 when the
    file has none (written before versioning)."""
    model_config = ConfigDict(extra="allow")

    schema_version: int = Field(0, ge=0)

    def value(self, key: str, default: Any = None) -> Any:
        """A field or an extra key by name (metric keys chosen at run time)."""
        v = getattr(self, key, default)
        return default if v is None else v

    def to_dict(self) -> dict:
        """The keys as read (or set), without defaults the file did not carry."""
        return self.model_dump(mode="json", exclude_unset=True)


class _Section(BaseModel):
    """A nested object of a run file: extra keys kept, no version of its own."""
    model_config = ConfigDict(extra="allow")

    def value(self, key: str, default: Any = None) -> Any:
        v = getattr(self, key, default)
        return default if v is None else v


# ----------------------------------------------------------------------------- events

class Event(RunFile):
    """One line of ``events.jsonl``. Kinds without a model of their own parse as this."""
    ts: Optional[float] = None
    event: str


class RunStarted(Event):
    mode: Optional[str] = None  # analyze | compare | benchmark | trace_analysis
    pid: Optional[int] = None
    # The identity of that process: a pid alone names whichever process has it now. Start time in
    # clock ticks since boot (/proc/PID/stat field 22) and the process group; absent in run folders
    # written before they were recorded, and where /proc cannot be read.
    start_time: Optional[int] = None
    pgid: Optional[int] = None
    workspace: Optional[str] = None
    label: Optional[str] = None  # the label in the folder's name
    # What every list calls the run (engine.runs.labels.run_label), fixed at launch; absent in run
    # folders written before it was recorded (their config.yaml tells it).
    title: Optional[str] = None
    kernels: Optional[list[str]] = None  # analyze / compare
    target: Optional[str] = None  # trace_analysis


class RunSubmitted(Event):
    """Written by the front end that launched a run detached, before the run's process starts:
    the run's ``title`` (engine.runs.labels), so the run is called the same from the moment its
    folder appears."""
    title: Optional[str] = None


class StageEvent(Event):
    stage: str = ""
    state: Optional[str] = None  # StageState
    kernel: Optional[str] = None  # analyze / compare
    index: Optional[int] = None
    backend: Optional[str] = None
    median_ms: Optional[float] = None
    # A kernel's place inside a stage (optional; run folders before them still read): which input
    # set of a correctness check (``step`` of ``steps``, 1-based), which timing round; ``detail``
    # says what the step is. A compare's ``done`` stage carries each kernel's ``verdict`` (and
    # ``speedup`` over the baseline), written with the report, before ``run_finished``.
    step: Optional[int] = None
    steps: Optional[int] = None
    detail: Optional[str] = None
    verdict: Optional[str] = None
    speedup: Optional[float] = None
    argv: Optional[list[Any]] = None  # benchmark server (written with default=str)
    ready_s: Optional[float] = None
    image: Optional[str] = None
    traces: Optional[list[str]] = None  # trace analysis
    trace: Optional[str] = None
    events: Optional[int] = None


class ProgressEvent(Event):
    phase: Optional[str] = None
    done: Optional[int] = None
    total: Optional[int] = None
    repeat: Optional[int] = None  # 0-based, as written since the first run folders
    repeats: Optional[int] = None  # how many repeats the point runs
    point: Optional[dict[str, Any]] = None
    # A benchmark's live numbers (about once a second), over the measured requests finished so far.
    point_index: Optional[int] = None
    completed: Optional[int] = None
    failed: Optional[int] = None  # every measured request that ended without success, never-sent ones included
    # Requests a cancel kept queued: counted in ``done`` and ``failed`` (the load generator ends
    # them as failed), never seen by the server.
    never_sent: Optional[int] = None
    elapsed_s: Optional[float] = None
    output_tok_s: Optional[float] = None
    ttft_p50_ms: Optional[float] = None
    tpot_p50_ms: Optional[float] = None
    # Added for the live view; every one optional, so older run folders read as before.
    ttft_p99_ms: Optional[float] = None
    tpot_p99_ms: Optional[float] = None
    output_tokens: Optional[int] = None  # output tokens of the completed measured requests so far
    in_flight: Optional[int] = None  # sent to the server and not ended (one client process only)
    eta_s: Optional[float] = None  # this repeat's measured load: seconds left, estimated
    # The server's own /metrics (the newest scrape of server_metrics.jsonl), when it exposes them.
    server_running: Optional[int] = None
    server_waiting: Optional[int] = None
    server_kv_cache: Optional[float] = None  # KV-cache use, 0-1


class Figure(_Section):
    """One headline number of a report: the mean over ``n`` repeats and its 95% interval (None
    with one repeat)."""
    mean: float
    n: int = 1
    ci95: Optional[list[float]] = None


class RunFigures(_Section):
    """The report's own headline figures, carried by ``run_finished`` so that every front end
    shows what the report says without reading it. Requests are summed over every point and
    repeat (the report's ``failures`` section); a loop sets the ``steps_*`` keys."""
    requests: Optional[int] = None  # measured requests planned: sent + never sent
    sent: Optional[int] = None
    completed: Optional[int] = None
    failed: Optional[int] = None  # sent and failed
    never_sent: Optional[int] = None
    output_tok_s: Optional[Figure] = None
    ttft_p50_ms: Optional[Figure] = None
    tpot_p50_ms: Optional[Figure] = None
    capacity_over: Optional[str] = None  # concurrency | request_rate
    capacity_knee: Optional[float] = None
    capacity_levels: Optional[list[float]] = None  # every level tried, in order
    # A repeat a cancel or the server's exit cut short, left out of the figures: which of how many.
    repeat_cut: Optional[int] = None
    repeats_planned: Optional[int] = None
    steps_done: Optional[int] = None
    steps_total: Optional[int] = None
    outcome: Optional[str] = None  # a loop's end in words ("no proven gain")
    # analyze / compare: how many kernels got each verdict (a compare's: faster, tie, incorrect,
    # not judged...; an analyze's: correct, incorrect, not judged), the baseline and the winner
    verdicts: Optional[dict[str, int]] = None
    baseline: Optional[str] = None
    winner: Optional[str] = None
    winner_speedup: Optional[Figure] = None


class RunFinished(Event):
    state: Optional[str] = None  # RunState; readers take a missing state as completed
    exit_code: Optional[int] = None
    report: Optional[str] = None  # the report's file name
    error: Optional[str] = None
    figures: Optional[RunFigures] = None


class CapacityLevel(Event):
    """One level of a capacity search, as it ends (``engine.bench.capacity``)."""
    level: float
    over: Optional[str] = None
    passed: Optional[bool] = None


EVENT_MODELS: Final[dict[str, type[Event]]] = {
    "submitted": RunSubmitted, "run_started": RunStarted, "stage": StageEvent, "progress": ProgressEvent,
    "run_finished": RunFinished, "capacity_level": CapacityLevel,
}


def validate_event(record: dict) -> Event:
    """The model of one event record; raises :class:`pydantic.ValidationError` when a known
    kind carries a field of the wrong type. Unknown kinds parse as :class:`Event`."""
    model = EVENT_MODELS.get(record.get("event"), Event) if isinstance(record.get("event"), str) else Event
    return model.model_validate(record)


def parse_event(record: Any) -> Optional[Event]:
    """Tolerant :func:`validate_event` for readers: None for anything malformed."""
    if not isinstance(record, dict):
        return None
    try:
        return validate_event(record)
    except ValidationError:
        return None


# ----------------------------------------------------------------------------- kernel reports

class Timing(_Section):
    """``summarize()`` of a kernel's samples (milliseconds)."""
    unit: str = "ms"
    n: Optional[int] = None
    median: Optional[float] = None
    mean: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None
    std: Optional[float] = None
    p25: Optional[float] = None
    p75: Optional[float] = None
    iqr: Optional[float] = None
    cv: Optional[float] = None


class KernelResult(_Section):
    """One kernel of an analyze report's ``results`` or a compare report's ``kernel_results``."""
    kernel_id: str
    compiling_state: Optional[str] = None  # StageState
    correctness_state: Optional[str] = None
    performance_state: Optional[str] = None
    errors: list[str] = Field(default_factory=list)
    score: Optional[float] = None
    compiling_result: Optional[dict[str, Any]] = None
    correctness_result: Optional[dict[str, Any]] = None
    performance_result: Optional[dict[str, Any]] = None
    timing: Optional[Timing] = None
    guards: Optional[dict[str, Any]] = None
    extra: Optional[dict[str, Any]] = None
    # compare only
    speedup: Optional[float] = None
    speedup_ci: Optional[list[Optional[float]]] = None
    verdict: Optional[str] = None  # Verdict

    @property
    def correct(self) -> bool:
        return self.correctness_state == StageState.SUCCESS


class _KernelReport(RunFile):
    mode: str
    timestamp: Optional[str] = None
    state: str  # RunState
    exit_code: Optional[int] = None
    execution_time: Optional[float] = None
    degenerate_test: Optional[str] = None
    workspace_dir: Optional[str] = None
    overrides: list[dict[str, Any]] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    settings: Optional[dict[str, Any]] = None
    environment: Optional[dict[str, Any]] = None
    provenance: Optional[dict[str, Any]] = None  # engine.runs.provenance: what produced the report
    error: Optional[str] = None
    cancel_reason: Optional[str] = None


class AnalyzeReport(_KernelReport):
    mode: str = "analyze"
    results: list[KernelResult]
    all_correct: Optional[bool] = None

    @property
    def kernel_results(self) -> list[KernelResult]:
        return self.results

    @property
    def rankings(self) -> list[tuple[int, float]]:
        return []


class CompareResults(_Section):
    kernel_results: list[KernelResult]
    comparison_metrics: Optional[dict[str, Any]] = None
    winner: Optional[int] = None
    rankings: list[tuple[int, float]] = Field(default_factory=list)  # [kernel index, speedup], best first
    summary: Optional[str] = None


class Baseline(_Section):
    index: Optional[int] = None
    id: Optional[str] = None
    chosen_by: Optional[str] = None


class CorrectnessReference(_Section):
    """What a compare judged the outputs against: the baseline's (``kind`` baseline, ``id``) or
    a reference_file module's, which judged the baseline too (``kind`` reference_file, ``file``)."""
    kind: Optional[str] = None
    id: Optional[str] = None
    file: Optional[str] = None


class CompareReport(_KernelReport):
    mode: str = "compare"
    results: CompareResults
    baseline: Optional[Baseline] = None
    correctness_reference: Optional[CorrectnessReference] = None
    winner_id: Optional[str] = None
    winner_reason: Optional[str] = None
    tie_margin: Optional[float] = None

    @property
    def kernel_results(self) -> list[KernelResult]:
        return self.results.kernel_results

    @property
    def rankings(self) -> list[tuple[int, float]]:
        return self.results.rankings


# ----------------------------------------------------------------------------- benchmark report

class BenchResult(_Section):
    """One measured run (vLLM's result keys); every other metric key is an extra, read with
    :meth:`value`."""
    duration: Optional[float] = None
    completed: Optional[int] = None
    failed: Optional[int] = None
    total_input_tokens: Optional[int] = None
    total_output_tokens: Optional[int] = None
    request_throughput: Optional[float] = None
    output_throughput: Optional[float] = None
    total_token_throughput: Optional[float] = None
    median_ttft_ms: Optional[float] = None
    median_tpot_ms: Optional[float] = None
    errors: list[str] = Field(default_factory=list)
    cut_short: Optional[bool] = None


class RepeatStat(_Section):
    """One metric across repeats: mean, sample std, 95% t-interval of the mean."""
    mean: Optional[float] = None
    std: Optional[float] = None
    n: Optional[int] = None
    ci95: Optional[list[float]] = None
    values: list[float] = Field(default_factory=list)


class SweepPoint(_Section):
    point: dict[str, Any] = Field(default_factory=dict)
    runs: list[BenchResult] = Field(default_factory=list)
    repeats: Optional[dict[str, RepeatStat]] = None


class BenchDataset(_Section):
    name: Optional[str] = None
    prompts: Optional[str] = None  # "text" | "token ids"
    tokenizer: Optional[str] = None
    prefix_len: Optional[int] = None


class BenchEnvironment(_Section):
    python: Optional[str] = None
    platform: Optional[str] = None
    host: Optional[str] = None
    http_client: Optional[str] = None


class BenchmarkReport(RunFile):
    state: str  # RunState
    success: bool = False
    framework: Optional[str] = None
    model: Optional[str] = None
    run_kind: Optional[str] = None
    profiling_enabled: Optional[bool] = None
    reward_eligible: Optional[bool] = None
    workspace_dir: Optional[str] = None
    overrides: list[dict[str, Any]] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    envs: dict[str, Any] = Field(default_factory=dict)
    dataset: Optional[BenchDataset] = None
    environment: Optional[BenchEnvironment] = None
    server: Optional[dict[str, Any]] = None
    result: Optional[BenchResult] = None  # the first run of the first point
    throughput: Optional[dict[str, Any]] = None
    latency: Optional[dict[str, Any]] = None
    repeats: Optional[dict[str, RepeatStat]] = None  # the first point's repeats (None with one run)
    sweep: Optional[list[SweepPoint]] = None  # None without a sweep
    # Repeats a cancel or the server's exit cut short, left out of the statistics: point, repeat,
    # repeats planned, requests completed and failed in it, why.
    repeats_cut: Optional[list[dict[str, Any]]] = None
    kernel_summary: list[dict[str, Any]] = Field(default_factory=list)
    top_bottlenecks: list[str] = Field(default_factory=list)
    gap_analysis: Optional[dict[str, Any]] = None
    tracelens_analysis: Optional[dict[str, Any]] = None
    provenance: Optional[dict[str, Any]] = None  # engine.runs.provenance (framework, model revision, image)
    execution_time: Optional[float] = None


# ----------------------------------------------------------------------------- trace analysis report

class TraceAnalysisReport(RunFile):
    mode: str = "trace_analysis"
    target: str
    state: str  # RunState
    error: Optional[str] = None  # set when the analysis failed before any section
    workspace_dir: Optional[str] = None
    gap_analysis: Optional[dict[str, Any]] = None
    tracelens_analysis: Optional[dict[str, Any]] = None
    options: Optional[dict[str, Any]] = None
    provenance: Optional[dict[str, Any]] = None  # engine.runs.provenance
    elapsed_s: Optional[float] = None
    stage_times_s: Optional[dict[str, float]] = None  # wall-clock seconds by stage (engine.trace.analyze.StageTimes)


# ----------------------------------------------------------------------------- trace diff report

class TraceDiffReport(RunFile):
    """``magpie benchmark --trace-diff A B`` (engine.trace.diff): rows are dicts with ``name``,
    ``stack``, ``status`` and per metric ``{a, b, delta, pct}``."""
    mode: str = "trace_diff"
    state: str  # RunState
    a: dict[str, Any]  # the trace compared on each side: path (and once read: events, basis, arch, ops, kernels)
    b: dict[str, Any]
    error: Optional[str] = None  # set when the traces could not be read or compared
    basis: Optional[str] = None  # gpu (GPU-event time) or cpu (CPU time: traces without GPU events)
    totals: Optional[dict[str, Any]] = None
    ops: Optional[dict[str, Any]] = None  # movers, only_a, only_b, rows, unchanged
    kernels: Optional[dict[str, Any]] = None
    gpu_timeline: Optional[list[dict[str, Any]]] = None
    provenance: Optional[dict[str, Any]] = None
    elapsed_s: Optional[float] = None


Report = Union[AnalyzeReport, CompareReport, BenchmarkReport, TraceAnalysisReport, TraceDiffReport]
REPORT_MODELS: Final[dict[str, type[RunFile]]] = {
    ANALYZE_REPORT: AnalyzeReport, COMPARE_REPORT: CompareReport, BENCHMARK_REPORT: BenchmarkReport,
    TRACE_ANALYSIS_REPORT: TraceAnalysisReport, TRACE_DIFF_REPORT: TraceDiffReport,
}


class RunFileError(ValueError):
    """A run file that cannot be read or does not match its model; the message names the
    file and each failing field."""


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def parse_report(name: str, data: Any) -> Report:
    """The model for report file ``name`` (a file name in :data:`REPORT_FILES`) validated from ``data``."""
    model = REPORT_MODELS.get(Path(name).name)
    if model is None:
        raise RunFileError(f"{name}: not a report file (known: {', '.join(REPORT_FILES)})")
    if not isinstance(data, dict):
        raise RunFileError(f"{name}: a report is a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)  # type: ignore[return-value]
    except ValidationError as exc:
        raise RunFileError(f"{name}: {_describe(exc)}") from None


def load_report(path: Path | str) -> Report:
    """Read a report file, picking its model by file name."""
    path = Path(path)
    if path.name not in REPORT_MODELS:
        raise RunFileError(f"{path}: not a report file (known: {', '.join(REPORT_FILES)})")
    try:
        from engine.safeio import read_json
        data = read_json(path)  # a regular file under the report size cap: never a FIFO's wait
    except (OSError, ValueError) as exc:
        raise RunFileError(f"{path}: cannot read the report ({exc})") from None
    try:
        return parse_report(path.name, data)
    except RunFileError as exc:
        raise RunFileError(f"{path.parent}/{exc}") from None

"""Benchmark config YAML (Magpie's ``benchmark:`` format, magpie-reference §5) as pydantic models.

Every key keeps Magpie's meaning: ``envs.RANDOM_RANGE_RATIO`` bounds lengths to [L*r, L] as
Magpie's InferenceX client draws them (vLLM's own spread is ``client.vllm_range_ratio``);
``EXTRA_VLLM_ARGS`` / ``EXTRA_SGLANG_ARGS`` / ``EXTRA_ATOM_ARGS`` go on the server's command line and
every other ``envs`` entry into its environment, as Magpie's scripts export them; with no
``run_mode`` a vLLM / SGLang / ATOM server runs in docker (Magpie's default); ``run_mode: ray`` runs
the point as a Ray task; ``server_lifecycle`` keeps a server for the next run.

Differences from Magpie, on purpose, each said when it applies: ``framework`` is required (Magpie
silently picks SGLang); the torch profiler is off unless asked for (Magpie turns it on when
``profiler`` is omitted: a warning says so); keys this tool does not act on are errors or listed
warnings, never silently dropped; command-line flags override the YAML and every override is
recorded (``apply_cli_overrides``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from engine.cluster.settings import MagpieRayConfig
from engine.config.yamlfile import (
    ConfigError, LocatedYaml, expand_env_vars, format_loc, load_located_yaml, validate_located,
)

FRAMEWORKS = ("vllm", "sglang", "atom", "builtin")
STAGES = ("prefilldecode", "decode_only", "prefill_only")
_STAGE_ALIASES = {"pd": "prefilldecode", "mixed": "prefilldecode", "prefill_decode": "prefilldecode",
                  "decode": "decode_only", "prefill": "prefill_only"}
# Magpie's defaults when `envs` is empty, plus NUM_PROMPTS = CONC x 10 when absent.
DEFAULT_ENVS = {"TP": "1", "CONC": "32", "ISL": "1024", "OSL": "512", "RANDOM_RANGE_RATIO": "0.5"}

# Every `envs` value the benchmark reads: (type, lowest, lowest allowed?, highest, highest allowed?, what it is).
_ENV_RULES: dict[str, tuple[type, float, bool, Optional[float], bool, str]] = {
    "TP": (int, 1, True, None, True, "tensor-parallel size"),
    "CONC": (int, 1, True, None, True, "the client's max concurrency"),
    "ISL": (int, 1, True, None, True, "input tokens per request"),
    "OSL": (int, 1, True, None, True, "output tokens per request"),
    "NUM_PROMPTS": (int, 1, True, None, True, "requests per run"),
    "MAX_MODEL_LEN": (int, 1, True, None, True, "the server's context length"),
    "VOCAB_SIZE": (int, 1, True, None, True, "the model's vocabulary size"),
    "PORT": (int, 1, True, 65535, True, "the server's port"),
    # Magpie's meaning (InferenceX's benchmark_serving): lengths from [L*r, L]; 1 = fixed length.
    "RANDOM_RANGE_RATIO": (float, 0, True, 1, True, "Magpie's length ratio (lengths drawn from [L*r, L]; "
                                                    "1 = fixed)"),
    "GPU_MEMORY_UTILIZATION": (float, 0, False, 1, True, "the share of GPU memory the server may take"),
}


# Magpie's EXTRA_<FRAMEWORK>_ARGS: appended to that framework's server command line.
EXTRA_ARGS_KEYS = {"vllm": "EXTRA_VLLM_ARGS", "sglang": "EXTRA_SGLANG_ARGS", "atom": "EXTRA_ATOM_ARGS"}

# `envs` keys only the client reads (a server kept by server_lifecycle serves any of their values).
CLIENT_ENV_KEYS = frozenset({"CONC", "ISL", "OSL", "NUM_PROMPTS", "RANDOM_RANGE_RATIO", "REQUEST_RATE", "SEED",
                             "VOCAB_SIZE"})

# `envs` keys Magpie's scripts read that mean something other than "export to the server":
# what happens to them here. Every other key is exported to the server's environment.
MAGPIE_ENV_NOTES = {
    "ENABLE_PROFILE": "no Magpie script reads it (docs only); profiling is profiler.torch_profiler.enabled",
    "ENABLE_PROFILIER": "no Magpie script reads it; profiling is profiler.torch_profiler.enabled",
    "GPU_MEM_UTIL": "Magpie's scripts read GPU_MEMORY_UTILIZATION (its docs misspell it); rename the key",
    "TL_EXTENSION": "TraceLens extensions are Magpie's TraceLens runtime; the reports here are built in",
    "MAGPIE_BENCHMARK_BACKEND": "the client's API comes from client.endpoint (completions or chat)",
    "REQUEST_RATE": "the client's rate: client.request_rate (--request-rate), set from it",
    "SEED": "the dataset's seed: client.seed (--seed), set from it",
}
_MAGPIE_ENV_REFUSED = {
    "RUN_EVAL": "the lm-eval accuracy gate (RUN_EVAL) is not provided: remove it, or run lm-eval on its own",
}


def env_problem(key: str, value: str) -> Optional[str]:
    """What is wrong with ``envs.KEY: value`` (None when it is fine, or a key the benchmark does not read)."""
    rule = _ENV_RULES.get(key.upper())
    if rule is None:
        return None
    kind, lo, lo_ok, hi, hi_ok, what = rule
    allowed = f"{'an integer' if kind is int else 'a number'} {'>=' if lo_ok else '>'} {lo:g}"
    if hi is not None:
        allowed = f"a number in {'[' if lo_ok else '('}{lo:g}, {hi:g}{']' if hi_ok else ')'}"
    text = str(value).strip()
    try:
        num = int(text) if kind is int else float(text)
    except ValueError:
        num = None
    if num is None or num != num or (num < lo if lo_ok else num <= lo) or \
            (hi is not None and (num > hi if hi_ok else num >= hi)):
        return f"{what}: expected {allowed}, got {value!r}"
    return None


def _envs_problems(doc: LocatedYaml) -> list[str]:
    """file:line problems of the raw ``benchmark.envs`` values (after ``$VAR`` expansion)."""
    bench = doc.data.get("benchmark") if isinstance(doc.data, dict) else None
    raw = bench.get("envs") if isinstance(bench, dict) else None
    if not isinstance(raw, dict):
        return []
    out = []
    for key, value in expand_env_vars(raw).items():
        problem = env_problem(str(key), "" if value is None else str(value))
        if problem:
            out.append(f"{doc.where(('benchmark', 'envs', key))}: benchmark.envs.{str(key).upper()}: {problem}")
    return out


def _line_key(problem: str) -> int:
    parts = problem.split(":", 2)
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TorchProfiler(_Strict):
    enabled: bool = False
    num_steps: Optional[int] = Field(default=None, ge=1)
    num_profiles: int = Field(default=1, ge=1)
    start_seconds: float = Field(default=0.0, ge=0)
    interval_seconds: float = Field(default=0.0, ge=0)
    detailed_annotations: bool = True
    # The built-in server only: name each registry kernel's call site in the trace (what the
    # optimization loop maps bottlenecks with; decode steps then run eagerly while profiling).
    # false: the steps run as served (CUDA graphs, overlap), for the GPU timeline as measured.
    kernel_sites: bool = True
    record_shapes: bool = True
    with_stack: bool = False
    capture_timeout_seconds: float = Field(default=600.0, gt=0)
    flush_timeout_seconds: float = Field(default=600.0, gt=0)


class SystemProfiler(_Strict):
    enabled: bool = False
    profile_args: list[str] = Field(default_factory=list)




class TraceLensSettings(_Strict):
    enabled: bool = False
    analysis_mode: Literal["inference", "pytorch"] = "inference"
    analysis_stages: list[str] = Field(default_factory=lambda: list(STAGES))
    num_steps: int = Field(default=32, ge=1)
    export_format: Literal["csv"] = "csv"
    gpu_arch_config: Optional[str] = None
    perf_report_enabled: bool = True
    # Magpie's TraceLens-runtime knobs: accepted, they have no meaning here (no TraceLens install,
    # no runtime patching), and the report lists them as ignored.
    cli_timeout_seconds: Optional[float] = None
    auto_patch_runtime: Optional[bool] = None
    tracelens_repo_path: Optional[str] = None
    extension_wheel_path: Optional[str] = None
    runtime_patch_image_tag: Optional[str] = None
    runtime_patch_force_rebuild: Optional[bool] = None
    restore_patches: Optional[bool] = None
    multi_rank_report_enabled: Optional[bool] = None
    export_csv: Optional[bool] = None
    export_excel: Optional[bool] = None

    @field_validator("analysis_mode", mode="before")
    @classmethod
    def _classic(cls, v: Any) -> Any:
        return "pytorch" if v == "classic" else v

    @field_validator("analysis_stages", mode="before")
    @classmethod
    def _stages(cls, v: Any) -> Any:
        if v is None or v == "all":
            return list(STAGES)
        items = [s.strip() for s in v.split(",")] if isinstance(v, str) else v
        if not isinstance(items, list):
            raise ValueError("expected 'all', a comma list or a list of stages")
        out = []
        for s in items:
            s = _STAGE_ALIASES.get(str(s).strip().lower(), str(s).strip().lower())
            if s not in STAGES:
                raise ValueError(f"unknown stage {s!r}; expected {', '.join(STAGES)} (or all)")
            out.append(s)
        return out

    @field_validator("export_format", mode="before")
    @classmethod
    def _csv_only(cls, v: Any) -> Any:
        if v == "excel":
            raise ValueError("export_format 'excel' is not provided; the reports are CSV files")
        return v

    def ignored(self) -> list[str]:
        knobs = ("cli_timeout_seconds", "auto_patch_runtime", "tracelens_repo_path", "extension_wheel_path",
                 "runtime_patch_image_tag", "runtime_patch_force_rebuild", "restore_patches",
                 "multi_rank_report_enabled", "export_csv", "export_excel")
        return [k for k in knobs if getattr(self, k) is not None]


class GpuMonitor(_Strict):
    enabled: bool = True
    interval_sec: float = Field(default=2.0, gt=0)
    device_id: Optional[int] = None


class Profiler(_Strict):
    torch_profiler: TorchProfiler = Field(default_factory=TorchProfiler)
    system_profiler: SystemProfiler = Field(default_factory=SystemProfiler)
    tracelens: TraceLensSettings = Field(default_factory=TraceLensSettings)
    gpu_monitor: GpuMonitor = Field(default_factory=GpuMonitor)
    targeted_trace: Optional[dict] = None

    @model_validator(mode="after")
    def _needs_traces(self) -> "Profiler":
        if self.tracelens.enabled and not self.torch_profiler.enabled:
            raise ValueError("tracelens.enabled needs torch traces: set profiler.torch_profiler.enabled: true")
        if self.targeted_trace and self.targeted_trace.get("enabled"):
            raise ValueError("targeted_trace is not provided; use torch_profiler + tracelens + gap_analysis")
        return self


class GapAnalysis(_Strict):
    enabled: bool = False
    trace_start_pct: float = Field(default=0.0, ge=0, le=100)
    trace_end_pct: float = Field(default=100.0, ge=0, le=100)
    top_k: int = Field(default=20, ge=1)
    min_duration_us: float = Field(default=0.0, ge=0)
    categories: list[str] = Field(default_factory=lambda: ["kernel", "gpu"])
    ignore_categories: list[str] = Field(default_factory=lambda: ["gpu_user_annotation", "user_annotation"])
    find_kernel_sources: bool = False
    kernel_source_repos: list[str] = Field(default_factory=list)
    auto_clone_repos: bool = False  # Magpie's default is true; this tool never clones (a warning says so)
    repos_base_dir: Optional[str] = None

    @model_validator(mode="after")
    def _check(self) -> "GapAnalysis":
        if self.trace_start_pct >= self.trace_end_pct:
            raise ValueError(f"trace_start_pct ({self.trace_start_pct}) must be below trace_end_pct "
                             f"({self.trace_end_pct})")
        return self

    def magpie_notes(self) -> list[tuple[str, str]]:
        """(field, what happens) for Magpie's source-finding keys this tool reads differently:
        it never clones, so without local checkouts the source columns are left out."""
        out = []
        if self.auto_clone_repos:
            out.append(("gap_analysis.auto_clone_repos", "this tool never clones repositories; list local "
                        "checkouts in gap_analysis.kernel_source_repos"))
        if self.find_kernel_sources and not self.kernel_source_repos:
            out.append(("gap_analysis.find_kernel_sources", "no gap_analysis.kernel_source_repos (local checkouts) "
                        "given, and nothing is cloned: the source columns are left out"))
        return out


class GpuSelection(_Strict):
    auto: bool = True
    min_free_memory_gb: float = Field(default=8.0, ge=0)
    count: Optional[int] = Field(default=None, ge=1)
    candidates: Optional[list[int]] = None


class ServerLifecycle(_Strict):
    """Magpie's server reuse: with ``enabled``, one server serves every point and repeat of a run;
    ``cleanup: false`` leaves it running after the run (recorded in ``pid_dir``), and the next run
    with the same server settings uses it instead of starting one (``force_reuse``: even when the
    settings differ); ``cleanup: true`` stops it (also one left by an earlier run) at the end."""
    enabled: bool = False
    cleanup: bool = True
    force_reuse: bool = False
    pid_dir: Optional[str] = None
    server_ready_timeout_s: float = Field(default=2700.0, gt=0)


class BenchmarkRayConfig(MagpieRayConfig):
    """Magpie's ``ray_config`` of a ``run_mode: ray`` benchmark: the point runs as a Ray task."""

    @model_validator(mode="after")
    def _single_node(self) -> "BenchmarkRayConfig":
        if self.multi_node or (self.num_nodes or 1) > 1:
            raise ValueError("multi-node serving (one server over several Ray nodes) is not provided: a point runs "
                             "on one node, holding TP GPUs; remove multi_node / num_nodes")
        return self

    def notes(self) -> list[tuple[str, str]]:
        return self.unmapped("the point's task holds TP GPUs (envs.TP) on its node")


class BuiltinServer(_Strict):
    """Ours: the built-in reference server (framework ``builtin``)."""
    size: str = "tiny"
    max_batch: int = Field(default=64, ge=1)
    kernels: dict[str, str] = Field(default_factory=dict)
    seed: int = 0
    # No CUDA graphs: every decode step runs eagerly (on the CPU it always does).
    eager: bool = False
    # Batch sizes decode steps are padded to and captured at; none: 1, 2, 4, ... up to max_batch.
    cuda_graph_batch_sizes: Optional[list[int]] = None
    # Prompt + output cap and the length of each KV-cache slot; none: the model's max_seq_len.
    max_model_len: Optional[int] = Field(default=None, ge=16)
    # Prefix caching (on by default, as in vLLM); false starts the server with --no-enable-prefix-caching.
    prefix_caching: bool = True

    @field_validator("size")
    @classmethod
    def _known_size(cls, v: str) -> str:
        from engine.serve.shapes import PRESETS  # no torch: the presets are plain shapes
        if v not in PRESETS:
            raise ValueError(f"unknown built-in model size {v!r}; one of {', '.join(PRESETS)}")
        return v

    @field_validator("cuda_graph_batch_sizes")
    @classmethod
    def _graph_sizes(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if v is not None and (not v or min(v) < 1):
            raise ValueError("cuda_graph_batch_sizes: give positive batch sizes, e.g. [1, 2, 4, 8, 16, 32, 64]")
        return v

    @model_validator(mode="after")
    def _graph_sizes_fit(self) -> "BuiltinServer":
        if self.cuda_graph_batch_sizes and max(self.cuda_graph_batch_sizes) > self.max_batch:
            raise ValueError(f"cuda_graph_batch_sizes: {max(self.cuda_graph_batch_sizes)} is above max_batch "
                             f"{self.max_batch}; a step never has more sequences than that")
        return self

    def server_flags(self) -> list[str]:
        """The ``python -m engine.serve`` flags of these settings beyond size and max_batch."""
        flags = ["--seed", str(self.seed)] if self.seed else []
        if self.eager:
            flags.append("--eager")
        if self.cuda_graph_batch_sizes:
            flags += ["--cuda-graph-batch-sizes", ",".join(str(b) for b in sorted(set(self.cuda_graph_batch_sizes)))]
        if self.max_model_len is not None:
            flags += ["--max-model-len", str(self.max_model_len)]
        if not self.prefix_caching:
            flags.append("--no-enable-prefix-caching")
        return flags


class Client(_Strict):
    """Ours: the load generator beyond Magpie's envs."""
    endpoint: Literal["completions", "chat"] = "completions"
    request_rate: Optional[float] = Field(default=None, gt=0, description="requests/s; none = all at once")
    burstiness: float = Field(default=1.0, gt=0)
    warmup: int = Field(default=2, ge=0)
    repeats: int = Field(default=1, ge=1)
    seed: int = 0
    base_url: Optional[str] = None
    sweep: dict[str, list[Union[int, float]]] = Field(default_factory=dict)
    goodput: dict[str, float] = Field(default_factory=dict)
    # lean: our asyncio-Protocol client, which stamps each read where it arrives; aiohttp: the
    # client library vLLM's benchmark uses (a cross-check, or for servers behind what lean lacks).
    http_client: Literal["lean", "aiohttp"] = "lean"
    # auto: for the lean client asyncio's own loop where its turn runs in C (engine._streamread),
    # else uvloop where installed (a dependency where it installs), else asyncio's own loop.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # Client processes sharing the load on one clock, results merged (engine.bench.client_procs):
    # for loads one process cannot stamp in time. Each gets a share of the concurrency.
    client_procs: int = Field(default=1, ge=1)
    # Text prompts through this tokenizer (a Hugging Face name or folder, or "builtin"), as
    # `vllm bench serve` sends them; unset: the model's, as vLLM defaults it (token ids for the
    # built-in server's completions); "none": token-id prompts (the chat endpoint needs text).
    tokenizer: Optional[str] = None
    # The model's vocabulary size, for token-id prompts when no tokenizer loads (ids stay below it).
    vocab_size: Optional[int] = Field(default=None, ge=1)
    # A shared prefix of this many tokens in front of every prompt (vLLM's --random-prefix-len).
    prefix_len: int = Field(default=0, ge=0)
    # vLLM's own --random-range-ratio (lengths from [L*(1-r), L*(1+r)]), instead of Magpie's
    # envs.RANDOM_RANGE_RATIO ([L*r, L]): the same word means two different spreads.
    vllm_range_ratio: Optional[float] = Field(default=None, ge=0, lt=1, description=(
        "vLLM's --random-range-ratio: lengths drawn from [L*(1-r), L*(1+r)]; replaces envs.RANDOM_RANGE_RATIO "
        "(Magpie's [L*r, L])"))
    # vLLM's --dataset-name / --dataset-path: random (ISL/OSL), custom (JSONL), sharegpt (JSON);
    # multi-turn sessions (engine.bench.sessions): mooncake (AIPerf's trace JSONL), sessions
    # (synthetic), sharegpt with multi_turn (whole conversations).
    dataset_name: Literal["random", "custom", "sharegpt", "mooncake", "sessions"] = "random"
    dataset_path: Optional[str] = None
    custom_output_len: Optional[int] = Field(default=None, ge=1)
    sharegpt_output_len: Optional[int] = Field(default=None, ge=1)
    # Session replay (mooncake, sessions, sharegpt + multi_turn; engine.bench.session_replay):
    # closed loop (a turn after the previous answer plus its delay), open loop (at the recorded
    # timestamps), auto (open when the trace has timestamps); the session-affinity header; the
    # mooncake hash_ids block size; the synthetic sessions' shape (per turn: ISL new tokens, OSL
    # answer tokens); num_sessions (default: CONC) also caps the sessions of a file.
    multi_turn: bool = False
    session_mode: Literal["auto", "closed", "open"] = "auto"
    session_header: str = "X-Session-ID"
    session_block_size: int = Field(default=512, ge=1)
    num_sessions: Optional[int] = Field(default=None, ge=1)
    session_turns: int = Field(default=4, ge=1)
    system_prompt_len: int = Field(default=0, ge=0)
    session_delay: float = Field(default=0.0, ge=0)
    subagents: int = Field(default=0, ge=0)
    # A run bounded by time: requests are sent (the dataset cycled) for this many seconds; those
    # started in the first warmup_seconds or the last cooldown_seconds are not measured.
    duration: Optional[float] = Field(default=None, gt=0)
    warmup_seconds: float = Field(default=0.0, ge=0)
    cooldown_seconds: float = Field(default=0.0, ge=0)
    # SLO capacity search: the highest load whose goodput (share of requests meeting every SLO, in
    # ms: ttft, tpot, e2el) reaches goodput_target, searched over capacity_over (engine.bench.capacity).
    find_capacity: dict[str, float] = Field(default_factory=dict)
    goodput_target: float = Field(default=0.9, gt=0, le=1)
    capacity_over: Literal["concurrency", "request_rate"] = "concurrency"
    capacity_max: Optional[float] = Field(default=None, gt=0, description="highest level tried (default 1024 "
                                          "concurrent requests, or 1024 requests/s)")
    capacity_steps: int = Field(default=10, ge=2, description="most levels tried (the margin search: most runs, "
                                "replicates included)")
    capacity_search: Literal["margin", "bisect"] = Field(
        default="margin", description="margin: the next level where the SLO margins' line crosses 1, the "
                                      "bracket's ends and undecided levels run again; bisect: doubled, then bisected "
                                      "on pass/fail alone")
    # search: each level a run of its own (the client restarted), doubled then bisected; ramp: one
    # continuous run (engine.bench.ramp) whose level changes window by window, judged by the same
    # SLOs, then held at the highest passing level for ramp_hold seconds (measured in windows, with
    # a 95% interval across them).
    capacity_mode: Literal["search", "ramp"] = "search"
    ramp_window: float = Field(default=10.0, gt=0, description="seconds of load a ramp level is judged over")
    ramp_min_requests: int = Field(default=10, ge=1, description="requests a ramp window needs at least")
    ramp_hold: float = Field(default=30.0, ge=0, description="seconds held at the highest passing level")
    # Empty the server's prefix cache before each load point (vLLM POST /reset_prefix_cache, SGLang
    # POST /flush_cache, the built-in server's /reset_prefix_cache), so that no point inherits the
    # cache of the one before it. None: on for sweeps and capacity searches, off for one point.
    reset_prefix_cache: Optional[bool] = None

    @field_validator("sweep")
    @classmethod
    def _sweep_keys(cls, v: dict) -> dict:
        known = {"concurrency", "input_len", "output_len", "request_rate"}
        bad = [k for k in v if k not in known]
        if bad:
            raise ValueError(f"cannot sweep {', '.join(bad)}; sweepable: {', '.join(sorted(known))}")
        return v

    @model_validator(mode="after")
    def _dataset_and_windows(self) -> "Client":
        if self.dataset_name not in ("random", "sessions") and not self.dataset_path:
            raise ValueError(f"dataset_name {self.dataset_name} needs dataset_path (--dataset-path FILE)")
        if self.dataset_name in ("random", "sessions") and self.dataset_path:
            raise ValueError(f"dataset_path is for dataset_name custom, sharegpt or mooncake (--dataset-name); the "
                             f"{self.dataset_name} dataset has no file")
        if self.multi_turn and self.dataset_name != "sharegpt":
            raise ValueError("multi_turn (--multi-turn) replays ShareGPT conversations as sessions: it needs "
                             "dataset_name sharegpt")
        if self.dataset_path and not Path(self.dataset_path).expanduser().is_file():
            raise ValueError(f"dataset_path {self.dataset_path}: no such file")
        if (self.warmup_seconds or self.cooldown_seconds) and self.duration is None:
            raise ValueError("warmup_seconds / cooldown_seconds need a duration-bounded run (duration, --duration S)")
        if self.duration is not None and self.warmup_seconds + self.cooldown_seconds >= self.duration:
            raise ValueError(f"warmup_seconds + cooldown_seconds ({self.warmup_seconds + self.cooldown_seconds:g}) "
                             f"leave nothing of duration {self.duration:g} s to measure")
        if self.event_loop == "uvloop":
            import importlib.util
            if importlib.util.find_spec("uvloop") is None:
                raise ValueError("event_loop uvloop: it is not installed (pip install uvloop), "
                                 "or use auto")
        if self.find_capacity:
            if self.sweep:
                raise ValueError("find_capacity chooses the levels itself: remove sweep")
            if self.duration is not None:
                raise ValueError("find_capacity runs a fixed number of requests per level: remove duration")
            if self.capacity_mode == "ramp" and self.client_procs > 1:
                raise ValueError("capacity_mode ramp is one continuous load in one client process: remove "
                                 "client_procs")
            if self.capacity_mode == "ramp" and (self.multi_turn or self.dataset_name in ("mooncake", "sessions")):
                raise ValueError("capacity_mode ramp sends single requests: multi-turn session replays need "
                                 "capacity_mode search")
            if self.capacity_mode == "ramp" and self.repeats > 1:
                raise ValueError("capacity_mode ramp measures its hold in windows, with an interval across them: "
                                 "remove repeats")
        return self

    @field_validator("find_capacity")
    @classmethod
    def _capacity_slos(cls, v: dict) -> dict:
        bad = [k for k in v if k not in ("ttft", "tpot", "e2el")]
        if bad:
            raise ValueError(f"find_capacity SLOs are ttft, tpot and e2el (in ms); unknown: {', '.join(bad)}")
        if any(ms <= 0 for ms in v.values()):
            raise ValueError("find_capacity SLOs must be > 0 ms, e.g. --find-capacity ttft:500 tpot:50")
        return v

    @field_validator("goodput")
    @classmethod
    def _goodput_keys(cls, v: dict) -> dict:
        # Checked here, not when the metrics are computed: a typo must not cost a server start.
        bad = [k for k in v if k not in ("ttft", "tpot", "e2el")]
        if bad:
            raise ValueError(f"goodput SLOs are ttft, tpot and e2el (in ms); unknown: {', '.join(bad)}")
        negative = [k for k, ms in v.items() if ms < 0]
        if negative:
            raise ValueError(f"goodput SLOs must be >= 0 ms: {', '.join(negative)}")
        return v


class BenchmarkConfig(_Strict):
    framework: Literal["vllm", "sglang", "atom", "builtin"]
    model: str = ""
    precision: str = "bf16"
    # None: Magpie's default (docker for vllm / sglang / atom; the built-in server runs here).
    run_mode: Optional[Literal["docker", "local", "ray"]] = None
    run_kind: Literal["auto", "measurement", "diagnostic"] = "auto"
    envs: dict[str, str] = Field(default_factory=dict)
    docker_image: Optional[str] = None
    gpu_arch: Optional[str] = None
    runner_type: Optional[str] = None
    timeout_seconds: float = Field(default=3600.0, gt=0)
    hf_cache_path: Optional[str] = None
    server_args: list[str] = Field(default_factory=list, description="ours: extra server command-line args")
    server_env: dict[str, str] = Field(default_factory=dict, description=(
        "ours: environment variables of the server process, over the inherited ones (local) or passed with "
        "the container's environment (docker); e.g. the loop's vLLM plugin: PYTHONPATH, VLLM_PLUGINS"))
    profiler: Profiler = Field(default_factory=Profiler)
    gap_analysis: GapAnalysis = Field(default_factory=GapAnalysis)
    gpu_selection: GpuSelection = Field(default_factory=GpuSelection)
    server_lifecycle: ServerLifecycle = Field(default_factory=ServerLifecycle)
    server: BuiltinServer = Field(default_factory=BuiltinServer)
    client: Client = Field(default_factory=Client)
    # Magpie keys for its InferenceX scripts / Ray / lm-eval paths, which this tool does not have.
    benchmark_script: Optional[str] = None
    inferencex_path: Optional[str] = Field(default=None, alias="inferencemax_path")
    ray_config: Optional[BenchmarkRayConfig] = None
    lm_eval_runtime: Optional[dict] = None
    run_cmd: Optional[str] = None
    # Magpie's agentic-coding benchmark (AgentX); named so the error can say why.
    agentx: Optional[Any] = None

    @model_validator(mode="before")
    @classmethod
    def _magpie_default_framework(cls, data: Any) -> Any:
        """Magpie runs SGLang when a benchmark YAML names no framework; so does this tool, and the
        file's notes say so (``magpie_file_notes``)."""
        if isinstance(data, dict) and data.get("framework") in (None, ""):
            return {**data, "framework": "sglang"}
        return data

    @field_validator("framework", mode="before")
    @classmethod
    def _framework(cls, v: Any) -> Any:
        if v == "xdit":
            raise ValueError("framework 'xdit' (offline diffusion) is not provided; use vllm, sglang, atom or builtin")
        return v.strip().lower() if isinstance(v, str) else v

    @model_validator(mode="before")
    @classmethod
    def _magpie_client_envs(cls, data: Any) -> Any:
        """Magpie's client-only envs: BENCHMARK_BASE_URL (a server that is already running) and
        MAGPIE_BENCHMARK_ENDPOINT /v1/chat/completions (the chat API) set the client's fields."""
        if not isinstance(data, dict) or not isinstance(data.get("envs"), dict):
            return data
        envs = {str(k).upper(): v for k, v in data["envs"].items()}
        client = dict(data.get("client") or {}) if isinstance(data.get("client") or {}, dict) else data.get("client")
        if not isinstance(client, dict):
            return data
        url = envs.get("BENCHMARK_BASE_URL")
        if url and not client.get("base_url"):
            client["base_url"] = str(url)
        endpoint = str(envs.get("MAGPIE_BENCHMARK_ENDPOINT") or "").strip()
        if endpoint and not client.get("endpoint"):
            client["endpoint"] = "chat" if endpoint.rstrip("/").endswith("chat/completions") else "completions"
        # Newer Magpie scripts read the client's rate and seed from envs too.
        rate = str(envs.get("REQUEST_RATE") or "").strip().lower()
        if rate and rate != "inf" and client.get("request_rate") is None:
            client["request_rate"] = rate
        if envs.get("SEED") not in (None, "") and client.get("seed") is None:
            client["seed"] = envs["SEED"]
        return {**data, "client": client} if client else data

    @field_validator("run_mode", mode="before")
    @classmethod
    def _run_mode(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) and v.strip() else (None if v == "" else v)

    @field_validator("agentx", mode="before")
    @classmethod
    def _agentx(cls, v: Any) -> Any:
        if v in (None, False, "disable", "disabled") or (isinstance(v, dict) and not v.get("enabled", True)):
            return None
        raise ValueError("the AgentX agentic-coding benchmark is not provided: remove agentx (serving points here "
                         "are random, custom-JSONL or ShareGPT prompts: client.dataset_name)")

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("expected a mapping of environment variables")
        return {str(k).upper(): ("" if val is None else str(val)) for k, val in v.items()}

    @field_validator("envs")
    @classmethod
    def _envs_values(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [f"envs.{k}: {p}" for k, p in ((k, env_problem(k, val)) for k, val in v.items()) if p]
        if bad:
            raise ValueError("; ".join(bad))
        return v

    @field_validator("server_env", mode="before")
    @classmethod
    def _server_env(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("expected a mapping of environment variable names to values")
        bad = [str(k) for k in v if not str(k) or "=" in str(k) or "\0" in str(k)]
        if bad:
            raise ValueError(f"not an environment variable name: {', '.join(map(repr, bad))}")
        return {str(k): ("" if val is None else str(val)) for k, val in v.items()}  # names keep their case

    @model_validator(mode="after")
    def _consistency(self) -> "BenchmarkConfig":
        if self.lm_eval_runtime:
            raise ValueError("lm_eval_runtime: the lm-eval accuracy gate is not provided; remove it")
        refused = [f"envs.{k}: {why}" for k, why in _MAGPIE_ENV_REFUSED.items()
                   if k in self.envs and str(self.envs[k]).strip().lower() not in ("", "0", "false", "no")]
        multimodal = sorted(k for k in self.envs if k.startswith("MM_"))
        if multimodal:
            refused.append(f"envs.{', '.join(multimodal)}: a multimodal load (images / video per request) is not "
                           "provided: the prompts here are text or token ids only, a different workload; remove the "
                           "MM_* keys to benchmark text")
        if refused:
            raise ValueError("; ".join(refused))
        if self.run_mode is None:
            # Magpie's default: docker; the built-in server and a server given by URL need none.
            self.run_mode = "local" if self.framework == "builtin" or self.client.base_url else "docker"
            self._run_mode_default = True
        if self.run_cmd:
            raise ValueError("run_cmd is for xDiT offline runs, which are not provided")
        if self.framework != "builtin" and not self.model:
            raise ValueError(f"framework {self.framework} needs a model (HF id or local path)")
        if self.run_kind == "measurement" and (self.profiler.torch_profiler.enabled or self.gap_analysis.enabled):
            raise ValueError("run_kind measurement excludes the torch profiler and gap analysis "
                             "(profiling perturbs latency): use run_kind diagnostic or auto")
        if self.client.endpoint == "chat" and not self.effective_tokenizer():
            raise ValueError("client.endpoint chat sends text messages: set client.tokenizer (--tokenizer) to the "
                             "model's tokenizer (a Hugging Face name or folder) so that the random prompts are text")
        cl = self.client
        if cl.find_capacity and cl.capacity_mode == "ramp" and cl.ramp_hold == 0 and self.profiler.torch_profiler.enabled:
            raise ValueError("a profiled capacity ramp profiles its hold at the knee: give client.ramp_hold > 0 "
                             "(--ramp-hold S)")
        if self.server_lifecycle.enabled and not self.server_lifecycle.cleanup and self.profiler.torch_profiler.enabled:
            raise ValueError("server_lifecycle reuse without cleanup cannot be combined with the torch profiler")
        self._check_client_procs()
        return self

    _run_mode_default: bool = PrivateAttr(default=False)

    def run_mode_why(self) -> str:
        """Why the run mode is what it is (the plan and the report say it)."""
        if not self._run_mode_default:
            return "given"
        if self.client.base_url:
            return "not given: the server at client.base_url is not started by this tool"
        if self.framework == "builtin":
            return "not given: the built-in server runs on this host"
        return "not given: docker, Magpie's default"

    def fixed_port(self) -> Optional[int]:
        """The server's port when the config fixes it (Magpie's envs.PORT), else None (a free one)."""
        return int(self.envs["PORT"]) if "PORT" in self.envs else None

    def extra_server_args(self) -> list[str]:
        """Magpie's EXTRA_<FRAMEWORK>_ARGS for this framework, split as a shell splits words."""
        key = EXTRA_ARGS_KEYS.get(self.framework)
        text = self.envs.get(key, "") if key else ""  # never one of the defaults
        return shlex.split(text) if text.strip() else []

    def server_environment(self) -> dict[str, str]:
        """The ``envs`` a Magpie script exports to its server: every key but the EXTRA_*_ARGS (which go on
        the command line) and those with another meaning here (MAGPIE_ENV_NOTES); then ``server_env``."""
        skip = set(EXTRA_ARGS_KEYS.values()) | set(MAGPIE_ENV_NOTES) | {"BENCHMARK_BASE_URL",
                                                                       "MAGPIE_BENCHMARK_ENDPOINT"}
        return {**{k: v for k, v in self.effective_envs().items() if k not in skip}, **self.server_env}

    def _check_client_procs(self) -> None:
        """Each client process holds at least one request at a time: no more processes than the
        concurrency (the capacity search runs a level below them on as many processes as it has)."""
        procs = self.client.client_procs
        if procs == 1 or (self.client.find_capacity and self.client.capacity_over == "concurrency"):
            return
        swept = self.client.sweep.get("concurrency")
        levels = [int(c) for c in swept] if swept else [self.workload().concurrency]
        if min(levels) < procs:
            where = "client.sweep.concurrency" if swept else "envs.CONC (--concurrency)"
            raise ValueError(f"client.client_procs {procs} (--client-procs) is above the concurrency {min(levels)} "
                             f"of {where}: each process needs at least one request at a time; give at most "
                             f"{min(levels)} processes")

    def effective_tokenizer(self) -> Optional[str]:
        """The tokenizer for text prompts, or None for token ids: the one named, else the model's
        (as `vllm bench serve` defaults it). The built-in server's chat endpoint gets its own byte
        tokenizer without being asked; its completions get token ids; ``none`` asks for token ids."""
        name = self.client.tokenizer
        if name:
            return None if name.strip().lower() == "none" else name
        if self.framework == "builtin":
            return "builtin" if self.client.endpoint == "chat" else None
        return self.model or None

    def tokenizer_is_default(self) -> bool:
        """True when the tokenizer is the model's because none was named (a fallback is allowed)."""
        return not self.client.tokenizer and self.framework != "builtin"

    def effective_run_kind(self) -> str:
        if self.run_kind != "auto":
            return self.run_kind
        diagnostic = self.profiler.torch_profiler.enabled or self.gap_analysis.enabled or self.profiler.tracelens.enabled
        return "diagnostic" if diagnostic else "measurement"

    def length_rule(self) -> tuple[str, float]:
        """How lengths are spread: ("magpie", envs.RANDOM_RANGE_RATIO) — [L*r, L] as Magpie's InferenceX
        client draws them — or ("vllm", client.vllm_range_ratio) — [L*(1-r), L*(1+r)]."""
        if self.client.vllm_range_ratio is not None:
            return "vllm", float(self.client.vllm_range_ratio)
        return "magpie", float(self.effective_envs()["RANDOM_RANGE_RATIO"])

    def length_bounds(self, isl: int, osl: int) -> dict[str, Any]:
        """The resolved inclusive length bounds of the random dataset (before special tokens), for the
        report, the terminal and the dry-run plan: the ratio alone is ambiguous."""
        from engine.bench.dataset import length_bounds
        rule, ratio = self.length_rule()
        (in_lo, in_hi), (out_lo, out_hi) = length_bounds(isl, osl, ratio, rule=rule)
        source = "client.vllm_range_ratio" if rule == "vllm" else "envs.RANDOM_RANGE_RATIO"
        return {"rule": rule, "ratio": ratio, "source": source, "input": [in_lo, in_hi], "output": [out_lo, out_hi]}

    def workload(self) -> "Workload":
        """The load Magpie's envs describe, typed: the run reads these numbers, never the strings
        (the strings stay in envs, as Magpie's YAML and config.yaml keep them)."""
        envs = self.effective_envs()
        return Workload(tp=int(envs["TP"]), concurrency=int(envs["CONC"]), input_len=int(envs["ISL"]),
                        output_len=int(envs["OSL"]), num_prompts=int(envs["NUM_PROMPTS"]),
                        range_ratio=float(envs["RANDOM_RANGE_RATIO"]))

    def effective_envs(self) -> dict[str, str]:
        envs = dict(DEFAULT_ENVS) if not self.envs else dict(self.envs)
        for k, v in DEFAULT_ENVS.items():
            envs.setdefault(k, v)
        envs.setdefault("NUM_PROMPTS", str(int(envs["CONC"]) * 10) if envs["CONC"].isdigit() else "320")
        return envs


@dataclass(frozen=True)
class Workload:
    """``BenchmarkConfig.workload()``: envs.TP, CONC, ISL, OSL, NUM_PROMPTS and RANDOM_RANGE_RATIO
    (defaults filled in), checked at load by ``env_problem`` and typed here once."""
    tp: int
    concurrency: int
    input_len: int
    output_len: int
    num_prompts: int
    range_ratio: float


class BenchmarkFile(_Strict):
    benchmark: BenchmarkConfig


def load_benchmark_config(path: Path | str, warnings: list[str] | None = None) -> tuple[BenchmarkConfig, LocatedYaml]:
    doc = load_located_yaml(path)
    if not isinstance(doc.data, dict) or "benchmark" not in doc.data:
        raise ConfigError([f"{doc.path}:1: expected a top-level 'benchmark:' mapping"])
    env_problems = _envs_problems(doc)
    if env_problems:
        # The rest of the file is still checked, so that every problem is listed at once.
        rest = {**doc.data, "benchmark": {k: v for k, v in doc.data["benchmark"].items() if k != "envs"}} \
            if isinstance(doc.data["benchmark"], dict) else doc.data
        others: list[str] = []
        try:
            validate_located(BenchmarkFile, LocatedYaml(doc.path, rest, doc._lines), None)
        except ConfigError as exc:
            others = exc.problems
        raise ConfigError(sorted(env_problems + others, key=_line_key))
    _check_range_ratio_names(doc)
    cfg = validate_located(BenchmarkFile, doc, warnings).benchmark
    if warnings is not None:
        warnings.extend(magpie_file_notes(cfg, doc))
    return cfg, doc


def _check_range_ratio_names(doc: LocatedYaml) -> None:
    """Magpie's RANDOM_RANGE_RATIO and vLLM's spread are two meanings of one word: not both at once."""
    bench = doc.data.get("benchmark") if isinstance(doc.data, dict) else None
    if not isinstance(bench, dict):
        return
    envs = bench.get("envs") if isinstance(bench.get("envs"), dict) else {}
    client = bench.get("client") if isinstance(bench.get("client"), dict) else {}
    if any(str(k).upper() == "RANDOM_RANGE_RATIO" for k in envs) and client.get("vllm_range_ratio") is not None:
        raise ConfigError([f"{doc.where(('benchmark', 'client', 'vllm_range_ratio'))}: benchmark.client.vllm_range_ratio "
                           "and benchmark.envs.RANDOM_RANGE_RATIO both set: they are two spreads of the lengths "
                           "(vLLM's [L*(1-r), L*(1+r)], Magpie's [L*r, L]); keep one"])


_SCRIPT_NOTE = ("this tool starts the server itself (no InferenceX / Magpie launch scripts); the script's own defaults "
                "are not applied (e.g. vLLM --gpu-memory-utilization 0.95 --max-model-len 4096 --trust-remote-code, "
                "SGLang --mem-fraction-static 0.8 --disable-radix-cache, ROCm AITER variables): give the ones you "
                "want in envs (MAX_MODEL_LEN, GPU_MEMORY_UTILIZATION, VLLM_ROCM_USE_AITER ...) or EXTRA_*_ARGS")


def magpie_file_notes(cfg: BenchmarkConfig, doc: LocatedYaml) -> list[str]:
    """What a Magpie benchmark YAML asks for that means something else here, each by name with
    what happens instead (file:line first). Nothing in the file is dropped without one of these."""
    bench = doc.data.get("benchmark") if isinstance(doc.data, dict) else {}
    bench = bench if isinstance(bench, dict) else {}
    out: list[str] = []

    def note(field: str, text: str) -> None:
        out.append(f"{doc.where(('benchmark',) + tuple(field.split('.')))}: benchmark.{field}: {text}")

    if bench.get("framework") in (None, ""):
        out.append(f"{doc.where(('benchmark',))}: benchmark.framework: not given: sglang, as Magpie defaults it; "
                   "name the framework to silence this")
    for key in ("benchmark_script", "inferencex_path", "runner_type"):
        if getattr(cfg, key):
            note(key, _SCRIPT_NOTE if key != "runner_type" else "InferenceX runner types are not used here")
    for k in cfg.profiler.tracelens.ignored():
        note(f"profiler.tracelens.{k}", "Magpie's TraceLens runtime setting; the reports here are built in, it has "
                                        "no effect")
    raw_envs = {str(k).upper(): k for k in (bench.get("envs") or {})} if isinstance(bench.get("envs"), dict) else {}
    for key, text in MAGPIE_ENV_NOTES.items():
        if key in cfg.envs:
            note(f"envs.{raw_envs.get(key, key)}", f"not exported to the server: {text}")
    for key in sorted(k for k in cfg.envs if k.startswith("MAGPIE_EVAL_")):
        note(f"envs.{raw_envs.get(key, key)}", "a setting of Magpie's lm-eval gate, which is not provided: exported "
                                              "to the server's environment, read by nothing here")
    if cfg.envs.get("MODEL_REVISION") and cfg.framework not in ("vllm", "sglang"):
        note(f"envs.{raw_envs.get('MODEL_REVISION', 'MODEL_REVISION')}",
             f"{cfg.framework} is not passed a revision here: the server loads what the hub or its cache holds")
    if "run_mode" not in bench and cfg.framework != "builtin" and not cfg.client.base_url:
        note("run_mode", "not given: docker, as Magpie defaults it (set run_mode: local to start the server on "
                         "this host)")
    for fw, key in EXTRA_ARGS_KEYS.items():
        if key in cfg.envs and fw != cfg.framework:
            note(f"envs.{raw_envs.get(key, key)}", f"for {fw} servers; this config runs {cfg.framework}: not used")
    if "profiler" not in bench and cfg.framework != "builtin":  # the built-in server is no Magpie framework
        note("profiler", "not given: Magpie turns the torch profiler on when the block is omitted; here it stays off "
                         "(a measurement run): set profiler.torch_profiler.enabled: true to profile")
    elif cfg.profiler.system_profiler.enabled:
        note("profiler.system_profiler.enabled", "Magpie never ran a system profiler (no code path); nothing runs here "
                                                 "either: use profiler.torch_profiler for traces")
    for field, text in cfg.gap_analysis.magpie_notes():
        note(field, text)
    if cfg.ray_config is not None:
        if cfg.run_mode != "ray":
            note("ray_config", f"used with run_mode: ray; this run's mode is {cfg.run_mode}")
        for field, text in cfg.ray_config.notes():
            note(field, text)
    if cfg.server_lifecycle.pid_dir and not cfg.server_lifecycle.enabled:
        note("server_lifecycle.pid_dir", "used only with server_lifecycle.enabled: true")
    return out


# A profile with no step bound records the whole run: millions of events and minutes of export.
DEFAULT_PROFILE_STEPS = 64


def resolve_defaults(cfg: BenchmarkConfig) -> list[str]:
    """Settings filled in before a run, each said: a step bound for an unbounded torch profile, and
    source finding off when there are no local checkouts to search (nothing is cloned)."""
    notes = []
    tp = cfg.profiler.torch_profiler
    if tp.enabled and tp.num_steps is None:
        tp.num_steps = DEFAULT_PROFILE_STEPS
        notes.append(f"benchmark.profiler.torch_profiler.num_steps: not given; the profile stops after "
                     f"{DEFAULT_PROFILE_STEPS} engine steps (an unbounded profile of a whole run is millions of events "
                     "and minutes of export): set num_steps to record more")
    if cfg.gap_analysis.find_kernel_sources and not cfg.gap_analysis.kernel_source_repos:
        cfg.gap_analysis.find_kernel_sources = False
    return notes


def apply_cli_overrides(cfg: BenchmarkConfig, flags: Any,
                        machine_checks: bool = True) -> tuple[BenchmarkConfig, list[dict]]:
    """The overrides (``BenchmarkOverrides``, or a mapping of them; None = not given) replace YAML
    values; each change is returned as {field, yaml, cli, flag}. Unlike Magpie, no flag is silently
    dropped with -b, and an unknown one is an error. ``machine_checks=False``: what this machine
    lacks is not checked (``prompt_problems``)."""
    from engine.config.overrides import OVERRIDES, BenchmarkOverrides, config_value
    flags = BenchmarkOverrides.build(flags, where="command line").given()
    data = cfg.model_dump(by_alias=False)
    if cfg.run_mode_why() != "given":
        data["run_mode"] = None  # still Magpie's default, unless --run-mode says otherwise
    # NUM_PROMPTS is left out: when only --concurrency changes, its CONC x 10 default follows.
    data["envs"] = {**DEFAULT_ENVS, **cfg.envs}
    overrides: list[dict] = []
    for flag, value in flags.items():
        path = OVERRIDES[flag].config
        value = config_value(flag, value)
        node = data
        parts = path.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        old = node.get(parts[-1])
        if path == "run_mode" and old is None:
            old = cfg.run_mode  # the default the flag replaces
        if old != value:
            overrides.append({"field": f"benchmark.{path}", "yaml": old, "cli": value,
                              "flag": "--" + flag.replace("_", "-")})
        node[parts[-1]] = value
    if flags.get("tracelens") and not data["profiler"]["torch_profiler"]["enabled"]:
        data["profiler"]["torch_profiler"]["enabled"] = True  # TraceLens needs traces
        overrides.append({"field": "benchmark.profiler.torch_profiler.enabled", "yaml": False, "cli": True,
                          "flag": "--tracelens", "note": "traces are needed for the analysis"})
    bad_flags = [f"command line: {o['flag']} {o['cli']}: {p}" for o in overrides
                 if o["field"].startswith("benchmark.envs.")
                 and (p := env_problem(o["field"].rsplit(".", 1)[1], str(o["cli"])))]
    if bad_flags:
        raise ConfigError(bad_flags)
    try:
        new = BenchmarkConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"command line: {format_loc(e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                           for e in exc.errors()]) from None
    problems = prompt_problems(new, machine_checks) + (load_problems(new) if machine_checks else [])
    if problems:
        raise ConfigError(problems)
    return new, overrides


# File descriptors kept free for the client's own files, logs and the server's pipes.
_FD_RESERVE = 256
# Python's cost of one random prompt token held in memory before the run (a list of ints).
_BYTES_PER_PROMPT_TOKEN = 40


def load_problems(cfg: BenchmarkConfig) -> list[str]:
    """A load this machine cannot hold, said before anything starts (not a run killed for memory or
    out of file descriptors): every in-flight request holds a socket, and the prompts are made in
    memory before the load."""
    import resource
    load = cfg.workload()
    conc_levels = [int(c) for c in cfg.client.sweep.get("concurrency", [])] or [load.concurrency]
    out = []
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = max(conc_levels)
    per_process = -(-most // cfg.client.client_procs)  # the client processes share the sockets
    if soft != resource.RLIM_INFINITY and per_process > soft - _FD_RESERVE:
        out.append(f"benchmark.envs.CONC {most}: every in-flight request holds a socket, and a client process may "
                   f"open {soft} files (ulimit -n): give at most {max(1, soft - _FD_RESERVE) * cfg.client.client_procs}"
                   ", or raise the limit (ulimit -n) first, or share the load over --client-procs")
    if cfg.client.dataset_name == "random" and cfg.client.duration is None:
        prompts = load.num_prompts if "concurrency" not in cfg.client.sweep else 10 * most
        longest = max([load.input_len] + [int(v) for v in cfg.client.sweep.get("input_len", [])])
        need = prompts * (longest + cfg.client.prefix_len) * _BYTES_PER_PROMPT_TOKEN
        avail = _available_memory()
        if avail is not None and need > avail // 2:
            out.append(f"benchmark.envs.NUM_PROMPTS {prompts} x ISL {longest}: the prompts take about "
                       f"{need / 2**30:.1f} GiB in memory before the load, more than half of the "
                       f"{avail / 2**30:.1f} GiB available here: send fewer prompts, or bound the run by time "
                       "(client.duration, --duration S)")
    return out


def _available_memory() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def prompt_problems(cfg: BenchmarkConfig, machine: bool = True) -> list[str]:
    """Why the random prompts could not be made for this server, checked before anything starts:
    a named tokenizer without transformers, or token ids with no vocabulary size known for certain
    (ids outside the model's vocabulary fail every request). ``machine=False`` leaves out what only
    this machine lacks (the transformers package): what a plan made here for a GPU server says apart."""
    from engine.bench.tokenizers import BUILTIN, NO_VOCAB_FIX, known_vocab, transformers_available
    if cfg.client.dataset_name == "custom" and cfg.client.dataset_path:
        from engine.bench.datasets import DatasetError, load_custom_jsonl
        try:  # every line checked now: a bad line must not cost a server start
            load_custom_jsonl(cfg.client.dataset_path, num_requests=None, output_len=1)
        except DatasetError as exc:
            return exc.problems
    if cfg.client.dataset_name == "mooncake" and cfg.client.dataset_path:
        from engine.bench.datasets import DatasetError
        from engine.bench.sessions import BlockTokens, load_mooncake
        try:  # every line checked now (token ids below any vocabulary: only the fields matter here)
            load_mooncake(cfg.client.dataset_path, blocks=BlockTokens(2), block_size=cfg.client.session_block_size)
        except DatasetError as exc:
            return exc.problems
    if cfg.client.dataset_name not in ("random", "mooncake", "sessions"):
        return []  # the file has the prompts: no vocabulary needed (a tokenizer, when it loads, counts them)
    name = cfg.effective_tokenizer()
    has_hf = name == BUILTIN or transformers_available() or not machine
    if name and has_hf:
        return []  # loaded before the server starts; the model's own falls back to token ids if it cannot load
    if name and not cfg.tokenizer_is_default():
        return [f"benchmark.client.tokenizer {name!r}: loading a Hugging Face tokenizer needs the transformers "
                "package: pip install transformers, or set client.tokenizer none (--tokenizer none) for token-id "
                "prompts with --vocab-size N"]
    if name and cfg.client.endpoint == "chat":
        return [f"benchmark.client.endpoint chat sends text messages, but the model's tokenizer ({name}) cannot be "
                "loaded here: transformers is not installed (pip install transformers), or set client.tokenizer "
                "(--tokenizer) to 'builtin' for the built-in server"]
    if known_vocab(cfg) is None:
        why = "transformers is not installed, so the model's tokenizer cannot be loaded" if name else \
            "client.tokenizer is none"
        return [f"benchmark.client.vocab_size: random token-id prompts for {cfg.framework} {cfg.model!r} need the "
                f"model's vocabulary size ({why}), and none is known: {NO_VOCAB_FIX}"]
    return []

"""What a front end asks for: one typed request per mode, plain data that survives JSON and pickle.

The command line builds one from its flags, the workbench from its launch form, an MCP client
from its tool arguments; ``prepare()`` checks it the way the command line always did (a
``ConfigError`` naming the file, the field and the fix) and turns it into what the mode runs.
A request is written into its run folder as ``request.json``, so a run records exactly what was
asked and a detached process or another machine can run it from there.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import hmac
import math
import os
import pickle
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from engine.config.overrides import BenchmarkOverrides, notice_lines
# The overrides' metadata and their command-line and MCP forms, for the front ends that build requests.
from engine.config.overrides import OVERRIDES, add_cli_flags, from_cli_args, mcp_names  # noqa: F401
from engine.config.yamlfile import ConfigError, load_located_yaml

REQUEST_FILE = "request.json"

# Framework-config keys this tool reads; the rest of Magpie's framework config is reported, not dropped.
_FRAMEWORK_KEYS_USED = {
    "scheduler": {"max_workers", "environment", "docker_image", "ray", "container"},
    "performance": {"backend", "timeout_seconds", "ncu"},
    "correctness": {"backend", "accordo"},
}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """A misspelt field is named with the nearest one (pydantic would only say "extra")."""
        if isinstance(data, dict):
            fields = list(cls.model_fields)
            problems = []
            for key in (k for k in data if k not in cls.model_fields):
                close = difflib.get_close_matches(str(key), fields, n=1)
                problems.append(f"{key}: unknown field of a {cls.__name__}; " + (
                    f"did you mean {close[0]}?" if close else f"the fields are {', '.join(fields)}"))
            if problems:
                raise ConfigError(problems)
        return data

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


class KernelRequest(_Request):
    """``magpie analyze`` / ``magpie compare``: the same fields as their flags."""
    mode: Literal["analyze", "compare"]
    kernels: list[str] = Field(default_factory=list, description="kernel source files (instead of kernel_config)")
    kernel_config: Optional[str] = Field(None, description="kernel YAML (kernel: / kernels:)")
    framework_config: Optional[str] = Field(None, description="framework config YAML (scheduler, performance)")
    testcase: Optional[str] = None
    type: Optional[str] = None
    compile_cmd: Optional[str] = None
    baseline: Optional[str] = Field(None, description="compare: baseline index or id")
    no_perf: bool = False
    repeats: Optional[int] = None
    warmup: Optional[int] = None
    timeout: Optional[float] = None
    seed: Optional[int] = None
    rtol: Optional[float] = None
    atol: Optional[float] = None
    workers: Optional[int] = None
    environment: Optional[str] = None
    docker_image: Optional[str] = None
    only: Optional[list[str]] = None
    tie_margin: Optional[float] = None
    ray_address: Optional[str] = Field(None, description="Ray cluster address for environment ray")
    cwd: Optional[str] = Field(None, description=(
        "the current directory the request was made in: relative paths (kernel_config, a working_dir, "
        "latency.pythonpath) resolve against it, as Magpie resolves them; default: the current directory"))

    def value_problems(self) -> list[str]:
        """Numbers that cannot mean anything, named by their flag (the CLI, MCP and the workbench all
        build this request): a kernel must never be judged under them."""
        out = []
        if self.repeats is not None and self.repeats < 3:
            out.append(f"--repeats {self.repeats}: at least 3 repeats are needed for a median and its spread")
        if self.timeout is not None and not (math.isfinite(self.timeout) and self.timeout > 0):
            out.append(f"--timeout {self.timeout}: seconds allowed for each command: give a number > 0")
        for flag, value in (("--rtol", self.rtol), ("--atol", self.atol)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                out.append(f"{flag} {value}: a tolerance is a finite number >= 0")
        if self.tie_margin is not None and not (math.isfinite(self.tie_margin) and 0 <= self.tie_margin < 1):
            out.append(f"--tie-margin {self.tie_margin}: a share in [0, 1), e.g. 0.02")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            out.append(f"--seed {self.seed}: seeds are integers in [0, 2**32) (NumPy and torch take no larger one)")
        if self.warmup is not None and self.warmup < 0:
            out.append(f"--warmup {self.warmup}: warm-up calls are >= 0")
        if self.workers is not None and self.workers < 1:
            out.append(f"--workers {self.workers}: at least 1 worker")
        return out

    def prepare(self) -> "PreparedKernels":
        from engine.kernels.plan import CliOptions, build_plan
        problems = self.value_problems()
        if problems:
            raise ConfigError(problems)
        warnings: list[str] = []
        framework = load_framework_config(self.framework_config, warnings)
        # The request carries every flag of CliOptions under the same name; compare's own flags
        # are dropped for analyze.
        opts = CliOptions(**{f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(CliOptions)})
        if self.mode != "compare":
            opts.baseline = opts.tie_margin = None
        plan = build_plan(self.mode, opts, framework)
        if plan.environment == "ray":  # stop here, before a run folder, when Ray is not installed
            from engine.extras import require_extra
            require_extra("ray", "running kernels on Ray (-e ray)")
        if self.docker_image and plan.environment != "container" and self.environment != "container":
            warnings.append(f"--docker-image {self.docker_image} is not used: kernels run in the "
                            f"{plan.environment!r} environment")
        plan.warnings = warnings + plan.warnings
        return PreparedKernels(request=self, plan=plan, warnings=plan.warnings, overrides=plan.overrides)


class BenchmarkRequest(_Request):
    """``magpie benchmark``: a benchmark YAML and/or a framework, plus the flags that override it."""
    mode: Literal["benchmark"] = "benchmark"
    benchmark_config: Optional[str] = None
    framework: Optional[str] = None
    # The values that replace the YAML's (None: keep the YAML's value), typed once for every front
    # end; a dict is checked into it, an unknown key named with the nearest valid one.
    flags: BenchmarkOverrides = Field(default_factory=BenchmarkOverrides)
    batch: Optional[str] = Field(None, description="a batch YAML: a list of benchmark configs or a sweep, "
                                                   "each point a run of its own (engine.cluster.batch)")
    environment: Optional[str] = Field(None, description="batch points: local (one after another) or ray")
    ray_address: Optional[str] = None

    @field_validator("flags", mode="before")
    @classmethod
    def _typed_flags(cls, v: Any) -> Any:
        return BenchmarkOverrides.build(v if v is not None else {})

    def prepare(self, plan_only: bool = False) -> Any:
        """Checked and resolved. ``plan_only`` (a dry run): what only this machine lacks (the
        transformers package for the model's tokenizer) is listed in ``machine_problems``, not raised."""
        if self.environment == "container":
            raise ConfigError(["magpie benchmark -e container: the server runs in a container with --run-mode docker "
                               "(and --docker-image); -e container is for analyze / compare"])
        if self.batch or self.environment == "ray" or self._config_asks_ray():
            from engine.cluster.batch import prepare_batch
            return prepare_batch(self, plan_only)
        return self._prepare_one(plan_only)

    def _config_asks_ray(self) -> bool:
        """Magpie's ``run_mode: ray`` in the YAML (and no --run-mode saying otherwise): the point runs
        as a Ray task, as ``-e ray`` runs it."""
        if not self.benchmark_config or self.flags.run_mode:
            return False
        from engine.config.benchmark import load_benchmark_config
        cfg, _doc = load_benchmark_config(self.benchmark_config)
        return cfg.run_mode == "ray"

    def _prepare_one(self, plan_only: bool = False) -> "PreparedBenchmark":
        from engine.config.benchmark import (BenchmarkConfig, apply_cli_overrides, load_benchmark_config,
                                             load_problems, prompt_problems, resolve_defaults)
        warnings: list[str] = []
        flags = self.flags.given()
        if self.benchmark_config:
            cfg, _doc = load_benchmark_config(self.benchmark_config, warnings)
            if self.framework and self.framework != cfg.framework:
                raise ConfigError([f"framework {self.framework} on the command line, {cfg.framework} in "
                                   f"{self.benchmark_config}: say one"])
        else:
            if not self.framework:
                raise ConfigError(["magpie benchmark: give a framework (vllm, sglang, atom, builtin) and -m MODEL, "
                                   "or -b CONFIG.yaml, or --trace-dir DIR to analyse traces"])
            try:
                cfg = BenchmarkConfig.model_validate({"framework": self.framework, "model": flags.get("model") or ""})
            except Exception as exc:  # pydantic's message names the field
                raise ConfigError([f"command line: {exc}"]) from None
        if flags.get("torch_profiler") is False:
            if flags.get("tracelens") or flags.get("gap_analysis"):
                raise ConfigError(["--no-torch-profiler with --tracelens/--gap-analysis: the analysis needs traces"])
            flags["tracelens"] = flags["gap_analysis"] = False  # nothing to analyse without traces
        if flags.get("gap_analysis") and not (flags.get("torch_profiler") or cfg.profiler.torch_profiler.enabled):
            flags["torch_profiler"] = True  # the analysis needs traces
        cfg, overrides = apply_cli_overrides(cfg, flags, machine_checks=not plan_only)
        machine = [p for p in prompt_problems(cfg) if p not in prompt_problems(cfg, machine=False)] \
            + load_problems(cfg) if plan_only else []
        if cfg.run_mode == "ray":
            raise ConfigError(["benchmark.run_mode ray: a Ray point is started through prepare() (the batch path); "
                               "give --run-mode local to run it here"])
        warnings += resolve_defaults(cfg)
        if not self.benchmark_config and cfg.run_mode_why() == "not given: docker, Magpie's default":
            warnings.append(f"--run-mode not given: the {cfg.framework} server runs in docker, as Magpie runs it "
                            "(--run-mode local starts it on this host)")
        label = cfg.framework if cfg.framework != "builtin" else f"builtin-{cfg.server.size}"
        return PreparedBenchmark(request=self, config=cfg, label=label, warnings=warnings, overrides=overrides,
                                 machine_problems=machine)


class TraceRequest(_Request):
    """``magpie benchmark --trace-dir``: analyse torch-profiler traces already recorded."""
    mode: Literal["trace"] = "trace"
    trace_dir: str
    stages: str = "all"
    top_k: int = 20
    start_pct: float = 0.0
    end_pct: float = 100.0
    min_duration_us: float = 0.0
    categories: Optional[list[str]] = None
    ignore_categories: Optional[list[str]] = None
    rank_csv: bool = True
    find_kernel_sources: bool = False
    kernel_source_repos: list[str] = Field(default_factory=list)
    gpu_arch: Optional[str] = None
    # Analyse into the workspace of the run that recorded the trace when there is one (no
    # output folder given); else into a new trace run.
    into_recording_run: bool = True

    def prepare(self) -> "PreparedTrace":
        from engine.trace.analyze import STAGES, TraceAnalysisOptions
        from engine.trace.gaps import DEFAULT_CATEGORIES, DEFAULT_IGNORE
        target = Path(self.trace_dir).expanduser().resolve()
        if not target.exists():
            raise ConfigError([f"--trace-dir {self.trace_dir}: no such file or folder"])
        stages = list(STAGES) if self.stages.strip() == "all" else [s.strip() for s in self.stages.split(",") if s.strip()]
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise ConfigError([f"--stages: unknown stage(s) {', '.join(unknown)}; use all or a comma list of "
                               f"{', '.join(STAGES)}"])
        if not 0.0 <= self.start_pct < self.end_pct <= 100.0:
            raise ConfigError([f"--start-pct {self.start_pct} / --end-pct {self.end_pct}: need 0 <= start < end <= 100"])
        if self.top_k < 1:
            raise ConfigError([f"--top-k {self.top_k}: must be at least 1"])
        if self.kernel_source_repos and not self.find_kernel_sources:
            raise ConfigError(["--kernel-source-repos is only used with --find-kernel-sources; add that flag"])
        if self.find_kernel_sources and not self.kernel_source_repos:
            raise ConfigError(["--find-kernel-sources needs --kernel-source-repos PATH ... (local checkouts; "
                               "this tool never clones repositories)"])
        if self.gpu_arch:
            from engine.hw.specs import ARCH_SPECS
            from engine.trace.arch import resolve_arch
            try:
                resolve_arch(self.gpu_arch)
            except (ValueError, OSError) as exc:
                raise ConfigError([f"{exc} (known names: {', '.join(sorted(ARCH_SPECS))}; or a TraceLens-style "
                                   "arch JSON file with mem_bw_gbps and max_achievable_tflops)"]) from None
        repos = [Path(r).expanduser().resolve() for r in self.kernel_source_repos]
        missing = [str(r) for r in repos if not r.is_dir()]
        if missing:
            raise ConfigError([f"--kernel-source-repos: not a folder: {m}" for m in missing])
        opts = TraceAnalysisOptions(
            top_k=self.top_k, start_pct=self.start_pct, end_pct=self.end_pct, min_duration_us=self.min_duration_us,
            categories=tuple(self.categories) if self.categories is not None else DEFAULT_CATEGORIES,
            ignore_categories=tuple(self.ignore_categories) if self.ignore_categories is not None else DEFAULT_IGNORE,
            rank_csv=self.rank_csv, find_kernel_sources=self.find_kernel_sources, kernel_source_repos=repos,
            gpu_arch=self.gpu_arch, stages=stages)
        return PreparedTrace(request=self, target=target, options=opts)


class TraceDiffRequest(_Request):
    """``magpie benchmark --trace-diff A B``: two recorded traces (or run folders holding them) compared
    op by op and kernel by kernel, A the baseline, B the variant."""
    mode: Literal["trace_diff"] = "trace_diff"
    a: str = Field(description="the baseline: a trace file, a folder of traces or a benchmark workspace")
    b: str = Field(description="the variant: a trace file, a folder of traces or a benchmark workspace")
    top_k: int = Field(20, description="rows of each list kept in the report and printed (the CSVs have all)")
    gpu_arch: Optional[str] = Field(None, description="arch for the roofline columns (default: the traces' "
                                                      "deviceProperties)")

    def prepare(self) -> "PreparedTraceDiff":
        from engine.trace.discover import discover_traces
        problems: list[str] = []
        picked: list[Path] = []
        notes: list[str] = []
        for flag, value in (("A", self.a), ("B", self.b)):
            target = Path(value).expanduser().resolve()
            try:
                traces = discover_traces(target)
            except FileNotFoundError as exc:
                problems.append(f"--trace-diff {flag} {value}: {exc}")
                continue
            picked.append(traces[0][1])
            if len(traces) > 1:
                notes.append(f"--trace-diff {flag}: {len(traces)} ranks found; rank {traces[0][0]} is compared "
                             f"({traces[0][1]})")
        if self.top_k < 1:
            problems.append(f"--top-k {self.top_k}: must be at least 1")
        if self.gpu_arch:
            from engine.trace.arch import resolve_arch
            try:
                resolve_arch(self.gpu_arch)
            except (ValueError, OSError) as exc:
                problems.append(f"--gpu-arch: {exc}")
        if problems:
            raise ConfigError(problems)
        return PreparedTraceDiff(request=self, a=picked[0], b=picked[1], warnings=notes)


class LoopRequest(_Request):
    """``magpie optimize``: start a loop on a clean benchmark YAML, or resume a loop folder."""
    mode: Literal["optimize"] = "optimize"
    benchmark_config: Optional[str] = Field(None, description="the clean benchmark YAML (start a loop)")
    resume: Optional[str] = Field(None, description="a loop folder to continue (a killed step restarts)")
    until: Optional[str] = Field(None, description="stop after this step")
    kernel: Optional[str] = Field(None, description="the registry op to optimise (default: the top replaceable row)")
    candidates: list[str] = Field(default_factory=list, description="folders or files of candidate kernels")
    library: bool = Field(True, description="add the bundled library's candidates for the op")

    def prepare(self) -> "PreparedLoop":
        from engine.loop.schema import STEP_NAMES, load_loop_file
        if bool(self.resume) == bool(self.benchmark_config):
            raise ConfigError(["magpie optimize: give -b CLEAN.yaml to start a loop, or --resume LOOP_DIR to continue one"])
        if self.until is not None and self.until not in STEP_NAMES:
            raise ConfigError([f"--until {self.until}: not a step; the steps are {', '.join(STEP_NAMES)}"])
        if self.kernel is not None:
            from engine.serve.kernel_keys import KERNEL_KEYS
            if self.kernel not in KERNEL_KEYS:
                raise ConfigError([f"--kernel {self.kernel}: not a registry op of the built-in server; "
                                   f"one of {', '.join(KERNEL_KEYS)}"])
        for c in self.candidates:
            if not Path(c).expanduser().exists():
                raise ConfigError([f"--candidates {c}: no such file or folder"])
        if self.resume:
            root = Path(self.resume).expanduser().resolve()
            loop = load_loop_file(root)  # a LoopFileError naming the file when it is not a loop
            # The step's process, checked by pid and start time: a pid since given to another process
            # (after a reboot, pid 1) is not a loop still running.
            busy = [s for s in loop.steps if s.state == "running" and s.pid is not None and s.process_alive(root)]
            if busy:
                raise ConfigError([f"--resume {self.resume}: step {busy[0].name} is running in process {busy[0].pid}; "
                                   "wait for it or stop it first"])
            return PreparedLoop(request=self, label=loop.label, resume_dir=root)
        path = Path(str(self.benchmark_config)).expanduser().resolve()
        bench = BenchmarkRequest(benchmark_config=str(path)).prepare()  # every config problem before a folder exists
        return PreparedLoop(request=self, label=bench.label, config=str(path), warnings=bench.warnings)


JobRequest = Annotated[Union[KernelRequest, BenchmarkRequest, TraceRequest, TraceDiffRequest, LoopRequest],
                       Field(discriminator="mode")]
_ADAPTER: TypeAdapter = TypeAdapter(JobRequest)


def parse_request(data: Union[str, bytes, dict]) -> Union[KernelRequest, BenchmarkRequest, TraceRequest,
                                                         TraceDiffRequest, LoopRequest]:
    """A request from JSON text or a dict; a ConfigError naming the field when it is not one."""
    try:
        if isinstance(data, (str, bytes)):
            return _ADAPTER.validate_json(data)
        return _ADAPTER.validate_python(data)
    except Exception as exc:
        raise ConfigError([f"request: {exc}"]) from None


def read_request(path: Path) -> Union[KernelRequest, BenchmarkRequest, TraceRequest, TraceDiffRequest, LoopRequest]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the request ({exc.strerror})"]) from None
    return parse_request(text)


# What submit() checked, kept beside the request file for the process that runs it: prepare()
# runs once per launch, and the run is the one that was checked (and shown), even if its YAML
# changes meanwhile.
def prepared_file(request_file: str) -> str:
    return Path(request_file).stem + ".prepared.pickle"


# Unpickling runs code, and a run folder is only a folder: a file planted there (or a run folder
# copied from elsewhere and resumed) must not be loaded. The pickle carries an HMAC under a key
# that only the submitting process and the children it starts hold (their environment).
PREPARED_KEY_ENV = "MAGPIE_PREPARED_KEY"


def _prepared_key(create: bool) -> Optional[bytes]:
    key = os.environ.get(PREPARED_KEY_ENV)
    if not key and create:
        key = os.environ[PREPARED_KEY_ENV] = secrets.token_hex(32)
    try:
        return bytes.fromhex(key) if key else None
    except ValueError:
        return None


def save_prepared(run_dir: Path, request_file: str, prepared: Any) -> None:
    """Keep a prepared request in its run folder, signed (best effort: without it, the runner
    prepares again)."""
    try:
        data = pickle.dumps(prepared, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    tag = hmac.new(_prepared_key(create=True), data, hashlib.sha256).digest()
    (Path(run_dir) / prepared_file(request_file)).write_bytes(tag + data)


def load_prepared(run_dir: Path, request_file: str, request: Any) -> Optional[Any]:
    """The prepared request submit() kept for ``request``, or None (none kept, unreadable, another
    request): the caller then prepares it."""
    key = _prepared_key(create=False)
    if key is None:  # not started by the process that kept it: prepared again
        return None
    try:
        blob = (Path(run_dir) / prepared_file(request_file)).read_bytes()
        tag, data = blob[:32], blob[32:]
        if not hmac.compare_digest(tag, hmac.new(key, data, hashlib.sha256).digest()):
            return None  # not written by the process that started this one: never unpickled
        prepared = pickle.loads(data)
    except Exception:  # none kept, or another engine version's: prepared again
        return None
    return prepared if getattr(prepared, "request", None) == request else None


def load_framework_config(path: Optional[str], warnings: list[str]) -> dict:
    """Magpie's framework config (``-c``): the sections this tool reads; the rest is reported."""
    if not path:
        return {}
    doc = load_located_yaml(path)
    data = doc.data or {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}:1: expected a mapping at the top level"])
    for section, value in data.items():
        used = _FRAMEWORK_KEYS_USED.get(section)
        keys = set(value) if isinstance(value, dict) else set()
        unused = sorted(keys - used) if used is not None else sorted(keys) or [section]
        if unused:
            warnings.append(f"{doc.where((section,))}: framework config {section}: "
                            f"{', '.join(unused)} not used by this tool")
    return data


def notices(prepared: Any) -> list[str]:
    """The lines a front end prints before a run starts: its warnings, then each flag that
    replaced a value of the config file (with no file, the flags are the config: nothing to say)."""
    request = getattr(prepared, "request", None)
    from_file = getattr(request, "benchmark_config", None) or getattr(request, "kernel_config", None) or \
        getattr(request, "batch", None) or request is None
    return notice_lines(prepared.warnings, prepared.overrides if from_file else [])


@dataclass
class PreparedKernels:
    request: KernelRequest
    plan: Any  # engine.kernels.plan.Plan
    warnings: list[str] = field(default_factory=list)
    overrides: list[dict] = field(default_factory=list)


@dataclass
class PreparedBenchmark:
    request: BenchmarkRequest
    config: Any  # engine.config.benchmark.BenchmarkConfig
    label: str
    warnings: list[str] = field(default_factory=list)
    overrides: list[dict] = field(default_factory=list)
    # A dry run's: what would stop the run on this machine though the config is right.
    machine_problems: list[str] = field(default_factory=list)


@dataclass
class PreparedTrace:
    request: TraceRequest
    target: Path
    options: Any  # engine.trace.analyze.TraceAnalysisOptions
    warnings: list[str] = field(default_factory=list)
    overrides: list[dict] = field(default_factory=list)


@dataclass
class PreparedTraceDiff:
    request: TraceDiffRequest
    a: Path  # the trace file compared on each side
    b: Path
    warnings: list[str] = field(default_factory=list)
    overrides: list[dict] = field(default_factory=list)


@dataclass
class PreparedLoop:
    request: LoopRequest
    label: str
    config: Optional[str] = None  # the clean YAML, absolute (a new loop)
    resume_dir: Optional[Path] = None  # the loop folder (a resume)
    warnings: list[str] = field(default_factory=list)
    overrides: list[dict] = field(default_factory=list)

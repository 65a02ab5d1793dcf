"""Kernel config YAML (Magpie's ``kernel:`` / ``kernels:`` format) as pydantic models.

Every field of Magpie's kernel YAML is accepted: the entry with its string / list /
list-of-lists command forms and ``bench_target``, and the ``performance``, ``correctness``
(with ``accordo``), ``latency``, ``scheduler`` and ``ray_config`` blocks. What each means here
is decided in engine.kernels.plan (honoured, mapped onto this tool's settings, or named in a
warning). Unknown fields are errors (with the field's line), never silently dropped.
``${MAGPIE_CONFIG_DIR}`` expands to the YAML's folder.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.cluster.settings import ContainerSettings, MagpieRayConfig, RaySettings
from engine.config.yamlfile import ConfigError, LocatedYaml, load_located_yaml, validate_located

KERNEL_TYPES = ("hip", "cuda", "triton", "pytorch")
TYPE_ALIASES = {"torch": "pytorch", "py": "pytorch", "python": "pytorch"}

# One command: a shell command line (str) or an argv (list of str).
Command = Union[str, list[str]]


def normalize_commands(value: Any) -> list[Command]:
    """Magpie's three command forms -> a list of commands run in order.

    - "cmd --flag && other"   one shell command line
    - ["prog", "arg 1", ...]   one argv (no shell)
    - [["prog", "a"], [...]]   several argv commands, in order
    """
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("empty command")
        return [value]
    if isinstance(value, list):
        if not value:
            return []
        if all(isinstance(v, list) for v in value):
            out: list[Command] = []
            for i, argv in enumerate(value):
                if not argv or not all(isinstance(a, (str, int, float)) for a in argv):
                    raise ValueError(f"command {i + 1} must be a non-empty list of strings")
                out.append([str(a) for a in argv])
            return out
        if all(isinstance(v, (str, int, float)) for v in value):
            argv = [str(v) for v in value]
            if " " in argv[0].strip():
                raise ValueError(
                    f"a list of strings is ONE command's argv, but its program {argv[0]!r} contains spaces; "
                    "for several commands use a list of lists, or one string joined with &&")
            return [argv]
    raise ValueError("expected a string (shell command line), a list of strings (one argv) "
                     "or a list of lists (several commands)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NcuSettings(_Strict):
    args: list[str] = Field(default_factory=list)
    metrics: list[str] = Field(default_factory=list)
    kernel_name: Optional[str] = None


class RocprofSettings(_Strict):
    args: list[str] = Field(default_factory=list)


class PerformanceSettings(_Strict):
    backend: Literal["auto", "harness", "ncu", "rocprofv3", "timing_json", "prof_command", "none"] = "auto"
    timeout_seconds: Optional[float] = Field(default=None, gt=0)
    repeats: Optional[int] = Field(default=None, ge=3)
    warmup: Optional[int] = Field(default=None, ge=0)
    l2_flush: bool = True
    cuda_graph: bool = False
    timer: Literal["auto", "trace", "events", "graph"] = Field(
        default="auto", description="GPU timer of the harness: trace (every stream's kernels from the device "
                                    "trace; the default), events (launching stream only), graph (CUDA-graph replay)")
    tie_margin: Optional[float] = Field(default=None, ge=0, lt=1, description=(
        "practical-equivalence margin of a compare; default 0.02 with a GPU timer, 0.10 with the CPU timer"))
    rounds: int = Field(default=10, ge=1, le=1000, description="interleaved timing rounds")
    ncu: NcuSettings = Field(default_factory=NcuSettings)
    rocprofv3: RocprofSettings = Field(default_factory=RocprofSettings)
    # Magpie's counter-based backends; named so the error can say what to use instead.
    rocprof_compute: Optional[dict] = None
    metrix: Optional[dict] = None

    @field_validator("backend", mode="before")
    @classmethod
    def _known_backend(cls, v: Any) -> Any:
        if v in ("rocprof_compute", "metrix"):
            raise ValueError(f"backend {v!r} (Magpie's counter-weighted score) is not provided: use 'rocprofv3' "
                             "(per-dispatch kernel timing on AMD), 'ncu' on NVIDIA, or 'auto'")
        return v

    @model_validator(mode="after")
    def _no_counter_blocks(self) -> "PerformanceSettings":
        for name in ("rocprof_compute", "metrix"):
            if getattr(self, name) is not None:
                raise ValueError(f"the '{name}' block is not used by this tool (no counter-weighted score); "
                                 "remove it, and use backend 'rocprofv3' or 'ncu' for kernel timing")
        return self


class AccordoSettings(_Strict):
    """Magpie's ``correctness.accordo`` block: IntelliKit Accordo's HSA-level comparison of the
    output buffers of one kernel in a reference binary and an optimized binary."""
    kernel_name: Optional[str] = Field(default=None, description="the GPU kernel to intercept")
    reference_binary: Optional[str] = Field(default=None, description="command or path of the reference binary")
    optimized_binary: Optional[str] = Field(default=None, description="command or path of the optimized binary")
    atol: float = Field(default=1e-6, ge=0)
    rtol: float = Field(default=1e-5, ge=0)
    equal_nan: bool = False
    timeout_seconds: Optional[float] = Field(default=None, gt=0, description=(
        "per snapshot capture; default performance.timeout_seconds, else 300"))
    kernel_args: Optional[list[tuple[str, str]]] = Field(default=None, description=(
        "[[name, type], ...] when Accordo cannot extract them from the binary's debug info"))
    working_directory: Optional[str] = Field(default=None, description=(
        "where the binaries run; default the kernel's working_dir"))

    @field_validator("kernel_args", mode="before")
    @classmethod
    def _pairs(cls, v: Any) -> Any:
        # "name:type" strings are accepted beside [name, type] pairs.
        if isinstance(v, list):
            return [tuple(x.split(":", 1)) if isinstance(x, str) and ":" in x else x for x in v]
        return v


class CorrectnessSettings(_Strict):
    backend: Literal["auto", "testcase", "harness", "accordo"] = "auto"
    rtol: Optional[float] = Field(default=None, ge=0)
    atol: Optional[float] = Field(default=None, ge=0)
    seeds: Optional[int] = Field(default=None, ge=1, description="number of random input sets")
    iteration_count: int = Field(default=1, ge=1, description="times each testcase command is run")
    timeout_seconds: Optional[float] = Field(default=None, gt=0)
    accordo: Optional[AccordoSettings] = None


class BenchTarget(_Strict):
    """Magpie's latency harness target: ``module.callable(*get_inputs())``."""
    module: str = Field(description="dotted module name, found on latency.pythonpath, the working_dir or "
                                    "the YAML's folder")
    callable: str = Field(description="the function called with the inputs")
    get_inputs: str = Field(default="get_inputs", description="the module's input factory")


LATENCY_METHODS = ("auto", "cuda_graph", "kernel_trace", "rocprof_timestamps", "both", "none")


class LatencySettings(_Strict):
    """Magpie's ``latency:`` block (its latency stage). This tool times every kernel in its
    performance stage; engine.kernels.plan maps these keys onto that stage or names the ones
    it does not use."""
    enabled: bool = True
    method: Literal["auto", "cuda_graph", "kernel_trace", "rocprof_timestamps", "both", "none"] = "auto"
    primary_metric: Optional[Literal["wall_median_ms", "kernel_median_ms"]] = None
    rep_ms: Optional[float] = Field(default=None, gt=0)
    n_retries: Optional[int] = Field(default=None, ge=1)
    estimate_reps: Optional[int] = Field(default=None, ge=1)
    warmup_iters: Optional[int] = Field(default=None, ge=0)
    seed: Optional[int] = None
    kernel_filter: Optional[str] = None
    pythonpath: list[str] = Field(default_factory=list)
    bench_target: Optional[BenchTarget] = None
    timeout_seconds: Optional[float] = Field(default=None, gt=0)
    output_dir: Optional[str] = None

    @field_validator("pythonpath", mode="before")
    @classmethod
    def _path_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [x for x in v.split(os.pathsep) if x]
        return [] if v is None else v


class SchedulerSettings(_Strict):
    environment: Literal["local", "container", "ray"] = "local"
    max_workers: Optional[int] = Field(default=None, ge=1)
    docker_image: Optional[str] = None
    ray: Optional[RaySettings] = None
    container: Optional[ContainerSettings] = None


class KernelEntry(_Strict):
    id: str = "kernel"
    type: Literal["hip", "cuda", "triton", "pytorch"] = "hip"
    source_files: list[str] = Field(default_factory=list)
    working_dir: Optional[str] = None
    env: dict[str, str] = Field(default_factory=dict)
    compile_command: Any = None
    testcase_command: Any = None
    prof_command: Any = None
    get_inputs_func: str = "get_inputs"
    get_init_inputs_func: str = "get_init_inputs"
    # Ours:
    baseline: bool = False
    reference_file: Optional[str] = Field(
        default=None, description="Python module (Model/get_inputs) whose outputs this kernel must match")
    model_class: Optional[str] = Field(
        default=None, description="class to instantiate; default ModelNew if defined, else Model")
    inplace: bool = Field(default=False, description="the kernel writes its result into its inputs on purpose")
    bench_target: Optional[BenchTarget] = Field(default=None, description=(
        "Magpie's latency target: the harness calls module.callable(*get_inputs())"))

    @field_validator("type", mode="before")
    @classmethod
    def _type_alias(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip().lower()
            return TYPE_ALIASES.get(v, v)
        return v

    @field_validator("source_files", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): ("" if val is None else str(val)) for k, val in v.items()}
        return v

    @field_validator("compile_command", "testcase_command", "prof_command")
    @classmethod
    def _commands(cls, v: Any) -> Any:
        normalize_commands(v)  # validate the form; kept as written for config.yaml
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("id must not be empty")
        return v


class KernelConfigFile(_Strict):
    kernel: Optional[KernelEntry] = None
    kernels: Optional[list[KernelEntry]] = None
    performance: PerformanceSettings = Field(default_factory=PerformanceSettings)
    correctness: CorrectnessSettings = Field(default_factory=CorrectnessSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    ray_config: Optional[MagpieRayConfig] = None
    latency: Optional[LatencySettings] = None

    @model_validator(mode="after")
    def _has_kernels(self) -> "KernelConfigFile":
        if self.kernel is None and not self.kernels:
            raise ValueError("no kernel: add a 'kernel:' mapping or a 'kernels:' list")
        return self

    def entries(self) -> list[KernelEntry]:
        """Magpie merges ``kernel`` and ``kernels`` when both exist: kernel first."""
        return ([self.kernel] if self.kernel else []) + list(self.kernels or [])


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


_MODEL_AT = {
    (): KernelConfigFile, ("kernel",): KernelEntry, ("kernels", int): KernelEntry,
    ("performance",): PerformanceSettings, ("correctness",): CorrectnessSettings,
    ("scheduler",): SchedulerSettings, ("performance", "ncu"): NcuSettings,
    ("performance", "rocprofv3"): RocprofSettings, ("scheduler", "ray"): RaySettings,
    ("scheduler", "container"): ContainerSettings, ("correctness", "accordo"): AccordoSettings,
    ("latency",): LatencySettings, ("latency", "bench_target"): BenchTarget, ("ray_config",): MagpieRayConfig,
    ("kernel", "bench_target"): BenchTarget, ("kernels", int, "bench_target"): BenchTarget,
}


def _model_for(parent: tuple) -> type[BaseModel] | None:
    shape = tuple(int if isinstance(p, int) else p for p in parent)
    return _MODEL_AT.get(shape)


def _unknown_field_hint(loc: tuple) -> str:
    model = _model_for(loc[:-1])
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), _field_names(model), n=1)
    return (f" Did you mean '{close[0]}'?" if close else "") + f" Known fields: {', '.join(_field_names(model))}."


CONFIG_DIR_VARIABLE = "MAGPIE_CONFIG_DIR"


def config_variables(path: Path) -> dict[str, str]:
    """The variables a kernel YAML may use beside the environment's: ``${MAGPIE_CONFIG_DIR}``, the
    folder that holds the YAML (relative paths otherwise resolve as in Magpie: against the
    current directory)."""
    return {CONFIG_DIR_VARIABLE: str(Path(path).resolve().parent)}


def parse_kernel_config(doc: LocatedYaml, warnings: list[str] | None = None) -> KernelConfigFile:
    if not isinstance(doc.data, dict):
        raise ConfigError([f"{doc.path}:1: expected a mapping with 'kernel:' or 'kernels:' at the top level"])
    return validate_located(KernelConfigFile, doc, warnings, variables=config_variables(doc.path),
                            unknown_hint=_unknown_field_hint)


def load_kernel_config(path: Path | str, warnings: list[str] | None = None) -> tuple[KernelConfigFile, LocatedYaml]:
    doc = load_located_yaml(path)
    return parse_kernel_config(doc, warnings), doc

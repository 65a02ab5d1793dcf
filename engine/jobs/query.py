"""The read-only questions front ends ask the engine, in one place.

The workbench, the command line and the MCP server start and follow runs through the job API
(``engine.jobs``: requests -> ``submit`` -> ``Job``); everything else they need to know comes from
here: what a file is and whether it checks out (``check_config``), the runs under a results
folder (``RunCatalog`` / ``RunInfo``; cancel goes through ``attach(run_dir).cancel()``), the
comparison of two benchmark reports, a loop's state, the GPU, kernel sources, YAML and other
files read safely (a FIFO, a device or a huge file is refused, never waited on or read whole),
trace step annotations and the run state as one line of text.

The functions below do the work where a front end would otherwise chain several engine calls;
types and small helpers are re-exported by name (``LAZY``) and load their module only when first
asked for, so importing this module stays cheap for a front end that starts fast.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from engine import __version__  # noqa: F401 - the engine's version, for front ends
from engine.config.yamlfile import ConfigError, YamlSyntaxError, load_yaml_file

# --------------------------------------------------------------------------- names, loaded when asked for
# name -> the engine module that defines it. ``from engine.jobs.query import RunInfo`` works as if
# it were defined here.
LAZY: dict[str, str] = {
    # runs and their state
    **dict.fromkeys(("RunCatalog", "RunInfo", "CancelRefused", "FINISHED_STATES", "read_new_events"),
                    "engine.runs.catalog"),
    **dict.fromkeys(("status_text", "headline_numbers", "no_roofline_reason", "RunStatus", "run_eta_s"), "engine.runs.state"),
    # files, read safely; and the atomic writes a front end's own files (settings, exports) use
    **dict.fromkeys(("open_regular", "open_text", "read_json", "read_text", "read_tail", "is_regular_file",
                     "MAX_SMALL_TEXT_BYTES", "MAX_REPORT_BYTES", "FileTooLarge", "NotRegularFile"), "engine.safeio"),
    **dict.fromkeys(("atomic_write_text", "atomic_write_json"), "engine.runs.workspace"),
    # YAML configs
    **dict.fromkeys(("load_located_yaml", "expand_env_vars"), "engine.config.yamlfile"),
    **dict.fromkeys(("KERNEL_TYPES", "TYPE_ALIASES", "load_kernel_config"), "engine.config.kernel"),
    # benchmark reports side by side
    **dict.fromkeys(("compare_reports", "format_interval", "CI_NOT_MEANINGFUL", "MIN_REPEATS_FOR_CI"),
                    "engine.bench.metrics"),
    **dict.fromkeys(("compare_runs", "ReportComparison", "ReportCompareError"), "engine.bench.report_compare"),
    # the optimization loop
    **dict.fromkeys(("STEP_NAMES", "LOOP_FILE", "LoopFile", "LoopStep", "LoopFileError", "load_loop_file"),
                    "engine.loop.schema"),
    **dict.fromkeys(("BenchmarkStepResult", "BottlenecksResult", "CandidateRow", "CandidatesResult", "HarnessResult",
                     "IntegrateResult", "Metric", "ProfiledResult", "RebenchmarkResult", "VerdictResult",
                     "step_result"), "engine.loop.results"),
    "format_status": "engine.loop.run",
    # a kernel run's stages as they go (each kernel's stage, step and verdict; a console line per event)
    **dict.fromkeys(("KernelProgress", "kernels_text", "stage_line"), "engine.runs.state"),
    # the GPU
    **dict.fromkeys(("detect_gpu", "format_gpu_info", "GpuInfo"), "engine.hw.detect"),
    "resolve_arch": "engine.trace.arch",
    # traces
    "parse_step_annotation": "engine.trace.steps",
    "workspace_of": "engine.trace.discover",
    # kernel sources
    "build_index": "engine.sources.index",
    **dict.fromkeys(("find_kernel_sources", "repository_variables"), "engine.sources.finder"),
    # optional parts of the installation
    **dict.fromkeys(("MissingExtra", "missing_extra_error"), "engine.extras"),
}


def __getattr__(name: str) -> Any:
    module = LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Read from its module each time (not cached here): a name patched there (a test's
    # monkeypatch) is the one a front end gets, as with a direct import.
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY))


# --------------------------------------------------------------------------- files: what they are
SOURCE_SUFFIXES = {".py": "python", ".cu": "cuda", ".cuh": "cuda", ".hip": "hip", ".cpp": "cpp", ".cc": "cpp",
                   ".cxx": "cpp", ".c": "c", ".h": "cpp", ".hpp": "cpp"}
CONFIG_SUFFIXES = {".yaml", ".yml"}


@dataclass
class ConfigCheck:
    """What a file is and what the engine says about it."""
    path: Path
    kind: str  # "kernel", "benchmark", "framework", "yaml" (not ours), "source", "run record", "other"
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kernel_ids: list[str] = field(default_factory=list)
    valid_modes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def modes(self) -> list[str]:
        """The run modes this file can start."""
        if self.kind == "kernel":
            return list(self.valid_modes)
        if self.kind == "benchmark":
            return ["benchmark", "optimize"]  # optimize: the loop, with this file as its clean config
        return []


def is_run_folder(folder: Path) -> bool:
    """A run folder (it has the ``events.jsonl`` every run writes): its files are a run's record."""
    return (Path(folder) / "events.jsonl").is_file()


def classify(path: Path) -> str:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in SOURCE_SUFFIXES:
        return "source"
    if suffix not in CONFIG_SUFFIXES:
        return "other"
    if is_run_folder(path.parent):
        # The config a run recorded (with its overrides and warnings): not a config to validate
        # or launch as it stands; the Runs list re-runs it.
        return "run record"
    try:
        data = load_yaml_file(path)
    except ConfigError:
        # Broken YAML, or a file refused before it is parsed (not a regular file, too large,
        # binary, an alias bomb): check_config reports why. Gone meanwhile: not a config.
        return "yaml" if os.path.lexists(path) else "other"
    if isinstance(data, dict):
        if "benchmark" in data:
            return "benchmark"
        if "kernel" in data or "kernels" in data:
            return "kernel"
        if {"scheduler", "performance"} & set(data):
            return "framework"
    return "yaml"


def check_config(path: Union[Path, str]) -> ConfigCheck:
    """Validate a file the way the command line would, without running anything."""
    path = Path(path)
    kind = classify(path)
    check = ConfigCheck(path=path, kind=kind)
    if kind == "yaml":
        try:
            load_yaml_file(path)
        except YamlSyntaxError as exc:
            if exc.limit:
                check.problems.extend(exc.problems)
            else:
                where = f"{path}:{exc.line}" if exc.line is not None else str(path)
                check.problems.append(f"{where}: not valid YAML ({exc.problem})")
        except ConfigError as exc:  # refused before parsing: not a regular file, too large, binary
            check.problems.extend(exc.problems)
    elif kind == "benchmark":
        from engine.config.benchmark import load_benchmark_config
        try:
            load_benchmark_config(path, check.warnings)
        except ConfigError as exc:
            check.problems.extend(exc.problems)
    elif kind == "kernel":
        # A file can be valid for compare (candidates checked against the baseline) and not
        # for analyze (which needs a testcase or reference per kernel): keep what works.
        from engine.kernels.plan import CliOptions, build_plan
        failures: dict[str, list[str]] = {}
        for mode in ("compare", "analyze"):
            try:
                plan = build_plan(mode, CliOptions(kernel_config=str(path)), {})
            except ConfigError as exc:
                failures[mode] = list(exc.problems)
                continue
            if mode == "compare" and len(plan.kernels) < 2:
                continue
            check.valid_modes.append(mode)
            check.kernel_ids = [k.id for k in plan.kernels]
            check.warnings.extend(w for w in plan.warnings if w not in check.warnings)
        if not check.valid_modes:
            # Report the problems of the mode the file is written for: a file of several kernels
            # is a compare (analyze's extra demands, a reference for the baseline too, would be
            # false alarms on kernels nobody touched); a single kernel is an analyze.
            meant = "compare" if _kernel_entries(path) > 1 else "analyze"
            for problem in _root_causes(failures.get(meant) or failures.get("compare") or failures.get("analyze") or []):
                if problem not in check.problems:
                    check.problems.append(problem)
    return check


_MISSING_FILE = re.compile(r"^(?P<where>.*?: (?P<kernel>[^:\s.]+))\.\w+: .* does not exist")


def _root_causes(problems: list[str]) -> list[str]:
    """Drop what follows from a missing file: a kernel whose source does not exist also "has no
    way to check correctness" (its module cannot load); only the missing file is the fix."""
    missing = {m["kernel"] for m in map(_MISSING_FILE.match, problems) if m}
    return [p for p in problems if _MISSING_FILE.match(p) or not any(f": {k}: " in p for k in missing)]


def _kernel_entries(path: Path) -> int:
    try:
        data = load_yaml_file(path)
    except ConfigError:
        return 0
    kernels = data.get("kernels") if isinstance(data, dict) else None
    return len(kernels) if isinstance(kernels, list) else 1


# --------------------------------------------------------------------------- YAML configs
def read_yaml(path: Union[Path, str], what: str = "a config") -> Any:
    """A YAML file's data through the one safe loader (a FIFO, a huge file, binary or an alias bomb
    is refused): a ConfigError with file:line, never a half-read file."""
    return load_yaml_file(path, what=what)


def read_recorded_config(run_dir: Union[Path, str]) -> dict:
    """The ``config.yaml`` a run recorded, as a mapping; {} when it is missing, unreadable or not a mapping."""
    try:
        cfg = load_yaml_file(Path(run_dir) / "config.yaml") or {}
    except ConfigError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


def config_kernels(config: Union[Path, str]) -> tuple[Optional[str], dict[str, Path]]:
    """(baseline id, {kernel id: its first source file}) of a kernel config, as the engine plans
    it (compare first, else analyze); (None, {}) when it does not check out."""
    from engine.kernels.plan import CliOptions, build_plan
    for mode in ("compare", "analyze"):
        try:
            plan = build_plan(mode, CliOptions(kernel_config=str(config)), {})
        except ConfigError:
            continue
        sources = {k.id: k.source_files[0] for k in plan.kernels if k.source_files}
        baseline = plan.kernels[plan.baseline_index].id if plan.baseline_index is not None else None
        return baseline, sources
    return None, {}


def batch_points(path: Union[Path, str], where: str) -> list[tuple[str, str, dict]]:
    """The points of a batch YAML (``magpie benchmark --batch``): (where, benchmark config, flags)
    each; [] when the file is not a batch (the engine names the problem when it loads it)."""
    from engine.cluster.batch import BatchFile, _points_of
    from engine.config.yamlfile import load_located_yaml
    doc = load_located_yaml(path)
    if not isinstance(doc.data, dict):
        return []
    try:
        data = BatchFile.model_validate(doc.data)
    except Exception:  # noqa: BLE001 - the engine names the problem when it loads the file
        return []
    return _points_of(data, doc.path.resolve().parent, where)


# --------------------------------------------------------------------------- what a run would do
def plan_lines(prepared: Any, output_dir: Union[Path, str, None] = None) -> list[str]:
    """A prepared request's dry-run plan, one line each (``magpie ... --dry-run``): per kernel its
    folder, files, commands, correctness and timing; for a benchmark the server command and
    environment, image, GPUs, points, profiling and run folder; for a loop its steps."""
    request = getattr(prepared, "request", None)
    mode = getattr(request, "mode", None)
    if mode in ("analyze", "compare"):
        return list(prepared.plan.plan_lines())
    if mode == "benchmark":
        from engine.bench.plan import benchmark_plan, format_plan
        return list(format_plan(benchmark_plan(prepared, str(output_dir or "./results"))))
    if mode == "optimize":
        from engine.loop.run import loop_plan_lines
        return list(loop_plan_lines(prepared, output_dir))
    raise ValueError(f"no plan for a {mode!r} request")


def benchmark_plan(prepared: Any, output_dir: Union[Path, str]) -> dict:
    """A prepared benchmark's plan as data (what ``plan_lines`` prints)."""
    from engine.bench.plan import benchmark_plan as plan
    return plan(prepared, str(output_dir))


def kernel_plan(prepared: Any) -> dict:
    """A prepared kernel request's plan as data (per kernel: folder, files, commands, correctness, timing)."""
    from engine.kernels.describe import describe_plan
    return describe_plan(prepared.plan)


def loop_status(loop_dir: Union[Path, str]) -> str:
    """A loop's chain of steps as text (``magpie optimize --status``)."""
    from engine.loop.run import format_status
    return format_status(str(loop_dir))


# --------------------------------------------------------------------------- the engine's own parts
def optimizable_ops() -> tuple[str, ...]:
    """The registry ops ``magpie optimize --kernel`` takes (the built-in server's swappable kernels)."""
    from engine.serve.kernel_keys import KERNEL_KEYS
    return tuple(KERNEL_KEYS)


def bundled_kernel_paths() -> frozenset[str]:
    """``module:function`` of every kernel that ships with the engine: the library's catalog, the
    built-in server's Triton defaults and its PyTorch references."""
    from engine.library import CATALOG
    from engine.serve.kernel_keys import REFERENCE_PATHS
    from engine.serve.kernels import TRITON_DEFAULTS
    paths = {k.path for k in CATALOG} | set(TRITON_DEFAULTS.values()) | set(REFERENCE_PATHS.values())
    return frozenset(paths)


def bundled_kernel_dirs() -> list[Path]:
    """The folders of the kernels that ship with the engine: the built-in server's Triton kernels
    (engine/serve) and the bundled library's candidates (engine/library). A trace of the built-in
    server runs them, and they are on every machine the workbench runs on."""
    root = Path(__file__).resolve().parents[1]
    return [root / "serve", root / "library"]


def recorded_run_label(run_dir: Union[Path, str], fallback: str) -> str:
    """The label of a run folder written before runs recorded theirs at launch: ``run_label`` of
    its ``config.yaml`` (engine.runs.labels), else ``fallback``. Reads a small YAML."""
    from engine.runs.labels import recorded_run_label as label
    return label(Path(run_dir), fallback)


def server_images() -> dict[str, dict[str, str]]:
    """The container images the engine runs each framework's server in: {framework: {arch: image}}."""
    from engine.bench.docker_launch import IMAGES
    return {fw: dict(by_arch) for fw, by_arch in IMAGES.items()}


def gpu_info_text() -> str:
    """The detected GPUs, compiler and profilers as text (``magpie --gpu-info``)."""
    from engine.hw.detect import detect_gpu, format_gpu_info
    return format_gpu_info(detect_gpu())


def arch_of_name(name: str) -> Optional[dict]:
    """The roofline ceilings of an arch name (H200, MI300X, ...) or a TraceLens-style arch JSON
    file; None when it is neither."""
    from engine.trace.arch import resolve_arch
    try:
        return resolve_arch(name)
    except (ValueError, OSError):
        return None


# --------------------------------------------------------------------------- kernel sources
def locate_kernel_sources(names: Sequence[str], repos: Sequence[Path]) -> list[dict[str, Any]]:
    """Where each kernel name is defined in local repositories (nothing is ever cloned): the
    finder's result per name, with the ``$REPO_DIR`` path resolved to a file on disk (``path``)."""
    from engine.sources.finder import find_kernel_sources, repository_variables
    from engine.sources.index import build_index
    index = build_index(list(repos))
    roots = repository_variables(index)
    out = []
    for name, match in find_kernel_sources(list(names), list(repos), index=index).items():
        path = None
        if match.source_file:
            var, _, rel = match.source_file.partition("/")
            if var in roots:
                path = Path(roots[var]) / rel
        out.append({"kernel": name, "status": match.status, "file": match.source_file, "line": match.source_line,
                    "path": path, "confidence": match.confidence, "reason": match.confidence_reason,
                    "candidates": list(match.candidates)})
    return out

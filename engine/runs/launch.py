"""What the workbench needs to start a run from a config file: what the file is, whether it
checks out, and a launch through the job API (``engine.jobs``) as a detached process.

The run gets its own session and process group, writes its own run folder, and keeps going
when the front end exits or its terminal disappears. ``LaunchRequest.argv`` is the equivalent
command line, shown to the user; the run itself is the typed request, not those flags.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from engine.config.yamlfile import ConfigError, YamlSyntaxError, load_yaml_file

SOURCE_SUFFIXES = {".py": "python", ".cu": "cuda", ".cuh": "cuda", ".hip": "hip", ".cpp": "cpp", ".cc": "cpp",
                   ".cxx": "cpp", ".c": "c", ".h": "cpp", ".hpp": "cpp"}
CONFIG_SUFFIXES = {".yaml", ".yml"}


@dataclass
class ConfigCheck:
    """What a file is and what the engine says about it."""
    path: Path
    kind: str  # "kernel", "benchmark", "framework", "yaml" (not ours), "source", "other"
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
    return (folder / "events.jsonl").is_file()


def classify(path: Path) -> str:
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


def check_config(path: Path | str) -> ConfigCheck:
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


# The launch form's benchmark overrides: LaunchRequest attribute -> BenchmarkOverrides field, in
# the order the equivalent command line shows them (tests/unit/test_overrides.py checks them
# against the model's form=True fields).
BENCH_FORM_FIELDS = {"repeats": "repeats", "concurrency": "concurrency", "input_len": "input_len",
                     "output_len": "output_len", "num_prompts": "num_prompts", "warmup": "warmup",
                     "timeout": "timeout", "seed": "seed", "profiler": "torch_profiler"}


@dataclass
class LaunchRequest:
    mode: str  # analyze | compare | benchmark | optimize
    config: Path
    output_dir: Path
    # Common overrides; None = keep the config's value.
    repeats: Optional[int] = None
    baseline: Optional[str] = None
    concurrency: Optional[int] = None
    input_len: Optional[int] = None
    output_len: Optional[int] = None
    num_prompts: Optional[int] = None
    profiler: Optional[bool] = None
    only: Optional[list[str]] = None  # kernel ids (analyze/compare); the baseline is always kept
    until: Optional[str] = None  # optimize: stop after this step (None: every step)
    warmup: Optional[int] = None  # analyze/compare: untimed calls; benchmark: warm-up requests
    timeout: Optional[float] = None  # analyze/compare: per command; benchmark: the whole run
    seed: Optional[int] = None
    rtol: Optional[float] = None  # analyze/compare only
    atol: Optional[float] = None
    no_perf: bool = False  # analyze/compare: correctness only

    def to_request(self) -> Any:
        """The typed request this launch runs (``engine.jobs.requests``)."""
        from engine.jobs.requests import BenchmarkRequest, KernelRequest, LoopRequest
        config = str(Path(self.config).resolve())
        if self.mode in ("analyze", "compare"):
            # Relative paths resolve where the run starts (start_run: the config's folder), in
            # the preview as in the run.
            return KernelRequest(mode=self.mode, kernel_config=config, cwd=str(Path(config).parent), repeats=self.repeats,
                                 baseline=self.baseline if self.mode == "compare" else None,
                                 only=list(self.only) if self.only else None, warmup=self.warmup,
                                 timeout=self.timeout, seed=self.seed, rtol=self.rtol, atol=self.atol,
                                 no_perf=self.no_perf)
        if self.mode == "benchmark":
            return BenchmarkRequest(benchmark_config=config, flags=self.benchmark_overrides())
        if self.mode == "optimize":
            return LoopRequest(benchmark_config=config, until=self.until)
        raise ValueError(f"unknown mode {self.mode!r}: analyze, compare, benchmark or optimize")

    def benchmark_overrides(self) -> Any:
        """The form's benchmark overrides as the typed model (``BenchmarkOverrides``)."""
        from engine.config.overrides import BenchmarkOverrides
        return BenchmarkOverrides.build({name: getattr(self, attr) for attr, name in BENCH_FORM_FIELDS.items()},
                                        where="launch form")

    def argv(self, python: str = sys.executable) -> list[str]:
        """The equivalent command line (what the launch screen shows)."""
        args = [python, "-m", "engine.cli", self.mode]
        config, output = str(Path(self.config).resolve()), str(Path(self.output_dir).resolve())
        if self.mode in ("analyze", "compare"):
            args += ["-k", config, "-o", output]
            if self.repeats is not None:
                args += ["--repeats", str(self.repeats)]
            if self.baseline and self.mode == "compare":
                args += ["--baseline", self.baseline]
            if self.only:
                args += ["--only", ",".join(self.only)]
            for flag, value in (("--warmup", self.warmup), ("--timeout", self.timeout), ("--seed", self.seed),
                                ("--rtol", self.rtol), ("--atol", self.atol)):
                if value is not None:
                    args += [flag, str(value)]
            if self.no_perf:
                args.append("--no-perf")
        elif self.mode == "benchmark":
            from engine.config.overrides import OVERRIDES
            args += ["-b", config, "-o", output]
            for attr, name in BENCH_FORM_FIELDS.items():
                value, flag = getattr(self, attr), OVERRIDES[name].flag(name)
                if isinstance(value, bool):
                    args.append(flag if value else flag.replace("--", "--no-", 1))
                elif value is not None:
                    args += [flag, str(value)]
        elif self.mode == "optimize":
            args += ["-b", config, "-o", output] + (["--until", self.until] if self.until else [])
        else:
            raise ValueError(f"unknown mode {self.mode!r}: analyze, compare, benchmark or optimize")
        return args


def effective_config(req: LaunchRequest, prepared: Any = None) -> tuple[dict[str, Any], list[dict], list[str]]:
    """(config after overrides, the overrides, warnings): what the run would record in config.yaml.
    Raises ConfigError with file:line problems, as the command line would (the same checks).
    ``prepared``: the launch's ``to_request().prepare()`` when the caller has it already."""
    prepared = prepared if prepared is not None else req.to_request().prepare()
    if req.mode == "benchmark":
        return {"benchmark": prepared.config.model_dump(by_alias=True)}, prepared.overrides, prepared.warnings
    if req.mode == "optimize":
        return _loop_baseline_config(prepared)
    return prepared.plan.effective_config(), prepared.overrides, prepared.warnings


def _loop_baseline_config(prepared: Any) -> tuple[dict[str, Any], list[dict], list[str]]:
    """What the loop's baseline step starts from: the clean config as it stands (the loop raises
    its repeats to the minimum it needs for a confidence interval, and records that in loop.json)."""
    from engine.jobs.requests import BenchmarkRequest
    bench = BenchmarkRequest(benchmark_config=prepared.config).prepare()
    return {"benchmark": bench.config.model_dump(by_alias=True)}, list(bench.overrides), prepared.warnings


@dataclass
class StartedRun:
    process: subprocess.Popen
    argv: list[str]  # the equivalent command line
    console_log: Path
    started: float
    run_dir: Optional[Path] = None

    @property
    def pid(self) -> int:
        return self.process.pid


def find_console_log(output_dir: Path, pid: Optional[int]) -> Optional[Path]:
    """The console log a front end kept for the run with this pid (newest if the pid was reused)."""
    if pid is None:
        return None
    folder = output_dir / ".console"
    try:
        matches = sorted(folder.glob(f"*_{pid}.log"))
    except OSError:
        return None
    return matches[-1] if matches else None


def start_run(req: LaunchRequest, cwd: Optional[Path] = None, prepared: Any = None) -> StartedRun:
    """Submit the launch to the job API's detached local-process executor; the console output
    goes to ``<output>/.console/<stamp>_<pid>.log``. ``prepared``: the preview's own
    ``to_request().prepare()``, run as it was shown (not checked again)."""
    from engine.jobs.api import submit
    job = submit(req.to_request(), req.output_dir, executor="local-process", cwd=cwd or Path(req.config).parent,
                 prepared=prepared)
    ex = job.execution
    return StartedRun(process=ex.process, argv=req.argv(), console_log=ex.console_log, started=time.time(),
                      run_dir=job.run_dir)


def resume_loop(loop_dir: Path | str, until: Optional[str] = None) -> StartedRun:
    """Continue a stopped loop (``magpie optimize --resume``) as a detached job; a step whose
    process was killed restarts. The job's console log goes next to the loop folder's."""
    from engine.jobs.api import submit
    from engine.jobs.requests import LoopRequest
    root = Path(loop_dir).resolve()
    job = submit(LoopRequest(resume=str(root), until=until), root.parent, executor="local-process", cwd=root)
    ex = job.execution
    argv = [sys.executable, "-m", "engine.cli", "optimize", "--resume", str(root)] + (["--until", until] if until else [])
    return StartedRun(process=ex.process, argv=argv, console_log=ex.console_log, started=time.time(), run_dir=job.run_dir)

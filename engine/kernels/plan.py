"""From YAML + command-line flags to an evaluation plan: resolved kernels and run settings.

Rules: relative paths resolve against the YAML file's folder; a CLI flag that conflicts
with the YAML wins and is recorded in ``overrides``; anything that cannot be honoured is
an error before anything runs, never a silent drop.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from engine.config.kernel import (
    Command, CorrectnessSettings, KernelConfigFile, KernelEntry, PerformanceSettings, load_kernel_config,
    normalize_commands,
)
from engine.config.yamlfile import ConfigError, LocatedYaml
from engine.kernels.harness import follows_convention

DEFAULT_COMMAND_TIMEOUT_S = 600.0
DEFAULT_SEEDS = 3


@dataclass
class KernelSpec:
    index: int
    id: str
    type: str
    source_files: list[Path]
    working_dir: Path
    env: dict[str, str]
    compile: list[Command]
    testcase: list[Command]
    prof: list[Command]
    get_inputs_func: str = "get_inputs"
    get_init_inputs_func: str = "get_init_inputs"
    model_class: Optional[str] = None
    reference_file: Optional[Path] = None
    baseline: bool = False
    harness: bool = False  # its first source file follows the Model/get_inputs convention
    inplace: bool = False  # declared: writes its inputs on purpose
    origin: str = ""  # file:line where the entry was defined, or "command line"

    def to_config(self) -> dict:
        """The effective entry, as written to the workspace's config.yaml."""
        def cmds(c: list[Command]) -> Any:
            return None if not c else (c[0] if len(c) == 1 and isinstance(c[0], str) else
                                       [x if isinstance(x, list) else ["bash", "-c", x] for x in c])
        return {
            "id": self.id, "type": self.type, "source_files": [str(p) for p in self.source_files],
            "working_dir": str(self.working_dir), "env": dict(self.env),
            "compile_command": cmds(self.compile), "testcase_command": cmds(self.testcase),
            "prof_command": cmds(self.prof), "get_inputs_func": self.get_inputs_func,
            "get_init_inputs_func": self.get_init_inputs_func, "model_class": self.model_class,
            "reference_file": str(self.reference_file) if self.reference_file else None,
            "baseline": self.baseline, "inplace": self.inplace,
        }


@dataclass
class RunSettings:
    perf_enabled: bool = True
    perf_backend: str = "auto"
    repeats: Optional[int] = None
    warmup: Optional[int] = None
    compile_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    correctness_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    perf_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    seed: Optional[int] = None  # None: hidden random seeds, drawn per run and reported afterwards
    n_seeds: int = DEFAULT_SEEDS
    rtol: Optional[float] = None
    atol: Optional[float] = None
    correctness_backend: str = "auto"
    iteration_count: int = 1
    l2_flush: bool = True
    cuda_graph: bool = False
    timer: str = "auto"
    tie_margin: Optional[float] = None  # None: 0.02 with a GPU timer, 0.10 with the CPU one
    rounds: int = 10
    ncu_args: list[str] = field(default_factory=list)
    ncu_metrics: list[str] = field(default_factory=list)
    ncu_kernel_name: Optional[str] = None
    rocprof_args: list[str] = field(default_factory=list)
    workers: int = 1

    @property
    def seeds(self) -> list[int]:
        """Fixed seeds with --seed; otherwise drawn once per run, so a kernel cannot know them."""
        if self.seed is not None:
            return [self.seed + i for i in range(self.n_seeds)]
        if not hasattr(self, "_drawn"):
            from engine.kernels.session import secret_seeds
            self._drawn = secret_seeds(self.n_seeds)
        return self._drawn

    def to_dict(self) -> dict:
        d = asdict(self)
        # Hidden seeds are written only once drawn, i.e. in the report at the end of the run.
        d["seeds_used"] = list(self._drawn) if hasattr(self, "_drawn") else (
            self.seeds if self.seed is not None else None)
        d["seeds_hidden"] = self.seed is None
        return d


@dataclass
class Plan:
    mode: str
    kernels: list[KernelSpec]
    settings: RunSettings
    baseline_index: Optional[int] = None
    baseline_source: str = ""
    overrides: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config_file: Optional[Path] = None
    environment: str = "local"
    # The resolved scheduler.ray / scheduler.container block (engine.cluster.settings) of a
    # non-local environment; None for local runs.
    scheduler: Optional[Any] = None

    def effective_config(self) -> dict:
        out = {
            "mode": self.mode,
            "config_file": str(self.config_file) if self.config_file else None,
            "environment": self.environment,
            "baseline": None if self.baseline_index is None else
            {"index": self.baseline_index, "id": self.kernels[self.baseline_index].id, "chosen_by": self.baseline_source},
            "kernels": [k.to_config() for k in self.kernels],
            "settings": self.settings.to_dict(),
            "overrides": self.overrides,
            "warnings": self.warnings,
        }
        if self.scheduler is not None:
            out["scheduler"] = {self.environment: self.scheduler.model_dump()}
        return out


@dataclass
class CliOptions:
    """The analyze/compare flags, None where not given on the command line."""
    kernels: list[str] = field(default_factory=list)
    kernel_config: Optional[str] = None
    testcase: Optional[str] = None
    type: Optional[str] = None
    compile_cmd: Optional[str] = None
    baseline: Optional[str] = None
    no_perf: bool = False
    repeats: Optional[int] = None
    warmup: Optional[int] = None
    timeout: Optional[float] = None
    seed: Optional[int] = None
    rtol: Optional[float] = None
    atol: Optional[float] = None
    workers: Optional[int] = None
    environment: Optional[str] = None
    only: Optional[list[str]] = None
    tie_margin: Optional[float] = None
    ray_address: Optional[str] = None
    docker_image: Optional[str] = None


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def _shell_command(text: str) -> list[Command]:
    # Validate quoting now so a typo fails before anything runs; run it through the shell
    # so quotes, pipes and && behave as typed.
    try:
        shlex.split(text)
    except ValueError as exc:
        raise ConfigError([f"command line: cannot parse {text!r}: {exc}"]) from None
    return [text]


def _entry_to_spec(entry: KernelEntry, index: int, base: Path, origin: str, problems: list[str],
                   where: str) -> KernelSpec:
    wd = _resolve(base, entry.working_dir) if entry.working_dir else base
    if not wd.is_dir():
        problems.append(f"{where}.working_dir: folder {wd} does not exist")
    spec = KernelSpec(
        index=index, id=entry.id, type=entry.type,
        source_files=[_resolve(base, s) for s in entry.source_files],
        working_dir=wd, env=dict(entry.env),
        compile=normalize_commands(entry.compile_command),
        testcase=normalize_commands(entry.testcase_command),
        prof=normalize_commands(entry.prof_command),
        get_inputs_func=entry.get_inputs_func, get_init_inputs_func=entry.get_init_inputs_func,
        model_class=entry.model_class,
        reference_file=_resolve(base, entry.reference_file) if entry.reference_file else None,
        baseline=entry.baseline, origin=origin, inplace=entry.inplace,
    )
    return spec


def _record(overrides: list[dict], field_name: str, yaml_value: Any, cli_value: Any, flag: str) -> None:
    if yaml_value != cli_value:
        overrides.append({"field": field_name, "yaml": yaml_value, "cli": cli_value, "flag": flag})


def build_plan(mode: str, opts: CliOptions, framework: dict | None = None) -> Plan:
    """``framework`` is the --config framework YAML (already loaded), used for defaults."""
    problems: list[str] = []
    overrides: list[dict] = []
    warnings: list[str] = []
    framework = framework or {}
    cfg: KernelConfigFile | None = None
    doc: LocatedYaml | None = None
    if opts.kernel_config:
        cfg, doc = load_kernel_config(opts.kernel_config, warnings)
        kernels = _kernels_from_config(cfg, doc, opts, overrides, warnings, problems)
    else:
        kernels = _kernels_from_files(mode, opts, problems)
    if opts.only:
        kernels = _select_only(kernels, opts, overrides, problems)
    for k in kernels:
        _apply_entry_flags(k, opts, cfg is not None, overrides)
    _check_kernels(kernels, problems)

    settings = _settings(cfg, doc, opts, framework, overrides, problems)
    plan = Plan(mode=mode, kernels=kernels, settings=settings, overrides=overrides, warnings=warnings,
                config_file=doc.path.resolve() if doc else None)
    plan.environment = _environment(cfg, doc, opts, framework, overrides)
    if plan.environment != "local":
        from engine.cluster.settings import resolve_scheduler
        plan.scheduler = resolve_scheduler(plan.environment, cfg, doc, opts, framework, overrides, problems)
    if mode == "compare":
        if len(kernels) < 2:
            problems.append(f"compare needs at least 2 kernels, got {len(kernels)}")
        else:
            _choose_baseline(plan, opts, problems)
    _check_correctness_paths(plan, problems)
    if problems:
        raise ConfigError(problems)
    return plan


def _kernels_from_config(cfg: KernelConfigFile, doc: LocatedYaml, opts: CliOptions, overrides: list[dict],
                         warnings: list[str], problems: list[str]) -> list[KernelSpec]:
    kernels: list[KernelSpec] = []
    base = doc.path.resolve().parent
    for i, entry in enumerate(cfg.entries()):
        loc = ("kernel",) if (cfg.kernel is not None and i == 0) else (
            "kernels", i - (1 if cfg.kernel is not None else 0))
        where = f"{doc.where(loc)}: {loc[0]}" + (f"[{loc[1]}]" if len(loc) > 1 else "")
        kernels.append(_entry_to_spec(entry, i, base, doc.where(loc), problems, where))
    if opts.kernels:
        warnings.append(f"positional kernel files {opts.kernels} ignored: --kernel-config gives the kernels")
        overrides.append({"field": "kernels", "yaml": [k.id for k in kernels], "cli": opts.kernels,
                          "flag": "positional", "note": "ignored in favour of --kernel-config"})
    return kernels


def _kernels_from_files(mode: str, opts: CliOptions, problems: list[str]) -> list[KernelSpec]:
    if not opts.kernels:
        raise ConfigError(["no kernels: give kernel files, or a kernel config with -k/--kernel-config"])
    kernels: list[KernelSpec] = []
    ktype = (opts.type or "hip")
    for i, f in enumerate(opts.kernels):
        path = Path(f).expanduser().resolve()
        if not path.is_file():
            problems.append(f"kernel file {f}: not found")
            continue
        kid = path.stem if mode == "analyze" else f"kernel_{i}_{path.stem}"
        kernels.append(KernelSpec(index=i, id=kid, type=ktype, source_files=[path], working_dir=path.parent,
                                  env={}, compile=[], testcase=[], prof=[], origin="command line"))
    return kernels


def _apply_entry_flags(k: KernelSpec, opts: CliOptions, from_config: bool, overrides: list[dict]) -> None:
    """Command-line flags that replace per-entry fields (recorded as overrides), then whether
    the entry runs in the harness."""
    if opts.testcase:
        new = _shell_command(opts.testcase)
        if from_config and k.testcase and k.testcase != new:
            _record(overrides, f"{k.id}.testcase_command", k.testcase, new, "--testcase")
        k.testcase = new
    if opts.compile_cmd:
        new = _shell_command(opts.compile_cmd)
        if from_config and k.compile and k.compile != new:
            _record(overrides, f"{k.id}.compile_command", k.compile, new, "--compile-cmd")
        k.compile = new
    if opts.type and from_config:
        alias = {"torch": "pytorch", "py": "pytorch"}.get(opts.type, opts.type)
        _record(overrides, f"{k.id}.type", k.type, alias, "--type")
        k.type = alias
    k.harness = (k.type in ("pytorch", "triton") and bool(k.source_files)
                 and k.source_files[0].is_file()
                 and follows_convention(k.source_files[0], k.get_inputs_func, k.model_class))


def _check_kernels(kernels: list[KernelSpec], problems: list[str]) -> None:
    seen: dict[str, int] = {}
    for k in kernels:
        if k.id in seen:
            problems.append(f"{k.origin}: id {k.id!r} is used twice (entries {seen[k.id]} and {k.index}); "
                            "ids name the log folders and report rows, so they must be unique")
        seen[k.id] = k.index
        for src in k.source_files:
            if not src.exists():
                problems.append(f"{k.origin}: {k.id}.source_files: {src} does not exist")
        if k.reference_file is not None and not k.reference_file.is_file():
            problems.append(f"{k.origin}: {k.id}.reference_file: {k.reference_file} does not exist")


def _select_only(kernels: list[KernelSpec], opts: CliOptions, overrides: list[dict],
                 problems: list[str]) -> list[KernelSpec]:
    """--only: run a subset of the config's kernels; the baseline always stays, so candidates
    are still checked and timed against it."""
    ids = [k.id for k in kernels]
    unknown = [i for i in opts.only or [] if i not in ids]
    if unknown:
        problems.append(f"--only: no kernel with id {', '.join(unknown)} in the config (ids: {', '.join(ids)})")
    keep = set(opts.only or []) | {k.id for k in kernels if k.baseline}
    if opts.baseline is not None:
        named = [k for k in kernels if str(opts.baseline) in (k.id, str(k.index))]
        keep |= {k.id for k in named}
        if named and str(opts.baseline).isdigit():
            opts.baseline = named[0].id  # the index meant the config's numbering, not the subset's
    if not any(k.baseline for k in kernels) and opts.baseline is None and kernels:
        keep.add(kernels[0].id)  # the default baseline is the first entry
    chosen = [k for k in kernels if k.id in keep]
    for i, k in enumerate(chosen):
        k.index = i
    overrides.append({"field": "kernels", "yaml": ids, "cli": [k.id for k in chosen], "flag": "--only"})
    return chosen


def _settings(cfg: KernelConfigFile | None, doc: LocatedYaml | None, opts: CliOptions, framework: dict,
              overrides: list[dict], problems: list[str]) -> RunSettings:
    perf = cfg.performance if cfg else PerformanceSettings()
    corr = cfg.correctness if cfg else CorrectnessSettings()
    fw_perf = framework.get("performance") or {}
    s = RunSettings()
    s.perf_backend = perf.backend if perf.backend != "auto" else fw_perf.get("backend", "auto") or "auto"
    if s.perf_backend in ("rocprof_compute", "metrix"):
        problems.append(f"framework config performance.backend {s.perf_backend!r} is not provided; use rocprofv3 or ncu")
    s.repeats, s.warmup = perf.repeats, perf.warmup
    s.l2_flush, s.cuda_graph = perf.l2_flush, perf.cuda_graph
    s.timer = "graph" if (perf.cuda_graph and perf.timer == "auto") else perf.timer
    s.tie_margin, s.rounds = perf.tie_margin, perf.rounds
    s.ncu_args = list(perf.ncu.args or (fw_perf.get("ncu") or {}).get("args") or [])
    s.ncu_metrics = list(perf.ncu.metrics)
    s.ncu_kernel_name = perf.ncu.kernel_name
    s.rocprof_args = list(perf.rocprofv3.args)
    if perf.timeout_seconds or fw_perf.get("timeout_seconds"):
        s.perf_timeout_s = float(perf.timeout_seconds or fw_perf["timeout_seconds"])
    if corr.timeout_seconds:
        s.correctness_timeout_s = float(corr.timeout_seconds)
    s.rtol, s.atol = corr.rtol, corr.atol
    s.n_seeds = corr.seeds or DEFAULT_SEEDS
    s.correctness_backend = corr.backend
    s.iteration_count = corr.iteration_count

    def cli(name: str, yaml_value: Any, value: Any, flag: str) -> Any:
        if value is None:
            return yaml_value
        if cfg is not None and yaml_value is not None and yaml_value != value:
            _record(overrides, name, yaml_value, value, flag)
        return value

    s.repeats = cli("performance.repeats", s.repeats, opts.repeats, "--repeats")
    s.warmup = cli("performance.warmup", s.warmup, opts.warmup, "--warmup")
    s.rtol = cli("correctness.rtol", s.rtol, opts.rtol, "--rtol")
    s.atol = cli("correctness.atol", s.atol, opts.atol, "--atol")
    if opts.tie_margin is not None:
        if not 0 <= opts.tie_margin < 1:
            problems.append(f"--tie-margin {opts.tie_margin}: give a fraction in [0, 1), e.g. 0.02 for 2%")
        s.tie_margin = cli("performance.tie_margin", s.tie_margin, opts.tie_margin, "--tie-margin")
    if opts.seed is not None:
        s.seed = opts.seed
    if opts.timeout is not None:
        for attr, name in (("compile_timeout_s", "compile"), ("correctness_timeout_s", "correctness.timeout_seconds"),
                           ("perf_timeout_s", "performance.timeout_seconds")):
            old = getattr(s, attr)
            if old != DEFAULT_COMMAND_TIMEOUT_S and old != opts.timeout:
                _record(overrides, name, old, opts.timeout, "--timeout")
            setattr(s, attr, float(opts.timeout))
    if opts.no_perf:
        if cfg is not None and perf.backend not in ("auto", "none"):
            _record(overrides, "performance.backend", perf.backend, "none", "--no-perf")
        s.perf_enabled = False
    if s.perf_backend == "none":
        s.perf_enabled = False
    workers = opts.workers or (cfg.scheduler.max_workers if cfg and cfg.scheduler.max_workers else None) or \
        (framework.get("scheduler") or {}).get("max_workers") or 1
    s.workers = max(1, int(workers))
    return s


def _environment(cfg: KernelConfigFile | None, doc: LocatedYaml | None, opts: CliOptions, framework: dict,
                 overrides: list[dict]) -> str:
    yaml_env = None
    if cfg is not None:
        if cfg.ray_config is not None:
            yaml_env = "ray"
        if doc is not None and isinstance(doc.data, dict) and "environment" in (doc.data.get("scheduler") or {}):
            yaml_env = cfg.scheduler.environment
    if opts.environment:
        if yaml_env and yaml_env != opts.environment:
            _record(overrides, "scheduler.environment", yaml_env, opts.environment, "--environment")
        return opts.environment
    return yaml_env or (framework.get("scheduler") or {}).get("environment") or "local"


def _choose_baseline(plan: Plan, opts: CliOptions, problems: list[str]) -> None:
    marked = [k.index for k in plan.kernels if k.baseline]
    if len(marked) > 1:
        problems.append(f"more than one entry has baseline: true ({[plan.kernels[i].id for i in marked]})")
        return
    if opts.baseline is not None:
        chosen = None
        text = str(opts.baseline)
        if text.lstrip("-").isdigit():
            idx = int(text)
            if not 0 <= idx < len(plan.kernels):
                problems.append(f"--baseline {idx}: index out of range (0..{len(plan.kernels) - 1})")
                return
            chosen = idx
        else:
            ids = [k.id for k in plan.kernels]
            if text not in ids:
                problems.append(f"--baseline {text!r}: no kernel with that id (ids: {', '.join(ids)})")
                return
            chosen = ids.index(text)
        if marked and marked[0] != chosen:
            plan.overrides.append({"field": "baseline", "yaml": plan.kernels[marked[0]].id,
                                   "cli": plan.kernels[chosen].id, "flag": "--baseline"})
        plan.baseline_index, plan.baseline_source = chosen, "--baseline"
    elif marked:
        plan.baseline_index, plan.baseline_source = marked[0], "baseline: true"
    else:
        plan.baseline_index, plan.baseline_source = 0, "first entry"
    for k in plan.kernels:
        k.baseline = k.index == plan.baseline_index


def _check_correctness_paths(plan: Plan, problems: list[str]) -> None:
    """An entry with no way to check its correctness is an error, not a pass."""
    backend = plan.settings.correctness_backend
    for k in plan.kernels:
        harness_ok = k.harness and backend != "testcase"
        if harness_ok:
            if plan.mode == "compare":
                continue  # the baseline is the reference; candidates are compared with it
            if k.reference_file is not None:
                continue
        if k.testcase and backend != "harness":
            continue
        if backend == "harness" and not k.harness:
            problems.append(f"{k.origin}: {k.id}: correctness.backend is 'harness' but "
                            f"{k.source_files[0] if k.source_files else 'the entry'} does not define "
                            f"Model/ModelNew and {k.get_inputs_func}()")
            continue
        if k.harness and plan.mode == "analyze":
            problems.append(f"{k.origin}: {k.id}: no way to check correctness: add testcase_command, or "
                            "reference_file (a module whose Model gives the expected outputs)")
        else:
            problems.append(f"{k.origin}: {k.id}: no way to check correctness: add testcase_command "
                            "(its exit code is the check)" + (
                                ", or write the kernel as a module with Model and get_inputs()"
                                if k.type in ("pytorch", "triton") else ""))

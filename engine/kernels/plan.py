"""From YAML + command-line flags to an evaluation plan: resolved kernels and run settings.

Rules: paths resolve as Magpie resolves them: a relative ``working_dir`` against the current
directory (``${MAGPIE_CONFIG_DIR}`` names the YAML's folder), an entry with commands and no
``working_dir`` runs them in the current directory; relative ``source_files`` / ``reference_file``
against the working_dir where the file is there, else the current directory, else the YAML's
folder. A CLI flag that conflicts with the YAML wins and is recorded in ``overrides``; a Magpie
field that maps onto
this tool's own settings is recorded in ``notes``, one it does not honour is a warning naming
it; anything that cannot be honoured at all is an error before anything runs, never a silent
drop. ``Plan.describe()`` is the plan as plain data (``--dry-run``).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from engine.config.kernel import (
    CONFIG_DIR_VARIABLE, BenchTarget, Command, CorrectnessSettings, KernelConfigFile, KernelEntry, LatencySettings,
    PerformanceSettings, config_variables, load_kernel_config, normalize_commands,
)
from engine.config.yamlfile import ConfigError, LocatedYaml, unset_variables
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
    working_dir_from: str = ""  # how working_dir was chosen (shown in the plan)
    pythonpath: list[Path] = field(default_factory=list)  # put first on the PYTHONPATH of its processes
    # Magpie's bench_target: the harness calls harness_module's function model_class(*get_inputs()).
    bench_target: Optional[dict] = None
    harness_module: Optional[Path] = None  # the module the harness loads, when not source_files[0]
    call_function: bool = False  # model_class names a function called with the inputs (no class to build)

    @property
    def module_file(self) -> Optional[Path]:
        """The Python module the harness loads for this kernel."""
        return self.harness_module or (self.source_files[0] if self.source_files else None)

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
            "working_dir_from": self.working_dir_from, "pythonpath": [str(p) for p in self.pythonpath],
            "bench_target": self.bench_target,
            "harness_module": str(self.harness_module) if self.harness_module else None,
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
    # correctness.backend accordo: Magpie's accordo block, resolved (engine.kernels.accordo).
    accordo: Optional[dict] = None

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
    cwd: Optional[Path] = None  # the current directory relative paths resolved against
    notes: list[str] = field(default_factory=list)  # Magpie fields mapped onto this tool's settings

    def describe(self) -> dict:
        """The plan as plain data (JSON-ready): what ``--dry-run`` prints, what an MCP tool can return."""
        from engine.kernels.describe import describe_plan
        return describe_plan(self)

    def plan_lines(self) -> list[str]:
        """``describe()`` as the lines a terminal shows."""
        from engine.kernels.describe import plan_lines
        return plan_lines(self.describe())

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
            "notes": self.notes,
            "cwd": str(self.cwd) if self.cwd else None,
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
    cwd: Optional[str] = None  # the folder relative paths resolve against (default: the current directory)


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def _unset_note(raw: str, variables: dict[str, str]) -> str:
    names = unset_variables(raw, variables)
    return ", ".join(f"${n}" for n in names) + (" is" if len(names) == 1 else " are") + " not set" if names else ""


@dataclass
class _Where:
    """Where an entry is: its YAML (and folder), its file:line, the current directory."""
    doc: LocatedYaml
    loc: tuple
    cwd: Path
    variables: dict[str, str]
    kernel_id: str = "kernel"

    @property
    def yaml_dir(self) -> Path:
        return self.doc.path.resolve().parent

    def at(self, field_name: str) -> str:
        """``file:line: <kernel id>.working_dir``"""
        name, _, index = field_name.partition("[")
        path = (name, int(index.rstrip("]"))) if index else (name,)
        return f"{self.doc.where(self.loc + path)}: {self.kernel_id}.{field_name}"


def _find_file(raw: str, wd: Path, w: _Where, what: str, problems: list[str], warnings: list[str],
               kernel_id: str) -> Path:
    """A relative source / reference file: in the working_dir when it is there, else in the current
    directory, else next to the YAML; missing from all: the working_dir's path, reported."""
    p = Path(raw).expanduser()
    unset = _unset_note(raw, w.variables)
    if p.is_absolute() or unset:
        if not p.exists() and not (wd / p).exists():
            problems.append(f"{w.at(what)}: {raw}: " + (f"{unset}: export it" if unset else f"{p} does not exist"))
        return p.resolve() if p.is_absolute() else (wd / p).resolve()
    in_wd = (wd / p).resolve()
    if in_wd.exists():
        return in_wd
    in_cwd = (w.cwd / p).resolve()
    if in_cwd.exists():  # a path as Magpie's process sees it (its template writes them so)
        return in_cwd
    beside = (w.yaml_dir / p).resolve()
    if beside.exists():
        if wd != w.yaml_dir:
            warnings.append(f"{w.at(what)}: {raw} is not in the working_dir {wd}; taken from the YAML's folder "
                            f"({beside}). Magpie resolves it against the working_dir: write "
                            f"${{{CONFIG_DIR_VARIABLE}}}/{raw} to say where it is")
        return beside
    looked = "" if wd == w.yaml_dir else (f" (looked in the working_dir {wd}, the current directory and next to "
                                          f"the YAML in {w.yaml_dir})")
    problems.append(f"{w.at(what)}: {raw}: {in_wd} does not exist{looked}")
    return in_wd


def _working_dir(entry: KernelEntry, w: _Where, has_commands: bool, problems: list[str]) -> tuple[Path, str]:
    if entry.working_dir:
        raw = entry.working_dir
        wd = _resolve(w.cwd, raw)
        if not wd.is_dir():
            unset = _unset_note(raw, w.variables)
            if unset:
                problems.append(f"{w.at('working_dir')} {raw}: {unset}: export it (as written, the folder does "
                                "not exist)")
            else:
                msg = f"{w.at('working_dir')} {raw}: folder {wd} does not exist"
                if not Path(raw).expanduser().is_absolute():
                    msg += f" (a relative working_dir is relative to the current directory {w.cwd}, as in Magpie"
                    beside = (w.yaml_dir / raw).resolve()
                    msg += (f"; for the folder next to the YAML write ${{{CONFIG_DIR_VARIABLE}}}/{raw}"
                            if beside.is_dir() else "") + ")"
                problems.append(msg)
        return wd, "working_dir"
    if has_commands:
        return w.cwd, "the current directory (no working_dir: Magpie runs the commands there)"
    return w.yaml_dir, "the YAML's folder (no working_dir and no command to run: the harness worker runs there)"


def _shell_command(text: str) -> list[Command]:
    # Validate quoting now so a typo fails before anything runs; run it through the shell
    # so quotes, pipes and && behave as typed.
    try:
        shlex.split(text)
    except ValueError as exc:
        raise ConfigError([f"command line: cannot parse {text!r}: {exc}"]) from None
    return [text]


def _entry_to_spec(entry: KernelEntry, index: int, w: _Where, problems: list[str], warnings: list[str],
                   cli_commands: bool, latency: Optional[LatencySettings]) -> KernelSpec:
    has_commands = bool(entry.compile_command or entry.testcase_command or entry.prof_command or cli_commands)
    wd, wd_from = _working_dir(entry, w, has_commands, problems)
    spec = KernelSpec(
        index=index, id=entry.id, type=entry.type,
        source_files=[_find_file(s, wd, w, f"source_files[{i}]" if len(entry.source_files) > 1 else "source_files",
                                 problems, warnings, entry.id) for i, s in enumerate(entry.source_files)],
        working_dir=wd, env=dict(entry.env),
        compile=normalize_commands(entry.compile_command),
        testcase=normalize_commands(entry.testcase_command),
        prof=normalize_commands(entry.prof_command),
        get_inputs_func=entry.get_inputs_func, get_init_inputs_func=entry.get_init_inputs_func,
        model_class=entry.model_class,
        reference_file=_find_file(entry.reference_file, wd, w, "reference_file", problems, warnings, entry.id)
        if entry.reference_file else None,
        baseline=entry.baseline, origin=w.doc.where(w.loc), inplace=entry.inplace, working_dir_from=wd_from,
    )
    if latency is not None and latency.pythonpath:
        spec.pythonpath = [_resolve(w.cwd, x) for x in latency.pythonpath]
    target = entry.bench_target or (latency.bench_target if latency is not None else None)
    if target is not None:
        field_name = "bench_target" if entry.bench_target else "latency.bench_target"
        _bench_target(spec, target, field_name, w, warnings)
    return spec


def _bench_target(spec: KernelSpec, target: BenchTarget, field_name: str, w: _Where, warnings: list[str]) -> None:
    """Magpie's ``module.callable(*get_inputs())``: the harness loads the module's file and calls
    the function with the module's inputs, when it can find that file."""
    spec.bench_target = target.model_dump()
    where = f"{w.doc.where(w.loc)}: {spec.id}.{field_name}"
    if spec.type not in ("pytorch", "triton"):
        warnings.append(f"{where}: not used: the Python harness runs pytorch and triton kernels; this {spec.type} "
                        "kernel is timed around its testcase instead")
        return
    rel = Path(*target.module.split("."))
    dirs = list(dict.fromkeys([*spec.pythonpath, spec.working_dir, w.yaml_dir, *(f.parent for f in spec.source_files)]))
    found = next((c for d in dirs for c in (d / rel.with_suffix(".py"), d / rel / "__init__.py") if c.is_file()), None)
    if found is None:
        warnings.append(f"{where}: module {target.module} not found (looked for {rel.with_suffix('.py')} in "
                        f"{', '.join(str(d) for d in dirs)}): not used; put its folder in latency.pythonpath. "
                        "The kernel is timed around its testcase instead")
        return
    if not follows_convention(found, target.get_inputs, target.callable):
        warnings.append(f"{where}: {found} defines no {target.callable}() and {target.get_inputs}() at its top "
                        "level: not used; the kernel is timed around its testcase instead")
        return
    spec.harness_module = found.resolve()
    spec.model_class, spec.get_inputs_func, spec.call_function = target.callable, target.get_inputs, True


def _record(overrides: list[dict], field_name: str, yaml_value: Any, cli_value: Any, flag: str) -> None:
    if yaml_value != cli_value:
        overrides.append({"field": field_name, "yaml": yaml_value, "cli": cli_value, "flag": flag})


def build_plan(mode: str, opts: CliOptions, framework: dict | None = None) -> Plan:
    """``framework`` is the --config framework YAML (already loaded), used for defaults."""
    problems: list[str] = []
    overrides: list[dict] = []
    warnings: list[str] = []
    notes: list[str] = []
    framework = framework or {}
    cwd = Path(opts.cwd).expanduser().resolve() if opts.cwd else Path.cwd()
    cfg: KernelConfigFile | None = None
    doc: LocatedYaml | None = None
    if opts.kernel_config:
        config_path = Path(opts.kernel_config).expanduser()
        if not config_path.is_absolute() and cwd != Path.cwd():
            config_path = cwd / config_path  # as typed where the request was made
        cfg, doc = load_kernel_config(config_path, warnings)
        kernels = _kernels_from_config(cfg, doc, opts, cwd, overrides, warnings, problems)
    else:
        kernels = _kernels_from_files(mode, opts, cwd, problems)
    if opts.only:
        kernels = _select_only(kernels, opts, overrides, problems)
    for k in kernels:
        _apply_entry_flags(k, opts, cfg is not None, overrides, warnings)
    _check_kernels(kernels, problems)

    settings = _settings(cfg, doc, opts, framework, overrides, problems, notes, warnings, cwd)
    plan = Plan(mode=mode, kernels=kernels, settings=settings, overrides=overrides, warnings=warnings,
                config_file=doc.path.resolve() if doc else None, cwd=cwd, notes=notes)
    if cfg is not None and cfg.latency is not None:
        _latency(cfg.latency, plan, warnings, notes)
    plan.environment = _environment(cfg, doc, opts, framework, overrides)
    if cfg is not None and cfg.ray_config is not None:
        _ray_config(cfg, doc, plan, warnings, notes)
    if plan.environment != "local":
        from engine.cluster.settings import resolve_scheduler
        plan.scheduler = resolve_scheduler(plan.environment, cfg, doc, opts, framework, overrides, problems)
    if mode == "compare":
        if len(kernels) < 2:
            problems.append(f"compare needs at least 2 kernels, got {len(kernels)}")
        else:
            _choose_baseline(plan, opts, problems)
            _one_reference(plan, problems)
    _check_correctness_paths(plan, problems)
    if problems:
        raise ConfigError(problems)
    return plan


def _kernels_from_config(cfg: KernelConfigFile, doc: LocatedYaml, opts: CliOptions, cwd: Path,
                         overrides: list[dict], warnings: list[str], problems: list[str]) -> list[KernelSpec]:
    kernels: list[KernelSpec] = []
    variables = config_variables(doc.path)
    cli_commands = bool(opts.testcase or opts.compile_cmd)
    for i, entry in enumerate(cfg.entries()):
        loc = ("kernel",) if (cfg.kernel is not None and i == 0) else (
            "kernels", i - (1 if cfg.kernel is not None else 0))
        w = _Where(doc=doc, loc=loc, cwd=cwd, variables=variables, kernel_id=entry.id)
        kernels.append(_entry_to_spec(entry, i, w, problems, warnings, cli_commands, cfg.latency))
    if opts.kernels:
        warnings.append(f"positional kernel files {opts.kernels} ignored: --kernel-config gives the kernels")
        overrides.append({"field": "kernels", "yaml": [k.id for k in kernels], "cli": opts.kernels,
                          "flag": "positional", "note": "ignored in favour of --kernel-config"})
    return kernels


def _kernels_from_files(mode: str, opts: CliOptions, cwd: Path, problems: list[str]) -> list[KernelSpec]:
    if not opts.kernels:
        raise ConfigError(["no kernels: give kernel files, or a kernel config with -k/--kernel-config"])
    kernels: list[KernelSpec] = []
    ktype = (opts.type or "hip")
    for i, f in enumerate(opts.kernels):
        path = _resolve(cwd, f)
        if not path.is_file():
            problems.append(f"kernel file {f}: not found")
            continue
        kid = path.stem if mode == "analyze" else f"kernel_{i}_{path.stem}"
        kernels.append(KernelSpec(index=i, id=kid, type=ktype, source_files=[path], working_dir=path.parent,
                                  env={}, compile=[], testcase=[], prof=[], origin="command line",
                                  working_dir_from="the kernel file's folder (as in Magpie)"))
    return kernels


def _apply_entry_flags(k: KernelSpec, opts: CliOptions, from_config: bool, overrides: list[dict],
                       warnings: list[str]) -> None:
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
    module = k.module_file
    k.harness = (k.type in ("pytorch", "triton") and module is not None and module.is_file()
                 and follows_convention(module, k.get_inputs_func, k.model_class))


def _check_kernels(kernels: list[KernelSpec], problems: list[str]) -> None:
    seen: dict[str, int] = {}
    for k in kernels:
        if k.id in seen:
            problems.append(f"{k.origin}: id {k.id!r} is used twice (entries {seen[k.id]} and {k.index}); "
                            "ids name the log folders and report rows, so they must be unique")
        seen[k.id] = k.index


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
              overrides: list[dict], problems: list[str], notes: list[str], warnings: list[str],
              cwd: Path) -> RunSettings:
    perf = cfg.performance if cfg else PerformanceSettings()
    corr = cfg.correctness if cfg else CorrectnessSettings()
    lat = cfg.latency if cfg else None
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
    if lat is not None:
        _latency_settings(lat, perf, s, notes, warnings)
    _accordo_settings(cfg, doc, corr, framework, s, problems, warnings, cwd)

    def cli(name: str, yaml_value: Any, value: Any, flag: str) -> Any:
        if value is None:
            return yaml_value
        if cfg is not None and yaml_value is not None and yaml_value != value:
            _record(overrides, name, yaml_value, value, flag)
        return value

    s.repeats = cli("performance.repeats", s.repeats, opts.repeats, "--repeats")
    s.warmup = cli("performance.warmup" if perf.warmup is not None else "latency.warmup_iters", s.warmup,
                   opts.warmup, "--warmup")
    if s.accordo is not None:
        s.accordo["rtol"] = cli("correctness.accordo.rtol", s.accordo["rtol"], opts.rtol, "--rtol")
        s.accordo["atol"] = cli("correctness.accordo.atol", s.accordo["atol"], opts.atol, "--atol")
    s.rtol = cli("correctness.rtol", s.rtol, opts.rtol, "--rtol")
    s.atol = cli("correctness.atol", s.atol, opts.atol, "--atol")
    if opts.tie_margin is not None:
        if not 0 <= opts.tie_margin < 1:
            problems.append(f"--tie-margin {opts.tie_margin}: give a fraction in [0, 1), e.g. 0.02 for 2%")
        s.tie_margin = cli("performance.tie_margin", s.tie_margin, opts.tie_margin, "--tie-margin")
    if opts.seed is not None:
        if s.seed is not None and s.seed != opts.seed:
            _record(overrides, "latency.seed", s.seed, opts.seed, "--seed")
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


def _latency_settings(lat: LatencySettings, perf: PerformanceSettings, s: RunSettings, notes: list[str],
                      warnings: list[str]) -> None:
    """Magpie's ``latency:`` keys that are settings of this tool's performance stage."""
    if lat.warmup_iters is not None:
        if perf.warmup is None:
            s.warmup = lat.warmup_iters
            notes.append(f"latency.warmup_iters {lat.warmup_iters} -> performance.warmup (untimed harness calls "
                         "before timing)")
        else:
            warnings.append(f"latency.warmup_iters {lat.warmup_iters}: not used: performance.warmup {perf.warmup} "
                            "is given")
    if lat.seed is not None:
        s.seed = lat.seed
        notes.append(f"latency.seed {lat.seed} -> the harness's input seeds {lat.seed}, {lat.seed + 1}, ... "
                     "(fixed, so not hidden from the kernels)")
    if lat.timeout_seconds is not None:
        if perf.timeout_seconds is None:
            s.perf_timeout_s = float(lat.timeout_seconds)
            notes.append(f"latency.timeout_seconds {lat.timeout_seconds:g} -> performance.timeout_seconds "
                         "(each timing run)")
        else:
            warnings.append(f"latency.timeout_seconds {lat.timeout_seconds:g}: not used: "
                            f"performance.timeout_seconds {perf.timeout_seconds:g} is given")
    if lat.kernel_filter:
        if not s.ncu_kernel_name:
            s.ncu_kernel_name = f"regex:{lat.kernel_filter}"
        if "--kernel-include-regex" not in s.rocprof_args:
            s.rocprof_args += ["--kernel-include-regex", lat.kernel_filter]
        notes.append(f"latency.kernel_filter {lat.kernel_filter!r} -> ncu --kernel-name regex:{lat.kernel_filter} "
                     f"and rocprofv3 --kernel-include-regex {lat.kernel_filter}")


def _latency(lat: LatencySettings, plan: Plan, warnings: list[str], notes: list[str]) -> None:
    """The ``latency:`` keys that depend on the kernels: the method, the metric, Magpie's own
    repetition knobs; each either maps onto the performance stage or is named with what is used."""
    s = plan.settings
    harness = [k.id for k in plan.kernels if k.harness]
    others = [k.id for k in plan.kernels if not k.harness]
    auto = ("the timing backend chosen per kernel (performance.backend auto: the harness for Python modules, "
            "else the testcase's MAGPIE_TIMING_JSON line, ncu on NVIDIA, rocprofv3 on AMD)")
    if lat.pythonpath:
        notes.append(f"latency.pythonpath -> first on the PYTHONPATH of every kernel process: "
                     f"{', '.join(str(p) for p in plan.kernels[0].pythonpath) if plan.kernels else ''}")
        for p in plan.kernels[0].pythonpath if plan.kernels else []:
            if not p.is_dir():
                warnings.append(f"latency.pythonpath: {p} does not exist (relative entries are relative to the "
                                f"current directory, as in Magpie; ${{{CONFIG_DIR_VARIABLE}}} names the YAML's folder)")
    for k in plan.kernels:
        if k.call_function and k.harness:
            notes.append(f"{k.id}.bench_target -> the harness calls {k.model_class}(*{k.get_inputs_func}()) from "
                         f"{k.module_file}")
    if not lat.enabled:
        warnings.append("latency.enabled false: kernels are still timed in the performance stage (this tool has no "
                        "separate latency stage); give --no-perf to skip timing")
    method = lat.method
    if method == "cuda_graph":
        if harness and s.timer == "auto":
            s.timer = "graph"
            notes.append(f"latency.method cuda_graph -> performance.timer graph (CUDA/HIP-graph replay) for "
                         f"{', '.join(harness)}")
        if others:
            warnings.append(f"latency.method cuda_graph: {', '.join(others)} not run by the Python harness: timed by "
                            f"{auto}; a MAGPIE_LATENCY_JSON line is not read (print MAGPIE_TIMING_JSON: "
                            '{"samples_ms": [...]} instead)')
    elif method in ("kernel_trace", "rocprof_timestamps"):
        notes.append(f"latency.method {method} -> device-side kernel times: the harness's device trace "
                     "(performance.timer trace) for Python modules, rocprofv3 kernel trace (AMD) / ncu (NVIDIA) "
                     "around the testcase otherwise")
    elif method == "both":
        warnings.append("latency.method both: the wall-minus-kernel dispatch overhead and the rocprof cross-check "
                        f"are not reported; kernels are timed once, by {auto}")
    elif method == "none":
        warnings.append("latency.method none: kernels are still timed in the performance stage; give --no-perf to "
                        "skip timing")
    if lat.primary_metric == "wall_median_ms":
        warnings.append("latency.primary_metric wall_median_ms: not available; verdicts use the median of the timing "
                        "backend's samples (device time on a GPU: the harness's trace or graph replay, ncu, "
                        "rocprofv3)")
    elif lat.primary_metric == "kernel_median_ms":
        notes.append("latency.primary_metric kernel_median_ms -> the median of the timing backend's samples "
                     "(device time on a GPU)")
    instead = {"rep_ms": "the harness picks the calls per round itself (performance.repeats / --repeats)",
               "n_retries": f"performance.rounds ({s.rounds}) interleaved rounds, the median over all their samples",
               "estimate_reps": "the harness estimates a call's time in its warm-up",
               "output_dir": "results are in the run folder (-o), under performance in the report"}
    for key, what in instead.items():
        value = getattr(lat, key)
        if value is not None:
            warnings.append(f"latency.{key} {value:g}: not used: {what}" if isinstance(value, float) else
                            f"latency.{key} {value}: not used: {what}")
    if lat.kernel_filter and harness:
        warnings.append(f"latency.kernel_filter {lat.kernel_filter!r}: not used for {', '.join(harness)}: the Python "
                        "harness times the whole call (every kernel it launches, on every stream)")


def _ray_config(cfg: KernelConfigFile, doc: Optional[LocatedYaml], plan: Plan, warnings: list[str],
                notes: list[str]) -> None:
    rc = cfg.ray_config
    where = doc.where(("ray_config",)) if doc is not None else "ray_config"
    if plan.environment != "ray":
        warnings.append(f"{where}: ray_config: not used: the kernels run in the {plan.environment!r} environment "
                        "(-e/--environment or scheduler.environment says so)")
        return
    notes.append("ray_config -> environment ray (as in Magpie)")
    notes.extend(rc.mapped())
    for name, why in rc.unmapped():
        at = doc.where(("ray_config", name.split(".", 1)[1])) if doc is not None else where
        warnings.append(f"{at}: {name}: not used: {why}")


def _accordo_settings(cfg: KernelConfigFile | None, doc: LocatedYaml | None, corr: CorrectnessSettings,
                      framework: dict, s: RunSettings, problems: list[str], warnings: list[str], cwd: Path) -> None:
    """correctness.backend accordo: Magpie's accordo block (the framework config's defaults, then the
    kernel YAML's), checked now so a missing key fails before anything runs."""
    fw = framework.get("correctness") or {}
    backend = corr.backend
    # The framework config's backend: accordo is taken; Magpie's default "testcase" is this tool's
    # auto (the testcase's exit code, plus the harness's output comparison where it can run).
    if backend == "auto" and fw.get("backend") == "accordo":
        backend = s.correctness_backend = "accordo"
    where = doc.where(("correctness",)) if doc is not None else "correctness"
    if backend != "accordo":
        if corr.accordo is not None:
            warnings.append(f"{where}: correctness.accordo: not used: correctness.backend is {backend!r} "
                            "(set backend: accordo to validate with IntelliKit Accordo)")
        return
    from engine.config.kernel import AccordoSettings
    merged = dict(fw.get("accordo") or {})
    if corr.accordo is not None:
        merged.update(corr.accordo.model_dump(exclude_unset=True))
    try:
        acc = AccordoSettings.model_validate(merged)
    except Exception as exc:  # pydantic names the field (a framework-config value)
        problems.append(f"{where}: correctness.accordo: {exc}")
        return
    missing = [k for k in ("kernel_name", "reference_binary", "optimized_binary") if not getattr(acc, k)]
    if missing:
        problems.append(f"{where}: correctness.backend accordo needs correctness.accordo.{', '.join(missing)} "
                        "(the kernel to intercept and the two binaries it compares)")
    s.accordo = acc.model_dump()
    if acc.working_directory:
        s.accordo["working_directory"] = str(_resolve(cwd, acc.working_directory))
    if acc.kernel_args:
        s.accordo["kernel_args"] = [list(a) for a in acc.kernel_args]
    if corr.rtol is not None or corr.atol is not None:
        warnings.append(f"{where}: correctness.rtol/atol: not used with backend accordo: "
                        "correctness.accordo.rtol/atol are Accordo's tolerances")


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


def compare_reference(kernels: list[KernelSpec]) -> Optional[Path]:
    """The ``reference_file`` a compare judges every kernel against (the baseline included), or
    None: then the baseline's outputs are the reference. ``build_plan`` lets a compare name one."""
    return next((k.reference_file for k in kernels if k.reference_file is not None), None)


def _one_reference(plan: Plan, problems: list[str]) -> None:
    """A compare has one reference for correctness: the ``reference_file`` its entries name. Two
    different files are a configuration error (the kernels would not compute the same thing, so
    their speeds could not be compared); an entry that names none is judged against the one
    named, which every entry then carries (in the effective config and on Ray and container
    workers alike)."""
    named: dict[Path, list[str]] = {}
    for k in plan.kernels:
        if k.reference_file is not None:
            named.setdefault(k.reference_file, []).append(k.id)
    if len(named) > 1:
        problems.append("a compare judges every kernel against one reference, but the entries name different "
                        "reference_file modules: " + "; ".join(f"{f} ({', '.join(ids)})" for f, ids in named.items())
                        + ": give the same file on every entry that names one (or compare them in separate runs)")
        return
    if not named:
        return
    ref_file, ids = next(iter(named.items()))
    others = [k.id for k in plan.kernels if k.reference_file is None]
    for k in plan.kernels:
        k.reference_file = ref_file
    base = plan.kernels[plan.baseline_index].id if plan.baseline_index is not None else None
    also = f" (also {', '.join(others)}, which name none)" if others else ""
    plan.notes.append(f"reference_file {ref_file} (named by {', '.join(ids)}) judges the outputs of every kernel the "
                      f"harness runs, the baseline {base} included{also}; speedups are still measured against the baseline")


def _check_correctness_paths(plan: Plan, problems: list[str]) -> None:
    """An entry with no way to check its correctness is an error, not a pass."""
    backend = plan.settings.correctness_backend
    if backend == "accordo":
        return  # Accordo compares the two binaries of the accordo block for every kernel
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
                            f"{k.module_file or 'the entry'} does not define "
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

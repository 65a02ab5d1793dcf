"""What a front end needs around ``submit`` to start a run from a config file: the typed request
a launch form builds (``form_request``), the equivalent command line shown before it starts
(``command_line``), the folder it runs in (``launch_cwd``), the config it would record
(``effective_config``), the request that resumes a loop (``resume_request``) and the console log
the detached process writes (``find_console_log``).

A launch is then ``submit(request, output_dir, executor="local-process", cwd=launch_cwd(request))``:
the run gets its own session and process group, writes its own run folder, and keeps going when
the front end exits or its terminal disappears. The command line is for the user to read and
copy; the run itself is the typed request, not those flags.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import ValidationError

from engine.config.overrides import OVERRIDES, BenchmarkOverrides
from engine.config.yamlfile import ConfigError
from engine.jobs.requests import BenchmarkRequest, KernelRequest, LoopRequest, TraceDiffRequest, TraceRequest

MODES = ("analyze", "compare", "benchmark", "optimize")

# The launch form's benchmark overrides: form field -> BenchmarkOverrides field, in the order the
# equivalent command line shows them (tests/unit/test_overrides.py checks them against the
# model's form=True fields).
BENCH_FORM_FIELDS = {"repeats": "repeats", "concurrency": "concurrency", "input_len": "input_len",
                     "output_len": "output_len", "num_prompts": "num_prompts", "warmup": "warmup",
                     "timeout": "timeout", "seed": "seed", "profiler": "torch_profiler"}

# The launch form's fields (None: keep the config's value), by the modes that use them.
FORM_FIELDS = ("repeats", "baseline", "concurrency", "input_len", "output_len", "num_prompts", "profiler", "only",
               "until", "warmup", "timeout", "seed", "rtol", "atol", "no_perf", "kernel", "candidates", "library")

Request = Union[KernelRequest, BenchmarkRequest, LoopRequest, TraceRequest]


def _unknown_mode(mode: Any) -> ValueError:
    return ValueError(f"unknown mode {mode!r}: analyze, compare, benchmark or optimize")


def form_request(mode: str, config: Union[Path, str], *, repeats: Optional[int] = None,
                 baseline: Optional[str] = None, concurrency: Optional[int] = None,
                 input_len: Optional[int] = None, output_len: Optional[int] = None,
                 num_prompts: Optional[int] = None, profiler: Optional[bool] = None,
                 only: Optional[list[str]] = None, until: Optional[str] = None, warmup: Optional[int] = None,
                 timeout: Optional[float] = None, seed: Optional[int] = None, rtol: Optional[float] = None,
                 atol: Optional[float] = None, no_perf: bool = False, kernel: Optional[str] = None,
                 candidates: Optional[list[str]] = None, library: bool = True) -> Request:
    """The typed request of a launch form: ``mode`` (analyze | compare | benchmark | optimize) on
    the config file, with the common overrides (None: keep the config's value). Fields a mode
    does not take are left out: a baseline only for compare; only, rtol, atol and no_perf for
    analyze/compare; the benchmark overrides (``BENCH_FORM_FIELDS``) for benchmark; until for
    optimize, with the op to optimise (kernel), candidate paths and whether the bundled library's
    candidates join them. warmup: untimed calls (analyze/compare) or warm-up requests (benchmark);
    timeout: per command (analyze/compare) or the whole run (benchmark)."""
    try:
        return _form_request(mode, str(Path(config).resolve()), repeats=repeats, baseline=baseline,
                             concurrency=concurrency, input_len=input_len, output_len=output_len,
                             num_prompts=num_prompts, profiler=profiler, only=only, until=until, warmup=warmup,
                             timeout=timeout, seed=seed, rtol=rtol, atol=atol, no_perf=no_perf, kernel=kernel,
                             candidates=candidates, library=library)
    except ValidationError as exc:  # a value of the wrong type: named by its field, as a config problem
        raise ConfigError([f"launch form: {'.'.join(str(p) for p in e['loc']) or mode}: {e['msg']}"
                           for e in exc.errors()]) from None


def _form_request(mode: str, path: str, *, repeats: Any, baseline: Any, concurrency: Any, input_len: Any,
                  output_len: Any, num_prompts: Any, profiler: Any, only: Any, until: Any, warmup: Any, timeout: Any,
                  seed: Any, rtol: Any, atol: Any, no_perf: bool, kernel: Any, candidates: Any, library: bool) -> Request:
    if mode in ("analyze", "compare"):
        # Relative paths resolve where the run starts (the config's folder), in the preview as in the run.
        return KernelRequest(mode=mode, kernel_config=path, cwd=str(Path(path).parent), repeats=repeats,
                             baseline=baseline if mode == "compare" else None, only=list(only) if only else None,
                             warmup=warmup, timeout=timeout, seed=seed, rtol=rtol, atol=atol, no_perf=no_perf)
    if mode == "benchmark":
        values = {"repeats": repeats, "concurrency": concurrency, "input_len": input_len, "output_len": output_len,
                  "num_prompts": num_prompts, "warmup": warmup, "timeout": timeout, "seed": seed,
                  "profiler": profiler}
        flags = BenchmarkOverrides.build({name: values[field] for field, name in BENCH_FORM_FIELDS.items()},
                                         where="launch form")
        return BenchmarkRequest(benchmark_config=path, flags=flags)
    if mode == "optimize":
        return LoopRequest(benchmark_config=path, until=until, kernel=kernel or None,
                           candidates=[str(Path(c).expanduser().resolve()) for c in candidates or []], library=library)
    raise _unknown_mode(mode)


def resume_request(loop_dir: Union[Path, str], until: Optional[str] = None) -> LoopRequest:
    """The request that continues a stopped loop (``magpie optimize --resume``); a step whose
    process was killed restarts. Submit it with the loop folder's parent as the output folder and
    the loop folder as ``cwd`` (``launch_output_dir`` / ``launch_cwd``): its console log goes next
    to the loop folder's."""
    return LoopRequest(resume=str(Path(loop_dir).resolve()), until=until)


def config_path(request: Request) -> Optional[Path]:
    """The config file the request runs (None for a resume or a request without one)."""
    path = getattr(request, "kernel_config", None) or getattr(request, "benchmark_config", None)
    return Path(path) if path else None


def launch_cwd(request: Request) -> Path:
    """Where a launched run starts: the request's own ``cwd`` (a kernel request), the loop folder
    of a resume, else the config's folder (relative paths in it resolve there, as in the preview)."""
    if getattr(request, "cwd", None):
        return Path(request.cwd)  # type: ignore[union-attr]
    if getattr(request, "resume", None):
        return Path(request.resume)  # type: ignore[union-attr]
    config = config_path(request)
    return config.parent if config is not None else Path.cwd()


def launch_output_dir(request: Request, output_dir: Union[Path, str, None]) -> Path:
    """Where the run folder goes: ``output_dir``, or for a loop resume the loop folder's parent."""
    if getattr(request, "resume", None):
        return Path(request.resume).resolve().parent  # type: ignore[union-attr]
    return Path(output_dir if output_dir is not None else "./results")


def command_line(request: Request, output_dir: Union[Path, str, None], python: str = sys.executable) -> list[str]:
    """The equivalent command line of a request (what a launch screen shows and copies):
    ``[python, "-m", "engine.cli", *global options, mode, ...flags]``, paths absolute."""
    head = [python, "-m", "engine.cli"]
    output = str(Path(output_dir if output_dir is not None else "./results").resolve())
    if isinstance(request, KernelRequest):
        return head + _kernel_globals(request) + [request.mode] + _kernel_args(request, output)
    if isinstance(request, BenchmarkRequest):
        return head + _options((("-e", request.environment), ("--ray-address", request.ray_address))) \
            + [request.mode] + _benchmark_args(request, output)
    if isinstance(request, LoopRequest):
        return head + [request.mode] + _loop_args(request, output)
    if isinstance(request, TraceDiffRequest):
        return head + ["benchmark", "--trace-diff", str(Path(request.a).resolve()), str(Path(request.b).resolve()),
                       "--top-k", str(request.top_k)] + _options((("--gpu-arch", request.gpu_arch),)) + ["-o", output]
    raise _unknown_mode(getattr(request, "mode", request))


def _options(pairs: Any) -> list[str]:
    out: list[str] = []
    for flag, value in pairs:
        if value is not None:
            out += [flag, str(value)]
    return out


def _kernel_globals(request: KernelRequest) -> list[str]:
    """The global options (given before the mode) a kernel request sets."""
    return _options((("-c", request.framework_config), ("-e", request.environment),
                     ("--ray-address", request.ray_address), ("-w", request.workers),
                     ("--docker-image", request.docker_image)))


def _kernel_args(request: KernelRequest, output: str) -> list[str]:
    args = list(request.kernels)
    if request.kernel_config:
        args += ["-k", str(Path(request.kernel_config).resolve())]
    args += ["-o", output]
    if request.repeats is not None:
        args += ["--repeats", str(request.repeats)]
    if request.baseline and request.mode == "compare":
        args += ["--baseline", request.baseline]
    if request.only:
        args += ["--only", ",".join(request.only)]
    args += _options((("--warmup", request.warmup), ("--timeout", request.timeout), ("--seed", request.seed),
                      ("--rtol", request.rtol), ("--atol", request.atol), ("-t", request.testcase),
                      ("--type", request.type), ("--compile-cmd", request.compile_cmd),
                      ("--tie-margin", request.tie_margin if request.mode == "compare" else None)))
    if request.no_perf:
        args.append("--no-perf")
    return args


def _benchmark_args(request: BenchmarkRequest, output: str) -> list[str]:
    args = [request.framework] if request.framework else []
    if request.benchmark_config:
        args += ["-b", str(Path(request.benchmark_config).resolve())]
    if request.batch:
        args += ["--batch", str(Path(request.batch).resolve())]
    args += ["-o", output]
    given = request.flags.given()
    # The form's overrides first, in its order; then any other override, in the command line's.
    order = list(BENCH_FORM_FIELDS.values()) + [n for n in OVERRIDES if n not in BENCH_FORM_FIELDS.values()]
    for name in order:
        if name in given:
            args += _override_args(name, given[name])
    return args


def _loop_args(request: LoopRequest, output: str) -> list[str]:
    if request.resume:
        args = ["--resume", str(Path(request.resume).resolve())]
    else:
        args = ["-b", str(Path(str(request.benchmark_config)).resolve()), "-o", output]
    if request.until:
        args += ["--until", request.until]
    if request.kernel:
        args += ["--kernel", request.kernel]
    if request.candidates:
        args += ["--candidates", *request.candidates]
    if not request.library:
        args.append("--no-library")
    return args


def _override_args(name: str, value: Any) -> list[str]:
    meta = OVERRIDES[name]
    flag = meta.flag(name)
    if isinstance(value, bool):
        return [flag if value else flag.replace("--", "--no-", 1)]
    if meta.items == "sweep" and isinstance(value, dict):
        out: list[str] = []
        for key, values in value.items():
            out += [flag, f"{key}={','.join(str(v) for v in values)}"]
        return out
    if meta.items == "slo" and isinstance(value, dict):
        return [flag, *(f"{key}:{ms:g}" for key, ms in value.items())]
    return [flag, str(value)]


def effective_config(request: Request, prepared: Any = None) -> tuple[dict[str, Any], list[dict], list[str]]:
    """(config after overrides, the overrides, warnings): what the run would record in config.yaml.
    Raises ConfigError with file:line problems, as the command line would (the same checks).
    ``prepared``: the request's ``prepare()`` when the caller has it already."""
    prepared = prepared if prepared is not None else request.prepare()
    if isinstance(request, BenchmarkRequest):
        return {"benchmark": prepared.config.model_dump(by_alias=True)}, prepared.overrides, prepared.warnings
    if isinstance(request, LoopRequest):
        return _loop_baseline_config(prepared)
    if isinstance(request, KernelRequest):
        return prepared.plan.effective_config(), prepared.overrides, prepared.warnings
    raise _unknown_mode(getattr(request, "mode", request))


def _loop_baseline_config(prepared: Any) -> tuple[dict[str, Any], list[dict], list[str]]:
    """What the loop's baseline step starts from: the clean config as it stands (the loop raises
    its repeats to the minimum it needs for a confidence interval, and records that in loop.json)."""
    bench = BenchmarkRequest(benchmark_config=prepared.config).prepare()
    return {"benchmark": bench.config.model_dump(by_alias=True)}, list(bench.overrides), prepared.warnings


def find_console_log(output_dir: Path, pid: Optional[int]) -> Optional[Path]:
    """The console log the local-process executor kept for the run with this pid (newest if the
    pid was reused)."""
    if pid is None:
        return None
    folder = Path(output_dir) / ".console"
    try:
        matches = sorted(folder.glob(f"*_{pid}.log"))
    except OSError:
        return None
    return matches[-1] if matches else None

"""Kernel tools: hardware_spec, analyze, compare, create_kernel_config, discover_kernels,
validate_config.

Magpie's inline arguments (kernel_path, testcase_command, working_dir, compile_command, the
backends) become a kernel config in Magpie's YAML format, written beside the results and run like
any config on disk, so the engine's config loader checks it and the run records it. A config
already on disk (kernel_config) is run as the command line runs it, with the same flags.
"""

from pathlib import Path
from typing import Any, Optional

from engine.jobs import KernelRequest
from engine.jobs.query import KERNEL_TYPES, TYPE_ALIASES, load_kernel_config
from engine.mcp.jobs import describe
from engine.mcp.security import AccessRefused
from engine.mcp.server import State, add_tool, dump_yaml

_MAGPIE_TYPES = ("hip", "cuda", "triton", "all")


def kernel_entry(kernel_id: str, kernel_path: Path, kernel_type: str, working_dir: Optional[Path],
                 compile_command: str, testcase_command: str) -> dict:
    """One ``kernels:`` entry in Magpie's format (absolute paths, so the file runs from anywhere)."""
    entry: dict[str, Any] = {"id": kernel_id, "type": TYPE_ALIASES.get(kernel_type, kernel_type),
                             "source_files": [str(kernel_path)],
                             "working_dir": str(working_dir or kernel_path.parent)}
    if compile_command:
        entry["compile_command"] = compile_command
    if testcase_command:
        entry["testcase_command"] = testcase_command
    return entry


def config_document(entries: list[dict], performance_backend: str, correctness_backend: str,
                    single: bool) -> dict:
    doc: dict[str, Any] = {"kernel": entries[0]} if single else {"kernels": entries}
    if performance_backend:
        doc["performance"] = {"backend": performance_backend}
    if correctness_backend:
        doc["correctness"] = {"backend": correctness_backend}
    return doc


def _broadcast(values: list[str], n: int, argument: str) -> list[str]:
    if not values:
        return [""] * n
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise AccessRefused(f"{argument}: {len(values)} values for {n} kernels", hint="give one for all, or one each")
    return list(values)


class KernelTools:
    def __init__(self, state: State) -> None:
        self.state = state

    # ------------------------------------------------------------------ shared
    def write_config(self, doc: dict, mode: str) -> Path:
        path = self.state.scratch("configs")
        path = path.with_name(f"{mode}_{path.name}")
        path.write_text(dump_yaml(doc))
        return path

    def _check_plan_paths(self, request: KernelRequest, prepared: Any = None) -> list[str]:
        """Every file and folder the plan will use lies under a root (a config on disk may name others)."""
        prepared = prepared if prepared is not None else request.prepare()
        for k in prepared.plan.kernels:
            for src in k.source_files:
                self.state.roots.check_inside(src, f"{k.id}.source_files")
            self.state.roots.check_inside(k.working_dir, f"{k.id}.working_dir")
            if k.reference_file is not None:
                self.state.roots.check_inside(k.reference_file, f"{k.id}.reference_file")
        return prepared.warnings

    def submit(self, mode: str, config: Path, flags: dict, output_dir: str) -> dict:
        # Relative paths resolve where the job runs (the first root), in the check as in the run.
        request = KernelRequest(mode=mode, kernel_config=str(config), cwd=str(self.state.book.cwd), **flags)
        prepared = request.prepare()
        warnings = self._check_plan_paths(request, prepared)
        out = self.state.output_dir(output_dir)
        job = self.state.book.submit(request, out, prepared)  # the run is the plan just checked
        return {**describe(job), "kernel_config": str(config), "warnings": warnings,
                "next": "poll job_status(job_id, wait_s=5) until finished, then job_result(job_id)"}

    def common_flags(self, check_performance: bool, environment: str, framework_config: str, repeats: Optional[int],
                     warmup: Optional[int], timeout: Optional[float], seed: Optional[int], rtol: Optional[float],
                     atol: Optional[float], workers: Optional[int], docker_image: str,
                     only: Optional[list[str]], ray_address: str = "") -> dict:
        # Kernel containers have no image of the engine's: any image named here is the caller's code.
        self.state.confine.docker_image(docker_image, None, "docker_image")
        return {"no_perf": not check_performance, "environment": environment or None,
                "framework_config": str(self.state.path(framework_config, "framework_config")) if framework_config
                else None, "repeats": repeats, "warmup": warmup, "timeout": timeout, "seed": seed, "rtol": rtol,
                "atol": atol, "workers": workers, "docker_image": docker_image or None, "only": only or None,
                "ray_address": ray_address or None}


def register(app: Any, state: State) -> None:  # noqa: C901 - one closure per tool
    tools = KernelTools(state)

    def hardware_spec(device_id: int = 0, include_all: bool = False) -> dict:
        """The GPUs this host's runtime sees (nvidia-smi / amd-smi / rocminfo), with compiler, profilers and
        the arch spec (peak FLOP/s per dtype, bandwidth; measured or datasheet, labelled). Magpie's keys:
        gpu_count, and gpu (device_id) or gpus (include_all)."""
        from engine.jobs.query import detect_gpu
        info = detect_gpu()
        if info is None:
            return {"gpu_count": 0, "gpu": None, "note": "no GPU seen by nvidia-smi, amd-smi or rocminfo"}
        full = info.to_dict()
        devices = {str(d["index"]): d for d in full["devices"]}
        common = {k: full[k] for k in ("vendor", "name", "arch", "driver", "runtime", "compiler", "profilers", "spec")}
        if include_all:
            return {"gpu_count": len(devices), "gpus": devices, **common}
        if str(device_id) not in devices:
            raise AccessRefused(f"device_id {device_id}: not a visible device (visible: {', '.join(devices)})")
        return {"gpu_count": len(devices), "gpu": devices[str(device_id)], **common}

    def analyze(kernel_path: str = "", testcase_command: str = "", kernel_type: str = "", working_dir: str = "",
                compile_command: str = "", check_performance: bool = True, environment: str = "local",
                performance_backend: str = "", correctness_backend: str = "", kernel_config: str = "",
                framework_config: str = "", repeats: Optional[int] = None, warmup: Optional[int] = None,
                timeout: Optional[float] = None, seed: Optional[int] = None, rtol: Optional[float] = None,
                atol: Optional[float] = None, workers: Optional[int] = None, docker_image: str = "", ray_address: str = "",
                only: Optional[list[str]] = None, output_dir: str = "") -> dict:
        """Evaluate one kernel (or every entry of kernel_config): compile, correctness, then timing. Returns a
        job id at once. Either kernel_path (Magpie's inline form; kernel_type hip|cuda|pytorch|triton, default
        hip; working_dir defaults to the kernel's folder) or kernel_config (a YAML on disk; testcase_command /
        compile_command / kernel_type then override every entry, like --testcase/--compile-cmd/--type).
        Command lines given here need a server started with --allow-commands."""
        state.commands(testcase_command=testcase_command, compile_command=compile_command)
        flags = tools.common_flags(check_performance, environment, framework_config, repeats, warmup, timeout, seed,
                                   rtol, atol, workers, docker_image, only, ray_address)
        if kernel_config:
            if kernel_path or working_dir or performance_backend or correctness_backend:
                raise AccessRefused("kernel_config with kernel_path/working_dir/performance_backend/"
                                    "correctness_backend: the config sets those",
                                    hint="edit the config, or use the inline form without kernel_config")
            config = state.path(kernel_config, "kernel_config")
            flags.update(testcase=testcase_command or None, compile_cmd=compile_command or None,
                         type=kernel_type or None)
        elif kernel_path:
            path = state.path(kernel_path, "kernel_path")
            wd = state.path(working_dir, "working_dir") if working_dir else None
            entry = kernel_entry(path.stem, path, kernel_type or "hip", wd, compile_command, testcase_command)
            config = tools.write_config(config_document([entry], performance_backend, correctness_backend, True),
                                         "analyze")
        else:
            raise AccessRefused("analyze: give kernel_path (with testcase_command) or kernel_config")
        return tools.submit("analyze", config, flags, output_dir)

    def compare(kernel_paths: Optional[list[str]] = None, testcase_commands: Optional[list[str]] = None,
                kernel_type: str = "", baseline_index: Optional[int] = None, check_performance: bool = True,
                environment: str = "local", performance_backend: str = "", correctness_backend: str = "",
                compile_commands: Optional[list[str]] = None, working_dirs: Optional[list[str]] = None,
                kernel_config: str = "", baseline: str = "", tie_margin: Optional[float] = None,
                framework_config: str = "", repeats: Optional[int] = None, warmup: Optional[int] = None,
                timeout: Optional[float] = None, seed: Optional[int] = None, rtol: Optional[float] = None,
                atol: Optional[float] = None, workers: Optional[int] = None, docker_image: str = "", ray_address: str = "",
                only: Optional[list[str]] = None, output_dir: str = "") -> dict:
        """Rank two or more kernels against a baseline, correctness-gated (an incorrect kernel is never
        ranked; a difference inside the noise is a tie). Returns a job id at once. Either kernel_paths with
        testcase_commands (Magpie's form; one command for all or one each), plus compile_commands and
        working_dirs (one for all or one each), or kernel_config (a YAML on disk). baseline_index or baseline
        (an id) picks the baseline (default: the entry marked baseline, else the first). Command lines given
        here need a server started with --allow-commands."""
        kernel_paths, testcase_commands = kernel_paths or [], testcase_commands or []
        compile_commands, working_dirs = compile_commands or [], working_dirs or []
        state.commands(testcase_commands=testcase_commands, compile_commands=compile_commands)
        if baseline and baseline_index is not None:
            raise AccessRefused("baseline and baseline_index: give one")
        flags = tools.common_flags(check_performance, environment, framework_config, repeats, warmup, timeout, seed,
                                   rtol, atol, workers, docker_image, only, ray_address)
        flags.update(baseline=baseline or (str(baseline_index) if baseline_index is not None else None),
                     tie_margin=tie_margin)
        if kernel_config:
            if kernel_paths or working_dirs or performance_backend or correctness_backend:
                raise AccessRefused("kernel_config with kernel_paths/working_dirs/backends: the config sets those")
            if len(testcase_commands) > 1 or len(compile_commands) > 1:
                raise AccessRefused("with kernel_config, testcase_commands/compile_commands take one command that "
                                    "replaces every entry's (per-entry commands belong in the config)")
            config = state.path(kernel_config, "kernel_config")
            flags.update(testcase=(testcase_commands or [None])[0], compile_cmd=(compile_commands or [None])[0],
                         type=kernel_type or None)
        elif kernel_paths:
            paths = state.roots.resolve_all(kernel_paths, "kernel_paths")
            n = len(paths)
            tests = _broadcast(testcase_commands, n, "testcase_commands")
            builds = _broadcast(compile_commands, n, "compile_commands")
            dirs = [state.path(d, f"working_dirs[{i}]") if d else None
                    for i, d in enumerate(_broadcast(working_dirs, n, "working_dirs"))]
            entries = [kernel_entry(f"kernel_{i}_{p.stem}", p, kernel_type or "hip", dirs[i], builds[i], tests[i])
                       for i, p in enumerate(paths)]
            config = tools.write_config(config_document(entries, performance_backend, correctness_backend, False),
                                         "compare")
        else:
            raise AccessRefused("compare: give kernel_paths (with testcase_commands) or kernel_config")
        return tools.submit("compare", config, flags, output_dir)

    def create_kernel_config(kernel_id: str, kernel_path: str, testcase_command: str = "", kernel_type: str = "hip",
                             working_dir: str = "", compile_command: str = "", output_path: str = "") -> dict:
        """A kernel config in Magpie's YAML format, checked by the engine's config loader (unknown fields,
        wrong command forms and missing files are reported). With output_path (under a root) the file is
        written; a config with command lines is written only by a server started with --allow-commands,
        since running it runs them."""
        path = state.path(kernel_path, "kernel_path")
        wd = state.path(working_dir, "working_dir") if working_dir else None
        doc = config_document([kernel_entry(kernel_id, path, kernel_type, wd, compile_command, testcase_command)],
                              "", "", True)
        text = dump_yaml(doc)
        check = state.scratch("checks")
        check.write_text(text)
        warnings: list[str] = []
        try:
            load_kernel_config(check, warnings)
        finally:
            check.unlink(missing_ok=True)
        out: dict[str, Any] = {"config_content": text, "warnings": warnings, "path": None}
        if output_path:
            if testcase_command or compile_command:
                state.commands(testcase_command=testcase_command, compile_command=compile_command)
            target = state.path(output_path, "output_path")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            out["path"] = str(target)
        where = out["path"] or "<file>.yaml"
        out["usage"] = f"magpie analyze --kernel-config {where}   (or the analyze tool with kernel_config={where})"
        return out

    def discover_kernels(project_path: str, kernel_type: str = "hip", include_tests: bool = True,
                         include_examples: bool = True) -> dict:
        """Kernel definitions in a local project (CUDA/HIP __global__ functions, Triton @jit kernels, ATen
        kernel functors), from the engine's source index, with a suggested config per kernel."""
        from engine.jobs.query import build_index
        if kernel_type not in _MAGPIE_TYPES:
            raise AccessRefused(f"kernel_type {kernel_type!r}: one of {', '.join(_MAGPIE_TYPES)}")
        root = state.path(project_path, "project_path")
        index = build_index([root])
        wanted = {"hip": {"cuda"}, "cuda": {"cuda"}, "triton": {"triton"}, "all": {"cuda", "triton", "aten"}}[kernel_type]
        kernels = []
        for name, defs in sorted(index.definitions.items()):
            for d in defs:
                if d.kind not in wanted or (d.in_test and not include_tests):
                    continue
                if not include_examples and any(part in ("examples", "example") for part in Path(d.path).parts):
                    continue
                source = root / d.path
                if not state.roots.contains(source.resolve()):
                    continue  # a file linked in from outside the roots: not this project's
                ktype = "triton" if d.kind == "triton" else ("hip" if source.suffix == ".hip" or kernel_type == "hip"
                                                             else "cuda")
                kernels.append({"name": name, "kind": d.kind, "source_file": str(source), "line": d.line,
                                "in_test": d.in_test, "launchers": sorted(index.launchers.get(name, ())),
                                "suggested_config": {"id": name, "type": ktype, "source_files": [str(source)],
                                                     "working_dir": str(source.parent)}})
        return {"project_path": str(root), "kernel_type": kernel_type, "total": len(kernels),
                "files_read": index.files_read, "kernels": kernels}

    def validate_config(config_path: str, kind: str = "auto") -> dict:
        """Check a config as a run would, without running it (magpie ... --dry-run): kind kernel (kernel:/
        kernels:), benchmark (benchmark:), or auto (by its top-level key). Problems name the file, the line
        and the fix; a valid config comes with its plan (benchmark: the server's command line and
        environment, image, GPUs, points with their length bounds, profiling; kernel: each kernel's folder,
        commands, correctness and timing) and what only this machine lacks (machine_problems)."""
        from engine.jobs.query import ConfigError, benchmark_plan, load_located_yaml
        from engine.jobs.requests import BenchmarkRequest
        path = state.path(config_path, "config_path")
        if kind in ("auto", "benchmark"):
            # What the config names lies under a root, checked before the loader opens any of it.
            data = load_located_yaml(path).data
            if isinstance(data, dict) and "benchmark" in data:
                state.confine.benchmark_body(data["benchmark"], f"config_path ({path})", inline=False)
        if kind == "auto":
            data = load_located_yaml(path).data
            kind = "benchmark" if isinstance(data, dict) and "benchmark" in data else "kernel"
        if kind not in ("benchmark", "kernel"):
            raise AccessRefused(f"kind {kind!r}: one of auto, kernel, benchmark")
        try:
            if kind == "benchmark":
                prepared = BenchmarkRequest(benchmark_config=str(path)).prepare(plan_only=True)
                plan = benchmark_plan(prepared, str(state.results))
                warnings = list(prepared.warnings)
            else:
                from engine.jobs.query import kernel_plan
                request = KernelRequest(mode="compare" if _entries(path) > 1 else "analyze", kernel_config=str(path),
                                        cwd=str(state.roots.first))
                prepared_k = request.prepare()
                tools._check_plan_paths(request, prepared_k)
                plan, warnings = kernel_plan(prepared_k), list(prepared_k.warnings)
        except ConfigError as exc:
            return {"valid": False, "kind": kind, "path": str(path), "problems": exc.problems, "warnings": []}
        return {"valid": True, "kind": kind, "path": str(path), "problems": [], "warnings": warnings, "plan": plan,
                "machine_problems": plan.get("machine_problems", []) if isinstance(plan, dict) else []}

    for fn in (hardware_spec, analyze, compare, create_kernel_config, discover_kernels, validate_config):
        add_tool(app, fn)


def _entries(path: Path) -> int:
    cfg, _doc = load_kernel_config(path)
    return len(cfg.entries())


__all__ = ["KERNEL_TYPES", "config_document", "kernel_entry", "register"]

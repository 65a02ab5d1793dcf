"""Re-running a finished run with the config it recorded (the Runs list's ``R`` and ``Y``).

A kernel run (analyze/compare) records the kernel config it read (``config_file``), the baseline
it compared against and its kernels: the re-run names the same file, baseline and kernels. A
benchmark run records its whole effective config under ``benchmark:`` (beside ``overrides`` and
``warnings``, which are not config keys): the re-run starts from a copy of that section, so the
overrides it had are part of the config rather than flags.

A run folder without its ``config.yaml`` (copied without it, written by an older version, or a
kernel config that has moved since) is re-run from what the folder still says, and the
confirmation names the source: a benchmark's config is rebuilt from ``benchmark_report.json``
(framework, model, server, envs, repeats, sweep or capacity search; every other field takes its
default); a kernel run's config is the project's kernel config that has the run's kernels (by id,
then by source file). When neither works the error says why and what to do instead.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from engine.jobs.launch import Request, command_line, config_path, form_request
from engine.jobs.query import ConfigError, RunInfo, read_yaml

RERUN_FOLDER = ".rerun"  # under the results folder; hidden from the Runs list and the config tree


class RerunError(ValueError):
    """The run folder does not say enough to start it again; the message says what is missing."""


def _recorded_config(info: RunInfo) -> dict:
    path = info.path / "config.yaml"
    try:
        cfg = read_yaml(path)
    except ConfigError as exc:  # missing, not a regular file, too large, not valid YAML
        raise RerunError(f"cannot read the recorded config: {exc}") from exc
    if not isinstance(cfg, dict):
        raise RerunError(f"{path}: expected a mapping, the run's recorded config")
    return cfg


def rerun_config_path(info: RunInfo, output_dir: Path) -> Path:
    return Path(output_dir) / RERUN_FOLDER / f"{info.name}.yaml"


@dataclass
class Rerun:
    """The launch that repeats a run (a typed request of the job API, its run folder to go under
    ``output_dir``), and where its config came from (shown before asking)."""

    request: Request
    source: str
    output_dir: Path

    @property
    def config(self) -> Path:
        """The config file the re-run reads."""
        path = config_path(self.request)
        assert path is not None  # a re-run always names its config
        return path

    def argv(self, python: str = sys.executable) -> list[str]:
        """The equivalent command line (shown before asking, and copied by ``Y``)."""
        return command_line(self.request, self.output_dir, python=python)


def rerun_request(info: RunInfo, output_dir: Path, write: bool = True,
                  project_dir: Path | None = None) -> Request:
    """The launch that repeats ``info``. ``write=False`` only builds it (for the command line
    shown before asking); with ``write=True`` a benchmark's config copy is written first."""
    return plan_rerun(info, output_dir, write=write, project_dir=project_dir).request


def plan_rerun(info: RunInfo, output_dir: Path, write: bool = True, project_dir: Path | None = None) -> Rerun:
    """``rerun_request`` with the source of its config; RerunError saying why there is none.
    ``project_dir``: where to look for a kernel config when the run does not name one that exists."""
    if info.mode not in ("analyze", "compare", "benchmark"):
        raise RerunError(f"{info.name}: a {info.mode} run cannot be re-run from here (analyze, compare or "
                         "benchmark runs can)")
    recorded = info.path / "config.yaml"
    cfg = _recorded_config(info) if recorded.exists() else None
    if info.mode == "benchmark":
        if cfg is not None:
            bench = cfg.get("benchmark")
            if not isinstance(bench, dict):
                raise RerunError(f"{recorded}: no 'benchmark' section to run again")
            source = f"its recorded {recorded.name}"
        else:
            bench, derived = _benchmark_from_report(info)
            source = (f"no config.yaml in {info.name}: rebuilt from benchmark_report.json ({', '.join(derived)}); "
                      "every other field takes its default")
        target = rerun_config_path(info, output_dir)
        if write:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(yaml.safe_dump({"benchmark": bench}, sort_keys=False), encoding="utf-8")
        return Rerun(_request("benchmark", target), source, Path(output_dir))
    return _kernel_rerun(info, cfg, output_dir, project_dir)


# -- kernel runs ------------------------------------------------------------------------------

def _kernel_rerun(info: RunInfo, cfg: dict | None, output_dir: Path, project_dir: Path | None) -> Rerun:
    from magpie_tui.screens.reports import resolve_config_file
    recorded = info.path / "config.yaml"
    config = resolve_config_file(info.path, cfg.get("config_file")) if cfg is not None else None
    if cfg is not None:
        baseline = cfg.get("baseline") if isinstance(cfg.get("baseline"), dict) else {}
        baseline_id = baseline.get("id") if info.mode == "compare" else None
        kernels = [str(k.get("id")) for k in cfg.get("kernels") or [] if isinstance(k, dict) and k.get("id")]
        settings = cfg.get("settings") if isinstance(cfg.get("settings"), dict) else {}
        repeats = settings.get("repeats")
        sources: set[str] = {Path(str(f)).name for k in cfg.get("kernels") or [] if isinstance(k, dict)
                             for f in k.get("source_files") or []}
        source = f"its recorded {recorded.name}"
    else:
        baseline_id, kernels, repeats, sources = _kernels_from_report(info)
        source = f"no config.yaml in {info.name}: kernels, baseline and repeats from its report"
    if config is None:
        why = (f"{recorded}: config_file {cfg.get('config_file')!r} is missing or no longer exists" if cfg is not None
               else f"{info.path}: no config.yaml, and the report does not name the kernel config")
        config = _find_kernel_config(kernels, sources, project_dir, why)
        source += f"; the kernel config (in the command below) found by the run's kernels ({', '.join(kernels)})"
    only = [k for k in kernels if k != baseline_id] or None
    return Rerun(_request(info.mode, config, repeats=repeats, baseline=baseline_id, only=only), source,
                 Path(output_dir))


def _request(mode: str, config: Path, **fields: Any) -> Request:
    """The typed request of the re-run; RerunError when what the folder recorded does not make one."""
    try:
        return form_request(mode, config, **fields)
    except ConfigError as exc:
        raise RerunError(f"the run's recorded settings do not make a {mode} request: {'; '.join(exc.problems)}") \
            from exc


def _kernels_from_report(info: RunInfo) -> tuple[str | None, list[str], int | None, set[str]]:
    """(baseline id, kernel ids, repeats, source file names) as the run's report recorded them."""
    from engine.runs.schema import load_report
    if info.report_path is None:
        raise RerunError(f"{info.path}: neither a config.yaml nor a report to rebuild the run from; start it from "
                         "the Configs screen (1) instead")
    try:
        report: Any = load_report(info.report_path)
    except ValueError as exc:
        raise RerunError(f"{info.path} has no config.yaml and its report cannot be read: {exc}") from exc
    kernels = [kr.kernel_id for kr in report.kernel_results if kr.kernel_id]
    baseline = getattr(report, "baseline", None)
    baseline_id = baseline.id if baseline is not None and info.mode == "compare" else None
    settings = report.settings or {}
    sources = {Path(p).name for p in ((report.environment or {}).get("source_hashes") or {})}
    return baseline_id, kernels, settings.get("repeats"), sources


def _kernel_configs(project_dir: Path) -> Iterator[tuple[Path, list[str], set[str]]]:
    """(path, kernel ids, source file names) of every kernel config under the project, leaving
    out hidden folders, results and run folders (their config.yaml is a record)."""
    from engine.jobs.query import is_run_folder
    skip = {"results", "__pycache__", "node_modules", ".git", "build", "dist"}
    for folder, dirs, files in _walk(Path(project_dir)):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skip and not is_run_folder(folder / d))
        for name in sorted(files):
            if not name.endswith((".yaml", ".yml")):
                continue
            try:
                data = read_yaml(folder / name)
            except ConfigError:
                continue
            entries = data.get("kernels") if isinstance(data, dict) else None
            if not isinstance(entries, list):
                continue
            ids = [str(k.get("id")) for k in entries if isinstance(k, dict) and k.get("id")]
            files_of = {Path(str(f)).name for k in entries if isinstance(k, dict) for f in k.get("source_files") or []}
            yield folder / name, ids, files_of


def _walk(root: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    import os  # Path.walk is Python 3.12+ only
    for folder, dirs, files in os.walk(root):
        yield Path(folder), dirs, files


def _find_kernel_config(kernels: list[str], sources: set[str], project_dir: Path | None, why: str) -> Path:
    """The project's kernel config holding every kernel of the run; with several, the ones that
    also hold its source files; RerunError naming them (or saying there is none)."""
    if not kernels:
        raise RerunError(f"{why}; the run lists no kernels either, so nothing says what to run")
    if project_dir is None:
        raise RerunError(f"{why}; start it from the Configs screen (1) instead")
    found = [(path, files) for path, ids, files in _kernel_configs(project_dir) if set(kernels) <= set(ids)]
    if len(found) > 1 and sources:
        narrowed = [(path, files) for path, files in found if sources <= files]
        found = narrowed or found
    if len(found) == 1:
        return found[0][0]
    if not found:
        raise RerunError(f"{why}; no kernel config under {project_dir} has the kernels {', '.join(kernels)}: open or "
                         "write one on the Configs screen (1) and launch it with l")
    names = ", ".join(str(path.relative_to(project_dir)) for path, _ in found)
    raise RerunError(f"{why}; {len(found)} kernel configs have the kernels {', '.join(kernels)} ({names}): open the "
                     "one you mean on the Configs screen (1) and launch it with l")


# -- benchmark runs ---------------------------------------------------------------------------

_SWEEP_KEYS = ("concurrency", "input_len", "output_len", "request_rate")


def _benchmark_from_report(info: RunInfo) -> tuple[dict[str, Any], list[str]]:
    """A ``benchmark:`` section rebuilt from the run's report, and the names of what it took."""
    from engine.jobs.query import check_config
    from engine.runs.schema import load_report
    if info.report_path is None:
        raise RerunError(f"{info.path}: neither a config.yaml nor a benchmark_report.json to rebuild the run from; "
                         "start it from the Configs screen (1) instead")
    try:
        report = load_report(info.report_path).model_dump()
    except ValueError as exc:
        raise RerunError(f"{info.path} has no config.yaml and its report cannot be read: {exc}") from exc
    if not report.get("framework"):
        raise RerunError(f"{info.report_path}: no framework recorded, so there is nothing to rebuild the run from; "
                         "start it from the Configs screen (1) instead")
    server = report.get("server") or {}
    bench: dict[str, Any] = {"framework": report["framework"], "run_mode": server.get("run_mode") or "local"}
    derived = ["framework", "run_mode"]
    argv = [str(a) for a in server.get("argv") or []]
    if report["framework"] == "builtin":
        builtin: dict[str, Any] = {"size": report.get("model") or "tiny"}
        if "--max-batch-size" in argv[:-1]:
            builtin["max_batch"] = int(argv[argv.index("--max-batch-size") + 1])
        bench["server"] = builtin
        derived.append("server")
    elif report.get("model"):
        bench["model"] = report["model"]
        derived.append("model")
    if report.get("envs"):
        bench["envs"] = {str(k): str(v) for k, v in report["envs"].items()}
        derived.append("envs")
    if report.get("profiling_enabled"):
        bench["profiler"] = {"torch_profiler": {"enabled": True}}
        derived.append("torch profiler")
    client: dict[str, Any] = {}
    if server.get("launched") is False and server.get("base_url"):
        client["base_url"] = server["base_url"]  # it measured a server it did not start
    counts = [stat.get("n") for stat in (report.get("repeats") or {}).values() if isinstance(stat, dict)]
    if counts and max(c or 1 for c in counts) > 1:
        client["repeats"] = max(c or 1 for c in counts)
    capacity = report.get("capacity")
    if isinstance(capacity, dict) and capacity.get("slos_ms"):
        client.update(find_capacity=dict(capacity["slos_ms"]), goodput_target=capacity.get("goodput_target", 0.9),
                      capacity_over=capacity.get("over", "concurrency"))
        if capacity.get("ceiling"):
            client["capacity_max"] = capacity["ceiling"]
        # The search that ran: a report without the key is from before the margin search (bisection).
        client["capacity_search"] = capacity.get("search") if capacity.get("search") in ("margin", "bisect") else "bisect"
    else:
        points = [p.get("point") or {} for p in report.get("sweep") or []]
        # Only what varied between the points is a sweep axis (the rest is in envs).
        sweep = {k: [p[k] for p in points] for k in _SWEEP_KEYS if len(points) > 1
                 and len({p.get(k) for p in points}) > 1 and all(p.get(k) is not None for p in points)}
        if sweep:
            client["sweep"] = sweep
    if client:
        bench["client"] = client
        derived += [k.replace("_", " ") for k in client]
    check = _check_section(bench, check_config)
    if check:
        raise RerunError(f"{info.path} has no config.yaml, and the config rebuilt from its report is not valid "
                         f"({check}); start it from the Configs screen (1) instead")
    return bench, derived


def _check_section(bench: dict[str, Any], check_config) -> str | None:
    """The first problem of ``{"benchmark": bench}`` as the command line would see it, or None."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "benchmark.yaml"
        path.write_text(yaml.safe_dump({"benchmark": bench}, sort_keys=False), encoding="utf-8")
        check = check_config(path)
        return None if check.ok else "; ".join(str(p).replace(str(path), "the rebuilt config") for p in check.problems)

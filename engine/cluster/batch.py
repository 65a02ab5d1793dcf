"""``magpie benchmark --batch FILE.yaml``: many benchmark points, one batch report.

A batch file lists benchmark configs, or sweeps one config over flag values, or both::

    batch:
      - builtin_tiny_cpu.yaml                  # a benchmark YAML (paths: from this file's folder)
      - config: builtin_tiny_cpu.yaml
        flags: {concurrency: 8, tp: 2}         # the command line's overrides, by their names
    sweep:
      config: vllm_llama3.1-8b_h200.yaml
      flags: {num_prompts: 200}
      over: {concurrency: [8, 16, 32]}         # every combination is a point
    scheduler:
      environment: ray                         # or local: the points one after another here
      ray: {address: "HOST:6379"}

Each point is checked like ``magpie benchmark -b`` before anything runs (an error names the
batch file and the point). On Ray each point is one task holding ``tp`` GPUs (one task's
resources always come from one node); locally the points run in order. Every point gets its
own folder under ``points/`` (its benchmark_report.json, logs, traces), and the batch's
``benchmark_report.json`` compares them. A failed task is a failed point; a cancel stops the
running points (their reports say cancelled) and the ones not started.

This module reads and checks the file (``prepare_batch``, for ``BenchmarkRequest.prepare``);
``engine.cluster.batch_run`` runs the points.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from engine.cluster.settings import RaySettings
from engine.config.overrides import BenchmarkOverrides
from engine.config.yamlfile import ConfigError, format_loc, load_located_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatchPoint(_Strict):
    config: str
    flags: dict[str, Any] = Field(default_factory=dict)


class BatchSweep(_Strict):
    config: str
    flags: dict[str, Any] = Field(default_factory=dict)
    over: dict[str, list[Any]]


class BatchScheduler(_Strict):
    environment: Optional[str] = Field(None, pattern="^(local|ray)$")
    ray: Optional[RaySettings] = None


class BatchFile(_Strict):
    batch: list[Any] = Field(default_factory=list)
    sweep: Optional[BatchSweep] = None
    scheduler: BatchScheduler = Field(default_factory=BatchScheduler)


@dataclass
class PreparedBatch:
    request: Any
    label: str
    points: list[Any]  # BenchmarkRequest, one a point
    prepared: list[Any]  # their PreparedBenchmark
    environment: str = "local"
    ray: Optional[RaySettings] = None
    batch_file: Optional[str] = None
    warnings: list[str] = field(default_factory=list)
    overrides: list[dict] = field(default_factory=list)

    def effective_config(self) -> dict:
        return {"mode": "benchmark", "batch_file": self.batch_file, "environment": self.environment,
                "scheduler": {"ray": self.ray.model_dump()} if self.ray else None,
                "points": [{"index": i, "label": _point_label(i, p), "benchmark_config": r.benchmark_config,
                            "flags": r.flags.given(),
                            "benchmark": p.config.model_dump(by_alias=True)}
                           for i, (r, p) in enumerate(zip(self.points, self.prepared))],
                "warnings": self.warnings}


def _point_label(i: int, prepared: Any) -> str:
    load = prepared.config.workload()
    return f"{i:02d}_{prepared.label}_tp{load.tp}_c{load.concurrency}"


def _resolve(base: Path, path: str) -> str:
    p = Path(path).expanduser()
    return str((p if p.is_absolute() else base / p).resolve())


def _points_of(data: BatchFile, base: Path, where: str, doc: Any = None) -> list[tuple[str, str, dict]]:
    """(where, config path, flags) of every point, in the file's order; flags that are no override
    are named with their file:line (``doc``) and the nearest valid one."""
    out = []
    problems: list[str] = []

    def check(flags: dict, loc: tuple) -> None:
        try:
            BenchmarkOverrides.build(flags, where=format_loc(loc),
                                     locate=(lambda key: doc.where(loc + (key,))) if doc is not None else None)
        except ConfigError as exc:
            problems.extend(exc.problems if doc is not None else [f"{where}: {p}" for p in exc.problems])
    for i, item in enumerate(data.batch):
        at = f"{where}: batch[{i}]"
        if isinstance(item, str):
            out.append((at, _resolve(base, item), {}))
        elif isinstance(item, dict):
            try:
                pt = BatchPoint.model_validate(item)
            except Exception as exc:
                raise ConfigError([f"{at}: {exc}"]) from None
            check(pt.flags, ("batch", i, "flags"))
            out.append((at, _resolve(base, pt.config), dict(pt.flags)))
        else:
            raise ConfigError([f"{at}: give a benchmark YAML path or a mapping with config: and flags:"])
    if data.sweep is not None:
        sw = data.sweep
        keys = list(sw.over)
        check(sw.flags, ("sweep", "flags"))
        check({k: None for k in keys}, ("sweep", "over"))
        if not keys or any(not v for v in sw.over.values()):
            raise ConfigError([f"{where}: sweep.over: give each key a non-empty list of values"])
        for j, values in enumerate(itertools.product(*(sw.over[k] for k in keys))):
            out.append((f"{where}: sweep point {j} ({dict(zip(keys, values))})", _resolve(base, sw.config),
                        {**sw.flags, **dict(zip(keys, values))}))
    if problems:
        raise ConfigError(problems)
    return out


def prepare_batch(request: Any, plan_only: bool = False) -> PreparedBatch:
    """Every point checked before a folder exists; the environment and its Ray settings. Each point
    is a request of the batch request's own class (``BenchmarkRequest``) with that point's config
    and flags."""
    cli_flags = request.flags.given()
    warnings: list[str] = []
    scheduler = BatchScheduler()
    if request.batch:
        doc = load_located_yaml(request.batch)
        if not isinstance(doc.data, dict):
            raise ConfigError([f"{request.batch}:1: expected a mapping with batch: and/or sweep:"])
        try:
            data = BatchFile.model_validate(doc.data)
        except Exception as exc:
            raise ConfigError([f"{request.batch}: {exc}"]) from None
        specs = _points_of(data, doc.path.resolve().parent, str(request.batch), doc)
        if not specs:
            raise ConfigError([f"{request.batch}: no points: add a batch: list or a sweep:"])
        if request.benchmark_config:
            warnings.append(f"-b {request.benchmark_config} ignored: the batch file gives the points")
        scheduler = data.scheduler
        label = f"batch-{Path(request.batch).stem}"
    else:
        if not request.benchmark_config:
            raise ConfigError(["magpie benchmark -e ray: give -b CONFIG.yaml (one point) or --batch FILE.yaml"])
        specs = [("command line", str(Path(request.benchmark_config).expanduser().resolve()), {})]
        label = f"batch-{Path(request.benchmark_config).stem}"
    points, prepared, problems = [], [], []
    magpie_ray = _magpie_ray_configs(specs, cli_flags)
    for where, config, flags in specs:
        point_flags = {**flags, **cli_flags}
        if config in magpie_ray:
            # Magpie's run_mode ray: the point is a Ray task, and its server a process of that node.
            point_flags["run_mode"] = "local"
        point = type(request)(benchmark_config=config, framework=request.framework, flags=point_flags)
        try:
            prepared.append(point._prepare_one(plan_only))
            points.append(point)
        except ConfigError as exc:
            problems += [f"{where}: {p}" for p in exc.problems]
    if problems:
        raise ConfigError(problems)
    environment = request.environment or scheduler.environment or \
        ("ray" if scheduler.ray is not None or magpie_ray else "local")
    ray = None
    if environment == "ray":
        from engine.extras import require_extra
        require_extra("ray", "running benchmark points on Ray (-e ray)")
        ray = scheduler.ray or _ray_from_magpie(magpie_ray)
        if request.ray_address:
            ray = ray.model_copy(update={"address": request.ray_address})
    return PreparedBatch(request=request, label=label, points=points, prepared=prepared, environment=environment,
                         ray=ray, batch_file=str(Path(request.batch).resolve()) if request.batch else None,
                         warnings=warnings + [w for p in prepared for w in p.warnings])


def _magpie_ray_configs(specs: list[tuple[str, str, dict]], cli_flags: dict) -> dict[str, Any]:
    """The points whose YAML says Magpie's ``run_mode: ray`` (and no flag says another mode): config
    path -> its ``ray_config`` (None when the YAML has none)."""
    from engine.config.benchmark import load_benchmark_config
    out: dict[str, Any] = {}
    for _where, config, flags in specs:
        if {**flags, **cli_flags}.get("run_mode"):
            continue
        try:
            cfg, _doc = load_benchmark_config(config)
        except ConfigError:
            continue  # reported with the point's other problems
        if cfg.run_mode == "ray":
            out[config] = cfg.ray_config
    return out


def _ray_from_magpie(magpie_ray: dict[str, Any]) -> RaySettings:
    """RaySettings from the first Magpie ``ray_config`` (its cluster_address, shared storage, CPUs)."""
    for rc in magpie_ray.values():
        if rc is not None:
            return RaySettings.model_validate(rc.ray_settings())
    return RaySettings()

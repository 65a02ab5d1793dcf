"""What a benchmark will do, before it does it (``magpie benchmark --dry-run``, MCP ``validate_config``).

Everything is checked as for a real run (``BenchmarkRequest.prepare()``); the plan then says what
would start: the server's exact command line and environment (or the image it runs in), the GPUs,
the client's load with the resolved length bounds of every point, repeats, profiling, and where
the run folder goes. Nothing is started, no folder is made. A GPU or Docker engine that this
machine lacks is said, not an error: a plan is checked on a laptop before it runs on a GPU server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from engine.bench.control import reset_plan
from engine.config.benchmark import BenchmarkConfig

# Where the server's port and the run folder go in a plan made before either exists.
PORT_AT_LAUNCH = "<free port at launch>"


def _points(cfg: BenchmarkConfig) -> list[dict[str, Any]]:
    from engine.bench.run import _points as sweep_points
    from engine.bench.run import _Shape
    envs = cfg.effective_envs()
    if cfg.client.find_capacity:
        return [{"capacity_search": dict(cfg.client.find_capacity), "over": cfg.client.capacity_over,
                 "mode": cfg.client.capacity_mode, "search": cfg.client.capacity_search,
                 "lengths": cfg.length_bounds(int(envs["ISL"]), int(envs["OSL"]))
                 if cfg.client.dataset_name == "random" else None}]
    out = []
    for point in sweep_points(cfg):
        shape = _Shape.of(point, cfg, envs)
        out.append({**shape.to_dict(), "lengths": shape.lengths(cfg)})
    return out


def _image(cfg: BenchmarkConfig) -> dict[str, Any]:
    """The image a docker run would start: the config's, else the table's for the GPU arch (given,
    or detected here); without either, every image the arch could pick."""
    from engine.bench.docker_launch import IMAGES, image_for
    from engine.bench.launch import LaunchError
    if cfg.docker_image:
        return {"image": cfg.docker_image, "why": "benchmark.docker_image"}
    arch = cfg.gpu_arch
    why = "benchmark.gpu_arch"
    if arch is None:
        from engine.hw.detect import detect_gpu
        info = detect_gpu()
        arch, why = (info.arch, "the GPU detected here") if info is not None else (None, "")
    if arch is None:
        return {"image": None, "why": "no GPU on this machine and no gpu_arch: chosen at launch from the GPU arch",
                "candidates": dict(IMAGES.get(cfg.framework, {}))}
    try:
        return {"image": image_for(cfg, arch), "why": f"{cfg.framework} image for {arch} ({why})"}
    except LaunchError as exc:
        return {"image": None, "why": str(exc), "problem": True}


def server_plan(cfg: BenchmarkConfig, trace_dir: Optional[Path]) -> dict[str, Any]:
    """The server part of the plan: none (client only), or its command, environment and placement."""
    from engine.bench.launch import server_command
    if cfg.client.base_url:
        return {"launched": False, "base_url": cfg.client.base_url,
                "why": "client.base_url (or envs.BENCHMARK_BASE_URL): a server that is already running"}
    docker = cfg.run_mode == "docker"
    port = cfg.fixed_port()
    from engine.bench.docker_launch import CONTAINER_PORT
    cmd = server_command(cfg, CONTAINER_PORT if docker else (port or 0), trace_dir,
                         host="0.0.0.0" if docker else "127.0.0.1")
    argv = list(cmd.argv)
    if not docker and port is None:  # the port is picked when the server starts
        for i in range(1, len(argv)):
            if argv[i - 1] in ("--port", "--server-port") and argv[i] == "0":
                argv[i] = PORT_AT_LAUNCH
    out: dict[str, Any] = {
        "launched": True, "run_mode": cfg.run_mode, "run_mode_why": cfg.run_mode_why(), "argv": argv,
        "env": dict(cmd.env), "port": port if port is not None else PORT_AT_LAUNCH,
        "extra_args": cfg.extra_server_args(),
        "ready_timeout_s": min(cfg.server_lifecycle.server_ready_timeout_s, cfg.timeout_seconds),
        "lifecycle": _lifecycle(cfg),
    }
    if docker:
        out["container_port"] = CONTAINER_PORT
        out.update(_image(cfg))
    return out


def _lifecycle(cfg: BenchmarkConfig) -> str:
    lc = cfg.server_lifecycle
    if not lc.enabled:
        return "started for this run, stopped at its end"
    if lc.cleanup:
        return ("one server for every point and repeat, stopped at the end (a server an earlier run kept with the "
                "same settings is used, then stopped)")
    return ("one server for every point and repeat, kept running after the run for the next one (a server an "
            "earlier run kept with the same settings is used)")


def _gpus(cfg: BenchmarkConfig) -> dict[str, Any]:
    import os
    from engine.bench.run import _PINNING_VARS  # the run's own rule for pinned GPUs (_select_gpus)
    envs = cfg.effective_envs()
    pinned = [v for v in _PINNING_VARS if v in os.environ or v in envs]
    if cfg.client.base_url:
        return {"policy": "none: the server is not started here"}
    if pinned:
        return {"policy": f"pinned by {', '.join(pinned)}"}
    sel = cfg.gpu_selection
    if not sel.auto:
        return {"policy": "gpu_selection.auto false: every visible GPU"}
    return {"policy": f"the {sel.count or int(envs.get('TP', '1') or 1)} most free GPU(s) with at least "
                      f"{sel.min_free_memory_gb:g} GB free" + (f", among {sel.candidates}" if sel.candidates else "")}


def benchmark_plan(prepared: Any, output_dir: str = "./results") -> dict[str, Any]:
    """The plan of a prepared benchmark (``PreparedBenchmark``) or batch (``PreparedBatch``)."""
    if hasattr(prepared, "points"):  # a batch, or Magpie's run_mode ray
        plan: dict[str, Any] = {
            "kind": "batch", "environment": prepared.environment, "label": prepared.label,
            "ray": prepared.ray.model_dump() if prepared.ray is not None else None,
            "run_folder": f"{output_dir}/benchmark_{prepared.label}_<YYYYmmdd_HHMMSS>_<id>/ (points/<NN>_.../ each)",
            "points": [benchmark_plan(p, output_dir) for p in prepared.prepared],
            "warnings": list(prepared.warnings), "overrides": list(prepared.overrides)}
        return plan
    cfg: BenchmarkConfig = prepared.config
    profiled = cfg.profiler.torch_profiler.enabled
    trace_dir = Path("<run folder>/torch_trace") if profiled else None
    cl = cfg.client
    return {
        "kind": "benchmark", "framework": cfg.framework, "model": cfg.model or cfg.server.size,
        "precision": cfg.precision, "run_kind": cfg.effective_run_kind(), "label": prepared.label,
        "server": server_plan(cfg, trace_dir), "gpus": _gpus(cfg),
        "client": {"endpoint": cl.endpoint, "dataset": cl.dataset_name, "dataset_path": cl.dataset_path,
                   "tokenizer": cfg.effective_tokenizer() or "none (token-id prompts)",
                   "warmup_requests": cl.warmup, "repeats": cl.repeats, "seed": cl.seed,
                   "request_rate": cl.request_rate or "inf (all at once)", "duration_s": cl.duration,
                   "http_client": cl.http_client, "client_procs": cl.client_procs,
                   "timeout_s": cfg.timeout_seconds, "prefix_cache_reset": reset_plan(cfg)[1]},
        "points": _points(cfg),
        "profiling": {"torch_profiler": profiled,
                      "num_steps": cfg.profiler.torch_profiler.num_steps if profiled else None,
                      "tracelens": cfg.profiler.tracelens.enabled, "gap_analysis": cfg.gap_analysis.enabled,
                      "gpu_monitor": cfg.profiler.gpu_monitor.enabled},
        "run_folder": f"{output_dir}/benchmark_{prepared.label}_<YYYYmmdd_HHMMSS>_<id>/",
        "warnings": list(prepared.warnings), "overrides": list(prepared.overrides),
        "machine_problems": list(getattr(prepared, "machine_problems", [])) + _machine_notes(cfg),
    }


def _machine_notes(cfg: BenchmarkConfig) -> list[str]:
    """What this machine lacks for the run as planned (it may run elsewhere): a Docker engine."""
    if cfg.client.base_url or cfg.run_mode != "docker":
        return []
    try:
        import docker
    except ImportError:
        return ["run_mode docker: the docker SDK is not installed here (pip install 'magpie-workbench[docker]')"]
    try:
        docker.from_env(timeout=3).ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine says the same
        return [f"run_mode docker: no Docker engine answers here ({type(exc).__name__})"]
    return []


def format_plan(plan: dict[str, Any], indent: str = "") -> list[str]:
    """The plan as the lines ``--dry-run`` prints (commands whole, never wrapped)."""
    from engine.bench.run import format_lengths
    import shlex
    if plan["kind"] == "batch":
        lines = [f"{indent}batch {plan['label']}: {len(plan['points'])} point(s), environment {plan['environment']}"]
        if plan.get("ray"):
            ray = plan["ray"]
            lines.append(f"{indent}  ray: address {ray.get('address') or '$RAY_ADDRESS or a local instance'}, "
                         f"{ray.get('num_cpus')} CPU(s) a task, shared storage {ray.get('shared_storage')}")
        if plan["environment"] == "ray":
            lines.append(f"{indent}  each point runs as a Ray task holding TP GPUs of one node; its server is a "
                         "process of that node (run_mode local there)")
        lines.append(f"{indent}  run folder: {plan['run_folder']}")
        for i, point in enumerate(plan["points"]):
            lines.append(f"{indent}point {i}:")
            lines += format_plan({**point, "warnings": [], "overrides": []}, indent + "  ")
        return lines + _notes(plan, indent)
    s = plan["server"]
    lines = [f"{indent}{plan['framework']} {plan['model']} ({plan['precision']}), run kind {plan['run_kind']}"]
    if not s["launched"]:
        lines.append(f"{indent}server: not started; the load goes to {s['base_url']} ({s['why']})")
    else:
        lines.append(f"{indent}server: run_mode {s['run_mode']} ({s['run_mode_why']}); ready within "
                     f"{s['ready_timeout_s']:g} s; {s['lifecycle']}")
        if s["run_mode"] == "docker":
            image = s.get("image") or "chosen at launch"
            lines.append(f"{indent}  image: {image} ({s['why']})")
            for key, img in (s.get("candidates") or {}).items():
                lines.append(f"{indent}    on {key}: {img}")
            lines.append(f"{indent}  container port {s['container_port']} published on 127.0.0.1:{s['port']}")
        lines.append(f"{indent}  command: {shlex.join(s['argv'])}")
        if s["extra_args"]:
            lines.append(f"{indent}  of which EXTRA_*_ARGS: {shlex.join(s['extra_args'])}")
        env = s["env"]
        lines.append(f"{indent}  environment ({len(env)} set over the inherited one):" if env else
                     f"{indent}  environment: inherited, nothing added")
        for k in sorted(env):
            lines.append(f"{indent}    {k}={env[k]}")
        lines.append(f"{indent}  GPUs: {plan['gpus']['policy']}")
    c = plan["client"]
    lines.append(f"{indent}client: {c['endpoint']} endpoint, {c['dataset']} dataset"
                 + (f" {c['dataset_path']}" if c["dataset_path"] else "") + f", tokenizer {c['tokenizer']}, "
                 f"{c['warmup_requests']} warm-up request(s), {c['repeats']} repeat(s), rate {c['request_rate']}, "
                 f"{c['http_client']} HTTP client, {c['client_procs']} process(es), timeout {c['timeout_s']:g} s")
    if c.get("prefix_cache_reset"):
        lines.append(f"{indent}prefix-cache reset before each point: {c['prefix_cache_reset']}")
    for p in plan["points"]:
        if "capacity_search" in p:
            ramp = p.get("mode") == "ramp"
            lines.append(f"{indent}  capacity {'ramp (one run, then a hold)' if ramp else 'search'} over {p['over']}, "
                         f"SLOs {p['capacity_search']}" + (f", {p['search']} search" if p.get("search") else ""))
        else:
            lines.append(f"{indent}  point: concurrency {p['concurrency']}, {p['num_prompts']} prompts, ISL "
                         f"{p['input_len']}, OSL {p['output_len']}"
                         + (f", {p['request_rate']} req/s" if p.get("request_rate") else ""))
        if p.get("lengths"):
            lines.append(f"{indent}    lengths: {format_lengths(p['lengths'])}")
    prof = plan["profiling"]
    lines.append(f"{indent}profiling: " + (
        f"torch profiler for {prof['num_steps']} engine steps, tracelens {prof['tracelens']}, gap analysis "
        f"{prof['gap_analysis']}" if prof["torch_profiler"] else "off") + f"; GPU monitor {prof['gpu_monitor']}")
    lines.append(f"{indent}run folder: {plan['run_folder']}")
    return lines + _notes(plan, indent)


def _notes(plan: dict[str, Any], indent: str) -> list[str]:
    from engine.config.overrides import notice_lines
    machine = [f"this machine: {m} (the config is fine; a run here would stop)"
               for m in plan.get("machine_problems") or []]
    return [f"{indent}{line}" for line in notice_lines(plan.get("warnings") or [], plan.get("overrides") or []) + machine]

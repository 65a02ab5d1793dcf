"""``magpie benchmark``: launch the server (or use ``--base-url``), drive the load, and write
``benchmark_report.json`` (Magpie's keys, plus ``repeats``, ``sweep``, ``overrides``,
``environment`` and vLLM's result fields) and ``summary.txt`` into the run's workspace. A profiled
run collects server-side torch traces into ``torch_trace/`` and analyses them into
``gap_analysis/`` and ``tracelens/``.
"""

from __future__ import annotations

import math
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from engine.bench.capacity import DEFAULT_CEILING, CapacitySearch, capacity_table
from engine.bench.client_procs import ClientPool, ClientProcessError
from engine.bench.control import ControlHooks, hook_lines
from engine.bench.dataset import SampleRequest, sample_random_requests
from engine.bench.datasets import DatasetError, load_custom_jsonl, load_sharegpt
from engine.bench.gpu_monitor import GpuMonitor
from engine.bench.gpu_select import GpuSelectionError, GpuState, gpu_states, select_gpus, visible_devices
from engine.bench.launch import LaunchError, LocalServer, Server, ServerCommand, free_port, server_command
from engine.bench.loadgen import LoadGenConfig, LoadGenerator, freeze_heap
from engine.eventloop import c_loop_turn, event_loop_name, run_coroutine
from engine.bench.metrics import aggregate_repeats, detailed_lists, format_interval
from engine.bench.server_metrics import ServerMetricsScraper
from engine.bench.session_replay import summary_lines as session_summary_lines
from engine.bench.session_run import TOKEN_ID_SESSIONS, is_session_run, run_session_repeats
from engine.bench.tokenizers import NO_VOCAB_FIX, TokenizerError, known_vocab, load_tokenizer
from engine.config.benchmark import CLIENT_ENV_KEYS, BenchmarkConfig
from engine.runs.process import CancelToken
from engine.runs.provenance import benchmark_provenance, with_server
from engine.runs.schema import BENCHMARK_REPORT, SCHEMA_VERSION, RunState, StageState
from engine.runs.workspace import Workspace, write_error

SERVER_METRICS_FILE = "server_metrics.jsonl"  # the server's /metrics, one scrape a line

# Token ids below this when nothing is known (only a config built without prepare() gets here).
_GUESSED_VOCAB = 32000


def _latency_section(result: dict) -> dict:
    return {m: {"mean_ms": result.get(f"mean_{m}_ms"), "median_ms": result.get(f"median_{m}_ms"),
                "p99_ms": result.get(f"p99_{m}_ms"), "std_ms": result.get(f"std_{m}_ms")}
            for m in ("ttft", "tpot", "itl", "e2el")}


def _throughput_section(result: dict) -> dict:
    return {"request_throughput": result.get("request_throughput"), "output_throughput": result.get("output_throughput"),
            "total_token_throughput": result.get("total_token_throughput"),
            "completed_requests": result.get("completed"), "total_input_tokens": result.get("total_input_tokens"),
            "total_output_tokens": result.get("total_output_tokens"), "duration_seconds": result.get("duration")}


def _points(cfg: BenchmarkConfig) -> list[dict[str, Any]]:
    """Sweep points: the cartesian product of the sweep lists (one point when there is no sweep)."""
    points: list[dict[str, Any]] = [{}]
    for key, values in cfg.client.sweep.items():
        points = [{**p, key: v} for p in points for v in values]
    return points


def run_benchmark(cfg: BenchmarkConfig, ws: Workspace, cancel: CancelToken, *, overrides: list[dict],
                  warnings: list[str], log: Callable[[str], None] = lambda s: None) -> tuple[int, dict]:
    started = time.time()
    envs = cfg.effective_envs()
    profiled = cfg.profiler.torch_profiler.enabled
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "success": False, "framework": cfg.framework, "model": cfg.model or cfg.server.size,
        "run_kind": cfg.effective_run_kind(), "profiling_enabled": profiled, "reward_eligible": False,
        "workspace_dir": str(ws.root), "overrides": overrides, "warnings": warnings, "errors": [],
        "envs": envs, "kernel_summary": [], "top_bottlenecks": [], "tracelens_analysis": {"enabled": False},
        "gap_analysis": {"enabled": False}, "provenance": benchmark_provenance(cfg, ws.root),
        "environment": {"python": platform.python_version(), "platform": platform.platform(), "host": platform.node(),
                        "http_client": cfg.client.http_client, "client_procs": cfg.client.client_procs},
    }
    trace_dir = ws.path("torch_trace") if profiled else None
    if trace_dir is not None:
        trace_dir.mkdir(exist_ok=True)
    run = BenchRun(cfg, ws, cancel, report, warnings, log, envs, trace_dir)
    server: Optional[Server] = None
    monitor: Optional[GpuMonitor] = None
    scraper: Optional[ServerMetricsScraper] = None
    chosen: list[GpuState] = []
    state = RunState.FAILED
    report["dataset"] = {"name": cfg.client.dataset_name, "path": cfg.client.dataset_path, "prompts": "token ids",
                         "tokenizer": None, "prefix_len": cfg.client.prefix_len}
    loop = event_loop_name(cfg.client.event_loop, reads_streams=cfg.client.http_client == "lean")
    report["environment"]["event_loop"] = loop
    # asyncio's loop turn (poll, read, hand over the streams) in C or in Python; uvloop's is libuv's
    report["environment"]["loop_turn"] = ("C" if c_loop_turn() else "Python") if loop == "asyncio" else None
    try:
        # Before the server starts: prompts that cannot be made should not cost a server start.
        prompts = _prompt_source(run)
        if cfg.client.base_url:
            report["server"] = {"base_url": cfg.client.base_url.rstrip("/"), "launched": False}
            _check_reachable(cfg.client.base_url)
        else:
            chosen = _select_gpus(cfg, report, log)
            server = run.server = _start_server(run, chosen)
        monitor = _start_monitor(cfg, chosen)
        target = _load_target(run, server, prompts)
        # The server's /metrics once a second, in a thread of its own: off the load generator's event loop.
        scraper = run.scraper = ServerMetricsScraper(target.base_url, ws.path(SERVER_METRICS_FILE)).start()
        state = _assemble_results(run, _run_points(run, target))
    except (LaunchError, OSError, TokenizerError, DatasetError, ClientProcessError) as exc:
        report["errors"].append(str(exc))
    except BaseException as exc:  # anything else still ends in a report that says what happened
        _record_crash(run, exc)
    finally:
        _stop_all(run, monitor, server, scraper)
    if cancel.cancelled:
        state = RunState.CANCELLED  # also when the cancel interrupted the server's start
    _finish_report(run, state, started)
    try:
        ws.write_text("summary.txt", summary_text(report))
    except OSError as exc:
        report["errors"].append(write_error(ws.root / "summary.txt", exc))
        report["success"] = report["reward_eligible"] = False
    code = 130 if report["state"] == RunState.CANCELLED else (0 if report["success"] else 1)
    return code, report


def _check_reachable(base_url: str, timeout_s: float = 5.0) -> None:
    """A server given by URL must at least accept a connection: otherwise one clear error before any
    request, instead of every request failing and a report of zeros."""
    import socket
    from urllib.parse import urlsplit
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise LaunchError(f"the server at {base_url} does not answer ({exc.strerror or exc}): nothing was sent; "
                          "start it, or check --base-url") from None


def _record_crash(run: BenchRun, exc: BaseException) -> None:
    """An unexpected exception: its one-line form in the report, the traceback in logs/."""
    import traceback
    run.report["errors"].append(f"internal error: {type(exc).__name__}: {exc}")
    try:
        (run.ws.logs_dir / "engine_error.log").write_text(traceback.format_exc())
    except OSError:
        pass
    if not isinstance(exc, Exception):  # Ctrl-C reaching here: the run is cancelled, not crashed
        run.cancel.cancel("interrupted")


def _stop_all(run: BenchRun, monitor: Optional[GpuMonitor], server: Optional[Server],
              scraper: Optional[ServerMetricsScraper] = None) -> None:
    try:
        if scraper is not None:  # before the server stops: its last scrape closes the counters' deltas
            run.report["server_metrics"] = scraper.stop()
        if monitor is not None:
            monitor.stop()
            run.report["gpu_monitor"] = monitor.summary()
    finally:
        if server is not None and _keeps_server(run.cfg) and _keep(run, server):
            pass  # left running for the next run, recorded in server_lifecycle.pid_dir
        elif server is not None:
            run.ws.events.emit("stage", stage="server", state=StageState.STOPPING)
            server.stop()


def _keep(run: BenchRun, server: Server) -> bool:
    """Leave a server this run started running for the next run and record it; False when it
    cannot be kept (then it is stopped as usual)."""
    from engine.bench import lifecycle
    from engine.bench.docker_launch import DockerServer
    if isinstance(server, lifecycle.KeptServer):
        return True  # an earlier run's: its record stays
    section = run.report.setdefault("server", {})
    folder = lifecycle.pid_dir(run.cfg.server_lifecycle.pid_dir)
    port = run.cfg.fixed_port()
    try:
        settings = _lifecycle_settings(run)
        if isinstance(server, DockerServer) and server.container is not None:
            path = lifecycle.keep(folder, settings, base_url=server.base_url, port=port,
                                  container_id=server.container.id, docker_url=server.docker_url,
                                  run_dir=str(run.ws.root))
        elif isinstance(server, LocalServer) and server.proc is not None and server.proc.poll() is None:
            path = lifecycle.keep(folder, settings, base_url=server.base_url, port=port, pid=server.proc.pid,
                                  run_dir=str(run.ws.root))
        else:
            return False
    except OSError as exc:
        run.report["errors"].append(f"server_lifecycle: cannot record the kept server in {folder}: {exc}; stopped")
        return False
    section["lifecycle"] = {"kept": str(path), "stopped_at_end": False}
    run.log(f"server_lifecycle: the server stays up at {server.base_url} for the next run ({path}); a run with "
            "cleanup: true and the same settings stops it")
    return True


def _finish_report(run: BenchRun, state: str, started: float) -> None:
    """Trace analysis and the floor (never losing the report to them), then the report and summary."""
    cfg, report = run.cfg, run.report
    try:
        if cfg.profiler.torch_profiler.enabled and run.trace_dir is not None and \
                state in (RunState.COMPLETED, RunState.COMPLETED_WITH_ERRORS):
            _analyse_traces(cfg, run.ws, run.trace_dir, report, run.log)
            report["analysis_errors"] = analysis_errors(report)
            if report["analysis_errors"]:
                # The load's numbers stand; the diagnosis it was profiled for did not come out.
                state = RunState.COMPLETED_WITH_ERRORS
                report["success"] = report["reward_eligible"] = False
                for e in report["analysis_errors"]:
                    run.log(f"error: {e}")
        if cfg.framework == "builtin":  # additive: the weight-read floor of a decode step, TPOT against it
            from engine.serve.floor import builtin_floor
            report["floor"] = builtin_floor(cfg.server.size, cfg.gpu_arch,
                                            ((report.get("latency") or {}).get("tpot") or {}).get("median_ms"))
    except Exception as exc:
        _record_crash(run, exc)
        state = RunState.FAILED
        report["success"] = report["reward_eligible"] = False
    if run.ws.events.write_error:
        report["errors"].append(f"the event log is incomplete: {run.ws.events.write_error}")
    report["state"] = state
    report["execution_time"] = round(time.time() - started, 3)
    write_report(run.ws, BENCHMARK_REPORT, report)


def write_report(ws: Workspace, name: str, report: dict) -> bool:
    """Write the report; when it cannot be written (a full disk, a read-only folder) the run is not a
    success, the error names the file and the errno, and the report stays in memory for the caller
    to print. True when it was written."""
    try:
        ws.write_json(name, report)
        return True
    except OSError as exc:
        report["success"] = report["reward_eligible"] = False
        report["errors"].insert(0, write_error(ws.root / name, exc, "the report"))
        if report.get("state") == RunState.COMPLETED:
            report["state"] = RunState.COMPLETED_WITH_ERRORS
        return False


@dataclass
class BenchRun:
    """What every step of one benchmark run shares (the report is filled in as the steps go)."""
    cfg: BenchmarkConfig
    ws: Workspace
    cancel: CancelToken
    report: dict[str, Any]
    warnings: list[str]
    log: Callable[[str], None]
    envs: dict[str, str]
    trace_dir: Optional[Path]  # where the server writes torch traces; None when not profiled
    server: Optional[Server] = None  # the server this run launched or reused (None: client.base_url)
    # Why the server stopped serving during the load ("the server exited with code -9 after 3.2 s"):
    # the load stops at once, and the run is not a success.
    server_gone: Optional[str] = None
    # Files of measured data that could not be written (each names the file and the errno).
    save_errors: list[str] = field(default_factory=list)
    # The server's /metrics scraper, read by the progress events (None: not started yet).
    scraper: Optional[ServerMetricsScraper] = None
    # The control hooks (prefix-cache reset, profiler) against the server (None: before the load).
    hooks: Optional[ControlHooks] = None
    # Repeats a cancel or the server's exit cut short and the statistics leave out (the report says so).
    cut_repeats: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Launched:
    """What a launcher started: the server, the command it runs (argv and env go into the report)
    and the report's run-mode-specific ``server`` keys."""
    server: Server
    command: ServerCommand
    extra: dict[str, Any] = field(default_factory=dict)


# run_mode -> launcher(run, ready_timeout_s, gpus): starts the server, or raises LaunchError.
ServerLauncher = Callable[[BenchRun, float, list[GpuState]], Launched]


def _start_local(run: BenchRun, ready_timeout: float, chosen: list[GpuState]) -> Launched:
    """The server as a process group on this host, pinned to the chosen GPUs."""
    cfg, ws = run.cfg, run.ws
    cmd = server_command(cfg, server_port(cfg), run.trace_dir)
    cmd.env.update(visible_devices(chosen))
    ws.events.emit("stage", stage="server", state=StageState.RUNNING, argv=cmd.argv)
    run.log(f"starting {cfg.framework} server: {' '.join(cmd.argv)}")
    server = LocalServer(cmd, ws.path("server.log"), ready_timeout_s=ready_timeout,
                         cancelled=lambda: run.cancel.cancelled, keep=_keeps_server(cfg)).start()
    return Launched(server, cmd)


def _keeps_server(cfg: BenchmarkConfig) -> bool:
    """server_lifecycle with cleanup false: the server outlives the run (no watchdog, no parent pid)."""
    return cfg.server_lifecycle.enabled and not cfg.server_lifecycle.cleanup


def _lifecycle_settings(run: BenchRun) -> dict[str, Any]:
    """What makes this run's server the one it is, for finding a kept one (engine.bench.lifecycle):
    the port only when the config fixes it, no GPU pinning (the free GPUs change run to run), and
    none of the envs only the client reads (CONC, ISL, ...: one server serves any load)."""
    from engine.bench.docker_launch import CONTAINER_PORT
    from engine.bench.lifecycle import server_settings
    cfg = run.cfg
    docker = cfg.run_mode == "docker"
    cmd = server_command(cfg, CONTAINER_PORT if docker else (cfg.fixed_port() or 0), run.trace_dir,
                         host="0.0.0.0" if docker else "127.0.0.1")
    cmd.env = {k: v for k, v in cmd.env.items() if k not in _PINNING_VARS and k not in CLIENT_ENV_KEYS}
    return server_settings(cfg.framework, cfg.model or cfg.server.size, cfg.run_mode, cmd, cfg.docker_image)


def _kept_server(run: BenchRun) -> Optional[Server]:
    """A server an earlier run kept (server_lifecycle) with this run's settings, or None."""
    from engine.bench import lifecycle
    lc = run.cfg.server_lifecycle
    settings = _lifecycle_settings(run)
    port = run.cfg.fixed_port()
    kept, notes = lifecycle.find_kept(lifecycle.pid_dir(lc.pid_dir), settings, port, lc.force_reuse,
                                      stop_at_end=lc.cleanup)
    for note in notes:
        run.warnings.append(note)
        run.log(note)
    if kept is not None:
        run.log(f"server_lifecycle: using the server kept at {kept.base_url} ({kept.path})"
                + ("; it is stopped at the end (cleanup: true)" if lc.cleanup else ""))
    return kept


def server_port(cfg: BenchmarkConfig) -> int:
    """Magpie's envs.PORT when the config gives one, else a free port of this host."""
    port = cfg.fixed_port()
    return port if port is not None else free_port()


def _start_server(run: BenchRun, chosen: list[GpuState]) -> Server:
    """Start the server the run mode names and record it in the report; it is ready when this returns."""
    cfg = run.cfg
    launcher = SERVER_LAUNCHERS.get(cfg.run_mode)
    if launcher is None:
        raise LaunchError(f"run_mode {cfg.run_mode!r}: no server launcher (known: {', '.join(SERVER_LAUNCHERS)})")
    ready_timeout = min(cfg.server_lifecycle.server_ready_timeout_s, cfg.timeout_seconds)
    if cfg.server_lifecycle.enabled:
        kept = _kept_server(run)
        if kept is not None:
            run.report["server"] = {"base_url": kept.base_url, "launched": False, "run_mode": cfg.run_mode,
                                    "run_mode_why": cfg.run_mode_why(),
                                    "argv": kept.record["settings"].get("argv"),
                                    "env": kept.record["settings"].get("env"),
                                    "lifecycle": {"reused": str(kept.path), "kept_by_run": kept.record.get("kept_by_run"),
                                                  "stopped_at_end": cfg.server_lifecycle.cleanup}}
            run.ws.events.emit("stage", stage="server", state=StageState.SUCCESS, ready_s=0.0)
            return kept
    launched = launcher(run, ready_timeout, chosen)
    server, cmd = launched.server, launched.command
    try:
        run.report["server"] = {"base_url": server.base_url, "launched": True, "run_mode": cfg.run_mode,
                                "run_mode_why": cfg.run_mode_why(),
                                "argv": cmd.argv, "env": cmd.env, "ready_s": server.ready_s,
                                "log": str(run.ws.path("server.log")), **launched.extra}
        run.report["provenance"] = with_server(run.report.get("provenance"), cfg, launched, chosen)
        run.ws.events.emit("stage", stage="server", state=StageState.SUCCESS, ready_s=server.ready_s)
    except BaseException:
        server.stop()  # the caller only stops a server it was handed
        raise
    return server


def _start_monitor(cfg: BenchmarkConfig, chosen: list[GpuState]) -> Optional[GpuMonitor]:
    if not cfg.profiler.gpu_monitor.enabled:
        return None
    ids = [s.uuid if s.vendor == "nvidia" else str(s.smi_index) for s in chosen] if cfg.client.base_url is None \
        else []
    return GpuMonitor(ids or None, cfg.profiler.gpu_monitor.interval_sec).start()


@dataclass
class PromptSource:
    """How the random prompts are made: through a tokenizer (text), or token ids below ``vocab``."""
    tokenizer: Any  # None: token-id prompts
    vocab: Optional[int]
    special: tuple[int, ...]


@dataclass
class LoadTarget:
    """Where the load goes, and how its random prompts are made."""
    base_url: str
    model: str
    tokenizer: Any  # None: token-id prompts
    vocab: Optional[int]
    special: tuple[int, ...]


_TOKEN_ID_DATASETS = ("random", *TOKEN_ID_SESSIONS)  # prompts made here from token ids: a vocabulary is needed


def _prompt_source(run: BenchRun) -> PromptSource:
    """The tokenizer (named, or the model's as vLLM defaults it), else a vocabulary size known for
    certain; neither raises TokenizerError before anything starts. Recorded in ``report.dataset``."""
    cfg, dataset = run.cfg, run.report["dataset"]
    name = cfg.effective_tokenizer()
    known = known_vocab(cfg)
    if name:
        try:
            tokenizer = load_tokenizer(name)
            dataset.update(prompts="text", tokenizer=name)
            return PromptSource(tokenizer, None, ())
        except TokenizerError as exc:
            if not cfg.tokenizer_is_default() or cfg.client.endpoint == "chat":
                raise
            if cfg.client.dataset_name not in _TOKEN_ID_DATASETS:
                run.warnings.append(f"the model's tokenizer could not be loaded ({exc}); text prompts of the dataset "
                                    "are counted by the server")
                return PromptSource(None, None, ())
            if known is None:
                # A config built without prepare(): the command line, workbench and MCP stop earlier.
                run.warnings.append(f"random prompts use token ids below {_GUESSED_VOCAB}, a guess: {exc} "
                                    f"({NO_VOCAB_FIX})")
                return PromptSource(None, _GUESSED_VOCAB, ())
            run.warnings.append(f"the model's tokenizer could not be loaded ({exc}); random prompts are token ids "
                                f"below {known[0]} ({known[2]})")
    elif cfg.client.dataset_name not in _TOKEN_ID_DATASETS:
        return PromptSource(None, None, ())  # the dataset file has the prompts
    elif known is None:
        raise TokenizerError(f"random token-id prompts for {cfg.framework} {cfg.model!r} need the model's vocabulary "
                             f"size, and none is known: {NO_VOCAB_FIX}")
    dataset.update(vocab_size=known[0], vocab_source=known[2])
    return PromptSource(None, known[0], known[1])


def _load_target(run: BenchRun, server: Optional[Server], prompts: PromptSource) -> LoadTarget:
    cfg = run.cfg
    if server is not None:
        base_url, model = server.base_url, server.model_id or cfg.model or cfg.server.size
    else:
        base_url, model = (cfg.client.base_url or "").rstrip("/"), cfg.model or cfg.server.size
    return LoadTarget(base_url, model, prompts.tokenizer, prompts.vocab, prompts.special)


@dataclass
class _Shape:
    """One sweep point's load: concurrency, lengths, rate and prompt count."""
    conc: int
    isl: int
    osl: int
    rate: float
    num_prompts: int

    @classmethod
    def of(cls, point: dict[str, Any], cfg: BenchmarkConfig, envs: dict[str, str]) -> "_Shape":
        load = cfg.workload()
        conc = int(point.get("concurrency", load.concurrency))
        return cls(conc=conc, isl=int(point.get("input_len", load.input_len)),
                   osl=int(point.get("output_len", load.output_len)),
                   rate=point.get("request_rate", cfg.client.request_rate) or math.inf,
                   num_prompts=load.num_prompts if "concurrency" not in point else conc * 10)

    def to_dict(self) -> dict[str, Any]:
        return {"concurrency": self.conc, "input_len": self.isl, "output_len": self.osl,
                "request_rate": None if self.rate == math.inf else self.rate, "num_prompts": self.num_prompts}

    def lengths(self, cfg: BenchmarkConfig) -> Optional[dict[str, Any]]:
        """The random dataset's resolved length bounds at this point (None for a dataset file)."""
        return cfg.length_bounds(self.isl, self.osl) if cfg.client.dataset_name == "random" else None


def _run_points(run: BenchRun, target: LoadTarget) -> list[dict]:
    """Every sweep point, ``client.repeats`` times; the torch profiler covers the first point. With
    ``client.find_capacity``, the levels of the capacity search instead (the knee's first), or its
    one-run ramp. Each point starts on an empty prefix cache where the run resets it
    (engine.bench.control)."""
    run.hooks = ControlHooks(run.cfg, target.base_url, run.report, run.warnings, run.log,
                             lambda event, **f: run.ws.events.emit(event, **f))
    if run.cfg.client.find_capacity:
        if run.cfg.client.capacity_mode == "ramp":
            from engine.bench.ramp import run_ramp
            return run_ramp(run, target)
        return _run_capacity(run, target)
    sweep_results = []
    for index, point in enumerate(_points(run.cfg)):
        if run.server_gone or run.cancel.cancelled:
            break
        shape = _Shape.of(point, run.cfg, run.envs)
        lengths = shape.lengths(run.cfg)
        if lengths is not None:
            run.log(f"point {point or 'default'}: {format_lengths(lengths)}")
        run.hooks.reset_before(index, point)
        runs = _run_repeats(run, target, point, index, shape)
        sweep_results.append({"point": {**shape.to_dict(), "lengths": lengths}, "runs": runs,
                              "repeats": aggregate_repeats(runs) if len(runs) > 1 else None})
    return sweep_results


def _run_capacity(run: BenchRun, target: LoadTarget) -> list[dict]:
    """The SLO capacity search (engine.bench.capacity): each level as a sweep point with its repeats;
    ``report.capacity`` gets every level tried. Returned with the knee's level first."""
    cl = run.cfg.client
    search = CapacitySearch(over=cl.capacity_over, target=cl.goodput_target,
                            ceiling=cl.capacity_max or DEFAULT_CEILING, max_steps=cl.capacity_steps,
                            search=cl.capacity_search)
    results: list[dict] = []
    index = 0
    while not run.cancel.cancelled and not run.server_gone:
        level = search.next_level()
        if level is None:
            break
        point = {cl.capacity_over: int(level) if cl.capacity_over == "concurrency" else level}
        shape = _Shape.of(point, run.cfg, run.envs)
        if run.hooks is not None:
            run.hooks.reset_before(index, point)
        runs = _run_repeats(run, target, point, index, shape)
        if not runs:
            break
        lv = search.record(level, runs)
        again = f" (run {len(lv.runs)} of it: its verdict was undecided)" if len(lv.runs) > len(runs) else ""
        run.log(f"capacity: {cl.capacity_over} {level:g}{again}: goodput {lv.share:.1%} -> "
                f"{'pass' if lv.passed else 'fail'}" + (f", SLO margin {lv.margin:.2f}" if lv.margin is not None else ""))
        run.ws.events.emit("capacity_level", **lv.to_dict(cl.capacity_over))
        same = next((r for r in results if r["level"] == level), None)
        if same is not None:  # a replicate of a level already run: its runs join the level's
            same["runs"] = same["runs"] + runs
            same["repeats"] = aggregate_repeats(same["runs"])
        else:
            results.append({"point": {**shape.to_dict(), "lengths": shape.lengths(run.cfg)}, "runs": runs,
                            "repeats": aggregate_repeats(runs) if len(runs) > 1 else None, "level": level})
        index += 1
    section = search.summary(cl.find_capacity)
    run.report["capacity"] = section
    knee = section["knee"]
    results.sort(key=lambda r: r["level"] != knee)  # the knee's result is the run's headline
    return results


def _requests(run: BenchRun, target: LoadTarget, shape: _Shape, rep: int) -> list[SampleRequest]:
    """The measured requests of one repeat: the random dataset, or the file that client.dataset_name names."""
    cfg = run.cfg
    cl = cfg.client
    explicit = int(cfg.envs["NUM_PROMPTS"]) if "NUM_PROMPTS" in cfg.envs else None
    if cl.dataset_name == "custom":
        assert cl.dataset_path is not None
        return load_custom_jsonl(cl.dataset_path, num_requests=explicit, tokenizer=target.tokenizer,
                                 output_len=cl.custom_output_len or shape.osl)
    if cl.dataset_name == "sharegpt":
        assert cl.dataset_path is not None
        return load_sharegpt(cl.dataset_path, num_requests=shape.num_prompts, seed=cl.seed + rep,
                             output_len=cl.sharegpt_output_len, tokenizer=target.tokenizer, default_output_len=shape.osl)
    rule, ratio = cfg.length_rule()
    return sample_random_requests(shape.num_prompts, input_len=shape.isl, output_len=shape.osl,
                                  range_ratio=ratio, length_rule=rule, prefix_len=cl.prefix_len,
                                  seed=cl.seed + rep, vocab_size=target.vocab, special_ids=target.special,
                                  tokenizer=target.tokenizer)


def _load_generator(run: BenchRun, target: LoadTarget, point: dict, shape: _Shape,
                    rep: int, warm: bool = True) -> LoadGenerator | ClientPool:
    """One repeat's load: a LoadGenerator in this process, or a pool of ``client_procs`` processes
    (as many as the concurrency allows, for a capacity-search level below them); ``warm`` False:
    no warm-up requests (a later repeat inside the profiler's window)."""
    cfg = run.cfg
    requests = _requests(run, target, shape, rep)
    config = LoadGenConfig(base_url=target.base_url, model=target.model,
                           endpoint="/v1/chat/completions" if cfg.client.endpoint == "chat"
                           else "/v1/completions",
                           request_rate=shape.rate, burstiness=cfg.client.burstiness,
                           max_concurrency=shape.conc, num_warmups=cfg.client.warmup if warm else 0,
                           seed=cfg.client.seed + rep,
                           request_timeout_s=cfg.timeout_seconds,
                           http_client=cfg.client.http_client, event_loop=cfg.client.event_loop,
                           duration_s=cfg.client.duration, warmup_s=cfg.client.warmup_seconds,
                           cooldown_s=cfg.client.cooldown_seconds)
    procs = min(cfg.client.client_procs, shape.conc)
    if procs > 1:
        return ClientPool(config, requests, procs, log_dir=run.ws.logs_dir, timeout_s=cfg.timeout_seconds)
    return LoadGenerator(config, requests)


def _run_repeats(run: BenchRun, target: LoadTarget, point: dict, index: int, shape: _Shape) -> list[dict]:
    """One sweep point's repeats: their results, less a repeat that a cancel cut short."""
    if is_session_run(run.cfg.client):
        return run_session_repeats(run, target, point, index, shape)
    cfg, cancel = run.cfg, run.cancel
    # The profiler covers every repeat of the first point, so all of them run under the same
    # conditions (a profiled run is diagnostic: its numbers are not a baseline). It starts after
    # the first repeat's warm-up and stops when the last repeat's measured load has ended (or the
    # repeats stopped early); the later repeats skip their warm-up (the server is warm), so the
    # trace holds measured load only.
    profiled = cfg.profiler.torch_profiler.enabled and index == 0 and run.hooks is not None
    profiling = [False]
    runs: list[dict] = []
    for rep in range(cfg.client.repeats):
        if cancel.cancelled or run.server_gone:
            break
        lg = _load_generator(run, target, point, shape, rep, warm=not (profiled and rep > 0))
        cancel_watch = _watch_cancel(cancel, lg, run)
        progress = ProgressTimer(lg, lambda **f: run.ws.events.emit("progress", **f),
                                 {"repeat": rep, "repeats": cfg.client.repeats, "point": point,
                                  "point_index": index}, scraper=run.scraper).start()
        if profiled and rep == 0:
            lg.before_measure = lambda after=f"after the warm-up ({lg.config.num_warmups} request(s))": \
                _start_profiler(run, after, profiling)
        try:
            result_obj = _run(lg)
        finally:
            progress.stop()
        if profiling[0] and (rep == cfg.client.repeats - 1 or cancel.cancelled or run.server_gone):
            profiling[0] = False
            _stop_profiler(run, f"the end of the measured load of repeat {rep + 1} of {cfg.client.repeats}")
        cancel_watch()
        result = result_obj.metrics(goodput_slos=cfg.client.find_capacity or cfg.client.goodput or None,
                                    slo_quantile=cfg.client.goodput_target if cfg.client.find_capacity else None
                                    ).to_result()
        # How the client ACKed the measured tokens: every second one where its warm-up proved the server
        # does not wait for ACKs (True), every one (False: tried, never proved; None: not tried)
        result["halved_acks"] = result_obj.halved_acks
        if result_obj.window is not None:
            result["measured_window_s"] = list(result_obj.window)
            result["excluded_requests"] = result_obj.excluded
        errors = sorted({o.error for o in result_obj.outputs if not o.success and o.error})
        result["errors"] = errors[:10]
        result["failed_by_cause"] = failures_by_cause(result_obj.outputs)
        if (run.server_gone or cancel.cancelled) and runs:
            # A repeat cut short is not a sample of the same workload: keep it out of the
            # statistics (the first repeat stays, marked, so a cancelled run still reports), and
            # say which one it was and how far it got.
            why = "the server's exit" if run.server_gone else "the cancel"
            run.cut_repeats.append({"point": point, "point_index": index, "repeat": rep + 1,
                                    "repeats": cfg.client.repeats, "completed": result["completed"],
                                    "failed": result["failed"], "why": why})
            run.log(f"repeat {rep + 1} of {cfg.client.repeats} cut short by {why} ({result['completed']} "
                    "completed): left out of the repeat statistics")
            break
        if run.server_gone:
            result["server_exit"] = run.server_gone
        result["cut_short"] = bool(cancel.cancelled or run.server_gone)
        # Per-request lists (vLLM's --save-detailed fields), for latency distributions. A write that
        # fails (a full disk) loses these lists only: the run's numbers stay in memory for the report.
        _save(run, f"requests/point{index}_repeat{rep}.json", detailed_lists(result_obj.outputs))
        runs.append(result)
        run.log(f"point {point or 'default'} repeat {rep + 1}/{cfg.client.repeats}: "
                f"{result['completed']} ok, {result['failed']} failed, "
                f"{result['output_throughput']:.1f} output tok/s, TTFT p50 {result['median_ttft_ms']:.1f} ms")
    if profiling[0]:  # the repeats stopped before the last one
        _stop_profiler(run, f"the end of the measured load of repeat {len(runs)} of {cfg.client.repeats}")
    return runs


class ProgressTimer:
    """A ``progress`` event about once a second while a load generator runs, and one last one at
    its end. A thread of its own reads the generator's counters (its phase, the measured requests
    finished so far), so the load generator does no reporting work per request and its event
    loop is never woken for this."""

    def __init__(self, lg: LoadGenerator | ClientPool, emit: Callable[..., None], extra: dict[str, Any],
                 interval_s: float = 1.0, scraper: Optional[ServerMetricsScraper] = None) -> None:
        self.lg, self.emit, self.extra, self.interval_s = lg, emit, extra, interval_s
        self.scraper = scraper
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._seen = 0
        self._broken = False
        self._completed = self._failed = self._never_sent = self._tokens = 0
        self._ttfts: list[float] = []
        self._tpots: list[float] = []

    def start(self) -> "ProgressTimer":
        self._thread = threading.Thread(target=self._loop, name="bench-progress", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._emit()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._emit()

    def _emit(self) -> None:
        if self._broken:
            return
        try:
            self.emit(**self.snapshot(), **self.extra)
        except OSError:  # events.jsonl cannot be written (a full disk): the load goes on, unreported
            self._broken = True

    def snapshot(self) -> dict[str, Any]:
        lg = self.lg
        if lg.phase == "warmup":
            return {"phase": "warmup", "done": lg.finished("warmup"), "total": lg.phase_total}
        outs = lg.measured
        n = len(outs)
        for o in outs[self._seen:n]:
            if not o.success:
                self._failed += 1
                self._never_sent += o.error == NEVER_SENT  # queued when a cancel came: the server never saw it
                continue
            self._completed += 1
            n_out = o.effective_output_tokens
            self._tokens += n_out
            self._ttfts.append(o.ttft)
            if n_out > 1:
                self._tpots.append((o.latency - o.ttft) / (n_out - 1))
        self._seen = n
        start = lg.measure_start
        elapsed = time.perf_counter() - start if start is not None else 0.0
        out: dict[str, Any] = {
            "phase": "measure", "done": n, "total": lg.phase_total, "completed": self._completed,
            "failed": self._failed, "never_sent": self._never_sent, "elapsed_s": round(elapsed, 3),
            "output_tok_s": round(self._tokens / elapsed, 3) if elapsed > 0 else None,
            "output_tokens": self._tokens,
            **_p50_p99("ttft", self._ttfts), **_p50_p99("tpot", self._tpots),
            "in_flight": getattr(lg, "in_flight", None), "eta_s": self._eta(n, elapsed)}
        if self.scraper is not None:
            out.update(self.scraper.latest())
        return out

    def _eta(self, done: int, elapsed: float) -> Optional[float]:
        """Seconds left in this repeat's measured load: what a duration-bounded run has left, else
        the requests left at the pace of those done so far (None before the first is done)."""
        duration = getattr(getattr(self.lg, "config", None), "duration_s", None)
        if duration is not None:
            return round(max(0.0, duration - elapsed), 1)
        total = self.lg.phase_total
        if not done or not total or elapsed <= 0:
            return None
        return round(max(0, total - done) * elapsed / done, 1)


def _p50_p99(name: str, values: list[float]) -> dict[str, Optional[float]]:
    """``{name}_p50_ms`` and ``{name}_p99_ms`` of seconds (linear, as the report's percentiles),
    in one pass over the values (the progress thread holds the GIL beside the load generator)."""
    if not values:
        return {f"{name}_p50_ms": None, f"{name}_p99_ms": None}
    p50, p99 = np.percentile(np.asarray(values, dtype=float), [50, 99])
    return {f"{name}_p50_ms": round(float(p50) * 1e3, 3), f"{name}_p99_ms": round(float(p99) * 1e3, 3)}


def _start_profiler(run: BenchRun, after: str, profiling: list[bool]) -> None:
    """The server's profiler, started once the warm-up is done (``after`` says when, for the report);
    raises ControlHookError when it did not start."""
    assert run.hooks is not None
    run.hooks.start_profile(_profile_body(run.cfg), after)
    profiling[0] = True


def _stop_profiler(run: BenchRun, until: str) -> None:
    """Stop the server's profiler (a failure is a warning: it may have stopped by itself after num_steps)."""
    assert run.hooks is not None
    run.hooks.stop_profile(run.cfg.profiler.torch_profiler.flush_timeout_seconds, until)


def _assemble_results(run: BenchRun, sweep_results: list[dict]) -> str:
    """The report's result sections (the first point's first repeat, its repeats, the sweep); the run's state."""
    report, cancel = run.report, run.cancel
    first = sweep_results[0]["runs"][0] if sweep_results and sweep_results[0]["runs"] else {}
    report["result"] = first
    report["throughput"] = _throughput_section(first)
    report["latency"] = _latency_section(first)
    report["repeats"] = sweep_results[0]["repeats"] if sweep_results else None
    report["sweep"] = sweep_results if len(sweep_results) > 1 else None
    report["lengths"] = sweep_results[0]["point"].get("lengths") if sweep_results else None
    if "sessions" in first:
        report["sessions"] = first["sessions"]
    failures = _failures(sweep_results)
    report["failures"] = failures
    report["repeats_cut"] = run.cut_repeats or None
    if run.server_gone:
        report["server_exit"] = run.server_gone
    measured = bool(first) and first.get("completed", 0) > 0
    report["success"] = (measured and not cancel.cancelled and not failures["requests"] and not run.server_gone
                         and not run.save_errors)
    report["reward_eligible"] = report["success"] and report["run_kind"] == "measurement"
    reasons = []
    if run.server_gone:
        reasons.append(f"the server stopped serving: {run.server_gone}")
    if failures["requests"]:
        causes = "; ".join(f"{n} x {cause}" for cause, n in list(failures["by_cause"].items())[:5])
        reasons.append(f"{failures['requests']} of {failures['sent']} measured request(s) failed: {causes}")
    report["errors"][:0] = reasons + list(run.save_errors)  # the reasons first
    if cancel.cancelled:
        return RunState.CANCELLED
    if run.server_gone or not measured:
        return RunState.FAILED
    # Every request measured but some failed, or a file of it could not be saved: the numbers are
    # there, the run is not a success.
    return RunState.COMPLETED if report["success"] else RunState.COMPLETED_WITH_ERRORS


NEVER_SENT = "cancelled before sending"  # the load generator's error for a request a stop kept queued


def _failures(sweep_results: list[dict]) -> dict[str, Any]:
    """Measured requests over every point and repeat: sent, failed (by cause) and never sent (queued
    when the load stopped: not a failure of the server, not a request it saw)."""
    sent = failed = never = 0
    by_cause: dict[str, int] = {}
    for point in sweep_results:
        for r in point["runs"]:
            causes = dict(r.get("failed_by_cause") or {})
            unsent = causes.pop(NEVER_SENT, 0)
            never += unsent
            failed += (r.get("failed") or 0) - unsent
            sent += (r.get("completed") or 0) + (r.get("failed") or 0) - unsent
            for cause, n in causes.items():
                by_cause[cause] = by_cause.get(cause, 0) + n
    return {"requests": failed, "sent": sent, "never_sent": never,
            "by_cause": dict(sorted(by_cause.items(), key=lambda kv: -kv[1]))}


_PINNING_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _select_gpus(cfg: BenchmarkConfig, report: dict, log: Callable[[str], None]) -> list[GpuState]:
    """Free GPUs for the server, unless selection is off or the user pinned devices already."""
    sel = cfg.gpu_selection
    envs = cfg.effective_envs()
    pinned = [v for v in _PINNING_VARS if v in os.environ or v in envs]
    if not sel.auto or pinned:
        report["gpu_selection"] = {"auto": False, "reason": f"pinned by {', '.join(pinned)}" if pinned else "off"}
        return []
    states = gpu_states()
    if not states:
        report["gpu_selection"] = {"auto": True, "gpus": [], "reason": "no GPU found (nvidia-smi / amd-smi)"}
        return []
    count = sel.count or int(envs.get("TP", "1") or 1)
    try:
        chosen, skipped = select_gpus(states, count, min_free_gb=sel.min_free_memory_gb, candidates=sel.candidates)
    except GpuSelectionError as exc:
        raise LaunchError(f"GPU selection: {exc}") from None
    report["gpu_selection"] = {"auto": True, "gpus": [s.to_dict() for s in chosen], "skipped": skipped,
                               "env": visible_devices(chosen)}
    log(f"GPUs: {', '.join(f'{s.runtime_index} ({s.bus_id})' for s in chosen)}")
    return chosen


def _start_container(run: BenchRun, ready_timeout: float, chosen: list[GpuState]) -> Launched:
    """The server in a container (docker SDK): image by framework x GPU arch, GPUs by vendor."""
    from engine.bench.docker_launch import CONTAINER_PORT, DockerServer, container_spec
    cfg, ws, log = run.cfg, run.ws, run.log
    if cfg.framework == "builtin":
        raise LaunchError("the built-in server runs on this host: use --run-mode local")
    arch = cfg.gpu_arch
    if arch is None:
        from engine.hw.detect import detect_gpu
        info = detect_gpu()
        arch = info.arch if info is not None else None
    cmd = server_command(cfg, CONTAINER_PORT, run.trace_dir, host="0.0.0.0")
    host_port = server_port(cfg)
    gpus = ([s.uuid for s in chosen] if chosen[0].vendor == "nvidia" else [str(s.runtime_index) for s in chosen]) \
        if chosen else None
    spec = container_spec(cfg, cmd, arch=arch, workspace=ws.root, host_port=host_port, gpus=gpus)
    log(f"starting {cfg.framework} in a container from {spec['image']}")
    ws.events.emit("stage", stage="server", state=StageState.RUNNING, image=spec["image"], argv=cmd.argv)
    base_url = f"http://127.0.0.1:{host_port}"
    server = DockerServer(spec, base_url, ws.path("server.log"), ready_timeout_s=ready_timeout,
                          cancelled=lambda: run.cancel.cancelled).start()
    return Launched(server, cmd, {"image": spec["image"], "gpu_arch": arch, "container": spec["name"]})


# How each ``run_mode`` starts its server; a new mode (a remote host, Ray) adds its launcher here.
SERVER_LAUNCHERS: dict[str, ServerLauncher] = {"local": _start_local, "docker": _start_container}


def _profile_body(cfg: BenchmarkConfig) -> dict:
    """Each framework's way to bound a profile to N engine steps (torch_profiler.num_steps)."""
    tp = cfg.profiler.torch_profiler
    body: dict = {} if tp.num_steps is None else (
        {"max_iterations": tp.num_steps} if cfg.framework == "vllm" else {"num_steps": tp.num_steps})
    if cfg.framework == "builtin" and not tp.kernel_sites:
        body["kernel_sites"] = False
    return body


def _run(lg: LoadGenerator | ClientPool):
    if isinstance(lg, ClientPool):
        return lg.run()  # each process freezes its own heap
    freeze_heap()
    return run_coroutine(lg.run(), lg.config.event_loop, reads_streams=lg.config.http_client == "lean")


SERVER_POLL_S = 0.5  # how often the run looks whether the server is gone, unless it says (exit_poll_s)


def _watch_cancel(cancel: CancelToken, lg: LoadGenerator | ClientPool,
                  run: Optional["BenchRun"] = None) -> Callable[[], None]:
    """Forward a cancel (Ctrl-C, SIGTERM) to the load generator, and stop the load when the server
    this run started dies (``run.server_gone``: the run fails fast instead of sending every
    remaining request to nothing); returns a stop function."""
    import threading
    done = threading.Event()
    exited = getattr(run.server, "exited", None) if run is not None else None
    poll_s = getattr(run.server, "exit_poll_s", SERVER_POLL_S) if run is not None else SERVER_POLL_S
    started = time.monotonic()

    def watch() -> None:
        last_poll = 0.0
        while not done.wait(min(0.1, poll_s)):
            if cancel.cancelled:
                lg.cancel()
                return
            if exited is not None and time.monotonic() - last_poll >= poll_s:
                last_poll = time.monotonic()
                why = exited()
                if why:
                    run.server_gone = f"{why} after {time.monotonic() - started:.1f} s of load"
                    run.log(f"error: {run.server_gone}: stopping the load")
                    lg.cancel()
                    return

    threading.Thread(target=watch, daemon=True).start()
    return done.set


def _save(run: "BenchRun", name: str, obj: Any) -> None:
    """Write a file of measured data; a failure (full disk, read-only folder) is recorded by file
    and errno, and the run goes on: what was measured stays in memory for the report."""
    try:
        run.ws.write_json(name, obj)
    except OSError as exc:
        run.save_errors.append(write_error(run.ws.root / name, exc))


def failures_by_cause(outputs: Any) -> dict[str, int]:
    """Failed requests counted by cause (the first line of each error, at most 120 characters)."""
    counts: dict[str, int] = {}
    for o in outputs:
        if not o.success:
            cause = (o.error or "unknown error").splitlines()[0][:120] or "unknown error"
            counts[cause] = counts.get(cause, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _magpie_ratio(cfg: BenchmarkConfig) -> float:
    """The ratio R of Magpie's [OSL*R, OSL] with the same mean output length as this run's lengths
    (the trace split's expected share of prefill steps is 2*CONC / (OSL*(1+R)))."""
    rule, ratio = cfg.length_rule()
    return ratio if rule == "magpie" else 1.0  # vLLM's spread is centred on OSL


def _analyse_traces(cfg: BenchmarkConfig, ws: Workspace, trace_dir: Path, report: dict,
                    log: Callable[[str], None]) -> None:
    from engine.trace.analyze import TraceAnalysisOptions, run_trace_analysis
    from engine.trace.gaps import aggregate_kernels, trace_window
    from engine.trace.load import load_trace
    from engine.trace.discover import discover_traces
    ga = cfg.gap_analysis
    load = cfg.workload()
    opts = TraceAnalysisOptions(
        top_k=ga.top_k, start_pct=ga.trace_start_pct, end_pct=ga.trace_end_pct, min_duration_us=ga.min_duration_us,
        categories=tuple(ga.categories), ignore_categories=tuple(ga.ignore_categories),
        find_kernel_sources=ga.find_kernel_sources, kernel_source_repos=[Path(p) for p in ga.kernel_source_repos],
        gpu_arch=cfg.gpu_arch or cfg.profiler.tracelens.gpu_arch_config, stages=cfg.profiler.tracelens.analysis_stages,
        tracelens=cfg.profiler.tracelens.enabled, isl=load.input_len, osl=load.output_len, conc=load.concurrency,
        random_range_ratio=_magpie_ratio(cfg), num_steps=cfg.profiler.tracelens.num_steps)
    try:
        traces = discover_traces(trace_dir)
    except FileNotFoundError as exc:
        report["errors"].append(f"profiling: {exc}")
        return
    # Magpie's kernel_summary: the largest trace's kernels (issue #38: not the warm-up trace).
    largest = max((p for _, p in traces), key=lambda p: p.stat().st_size)
    trace = load_trace(largest)
    aggs = aggregate_kernels(trace, trace_window(trace), categories=("kernel",), ignore_categories=())
    total = sum(a.total for a in aggs.values()) or 1.0
    ranked = sorted(aggs.values(), key=lambda a: -a.total)
    report["kernel_summary"] = [{"name": a.name, "time_ms": a.total / 1e3, "percent": a.total / total * 100,
                                 "calls": len(a.durations)} for a in ranked[:50]]
    report["top_bottlenecks"] = [a.name for a in ranked[:10]]
    del trace, aggs, ranked  # the analysis loads the traces itself: do not hold a second copy
    if not (ga.enabled or cfg.profiler.tracelens.enabled):
        return
    try:
        result = run_trace_analysis(trace_dir, opts, ws, log)
        if ga.enabled:
            report["gap_analysis"] = result.report["gap_analysis"]
        report["tracelens_analysis"] = result.report["tracelens_analysis"]
        report["trace_checks"] = result.report["trace_checks"]
        report["trace_analysis_summary"] = result.report["summary_lines"]
    except Exception as exc:  # the measured numbers above stand on their own
        report["errors"].append(f"trace analysis: {type(exc).__name__}: {exc}")


def analysis_errors(report: dict) -> list[str]:
    """Every failure of a profiled run's analysis stages (profiling, kernel summary, gap analysis,
    TraceLens and each of its inference stages), one line each, named by stage."""
    out = [e for e in report.get("errors", []) if e.startswith(("profiling:", "trace analysis:"))]
    tl = report.get("tracelens_analysis") or {}
    if tl.get("enabled"):
        out += [f"tracelens: {e}" for e in tl.get("errors") or []]
        for stage, result in (tl.get("stage_results") or {}).items():
            if isinstance(result, dict) and result.get("error"):
                out.append(f"tracelens {stage}: {result['error']}")
    ga = report.get("gap_analysis") or {}
    if ga.get("enabled"):
        out += [f"gap analysis: {e}" for e in ga.get("errors") or []]
    return out


def summary_text(report: dict) -> str:
    lines = [line for line in (_all_failed_line(report),) if line]
    if report.get("analysis_errors"):
        lines.append(f"COMPLETED WITH ERRORS: the load was measured, {len(report['analysis_errors'])} analysis "
                     f"stage(s) failed: {report['analysis_errors'][0].splitlines()[0][:200]}")
    lines += [f"magpie benchmark: {report['framework']} {report['model']} — {report.get('state')}",
             f"run kind: {report['run_kind']}; profiling: {report['profiling_enabled']}; "
             f"workspace: {report['workspace_dir']}"]
    t = report.get("throughput") or {}
    if t.get("completed_requests") is not None:
        lines.append(f"requests: {t['completed_requests']} completed in {t['duration_seconds']:.2f} s; "
                     f"{t['request_throughput']:.2f} req/s, {t['output_throughput']:.1f} output tok/s, "
                     f"{t['total_token_throughput']:.1f} total tok/s")
        for m, v in (report.get("latency") or {}).items():
            if v.get("mean_ms") is not None:
                lines.append(f"{m.upper():5} mean {v['mean_ms']:.2f} ms, median {v['median_ms']:.2f} ms, "
                             f"p99 {v['p99_ms']:.2f} ms, std {v['std_ms']:.2f} ms")
    rep = report.get("repeats")
    if rep:
        for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms"):
            r = rep.get(key)
            if r:
                lines.append(f"{key} over {r['n']} repeats: {r['mean']:.3f} (95% CI {format_interval(r)})")
    if report.get("sessions"):
        lines += session_summary_lines(report["sessions"])
    if report.get("capacity"):
        lines += capacity_table(report["capacity"])
    lines += hook_lines(report)  # the prefix-cache resets, the profiler's window
    if report.get("lengths"):
        lines.append(f"lengths: {format_lengths(report['lengths'])}")
    if (report.get("tracelens_analysis") or {}).get("skipped"):
        lines.append(f"tracelens: skipped: {report['tracelens_analysis']['skipped']}")
    for name in report.get("top_bottlenecks", [])[:5]:
        lines.append(f"bottleneck: {name[:100]}")
    lines += report.get("trace_analysis_summary") or []  # the trace's self-checks, the idle gaps by cause
    for e in report.get("errors", []):
        lines.append(f"error: {e.splitlines()[0] if e else e}")
    for e in report.get("analysis_errors") or []:
        if e not in report.get("errors", []):
            lines.append(f"error: {e.splitlines()[0] if e else e}")
    lines.append(f"elapsed: {report.get('execution_time', 0):.1f} s")
    return "\n".join(lines) + "\n"


def format_lengths(lengths: dict[str, Any]) -> str:
    """``input 512-1024 tokens, output 64-128 (RANDOM_RANGE_RATIO 0.5, Magpie's [L*r, L])``."""
    def span(lo_hi: list[int]) -> str:
        return f"{lo_hi[0]}" if lo_hi[0] == lo_hi[1] else f"{lo_hi[0]}-{lo_hi[1]}"
    meaning = "Magpie's [L*r, L]" if lengths["rule"] == "magpie" else "vLLM's [L*(1-r), L*(1+r)]"
    name = "RANDOM_RANGE_RATIO" if lengths["rule"] == "magpie" else "vllm_range_ratio"
    return (f"input {span(lengths['input'])} tokens, output {span(lengths['output'])} tokens "
            f"({name} {lengths['ratio']:g}, {meaning})")


def _all_failed_line(report: dict) -> str:
    """One line for the top of summary.txt when the run is not a success because of its load: every
    measured request failed, the server stopped serving, or some requests failed (else "")."""
    result = report.get("result") or {}
    failed, completed = result.get("failed") or 0, result.get("completed") or 0
    if report.get("server_exit"):
        f = report.get("failures") or {}
        return (f"SERVER EXITED DURING THE RUN: {report['server_exit']}; {f.get('requests', failed)} of "
                f"{f.get('sent', failed + completed)} measured request(s) failed; see server.log")
    if failed and completed:
        f = report.get("failures") or {}
        cause = next(iter((f.get("by_cause") or {}).items()), None)
        return (f"NOT A SUCCESS: {f.get('requests', failed)} of {f.get('sent', failed + completed)} measured "
                "request(s) failed" + (f" ({cause[1]} x {cause[0]})" if cause else ""))
    if not failed or completed:
        return ""
    first = (result.get("errors") or [""])[0]
    return (f"ALL {failed} REQUESTS FAILED: no measurement" + (f"; first error: {first.splitlines()[0][:200]}"
                                                              if first else ""))

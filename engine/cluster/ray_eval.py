"""analyze / compare on a Ray cluster: the Evaluator's stages, fanned out as Ray tasks.

* **check** tasks (``num_cpus``, plus ``check_gpus`` of a GPU when testcases need one): compile
  and testcase of one kernel each, at most ``--workers`` in flight. A kernel that fails here
  never takes a GPU.
* **time** tasks (one whole GPU: ``{gpu_resource: 1}``): the local Evaluator on the baseline and
  one candidate (compare) or one kernel (analyze). Two timings never share a GPU, the baseline
  is re-timed beside every candidate on the GPU that times it, and a candidate's speedup is the
  ratio of the two on that GPU (paired rounds where the harness interleaves them).

Where timing runs (``timing_placement``, ``scheduler.ray.device``): one kind of device per run,
as a local run times on this machine's GPU or, with none, on its CPU. ``auto`` times on GPUs
when any node offers ``gpu_resource`` (or the config asks for GPUs: ``gpu_type``, a custom
``gpu_resource``), else on the CPU: a time task then holds all the CPUs of one node, pinned to
it, so nothing else runs beside a timing, and checks hold no GPU share. On a mixed cluster GPU
timing never lands on a CPU-only node (it holds a GPU), and ``device: cpu`` times CPU kernels
on the CPU-only nodes only. A cluster that cannot run what is asked (GPU timing, no GPU node)
runs nothing: every kernel is ``not run`` with the cause, never ``incorrect``.

Results and each task's folder come back through the object store (or are written in place
with ``shared_storage``) into the one run folder: ``tasks/<kind>_<kernel>/`` holds a task's
logs, harness files and events; ``cluster.json`` the Ray job id, the address and every task
with its node, GPU model and state. A cluster with several GPU models is refused unless
``gpu_type`` picks one or ``allow_mixed_gpus`` says ranking across them is fine.
"""

from __future__ import annotations

import copy
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from engine.cluster.raytasks import (
    CancelFlagImpl, ClusterError, benchmark_point_task, cluster_gpu_models, kernel_roots, kernel_task, pack_dir,
    rewrite_paths, unpack,
)
from engine.errors import MagpieError
from engine.kernels.pipeline import CANCELLED, FAILED, SKIPPED, SUCCESS, Evaluator, KernelOutcome, StageResult
from engine.runs.workspace import atomic_write_json

CLUSTER_FILE = "cluster.json"
_WAIT_S = 0.2


# ---------------------------------------------------------------------- connection
RAY_CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: Optional[str]) -> None:
    """An address given as HOST:PORT (or ray://HOST:PORT) must accept a connection within seconds:
    ray.init itself retries an unreachable head for minutes, deaf to signals meanwhile. ``auto``
    and no address (a local instance) are Ray's own to find."""
    if not address or address == "auto":
        return
    import socket
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # not HOST:PORT: Ray reports what it makes of it
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} (nothing answered on "
                           f"{host}:{port} within {RAY_CONNECT_TIMEOUT_S:g} s)",
                           hint="start one with 'ray start --head' and give --ray-address HOST:6379 (or "
                                "scheduler.ray.address)") from None


def connect(settings: Any) -> dict:
    """Join the cluster (``address``; $RAY_ADDRESS; else a Ray instance for this run), with
    this tool shipped to the workers unless told not to. Returns what cluster.json records."""
    try:
        import ray
    except ImportError as exc:
        from engine.extras import missing_extra_error
        raise missing_extra_error(exc, "ray", "running on Ray (-e ray)") or exc from None
    if not ray.is_initialized():
        runtime_env: dict = {"env_vars": {"PYTHONUNBUFFERED": "1", **settings.env_vars}}
        if settings.ship_engine:
            runtime_env["py_modules"] = [str(Path(__file__).resolve().parents[1])]
        address = settings.address or os.environ.get("RAY_ADDRESS") or None
        _check_reachable(address)
        # ray.init installs its own SIGTERM/SIGINT handlers (exit at once); the run's handlers,
        # which cancel and still write the report, are put back after it.
        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} \
            if threading.current_thread() is threading.main_thread() else {}
        try:
            ray.init(address=address, namespace=settings.namespace, runtime_env=runtime_env,
                     logging_level="WARNING", log_to_driver=False, include_dashboard=False if address is None else None)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"cannot reach the Ray cluster at {address or 'a new local instance'}: {exc}",
                               hint="start one with 'ray start --head' and give --ray-address HOST:6379 "
                                    "(or scheduler.ray.address); a cluster with token authentication also needs "
                                    "RAY_AUTH_MODE=token and its token (~/.ray/auth_token or $RAY_AUTH_TOKEN) here"
                               ) from None
        finally:
            for sig, handler in saved.items():
                if handler is not None:
                    signal.signal(sig, handler)
    ctx = ray.get_runtime_context()
    return {"address": settings.address or os.environ.get("RAY_ADDRESS") or "local instance",
            "gcs_address": ctx.gcs_address, "ray_job_id": ctx.get_job_id(), "namespace": settings.namespace,
            "driver_pid": os.getpid(), "ray_version": ray.__version__}


def check_gpu_models(models: dict[str, list[str]], s: Any) -> dict[str, list[str]]:
    """The GPU models timing may use (model -> node ids), or a ClusterError: no GPU node, the
    asked-for model missing, or several models with neither gpu_type nor allow_mixed_gpus."""
    if not models:
        raise ClusterError(f"no node of the cluster offers the resource {s.gpu_resource!r} that GPU timing needs "
                           f"({_why_gpu(s)})",
                           hint="add GPU nodes, or set scheduler.ray.gpu_resource to the resource they offer; "
                                "kernels that run on the CPU: scheduler.ray.device: cpu")
    if s.gpu_type:
        if s.gpu_type not in models:
            raise ClusterError(f"scheduler.ray.gpu_type {s.gpu_type}: no node has it (models: {', '.join(sorted(models))})")
        return {s.gpu_type: models[s.gpu_type]}
    if len(models) > 1 and not s.allow_mixed_gpus:
        raise ClusterError(f"the cluster has several GPU models ({', '.join(sorted(models))}): speedups from "
                           "different models cannot be ranked together",
                           hint="set scheduler.ray.gpu_type to one of them, or allow_mixed_gpus: true")
    return models


def _why_gpu(s: Any) -> str:
    if s.device == "gpu":
        return "scheduler.ray.device: gpu"
    if s.gpu_type:
        return f"scheduler.ray.gpu_type: {s.gpu_type}"
    if s.gpu_resource != "GPU":
        return f"scheduler.ray.gpu_resource: {s.gpu_resource}"
    return "the cluster offers GPUs"


def _offers_gpu(node: dict, s: Any) -> bool:
    res = node.get("Resources") or {}
    return bool(res.get(s.gpu_resource) or res.get("GPU"))


@dataclass
class Placement:
    """Where a run's time tasks go: ``device`` gpu (one ``gpu_resource`` each, on ``gpu_models``:
    model -> node ids) or cpu (all the CPUs of one node of ``cpu_nodes``: (node id, CPUs),
    pinned to it), and why."""
    device: str
    why: str
    gpu_models: dict[str, list[str]] = field(default_factory=dict)
    cpu_nodes: list[tuple[str, float]] = field(default_factory=list)

    def record(self) -> dict:
        """What cluster.json and the report say about it."""
        out: dict = {"device": self.device, "why": self.why}
        if self.device == "cpu":
            out["cpu_nodes"] = [{"node_id": n, "cpus": c} for n, c in self.cpu_nodes]
        return out


def timing_placement(nodes: list[dict], s: Any) -> Placement:
    """Where the time tasks of a run go (``scheduler.ray.device``), or a ClusterError when the
    cluster cannot run what is asked: GPU timing (device gpu; auto with gpu_type, a custom
    gpu_resource or any node offering one) needs a node with ``gpu_resource`` (and the GPU-model
    rules of check_gpu_models); CPU timing (device cpu; auto on a cluster without GPUs) needs a
    node with no GPU and at least ``num_cpus`` CPUs, and each time task holds all of one such node."""
    alive = [n for n in nodes if n.get("Alive", True)]
    models = cluster_gpu_models(alive, s.gpu_resource)
    device, why = s.device, f"scheduler.ray.device: {s.device}"
    if device == "auto":
        if models:
            device, why = "gpu", f"nodes offer {s.gpu_resource!r}: kernels are timed on GPUs, one whole GPU a task"
        elif s.gpu_type or s.gpu_resource != "GPU":
            device = "gpu"
        else:
            device, why = "cpu", ("no node of the cluster offers a GPU: kernels run on the CPU, as a local run on a "
                                  "machine without one, each time task holding all the CPUs of one node")
    if device == "gpu":
        return Placement("gpu", why, gpu_models=check_gpu_models(models, s))
    if s.gpu_type:
        raise ClusterError(f"scheduler.ray.device: cpu with gpu_type {s.gpu_type}: CPU timing uses no GPU",
                           hint="drop one of them")
    cpu_nodes = sorted(((n.get("NodeID"), float((n.get("Resources") or {}).get("CPU", 0.0))) for n in alive
                        if not _offers_gpu(n, s)), key=lambda nc: (-nc[1], str(nc[0])))
    usable = [(n, c) for n, c in cpu_nodes if c >= s.num_cpus]
    if not usable:
        raise ClusterError("no node of the cluster can time kernels on the CPU: " + (
            f"every node offers a GPU ({s.gpu_resource!r}), and CPU timing uses nodes without one"
            if not cpu_nodes else f"no node without a GPU has {s.num_cpus:g} CPU(s) (scheduler.ray.num_cpus)"),
            hint="add a node without GPUs, or time on the GPUs with scheduler.ray.device: auto or gpu")
    return Placement("cpu", why, cpu_nodes=usable)


def largest_node(nodes: list[dict], resource: str) -> float:
    """The most of ``resource`` any one alive node has (a task's resources come from one node)."""
    return max([(n.get("Resources") or {}).get(resource, 0.0) for n in nodes if n.get("Alive", True)] or [0.0])


class TaskBoard:
    """The tasks of a run: submit (optionally capped in flight), wait, cancel; every change is
    written to ``cluster.json`` in the run folder, so another process sees where things run."""

    def __init__(self, run_dir: Path, cluster: dict, settings: Any, events: Any) -> None:
        import ray
        self.ray, self.run_dir, self.settings, self.events = ray, run_dir, settings, events
        self.cluster = cluster
        self.flag = ray.remote(num_cpus=0)(CancelFlagImpl).remote()
        self.rows: dict[str, dict] = {}
        self.pending: dict[Any, str] = {}  # ref -> key
        self.cancel_sent: Optional[float] = None
        self.write()

    def write(self) -> None:
        atomic_write_json(self.run_dir / CLUSTER_FILE, {**self.cluster, "tasks": list(self.rows.values())})

    def submit(self, key: str, fn: Any, payload: dict, resources: dict, info: dict,
               node: Optional[str] = None) -> None:
        """Submit ``fn(payload)`` holding ``resources`` (a ``CPU`` key replaces ``num_cpus``), on
        ``node`` only when one is given."""
        opts: dict = {"num_cpus": resources.pop("CPU", self.settings.num_cpus), "max_retries": 0}
        cpus = {"CPU": opts["num_cpus"]} if opts["num_cpus"] != self.settings.num_cpus else {}
        gpu = self.settings.gpu_resource
        if gpu == "GPU" and resources.get("GPU") is not None:
            opts["num_gpus"] = resources.pop("GPU")
        opts["resources"] = resources
        if node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        ref = self.ray.remote(fn).options(name=f"magpie:{key}", **opts).remote({**payload, "flag": self.flag, "key": key})
        self.pending[ref] = key
        self.rows[key] = {"key": key, **info, "task_id": ref.task_id().hex(), "state": "submitted",
                          "resources": {**cpus, **resources,
                                        **({"GPU": opts["num_gpus"]} if "num_gpus" in opts else {})},
                          **({"pinned_node": node} if node is not None else {}),
                          "submitted": round(time.time(), 3)}
        self.events.emit("ray_task", key=key, state="submitted", task_id=self.rows[key]["task_id"], **info)
        self.write()

    def next_done(self) -> list[tuple[str, Any, Optional[BaseException]]]:
        """The tasks that finished since the last call: (key, result, error)."""
        if not self.pending:
            return []
        done, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=_WAIT_S)
        # After the wait: a task that has returned has flushed its events, so they are written before
        # its ray_task 'finished' event.
        self.drain_events()
        out = []
        for ref in done:
            key = self.pending.pop(ref)
            try:
                out.append((key, self.ray.get(ref), None))
            except BaseException as exc:  # a failed or cancelled task is that kernel's or point's failure
                if isinstance(exc, KeyboardInterrupt):
                    raise
                out.append((key, None, exc))
        return out

    def drain_events(self) -> int:
        """Write the stage events the tasks posted since the last call into the run's events.jsonl,
        as a local run writes them, with ``ray_task`` (the task's key) and ``task_ts`` (when the task
        emitted it). Returns how many were written."""
        try:
            posted = self.ray.get(self.flag.take.remote(), timeout=10)
        except Exception:  # the actor is unreachable for a moment: the events wait for the next poll
            return 0
        for key, record in posted:
            fields = {k: v for k, v in record.items() if k not in ("ts", "event", "schema_version")}
            self.events.emit("stage", **fields, ray_task=key, task_ts=record.get("ts"))
        return len(posted)

    def finish(self, key: str, result: Optional[dict], error: Optional[BaseException], folder: Optional[str]) -> None:
        row = self.rows[key]
        if error is not None:
            row["state"] = "cancelled" if type(error).__name__ == "TaskCancelledError" else "failed"
            row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
        elif result.get("skipped"):
            row["state"] = "cancelled"
            row["error"] = f"not started: {result.get('reason')}"
        else:
            row["state"] = "cancelled" if result.get("cancelled") else "finished"
        if result is not None:
            row["node"] = result.get("node")
            row["gpu"] = result.get("gpu")
        row["folder"] = folder
        row["finished"] = round(time.time(), 3)
        self.events.emit("ray_task", key=key, state=row["state"], task_id=row["task_id"],
                         node=(result or {}).get("node", {}).get("node_ip"), error=row.get("error"))
        self.write()

    def cancel(self, reason: str) -> None:
        """Tell running tasks to stop (they stop their children and return what they reached);
        cancel the ones not started; after the grace period, have Ray cancel what is left."""
        now = time.monotonic()
        if self.cancel_sent is None:
            self.cancel_sent = now
            self.ray.get(self.flag.set.remote(reason))
            started = set(self.ray.get(self.flag.started_keys.remote()))
            for ref, key in list(self.pending.items()):
                if key not in started:
                    self.ray.cancel(ref)
        elif now - self.cancel_sent > self.settings.cancel_grace_s:
            for ref in list(self.pending):
                self.ray.cancel(ref, force=now - self.cancel_sent > 2 * self.settings.cancel_grace_s)

    def take_files(self, result: dict, dest: Path) -> str:
        """The task's folder, in the run folder (unpacked from the object store unless written in place)."""
        if result.get("files") is not None:
            unpack(result.pop("files"), dest)
        return str(dest)


def upload_roots(specs: list[Any], put: Any) -> dict[str, Any]:
    """Each folder the kernels need, once, as an object-store ref: root -> ref."""
    refs: dict[str, Any] = {}
    for k in specs:
        for root in kernel_roots(k):
            if str(root) not in refs:
                refs[str(root)] = put(pack_dir(root))
    return refs


def _bundles_for(spec: Any, refs: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(str(r), refs[str(r)]) for r in kernel_roots(spec) if str(r) in refs]


# ---------------------------------------------------------------------- the evaluator
class RayEvaluator:
    """Evaluator's interface (``outcomes``, ``run()``, ``degenerate``, ``build_report``) on Ray."""

    def __init__(self, plan: Any, ws: Any, machine: Any, cancel: Any) -> None:
        self.plan, self.ws, self.machine, self.cancel = plan, ws, machine, cancel
        self.s = plan.settings
        self.settings = plan.scheduler
        self.outcomes = [KernelOutcome(spec=k) for k in plan.kernels]
        self.degenerate: Optional[str] = None
        self.local = Evaluator(plan, ws, machine, cancel)  # for the stage rules it shares (no work runs here)
        self.checks: dict[int, KernelOutcome] = {}
        self.timed: dict[int, dict] = {}  # kernel index -> the time task's result
        self.errors: dict[int, str] = {}
        self.execution: dict[int, dict] = {}
        self.board: Optional[TaskBoard] = None
        self.placement = Placement("gpu", "not yet placed")
        self._cpu_turn = 0
        self.not_run: Optional[dict] = None  # {cause, hint, error} when the cluster could run nothing

    # ------------------------------------------------------------------ payloads
    def _needs_check(self, k: Any) -> bool:
        return bool(k.compile) or self.s.correctness_backend == "accordo" or (
            bool(k.testcase) and self.s.correctness_backend != "harness")

    def _shared_root(self, name: str) -> Optional[str]:
        return str(self.ws.path("tasks", name)) if self.settings.shared_storage else None

    def _payload(self, kind: str, specs: list[Any], refs: dict, baseline_index: Optional[int]) -> dict:
        settings = copy.copy(self.s)
        settings.workers = 1  # one kernel or pair per task; the cluster is the parallelism
        bundles = [b for s in specs for b in _bundles_for(s, refs)]
        return {"kind": kind, "mode": self.plan.mode, "specs": [replace(s, index=i) for i, s in enumerate(specs)],
                "plan_indexes": [s.index for s in specs],
                "settings": settings, "baseline_index": baseline_index, "bundles": list(dict(bundles).items()),
                "shared_root": self._shared_root(f"{kind}_{specs[-1].id}")}

    def _check_resources(self) -> dict:
        s = self.settings
        if self.placement.device == "cpu":  # CPU kernels: their testcases need no GPU
            return {}
        share = s.check_gpus
        if share is None:  # real GPUs: Ray hides them from a task that holds none, and testcases need one
            share = 0.25 if s.gpu_resource == "GPU" else 0.0
        return {s.gpu_resource: share} if share else {}

    def _time_resources(self) -> tuple[dict, Optional[str]]:
        """What a time task holds, and the node it is pinned to (CPU timing: all of one node's CPUs,
        the nodes taken in turn)."""
        s = self.settings
        if self.placement.device == "cpu":
            node, cpus = self.placement.cpu_nodes[self._cpu_turn % len(self.placement.cpu_nodes)]
            self._cpu_turn += 1
            return {"CPU": cpus}, node
        res = {s.gpu_resource: 1}
        if s.gpu_type:
            res[f"accelerator_type:{s.gpu_type}"] = 0.001
        return res, None

    # ------------------------------------------------------------------ driver
    def _preflight(self) -> None:
        import ray
        self.placement = timing_placement(ray.nodes(), self.settings)
        self.gpu_models = {m: len(n) for m, n in self.placement.gpu_models.items()}

    def _not_run(self, exc: MagpieError) -> None:
        """The cluster cannot run what is asked (or cannot be reached): every kernel is not run,
        with the cause, a failure of the environment (never 'incorrect')."""
        cause = str(exc)
        self.not_run = {"cause": cause, "hint": exc.hint, "error": type(exc).__name__}
        for o in self.outcomes:
            o.environment.append(f"not run: {cause}")
            for stage in (o.compile, o.correctness, o.performance):
                stage.details["reason"] = "not run: the Ray cluster cannot run it"

    def run(self) -> list[KernelOutcome]:
        try:
            cluster = connect(self.settings)
            self._preflight()
        except MagpieError as exc:  # ClusterError, MissingExtra: nothing was submitted
            self._not_run(exc)
            raise
        import ray
        cluster["gpu_models"] = self.gpu_models
        cluster["timing"] = self.placement.record()
        self.s.seeds  # drawn once here, so every task checks on the same hidden inputs  # noqa: B018
        board = self.board = TaskBoard(self.ws.root, cluster, self.settings, self.ws.events)
        refs = {} if self.settings.shared_storage else upload_roots(self.plan.kernels, ray.put)
        order = [k for k in self.plan.kernels]
        b = self.plan.baseline_index
        if b is not None:
            order = [self.plan.kernels[b]] + [k for k in order if k.index != b]
        to_check = [k for k in order if self._needs_check(k)]
        base_ok: Optional[bool] = None if (b is not None and self._needs_check(self.plan.kernels[b])) else True
        waiting_time = [k for k in order if not (b is not None and k.index == b)]  # each needs a time task
        if b is None:
            waiting_time = list(order)
        checked_ok = {k.index for k in order if not self._needs_check(k)}
        total = len(to_check) + len(waiting_time)
        done = 0

        def submit_checks() -> None:
            in_flight = sum(1 for key in board.pending.values() if key.startswith("check_"))
            while to_check and in_flight < self.s.workers and not self.cancel.cancelled:
                k = to_check.pop(0)
                board.submit(f"check_{k.id}", kernel_task, self._payload("check", [k], refs, None),
                             self._check_resources(), {"kernel": k.id, "kind": "check"})
                in_flight += 1

        def submit_times() -> None:
            if base_ok is not True or self.cancel.cancelled:
                return
            for k in list(waiting_time):
                if k.index in checked_ok:
                    waiting_time.remove(k)
                    specs = [self.plan.kernels[b], k] if b is not None else [k]
                    resources, node = self._time_resources()
                    board.submit(f"time_{k.id}", kernel_task,
                                 self._payload("time", specs, refs, 0 if b is not None else None),
                                 resources, {"kernel": k.id, "kind": "time"}, node=node)

        submit_checks()
        submit_times()
        while board.pending:
            if self.cancel.cancelled:
                board.cancel(self.cancel.reason or "cancelled")
            for key, result, error in board.next_done():
                done += 1
                kind, kid = key.split("_", 1)
                k = next(x for x in self.plan.kernels if x.id == kid)
                folder = None
                if result is not None and not result.get("skipped"):
                    folder = board.take_files(result, self.ws.path("tasks", key))
                    result = self._relocate(result, folder)
                board.finish(key, result, error, folder)
                ok = self._take(kind, k, result, error)
                if kind == "check":
                    if ok:
                        checked_ok.add(k.index)
                    if b is not None and k.index == b:
                        base_ok = ok
                self.ws.events.emit("progress", phase="ray tasks", done=done, total=total)
            submit_checks()
            submit_times()
        self._assemble()
        return self.outcomes

    def _relocate(self, result: dict, folder: str) -> dict:
        """Paths the task wrote (its own folder) as they are in the run folder."""
        root = result.get("root")
        if root and root != folder:
            for o in result.get("outcomes") or []:
                for st in (o.compile, o.correctness, o.performance):
                    st.details = rewrite_paths(st.details, [(root, folder)])
        return result

    def _take(self, kind: str, k: Any, result: Optional[dict], error: Optional[BaseException]) -> bool:
        """Keep a task's outcome; True when a check passed (the kernel may be timed)."""
        if error is not None or result is None or result.get("skipped"):
            if error is not None and type(error).__name__ != "TaskCancelledError":
                self.errors[k.index] = f"Ray {kind} task failed: {type(error).__name__}: {str(error).strip()[-1500:]}"
            return False
        self.execution.setdefault(k.index, {})[kind] = {"node": result["node"], "gpu": result.get("gpu"),
                                                        "folder": self.board.rows[f"{kind}_{k.id}"]["folder"]}
        outs = result["outcomes"]
        if kind == "check":
            o = outs[0]
            self.checks[k.index] = o
            self._emit_stages(k, o, ("compile", "testcase"))
            return o.compile.state != FAILED and o.compile.state != CANCELLED and not o.correctness.errors \
                and not o.cancelled_stage
        self.timed[k.index] = result
        self.degenerate = self.degenerate or result.get("degenerate")
        self._emit_stages(k, outs[-1], ("correctness", "performance"))
        return True

    def _emit_stages(self, k: Any, o: KernelOutcome, stages: tuple) -> None:
        for stage in stages:
            if stage == "testcase":
                tc = o.correctness.details.get("testcase")
                if tc is None:
                    continue
                state = CANCELLED if tc.get("cancelled") else (SUCCESS if tc.get("passed") else FAILED)
            else:
                state = getattr(o, stage).state
            extra = {}
            if stage == "performance" and o.timing:
                extra = {"backend": str(o.performance.details.get("backend")), "median_ms": o.timing["median"]}
            self.ws.events.emit("stage", kernel=k.id, index=k.index, stage=stage, state=state, **extra)

    # ------------------------------------------------------------------ outcomes
    def _assemble(self) -> None:
        b = self.plan.baseline_index
        for i, k in enumerate(self.plan.kernels):
            timed = self.timed.get(k.index)
            if timed is not None:
                outs = timed["outcomes"]
                o = outs[-1]
            elif b is not None and k.index == b and self._first_pair() is not None:
                o = self._first_pair()["outcomes"][0]
            else:
                o = self._unfinished(k)
            self.outcomes[i] = replace(o, spec=k)

    def _first_pair(self) -> Optional[dict]:
        for k in self.plan.kernels:
            if k.index in self.timed:
                return self.timed[k.index]
        return None

    def _unfinished(self, k: Any) -> KernelOutcome:
        """A kernel with no finished time task: its check, failed or cancelled, as the local
        Evaluator would finish it."""
        o = self.checks.get(k.index) or KernelOutcome(spec=k)
        o = replace(o, spec=k)
        err = self.errors.get(k.index)
        if o.compile.state == FAILED:
            o.correctness = StageResult(SKIPPED, details={"reason": "compile failed"})
            o.performance = StageResult(SKIPPED, details={"reason": "compile failed"})
            return o
        if err is not None:
            o.correctness.state = FAILED
            o.correctness.errors.append(err)
            o.performance = StageResult(SKIPPED, details={"reason": "not measured: its Ray task failed"})
            return o
        if self.cancel.cancelled:
            for stage in (o.compile, o.correctness, o.performance):
                if stage.state == SKIPPED and not stage.details.get("reason"):
                    stage.details["reason"] = f"not reached: run {self.cancel.reason}"
            if o.cancelled_stage == "correctness" or (o.correctness.state == SKIPPED and "testcase" in
                                                      o.correctness.details and o.correctness.details["testcase"]
                                                      .get("cancelled")):
                o.correctness.state = CANCELLED
            return o
        if o.correctness.errors or self.local._checks_finished(o):
            self.local.finish_correctness(o)
        b = self.plan.baseline_index
        if not o.correct:
            o.performance = StageResult(SKIPPED, details={"reason": "not measured: the kernel failed correctness"})
        elif b is not None and k.index != b:
            o.performance = StageResult(SKIPPED, details={"reason": "not measured: the baseline failed its checks"})
        return o

    # ------------------------------------------------------------------ report
    def build_report(self, plan: Any, outcomes: list, state: str, ws_dir: str, gpu: Optional[dict],
                     degenerate: Optional[str] = None) -> tuple[dict, list]:
        from engine.kernels import report as kr
        if plan.mode == "compare":
            report, rend = self._compare_report(plan, outcomes, state, ws_dir, gpu, degenerate)
            rows = report["results"]["kernel_results"]
        else:
            report, rend = kr.build_analyze_report(plan, outcomes, state, ws_dir, gpu, degenerate=degenerate)
            rows = report["results"]
        for o, row in zip(outcomes, rows):
            ex = self.execution.get(o.spec.index, {})
            last = ex.get("time") or ex.get("check") or {}
            row["execution"] = {"environment": "ray", **ex, "gpu_model": (last.get("gpu") or {}).get("model")}
        if self.board is not None:
            report["cluster"] = {**self.board.cluster, "file": CLUSTER_FILE,
                                 "tasks": {s: sum(1 for r in self.board.rows.values() if r["state"] == s)
                                           for s in ("finished", "failed", "cancelled")}}
        if self.not_run is not None:
            rend = self._not_run_report(plan, outcomes, report, rows)
        return report, rend

    def _not_run_report(self, plan: Any, outcomes: list, report: dict, rows: list) -> list:
        """The report of a run the cluster could not run: the cause first, each kernel ``not run``."""
        cause, hint = self.not_run["cause"], self.not_run.get("hint")
        report["not_run"] = dict(self.not_run)
        for row in rows:
            row["verdict"] = "not run"
        if plan.mode == "compare":
            report["winner_id"], report["results"]["winner"], report["results"]["rankings"] = None, None, []
            report["winner_reason"] = f"not run: {cause}"
            report["results"]["summary"] = f"Not run: {cause}\nWinner: none (not run)"
        b = plan.baseline_index if plan.mode == "compare" else None
        names = ", ".join(o.spec.id + (" (baseline)" if o.spec.index == b else "") for o in outcomes)
        return ([f"not run: {cause}"] + ([f"hint: {hint}"] if hint else []) +
                [f"kernels not run: {names} (none was judged: a failure of the environment, not of the kernels)"] +
                (["Winner: none — nothing was run"] if plan.mode == "compare" else []))

    def same_gpu_pairs(self, plan: Any) -> tuple[dict[int, tuple[KernelOutcome, KernelOutcome]], dict[int, str]]:
        """Each timed candidate's pair (the baseline timed beside it, the candidate), and the GPU
        model that timed it, by kernel index."""
        pairs: dict[int, tuple[KernelOutcome, KernelOutcome]] = {}
        models: dict[int, str] = {}
        for i, t in sorted(self.timed.items()):
            outs = t.get("outcomes") or []
            if i == plan.baseline_index or len(outs) != 2:
                continue
            pairs[i] = (outs[0], outs[1])
            models[i] = (t.get("gpu") or {}).get("model", "unknown")
        return pairs, models

    def _compare_report(self, plan: Any, outcomes: list, state: str, ws_dir: str, gpu: Optional[dict],
                        degenerate: Optional[str]) -> tuple[dict, list]:
        """The local compare report (engine.kernels.report decides every verdict and the winner),
        each candidate's speedup taken from its own task: against the baseline timed beside it, on
        its GPU; candidates timed on several GPU models are not ranked unless allowed."""
        from engine.kernels import report as kr
        pairs, models = self.same_gpu_pairs(plan)
        mixed = sorted(set(models.values()))
        unranked = None
        if len(mixed) > 1 and not self.settings.allow_mixed_gpus:
            unranked = (f"candidates were timed on different GPU models ({', '.join(mixed)}); "
                        "not ranked (set scheduler.ray.allow_mixed_gpus: true to rank them)")
        report, rend = kr.build_compare_report(plan, outcomes, state, ws_dir, gpu, degenerate=degenerate,
                                               pairs=pairs, unranked=unranked,
                                               kernel_notes={i: f"gpu {m}" for i, m in models.items()})
        ids = {o.spec.index: o.spec.id for o in outcomes}
        report["same_gpu"] = {"gpu_models": mixed, "baseline_runs": [
            {"with": ids.get(i), "node": (self.timed[i].get("node") or {}).get("node_ip"), "gpu_model": models[i],
             "median_ms": base_i.timing["median"] if base_i.timing else None, "correct": base_i.correct}
            for i, (base_i, _) in pairs.items()]}
        for o, row in zip(outcomes, report["results"]["kernel_results"]):
            row["gpu_model"] = models.get(o.spec.index)
        report["results"]["comparison_metrics"]["perf_score_definition"] = (
            "speedup vs the baseline timed beside the candidate on the same "
            + ("CPU node" if self.placement.device == "cpu" else "GPU") + " (higher is better)")
        return report, rend


__all__ = ["ClusterError", "RayEvaluator", "TaskBoard", "benchmark_point_task", "connect", "upload_roots"]

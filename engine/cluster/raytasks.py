"""What runs on a Ray worker, and what carries files between the driver and the workers.

A task gets plain data (kernel specs, run settings, a benchmark request), the folders it needs
as tarballs in the object store (unless every node shares the storage), and the handle of the
run's ``CancelFlag`` actor. It runs the same local code a run on this machine runs (the
Evaluator's stages, a benchmark mode) in a folder of its own, and returns its results and that
folder (again through the object store). A cancel reaches a running task through the flag: the
task's own CancelToken is set, its child processes are stopped by their process group, and its
report still says what was reached; a task not yet started returns at once.

The same actor carries the task's ``stage`` events (compile, testcase, correctness, performance;
a benchmark point's server and load stages) to the driver while the task runs: each event is
posted as the task's Evaluator emits it, and the driver writes it into the run's
``events.jsonl`` (with ``ray_task`` naming the task) on its next poll, as a local run would.

A task never waits for Ray on its main thread (``_off_main``): Ray lends the CPUs of a task
blocked there to other tasks, and a CPU timing holds all of its node's CPUs so that nothing
runs beside it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Optional

from engine.errors import MagpieError

MAX_UPLOAD_BYTES = 512 * 1024 * 1024
_SKIP_DIRS = {".git", "__pycache__", ".venv", "node_modules"}
_FLAG_POLL_S = 0.3


class ClusterError(MagpieError):
    title = "cluster"


# ---------------------------------------------------------------------- files through the object store
def pack_dir(root: Path, limit: int = MAX_UPLOAD_BYTES) -> bytes:
    """A gzipped tarball of ``root`` (without .git, caches and virtual environments)."""
    buf = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
        return None if _SKIP_DIRS & set(Path(info.name).parts) else info

    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(str(root), arcname=".", filter=keep)
    data = buf.getvalue()
    if len(data) > limit:
        raise ClusterError(f"{root}: {len(data) / 2**20:.0f} MiB packed, over the {limit / 2**20:.0f} MiB upload limit",
                           hint="put large inputs on storage every node sees and set scheduler.ray.shared_storage: true")
    return data


def unpack(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            tar.extractall(str(dest), filter="data")
        except TypeError:  # Python < 3.12 without extraction filters; our own tarballs only
            tar.extractall(str(dest))  # noqa: S202


def rewrite_paths(obj: Any, pairs: list[tuple[str, str]]) -> Any:
    """``obj`` with every string that starts with an old prefix moved to the new one (longest first)."""
    if isinstance(obj, str):
        for old, new in pairs:
            if obj == old or obj.startswith(old + os.sep):
                return new + obj[len(old):]
            if old in obj:  # a command line that names the folder
                obj = obj.replace(old, new)
        return obj
    if isinstance(obj, Path):
        return Path(rewrite_paths(str(obj), pairs))
    if isinstance(obj, list):
        return [rewrite_paths(v, pairs) for v in obj]
    if isinstance(obj, tuple):
        return tuple(rewrite_paths(v, pairs) for v in obj)
    if isinstance(obj, dict):
        return {k: rewrite_paths(v, pairs) for k, v in obj.items()}
    return obj


def kernel_roots(spec: Any) -> list[Path]:
    """The folders a kernel needs on a worker: its working dir, and the folder of any source or
    reference file outside it."""
    roots = [Path(spec.working_dir)]
    extra = [spec.reference_file, getattr(spec, "harness_module", None)]
    for f in list(spec.source_files) + [x for x in extra if x]:
        f = Path(f)
        if not any(f == r or r in f.parents for r in roots):
            roots.append(f.parent)
    for d in getattr(spec, "pythonpath", []):  # latency.pythonpath folders
        d = Path(d)
        if d.is_dir() and not any(d == r or r in d.parents for r in roots):
            roots.append(d)
    return roots


def remap_spec(spec: Any, pairs: list[tuple[str, str]]) -> Any:
    return replace(spec, working_dir=rewrite_paths(spec.working_dir, pairs),
                   source_files=[rewrite_paths(p, pairs) for p in spec.source_files],
                   reference_file=rewrite_paths(spec.reference_file, pairs) if spec.reference_file else None,
                   harness_module=rewrite_paths(spec.harness_module, pairs) if spec.harness_module else None,
                   pythonpath=[rewrite_paths(p, pairs) for p in spec.pythonpath],
                   env=rewrite_paths(dict(spec.env), pairs), compile=rewrite_paths(list(spec.compile), pairs),
                   testcase=rewrite_paths(list(spec.testcase), pairs), prof=rewrite_paths(list(spec.prof), pairs))


def _sorted_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted(pairs, key=lambda p: -len(p[0]))


# ---------------------------------------------------------------------- where a task ran
def node_info() -> dict:
    import ray
    ctx = ray.get_runtime_context()
    ids = {}
    try:
        ids = {k: list(v) for k, v in ctx.get_accelerator_ids().items() if v}
    except Exception:  # older Ray: no accelerator ids
        pass
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "host": socket.gethostname(),
            "pid": os.getpid(), "accelerator_ids": ids}


def node_accelerator(nodes: list[dict], node_id: str) -> Optional[str]:
    """The ``accelerator_type:<model>`` resource Ray gives a GPU node (None on a CPU node)."""
    for n in nodes:
        if n.get("NodeID") == node_id:
            for key in (n.get("Resources") or {}):
                if key.startswith("accelerator_type:"):
                    return key.split(":", 1)[1]
    return None


def gpu_model_here(gpu: Any) -> tuple[str, str]:
    """(model, how it was known) for the node this task runs on."""
    import ray
    try:
        model = node_accelerator(ray.nodes(), ray.get_runtime_context().get_node_id())
    except Exception:
        model = None
    if model:
        return model, "ray accelerator_type"
    if gpu is not None:
        return gpu.name, "detected"
    return "none (CPU)", "no GPU detected"


def cluster_gpu_models(nodes: list[dict], gpu_resource: str) -> dict[str, list[str]]:
    """GPU model -> ids of the alive nodes that offer ``gpu_resource``; a node without an
    accelerator_type resource counts as model 'unknown'."""
    out: dict[str, list[str]] = {}
    for n in nodes:
        if not n.get("Alive", True) or not (n.get("Resources") or {}).get(gpu_resource):
            continue
        model = node_accelerator([n], n.get("NodeID")) or "unknown"
        out.setdefault(model, []).append(n.get("NodeID"))
    return out


def _off_main(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a helper thread, waited for. A task whose main thread blocks in ``ray.get``
    lends its CPUs back to Ray until it returns (Ray does so against deadlocks), so another task
    could start beside a CPU timing that holds all of a node's CPUs; a helper thread's wait keeps
    them held. Only for waits that cannot deadlock (the run's actor, objects already put)."""
    box: dict = {}

    def call() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised on the task's own thread
            box["error"] = exc
    t = threading.Thread(target=call, daemon=True, name="magpie-ray-wait")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


# ---------------------------------------------------------------------- the cancel flag
class CancelFlagImpl:
    """One per run: the driver sets it; tasks poll it and say when they started, and post their
    stage events, which the driver takes on each poll."""

    def __init__(self) -> None:
        self.flag, self.reason, self.started = False, "", set()
        self.events: list[tuple[str, dict]] = []

    def post(self, key: str, records: list[dict]) -> int:
        self.events.extend((key, r) for r in records)
        return len(self.events)

    def take(self) -> list[tuple[str, dict]]:
        out, self.events = self.events, []
        return out

    def set(self, reason: str) -> None:
        self.flag, self.reason = True, reason

    def state(self) -> tuple[bool, str]:
        return self.flag, self.reason

    def start(self, key: str) -> tuple[bool, str]:
        self.started.add(key)
        return self.flag, self.reason

    def started_keys(self) -> list[str]:
        return sorted(self.started)


class _Watch:
    """Sets ``token`` when the run's flag is set; stops with the task."""

    def __init__(self, flag: Any, token: Any) -> None:
        import ray
        self._stop = threading.Event()

        def poll() -> None:
            while not self._stop.wait(_FLAG_POLL_S):
                try:
                    is_set, reason = ray.get(flag.state.remote(), timeout=10)
                except Exception:  # the driver is gone: Ray ends this task with it
                    continue
                if is_set:
                    token.cancel(reason or "cancelled by the driver")
                    return
        self._thread = threading.Thread(target=poll, daemon=True, name="magpie-cancel-watch")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


class _StageForwarder:
    """A listener of the task's event log: each ``stage`` event goes to the run's actor at once
    (a call that does not wait), its kernel index moved back to the run's own and its paths
    back to the driver's; ``flush`` waits until the actor holds every one of them. Calls from
    one caller to one actor run in the order they were made, so one waited call is enough."""

    def __init__(self, payload: dict, back: list[tuple[str, str]]) -> None:
        self.flag, self.key, self.back = payload["flag"], payload["key"], back
        self.plan_indexes = payload.get("plan_indexes")
        self.sent = 0

    def __call__(self, record: dict) -> None:
        if record.get("event") != "stage":
            return
        record = rewrite_paths(dict(record), self.back)
        idx = record.get("index")
        if self.plan_indexes is not None and isinstance(idx, int) and 0 <= idx < len(self.plan_indexes):
            record["index"] = self.plan_indexes[idx]
        try:
            self.flag.post.remote(self.key, [record])
            self.sent += 1
        except Exception:  # the driver is gone: Ray ends this task with it
            pass

    def flush(self) -> None:
        import ray
        if self.sent:
            try:
                _off_main(ray.get, self.flag.post.remote(self.key, []), timeout=10)
            except Exception:
                pass


def _start(payload: dict) -> tuple[Any, dict, Optional[dict]]:
    """A task's cancel token, the node it runs on, and the reply to give at once when the run was
    cancelled before the task started (None otherwise)."""
    import ray

    from engine.runs.process import CancelToken
    is_set, reason = _off_main(ray.get, payload["flag"].start.remote(payload["key"]))
    info = node_info()
    return CancelToken(), info, ({"skipped": True, "reason": reason, "node": info} if is_set else None)


@contextlib.contextmanager
def _task_folder(payload: dict, token: Any) -> Iterator[tuple[Path, list[tuple[str, str]]]]:
    """A scratch folder holding the run's sources (pairs: the driver's path -> this node's), with
    the run's cancel flag watched meanwhile, and every process group the task starts known to the
    watchdog (a worker killed outright leaves none behind); removed when the task ends."""
    from engine.runs.process import child_groups_watched
    watch = _Watch(payload["flag"], token)
    tmp = Path(tempfile.mkdtemp(prefix="magpie-ray-"))
    try:
        with child_groups_watched():
            yield tmp, _materialize(payload["bundles"], tmp)
    finally:
        watch.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _result_root(payload: dict, tmp: Path, name: str) -> Path:
    return Path(payload["shared_root"]) if payload.get("shared_root") else tmp / name


def _files(payload: dict, root: Path) -> Any:
    """The task's folder for the driver: None with shared storage, else packed for the object store."""
    return None if payload.get("shared_root") else pack_dir(root)


def _materialize(bundles: list[tuple[str, Any]], tmp: Path) -> list[tuple[str, str]]:
    import ray
    pairs = []
    for i, (root, ref) in enumerate(bundles):
        dest = tmp / f"src{i}"
        unpack(_off_main(ray.get, ref), dest)
        pairs.append((root, str(dest)))
    return _sorted_pairs(pairs)


_DETECTED: dict = {}


def detect_once() -> Any:
    """The GPU of this worker process (probed once: a worker runs many tasks on the same node)."""
    if "gpu" not in _DETECTED:
        from engine.hw.detect import detect_gpu
        _DETECTED["gpu"] = detect_gpu()
    return _DETECTED["gpu"]


# ---------------------------------------------------------------------- kernel tasks
def kernel_task(payload: dict) -> dict:
    """``kind`` check: compile and testcase of one kernel. ``kind`` time: the local Evaluator
    on a small plan (the baseline and one candidate, or one analyze kernel) on the GPU the
    task holds, so the candidate is checked against, and timed beside, the baseline there."""

    from engine.kernels.pipeline import CANCELLED, FAILED, Evaluator, Machine
    from engine.kernels.plan import Plan
    from engine.runs.workspace import Workspace

    token, info, skipped = _start(payload)
    if skipped is not None:
        return skipped
    with _task_folder(payload, token) as (tmp, pairs):
        specs = [remap_spec(s, pairs) for s in payload["specs"]]
        root = _result_root(payload, tmp, "run")
        ws = Workspace(root)
        back = _sorted_pairs([(new, old) for old, new in pairs])
        forward = _StageForwarder(payload, back)
        ws.events.listeners.append(forward)
        gpu = detect_once()
        model, model_source = gpu_model_here(gpu)
        plan = Plan(mode=payload["mode"], kernels=specs, settings=payload["settings"],
                    baseline_index=payload.get("baseline_index"), environment="local")
        ev = Evaluator(plan, ws, Machine.from_gpu_info(gpu), token)
        ev.degenerate = None
        try:
            if payload["kind"] == "check":
                for o in ev.outcomes:
                    ev.compile(o)
                    if o.compile.state not in (FAILED, CANCELLED) and not token.cancelled:
                        ev.testcase(o)
            else:
                ev.run()
        finally:
            ws.events.close()
            forward.flush()
        outcomes = []
        for o in ev.outcomes:
            o.compile.details = rewrite_paths(o.compile.details, back)
            o.correctness.details = rewrite_paths(o.correctness.details, back)
            o.performance.details = rewrite_paths(o.performance.details, back)
            outcomes.append(o)
        return {"outcomes": outcomes, "degenerate": ev.degenerate, "node": info,
                "gpu": {"model": model, "source": model_source, "detected": gpu.to_dict() if gpu else None},
                "root": str(root), "cancelled": token.cancelled, "cancel_reason": token.reason,
                "files": _files(payload, root)}


# ---------------------------------------------------------------------- benchmark points
def benchmark_point_task(payload: dict) -> dict:
    """One point of a batch: the benchmark mode (``payload["run"]``, the driver's ``run_benchmark``),
    as on this machine, in a folder of its own."""

    from engine.runs.workspace import Workspace

    token, info, skipped = _start(payload)
    if skipped is not None:
        return skipped
    with _task_folder(payload, token) as (tmp, pairs):
        request = payload["request"]
        if pairs:
            data = request.model_dump()
            request = type(request).model_validate(rewrite_paths(data, pairs))
        root = _result_root(payload, tmp, "point")
        root.mkdir(parents=True, exist_ok=True)
        ws = Workspace(root)
        forward = _StageForwarder(payload, _sorted_pairs([(new, old) for old, new in pairs]))
        ws.events.listeners.append(forward)
        try:
            outcome = payload["run"](request, cancel=token, workspace=ws)
        finally:
            forward.flush()
        return {"state": outcome.state, "exit_code": outcome.exit_code, "report": outcome.report, "node": info,
                "root": str(root), "cancelled": token.cancelled, "files": _files(payload, root)}

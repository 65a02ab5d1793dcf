"""analyze / compare inside a container image (``-e container --docker-image IMAGE``), through
the docker SDK.

The driver (here) keeps the run's life cycle; the container runs the same Evaluator (the
same harness, timing backends and statistics) on the plan, with the run folder, the kernels'
folders and this tool mounted at the paths they have here, so every path in the plan and the
report stays true. The GPUs reach it as an NVIDIA device request, or as AMD's /dev/kfd and
/dev/dri with the video group. Its console is streamed to ``logs/container.log``; its stage
events are forwarded into the run's events as they happen; it is removed at the end, also on
a cancel or a crash, and the report records the image id and digests it ran.

    python -m engine.cluster.container PAYLOAD   # what runs inside (the payload file is in the run folder)
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from engine.cluster.raytasks import ClusterError, kernel_roots
from engine.kernels.pipeline import FAILED, KernelOutcome, StageResult

ENGINE_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.2
_STOP_TIMEOUT_S = 15


def container_kwargs(plan: Any, run_dir: Path, payload: Path, vendor: Optional[str]) -> dict:
    """The arguments of ``containers.create``: image, command, mounts, environment, GPUs."""
    s = plan.scheduler
    volumes = {str(run_dir): {"bind": str(run_dir), "mode": "rw"},
               str(ENGINE_ROOT / "engine"): {"bind": str(ENGINE_ROOT / "engine"), "mode": "ro"}}
    for k in plan.kernels:
        for root in kernel_roots(k):  # compile writes its outputs next to the sources
            volumes.setdefault(str(root), {"bind": str(root), "mode": "rw"})
    for host, inside in s.volumes.items():
        volumes[str(Path(host).expanduser().resolve())] = {"bind": inside, "mode": "rw"}
    env = {"PYTHONPATH": str(ENGINE_ROOT), "PYTHONUNBUFFERED": "1", "HOME": "/tmp", **s.env}
    kw: dict[str, Any] = {
        "image": s.image, "command": [s.python, "-m", "engine.cluster.container", str(payload)],
        "working_dir": str(run_dir), "environment": env, "volumes": volumes, "detach": True,
        "ipc_mode": "host", "shm_size": s.shm_size, "user": f"{os.getuid()}:{os.getgid()}",
        "labels": {"magpie.workspace": str(run_dir)}, "name": f"magpie-kernels-{run_dir.name}"[:128],
    }
    gpus = vendor if s.gpus == "auto" else s.gpus
    if gpus == "nvidia":
        from docker.types import DeviceRequest
        kw["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    elif gpus == "amd":
        kw["devices"] = ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
        kw["group_add"] = ["video"]
        kw["security_opt"] = ["seccomp=unconfined"]
    return kw


class ContainerEvaluator:
    """Evaluator's interface (``outcomes``, ``run()``, ``degenerate``, ``build_report``) in a container."""

    def __init__(self, plan: Any, ws: Any, machine: Any, cancel: Any) -> None:
        self.plan, self.ws, self.machine, self.cancel = plan, ws, machine, cancel
        self.outcomes = [KernelOutcome(spec=k) for k in plan.kernels]
        self.degenerate: Optional[str] = None
        self.info: dict = {"image": plan.scheduler.image}

    def _client(self) -> Any:
        try:
            import docker
        except ImportError:
            raise ClusterError("-e container needs the docker SDK", hint="pip install docker") from None
        s = self.plan.scheduler
        try:
            client = docker.DockerClient(base_url=s.docker_host) if s.docker_host else docker.from_env()
            client.ping()
        except Exception as exc:
            where = s.docker_host or os.environ.get("DOCKER_HOST") or "local socket"
            raise ClusterError(f"cannot reach the Docker engine ({where}): {exc}",
                               hint="start Docker, or set scheduler.container.docker_host / $DOCKER_HOST") from None
        return client

    def _image(self, client: Any) -> None:
        import docker
        s = self.plan.scheduler
        try:
            if s.pull:
                client.images.pull(s.image)
            img = client.images.get(s.image)
        except docker.errors.ImageNotFound:
            raise ClusterError(f"image {s.image} is not on this machine",
                               hint="docker pull it, or set scheduler.container.pull: true") from None
        self.info.update(image_id=img.id, repo_digests=list(img.attrs.get("RepoDigests") or []))

    def run(self) -> list[KernelOutcome]:
        client = self._client()
        self._image(client)
        box = self.ws.path("container")
        box.mkdir(exist_ok=True)
        self.plan.settings.seeds  # drawn here, so the report can name them  # noqa: B018
        payload = box / "payload.pkl"
        payload.write_bytes(pickle.dumps({"plan": replace(self.plan, environment="local", scheduler=None)}, protocol=4))
        vendor = self.machine.vendor
        kw = container_kwargs(self.plan, self.ws.root, payload, vendor)
        self.info["gpus"] = "nvidia device request" if "device_requests" in kw else (
            "/dev/kfd + /dev/dri" if "devices" in kw else "none")
        container = None
        logger = None
        try:
            container = client.containers.create(**{k: v for k, v in kw.items() if k != "detach"})
            self.info["container_id"] = container.id
            self.ws.events.emit("stage", stage="container", state="running", image=self.plan.scheduler.image)
            container.start()
            logger = threading.Thread(target=self._stream_logs, args=(container,), daemon=True)
            logger.start()
            self._wait(container, box / "events.jsonl")
        finally:
            self._remove(client, container, kw["name"])
            if logger is not None:
                logger.join(5)
        self._take(box / "outcomes.pkl")
        return self.outcomes

    def _remove(self, client: Any, container: Any, name: str) -> None:
        """Remove the container whatever happened (by name when creating it failed half-way)."""
        import docker
        try:
            if container is not None:
                container.remove(force=True)
            else:
                client.api.remove_container(name, force=True)
            self.info["removed"] = True
        except docker.errors.NotFound:
            self.info["removed"] = container is None  # never created: nothing left behind
        except Exception as exc:  # reported, never hidden
            self.info["removed"] = False
            self.info["remove_error"] = str(exc)

    def _stream_logs(self, container: Any) -> None:
        with open(self.ws.logs_dir / "container.log", "ab") as out:
            try:
                for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    out.write(chunk)
                    out.flush()
            except Exception as exc:  # the container went away while streaming
                out.write(f"\n[log stream ended: {exc}]\n".encode())

    def _wait(self, container: Any, events: Path) -> None:
        offset, stop_sent = 0, None
        while True:
            offset = self._forward(events, offset)
            container.reload()
            if container.status in ("exited", "dead"):
                break
            if self.cancel.cancelled and stop_sent is None:
                stop_sent = time.monotonic()  # SIGTERM: the run inside cancels and writes what it reached
                container.stop(timeout=_STOP_TIMEOUT_S)
            time.sleep(_POLL_S)
        self._forward(events, offset)
        try:
            self.info["exit_code"] = container.wait(timeout=30).get("StatusCode")
        except Exception:
            self.info["exit_code"] = (container.attrs.get("State") or {}).get("ExitCode")

    def _forward(self, events: Path, offset: int) -> int:
        """The container's stage events, into the run's events (as they happen)."""
        try:
            with open(events, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return offset
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "stage":
                fields = {k: v for k, v in ev.items() if k not in ("ts", "event")}
                self.ws.events.emit("stage", **fields)
        return offset + end

    def _take(self, path: Path) -> None:
        try:
            result = pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError) as exc:
            why = (f"the container exited with code {self.info.get('exit_code')} and wrote no results ({exc}); "
                   "see logs/container.log")
            for i, k in enumerate(self.plan.kernels):
                self.outcomes[i] = KernelOutcome(spec=k, correctness=StageResult(FAILED, [why]))
            return
        self.degenerate = result.get("degenerate")
        self.info["inside"] = result.get("machine")
        for i, (k, o) in enumerate(zip(self.plan.kernels, result["outcomes"])):
            self.outcomes[i] = replace(o, spec=k)

    def build_report(self, plan: Any, outcomes: list, state: str, ws_dir: str, gpu: Optional[dict],
                     degenerate: Optional[str] = None) -> tuple[dict, list]:
        from engine.kernels import report as kr
        build = kr.build_compare_report if plan.mode == "compare" else kr.build_analyze_report
        report, rend = build(plan, outcomes, state, ws_dir, gpu, degenerate=degenerate)
        report["container"] = dict(self.info)
        rows = report["results"]["kernel_results"] if plan.mode == "compare" else report["results"]
        for row in rows:
            row["execution"] = {"environment": "container", "image": self.info.get("image"),
                                "image_id": self.info.get("image_id")}
        rend.insert(-1, f"container: {self.info.get('image')} ({self.info.get('image_id') or 'no image id'}), "
                        f"GPUs: {self.info.get('gpus')}, removed: {self.info.get('removed')}")
        return report, rend


def main(argv: Optional[list[str]] = None) -> int:
    """Inside the container: the plan's Evaluator, into the run folder's ``container/``."""
    from engine.hw.detect import detect_gpu
    from engine.kernels.pipeline import Evaluator, Machine
    from engine.runs.process import CancelToken, install_signal_handlers
    from engine.runs.workspace import Workspace
    args = list(sys.argv[1:] if argv is None else argv)
    payload = Path(args[0])
    plan = pickle.loads(payload.read_bytes())["plan"]
    cancel = CancelToken()
    install_signal_handlers(cancel)
    box = Workspace(payload.parent)
    gpu = detect_gpu()
    ev = Evaluator(plan, box, Machine.from_gpu_info(gpu), cancel)
    ev.degenerate = None
    try:
        ev.run()
    finally:
        box.events.close()
        result = {"outcomes": ev.outcomes, "degenerate": ev.degenerate, "cancelled": cancel.cancelled,
                  "machine": {"gpu": gpu.to_dict() if gpu else None, "python": sys.version.split()[0]}}
        tmp = payload.parent / ".outcomes.pkl.tmp"
        tmp.write_bytes(pickle.dumps(result, protocol=4))
        os.replace(tmp, payload.parent / "outcomes.pkl")
        print(f"magpie container: {len(ev.outcomes)} kernel(s) evaluated{' (cancelled)' if cancel.cancelled else ''}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

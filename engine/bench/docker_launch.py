"""Docker launcher (``--run-mode docker``), through the docker SDK: the server runs in a container
made from a framework x GPU-arch image table, with the GPUs requested the way each vendor needs
(NVIDIA: a device request; AMD: /dev/kfd, /dev/dri and the video group), the HF cache and the
workspace mounted, the environment passed, logs copied to ``server.log``, and the container
removed afterwards.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from engine.bench.launch import LaunchError, ServerCommand, wait_ready
from engine.config.benchmark import BenchmarkConfig

# framework -> arch family -> image (magpie-reference §5.5); the config's docker_image wins.
IMAGES = {
    "vllm": {"amd": "vllm/vllm-openai-rocm:v0.19.1", "nvidia": "vllm/vllm-openai:v0.19.1"},
    "sglang": {"gfx942": "lmsysorg/sglang:v0.5.12-rocm720-mi30x", "gfx950": "lmsysorg/sglang:v0.5.12-rocm720-mi35x",
               "nvidia": "lmsysorg/sglang:v0.5.8-cu130-amd64-runtime"},
    "atom": {"amd": "rocm/atom:latest"},
}
CONTAINER_PORT = 8000


def image_for(cfg: BenchmarkConfig, arch: Optional[str]) -> str:
    if cfg.docker_image:
        return cfg.docker_image
    table = IMAGES.get(cfg.framework)
    if table is None:
        raise LaunchError(f"framework {cfg.framework} has no image: set benchmark.docker_image")
    vendor = "amd" if (arch or "").startswith("gfx") else "nvidia" if (arch or "").startswith("sm_") else None
    for key in (arch, vendor):
        if key and key in table:
            return table[key]
    raise LaunchError(f"no {cfg.framework} image for GPU arch {arch or 'unknown'} (known: {', '.join(table)}); "
                      "set benchmark.docker_image or --docker-image")


def container_spec(cfg: BenchmarkConfig, command: ServerCommand, *, arch: Optional[str], workspace: Path,
                   host_port: int, gpus: Optional[list[str]] = None) -> dict[str, Any]:
    """The keyword arguments for ``containers.run``: image, command, env, mounts, GPUs, ports."""
    from docker.types import DeviceRequest
    hf_cache = Path(cfg.hf_cache_path or Path.home() / ".cache" / "huggingface").expanduser()
    volumes = {str(hf_cache): {"bind": "/root/.cache/huggingface", "mode": "rw"},
               str(workspace): {"bind": str(workspace), "mode": "rw"}}  # same path: traces land in place
    if Path(cfg.model).is_dir():  # a local model directory is mounted at the same path
        volumes[str(Path(cfg.model).resolve())] = {"bind": str(Path(cfg.model).resolve()), "mode": "ro"}
    env = dict(command.env)  # the envs Magpie exports, server_env, the profiler's (server_command)
    spec: dict[str, Any] = {
        "image": image_for(cfg, arch), "command": command.argv, "environment": env, "volumes": volumes,
        "ports": {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", host_port)}, "detach": True, "ipc_mode": "host",
        "shm_size": "16g", "labels": {"magpie.workspace": str(workspace)},
        "name": f"magpie-{cfg.framework}-{workspace.name}"[:128],
    }
    if (arch or "").startswith("gfx"):
        spec["devices"] = ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
        spec["group_add"] = ["video"]
        spec["security_opt"] = ["seccomp=unconfined"]
        if gpus:
            env["HIP_VISIBLE_DEVICES"] = ",".join(gpus)
    else:
        spec["device_requests"] = [DeviceRequest(device_ids=gpus, capabilities=[["gpu"]]) if gpus
                                   else DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return spec


class DockerServer:
    """A server container; the ``launch.Server`` interface (start, stop, model_id, ready_s, base_url)."""

    def __init__(self, spec: dict[str, Any], base_url: str, log_path: Path, *, ready_timeout_s: float = 2700.0,
                 docker_url: Optional[str] = None, cancelled: Callable[[], bool] = lambda: False) -> None:
        self.spec, self.base_url, self.log_path = spec, base_url, log_path
        self.ready_timeout_s, self.cancelled = ready_timeout_s, cancelled
        self.docker_url = docker_url or os.environ.get("DOCKER_HOST")
        self.client: Any = None
        self.container: Any = None
        self.model_id: Optional[str] = None
        self.ready_s: Optional[float] = None
        self._log_thread: Optional[threading.Thread] = None

    def start(self) -> "DockerServer":
        import docker
        try:
            self.client = docker.DockerClient(base_url=self.docker_url) if self.docker_url else docker.from_env()
            self.container = self.client.containers.run(**self.spec)
        except docker.errors.DockerException as exc:
            raise LaunchError(f"docker: {exc}") from None
        self._log_thread = threading.Thread(target=self._copy_logs, daemon=True)
        self._log_thread.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _copy_logs(self) -> None:
        try:
            with open(self.log_path, "ab") as fh:
                for chunk in self.container.logs(stream=True, follow=True):
                    fh.write(chunk)
                    fh.flush()
        except Exception:  # the container went away; what was copied stays
            return

    def exited(self) -> Optional[str]:
        """Why the server container is gone (its exit code), None while it runs."""
        if self.container is None:
            return None
        try:
            self.container.reload()
        except Exception as exc:  # noqa: BLE001 - removed under us, or the engine went away
            return f"the server container is gone ({type(exc).__name__})"
        if self.container.status not in ("exited", "dead"):
            return None
        return f"the server container exited with code {self.container.attrs.get('State', {}).get('ExitCode')}"

    def _wait_ready(self) -> None:
        self.model_id, self.ready_s = wait_ready(self.base_url, exited=self.exited, cancelled=self.cancelled,
                                                 timeout_s=self.ready_timeout_s, log_path=self.log_path)

    def stop(self) -> None:
        """Stop and remove our container only (by the id the run created)."""
        if self.container is None:
            return
        try:
            self.container.stop(timeout=15)
        except Exception:  # already gone
            pass
        if self._log_thread is not None:
            self._log_thread.join(timeout=5.0)  # the log stream ends with the container
        try:
            self.container.remove(force=True)
        except Exception:
            pass
        self.container = None

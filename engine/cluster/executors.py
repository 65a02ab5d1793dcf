"""The ``ray`` and ``container`` executors, registered by name into the job API's registry
(``engine.jobs.api.EXECUTORS``); this module does not import the job API.

A job on Ray or in a container is the same job as a local one: its run folder is made here, its
driver (the mode's life cycle: events, report, summary) runs where that folder is, as a
detached local process by default (``driver="local-process"``) or on a thread of the caller
(``driver="in-process"``); what goes to the cluster or the container is the kernels' stages or
the benchmark points. So ``state``, ``progress``, ``cancel`` and ``attach`` work unchanged, and
``cluster.json`` in the folder names the Ray job and every task.

    submit(KernelRequest(mode="compare", kernel_config="k.yaml"), "./results", executor="ray",
           address="HOST:6379")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from engine.errors import MagpieError
from engine.jobs.executors import InProcessExecutor, LocalProcessExecutor
from engine.jobs.requests import BenchmarkRequest, KernelRequest


class ExecutorError(MagpieError):
    title = "executor"


class _ClusterExecutor:
    environment = ""

    def __init__(self, driver: str = "local-process", cwd: Optional[Path] = None, **options: Any) -> None:
        if driver not in ("local-process", "in-process"):
            raise ExecutorError(f"driver {driver!r}: use local-process or in-process")
        self.driver, self.cwd, self.options = driver, cwd, options
        self.name = self.environment

    def adapt_request(self, request: Any) -> Any:
        """The request, pointed at this executor's environment (and its options)."""
        if not isinstance(request, (KernelRequest, BenchmarkRequest)):
            raise ExecutorError(f"a {request.mode} job runs on this machine: use executor local-process or in-process")
        update = {"environment": self.environment, **self._request_fields(request)}
        return request.model_copy(update=update)

    def _request_fields(self, request: Any) -> dict:
        return {}

    @property
    def record(self) -> dict:
        return {"environment": self.environment, "driver": self.driver, **self.options}

    def start(self, request: Any, run_dir: Path, request_file: str, prepared: Any) -> Any:
        inner = InProcessExecutor() if self.driver == "in-process" else LocalProcessExecutor(cwd=self.cwd)
        return inner.start(request, run_dir, request_file, prepared)


class RayExecutor(_ClusterExecutor):
    """Kernel stages and benchmark points as Ray tasks; ``address`` as --ray-address."""
    environment = "ray"

    def __init__(self, driver: str = "local-process", address: Optional[str] = None, cwd: Optional[Path] = None) -> None:
        super().__init__(driver, cwd, **({"address": address} if address else {}))

    def _request_fields(self, request: Any) -> dict:
        address = self.options.get("address")
        return {"ray_address": address} if address else {}


class ContainerExecutor(_ClusterExecutor):
    """Kernels evaluated inside ``image`` (as --docker-image)."""
    environment = "container"

    def __init__(self, driver: str = "local-process", image: Optional[str] = None, cwd: Optional[Path] = None) -> None:
        super().__init__(driver, cwd, **({"image": image} if image else {}))

    def adapt_request(self, request: Any) -> Any:
        if not isinstance(request, KernelRequest):
            raise ExecutorError("the container executor evaluates kernels (analyze, compare); a benchmark's server "
                                "runs in a container with run_mode: docker")
        return super().adapt_request(request)

    def _request_fields(self, request: Any) -> dict:
        image = self.options.get("image")
        return {"docker_image": image} if image else {}


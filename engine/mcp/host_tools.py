"""Host tools of Magpie that act on the machine rather than on a run: list_benchmark_images, and
configure_gpu, which this server refuses by name (the reason is in its description and error).

list_benchmark_images reads the docker launcher's own image table (engine/bench/docker_launch.py,
the images ``run_mode: docker`` starts when the config names none) and, through the docker SDK,
says whether each image is on this machine's Docker engine. The table does not need an engine:
without one the answer still holds it, with ``docker.reachable: false`` and the reason.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import anyio

from engine.mcp.security import AccessRefused
from engine.mcp.server import State, add_tool

DOCKER_TIMEOUT_S = 5
CONFIGURE_GPU_REFUSAL = (
    "configure_gpu is not provided by this server: power limits and clock locks need root and change the GPU "
    "for every process and every user of the machine until someone resets them, so a client holding this "
    "server's token would control the GPUs of runs that are not its own (other users' measurements included). "
    "The engine times candidates beside their baseline on the same GPU, so a ratio does not need fixed clocks.")
CONFIGURE_GPU_HINT = (
    "set clocks outside the server, as root, and reset them after: NVIDIA 'nvidia-smi -i ID -lgc MIN,MAX' "
    "(reset -rgc), '-lmc MIN,MAX' (reset -rmc), '-pl WATTS'; AMD the equivalent amd-smi / rocm-smi settings")


def _local_state(images: list[str]) -> tuple[dict, dict[str, Optional[dict]]]:
    """(the engine's state, image -> what the engine has of it); None per image without an engine."""
    where = os.environ.get("DOCKER_HOST") or "the local socket"
    try:
        import docker
    except ImportError:
        return ({"reachable": False, "host": where, "error": "the docker SDK is not installed",
                 "hint": "pip install docker"}, {i: None for i in images})
    try:
        client = docker.from_env(timeout=DOCKER_TIMEOUT_S)
        client.ping()
    except Exception as exc:  # no engine, no permission on the socket, a wrong DOCKER_HOST
        return ({"reachable": False, "host": where, "error": f"cannot reach the Docker engine: {exc}",
                 "hint": "start Docker or set DOCKER_HOST for the server; the image table does not need it"},
                {i: None for i in images})
    found: dict[str, Optional[dict]] = {}
    try:
        for image in images:
            try:
                img = client.images.get(image)
            except docker.errors.ImageNotFound:
                found[image] = {"present": False, "pull": f"docker pull {image}"}
            except docker.errors.APIError as exc:
                found[image] = {"present": None, "error": str(exc)}
            else:
                found[image] = {"present": True, "id": img.id, "repo_digests": list(img.attrs.get("RepoDigests") or []),
                                "size_bytes": img.attrs.get("Size"), "created": img.attrs.get("Created")}
    finally:
        client.close()
    return {"reachable": True, "host": where}, found


def register(app: Any, state: State) -> None:  # noqa: ARG001 - the registry's signature

    async def list_benchmark_images(framework: str = "", check_local: bool = True) -> dict:
        """The container images a benchmark with run_mode docker starts, per framework and GPU arch (an arch
        family, amd or nvidia, where one image serves all), when the config names none (benchmark.docker_image
        and --docker-image win). Magpie's keys: images{framework:{arch:image}} and details{framework:{arch:
        {image, runner_type}}}; with check_local, each detail also says whether the image is on this machine's
        Docker engine (id, digests, size), and docker says whether the engine answered."""
        from engine.jobs.query import server_images
        images = server_images()
        if framework and framework not in images:
            if framework == "builtin":
                raise AccessRefused("framework builtin: the built-in server runs on this machine (run_mode local) "
                                    "and has no image")
            raise AccessRefused(f"framework {framework!r}: no image table (frameworks with images: "
                                f"{', '.join(sorted(images))})")
        table = {fw: dict(archs) for fw, archs in images.items() if not framework or fw == framework}
        details = {fw: {arch: {"image": image, "runner_type": "docker"} for arch, image in archs.items()}
                   for fw, archs in table.items()}
        out: dict[str, Any] = {"images": table, "details": details,
                               "note": "benchmark.docker_image (or --docker-image) replaces the table's image"}
        if check_local:
            wanted = sorted({image for archs in table.values() for image in archs.values()})
            engine, found = await anyio.to_thread.run_sync(_local_state, wanted)
            for archs in details.values():
                for d in archs.values():
                    d["local"] = found.get(d["image"])
            out["docker"] = engine
        return out

    def configure_gpu(device_ids: Optional[list[int]] = None, power_limit_watts: Optional[float] = None,
                      gpu_clock_mhz: Optional[list[int]] = None, mem_clock_mhz: Optional[list[int]] = None,
                      reset: bool = False) -> dict:  # noqa: ARG001 - Magpie's arguments, so its calls get the reason
        raise AccessRefused(CONFIGURE_GPU_REFUSAL, hint=CONFIGURE_GPU_HINT)

    configure_gpu.__doc__ = ("Magpie's GPU power and clock control: refused by this server, whatever the arguments. "
                             + CONFIGURE_GPU_REFUSAL + " Instead: " + CONFIGURE_GPU_HINT + ".")
    for fn in (list_benchmark_images, configure_gpu):
        add_tool(app, fn)


__all__ = ["register"]

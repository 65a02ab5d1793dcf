"""The scheduler blocks of a kernel YAML, a framework config (``-c``) or a batch file:
``scheduler.ray`` and ``scheduler.container``. Strict models: an unknown key is an error with
its line, never a silent drop."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RaySettings(_Strict):
    """How kernels and benchmark points run on a Ray cluster."""
    address: Optional[str] = Field(None, description=(
        "the cluster: 'auto', 'HOST:6379' or 'ray://HOST:10001'; default: $RAY_ADDRESS, else a Ray instance "
        "started for the run on this machine (all its GPUs)"))
    gpu_resource: str = Field("GPU", description=(
        "the Ray resource a timing task takes one of (a benchmark point takes tp of them); a custom resource "
        "name stands in for GPUs on a CPU cluster"))
    check_gpus: Optional[float] = Field(None, ge=0, le=1, description=(
        "share of one GPU that a compile/correctness task holds (Ray hides the GPUs from a task that holds "
        "none); default 0.25 with gpu_resource GPU, 0 with a custom resource; 0: checks need no GPU"))
    num_cpus: float = Field(1.0, gt=0, description="CPUs each task holds")
    gpu_type: Optional[str] = Field(None, description=(
        "time only on nodes with this accelerator (Ray's accelerator_type resource, e.g. H200, MI300X)"))
    allow_mixed_gpus: bool = Field(False, description=(
        "rank candidates timed on different GPU models (speedups stay same-GPU ratios)"))
    shared_storage: bool = Field(False, description=(
        "every node sees the run folder and the kernels' folders at the same paths: tasks write in place; "
        "otherwise sources go out and results come back through Ray's object store"))
    ship_engine: bool = Field(True, description="upload this tool to the workers (runtime_env py_modules)")
    env_vars: dict[str, str] = Field(default_factory=dict, description="extra environment of every task")
    namespace: str = Field("magpie", description="Ray namespace of the run's helper actor")
    cancel_grace_s: float = Field(30.0, gt=0, description=(
        "seconds a running task has to stop by itself after a cancel before Ray is told to cancel it"))


class ContainerSettings(_Strict):
    """How kernels run inside a container image (through the docker SDK)."""
    image: Optional[str] = Field(None, description="the image (also --docker-image / scheduler.docker_image)")
    gpus: Literal["auto", "nvidia", "amd", "none"] = Field("auto", description=(
        "how the GPUs reach the container: an NVIDIA device request, AMD /dev/kfd + /dev/dri, or none; "
        "auto follows the GPU detected here"))
    python: str = Field("python3", description="the Python inside the image (needs torch for Python kernels)")
    volumes: dict[str, str] = Field(default_factory=dict, description="extra mounts HOST_PATH: CONTAINER_PATH")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment inside the container")
    pull: bool = Field(False, description="pull the image before the run (else it must be present)")
    docker_host: Optional[str] = Field(None, description="Docker engine URL (default: $DOCKER_HOST or the local socket)")
    shm_size: str = "8g"


def _merge(model: type[_Strict], layers: list[tuple[str, dict]], problems: list[str]) -> Optional[_Strict]:
    """Later layers win key by key; each layer is (where it came from, the keys it set)."""
    merged: dict = {}
    for where, data in layers:
        try:
            model.model_validate(data)
        except Exception as exc:  # pydantic's message names the field
            problems.append(f"{where}: {exc}")
            return None
        merged.update(data)
    return model.model_validate(merged)


def resolve_scheduler(environment: str, cfg, doc, opts, framework: dict, overrides: list[dict],
                      problems: list[str]) -> Optional[_Strict]:
    """The effective scheduler block of a ray or container run: the framework config (``-c``),
    then the kernel YAML (``scheduler.ray`` / Magpie's ``ray_config``, ``scheduler.container`` /
    ``scheduler.docker_image``), then the flags (``--ray-address``, ``--docker-image``)."""
    fw = framework.get("scheduler") or {}
    yaml_sched = cfg.scheduler if cfg is not None else None
    where_yaml = f"{doc.path}: scheduler" if doc is not None else "kernel config: scheduler"
    if environment == "ray":
        layers = [("framework config scheduler.ray", dict(fw.get("ray") or {}))]
        if cfg is not None and cfg.ray_config is not None:
            # Magpie's ray_config: the keys with a counterpart here (engine.config.kernel.KernelRayConfig;
            # the others are named in the plan's warnings).
            layers.append((f"{where_yaml} (ray_config)", cfg.ray_config.ray_settings()))
        if yaml_sched is not None and yaml_sched.ray is not None:
            layers.append((f"{where_yaml}.ray", yaml_sched.ray.model_dump(exclude_unset=True)))
        before = _merge(RaySettings, layers, problems)
        if before is not None and opts.ray_address:
            if before.address and before.address != opts.ray_address:
                overrides.append({"field": "scheduler.ray.address", "yaml": before.address, "cli": opts.ray_address,
                                  "flag": "--ray-address"})
            before = before.model_copy(update={"address": opts.ray_address})
        return before
    if environment == "container":
        layers = [("framework config scheduler.container", dict(fw.get("container") or {}))]
        if fw.get("docker_image"):
            layers.append(("framework config scheduler.docker_image", {"image": fw["docker_image"]}))
        if yaml_sched is not None and yaml_sched.container is not None:
            layers.append((f"{where_yaml}.container", yaml_sched.container.model_dump(exclude_unset=True)))
        if yaml_sched is not None and yaml_sched.docker_image:
            layers.append((f"{where_yaml}.docker_image", {"image": yaml_sched.docker_image}))
        merged = _merge(ContainerSettings, layers, problems)
        if merged is not None and opts.docker_image:
            if merged.image and merged.image != opts.docker_image:
                overrides.append({"field": "scheduler.container.image", "yaml": merged.image,
                                  "cli": opts.docker_image, "flag": "--docker-image"})
            merged = merged.model_copy(update={"image": opts.docker_image})
        if merged is not None and not merged.image:
            problems.append("--environment container needs an image: give --docker-image IMAGE, or "
                            "scheduler.container.image / scheduler.docker_image in the kernel or framework config")
        return merged
    problems.append(f"execution environment {environment!r} is unknown; use local, container or ray")
    return None

"""The scheduler blocks of a kernel YAML, a framework config (``-c``) or a batch file:
``scheduler.ray`` and ``scheduler.container``. Strict models: an unknown key is an error with
its line, never a silent drop."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# What one kernel task holds on Ray (the unmapped ray_config.entrypoint_num_gpus says so).
KERNEL_TASK_GPUS = ("each timing task holds one scheduler.ray.gpu_resource and each check task "
                    "scheduler.ray.check_gpus of one (on a cluster without GPUs, a timing task holds all the CPUs "
                    "of one node: scheduler.ray.device)")


class MagpieRayConfig(_Strict):
    """Magpie's ``ray_config`` block, of a kernel YAML (its presence selects the Ray environment) or of
    a benchmark YAML with ``run_mode: ray``. ``ray_settings`` maps the keys that have a counterpart in
    ``scheduler.ray`` (RaySettings); ``unmapped`` names the others and why."""
    cluster_address: Optional[str] = None
    shared_storage_path: Optional[str] = None
    entrypoint_num_gpus: Optional[float] = Field(default=None, ge=0)
    entrypoint_num_cpus: Optional[float] = Field(default=None, gt=0)
    multi_node: Optional[bool] = None
    total_num_gpus: Optional[int] = Field(default=None, ge=1)
    num_nodes: Optional[int] = Field(default=None, ge=1)
    gpus_per_node: Optional[int] = Field(default=None, ge=1)
    pip_packages: list[str] = Field(default_factory=list)
    env_vars: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    install_magpie: Optional[bool] = None
    magpie_install_path: Optional[str] = None

    @field_validator("env_vars", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): ("" if val is None else str(val)) for k, val in v.items()}
        return v

    def ray_settings(self) -> dict[str, Any]:
        """``scheduler.ray`` keys for the ones that map: (RaySettings field -> value)."""
        out: dict[str, Any] = {}
        if self.cluster_address:
            out["address"] = self.cluster_address
        if self.shared_storage_path:
            out["shared_storage"] = True
        if self.entrypoint_num_cpus:
            out["num_cpus"] = self.entrypoint_num_cpus
        if self.env_vars:
            out["env_vars"] = dict(self.env_vars)
        if self.install_magpie is not None:
            out["ship_engine"] = bool(self.install_magpie)
        return out

    def mapped(self) -> list[str]:
        """One line per key that maps, saying onto what."""
        lines = []
        if self.cluster_address:
            lines.append(f"ray_config.cluster_address {self.cluster_address} -> scheduler.ray.address")
        if self.shared_storage_path:
            lines.append(f"ray_config.shared_storage_path {self.shared_storage_path} -> scheduler.ray.shared_storage: "
                         "true (tasks read and write the run folder and the kernels' folders in place: they must "
                         "be on the shared storage, at the same paths on every node)")
        if self.entrypoint_num_cpus:
            lines.append(f"ray_config.entrypoint_num_cpus {self.entrypoint_num_cpus:g} -> scheduler.ray.num_cpus "
                         "(CPUs each task holds)")
        if self.env_vars:
            lines.append(f"ray_config.env_vars ({', '.join(self.env_vars)}) -> scheduler.ray.env_vars")
        if self.install_magpie is not None:
            lines.append(f"ray_config.install_magpie {str(self.install_magpie).lower()} -> scheduler.ray.ship_engine "
                         "(this tool is uploaded to the tasks)")
        return lines

    def unmapped(self, task_gpus: str = KERNEL_TASK_GPUS) -> list[tuple[str, str]]:
        """(field, what is done instead) for the keys with no counterpart here; ``task_gpus`` says what
        one task holds (a kernel's timing task, a benchmark point)."""
        out = []
        if self.entrypoint_num_gpus is not None:
            out.append(("ray_config.entrypoint_num_gpus", task_gpus))
        for key in ("multi_node", "total_num_gpus", "num_nodes", "gpus_per_node"):
            if getattr(self, key) is not None:
                out.append((f"ray_config.{key}", "a task runs on one node; Ray's own resources say what each node "
                            "has"))
        if self.pip_packages:
            out.append(("ray_config.pip_packages", "install them in the nodes' Python environment (no per-task pip "
                        "install here)"))
        if self.metadata:
            out.append(("ray_config.metadata", "recorded in the effective config only; the run folder names the job"))
        if self.magpie_install_path:
            out.append(("ray_config.magpie_install_path", "this tool ships its own source to the tasks "
                        "(install_magpie / scheduler.ray.ship_engine)"))
        return out



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
    device: Literal["auto", "gpu", "cpu"] = Field("auto", description=(
        "where kernels are timed: gpu (one gpu_resource a time task; a cluster with no node offering it runs "
        "nothing, every kernel 'not run'), cpu (CPU kernels: a time task holds all the CPUs of one node without "
        "GPUs; checks hold no GPU), auto (gpu when a node offers gpu_resource or gpu_type / a custom "
        "gpu_resource is set, else cpu, as a local run uses the GPU or, with none, the CPU)"))
    num_cpus: float = Field(1.0, gt=0, description="CPUs each task holds (a CPU time task: all of its node's)")
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
            # Magpie's ray_config: the keys with a counterpart here (MagpieRayConfig above;
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

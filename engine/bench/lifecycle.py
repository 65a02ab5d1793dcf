"""Magpie's ``server_lifecycle``: a server kept running between benchmark runs, and found again.

A run with ``server_lifecycle.enabled`` and ``cleanup: false`` leaves its server running at the end
and writes a record into ``pid_dir`` (default ``~/.cache/magpie/server``): the process (pid, its
start time, its process group) or the container (id), where it answers, and the settings that make
it the server it is (framework, model, command line, environment, image) with their hash. The next
run with ``server_lifecycle.enabled`` looks for a record with the same settings (or, with
``force_reuse``, for any record of the same framework and port): when its process is still the one
recorded (same pid *and* start time, so a reused pid is never taken for it) and ``/health`` answers,
the run uses it instead of starting a server. ``cleanup: true`` stops it at the end of the run and
removes the record. A record whose process is gone is removed; a server is only ever signalled
after its identity is checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from engine.bench.launch import LaunchError, ServerCommand, _get
from engine.runs.process import process_identity, same_process

DEFAULT_PID_DIR = Path("~/.cache/magpie/server")
_STOP_GRACE_S = 15.0


def pid_dir(configured: Optional[str]) -> Path:
    return Path(configured or DEFAULT_PID_DIR).expanduser()


def server_settings(framework: str, model: str, run_mode: str, command: ServerCommand,
                    image: Optional[str] = None) -> dict[str, Any]:
    """What makes the server the one it is (a kept server is reused only when these match); the
    port stays out when this tool picked it (a free port is no setting)."""
    argv = list(command.argv)
    return {"framework": framework, "model": model, "run_mode": run_mode, "argv": argv,
            "env": dict(sorted(command.env.items())), "image": image}


def settings_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


@dataclass
class KeptServer:
    """A server an earlier run left running (``launch.Server`` interface): its ``stop()`` stops it
    only when this run's ``cleanup`` says so; otherwise the record stays for the next run."""
    record: dict[str, Any]
    path: Path
    stop_at_end: bool
    model_id: Optional[str] = None
    ready_s: Optional[float] = 0.0
    stopped: bool = field(default=False)

    @property
    def base_url(self) -> str:
        return str(self.record["base_url"])

    exit_poll_s = 0.05  # a look at its process (see LocalServer.exit_poll_s)

    def exited(self) -> Optional[str]:
        return None if is_alive(self.record) else "the kept server is gone"

    def stop(self) -> None:
        if self.stopped or not self.stop_at_end:
            return
        self.stopped = True
        stop_kept(self.record)
        self.path.unlink(missing_ok=True)


def records(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    if not folder.is_dir():
        return out
    for p in sorted(folder.glob("*.json")):
        if not p.is_file():
            continue
        try:
            out.append((p, json.loads(p.read_text())))
        except (OSError, ValueError):
            continue
    return out


def is_alive(record: dict[str, Any]) -> bool:
    """The recorded server is still the process (pid + start time) or container it was."""
    if record.get("container_id"):
        try:
            import docker
            client = docker.DockerClient(base_url=record["docker_url"]) if record.get("docker_url") \
                else docker.from_env()
            return client.containers.get(record["container_id"]).status == "running"
        except Exception:  # noqa: BLE001 - no engine, no container: not alive
            return False
    pid, start = record.get("pid"), record.get("start_time")
    return isinstance(pid, int) and start is not None and same_process(pid, start, record.get("pgid"))


def stop_kept(record: dict[str, Any]) -> None:
    """Stop a kept server after checking it is the one recorded (never a reused pid)."""
    if record.get("container_id"):
        try:
            import docker
            client = docker.DockerClient(base_url=record["docker_url"]) if record.get("docker_url") \
                else docker.from_env()
            container = client.containers.get(record["container_id"])
            container.stop(timeout=int(_STOP_GRACE_S))
            container.remove(force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        return
    if not is_alive(record):
        return
    pgid = int(record["pgid"])
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + _STOP_GRACE_S
    while time.monotonic() < deadline and is_alive(record):
        time.sleep(0.1)
    if is_alive(record):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def find_kept(folder: Path, settings: dict[str, Any], port: Optional[int], force_reuse: bool,
              stop_at_end: bool) -> tuple[Optional[KeptServer], list[str]]:
    """A live kept server with these settings (``force_reuse``: of the same framework on ``port``,
    or any of the framework when no port is set); notes on what was found. A record whose server
    is gone is removed. A live server on ``port`` with other settings is an error unless forced:
    starting a second one there would fail to bind."""
    notes: list[str] = []
    want = settings_hash(settings)
    candidates = []
    for path, rec in records(folder):
        if not is_alive(rec):
            path.unlink(missing_ok=True)
            notes.append(f"server_lifecycle: the server recorded in {path} is gone; record removed")
            continue
        candidates.append((path, rec))
    for path, rec in candidates:
        if rec.get("settings_hash") == want and _health(rec):
            return KeptServer(rec, path, stop_at_end), notes
    same_port = [(p, r) for p, r in candidates if r.get("settings", {}).get("framework") == settings["framework"]
                 and (port is None or r.get("port") == port)]
    if same_port and (force_reuse or port is not None):
        path, rec = same_port[0]
        diff = settings_diff(rec.get("settings", {}), settings)
        if not force_reuse:
            raise LaunchError(f"server_lifecycle: a kept {settings['framework']} server answers on port {port} "
                              f"(record {path}) with other settings: {'; '.join(diff)}. Stop it (a run with "
                              "cleanup: true and its settings), or set server_lifecycle.force_reuse: true to use it")
        if _health(rec):
            notes.append(f"server_lifecycle.force_reuse: using the kept server of {path} though its settings "
                         f"differ: {'; '.join(diff)}")
            return KeptServer(rec, path, stop_at_end), notes
    return None, notes


def settings_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            out.append(f"{key}: kept {old.get(key)!r}, this run {new.get(key)!r}")
    return out


def _health(record: dict[str, Any]) -> bool:
    return _get(str(record["base_url"]) + "/health", timeout=5.0)[0] == 200


def keep(folder: Path, settings: dict[str, Any], *, base_url: str, port: Optional[int], pid: Optional[int] = None,
         container_id: Optional[str] = None, docker_url: Optional[str] = None, run_dir: str = "") -> Path:
    """Record a server left running for the next run; the record's path."""
    folder.mkdir(parents=True, exist_ok=True)
    digest = settings_hash(settings)
    record: dict[str, Any] = {"settings_hash": digest, "settings": settings, "base_url": base_url, "port": port,
                              "kept_by_run": run_dir, "kept_at": time.time()}
    if container_id:
        record.update(container_id=container_id, docker_url=docker_url)
    else:
        assert pid is not None
        record.update(process_identity(pid))  # pid, start time, group: what is_alive checks
    path = folder / f"{settings['framework']}_{digest[:16]}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)
    return path

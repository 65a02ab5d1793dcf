"""Kernels evaluated in a container (``-e container``), through the docker SDK.

Against the benchmark launcher's Engine-API stand-in (tests/e2e/test_docker_launch.py), taught
here to really run the container's command as a process on this machine (the mounts are the
same paths, so what runs sees what a container would), and against a real Docker engine when
one answers (skipped with the reason otherwise).
"""

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from conftest import only_workspace, run_magpie
from test_docker_launch import FakeEngine

pytest.importorskip("docker")

KERNEL_C = r"""
#include <stdio.h>
int main(void){ volatile double x = 0; for (int i = 0; i < 100000; i++) x += i;
  printf("MAGPIE_TIMING_JSON: {\"samples_ms\": [0.51, 0.52, 0.50, 0.53, 0.52]}\n"); return x < 0; }
"""


class RunningEngine(FakeEngine):
    """The stand-in's server and call log; create/start/logs/wait/stop/delete act on a real
    process running the container's Cmd with its Env in its WorkingDir."""

    def __init__(self, sock: Path) -> None:
        super().__init__(sock)
        self.proc = None
        self.config: dict = {}
        self.removed = False
        self.console = sock.parent / "container_console.log"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path.split("/", 2)[-1] if request.path.startswith("/v1.") else request.path.lstrip("/")
        if path.startswith("images/") and path.endswith("/json"):
            self.calls.append((request.method, path, {}))
            return web.json_response({"Id": "sha256:" + "ab" * 32, "RepoDigests": ["magpie/test@sha256:" + "cd" * 32]})
        if path == "containers/create":
            self.config = json.loads(body)
            self.calls.append((request.method, path, self.config))
            return web.json_response({"Id": "c0ffee", "Warnings": []}, status=201)
        if path == "containers/c0ffee/start":
            self.calls.append((request.method, path, {}))
            env = {**os.environ, **dict(e.split("=", 1) for e in self.config.get("Env") or [])}
            with open(self.console, "wb") as out:
                self.proc = subprocess.Popen(self.config["Cmd"], cwd=self.config["WorkingDir"], env=env, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            return web.Response(status=204)
        if path == "containers/c0ffee/json":
            if self.proc is None:
                state = {"Status": "created", "ExitCode": 0}
            elif self.proc.poll() is None:
                state = {"Status": "running", "ExitCode": 0}
            else:
                state = {"Status": "exited", "ExitCode": self.proc.returncode}
            return web.json_response({"Id": "c0ffee", "Name": "/magpie", "Config": {"Image": "img", "Tty": False},
                                      "State": state})
        if path == "containers/c0ffee/logs":
            return await self._logs(request)
        if path == "containers/c0ffee/wait":
            while self.proc.poll() is None:
                await asyncio.sleep(0.05)
            return web.json_response({"StatusCode": self.proc.returncode})
        if path == "containers/c0ffee/stop":
            self.calls.append((request.method, path, dict(request.query)))
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)  # what docker stop sends first
                for _ in range(200):
                    if self.proc.poll() is not None:
                        break
                    await asyncio.sleep(0.05)
            return web.Response(status=204)
        if request.method == "DELETE" and path == "containers/c0ffee":
            self.calls.append((request.method, path, dict(request.query)))
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.removed = True
            return web.Response(status=204)
        return await super()._handle(request)

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        sent = 0
        while True:
            done = self.proc.poll() is not None
            data = self.console.read_bytes()[sent:]
            if data:
                await resp.write(struct.pack(">BxxxL", 1, len(data)) + data)  # a stdout frame
                sent += len(data)
            if done:
                break
            await asyncio.sleep(0.05)
        await resp.write_eof()
        return resp


def _config(tmp_path: Path, container: dict, testcase: str = "./build/{id}") -> Path:
    (tmp_path / "kern.c").write_text(KERNEL_C)
    kernels = [{"id": kid, "type": "hip", "working_dir": "${MAGPIE_CONFIG_DIR}",
                "compile_command": f"mkdir -p build && cc -O1 -o build/{kid} kern.c",
                "testcase_command": testcase.format(id=kid)} for kid in ("base", "cand")]
    cfg = {"kernels": kernels, "scheduler": {"container": {"python": sys.executable, **container}}}
    path = tmp_path / "k.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_compare_in_a_container_through_the_engine_api(tmp_path):
    sock = tmp_path / "docker.sock"
    with RunningEngine(sock) as engine:
        cfg = _config(tmp_path, {"docker_host": f"unix://{sock}", "gpus": "amd"})
        out = tmp_path / "out"
        r = run_magpie("-e", "container", "--docker-image", "magpie/test:1", "compare", "-k", cfg, "-o", out)
    assert r.returncode == 0, r.stderr[-3000:]
    ws = only_workspace(out)
    report = json.loads((ws / "compare_report.json").read_text())
    rows = report["results"]["kernel_results"]
    assert [row["correctness_state"] for row in rows] == ["SUCCESS", "SUCCESS"]
    assert rows[1]["timing"]["n"] == 5 * report["settings"]["rounds"]  # 5 samples from each of the rounds' processes
    assert rows[1]["verdict"] in ("tie", "faster", "slower")
    c = report["container"]
    assert c["image"] == "magpie/test:1" and c["image_id"].startswith("sha256:") and c["repo_digests"]
    assert c["removed"] is True and c["exit_code"] == 0 and c["gpus"] == "/dev/kfd + /dev/dri"
    host = engine.config["HostConfig"]
    assert engine.config["Image"] == "magpie/test:1" and engine.config["WorkingDir"] == str(ws)
    assert {d["PathOnHost"] for d in host["Devices"]} == {"/dev/kfd", "/dev/dri"} and host["GroupAdd"] == ["video"]
    binds = host["Binds"]
    assert f"{ws}:{ws}:rw" in binds and f"{tmp_path}:{tmp_path}:rw" in binds  # the run folder and the kernels
    assert any(b.endswith("/engine:ro") for b in binds)  # the tool itself
    assert ("DELETE", "containers/c0ffee", {"v": "False", "link": "False", "force": "True"}) in engine.calls
    # The container's console streamed into the run folder; its stage events reached the run's.
    assert "magpie container: 2 kernel(s) evaluated" in (ws / "logs" / "container.log").read_text()
    events = [json.loads(x) for x in (ws / "events.jsonl").read_text().splitlines()]
    assert any(e.get("stage") == "performance" and e.get("state") == "SUCCESS" and e.get("kernel") == "cand"
               for e in events)
    assert "testcase_1.stdout.log" in json.dumps(rows[0]["correctness_result"])
    assert (ws / "container" / "logs" / "cand" / "testcase_1.stdout.log").is_file()


def test_cancel_stops_and_removes_the_container(tmp_path):
    from engine.jobs import KernelRequest, submit
    sock = tmp_path / "docker.sock"
    with RunningEngine(sock) as engine:
        cfg = _config(tmp_path, {"docker_host": f"unix://{sock}", "gpus": "nvidia"},
                      testcase=f"echo started > {tmp_path}/{{id}}.started; sleep 60")
        job = submit(KernelRequest(mode="compare", kernel_config=str(cfg)), tmp_path / "out", executor="container",
                     image="magpie/test:1", driver="in-process")
        for _ in range(600):
            if (tmp_path / "base.started").exists():
                break
            assert job.state() in ("pending", "running")
            time.sleep(0.1)
        job.cancel()
        assert job.wait(60) == "cancelled"
        report = job.result()
    assert engine.removed and any(c[1] == "containers/c0ffee/stop" for c in engine.calls)
    assert engine.proc.poll() is not None
    assert engine.config["HostConfig"]["DeviceRequests"][0]["Capabilities"] == [["gpu"]]
    assert report["state"] == "cancelled" and report["container"]["removed"] is True
    assert report["results"]["kernel_results"][0]["correctness_state"] == "CANCELLED"


def test_no_image_is_a_config_error(tmp_path):
    cfg = _config(tmp_path, {})
    r = run_magpie("-e", "container", "analyze", "-k", cfg)
    assert r.returncode == 2 and "--docker-image" in r.stderr


def test_against_a_real_docker_engine(tmp_path):
    import docker
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers here ({type(exc).__name__}: {str(exc)[:120]})")
    image = os.environ.get("MAGPIE_TEST_IMAGE", "python:3.11-slim")
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        pytest.skip(f"image {image} is not on this machine (set MAGPIE_TEST_IMAGE to one with python, cc, "
                    "pydantic, pyyaml and rich)")
    cfg = _config(tmp_path, {"python": "python3"})
    r = run_magpie("-e", "container", "--docker-image", image, "analyze", "-k", cfg, "-o", tmp_path / "out")
    report = json.loads((only_workspace(tmp_path / "out") / "analyze_report.json").read_text())
    assert report["container"]["removed"] is True and report["container"]["image_id"]
    assert r.returncode in (0, 1)

"""The docker launcher against a small Engine-API server on a unix socket (no Docker engine runs
here): the requests the docker SDK sends, the container lifecycle, and the logs copied."""

import json
import struct
from pathlib import Path

import pytest
from aiohttp import web

from bench_server import BenchServer, Script
from unix_http import UnixHTTPServer
from engine.bench.docker_launch import DockerServer, container_spec, image_for
from engine.bench.launch import LaunchError, server_command
from engine.config.benchmark import BenchmarkConfig

pytest.importorskip("docker")


class FakeEngine(UnixHTTPServer):
    """Enough of the Docker Engine API for containers.run / logs / reload / stop / remove."""

    def __init__(self, sock: Path, exit_at_start: bool = False) -> None:
        super().__init__(sock)
        self.exit_at_start = exit_at_start
        self.calls: list[tuple[str, str, object]] = []
        self.status = "created"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path.split("/", 2)[-1] if request.path.startswith("/v1.") else request.path.lstrip("/")
        self.calls.append((request.method, path, json.loads(body) if body else dict(request.query)))
        if path in ("version", "_ping"):
            return web.json_response({"ApiVersion": "1.43", "Version": "24.0.0", "MinAPIVersion": "1.12"})
        if path == "containers/create":
            return web.json_response({"Id": "c0ffee", "Warnings": []}, status=201)
        if path == "containers/c0ffee/start":
            self.status = "exited" if self.exit_at_start else "running"
            return web.Response(status=204)
        if path == "containers/c0ffee/json":
            return web.json_response({"Id": "c0ffee", "Name": "/magpie", "State": {"Status": self.status,
                                      "ExitCode": 3 if self.exit_at_start else 0}, "Config": {"Image": "img", "Tty": False}})
        if path == "containers/c0ffee/logs":
            resp = web.StreamResponse()
            await resp.prepare(request)
            line = b"INFO: server starting\n"
            await resp.write(struct.pack(">BxxxL", 1, len(line)) + line)  # stdout frame
            await resp.write_eof()
            return resp
        if path == "containers/c0ffee/stop":
            self.status = "exited"
            return web.Response(status=204)
        if request.method == "DELETE" and path == "containers/c0ffee":
            return web.Response(status=204)
        return web.json_response({"message": f"unexpected {request.method} {path}"}, status=404)


def _cfg(**kw):
    return BenchmarkConfig.model_validate({"framework": "vllm", "model": "org/m", "run_mode": "docker", **kw})


def test_image_table_and_vendor_device_requests(tmp_path):
    assert image_for(_cfg(), "sm_90") == "vllm/vllm-openai:v0.19.1"
    assert image_for(_cfg(), "gfx942") == "vllm/vllm-openai-rocm:v0.19.1"
    assert image_for(_cfg(framework="sglang"), "gfx950").endswith("mi35x")
    assert image_for(_cfg(docker_image="mine:1"), None) == "mine:1"
    with pytest.raises(LaunchError, match="no atom image for GPU arch sm_90"):
        image_for(_cfg(framework="atom"), "sm_90")
    cmd = server_command(_cfg(), 8000)
    nv = container_spec(_cfg(), cmd, arch="sm_90", workspace=tmp_path, host_port=4321, gpus=["GPU-1"])
    assert nv["device_requests"][0]["DeviceIDs"] == ["GPU-1"] and nv["ports"] == {"8000/tcp": ("127.0.0.1", 4321)}
    assert nv["volumes"][str(tmp_path)]["bind"] == str(tmp_path) and nv["environment"]["TP"] == "1"
    amd = container_spec(_cfg(), cmd, arch="gfx942", workspace=tmp_path, host_port=4321, gpus=["2", "3"])
    assert "/dev/kfd:/dev/kfd:rwm" in amd["devices"] and amd["group_add"] == ["video"]
    assert amd["environment"]["HIP_VISIBLE_DEVICES"] == "2,3" and "device_requests" not in amd


def test_container_lifecycle_against_the_engine_api(tmp_path):
    sock = tmp_path / "docker.sock"
    with BenchServer(Script(tokens=2)) as model_server, FakeEngine(sock) as engine:
        cfg = _cfg()
        spec = container_spec(cfg, server_command(cfg, 8000), arch="sm_90", workspace=tmp_path,
                              host_port=model_server.port)
        server = DockerServer(spec, model_server.url, tmp_path / "server.log", ready_timeout_s=20,
                              docker_url=f"unix://{sock}").start()
        assert server.ready_s is not None
        server.stop()
    create = next(body for method, path, body in engine.calls if path == "containers/create")
    assert create["Image"] == "vllm/vllm-openai:v0.19.1" and create["Cmd"][:3] == ["vllm", "serve", "org/m"]
    assert "TP=1" in create["Env"]
    host = create["HostConfig"]
    assert host["DeviceRequests"][0]["Capabilities"] == [["gpu"]] and host["DeviceRequests"][0]["Count"] == -1
    assert host["PortBindings"] == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(model_server.port)}]}
    assert any(b.startswith(f"{tmp_path}:{tmp_path}") for b in host["Binds"])
    paths = [(m, p) for m, p, _ in engine.calls]
    assert ("POST", "containers/c0ffee/stop") in paths and ("DELETE", "containers/c0ffee") in paths
    assert "server starting" in (tmp_path / "server.log").read_text()


def test_a_container_that_exits_is_reported_and_removed(tmp_path):
    sock = tmp_path / "docker.sock"
    with FakeEngine(sock, exit_at_start=True) as engine:
        cfg = _cfg()
        spec = container_spec(cfg, server_command(cfg, 8000), arch="sm_90", workspace=tmp_path, host_port=1)
        with pytest.raises(LaunchError, match="exited with code 3"):
            DockerServer(spec, "http://127.0.0.1:1", tmp_path / "server.log", ready_timeout_s=10,
                         docker_url=f"unix://{sock}").start()
    assert ("DELETE", "containers/c0ffee") in [(m, p) for m, p, _ in engine.calls]

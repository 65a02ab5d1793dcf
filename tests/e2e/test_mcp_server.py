"""The MCP server as a real subprocess, driven by the official SDK's own client over stdio and over
streamable HTTP on loopback: same report as the CLI, token and root refusals, a long benchmark that
returns its job id at once and reports progress, and a cancel that leaves a cancelled report."""

import json
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Optional

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import EXAMPLES, REPO, local_ray_head, mcp_http_url, only_workspace, run_magpie, stop_server

RMSNORM = EXAMPLES / "rmsnorm_pytorch" / "compare.yaml"
TINY_BENCH = REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml"
TOKEN = "test-token-0123456789"


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MAGPIE_MCP_TOKEN": TOKEN}
    env.pop("TRITON_INTERPRET", None)
    return env


def _server_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["-m", "engine.mcp", "--root", str(REPO), "--root", str(tmp_path), "-o", str(tmp_path / "mcp"), *extra]


def _stdio_client(tmp_path: Path) -> Client:
    return Client(StdioServerParameters(command=sys.executable, args=_server_args(tmp_path), env=_env(), cwd=str(REPO)))


@pytest.fixture
def http_server(tmp_path):
    proc = subprocess.Popen([sys.executable, *_server_args(tmp_path, "--transport", "http", "--port", "0")], cwd=REPO,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, lines = mcp_http_url(proc)
    assert url, "".join(lines)
    yield url, lines
    stop_server(proc)


@asynccontextmanager
async def _http_client(url: str, token: str = TOKEN):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0, read=60.0)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


async def _call(client: Client, tool: str, args: dict, **kw) -> dict:
    result = await client.call_tool(tool, args, **kw)
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


async def _error(client: Client, tool: str, args: dict) -> str:
    result = await client.call_tool(tool, args)
    assert result.is_error, result.content[0].text
    return result.content[0].text


async def _wait(client: Client, job_id: str, timeout: float = 300, progress=None) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = await _call(client, "job_status", {"job_id": job_id, "wait_s": 5}, progress_callback=progress)
        if status["finished"] or time.monotonic() > deadline:
            return status


# Keys whose values differ between any two runs of the same work: clocks, paths and hashes of the run folder.
_VOLATILE = {"timestamp", "workspace_dir", "workspace", "elapsed_s", "duration_s", "started", "finished", "wall_s",
             "log", "logs", "stdout_log", "stderr_log", "pid", "config_file", "kernel_config", "execution_time",
             "peak_memory"}  # measured, like the times


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE and not k.endswith(("_s", "_log", "_path"))}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, str) and ("/tmp" in value or str(REPO) in value):
        return "<path>"
    return value


@pytest.mark.slow
def test_compare_through_stdio_gives_the_cli_report(tmp_path):
    # In the environment the MCP server's jobs get (engine.jobs.executors.engine_env: the checkout
    # first on PYTHONPATH again): the harness workers of both runs then fork from one shared
    # server instead of one each environment (torch and its compiler stack imported again).
    job_env = {"MAGPIE_MCP_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    cli = run_magpie("compare", "-k", RMSNORM, "-o", tmp_path / "cli", "--no-perf", "--seed", "7", env=job_env)
    assert cli.returncode == 0, cli.stderr
    cli_report = json.loads((only_workspace(tmp_path / "cli") / "compare_report.json").read_text())

    async def go():
        async with _stdio_client(tmp_path) as client:
            job = await _call(client, "compare", {"kernel_config": str(RMSNORM), "check_performance": False,
                                                  "seed": 7})
            status = await _wait(client, job["job_id"])
            assert status["state"] == "completed", status
            result = await _call(client, "job_result", {"job_id": job["job_id"]})
            text = await client.read_resource(status["report_uri"])
            return result, json.loads(text.contents[0].text)
    result, resource = anyio.run(go)
    assert result["report"] == resource  # the resource is the report file
    assert _stable(result["report"]) == _stable(cli_report)
    assert [k["kernel_id"] for k in result["report"]["results"]["kernel_results"]] == ["eager", "fused"]


def test_http_needs_the_token(http_server):
    url, _lines = http_server
    health = httpx2.get(url.rsplit("/", 1)[0] + "/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        r = httpx2.post(url, json=body, headers={"Accept": "application/json, text/event-stream", **headers}, timeout=10)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")

    async def with_bad_token():
        async with _http_client(url, token="not-the-token") as client:
            await client.list_tools()
    try:
        anyio.run(with_bad_token)
    except Exception as exc:  # the SDK raises the 401 as an MCPError, inside task-group exception groups
        assert any(isinstance(e, MCPError) for e in _flatten(exc)), repr(exc)
    else:
        pytest.fail("a client with a wrong token was served")


def _flatten(exc: BaseException) -> list:
    inner = getattr(exc, "exceptions", None)
    return [exc] if not inner else [e for sub in inner for e in _flatten(sub)]


def test_http_refuses_paths_outside_the_roots_and_commands(http_server, tmp_path):
    url, _lines = http_server
    outside = Path("/etc/hostname") if Path("/etc/hostname").exists() else Path("/etc/passwd")

    async def go():
        async with _http_client(url) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"analyze", "compare", "benchmark", "job_status", "job_cancel"} <= names
            e1 = await _error(client, "analyze", {"kernel_path": str(outside), "kernel_type": "pytorch"})
            e2 = await _error(client, "compare", {"kernel_config": "../../../../etc/passwd"})
            e3 = await _error(client, "compare", {"kernel_paths": [str(EXAMPLES / "rmsnorm_pytorch" / "rmsnorm_eager.py"),
                                                                   str(EXAMPLES / "rmsnorm_pytorch" / "rmsnorm_fused.py")],
                                                  "testcase_commands": ["rm -rf ~"]})
            e4 = await _error(client, "analyze", {"kernel_config": str(RMSNORM), "accordo_atol": 1e-6})
            return e1, e2, e3, e4
    e1, e2, e3, e4 = anyio.run(go)
    assert "outside the allowed roots" in e1 and "kernel_path" in e1 and "--root" in e1
    assert "outside the allowed roots" in e2 and "kernel_config" in e2
    assert "--allow-commands" in e3 and "testcase_commands" in e3
    assert "accordo_atol" in e4  # an unknown argument is refused, not dropped
    assert not (tmp_path / "mcp").exists() or not any(p for p in (tmp_path / "mcp").iterdir() if p.name != ".mcp")


@pytest.mark.slow
def test_long_benchmark_returns_at_once_reports_progress_and_cancels(http_server):
    url, _lines = http_server
    progress = []

    async def on_progress(done, total, message):
        progress.append((done, total, message))

    async def go():
        async with _http_client(url) as client:
            t0 = time.monotonic()
            job = await _call(client, "benchmark", {"benchmark_config": str(TINY_BENCH), "num_prompts": 4000,
                                                    "repeats": 1, "warmup": 0})
            took = time.monotonic() - t0
            assert job["state"] in ("pending", "running") and job["job_id"].startswith("benchmark_builtin-tiny_")
            deadline = time.monotonic() + 240
            status = job
            while time.monotonic() < deadline:
                status = await _call(client, "job_status", {"job_id": job["job_id"], "wait_s": 5},
                                     progress_callback=on_progress)
                if status["finished"] or (status["done"] or 0) > 0:
                    break
            cancelled = await _call(client, "job_cancel", {"job_id": job["job_id"]})
            final = await _wait(client, job["job_id"], timeout=120)
            result = await _call(client, "job_result", {"job_id": job["job_id"]})
            listed = await _call(client, "job_list", {"mode": "benchmark"})
            return took, status, cancelled, final, result, listed
    took, status, cancelled, final, result, listed = anyio.run(go)
    # At once: far less than the run (minutes; still running below), with room for a busy machine.
    assert took < 10.0, f"the benchmark tool took {took:.2f} s to return its job id"
    assert not status["finished"] and status["done"] > 0 and status["total"] == 4000, status
    assert any(total == 4000 and done > 0 for done, total, _m in progress), progress
    dones = [d for d, t, _m in progress if t == 4000]
    assert dones == sorted(dones)
    assert cancelled["cancelled"] is True
    assert final["state"] == "cancelled", final
    report = result["report"]
    assert report["state"] == "cancelled" and report["success"] is False, report.get("state")
    assert any(j["job_id"] == final["job_id"] and j["state"] == "cancelled" for j in listed["jobs"])


# --------------------------------------------------------------------------- idle sessions
PROTOCOL = "2025-06-18"
IDLE_S = 2.0


class _RawSession:
    """A streamable-HTTP session driven by hand: initialize, no GET stream, no DELETE (the client can
    go away), every answer read to its end."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http, self.url, self.id, self.n = http, url, None, 0

    async def post(self, method: str, params: Optional[dict] = None, notify: bool = False) -> httpx2.Response:
        body: dict = {"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})}
        if not notify:
            self.n += 1
            body["id"] = self.n
        headers = {"Accept": "application/json, text/event-stream"}
        if self.id:
            headers.update({"mcp-session-id": self.id, "mcp-protocol-version": PROTOCOL})
        return await self.http.post(self.url, json=body, headers=headers)

    async def open(self) -> "_RawSession":
        r = await self.post("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                           "clientInfo": {"name": "raw", "version": "0"}})
        assert r.status_code == 200, r.text
        self.id = r.headers["mcp-session-id"]
        assert (await self.post("notifications/initialized", notify=True)).status_code == 202
        return self

    async def call(self, tool: str, args: dict) -> dict:
        r = await self.post("tools/call", {"name": tool, "arguments": args})
        assert r.status_code == 200, r.text
        data = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        result = [d for d in data if d.get("id") == self.n][0]["result"]
        assert not result.get("isError"), result
        return json.loads(result["content"][0]["text"])


def test_an_abandoned_session_expires_and_sessions_in_use_and_jobs_do_not(tmp_path):
    """--session-idle-timeout: a session left without DELETE answers 404 once idle that long; a session
    whose call outlasts the timeout and one that holds its GET stream open are kept; the job the
    abandoned session started runs to its end."""
    kernel = tmp_path / "k.hip"
    kernel.write_text("// built by the compile command below\n")
    proc = subprocess.Popen([sys.executable, *_server_args(tmp_path, "--transport", "http", "--port", "0",
                                                           "--allow-commands", "--session-idle-timeout", str(IDLE_S))],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, lines = mcp_http_url(proc)
    try:
        assert url, "".join(lines)

        async def go():
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                          timeout=httpx2.Timeout(30.0, read=60.0)) as http:
                gone = await _RawSession(http, url).open()
                job = await gone.call("analyze", {"kernel_path": str(kernel), "compile_command": "sleep 8",
                                                  "testcase_command": "true", "check_performance": False})
                # gone is abandoned from here on. The SDK's client holds a GET stream open.
                async with _http_client(url) as streaming:
                    busy = await _RawSession(http, url).open()
                    t0 = time.monotonic()
                    during = await busy.call("job_status", {"job_id": job["job_id"], "wait_s": 5})
                    long_call = time.monotonic() - t0
                    after_busy = await busy.post("tools/list")
                    after_gone = await gone.post("tools/list")
                    after_stream = await _call(streaming, "job_status", {"job_id": job["job_id"]})
                    final = await _wait(streaming, job["job_id"], timeout=120)
                return during, long_call, after_busy, after_gone, after_stream, final
        during, long_call, after_busy, after_gone, after_stream, final = anyio.run(go)
    finally:
        stop_server(proc)
    # The call stayed in flight past the timeout and got its answer, the session it came on is kept.
    assert long_call > 2 * IDLE_S and not during["finished"], (long_call, during)
    assert after_busy.status_code == 200, after_busy.text
    # The abandoned session is gone: the SDK's "session not found".
    assert after_gone.status_code == 404 and "Session not found" in after_gone.text, after_gone.text
    assert after_stream["job_id"] == final["job_id"]
    # Its job was the server's, not the session's: it ran to its end.
    assert final["state"] == "completed" and final["exit_code"] == 0, final


SMALL = {"num_prompts": 4, "input_len": 16, "output_len": 4, "warmup": 0, "repeats": 1}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_benchmark_batch_outlives_the_server_that_started_it(tmp_path):
    """benchmark_batch is one batch job (magpie benchmark --batch) in a detached process: the server that
    submitted it is killed while the points are queued or running, and a new server process on the same
    results root finds the batch by its id; batch_status reports every point completed, with its run folder,
    the points that started after the first server died included."""
    configs = [{"benchmark_config": str(TINY_BENCH), "concurrency": c, **SMALL} for c in (1, 2, 1)]
    first = subprocess.Popen([sys.executable, *_server_args(tmp_path, "--transport", "http", "--port", "0")],
                             cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url, lines = mcp_http_url(first)
        assert url, "".join(lines)

        async def submit():
            async with _http_client(url) as client:
                # Every point is checked before anything starts: a bad one names itself, and no batch exists.
                bad = await _error(client, "benchmark_batch", {"configs": [configs[0], {**configs[1], "concurency": 2}]})
                assert "configs[1]" in bad and "concurency" in bad and "did you mean concurrency" in bad, bad
                assert not list((tmp_path / "mcp").glob("benchmark_*")), "a refused batch started a run"
                t0 = time.monotonic()
                batch = await _call(client, "benchmark_batch", {"configs": configs})
                took = time.monotonic() - t0
                before = await _call(client, "batch_status", {"batch_id": batch["batch_id"]})
                return took, batch, before
        took, batch, before = anyio.run(submit)
        first.kill()  # no shutdown of its own: whatever the server held in memory is gone
        first.wait(timeout=30)
        killed_at = time.time()
    finally:
        stop_server(first)
    assert took < 10.0, f"benchmark_batch took {took:.2f} s to return"
    assert batch["batch_id"] == batch["job_id"] and batch["environment"] == "local" and batch["points"] == 3, batch
    assert [p["state"] for p in batch["jobs"]] == ["queued"] * 3
    assert [p["label"] for p in batch["jobs"]] == ["00_builtin-tiny_tp1_c1", "01_builtin-tiny_tp1_c2",
                                                   "02_builtin-tiny_tp1_c1"]
    assert Path(batch["batch_file"]).is_relative_to(tmp_path / "mcp" / ".mcp" / "batches")
    # The server died with points still to run (else this test would prove nothing).
    assert before["jobs"][-1]["state"] in ("queued", "running"), before
    run_dir = Path(batch["run_dir"])
    batch_pid = json.loads((run_dir / "job.json").read_text())["pid"]
    assert _pid_alive(batch_pid), "the batch's process died with the server"

    async def follow():
        async with _stdio_client(tmp_path) as client:  # a new server process, the same results root
            seen, deadline = [], time.monotonic() + 300
            while True:
                status = await _call(client, "batch_status", {"batch_id": batch["batch_id"]})
                seen.append([p["state"] for p in status["jobs"]])
                if status["finished"] or time.monotonic() > deadline:
                    break
                await anyio.sleep(1.0)
            job = await _call(client, "job_status", {"job_id": batch["batch_id"]})
            result = await _call(client, "job_result", {"job_id": batch["batch_id"]})
            point = await _call(client, "get_benchmark_result", {"workspace_dir": status["jobs"][-1]["run_dir"]})
            return seen, status, job, result, point
    seen, status, job, result, point = anyio.run(follow)
    assert status["state"] == "completed" and status["failed"] == 0, status
    assert job["state"] == "completed" and job["run_dir"] == str(run_dir)
    assert [p["state"] for p in status["jobs"]] == ["completed"] * 3, seen
    for p in status["jobs"]:
        folder = Path(p["run_dir"])
        assert folder.parent == run_dir / "points" and folder.name == p["label"]
        assert json.loads((folder / "benchmark_report.json").read_text())["state"] == "completed"
        assert p["metrics"]["completed"] == 4
    assert [p["flags"]["concurrency"] for p in status["jobs"]] == [1, 2, 1]
    # The last point started after the first server was gone.
    events = [json.loads(line) for line in (run_dir / "points" / status["jobs"][-1]["label"] / "events.jsonl")
              .read_text().splitlines()]
    started = [e["ts"] for e in events if e["event"] == "run_started"]
    assert started and started[0] > killed_at, (started, killed_at)
    report = result["report"]
    assert report["batch"] is True and report["state"] == "completed" and len(report["points"]) == 3
    assert point["workspace_dir"] == status["jobs"][-1]["run_dir"] and point["state"] == "completed"


@pytest.fixture
def ray_cluster():
    """A Ray head on 127.0.0.1 for one test, with 2 logical GPUs (none is real: the points run the
    built-in server on the CPU), stopped at the end."""
    pytest.importorskip("ray")
    with local_ray_head("mgmcp", num_gpus=2) as address:
        yield address


@pytest.mark.slow
def test_benchmark_batch_on_ray_through_the_mcp_client(ray_cluster, tmp_path):
    small = {"num_prompts": 4, "input_len": 16, "output_len": 4, "warmup": 0, "repeats": 1}
    inline = {"framework": "builtin", "run_mode": "local", "server": {"size": "tiny", "max_batch": 4},
              "envs": {"CONC": 2, "ISL": 16, "OSL": 4, "NUM_PROMPTS": 4}, "client": {"warmup": 0, "repeats": 1}}
    configs = [{"benchmark_config": str(TINY_BENCH), "concurrency": 1, **small}, inline]

    # An inline config's envs reach the server's environment: a server started with --allow-commands.
    server = Client(StdioServerParameters(command=sys.executable, args=_server_args(tmp_path, "--allow-commands"),
                                          env=_env(), cwd=str(REPO)))

    async def go():
        async with server as client:
            t0 = time.monotonic()
            job = await _call(client, "benchmark_batch", {"configs": configs, "parallel": True,
                                                          "ray_cluster_address": ray_cluster})
            took = time.monotonic() - t0
            status = await _wait(client, job["job_id"], timeout=120)
            result = await _call(client, "job_result", {"job_id": job["job_id"]})
            batch = await _call(client, "batch_status", {"batch_id": job["batch_id"]})
            return took, job, status, result, batch
    took, job, status, result, batch = anyio.run(go)
    assert took < 5.0 and job["points"] == 2 and job["batch_id"] == job["job_id"], job
    assert batch["environment"] == "ray" and [p["state"] for p in batch["jobs"]] == ["completed", "completed"], batch
    assert status["state"] == "completed", status
    report = result["report"]
    assert report["batch"] is True and report["run_environment"] == "ray" and report["state"] == "completed"
    points = report["points"]
    assert [p["state"] for p in points] == ["completed", "completed"], [p.get("error") for p in points]
    assert [p["metrics"]["completed"] for p in points] == [4, 4]
    assert all(p["metrics"]["request_throughput"] > 0 for p in points)
    assert points[0]["flags"]["concurrency"] == 1
    run_dir = Path(status["run_dir"])
    for p in points:  # each point's own report came back into the batch's folder
        assert json.loads((Path(p["folder"]) / "benchmark_report.json").read_text())["state"] == "completed"
        assert Path(p["folder"]).parent == run_dir / "points"
    cluster = json.loads((run_dir / "cluster.json").read_text())
    assert cluster["gcs_address"] == ray_cluster and cluster["ray_job_id"]
    assert [(t["resources"], t["state"]) for t in cluster["tasks"]] == [({"GPU": 1}, "finished")] * 2
    # The points' server and load stages reached the batch's events while they ran.
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert {e["ray_task"] for e in events if e.get("ray_task")} == {t["key"] for t in cluster["tasks"]}

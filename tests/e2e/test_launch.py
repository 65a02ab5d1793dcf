"""Local launchers: command lines per framework, and the built-in server run for real."""

import os
import sys

import pytest

from engine.bench.launch import LaunchError, LocalServer, free_port, server_command
from engine.config.benchmark import BenchmarkConfig


def _cfg(**kw):
    return BenchmarkConfig.model_validate({"framework": "vllm", "model": "org/m", **kw})


def test_command_lines_and_profiler_switches(tmp_path):
    c = server_command(_cfg(envs={"TP": 2, "MAX_MODEL_LEN": 4096}), 8123, tmp_path)
    assert c.argv[:3] == ["vllm", "serve", "org/m"] and "--tensor-parallel-size" in c.argv
    assert c.argv[c.argv.index("--max-model-len") + 1] == "4096"
    prof = c.argv[c.argv.index("--profiler-config") + 1]
    assert '"torch_profiler_dir": "%s"' % tmp_path in prof and '"profiler": "torch"' in prof
    assert "--profiler-config" not in server_command(_cfg(), 8123).argv
    s = server_command(_cfg(framework="sglang"), 9000, tmp_path)
    assert s.argv[1:3] == ["-m", "sglang.launch_server"] and s.env["SGLANG_TORCH_PROFILER_DIR"] == str(tmp_path)
    a = server_command(_cfg(framework="atom"), 9001, tmp_path)
    assert a.argv[a.argv.index("--server-port") + 1] == "9001" and "--torch-profiler-dir" in a.argv
    b = server_command(BenchmarkConfig.model_validate({"framework": "builtin", "server_args": ["--seed", "3"]}), 9002)
    assert b.argv[1:3] == ["-m", "engine.serve"] and b.argv[-2:] == ["--seed", "3"]
    assert b.base_url == "http://127.0.0.1:9002"


def test_builtin_server_starts_serves_and_stops_its_group(tmp_path):
    cfg = BenchmarkConfig.model_validate({"framework": "builtin"})
    cmd = server_command(cfg, free_port())
    with LocalServer(cmd, tmp_path / "server.log", ready_timeout_s=120) as server:
        assert server.model_id == "tiny" and server.ready_s is not None
        pid = server.proc.pid
    assert server.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert "magpie-serve ready" in (tmp_path / "server.log").read_text()


def test_a_server_that_dies_is_reported_with_its_log(tmp_path):
    from engine.bench.launch import ServerCommand
    cmd = ServerCommand([sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"], port=free_port())
    with pytest.raises(LaunchError) as info:
        LocalServer(cmd, tmp_path / "server.log", ready_timeout_s=30).start()
    assert "exited with code 3" in str(info.value) and "CUDA out of memory" in str(info.value)
    hang = ServerCommand([sys.executable, "-c", "import time; time.sleep(60)"], port=free_port())
    server = LocalServer(hang, tmp_path / "hang.log", ready_timeout_s=1.5)
    with pytest.raises(LaunchError, match="not ready after"):
        server.start()
    assert server.proc.poll() is not None  # the half-started server was stopped


def test_a_server_outlives_no_driver_killed_outright(tmp_path):
    # SIGKILL leaves the driver no time to stop its server: the process-group watchdog must.
    import signal
    import subprocess
    import time
    driver = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from engine.bench.launch import LocalServer, ServerCommand, free_port\n"
        "cmd = ServerCommand([sys.executable, '-c', 'import time; time.sleep(60)'], port=free_port())\n"
        f"server = LocalServer(cmd, Path({str(tmp_path / 'server.log')!r}), ready_timeout_s=60)\n"
        "threading.Thread(target=server.start, daemon=True).start()\n"
        "deadline = time.monotonic() + 20\n"
        "while server.proc is None and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
        "time.sleep(0.3)\n"  # the launcher registers the group right after it starts
        "print(server.proc.pid, flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    pid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        pytest.fail("the server's process group outlived its killed driver")
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the group this test's driver started, if it is still there
        except ProcessLookupError:
            pass


def test_a_process_the_server_detaches_with_setsid_is_stopped_with_it(tmp_path):
    """fork, setsid, fork: the grandchild is in no group the run started; it goes with the server."""
    import time
    from engine.bench.launch import ServerCommand
    pid_file = tmp_path / "detached"
    detach = ("import os, sys, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              f"        open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)\n"
              "    os._exit(0)\n"
              "time.sleep(60)\n")
    server = LocalServer(ServerCommand([sys.executable, "-c", detach], port=free_port()), tmp_path / "s.log",
                         ready_timeout_s=2)
    with pytest.raises(LaunchError, match="not ready after"):
        server.start()  # never answers: stopped as a half-started server
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{grandchild}"), "the detached grandchild outlived its server"
    assert "outlived its parent" in (tmp_path / "s.log").read_text()

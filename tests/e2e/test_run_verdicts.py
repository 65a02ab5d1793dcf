"""A benchmark's verdict is what happened: failed requests, a server that died, a file of measured data
that could not be written: none of them is a success, each is named first, and what was measured is
kept."""

import errno
import json
import os
import signal
import threading
import time

import pytest

from bench_server import BenchServer, Script

from engine.bench import run as bench_run
from engine.config.benchmark import BenchmarkConfig
from engine.runs.process import CancelToken
from engine.runs.workspace import Workspace


def _client_cfg(url: str, n: int = 30) -> BenchmarkConfig:
    return BenchmarkConfig.model_validate({
        "framework": "vllm", "model": "m", "client": {"base_url": url, "warmup": 0, "tokenizer": "none",
                                                      "vocab_size": 1000},
        "envs": {"CONC": 3, "ISL": 8, "OSL": 4, "NUM_PROMPTS": n, "RANDOM_RANGE_RATIO": 1},
        "profiler": {"gpu_monitor": {"enabled": False}}})


def test_a_server_failing_some_requests_is_not_a_success(tmp_path):
    def script(rid: str, _body: dict) -> Script:
        return Script(tokens=4, status=500 if int(rid.rsplit("-", 1)[-1]) % 3 == 0 else 200)

    with BenchServer(script) as srv:
        code, report = bench_run.run_benchmark(_client_cfg(srv.url), Workspace(tmp_path / "run"), CancelToken(),
                                               overrides=[], warnings=[])
    assert code == 1 and report["success"] is False and report["reward_eligible"] is False
    assert report["state"] == "completed_with_errors"  # the numbers are there, the run is not a success
    f = report["failures"]
    assert f["requests"] == 10 and f["sent"] == 30 and sum(f["by_cause"].values()) == 10
    assert report["errors"][0].startswith("10 of 30 measured request(s) failed: 10 x ")
    summary = (tmp_path / "run" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("NOT A SUCCESS: 10 of 30 measured request(s) failed")
    assert report["throughput"]["completed_requests"] == 20


@pytest.mark.slow
def test_a_server_that_dies_mid_run_fails_fast_and_says_so(tmp_path, monkeypatch):
    original = bench_run.SERVER_LAUNCHERS["local"]
    killed = {}

    def launch_then_kill(run, ready_timeout, chosen):
        launched = original(run, ready_timeout, chosen)
        pid = launched.server.proc.pid

        def kill() -> None:
            time.sleep(1.5)
            killed["at"] = time.monotonic()
            os.killpg(pid, signal.SIGKILL)
        threading.Thread(target=kill, daemon=True).start()
        return launched

    monkeypatch.setitem(bench_run.SERVER_LAUNCHERS, "local", launch_then_kill)
    cfg = BenchmarkConfig.model_validate({
        "framework": "builtin", "client": {"warmup": 0, "repeats": 3},
        "envs": {"CONC": 2, "ISL": 16, "OSL": 64, "NUM_PROMPTS": 4000, "RANDOM_RANGE_RATIO": 1},
        "profiler": {"gpu_monitor": {"enabled": False}}})
    t0 = time.monotonic()
    code, report = bench_run.run_benchmark(cfg, Workspace(tmp_path / "run"), CancelToken(), overrides=[],
                                           warnings=[])
    assert code == 1 and report["success"] is False and report["state"] == "failed"
    assert report["server_exit"].startswith("the server exited with code -9 after ")
    assert report["errors"][0].startswith("the server stopped serving: the server exited with code -9")
    # fail fast: the load stopped within seconds of the death, far short of 4000 requests x 3 repeats
    assert time.monotonic() - killed["at"] < 10
    assert report["failures"]["sent"] < 4000 and report["failures"]["never_sent"] > 0
    assert len(report["repeats"] or [None]) == 1
    summary = (tmp_path / "run" / "summary.txt").read_text()
    assert summary.startswith("SERVER EXITED DURING THE RUN: the server exited with code -9")
    assert time.monotonic() - t0 < 60


def test_measured_data_that_cannot_be_written_is_named_and_the_numbers_kept(tmp_path, monkeypatch):
    real = Workspace.write_json

    def full_disk(self, name, obj):
        if name.startswith("requests/"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, name, obj)

    monkeypatch.setattr(Workspace, "write_json", full_disk)
    with BenchServer(Script(tokens=4)) as srv:
        code, report = bench_run.run_benchmark(_client_cfg(srv.url, 12), Workspace(tmp_path / "run"), CancelToken(),
                                               overrides=[], warnings=[])
    assert code == 1 and report["success"] is False and report["state"] == "completed_with_errors"
    assert report["throughput"]["completed_requests"] == 12  # the measurement is kept
    assert report["errors"][0] == (f"{tmp_path / 'run' / 'requests' / 'point0_repeat0.json'}: cannot write: "
                                   "[Errno 28] No space left on device")
    on_disk = json.loads((tmp_path / "run" / "benchmark_report.json").read_text())
    assert on_disk["errors"] == report["errors"]


def test_a_report_that_cannot_be_written_still_reaches_the_terminal(tmp_path, monkeypatch):
    from engine.jobs import BenchmarkRequest, run_request
    real = Workspace.write_json

    def full_disk(self, name, obj):
        if name == "benchmark_report.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, name, obj)

    monkeypatch.setattr(Workspace, "write_json", full_disk)
    with BenchServer(Script(tokens=4)) as srv:
        request = BenchmarkRequest(framework="vllm", flags={
            "model": "m", "base_url": srv.url, "tokenizer": "none", "vocab_size": 1000, "concurrency": 2,
            "input_len": 8, "output_len": 4, "num_prompts": 6, "warmup": 0, "range_ratio": 1.0})
        outcome = run_request(request, str(tmp_path / "out"))
    assert outcome.exit_code == 1 and outcome.report["success"] is False
    assert outcome.report["errors"][0].endswith("benchmark_report.json: cannot write the report: [Errno 28] "
                                                "No space left on device")
    assert "requests: 6 completed" in outcome.display[0]  # the numbers, from memory, on the terminal


@pytest.mark.parametrize("flags, expected", [
    (["--timeout", "0"], "--timeout 0.0: seconds allowed for each command: give a number > 0"),
    (["--timeout", "-5"], "--timeout -5.0: seconds allowed for each command: give a number > 0"),
    (["--rtol", "nan"], "--rtol nan: a tolerance is a finite number >= 0"),
    (["--atol=-1e-3"], "--atol -0.001: a tolerance is a finite number >= 0"),
    (["--seed", "999999999999999999999999"], "--seed 999999999999999999999999: seeds are integers in [0, 2**32)"),
])
def test_values_that_mean_nothing_are_configuration_errors_not_incorrect_kernels(tmp_path, flags, expected):
    from conftest import REPO, run_magpie
    proc = run_magpie("analyze", "-k", REPO / "examples" / "kernels" / "rmsnorm_pytorch" / "analyze.yaml", *flags,
                      "-o", tmp_path / "o", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_an_unknown_builtin_size_is_named_as_such(tmp_path):
    from conftest import run_magpie
    p = tmp_path / "b.yaml"
    p.write_text("benchmark:\n  framework: builtin\n  server: {size: huge}\n")
    proc = run_magpie("benchmark", "-b", p, "--dry-run", timeout=60)
    assert proc.returncode == 2
    assert f"{p}:3: benchmark.server.size: unknown built-in model size 'huge'; one of tiny, 1b, 8b" in proc.stderr


def test_a_server_that_does_not_answer_gets_one_clear_error_and_no_load(tmp_path):
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, report = bench_run.run_benchmark(_client_cfg(f"http://127.0.0.1:{port}"), Workspace(tmp_path / "run"),
                                           CancelToken(), overrides=[], warnings=[])
    assert code == 1 and report["success"] is False and report["state"] == "failed"
    assert report["errors"] == [f"the server at http://127.0.0.1:{port} does not answer (Connection refused): "
                                "nothing was sent; start it, or check --base-url"]
    assert "result" not in report or not report.get("result")


def test_a_command_printing_a_flood_keeps_head_and_tail_in_a_capped_log(tmp_path):
    import sys
    from engine.runs import process
    code = ("import sys\nsys.stdout.write('FIRST\\n')\nline = 'x' * 1023 + '\\n'\n"
            "for _ in range(40 * 1024): sys.stdout.write(line)\nsys.stdout.write('LAST\\n')\n")
    result = process.run_process([sys.executable, "-c", code], cwd=tmp_path, log_stem=tmp_path / "logs" / "flood")
    assert result.returncode == 0
    log = tmp_path / "logs" / "flood.stdout.log"
    size = log.stat().st_size
    assert size < process.LOG_HEAD_BYTES + process.LOG_TAIL_BYTES + 4096  # 40 MiB printed, 16 MiB kept
    text = log.read_text()
    assert text.startswith("FIRST\n") and text.endswith("LAST\n")
    dropped = 40 * 1024 * 1024 + 11 - process.LOG_HEAD_BYTES - process.LOG_TAIL_BYTES
    assert f"[magpie: {dropped} bytes of output left out here" in text
    assert result.stdout.endswith("LAST\n")


def test_a_load_the_machine_cannot_hold_is_refused_before_anything_starts(tmp_path):
    import resource
    from conftest import run_magpie
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    proc = run_magpie("benchmark", "builtin", "--concurrency", "100000000", "-o", tmp_path / "o", timeout=60)
    assert proc.returncode == 2 and not (tmp_path / "o").exists()
    if soft != resource.RLIM_INFINITY:
        assert (f"benchmark.envs.CONC 100000000: every in-flight request holds a socket, and a client process may "
                f"open {soft} files (ulimit -n)") in proc.stderr
    proc = run_magpie("benchmark", "builtin", "--num-prompts", "1000000000", "--input-len", "4096", timeout=60)
    assert proc.returncode == 2 and "benchmark.envs.NUM_PROMPTS 1000000000 x ISL 4096: the prompts take about" \
        in proc.stderr


def test_an_unreachable_ray_address_fails_within_seconds(tmp_path):
    import socket
    from conftest import EXAMPLES, run_magpie
    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = run_magpie("-e", "ray", "--ray-address", f"127.0.0.1:{port}", "compare", "-k",
                      EXAMPLES / "softmax_triton" / "compare.yaml", "-o", tmp_path, timeout=120)
    assert time.monotonic() - t0 < 30  # Ray itself retried an unreachable head for minutes
    assert proc.returncode != 0
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused" in proc.stdout + proc.stderr

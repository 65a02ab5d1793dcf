"""Several client processes sharing one load (`--client-procs N`): real child processes against a
real streaming server on 127.0.0.1, their results merged as one client's. The server stamps each
chunk with `perf_counter()`, the clock every client process stamps with too, so a child's times can
be checked against the server's directly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bench_server import BenchServer, Script
from conftest import REPO, only_workspace, read_events, run_magpie
from engine.bench.client_procs import ClientPool, ClientProcessError
from engine.bench.dataset import SampleRequest
from engine.bench.loadgen import LoadGenConfig, arrival_offsets


def _reqs(n: int, out_len: int = 4) -> list[SampleRequest]:
    return [SampleRequest(prompt=[1, 2, 3], prompt_len=3, output_len=out_len, request_id=str(i)) for i in range(n)]


def _cfg(srv: BenchServer, **kw) -> LoadGenConfig:
    return LoadGenConfig(base_url=srv.url, model="m", **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (its parent has not reaped it yet).
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_concurrency_mode_merges_the_processes_into_one_client(tmp_path):
    # C=5 over 3 processes: shares 2, 2, 1; 30 requests; every chunk 10 ms apart after a 40 ms TTFT.
    with BenchServer(Script(ttft_s=0.04, itl_s=0.01, tokens=4)) as srv:
        pool = ClientPool(_cfg(srv, max_concurrency=5, num_warmups=4), _reqs(30), 3, log_dir=tmp_path)
        res = pool.run()
        stamps, ids = dict(srv.stamps), [rid for rid, _ in srv.arrivals]
        assert srv.max_in_flight == 5  # the shares add up to the one cap, never above it
    assert [o.request_id for o in res.outputs] == [str(i) for i in range(30)]  # one client's order
    assert all(o.success and o.output_tokens == 4 for o in res.outputs)
    assert sorted(ids) == sorted([str(i) for i in range(30)] + [f"warmup-{i}" for i in range(4)])  # no id twice
    assert len(res.warmup_outputs) == 4 and not res.cancelled
    # One clock: each child's first-token time is the server's write of that chunk, plus the read.
    lags = [o.start_time + o.ttft - stamps[o.request_id][0] for o in res.outputs]
    assert 0 < min(lags) and float(np.median(lags)) < 0.02
    # Every request was released at or after the common start, and the duration runs from it.
    assert pool.measure_start is not None
    assert min(o.start_time for o in res.outputs) >= pool.measure_start
    end = max(o.start_time + o.latency for o in res.outputs)
    assert res.duration_s == pytest.approx(end - pool.measure_start, abs=0.05)
    m = res.metrics()
    assert (m.completed, m.failed, m.total_output) == (30, 0, 120)
    assert 40 <= m.median_ttft_ms < 60 and 9 <= m.median_itl_ms < 15
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client_proc0.log", "client_proc1.log", "client_proc2.log"]
    assert not any(_alive(pid) for pid in pool.pids)


def test_request_rate_mode_follows_one_schedule_across_processes(tmp_path):
    n, rate = 24, 40.0
    with BenchServer(Script(tokens=2, itl_s=0.005)) as srv:
        pool = ClientPool(_cfg(srv, max_concurrency=8, request_rate=rate, seed=3), _reqs(n), 2, log_dir=tmp_path)
        res = pool.run()
    assert [o.request_id for o in res.outputs] == [str(i) for i in range(n)]
    assert all(o.success for o in res.outputs)
    # Request i left (its start) at the i-th time of seed 3's schedule for all n, whichever process sent it.
    released = np.array([o.start_time - pool.measure_start for o in res.outputs])
    planned = np.array(arrival_offsets(n, rate, 1.0, seed=3))
    other = np.array(arrival_offsets(n, rate, 1.0, seed=4))
    late = released - planned
    assert late.min() > -0.001 and float(np.median(late)) < 0.02
    assert float(np.median(np.abs(released - other))) > float(np.median(np.abs(late)))
    assert res.duration_s >= n / rate


def test_duration_mode_each_process_runs_its_share_for_the_window(tmp_path):
    with BenchServer(Script(tokens=3, itl_s=0.01)) as srv:
        pool = ClientPool(_cfg(srv, max_concurrency=4, duration_s=1.0, warmup_s=0.2, cooldown_s=0.2), _reqs(5), 2,
                          log_dir=tmp_path)
        res = pool.run()
        ids = [rid for rid, _ in srv.arrivals]
        assert srv.max_in_flight == 4
    assert len(ids) == len(set(ids))  # each process names its own requests (c0-d..., c1-d...)
    assert {rid.split("-")[0] for rid in ids} == {"c0", "c1"}
    assert res.window == (0.2, 0.8) and res.duration_s == pytest.approx(0.6)
    assert res.outputs and all(o.success for o in res.outputs) and res.excluded > 0
    lo, hi = pool.measure_start + 0.2, pool.measure_start + 0.8
    assert all(lo <= o.start_time <= hi for o in res.outputs)
    assert [o.start_time for o in res.outputs] == sorted(o.start_time for o in res.outputs)


def test_a_killed_process_fails_the_run_and_the_others_are_stopped(tmp_path):
    with BenchServer(Script(ttft_s=0.05, itl_s=0.05, tokens=200)) as srv:
        pool = ClientPool(_cfg(srv, max_concurrency=4), _reqs(8, out_len=200), 2, log_dir=tmp_path)

        def kill_when_streaming() -> None:
            while len(srv.stamps) < 2:
                time.sleep(0.01)
            os.kill(pool.pids[1], signal.SIGKILL)

        threading.Thread(target=kill_when_streaming, daemon=True).start()
        t = time.perf_counter()
        with pytest.raises(ClientProcessError, match=r"client process 2 of 2 \(pid \d+\) was killed by signal 9"):
            pool.run()
        assert time.perf_counter() - t < 8  # not a hang: the 200-token streams would last 10 s
    assert not any(_alive(pid) for pid in pool.pids)


def test_cancel_stops_every_process_and_keeps_what_was_released(tmp_path):
    with BenchServer(Script(itl_s=0.05, tokens=200)) as srv:
        pool = ClientPool(_cfg(srv, max_concurrency=4), _reqs(8, out_len=200), 2, log_dir=tmp_path)

        def cancel_when_streaming() -> None:
            while len(srv.stamps) < 4:
                time.sleep(0.01)
            pool.cancel()

        threading.Thread(target=cancel_when_streaming, daemon=True).start()
        res = pool.run()
    assert res.cancelled and res.outputs and all(not o.success for o in res.outputs)
    assert {o.error for o in res.outputs} <= {"cancelled", "cancelled before sending"}
    assert not any(_alive(pid) for pid in pool.pids)


def test_pool_refuses_more_processes_than_the_concurrency(tmp_path):
    with pytest.raises(ValueError, match="client processes must be >= 1"):
        ClientPool(LoadGenConfig(base_url="http://x", model="m", max_concurrency=4), _reqs(2), 0, log_dir=tmp_path)
    with pytest.raises(ValueError, match="3 client processes need a max concurrency of at least 3"):
        ClientPool(LoadGenConfig(base_url="http://x", model="m", max_concurrency=2), _reqs(2), 3, log_dir=tmp_path)


# ---- through the command line -------------------------------------------------------------------

_BASE = ("benchmark", "vllm", "-m", "test-model", "--tokenizer", "none", "--vocab-size", "1000", "--input-len", "8",
         "--output-len", "4", "--range-ratio", "1", "--warmup", "2")


def test_cli_client_procs_writes_one_report(tmp_path):
    with BenchServer(Script(ttft_s=0.02, itl_s=0.005, tokens=4)) as srv:
        proc = run_magpie(*_BASE, "--base-url", srv.url, "--concurrency", "4", "--num-prompts", "12",
                          "--client-procs", "2", "-o", tmp_path, timeout=120)
        assert srv.max_in_flight <= 4
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = only_workspace(tmp_path)
    r = json.loads((ws / "benchmark_report.json").read_text())
    assert r["success"] and r["environment"]["client_procs"] == 2
    assert r["throughput"]["completed_requests"] == 12 and r["throughput"]["total_output_tokens"] == 48
    assert {"field": "benchmark.client.client_procs", "yaml": 1, "cli": 2, "flag": "--client-procs"} in r["overrides"]
    detail = json.loads((ws / "requests" / "point0_repeat0.json").read_text())
    assert len(detail["ttfts"]) == 12 and all(t >= 0.02 for t in detail["ttfts"])
    assert (ws / "logs" / "client_proc0.log").exists() and (ws / "logs" / "client_proc1.log").exists()
    # Live progress is summed from the processes' counts: the last event has all 12.
    last = [e for e in read_events(ws) if e["event"] == "progress"][-1]
    assert (last["phase"], last["done"], last["total"], last["completed"], last["failed"]) == ("measure", 12, 12, 12, 0)
    assert last["ttft_p50_ms"] >= 20


@pytest.mark.parametrize("flags, message", [
    (("--client-procs", "0", "--concurrency", "4"), "client.client_procs: Input should be greater than or equal to 1"),
    (("--client-procs", "5", "--concurrency", "4"), "client.client_procs 5 (--client-procs) is above the "
                                                    "concurrency 4"),
    (("--client-procs", "3", "--sweep", "concurrency=2,8"), "above the concurrency 2 of client.sweep.concurrency"),
])
def test_cli_bad_client_procs_stop_before_anything_starts(tmp_path, flags, message):
    proc = run_magpie(*_BASE, "--base-url", "http://127.0.0.1:9", *flags, "-o", tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir())  # nothing started, no workspace


def _pool_children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            cmdline = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"engine.bench.client_procs" in cmdline:
            out.append(int(p.name))
    return out


def _start_cli(tmp_path: Path, url: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *_BASE, "--base-url", url, "--concurrency", "4",
                             "--num-prompts", "8", "--client-procs", "2", "-o", str(tmp_path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _streaming_children(cli: subprocess.Popen, srv: BenchServer) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = _pool_children(cli.pid)
        measured = [rid for rid in srv.stamps if not rid.startswith("warmup-")]
        if len(kids) == 2 and len(measured) >= 2:
            return kids
        assert cli.poll() is None, cli.communicate()
        time.sleep(0.02)
    raise AssertionError("the client processes never streamed")


def _long_measured(rid: str, _body: dict) -> Script:
    # 200 tokens for a measured request: 10 s, if the run waited for it; the warm-ups are short.
    return Script(itl_s=0.05, tokens=4 if rid.startswith("warmup-") else 200)


def test_cli_a_crashed_client_process_fails_the_run_with_a_report(tmp_path):
    with BenchServer(_long_measured) as srv:
        cli = _start_cli(tmp_path, srv.url)
        kids = _streaming_children(cli, srv)
        os.kill(kids[0], signal.SIGKILL)
        t = time.monotonic()
        out, err = cli.communicate(timeout=30)
        assert time.monotonic() - t < 6  # the other process was cancelled, not waited for (10 s of streams)
    assert cli.returncode == 1, out + err
    r = json.loads((only_workspace(tmp_path) / "benchmark_report.json").read_text())
    assert r["state"] == "failed" and not r["success"]
    assert any("was killed by signal 9" in e for e in r["errors"]), r["errors"]
    assert "Traceback" not in err
    assert not any(_alive(pid) for pid in kids)


def test_cli_sigint_cancels_the_client_processes(tmp_path):
    with BenchServer(_long_measured) as srv:
        cli = _start_cli(tmp_path, srv.url)
        kids = _streaming_children(cli, srv)
        cli.send_signal(signal.SIGINT)
        t = time.monotonic()
        out, err = cli.communicate(timeout=30)
        assert time.monotonic() - t < 6  # both processes cancelled, not waited for (10 s of streams)
    assert cli.returncode == 130, out + err
    r = json.loads((only_workspace(tmp_path) / "benchmark_report.json").read_text())
    assert r["state"] == "cancelled"
    assert not any(_alive(pid) for pid in kids)

"""Servers behind a registry by run_mode (engine/bench/run.py): a launcher returns a started
server (model_id, ready_s, base_url, stop), run_benchmark drives the load at it, records it in
the report and stops it, whichever way it ended."""

from __future__ import annotations

import json

import pytest

from engine.bench import run as bench_run
from engine.bench.launch import LaunchError, LocalServer, Server, ServerCommand
from engine.config.benchmark import load_benchmark_config
from engine.runs.process import CancelToken
from engine.runs.workspace import Workspace


class FakeServer:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.model_id = "served-model"
        self.ready_s = 0.25
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


def _cfg(tmp_path, run_mode: str):
    p = tmp_path / "bench.yaml"
    p.write_text(f"benchmark:\n  framework: vllm\n  model: test-model\n  run_mode: {run_mode}\n"
                 "  gpu_selection: {auto: false}\n"
                 "  envs: {conc: 2, isl: 8, osl: 4, num_prompts: 4, random_range_ratio: 1}\n")
    cfg, _ = load_benchmark_config(p)
    return cfg


def test_both_run_modes_are_registered():
    assert set(bench_run.SERVER_LAUNCHERS) == {"local", "docker"}
    assert isinstance(FakeServer("http://x"), Server)  # the protocol is structural
    assert LocalServer(ServerCommand(["x"], port=1234), log_path=None).base_url == "http://127.0.0.1:1234"


@pytest.mark.parametrize("run_mode", ["local", "docker"])
def test_a_registered_launcher_serves_the_run(tmp_path, monkeypatch, run_mode):
    from bench_server import BenchServer, Script
    seen = {}
    with BenchServer(Script(tokens=4)) as srv:
        fake = FakeServer(srv.url)

        def launcher(run, ready_timeout, chosen):
            seen.update(ready_timeout=ready_timeout, chosen=chosen, trace_dir=run.trace_dir)
            return bench_run.Launched(fake, ServerCommand(["serve", "it"], {"A": "1"}), {"where": run_mode})

        monkeypatch.setitem(bench_run.SERVER_LAUNCHERS, run_mode, launcher)
        ws = Workspace(tmp_path / "run")
        code, report = bench_run.run_benchmark(_cfg(tmp_path, run_mode), ws, CancelToken(), overrides=[],
                                               warnings=[])
    assert code == 0, report["errors"]
    assert fake.stopped == 1
    assert seen["chosen"] == [] and seen["trace_dir"] is None and seen["ready_timeout"] > 0
    assert report["server"] == {"base_url": srv.url, "launched": True, "run_mode": run_mode, "run_mode_why": "given",
                                "argv": ["serve", "it"],
                                "env": {"A": "1"}, "ready_s": 0.25, "log": str(ws.path("server.log")),
                                "where": run_mode}
    assert report["state"] == "completed" and report["throughput"]["completed_requests"] == 4
    on_disk = json.loads(ws.path("benchmark_report.json").read_text())
    assert on_disk["server"]["run_mode"] == run_mode
    events = [json.loads(line) for line in ws.path("events.jsonl").read_text().splitlines()]
    server_states = [e["state"] for e in events if e.get("stage") == "server"]
    assert server_states == ["SUCCESS", "stopping"]


def test_a_launcher_that_fails_is_reported_and_nothing_is_left_to_stop(tmp_path, monkeypatch):
    def launcher(run, ready_timeout, chosen):
        raise LaunchError("the server was not ready after 1 s (log: server.log)")

    monkeypatch.setitem(bench_run.SERVER_LAUNCHERS, "docker", launcher)
    code, report = bench_run.run_benchmark(_cfg(tmp_path, "docker"), Workspace(tmp_path / "run"), CancelToken(),
                                           overrides=[], warnings=[])
    assert code == 1 and report["state"] == "failed"
    assert report["errors"] == ["the server was not ready after 1 s (log: server.log)"]
    assert "server" not in report


def test_a_server_is_stopped_if_recording_it_fails(tmp_path, monkeypatch):
    fake = FakeServer("http://127.0.0.1:1")
    monkeypatch.setitem(bench_run.SERVER_LAUNCHERS, "local",
                        lambda run, t, chosen: bench_run.Launched(fake, ServerCommand(["x"])))
    ws = Workspace(tmp_path / "run")
    run = bench_run.BenchRun(_cfg(tmp_path, "local"), ws, CancelToken(), {}, [], lambda s: None, {}, None)

    def broken_emit(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ws.events, "emit", broken_emit)
    with pytest.raises(OSError, match="disk full"):
        bench_run._start_server(run, [])
    assert fake.stopped == 1

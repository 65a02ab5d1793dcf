"""magpie optimize: the loop's first three steps on the built-in tiny CPU server, through the real CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, read_events, run_magpie

from engine.loop.run import config_diff, profiled_twin
from engine.loop.schema import NOT_IMPLEMENTED, STEP_NAMES, load_loop_file

CLEAN = """\
benchmark:
  framework: builtin
  run_mode: local
  server:
    size: tiny
    max_batch: 16
  envs:
    CONC: 2
    ISL: 16
    OSL: 6
    RANDOM_RANGE_RATIO: 0.0
    NUM_PROMPTS: 4
  client:
    warmup: 1
    repeats: 1
"""


def _clean(tmp_path: Path) -> Path:
    p = tmp_path / "clean.yaml"
    p.write_text(CLEAN)
    return p


def _loop_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir() and p.name.startswith("loop_")]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.mark.slow
def test_until_bottlenecks_and_status(tmp_path):
    out = tmp_path / "results"
    proc = run_magpie("optimize", "-b", _clean(tmp_path), "-o", out, "--until", "bottlenecks", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = _loop_dir(out)
    loop = load_loop_file(root)
    assert loop.schema_version == 1 and [s.name for s in loop.steps] == list(STEP_NAMES)
    states = {s.name: s.state for s in loop.steps}
    assert states["baseline"] == states["profiled"] == states["bottlenecks"] == "done"
    assert all(s.state == "pending" and s.reason == NOT_IMPLEMENTED for s in loop.steps[3:])
    base = loop.step("baseline")
    assert base.result["repeats"] == 3
    assert {"field": "benchmark.client.repeats", "yaml": 1, "cli": 3,
            "flag": "magpie optimize (at least 3 repeats)"} in loop.overrides
    report = json.loads((root / base.result["report"]).read_text())
    assert report["state"] == "completed" and len(report["repeats"]["output_throughput"]["values"]) == 3
    assert (root / base.run_dir).parent == root / "baseline"
    diff = {d["field"]: (d["clean"], d["profiled"]) for d in loop.step("profiled").result["config_diff"]}
    assert diff["benchmark.profiler.torch_profiler.enabled"] == (False, True)
    assert diff["benchmark.profiler.tracelens.enabled"] == (False, True)
    assert diff["benchmark.gap_analysis.enabled"] == (False, True)
    assert not [f for f in diff if f.startswith("benchmark.envs") or f.startswith("benchmark.server")]
    table = json.loads((root / "bottlenecks" / "bottlenecks.json").read_text())
    assert table["device"] == "cpu" and table["annotated"]
    rows = table["stages"]["all"]["rows"]
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows == sorted(rows, key=lambda r: -r["time_us"])
    replaceable = {r["registry_op"] for r in rows if r["replaceable"]}
    assert replaceable == {"rmsnorm", "activation", "rotary", "attention"}
    assert all(r["mapping"]["confidence"] == "high" and r["calls"] > 0 for r in rows if r["replaceable"])
    assert any(not r["replaceable"] and r["name"] == "aten::linear" for r in rows)
    assert {"decode_only", "prefill_only"} <= set(table["stages"])
    events = read_events(root)
    assert events[0]["event"] == "run_started" and events[0]["mode"] == "loop"
    assert events[-1]["event"] == "run_finished" and events[-1]["state"] == "completed"
    status = run_magpie("optimize", "--status", root, timeout=60)
    assert status.returncode == 0, status.stderr
    for i, name in enumerate(STEP_NAMES, 1):
        assert f"{i}. {name}" in status.stdout
    assert "top replaceable:" in status.stdout and NOT_IMPLEMENTED in status.stdout


def _kill_servers_under(folder: Path) -> None:
    """The benchmark's server runs in a session of its own: after a SIGKILL of the loop it is
    orphaned; end the ones this test started (their command line names the test's folder)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmd and "engine.serve" in cmd:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_resume_after_kill_during_profiled(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "optimize", "-b", str(_clean(tmp_path)), "-o", str(out),
                             "--until", "bottlenecks"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if out.is_dir() and any((p / "profiled").is_dir() for p in out.iterdir()):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the loop ended before its profiled step started"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_servers_under(tmp_path)
    root = _loop_dir(out)
    loop = load_loop_file(root)
    assert loop.step("baseline").state == "done"
    prof = loop.step("profiled")
    assert prof.state == "running" and prof.pid == proc.pid
    status = run_magpie("optimize", "--status", root, timeout=60)
    assert f"process {proc.pid} is gone" in status.stdout
    baseline_before = loop.step("baseline").model_dump()
    resumed = run_magpie("optimize", "--resume", root, "--until", "bottlenecks", timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    loop = load_loop_file(root)
    assert loop.step("baseline").model_dump() == baseline_before  # not redone
    assert len(list((root / "baseline").iterdir())) == 1
    assert loop.step("profiled").state == "done" and loop.step("profiled").attempts == 2
    assert loop.step("bottlenecks").state == "done"
    events = read_events(root)
    assert [e["event"] for e in events].count("run_started") == 2 and events[-1]["state"] == "completed"


def test_profiled_twin_changes_only_the_profiler():
    import yaml
    raw = yaml.safe_load(CLEAN)
    twin = profiled_twin(raw)
    assert raw == yaml.safe_load(CLEAN)  # the clean config is not touched
    fields = {d["field"] for d in config_diff(raw["benchmark"], twin["benchmark"])}
    assert fields == {"benchmark.profiler.torch_profiler.enabled", "benchmark.profiler.torch_profiler.num_steps",
                      "benchmark.profiler.tracelens.enabled", "benchmark.profiler.tracelens.analysis_mode",
                      "benchmark.profiler.tracelens.analysis_stages", "benchmark.profiler.tracelens.export_format",
                      "benchmark.gap_analysis.enabled"}  # repeats: already 1 here


def test_optimize_errors(tmp_path):
    proc = run_magpie("optimize", timeout=60)
    assert proc.returncode == 2 and "give -b CLEAN.yaml" in proc.stderr
    proc = run_magpie("optimize", "-b", _clean(tmp_path), "--until", "nope", "-o", tmp_path / "r", timeout=60)
    assert proc.returncode == 2 and "--until nope" in proc.stderr
    assert not (tmp_path / "r").exists()
    proc = run_magpie("optimize", "--status", tmp_path, timeout=60)
    assert proc.returncode == 1 and "loop.json" in proc.stderr

"""The run catalog and the detached launcher: real run folders, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config.yamlfile import ConfigError
from engine.runs.catalog import CancelRefused, RunCatalog, cancel_run, parse_run_name
from engine.runs.process import process_identity
from engine.jobs.api import submit
from engine.jobs.launch import command_line, effective_config, find_console_log, form_request, launch_cwd
from engine.jobs.query import check_config
from engine.runs.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]
SOFTMAX = REPO / "examples" / "kernels" / "softmax_triton" / "compare.yaml"
BENCH_CPU = REPO / "examples" / "benchmarks" / "builtin_tiny_cpu_profiled.yaml"


def test_catalog_follows_a_run_as_it_writes_events(tmp_path):
    ws = Workspace.create(tmp_path, "compare", "softmax")
    cat = RunCatalog([tmp_path])
    changed = cat.refresh()
    assert [r.path for r in changed] == [ws.root]
    info = changed[0]
    assert (info.mode, info.label, info.state) == ("compare", "softmax", "pending")
    ws.events.emit("run_started", mode="compare", pid=os.getpid(), workspace=str(ws.root), label="softmax")
    ws.events.emit("stage", kernel="one_pass", stage="correctness", state="running")
    ws.events.emit("progress", phase="timing", done=3, total=10)
    assert cat.refresh() == [info]
    assert info.state == "running" and info.pid == os.getpid()
    assert (info.done, info.total, info.progress_text) == (3, 10, "3/10")
    assert cat.refresh() == []  # nothing new: nothing reported
    ws.write_json("compare_report.json", {"ok": True})
    ws.events.emit("run_finished", state="completed", exit_code=0, report="compare_report.json")
    cat.refresh()
    assert info.state == "completed" and info.exit_code == 0 and info.is_finished
    assert info.report_path == ws.root / "compare_report.json"
    assert info.elapsed() >= 0


def test_a_live_benchmark_shows_its_running_numbers(tmp_path):
    ws = Workspace.create(tmp_path, "benchmark", "builtin-tiny")
    cat = RunCatalog([tmp_path])
    ws.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(ws.root))
    ws.events.emit("progress", phase="measure", done=32, total=60, completed=30, failed=2, output_tok_s=12345.0,
                   ttft_p50_ms=41.7, tpot_p50_ms=2.21)
    info = cat.refresh()[0]
    assert info.progress_text == "32/60 · 2 failed · 12.3k tok/s · TTFT 41.7 ms · TPOT 2.21 ms"
    ws.events.emit("progress", phase="warmup", done=1, total=2)  # the next repeat's warm-up: no numbers yet
    cat.refresh()
    assert info.progress_text == "1/2"


def test_half_written_line_waits_for_its_end(tmp_path):
    run = tmp_path / "benchmark_x_20260101_000000_abc123"
    run.mkdir()
    events = run / "events.jsonl"
    line = json.dumps({"ts": 1.0, "event": "run_started", "mode": "benchmark", **process_identity()})
    events.write_text(line[:20])
    cat = RunCatalog([tmp_path])
    cat.refresh()
    info = cat.runs[run]
    assert info.state == "pending" and info.events_read == 0
    with open(events, "a") as fh:
        fh.write(line[20:] + "\nnot json\n")
    cat.refresh()
    assert info.state == "running" and info.events_read == 1


def test_run_whose_process_died_is_lost(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ws = Workspace.create(tmp_path, "benchmark", "gone")
    ws.events.emit("run_started", mode="benchmark", pid=dead.pid, workspace=str(ws.root))
    cat = RunCatalog([tmp_path])
    cat.refresh()
    info = cat.runs[ws.root]
    assert info.state == "lost" and str(dead.pid) in info.error
    with pytest.raises(CancelRefused, match="already finished"):
        cancel_run(info)


def test_cancel_refuses_a_process_that_is_not_a_run(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ws = Workspace.create(tmp_path, "analyze", "x")
        ws.events.emit("run_started", mode="analyze", pid=sleeper.pid, workspace=str(ws.root))
        cat = RunCatalog([tmp_path])
        cat.refresh()
        with pytest.raises(CancelRefused, match="not the run's process; not signalled"):
            cancel_run(cat.runs[ws.root])
        assert sleeper.poll() is None  # untouched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_parse_run_name():
    assert parse_run_name("benchmark_builtin-tiny_20261129_191509_3204ac") == ("benchmark", "builtin-tiny")
    assert parse_run_name("compare_three_pass_20261129_191525_aa7d27") == ("compare", "three_pass")
    assert parse_run_name("scratch") == ("?", "scratch")


def test_check_config_kinds_and_errors(tmp_path):
    assert check_config(SOFTMAX).kind == "kernel" and check_config(SOFTMAX).ok
    assert "compare" in check_config(SOFTMAX).modes
    assert check_config(BENCH_CPU).kind == "benchmark" and check_config(BENCH_CPU).ok
    bad = tmp_path / "bench.yaml"
    bad.write_text("benchmark:\n  framework: builtin\n  envs:\n    CONC: 4\n  clients:\n    warmup: 1\n")
    check = check_config(bad)
    assert check.kind == "benchmark" and not check.ok
    assert any(f"{bad}:5" in p and "clients" in p for p in check.problems), check.problems
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\nb: 3\n")
    check = check_config(broken)
    assert check.kind == "yaml" and check.problems and str(broken) in check.problems[0]
    assert check_config(REPO / "examples" / "kernels" / "softmax_triton" / "softmax_three_pass.py").kind == "source" \
        if (REPO / "examples" / "kernels" / "softmax_triton" / "softmax_three_pass.py").exists() else True


def test_effective_config_records_overrides(tmp_path):
    req = form_request("benchmark", BENCH_CPU, concurrency=2, profiler=False)
    cfg, overrides, _ = effective_config(req)
    fields = {o["field"]: o for o in overrides}
    assert fields["benchmark.envs.CONC"]["cli"] == "2"
    assert cfg["benchmark"]["profiler"]["torch_profiler"]["enabled"] is False
    argv = command_line(req, tmp_path)
    assert "--no-torch-profiler" in argv and "--concurrency" in argv
    req = form_request("compare", SOFTMAX, repeats=2)
    with pytest.raises(ConfigError, match="at least 3"):
        effective_config(req)
    req = form_request("compare", SOFTMAX, repeats=5, baseline="one_pass")
    cfg, overrides, _ = effective_config(req)
    assert cfg["baseline"]["id"] == "one_pass" and cfg["settings"]["repeats"] == 5


@pytest.mark.slow
def test_a_launch_that_does_not_check_out_starts_nothing(tmp_path):
    bad = tmp_path / "k.yaml"
    bad.write_text("kernels:\n  - id: a\n    sorce: missing.py\n")
    with pytest.raises(ConfigError) as err:
        req = form_request("analyze", bad)
        submit(req, tmp_path / "results", executor="local-process", cwd=launch_cwd(req))
    assert any(f"{bad}:3" in p and "sorce" in p for p in err.value.problems)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_started_run_is_detached_and_found_by_its_pid(tmp_path):
    cfg = tmp_path / "k.yaml"
    cfg.write_text("kernels:\n  - id: a\n    type: cuda\n    testcase_command: 'true'\n"
                   "  - id: b\n    type: cuda\n    testcase_command: 'true'\n")
    req = form_request("compare", cfg)
    job = submit(req, tmp_path / "results", executor="local-process", cwd=launch_cwd(req))
    started = job.execution
    try:
        assert os.getpgid(started.pid) == started.pid  # its own group: our Ctrl-C never reaches it
    except ProcessLookupError:
        pass  # already exited and reaped: the group check cannot be made
    assert started.process.wait(timeout=120) == 1  # completed; nothing to time on this machine
    assert job.run_dir is not None and job.run_dir.parent == (tmp_path / "results").resolve()
    assert find_console_log(tmp_path / "results", started.pid) == started.console_log
    assert f"workspace: {job.run_dir}" in started.console_log.read_text()
    runs = RunCatalog([tmp_path / "results"]).refresh()
    assert [r.path for r in runs] == [job.run_dir] and runs[0].state == "completed"
    assert command_line(req, tmp_path / "results")[3:5] == ["compare", "-k"]  # the equivalent command line


def test_refresh_opens_only_grown_events_files_and_the_quick_check_reads_only_live_runs(tmp_path, monkeypatch):
    import engine.runs.scan as scan
    done = Workspace.create(tmp_path, "compare", "done")
    done.events.emit("run_started", mode="compare", pid=os.getpid(), workspace=str(done.root))
    done.events.emit("run_finished", state="completed", exit_code=0)
    done.events.close()
    live = Workspace.create(tmp_path, "benchmark", "live")
    live.events.emit("run_started", mode="benchmark", pid=os.getpid(), workspace=str(live.root))
    cat = RunCatalog([tmp_path])
    assert {r.path for r in cat.refresh()} == {done.root, live.root}
    opened: list[Path] = []
    real_open = scan.open_regular
    monkeypatch.setattr(scan, "open_regular", lambda path, *a, **k: opened.append(Path(path).parent) or real_open(path, *a, **k))
    assert cat.refresh() == [] and opened == []  # nothing grew: nothing opened
    live.events.emit("progress", phase="measure", done=1, total=4)
    assert cat.refresh(finished=False) == [cat.runs[live.root]] and opened == [live.root]
    # A finished run's file that grows anyway is the full refresh's to see, never the quick check's.
    with open(done.root / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"ts": 9.0, "event": "stage", "stage": "again"}) + "\n")
    assert cat.refresh(finished=False) == [] and cat.runs[done.root].stage == ""
    assert cat.refresh() == [cat.runs[done.root]] and cat.runs[done.root].stage == "again"
    # A new run folder (the results folder's mtime moves) shows in the quick check.
    late = Workspace.create(tmp_path, "analyze", "late")
    late.events.emit("run_started", mode="analyze", pid=os.getpid(), workspace=str(late.root))
    assert [r.path for r in cat.refresh(finished=False)] == [late.root]
    live.events.close()
    late.events.close()


def test_runs_recorded_before_run_finished_carried_figures_get_them_from_their_report():
    # The example runs of 2026-11-29 ended with a bare run_finished: their numbers come from the
    # report, once, as the lists show them for every newer run.
    catalog = RunCatalog([REPO / "examples" / "runs"])
    catalog.refresh()
    runs = {info.name: info for info in catalog.runs.values()}
    sweep = runs["benchmark_builtin-tiny_20261129_192715_db9427"]
    report = json.loads((sweep.path / "benchmark_report.json").read_text())
    assert sweep.figures.completed == 10 + 10 + 20 + 20 + 40 + 40 and sweep.figures.failed == 0
    assert sweep.figures.never_sent is None  # not recorded then
    assert sweep.figures.ttft_p50_ms.mean == report["repeats"]["median_ttft_ms"]["mean"]
    assert sweep.figures.output_tok_s.ci95 == report["repeats"]["output_throughput"]["ci95"]
    repeated = runs["benchmark_builtin-tiny_20261129_192724_793ef2"]
    assert (repeated.figures.completed, repeated.figures.failed) == (24, 0)  # 3 repeats of 8
    compare = runs["compare_three_pass_20261129_191525_aa7d27"]
    assert compare.figures.winner == "one_pass" and compare.figures.baseline == "three_pass"
    assert compare.figures.verdicts == {"baseline": 1, "faster": 1, "incorrect": 1}
    assert "winner one_pass" in compare.progress_text
    # A run that recorded its own figures keeps them, unread from the report.
    gpu = runs["benchmark_builtin-1b_20261206_204557_017c5f"]
    assert gpu.figures is not None and gpu._figures_read is False

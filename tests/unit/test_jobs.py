"""The job API and the modes in-process: real kernels, a real built-in server, a real trace; a
cancel that keeps the states reached, a detached run re-attached from its folder."""

import json
import os
import pickle
import signal
import textwrap
import time
from pathlib import Path

import pytest

from engine.config.yamlfile import ConfigError
from engine.errors import MagpieError
from engine.jobs import BenchmarkRequest, KernelRequest, TraceRequest, attach, parse_request, run_request, submit
from engine.jobs.api import JOB_FILE, JobError
from engine.runs.process import CancelToken

REPO = Path(__file__).resolve().parents[2]
RMSNORM = REPO / "examples" / "kernels" / "rmsnorm_pytorch" / "compare.yaml"
SYNTHETIC = REPO / "tests" / "data" / "tracelens-golden" / "synthetic_vllm" / "synthetic_vllm.json.gz"


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def _slow_compare(tmp_path: Path, seconds: float = 30.0) -> Path:
    """A compare whose candidate's testcase sleeps: long enough to cancel mid-way."""
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(textwrap.dedent(f"""
        kernels:
          - id: base
            type: cuda
            testcase_command: "true"
            baseline: true
          - id: sleepy
            type: cuda
            testcase_command: "sleep {seconds}"
    """))
    return cfg


def test_requests_are_plain_data():
    req = KernelRequest(mode="compare", kernel_config=str(RMSNORM), repeats=5, only=["fused"])
    assert parse_request(req.to_json()) == req
    assert pickle.loads(pickle.dumps(req)) == req
    assert parse_request({"mode": "trace", "trace_dir": "/x"}) == TraceRequest(trace_dir="/x")
    with pytest.raises(ConfigError) as err:
        parse_request({"mode": "compare", "kernel_config": "k.yaml", "repeets": 3})
    assert "repeets" in str(err.value.problems)
    with pytest.raises(ConfigError):
        parse_request({"mode": "nonsense"})


def test_compare_in_process_through_the_job_api(tmp_path):
    job = submit(KernelRequest(mode="compare", kernel_config=str(RMSNORM), repeats=5), tmp_path / "out",
                 executor="in-process")
    assert job.run_dir.is_dir() and job.id == job.run_dir.name  # known before the work is done
    assert job.wait(timeout=300) == "completed"
    report = job.result()
    assert report["exit_code"] == 0 and [r["kernel_id"] for r in report["results"]["kernel_results"]] == ["eager", "fused"]
    assert job.outcome.report == report and job.outcome.exit_code == 0
    assert pickle.loads(pickle.dumps(job.outcome)).report == report  # crosses a process or a Ray task
    record = json.loads((job.run_dir / JOB_FILE).read_text())
    assert record["executor"] == "in-process" and record["mode"] == "compare" and record["pid"] == os.getpid()
    assert parse_request((job.run_dir / "request.json").read_text()).repeats == 5
    again = attach(job.run_dir)
    assert again.state() == "completed" and again.result() == report


def test_a_bad_request_fails_before_any_folder_exists(tmp_path):
    with pytest.raises(ConfigError) as err:
        submit(KernelRequest(mode="compare", kernel_config=str(RMSNORM), repeats=2), tmp_path, executor="in-process")
    assert "at least 3 repeats" in err.value.problems[0]
    with pytest.raises(ConfigError):
        submit(KernelRequest(mode="analyze", kernel_config=str(tmp_path / "missing.yaml")), tmp_path,
               executor="in-process")
    assert not any(tmp_path.iterdir())
    with pytest.raises(JobError) as err:
        submit(KernelRequest(mode="compare", kernel_config=str(RMSNORM)), tmp_path, executor="nowhere")
    assert isinstance(err.value, MagpieError) and "in-process" in err.value.hint


def test_cancel_in_process_keeps_the_states_reached(tmp_path):
    job = submit(KernelRequest(mode="compare", kernel_config=str(_slow_compare(tmp_path)), no_perf=True),
                 tmp_path / "out", executor="in-process")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # cancel while the candidate's testcase sleeps
        if any(e.get("kernel") == "sleepy" and e.get("stage") == "testcase" and e.get("state") == "running"
               for e in _events(job.run_dir)):
            break
        time.sleep(0.1)
    t0 = time.monotonic()
    job.cancel("test cancel")
    assert job.wait(timeout=60) == "cancelled"
    assert time.monotonic() - t0 < 20  # the sleeping testcase's process group was stopped
    report = job.result()
    assert report["state"] == "cancelled" and report["cancel_reason"] == "test cancel" and report["exit_code"] == 130
    by_id = {r["kernel_id"]: r for r in report["results"]["kernel_results"]}
    assert by_id["base"]["correctness_state"] == "SUCCESS" and by_id["sleepy"]["correctness_state"] == "CANCELLED"
    assert _events(job.run_dir)[-1]["event"] == "run_finished"


def test_detached_run_is_reattached_and_cancelled_from_its_folder(tmp_path):
    job = submit(KernelRequest(mode="compare", kernel_config=str(_slow_compare(tmp_path, 60)), no_perf=True),
                 tmp_path / "out", executor="local-process", cwd=tmp_path)
    assert job.pid != os.getpid() and os.getpgid(job.pid) == job.pid  # its own session and process group
    run_dir = job.run_dir
    del job  # the caller goes away; the folder and the pid are the truth
    later = attach(run_dir)
    deadline = time.monotonic() + 120
    while later.state() in ("pending", "running") and time.monotonic() < deadline:
        if any(e.get("kernel") == "sleepy" and e.get("stage") == "testcase" for e in _events(run_dir)):
            break
        time.sleep(0.1)
    assert later.state() == "running" and later.progress().state == "running"
    later.cancel()  # SIGTERM to the run's own process
    assert later.wait(timeout=60) == "cancelled"
    assert later.result()["state"] == "cancelled"
    console = list((run_dir.parent / ".console").glob(f"*_{later.pid}.log"))
    assert console and "workspace:" in console[0].read_text()


def test_a_cancel_sent_while_the_child_starts_still_ends_in_a_report(tmp_path):
    # The SIGTERM reaches the child before its interpreter has imported anything: the signal is
    # held until its handlers are in, so it cancels with a report instead of dying without one.
    job = submit(KernelRequest(mode="compare", kernel_config=str(_slow_compare(tmp_path, 60)), no_perf=True),
                 tmp_path / "out", executor="local-process", cwd=tmp_path)
    job.cancel("at once")
    assert job.wait(timeout=60) == "cancelled"
    assert job.result()["state"] == "cancelled"


def test_a_detached_run_that_dies_is_lost_not_running(tmp_path):
    # A short sleep: SIGKILL gives the run no chance to stop its testcase's own process group,
    # which then ends by itself.
    job = submit(KernelRequest(mode="compare", kernel_config=str(_slow_compare(tmp_path, 5)), no_perf=True),
                 tmp_path / "out", executor="local-process", cwd=tmp_path)
    deadline = time.monotonic() + 60
    while job.state() == "pending" and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # no handler runs: nothing gets to say it finished
    job.execution.wait(30)
    assert attach(job.run_dir).state() == "lost"


def test_a_request_that_no_longer_checks_out_ends_failed(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(RMSNORM.read_text())
    for name in ("rmsnorm_eager.py", "rmsnorm_fused.py"):
        (tmp_path / name).write_text((RMSNORM.parent / name).read_text())
    from engine.jobs.api import LocalProcessExecutor
    from engine.jobs.modes import workspace_for
    req = KernelRequest(mode="compare", kernel_config=str(cfg), no_perf=True)
    ws = workspace_for(req.prepare(), tmp_path / "out")
    ws.events.close()
    (ws.root / "request.json").write_text(req.to_json())
    cfg.write_text("kernels: [oops")  # changed between submit and start
    ex = LocalProcessExecutor(cwd=tmp_path).start(req, ws.root, "request.json", None)
    assert ex.wait(120) == 1
    job = attach(ws.root)
    assert job.state() == "failed"
    assert "configuration problem" in _events(ws.root)[-1]["error"]


def test_benchmark_and_trace_modes_in_process(tmp_path):
    req = BenchmarkRequest(framework="builtin", flags={"concurrency": 2, "input_len": 16, "output_len": 4,
                                                       "num_prompts": 4, "range_ratio": 1.0})
    out = run_request(req, tmp_path / "bench", cancel=CancelToken())
    assert out.exit_code == 0 and out.state == "completed" and out.report["throughput"]["completed_requests"] == 4
    assert out.workspace.name.startswith("benchmark_builtin-tiny_")
    assert parse_request((out.workspace / "request.json").read_text()) == req
    ev = _events(out.workspace)
    assert ev[0]["event"] == "run_started" and ev[-1] == {**ev[-1], "event": "run_finished", "state": "completed"}

    trace = run_request(TraceRequest(trace_dir=str(SYNTHETIC), top_k=3), tmp_path / "trace")
    assert trace.exit_code == 0 and trace.workspace.name.startswith("trace_synthetic_vllm_")
    assert len(trace.report["gap_analysis"]["top_kernels"]) == 3
    with pytest.raises(ConfigError):
        run_request(TraceRequest(trace_dir=str(SYNTHETIC), top_k=0), tmp_path / "trace")


def test_analyze_in_process_with_an_event_listener(tmp_path):
    seen = []
    out = run_request(KernelRequest(mode="analyze", kernel_config=str(RMSNORM.parent / "analyze.yaml"), no_perf=True),
                      tmp_path, sink=seen.append)
    assert out.exit_code == 0 and out.state == "completed" and out.report_name == "analyze_report.json"
    assert seen[0]["event"] == "run_started" and seen[-1]["event"] == "run_finished"
    assert [e["event"] for e in seen] == [e["event"] for e in _events(out.workspace)]
    assert any("workspace:" in str(d) for d in out.display)


def test_a_repeat_cut_by_a_cancel_is_named_and_left_out(tmp_path):
    # 8 requests a repeat at 4 a second: each repeat takes about 2 s; the cancel lands in repeat 2.
    req = BenchmarkRequest(framework="builtin", flags={"concurrency": 2, "input_len": 16, "output_len": 4,
                                                       "num_prompts": 8, "range_ratio": 1.0, "request_rate": 4.0,
                                                       "repeats": 3, "warmup": 1})
    job = submit(req, tmp_path / "out", executor="in-process")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(e.get("event") == "progress" and e.get("repeat") == 1 and (e.get("done") or 0) >= 1
               for e in _events(job.run_dir)):
            break
        time.sleep(0.05)
    job.cancel("test cancel")
    assert job.wait(timeout=60) == "cancelled"
    report = job.result()
    assert report["repeats"] is None or report["repeats"]["output_throughput"]["n"] == 1
    [cut] = report["repeats_cut"]
    assert (cut["repeat"], cut["repeats"], cut["why"]) == (2, 3, "the cancel") and cut["completed"] < 8
    assert report["failures"]["sent"] == 8  # repeat 1's requests: the cut repeat's are not counted
    from engine.runs.catalog import RunCatalog
    catalog = RunCatalog([tmp_path / "out"])
    catalog.refresh()
    [info] = catalog.runs.values()
    assert "cancelled at 8/8 completed" in info.progress_text
    assert "repeat 2 of 3 cut short, left out" in info.progress_text
    from engine.runs.schema import load_report

    from magpie_tui.screens.reports import bench_state
    state = bench_state(load_report(job.run_dir / "benchmark_report.json"))
    assert state.startswith("CANCELLED at 8") and "repeat 2 of 3 cut short after" in state, state

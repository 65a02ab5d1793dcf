"""The one run state (engine.runs.state) against real runs: what the workbench's header and list,
the job API and MCP show must be what the run's report says."""

from __future__ import annotations

import json
import os
import threading
import time

from bench_server import BenchServer, Script

from engine.jobs import BenchmarkRequest, run_request
from engine.runs.catalog import RunCatalog, RunInfo
from engine.runs.process import CancelToken
from engine.runs.workspace import Workspace


def _events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_a_cancelled_benchmark_counts_never_sent_requests_apart(tmp_path):
    """Cancelled at ~100 of 600 requests (four in flight, the rest queued): the state says how
    many completed and how many were never sent, as the report does; never ``600/600 · N failed``
    (the queued requests the cancel ends as failed), neither at the end nor during the cancel.
    Each request takes ~80 ms (the whole run ~12 s): a poll late on a busy machine still cancels it
    long before its end."""
    token = CancelToken()
    with BenchServer(Script(tokens=4, itl_s=0.02)) as srv:
        request = BenchmarkRequest(framework="vllm", flags={
            "model": "m", "base_url": srv.url, "tokenizer": "none", "vocab_size": 1000, "concurrency": 4,
            "input_len": 8, "output_len": 4, "num_prompts": 600, "warmup": 0, "range_ratio": 1.0})
        outcome: list = []
        worker = threading.Thread(target=lambda: outcome.append(run_request(request, str(tmp_path / "out"),
                                                                           cancel=token)))
        worker.start()
        catalog = RunCatalog([tmp_path / "out"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            catalog.refresh()
            live = [r for r in catalog.runs.values() if (r.live.get("completed") or 0) >= 100]
            if live:
                break
            time.sleep(0.05)
        token.cancel("test cancel")
        worker.join(120)
    report = outcome[0].report
    failures = report["failures"]
    assert report["state"] == "cancelled" and failures["never_sent"] > 0, failures
    completed = failures["sent"] - failures["requests"]
    catalog.refresh()
    info = next(iter(catalog.runs.values()))
    text = info.progress_text
    assert text.startswith(f"cancelled at {completed}/600 completed · {failures['never_sent']} never sent"), text
    assert "600/600" not in text
    # The state during the cancel: every event up to run_finished, folded as a poll then sees them.
    during = RunInfo(path=info.path)
    for event in _events(info.path)[:-1]:
        during.apply(event)
    assert "600/600" not in during.progress_text and f"{failures['never_sent']} never sent" in during.progress_text
    assert during.status.progress.requests.never_sent == failures["never_sent"]


def test_a_finished_benchmark_shows_the_reports_figures_not_its_last_repeats(tmp_path):
    """Three repeats: once finished, the state holds the report's mean and interval; the last
    repeat's live tok/s is gone from every line."""
    with BenchServer(Script(tokens=4)) as srv:
        request = BenchmarkRequest(framework="vllm", flags={
            "model": "m", "base_url": srv.url, "tokenizer": "none", "vocab_size": 1000, "concurrency": 2,
            "input_len": 8, "output_len": 4, "num_prompts": 8, "warmup": 0, "range_ratio": 1.0, "repeats": 3})
        outcome = run_request(request, str(tmp_path / "out"))
    stat = outcome.report["repeats"]["output_throughput"]
    catalog = RunCatalog([tmp_path / "out"])
    catalog.refresh()
    info = next(iter(catalog.runs.values()))
    assert [e for e in _events(info.path) if e.get("output_tok_s") is not None]  # live numbers were written
    assert info.progress_text == "24/24 · exit 0"  # what the run reached, no live number of its last repeat
    figure = info.status.figures.output_tok_s
    assert (figure.mean, figure.n, figure.ci95) == (stat["mean"], 3, stat["ci95"])
    from engine.runs.state import status_text
    lo, hi = stat["ci95"]
    assert status_text(info.status, detail=True).startswith(
        f"24/24 · exit 0 · {stat['mean']:.0f} tok/s (mean of 3, 95% CI {lo:.0f}–{hi:.0f})")


def test_a_resumed_run_keeps_its_first_start(tmp_path):
    """A loop resumed after it finished runs again; it began when it first started."""
    ws = Workspace.create(tmp_path, "loop", "x")
    ws.events.emit("run_started", mode="loop", pid=os.getpid(), workspace=str(ws.root))
    ws.events.emit("run_finished", state="completed", exit_code=0, report="loop.json")
    catalog = RunCatalog([tmp_path])
    catalog.refresh()
    info = catalog.runs[ws.root]
    first = info.started
    time.sleep(0.01)
    ws.events.emit("run_started", mode="loop", pid=os.getpid(), workspace=str(ws.root))
    catalog.refresh()
    assert info.state == "running" and info.started == first


def test_job_status_shows_the_state_the_workbench_shows(tmp_path):
    """MCP's job_status and the job API read the same state as the Runs list, on folders written by
    real runs (tests/tui/data/issue33): a cancelled benchmark, a capacity search, a settled loop."""
    import shutil
    from pathlib import Path

    from engine.jobs import attach
    from engine.mcp.jobs import describe
    data = Path(__file__).resolve().parents[1] / "tui" / "data" / "issue33"
    expected = {"benchmark_builtin-tiny_20261206_114747_eff4e8": "cancelled at 154/600 completed · 442 never sent",
                "benchmark_builtin-tiny_20261206_114922_85910e": "capacity c2 (tried c1, c2)",
                "loop_builtin-tiny_20261206_114807_a57b81": "8/8 steps · no proven gain · exit 3"}
    for name, text in expected.items():
        run_dir = shutil.copytree(data / name, tmp_path / name)
        status = describe(attach(run_dir))
        catalog = RunCatalog([tmp_path])
        catalog.refresh()
        assert status["progress"] == catalog.runs[run_dir].progress_text and status["progress"].startswith(text), status
        assert attach(run_dir).progress().text == status["progress"]  # the job API's too
        assert status["status"]["figures"] == catalog.runs[run_dir].figures.model_dump(mode="json", exclude_none=True)
        shutil.rmtree(run_dir)
    loop = step_results_of(data / "loop_builtin-tiny_20261206_114807_a57b81")
    assert loop["verdict"].decided and loop["verdict"].success is False and loop["candidates"].winner is None


def step_results_of(loop_dir) -> dict:
    from engine.loop.results import step_result
    from engine.loop.schema import load_loop_file
    return {step.name: step_result(step) for step in load_loop_file(loop_dir).steps}


def test_a_finished_compare_shows_its_winner_and_verdicts_from_the_report():
    """A recorded compare (examples/runs): the winner with its speedup and interval and the other
    kernels' verdicts, never a stale stage line; a cancelled one says so first."""
    from pathlib import Path

    from engine.runs.schema import RunFigures
    from engine.runs.state import RunStatus, kernel_figures, status_text
    run = next((Path(__file__).resolve().parents[2] / "examples" / "runs").glob("compare_three_pass_*"))
    report = json.loads((run / "compare_report.json").read_text())
    figures = kernel_figures(report)
    one = next(r for r in report["results"]["kernel_results"] if r["kernel_id"] == "one_pass")
    lo, hi = one["speedup_ci"]
    assert figures.verdicts == {"baseline": 1, "faster": 1, "incorrect": 1} and figures.baseline == "three_pass"
    done = RunStatus(state="completed", mode="compare", exit_code=0, figures=figures)
    assert status_text(done) == (f"winner one_pass {one['speedup']:.3g}x (95% CI {lo:.3g}–{hi:.3g}) · "
                                 "1 faster, 1 incorrect · exit 0")
    cancelled = RunStatus(state="cancelled", mode="compare", exit_code=130, figures=figures)
    assert status_text(cancelled).startswith("cancelled · winner one_pass")
    stands = RunFigures(verdicts={"baseline": 1, "tie": 2}, baseline="a", winner="a")
    assert status_text(RunStatus(state="completed", mode="compare", exit_code=0, figures=stands)) == \
        "baseline a stands · 2 tie · exit 0"


def test_run_finished_of_an_analyze_carries_its_verdicts(tmp_path):
    """A real analyze in this process: run_finished carries the counts, and the catalog's text
    (the Runs list, the Run header, job_status) is built from them."""
    from engine.jobs import KernelRequest
    cfg = tmp_path / "k.yaml"
    cfg.write_text("kernels:\n"
                   "  - {id: ok, type: hip, testcase_command: 'true'}\n"
                   "  - {id: wrong, type: hip, testcase_command: 'false'}\n"
                   "  - {id: nocc, type: hip, compile_command: 'magpie-no-such-compiler x.c', testcase_command: 'true'}\n")
    outcome = run_request(KernelRequest(mode="analyze", kernel_config=str(cfg), cwd=str(tmp_path), no_perf=True),
                          str(tmp_path / "out"))
    finished = _events(outcome.workspace)[-1]
    assert finished["event"] == "run_finished"
    assert finished["figures"]["verdicts"] == {"correct": 1, "incorrect": 1, "not judged": 1}
    catalog = RunCatalog([tmp_path / "out"])
    catalog.refresh()
    info = next(iter(catalog.runs.values()))
    assert info.progress_text == f"1 correct, 1 incorrect, 1 not judged · exit {outcome.exit_code}"

"""Pilot tests of the loop screen (``magpie optimize``) on hand-written loop folders.

The first three steps' results are those ``magpie optimize --until bottlenecks`` wrote on the
built-in tiny CPU server (trimmed); the later steps follow engine/loop/schema.py and the step
result formats the loop writes. The steps' run folders are copies of the recorded runs in
``examples/runs``, so the run screen opened from a step reads real files. Nothing is started:
the job API's ``submit`` is replaced by a recorder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from tui.conftest import build_app, open_launch, wait_for, wait_screen

from engine.jobs.requests import LoopRequest
from engine.loop.schema import STEP_NAMES, LoopFile, LoopStep
from engine.runs.process import process_identity, process_start_time
from engine.runs.workspace import Workspace, atomic_write_json
from magpie_tui.screens.help import all_bindings
from magpie_tui.screens.loop import (
    LoopScreen, Note, bottleneck_rows, candidate_rows, chain_rows, short_result, step_text, verdict_headline, verdict_rows,
)
from magpie_tui.screens.run import RunScreen
from magpie_tui.screens.runs import RunsScreen, format_elapsed
from magpie_tui.widgets.data_grid import DataGrid

SIZE = (140, 45)
LOOP_NAME = "loop_builtin-tiny_20261202_042935_f3fe9c"
BASE_RUN = "benchmark_builtin-tiny_20261129_192724_793ef2"
COMPARE_RUN = "compare_three_pass_20261129_191525_aa7d27"
T0 = 1796185775.0


# -- fixtures --------------------------------------------------------------------------------------

def ci(mean: float, lo: float, hi: float) -> dict:
    return {"mean": mean, "ci95": [lo, hi]}


def _row(rank: int, name: str, op: str | None, calls: int, time_us: float, share: float) -> dict:
    return {"rank": rank, "name": name, "registry_op": op, "replaceable": op is not None, "calls": calls,
            "time_us": time_us, "avg_us": round(time_us / calls, 3), "share_pct": share,
            "mapping": {"method": "call-site annotation", "confidence": "high"} if op else
            {"method": "none", "confidence": "none"},
            "behind": [{"name": "aten::mean", "calls": calls, "time_us": round(time_us / 2, 3)}] if op else [],
            "bound": None, "roofline_pct": None,
            "why_not": None if op else "not a registry op of the built-in server (no kernels: key replaces it)"}


BOTTLENECKS = {
    "device": "cpu", "time_basis": "CPU time of top-level ops (a CPU-only trace has no device timeline)",
    "window": {"steps": 18, "steps_in_trace": 19, "rule": "every profiled step but the first (one-time allocation costs)"},
    "annotated": True,
    "stages": {
        "all": {"steps": 18, "step_time_us": 82012.875, "accounted_time_us": 51366.326, "rows": [
            _row(1, "aten::linear", None, 144, 19770.816, 38.49), _row(2, "attention", "attention", 36, 14490.993, 28.21),
            _row(3, "rmsnorm", "rmsnorm", 90, 4811.017, 9.37),
            {"rank": 4, "name": "aten::odd", "calls": "many", "mapping": "?", "behind": "x", "future_key": [1]}]},
        "decode_only": {"steps": 15, "step_time_us": 62290.485, "accounted_time_us": 37307.511, "rows": [
            _row(1, "aten::linear", None, 120, 12000.0, 33.3), _row(2, "attention", "attention", 30, 11800.0, 32.7)]},
    },
}


def finished_steps(pid: int) -> list[dict]:
    """Every step done, the loop a success (the first three as the CLI wrote them)."""
    def step(name: str, start: float, secs: float, result: dict, run_dir: str | None = None) -> dict:
        return {"name": name, "state": "done", "run_dir": run_dir, "pid": pid, "started": T0 + start,
                "finished": T0 + start + secs, "result": result, "error": None, "reason": None, "attempts": 1}
    base_metrics = {"output_throughput": ci(472.726, 411.454, 533.998), "request_throughput": ci(78.788, 68.576, 89.0),
                    "median_ttft_ms": ci(8.19, 6.172, 10.208), "median_tpot_ms": ci(3.191, 2.458, 3.924),
                    "median_itl_ms": ci(2.985, 2.29, 3.679), "median_e2el_ms": ci(24.554, 21.601, 27.506),
                    "failed": ci(0.0, 0.0, 0.0)}
    return [
        step("baseline", 0, 5.3, {"report": f"baseline/{BASE_RUN}/benchmark_report.json", "report_sha256": "4be6",
                                  "repeats": 3, "metrics": base_metrics}, f"baseline/{BASE_RUN}"),
        step("profiled", 5.3, 7.9, {
            "config": "profiled_config.yaml",
            "config_diff": [{"field": "benchmark.client.repeats", "clean": 3, "profiled": 1},
                            {"field": "benchmark.profiler.torch_profiler.enabled", "clean": False, "profiled": True}],
            "traces": ["profiled/benchmark_x/torch_trace/vm_4902.pt.trace.json.gz"],
            "metrics": {"output_throughput": 238.38, "median_ttft_ms": 36.53, "failed": 0},
            "note": "profiling perturbs latency: these numbers diagnose, the baseline's measure"},
            "profiled/benchmark_builtin-tiny_20261202_042940_7fc733"),
        step("bottlenecks", 13.2, 0.9, {
            "table": "bottlenecks/bottlenecks.json", "device": "cpu",
            "top_by_stage": {"all": ["aten::linear 38.5%", "attention 28.2%", "rmsnorm 9.4%"]},
            "top_replaceable": {"registry_op": "rmsnorm", "share_pct": 9.37, "calls": 90, "confidence": "high"}},
            "bottlenecks"),
        step("harness", 14.1, 2.0, {"op": "rmsnorm", "file": "harness/harness.py",
                                    "implementation": "engine.serve.kernels:rmsnorm",
                                    "shapes": [{"args": "x[1,256] w[256]", "share_pct": 60.5},
                                               {"args": "x[2,256] w[256]", "share_pct": 39.5}]}, "harness"),
        step("candidates", 16.1, 40.0, {
            "compare_run": f"candidates/{COMPARE_RUN}", "winner": "rms_triton", "stopped": None,
            "rows": [
                {"id": "rms_triton", "source": "library/rmsnorm/triton.py", "origin": "library", "correct": True,
                 "verdict": "faster", "speedup": 1.42, "ci95": [1.3, 1.55], "median_ms": 0.012, "reason": None},
                {"id": "rms_tie", "source": "library/rmsnorm/torch_fused.py", "origin": "library", "correct": True,
                 "verdict": "tie", "speedup": 1.01, "ci95": [0.98, 1.04], "median_ms": 0.0168, "reason": None},
                {"id": "eager", "source": "engine/serve/kernels.py", "origin": "baseline", "correct": True,
                 "verdict": "baseline", "speedup": 1.0, "ci95": None, "median_ms": 0.017, "reason": None},
                {"id": "rms_user", "source": "my/rms.py", "origin": "user", "correct": False, "verdict": "incorrect",
                 "speedup": None, "ci95": None, "median_ms": None, "reason": "max abs error 0.31 > atol 1e-05"}]},
            "candidates"),
        step("integrate", 56.1, 0.1, {"config": "integrate/integrated_config.yaml",
                                      "kernels": {"rmsnorm": "library.rmsnorm.triton:rmsnorm"},
                                      "changed": [{"field": "benchmark.server.kernels.rmsnorm", "clean": None,
                                                   "integrated": "library.rmsnorm.triton:rmsnorm"}]}, "integrate"),
        step("rebenchmark", 56.2, 9.0, {"report": "rebenchmark/benchmark_y/benchmark_report.json", "repeats": 3,
                                        "metrics": {"output_throughput": ci(502.5, 490.1, 514.9)},
                                        "run_dir": "rebenchmark/benchmark_z", "kernel_after": {"share_pct": 4.1}},
             "rebenchmark/benchmark_y"),
        step("verdict", 65.2, 0.1, {
            "success": True, "message": "rmsnorm 1.42x faster; output throughput +6.3%",
            "kernel": {"speedup": 1.42, "ci95": [1.3, 1.55]},
            "end_to_end": [
                {"metric": "output_throughput", "baseline_mean": 472.7, "baseline_ci95": [411.5, 534.0],
                 "new_mean": 502.5, "new_ci95": [490.1, 514.9], "delta_pct": 6.3, "verdict": "better"},
                {"metric": "median_ttft_ms", "baseline_mean": 8.19, "baseline_ci95": [6.17, 10.21],
                 "new_mean": 8.09, "new_ci95": [6.0, 10.1], "delta_pct": -1.2, "verdict": "within noise"},
                {"metric": "median_tpot_ms", "baseline_mean": 3.19, "baseline_ci95": [3.1, 3.3],
                 "new_mean": 3.5, "new_ci95": [3.4, 3.6], "delta_pct": 9.7, "verdict": "worse"}],
            "checks": [{"name": "baseline report unchanged", "ok": True, "detail": "sha256 matches"},
                       {"name": "no failed requests", "ok": False, "detail": "2 failed in the rebenchmark"}],
            "top_bottleneck_after": "attention"}),
    ]


def mixed_steps(pid: int) -> list[dict]:
    """One step in each state; rebenchmark runs in process ``pid``."""
    steps = finished_steps(pid)
    by = {s["name"]: s for s in steps}
    by["harness"].update(state="skipped", reason="--kernel given: the harness of rmsnorm is reused", result={})
    by["candidates"].update(state="waiting", reason="waiting for a free GPU", finished=None, result={})
    by["integrate"].update(state="failed", error="the integrated config does not start: kernels.rmsnorm not found",
                           attempts=2)
    by["rebenchmark"].update(state="running", started=time.time() - 3, finished=None, result={})
    by["verdict"].update(state="pending", reason="after rebenchmark", started=None, finished=None, result={},
                         attempts=0)
    return steps


def write_loop(root: Path, steps: list[dict]) -> None:
    for s in steps:  # as the loop records a step's process: its pid with its start time
        if s.get("pid") is not None:
            s["start_time"] = process_start_time(s["pid"])
    atomic_write_json(root / "loop.json", {"schema_version": 1, "kind": "optimize_loop",
                                           "config": "/work/clean.yaml", "label": "builtin-tiny", "created": T0,
                                           "until": None, "overrides": [], "steps": steps})


def make_loop(project: Path, steps: list[dict], pid: int, finished: bool) -> Path:
    root = project / "results" / LOOP_NAME
    root.mkdir(parents=True)
    shutil.copytree(project / "runs" / BASE_RUN, root / "baseline" / BASE_RUN)
    shutil.copytree(project / "runs" / COMPARE_RUN, root / "candidates" / COMPARE_RUN)
    (root / "bottlenecks").mkdir()
    (root / "bottlenecks" / "bottlenecks.json").write_text(json.dumps(BOTTLENECKS))
    events = [{"ts": T0, "event": "run_started", **process_identity(pid), "workspace": str(root), "mode": "loop",
               "label": "builtin-tiny", "schema_version": 1}]
    if finished:
        events.append({"ts": T0 + 66, "event": "run_finished", "state": "completed", "exit_code": 0,
                       "report": "loop.json"})
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    write_loop(root, steps)
    return root


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def submitted(monkeypatch, tmp_path):
    """Replaces the job API's submit: records (request, output_dir, executor, options), starts nothing."""
    calls: list[tuple] = []

    def submit(request, output_dir=None, *, executor="local-process", **options):
        calls.append((request, output_dir, executor, options))
        process = SimpleNamespace(pid=dead_pid(), poll=lambda: 0)
        return SimpleNamespace(run_dir=Path(output_dir) / LOOP_NAME,
                               execution=SimpleNamespace(process=process, console_log=tmp_path / "console.log"))
    monkeypatch.setattr("engine.jobs.api.submit", submit)
    return calls


# -- helpers ---------------------------------------------------------------------------------------

async def open_loop(pilot, app) -> LoopScreen:
    await pilot.press("2")
    await wait_for(pilot, lambda: any(r.mode == "loop" for r in app.runs))
    app.open_run(next(r for r in app.runs if r.mode == "loop"))
    await wait_screen(pilot, app, LoopScreen, "#loop-chain")
    await wait_for(pilot, lambda: app.screen.query_one("#loop-chain", DataGrid).row_count == len(STEP_NAMES))
    return app.screen


def chain(screen) -> dict[str, list[str]]:
    """Each step's cells: number, step, state, elapsed, tries, detail."""
    grid = screen.query_one("#loop-chain", DataGrid)
    return {r["step"]: [str(r["n"]), r["step"], r["state"], format_elapsed(r["elapsed"]), str(r["attempts"]),
                        r["detail"]] for r in grid.visible_rows()}


def state_of(screen, step: str) -> str:
    return chain(screen)[step][2]


def text_of(screen, selector: str) -> str:
    """What a widget says: a note's whole text (on screen it may be folded to one line)."""
    widget = screen.query_one(selector)
    return widget.text if isinstance(widget, Note) else str(widget.render())


def drawn_lines(app) -> list[str]:
    """The terminal's lines as drawn now."""
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


async def select_step(pilot, screen, name: str) -> None:
    grid = screen.query_one("#loop-chain", DataGrid)
    grid.focus()
    grid.move_cursor_to_key(name)
    await pilot.pause()


# -- the chain -------------------------------------------------------------------------------------

async def test_chain_shows_each_state_and_follows_loop_json(project, submitted):
    root = make_loop(project, mixed_steps(os.getpid()), os.getpid(), finished=False)
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_loop(pilot, app)
        rows = chain(screen)
        assert [rows[name][2] for name in STEP_NAMES] == ["done", "done", "done", "skipped", "waiting", "failed",
                                                        "running", "pending"]
        assert rows["baseline"][:2] == ["1", "baseline"] and rows["baseline"][3] == "0:05"
        assert rows["baseline"][5].startswith("output tok/s 472.7 [411.5, 534]")
        assert rows["bottlenecks"][5] == "top replaceable: rmsnorm 9.4% (90 calls, high) · cpu"
        assert rows["harness"][5] == "--kernel given: the harness of rmsnorm is reused"
        assert rows["integrate"][4] == "2" and "kernels.rmsnorm not found" in rows["integrate"][5]
        assert rows["verdict"][5] == "after rebenchmark"
        assert "running" in text_of(screen, "#loop-status")
        await pilot.press("R")  # the loop runs: nothing is submitted
        await pilot.pause(0.2)
        assert not submitted

        # The loop process writes loop.json: the chain follows.
        steps = mixed_steps(os.getpid())
        steps[6].update(state="done", finished=time.time(), result={"metrics": {"output_throughput": 501.0}})
        write_loop(root, steps)
        await wait_for(pilot, lambda: state_of(screen, "rebenchmark") == "done")
        assert chain(screen)["rebenchmark"][5] == "output tok/s 501"

        # Left running by a process that is gone: the loop was killed there.
        gone = dead_pid()
        steps[6].update(state="running", pid=gone, finished=None, result={})
        write_loop(root, steps)
        await wait_for(pilot, lambda: state_of(screen, "rebenchmark") == "killed")
        assert chain(screen)["rebenchmark"][5] == f"process {gone} is gone: the loop was killed here (R resumes)"
        assert text_of(screen, "#loop-status").startswith("killed")
        await select_step(pilot, screen, "rebenchmark")
        assert f"killed: process {gone} is gone" in text_of(screen, "#step-text")


async def test_a_killed_loop_resumes_through_the_job_api(project, submitted):
    gone = dead_pid()
    steps = mixed_steps(gone)
    root = make_loop(project, steps, gone, finished=False)
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_loop(pilot, app)
        assert state_of(screen, "rebenchmark") == "killed"
        await wait_for(pilot, lambda: "R: resume" in text_of(screen, "#loop-status"))
        await pilot.press("R")
        await wait_for(pilot, lambda: bool(submitted))
        request, output_dir, executor, options = submitted[0]
        assert request == LoopRequest(resume=str(root.resolve()))
        assert Path(output_dir) == root.resolve().parent and executor == "local-process"
        assert options["cwd"] == root.resolve()
        await wait_for(pilot, lambda: screen._resumed_pid is not None)


# -- steps, panes ----------------------------------------------------------------------------------

async def test_enter_opens_a_steps_run_or_its_pane(project):
    root = make_loop(project, finished_steps(dead_pid()), dead_pid(), finished=True)
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_loop(pilot, app)
        await wait_for(pilot, lambda: "baseline" in screen.view.runs)
        await select_step(pilot, screen, "baseline")
        assert "metrics (mean [95% CI] over the repeats):" in text_of(screen, "#step-text")
        await pilot.press("enter")
        await wait_screen(pilot, app, RunScreen, "#run-summary")
        assert app.screen.info.path == root / "baseline" / BASE_RUN and app.screen.info.state == "completed"
        await pilot.press("escape")
        await wait_screen(pilot, app, LoopScreen)
        await select_step(pilot, screen, "candidates")  # its compare run
        await pilot.press("enter")
        await wait_screen(pilot, app, RunScreen, "#run-summary")
        assert app.screen.info.path == root / "candidates" / COMPARE_RUN and app.screen.info.mode == "compare"
        await pilot.press("escape")
        await wait_screen(pilot, app, LoopScreen)
        await select_step(pilot, screen, "bottlenecks")  # no run folder: its pane
        await pilot.press("enter")
        assert screen.query_one("#loop-tabs").active == "tab-bottlenecks"


async def test_bottleneck_candidates_and_verdict_panes(project):
    make_loop(project, finished_steps(dead_pid()), dead_pid(), finished=True)
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_loop(pilot, app)
        await pilot.press("b")
        grid = screen.query_one("#bottleneck-grid", DataGrid)
        await wait_for(pilot, lambda: grid.row_count == 4)
        assert screen.query_one("#bottleneck-stage").value == "all"
        rows = grid.visible_rows()
        assert [r["name"] for r in rows] == ["aten::linear", "attention", "rmsnorm", "aten::odd"]
        assert [r["replace"] for r in rows] == ["", "yes: attention", "yes: rmsnorm", ""]
        assert rows[3]["calls"] is None and rows[3]["behind"] == ""  # odd values show blank
        assert "51,366 of 82,013 us accounted" in text_of(screen, "#bottleneck-note")
        await pilot.press("n")
        await wait_for(pilot, lambda: grid.row_count == 2)
        assert screen.query_one("#bottleneck-stage").value == "decode_only"

        await pilot.press("a")
        cands = screen.query_one("#candidates-grid", DataGrid).visible_rows()
        assert [(r["id"], r["verdict"], r["winner"]) for r in cands] == [
            ("rms_triton", "faster", "*"), ("rms_tie", "tie", ""), ("eager", "baseline", ""),
            ("rms_user", "incorrect", "")]
        assert cands[0]["ci_low"] == 1.3 and cands[3]["correct"] == "no" and "atol" in cands[3]["reason"]
        assert "op rmsnorm · winner rms_triton" in text_of(screen, "#candidates-note")

        await pilot.press("v")
        assert screen.query_one("#loop-tabs").active == "tab-verdict"
        headline = text_of(screen, "#verdict-headline")
        assert headline.startswith("SUCCESS: rmsnorm 1.42x faster") and "kernel speedup 1.420x [1.300, 1.550]" in headline
        assert screen.query_one("#verdict-headline").has_class("-success")
        e2e = screen.query_one("#verdict-e2e", DataGrid).visible_rows()
        assert [(r["metric"], r["verdict"]) for r in e2e] == [("output tok/s", "better"), ("TTFT ms", "within noise"),
                                                              ("TPOT ms", "worse")]
        assert e2e[0]["delta_pct"] == 6.3 and e2e[0]["baseline_ci95"] == "[412, 534]"
        checks = screen.query_one("#verdict-checks", DataGrid).visible_rows()
        assert [(r["name"], r["ok"]) for r in checks] == [("baseline report unchanged", "pass"),
                                                          ("no failed requests", "FAIL")]


# -- 80x24: an SSH window -------------------------------------------------------------------------

RECORDED_LOOP = Path(__file__).resolve().parent / "data" / "issue33" / "loop_builtin-tiny_20261206_114807_a57b81"
"""A real ``magpie optimize`` loop on the built-in server: its bottleneck table as the loop wrote it
(25 rows a stage; the rows' call lines, input shapes and stack notes trimmed)."""
RECORDED_VERDICT = Path(__file__).resolve().parent / "data" / "loop_verdict.json"
"""A verdict of full size: the end-to-end rows that ``engine.loop.verdict.end_to_end`` computed
from two recorded three-repeat benchmarks of the built-in server (examples/runs/benchmark_..._793ef2
against data/issue33/benchmark_..._2fd002: all eight metrics), the six checks and a message as
long as the engine writes them."""


def in_view(app, grid: DataGrid, rows: int) -> bool:
    """The grid's header and its first ``rows`` rows lie on the screen, above the footer."""
    from textual.widgets import Footer
    footer = app.screen.query_one(Footer).region
    return grid.region.height >= rows + 1 and grid.region.y + rows < footer.y


async def test_at_80x24_the_chain_the_bottleneck_table_and_the_verdict_are_read_without_scrolling(project):
    from tui.test_usability import row_cells
    steps = finished_steps(dead_pid())
    steps[-1]["result"] = json.loads(RECORDED_VERDICT.read_text())
    root = make_loop(project, steps, dead_pid(), finished=True)
    shutil.copy(RECORDED_LOOP / "bottlenecks" / "bottlenecks.json", root / "bottlenecks" / "bottlenecks.json")
    table = json.loads((root / "bottlenecks" / "bottlenecks.json").read_text())
    app = build_app(project)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_loop(pilot, app)
        await pilot.pause()
        # The chain: every step in view, Detail takes the line's rest (Tries and Elapsed step aside).
        chain_grid = screen.query_one("#loop-chain", DataGrid)
        assert in_view(app, chain_grid, len(STEP_NAMES))
        assert chain_grid.column_widths["detail"] >= 45, chain_grid.column_widths
        for y, row in enumerate(chain_grid.visible_rows(), start=1):
            cells = row_cells(chain_grid, y)
            assert cells["step"] == row["step"] and cells["state"] == row["state"]
            assert cells["detail"].rstrip("…") == row["detail"][:len(cells["detail"].rstrip("…"))]
            assert len(cells["detail"]) >= min(len(row["detail"]), 45)
        assert screen.query_one("#loop-status").region.height == 1  # one line; m shows it whole

        # b: the bottleneck table, its top rows with rank, op, share and what replaces them.
        await pilot.press("b")
        grid = screen.query_one("#bottleneck-grid", DataGrid)
        recorded = table["stages"]["all"]["rows"]
        await wait_for(pilot, lambda: grid.row_count == len(recorded))
        await pilot.pause()
        assert screen.query_one("#bottleneck-note").region.height == 1
        assert in_view(app, grid, 8), (grid.region, screen.query_one("#loop-tabs").region)
        assert {"rank", "name", "share_pct", "replace"} <= set(grid.shown_columns)
        lines = drawn_lines(app)
        for y, row in enumerate(recorded[:8], start=1):
            cells = row_cells(grid, y)
            assert cells["rank"] == str(row["rank"]) and cells["name"] == row["name"]
            assert cells["share_pct"] == f"{row['share_pct']:.1f}"
            assert cells["replace"] == (f"yes: {row['registry_op']}" if row["replaceable"] else "")
            assert any(row["name"] in line and f"{row['share_pct']:.1f}" in line for line in lines), row["name"]
        assert "accounted" in text_of(screen, "#bottleneck-note")
        await pilot.press("m")  # the note, whole
        await wait_for(pilot, lambda: screen.query_one("#bottleneck-note").region.height > 1)
        await pilot.press("m")
        await wait_for(pilot, lambda: screen.query_one("#bottleneck-note").region.height == 1)

        # v: the headline, every end-to-end row with both intervals, every check.
        await pilot.press("v")
        await pilot.pause()
        e2e = screen.query_one("#verdict-e2e", DataGrid)
        checks = screen.query_one("#verdict-checks", DataGrid)
        verdict = steps[-1]["result"]
        assert e2e.row_count == len(verdict["end_to_end"]) == 8 and checks.row_count == 6
        assert in_view(app, e2e, 8) and in_view(app, checks, 6), (e2e.region, checks.region)
        assert set(e2e.shown_columns) == {c.key for c in e2e.columns}
        lines = drawn_lines(app)
        headline = screen.query_one("#verdict-headline")
        assert headline.region.height == 1 and lines[headline.region.y].strip().startswith("NO GAIN: not proven")
        for y, row in enumerate(e2e.visible_rows(), start=1):
            cells = row_cells(e2e, y)
            assert cells["metric"] == row["metric"]
            assert cells["baseline_ci95"] == row["baseline_ci95"] and cells["new_ci95"] == row["new_ci95"]
            assert cells["verdict"] == row["verdict"]
        for y, row in enumerate(verdict["checks"], start=1):
            cells = row_cells(checks, y)
            assert cells["ok"] == ("pass" if row["ok"] else "FAIL") and cells["name"] == row["name"]
            assert any(row["name"] in line for line in lines)

        # i: the chain and the step's details again; q goes back.
        await pilot.press("i")
        await pilot.pause()
        assert in_view(app, chain_grid, len(STEP_NAMES))
        await pilot.press("q")
        await wait_screen(pilot, app, RunsScreen)


# -- reaching it -----------------------------------------------------------------------------------

async def test_a_loop_row_in_the_runs_table_opens_the_loop_screen(project):
    root = make_loop(project, finished_steps(dead_pid()), dead_pid(), finished=True)
    app = build_app(project)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        table = app.screen.query_one("#runs-table")
        await wait_for(pilot, lambda: str(root) in table.visible_keys())
        row = table.get_row(str(root))
        assert [row["state"], row["mode"], row["label"]] == ["completed", "loop", "builtin-tiny"]
        # A loop started from the command line while the app watches shows up too.
        ws = Workspace.create(project / "results", "loop", "live")
        write_loop(ws.root, mixed_steps(os.getpid()))
        ws.events.emit("run_started", pid=os.getpid(), workspace=str(ws.root), mode="loop", label="live")
        await wait_for(pilot, lambda: str(ws.root) in table.visible_keys())
        assert table.get_row(str(ws.root))["mode"] == "loop" and table.get_row(str(ws.root))["state"] == "running"
        assert table.move_cursor_to_key(str(root))
        await pilot.press("enter")
        await wait_screen(pilot, app, LoopScreen, "#loop-chain")
        assert app.screen.root == root
        await wait_for(pilot, lambda: state_of(app.screen, "verdict") == "done")
        await pilot.press("escape")
        await wait_screen(pilot, app, RunsScreen, "#runs-table")
        await pilot.press("r")  # a loop's report is its verdict
        await wait_screen(pilot, app, LoopScreen, "#loop-chain")
        assert app.screen.query_one("#loop-tabs").active == "tab-verdict"


async def test_launch_optimize_submits_a_loop_request(app, project, submitted):
    config = project / "benchmarks" / "builtin_tiny_cpu.yaml"
    async with app.run_test(size=SIZE) as pilot:
        dialog = await open_launch(pilot, app, config)
        dialog.query_one("#mode").value = "optimize"
        await pilot.pause()
        assert not dialog.query_one("#repeats").display and dialog.query_one("#until").display
        dialog.query_one("#until").value = "bottlenecks"
        await pilot.pause()
        preview = text_of(dialog, "#launch-preview-text")
        assert f"$ magpie optimize -b {config.resolve()}" in preview and "--until bottlenecks" in preview
        assert "the baseline step's config" in preview
        await pilot.press("ctrl+s")
        await wait_screen(pilot, app, RunsScreen)
        request, output_dir, executor, _options = submitted[0]
        assert request == LoopRequest(benchmark_config=str(config.resolve()), until="bottlenecks")
        assert Path(output_dir) == app.settings.launch_results_dir and executor == "local-process"


async def test_launch_optimize_with_its_kernel_and_candidates(app, project, submitted):
    """Every field of ``magpie optimize``: the op, candidate paths (relative to the config's
    folder), and leaving out the bundled library."""
    config = project / "benchmarks" / "builtin_tiny_cpu.yaml"
    (config.parent / "my_rmsnorm.py").write_text("# a candidate\n")
    async with app.run_test(size=SIZE) as pilot:
        dialog = await open_launch(pilot, app, config)
        dialog.query_one("#mode").value = "optimize"
        await pilot.pause()
        assert dialog.query_one("#kernel").display and dialog.query_one("#candidates").display
        dialog.query_one("#kernel").value = "rmsnorm"
        dialog.query_one("#candidates").value = "my_rmsnorm.py"
        dialog.query_one("#library").value = False
        await pilot.pause()
        candidate = str((config.parent / "my_rmsnorm.py").resolve())
        preview = text_of(dialog, "#launch-preview-text")
        assert f"--kernel rmsnorm --candidates {candidate} --no-library" in preview, preview
        dialog.query_one("#candidates").value = "missing.py"  # checked as the command line checks it
        await pilot.pause()
        assert "--candidates" in dialog.problem and "no such file or folder" in dialog.problem
        dialog.query_one("#candidates").value = "my_rmsnorm.py"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_screen(pilot, app, RunsScreen)
        request, _output_dir, _executor, _options = submitted[0]
        assert request == LoopRequest(benchmark_config=str(config.resolve()), kernel="rmsnorm",
                                      candidates=[candidate], library=False)


# -- the row builders, on results with missing or unexpected keys ---------------------------------

def test_row_builders_take_any_result():
    odd = [{}, {"metrics": "n/a", "repeats": "3"}, {"config_diff": [1, None], "metrics": {"x": [1]}},
           {"top_replaceable": 5, "device": None}, {"top_replaceable": {"share_pct": "big"}}, {"shapes": "many"},
           {"rows": [None, 3], "winner": "a"}, {"kernels": [1], "changed": "x"}, {"kernel_after": 1},
           {"success": "yes", "message": None}]
    for name in STEP_NAMES:
        for result in odd:
            step = LoopStep(name=name, state="done", result=result, started=T0, finished=T0 + 1)
            assert isinstance(short_result(step), str)
            assert step.name in step_text(step, 1, ())
    assert candidate_rows({"rows": [None, {"id": None, "ci95": [1]}], "winner": None})[1]["id"] == "?"
    assert verdict_rows({"end_to_end": "x", "checks": [None, {"ok": "maybe"}]}) == (
        [], [{"ok": "?", "name": "?", "detail": ""}, {"ok": "?", "name": "?", "detail": ""}])
    assert bottleneck_rows({"stages": {"all": {"rows": [None, {"rank": "x"}]}}}, "all")[1]["rank"] == 2
    assert bottleneck_rows({"stages": []}, "all") == [] and bottleneck_rows(None, "all") == []
    headline, cls = verdict_headline(LoopStep(name="verdict", state="pending", reason="not implemented"))
    assert headline == "no verdict yet: not implemented" and cls is None
    loop = LoopFile(config="c.yaml", steps=[LoopStep(name="baseline", state="running", pid=1, started=T0)])
    assert chain_rows(loop, {"baseline"}, now=T0 + 10)[0]["state"] == "killed"
    assert chain_rows(loop, set(), now=T0 + 10)[0]["elapsed"] == 10
    ids = {row[1] for row in all_bindings(SimpleNamespace())}
    assert {"loop.open", "loop.resume", "loop.bottlenecks", "loop.candidates", "loop.verdict"} <= ids

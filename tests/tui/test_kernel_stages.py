"""Pilot: the Run screen of a compare shows each kernel's stage live, and the winner at its end.

The events are a real compare's (``magpie compare`` on the CPU, two kernels), written into a run
folder of the project step by step while the workbench watches, at 80x24; the run's process is a
real one (``sleep``) so that the run reads as running until its ``run_finished``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tui.conftest import find_run, open_runs, wait_for, wait_screen

from engine.runs.workspace import Workspace
from magpie_tui.screens.run import RunScreen
from magpie_tui.widgets.data_grid import DataGrid

ROOT = Path(__file__).resolve().parents[2]
MSE = ROOT / "examples" / "kernels" / "loss_functions"
SIZE = (80, 24)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[dict]:
    """The events of a real compare, in the order it wrote them."""
    work = tmp_path_factory.mktemp("rec")
    shutil.copytree(MSE, work / "k", ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-m", "engine.cli", "compare", "-k", str(work / "k" / "mse.compare.yaml"),
                          "--repeats", "20", "-o", str(work / "results")], cwd=work, capture_output=True,
                         text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = next((work / "results").glob("compare_*"))
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _emit(ws: Workspace, events: list[dict]) -> None:
    for e in events:
        e = {k: v for k, v in e.items() if k not in ("ts", "schema_version")}
        ws.events.emit(e.pop("event"), **e)


def _rows(app) -> dict[str, tuple[str, str, str]]:
    grid = app.screen.query_one("#kernels-grid", DataGrid)
    return {k: (r["stage"], r["detail"], r["verdict"]) for k, r in zip(grid.visible_keys(), grid.visible_rows())}


def _shown(app) -> str:
    """The grid as drawn, and the line below it."""
    grid = app.screen.query_one("#kernels-grid", DataGrid)
    lines = [grid.render_line(y).text for y in range(grid.size.height)]
    return "\n".join(lines) + "\n" + str(app.screen.query_one("#kernels-line").render())


async def test_the_run_screen_shows_each_kernels_stage_live_and_the_winner_at_the_end(app, project, sleeper,
                                                                                      recorded):
    started = next(e for e in recorded if e["event"] == "run_started")
    ws = Workspace.create(project / "results", "compare", "torch_mse")
    ws.events.emit("run_started", mode="compare", pid=sleeper.pid, workspace=str(ws.root), label="torch_mse",
                   kernels=started["kernels"])
    rest = [e for e in recorded if e["event"] != "run_started"]
    at = lambda pred: next(i for i, e in enumerate(rest) if pred(e))  # noqa: E731
    third_set = at(lambda e: e.get("stage") == "correctness" and e.get("step") == 3 and e["kernel"] == "manual_mse")
    fourth_round = at(lambda e: e.get("stage") == "performance" and e.get("step") == 4 and e["kernel"] == "manual_mse")

    async with app.run_test(size=SIZE) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: find_run(app, ws.root.name) is not None)
        app.open_run(find_run(app, ws.root.name))
        await wait_screen(pilot, app, RunScreen, "#kernels-grid")
        # opened before any stage: every kernel waits, and the Kernels tab is the one shown
        await wait_for(pilot, lambda: _rows(app).get("manual_mse", ("",))[0] == "waiting")
        assert app.screen.query_one("#run-tabs").active == "tab-kernels"

        _emit(ws, rest[:third_set + 1])  # both kernels on input set 3 of 5
        await wait_for(pilot, lambda: _rows(app)["manual_mse"][0] == "correctness set 3/5")
        assert _rows(app)["torch_mse"][0] == "correctness set 3/5"
        await wait_for(pilot, lambda: "correctness set 3/5 · 2 of 2 kernels" in _shown(app))
        assert "kernel 2 of 2" not in str(app.screen.query_one("#run-status").render())

        _emit(ws, rest[third_set + 1:fourth_round + 1])  # checked, and timing round 4
        await wait_for(pilot, lambda: _rows(app)["manual_mse"][0] == "timing round 4/10")
        assert _rows(app)["torch_mse"][0].startswith("timing round ")
        await wait_for(pilot, lambda: "2 checked · timing round 4/10" in _shown(app))
        assert "timing round 4/10" in _shown(app)  # drawn at 80 columns, not cut

        _emit(ws, rest[fourth_round + 1:])  # the end: each kernel's verdict, then run_finished
        ws.events.close()
        await wait_for(pilot, lambda: _rows(app)["manual_mse"][0] == "done")
        report = json.loads(json.dumps([e for e in rest if e.get("stage") == "done"]))
        verdicts = {e["kernel"]: e["verdict"] for e in report}
        assert {k: r[2] for k, r in _rows(app).items()} == verdicts
        await wait_for(pilot, lambda: "exit 0" in _shown(app))
        line = str(app.screen.query_one("#kernels-line").render())
        assert line.startswith(("baseline torch_mse stands", "winner manual_mse")), line
        assert "median" in _rows(app)["torch_mse"][1]

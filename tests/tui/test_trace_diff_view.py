"""The workbench's view of a trace diff (``magpie benchmark --trace-diff A B``): the report of a real
diff run (the H200 trace of tests/data against a copy with one op slower and one op renamed),
opened from the Runs list with ``r``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tui.conftest import find_run, open_runs, wait_for, wait_screen

from engine.jobs import TraceDiffRequest, run_request
from magpie_tui.screens.trace_diff import TraceDiffScreen, diff_rows
from magpie_tui.widgets.data_grid import DataGrid

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "data" / "tracelens-golden" / "h200_real" / "h200_block_bf16.json.gz"


def _variant(path: Path) -> Path:
    with gzip.open(H200, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    gelu = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::gelu"}
    for e in events:
        if e.get("cat") == "kernel" and (e.get("args") or {}).get("External id") in gelu:
            e["dur"] *= 10
    min((e for e in events if e.get("name") == "aten::addmm"), key=lambda e: e["ts"])["name"] = "aten::mm"
    path.write_text(json.dumps(doc))
    return path


def test_diff_rows_show_both_sides_and_the_call_site():
    row = {"name": "aten::mm", "stack": ["aten::linear"], "status": "only_b",
           "time_us": {"a": None, "b": 37.0, "delta": 37.0, "pct": None}, "calls": {"a": None, "b": 1}}
    (out,) = diff_rows([row])
    assert out["status"] == "B" and out["delta_us"] == 37.0 and out["calls"] == "- → 1" and out["stack"] == "aten::linear"
    assert out["tflops"] is None


@pytest.mark.slow  # a few seconds: the Runs list and a report screen
async def test_a_trace_diff_run_opens_on_its_report(app, project, tmp_path):
    outcome = run_request(TraceDiffRequest(a=str(H200), b=str(_variant(tmp_path / "b.json"))), project / "runs")
    assert outcome.exit_code == 0
    async with app.run_test(size=(140, 45)) as pilot:
        await open_runs(pilot, app)
        await wait_for(pilot, lambda: any(r.name.startswith("tracediff_") for r in app.runs))
        info = find_run(app, "tracediff_")
        assert info.mode == "trace_diff" and info.state == "completed"
        grid = app.screen.query_one("#runs-table", DataGrid)
        await pilot.press("slash", *"tracediff", "enter")
        await wait_for(pilot, lambda: grid.visible_count == 1)
        await pilot.press("home", "r")
        await wait_screen(pilot, app, TraceDiffScreen, "#diff-grid-0")
        screen = app.screen
        totals = str(screen.query_one("#diff-totals").render())
        assert "total GPU time" in totals and "ops: 8 in both, 0 only in A, 1 only in B" in totals
        movers = screen.query_one("#diff-grid-0", DataGrid)
        await wait_for(pilot, lambda: movers.row_count > 0)
        top = movers.get_row(0)
        assert top["name"] == "aten::gelu" and top["pct"] == pytest.approx(900) and top["status"] == "A B"
        await pilot.press("right_square_bracket", "right_square_bracket")  # the ops only in A or B
        only = screen.query_one("#diff-grid-2", DataGrid)
        assert [(r["name"], r["status"], r["stack"]) for r in only.visible_rows()] == [("aten::mm", "B", "aten::linear")]
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, TraceDiffScreen))

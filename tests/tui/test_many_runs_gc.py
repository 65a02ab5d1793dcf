"""Key latency with thousands of runs: the runs listed (and what the app keeps for them) are moved
out of the garbage collector's full passes once the list is out, and again when the runs double.
Those passes walked every object the app holds: with 2,000 run folders a pass took up to 230 ms on
the event loop, and a key pressed meanwhile waited for it (benchmarks/tui_many_runs.py)."""

from __future__ import annotations

import gc
import json

from tui.conftest import open_runs, wait_for


def many_runs(results, n: int) -> None:
    for i in range(n):
        root = results / f"benchmark_many-{i:04d}_20270101_{i:06d}_abcdef"
        root.mkdir(parents=True)
        events = [{"ts": 1_800_000_000.0 + i, "event": "run_started", "mode": "benchmark", "label": f"many-{i:04d}",
                   "pid": 4_194_400},
                  {"ts": 1_800_000_010.0 + i, "event": "run_finished", "state": "completed", "exit_code": 0}]
        (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


async def test_the_runs_are_kept_out_of_full_collections(app, project):
    many_runs(project / "results", 150)
    gc.unfreeze()
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            await open_runs(pilot, app)
            await wait_for(pilot, lambda: len(app.runs) == 154)
            await wait_for(pilot, lambda: gc.get_freeze_count() > 0)
            # the RunInfo objects listed are among the frozen ones: a full pass no longer walks them
            assert gc.get_freeze_count() > 154 and app._frozen_at == 154
            await pilot.press("j", "j")
            await pilot.pause(0.3)
            assert app._frozen_at == 154  # not frozen again until the runs double
        assert gc.get_freeze_count() == 0  # the app gone, its objects can be collected again
    finally:
        gc.unfreeze()

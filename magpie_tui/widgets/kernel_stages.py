"""An analyze or compare run's kernels as they go: per kernel its stage (compile, testcase, loading,
correctness set i of n, timing round i of n, done), a detail and, at the end, its verdict; below,
the run's line (what the Runs list says while it runs, the winner line once it has finished).

Everything comes from the run's state (``RunInfo.kernel_progress``, folded by the catalog from
the ``stage`` events the engine writes as it goes), so the table moves with the events."""

from __future__ import annotations

from textual.containers import Vertical
from textual.widgets import Static

from engine.jobs.query import RunInfo, status_text
from magpie_tui.widgets.data_grid import Column, DataGrid

COLUMNS = [
    Column("kernel", "Kernel", max_width=24, squeeze_to=10, ellipsis="middle"),
    Column("stage", "Stage", max_width=22, min_width=8),
    Column("detail", "Detail", max_width=40, squeeze_to=8),
    Column("verdict", "Verdict", max_width=14, min_width=7),
]

# A verdict's (or a failed stage's) row colour: the grid's row classes (the theme's colours).
VERDICT_CLASS = {"faster": "correct", "correct": "correct", "tie": "tie", "slower": "muted", "incorrect": "incorrect",
                 "rejected": "incorrect", "failed": "incorrect", "baseline": "muted", "not judged": "muted",
                 "not measured": "muted", "cancelled": "muted"}


def kernel_rows(info: RunInfo) -> list[dict]:
    """The table's rows: one per kernel, in the run's order; kernels not reached yet read ``waiting``."""
    rows = []
    progress = {r.kernel: r for r in info.kernel_progress}
    for kernel in list(info.kernels) + [k for k in progress if k not in info.kernels]:
        r = progress.get(kernel)
        if r is None:
            rows.append({"kernel": kernel, "stage": "waiting", "detail": "", "verdict": ""})
            continue
        failed = r.state in ("FAILED", "CANCELLED", "SKIPPED") and r.stage != "done"
        stage = {"harness": "correctness", "performance": "timing"}.get(r.stage, r.stage) if failed else r.where
        rows.append({"kernel": kernel, "stage": stage, "detail": r.detail_text,
                     "verdict": r.verdict or (r.detail if failed else "")})
    return rows


class KernelStages(Vertical):
    """The Kernels tab of an analyze or compare run."""

    DEFAULT_CSS = """
    KernelStages { height: 1fr; }
    KernelStages > DataGrid { height: 1fr; }
    KernelStages > #kernels-line { height: auto; padding: 0 1; }
    """

    _shown: list[dict] = []

    def compose(self):
        yield DataGrid(COLUMNS, row_class=lambda row: VERDICT_CLASS.get(row["verdict"]) or (
            "running" if row["stage"] not in ("waiting", "done") else None), fixed_columns=1, id="kernels-grid")
        yield Static("", id="kernels-line")

    def show(self, info: RunInfo) -> None:
        """Redraw from the run's state (called on every change the catalog sees)."""
        rows = kernel_rows(info)
        if rows != self._shown:  # the cursor stays on its kernel (explicit keys)
            self._shown = rows
            self.query_one("#kernels-grid", DataGrid).set_rows(rows, keys=[r["kernel"] for r in rows])
        line = status_text(info.status) if info.kernel_progress or info.is_finished else "waiting for the first stage"
        self.query_one("#kernels-line", Static).update(line)

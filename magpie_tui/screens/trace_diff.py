"""A trace diff's report (``magpie benchmark --trace-diff A B``, ``trace_diff_report.json``): the
totals, then per tab the largest op movers, the largest kernel movers and the rows only in A or
only in B, each row at its call site with A, B and the delta of its time, calls and share (and
TFLOPS/s and % of roofline where the report has them).

``diff_rows`` is a plain function, tested without a terminal."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static, TabbedContent, TabPane

from engine.jobs.query import RunInfo
from engine.runs import schema
from magpie_tui.screens.tabs import cycle_tab, tab_bindings
from magpie_tui.widgets.data_grid import Column, DataGrid
from magpie_tui.widgets.footer import KeysFooter

TABS = (("ops", "movers", "Op movers"), ("kernels", "movers", "Kernel movers"),
        ("ops", "only", "Only in A or B: ops"), ("kernels", "only", "Only in A or B: kernels"))


def _f(spec: str):
    return lambda v: format(v, spec)


COLUMNS = [
    Column("name", "Name", max_width=40, squeeze_to=16),
    Column("status", "In", max_width=6),
    Column("delta_us", "Δ µs", "number", fmt=_f("+,.1f")),
    Column("pct", "Δ %", "number", fmt=_f("+.1f")),
    Column("a_us", "A µs", "number", fmt=_f(",.1f")),
    Column("b_us", "B µs", "number", fmt=_f(",.1f")),
    Column("calls", "Calls A→B", max_width=14),
    Column("share", "Share % A→B", max_width=14, drop_order=3),
    Column("tflops", "TFLOPS/s A→B", max_width=16, drop_order=1),
    Column("roofline", "% roofline A→B", max_width=16, drop_order=2),
    Column("stack", "Call site", max_width=80, squeeze_to=12, ellipsis="middle"),
]
STATUS = {"both": "A B", "only_a": "A", "only_b": "B"}


def _pair(metric: dict[str, Any] | None, spec: str) -> str | None:
    if not metric or (metric.get("a") is None and metric.get("b") is None):
        return None
    a, b = metric.get("a"), metric.get("b")
    return f"{'-' if a is None else format(a, spec)} → {'-' if b is None else format(b, spec)}"


def diff_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The report's rows (movers, or only-in lists) as grid rows."""
    out = []
    for r in rows:
        tm = r.get("time_us") or {}
        out.append({"name": r["name"], "status": STATUS.get(r.get("status"), r.get("status")),
                    "delta_us": tm.get("delta"), "pct": tm.get("pct"), "a_us": tm.get("a"), "b_us": tm.get("b"),
                    "calls": _pair(r.get("calls"), "d"), "share": _pair(r.get("share_pct"), ".1f"),
                    "tflops": _pair(r.get("tflops_s"), ".2f"), "roofline": _pair(r.get("pct_roofline"), ".1f"),
                    "stack": " > ".join(r.get("stack") or []) or "-"})
    return out


def totals_text(report: schema.TraceDiffReport) -> str:
    t = report.totals or {}
    tt = t.get("time_us") or {}

    def num(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)
    unit = "GPU time" if report.basis == "gpu" else "CPU time (no GPU events)"
    lines = [f"A = {report.a.get('path')}", f"B = {report.b.get('path')}",
             f"total {unit}: {num(tt.get('a'), ',.1f')} µs → {num(tt.get('b'), ',.1f')} µs "
             f"({num(tt.get('delta'), '+,.1f')} µs, {num(tt.get('pct'), '+.2f')}%)"]
    for what in ("ops", "kernels"):
        c = t.get(what) or {}
        lines.append(f"{what}: {c.get('both', 0)} in both, {c.get('only_a', 0)} only in A, "
                     f"{c.get('only_b', 0)} only in B")
    return "\n".join(lines)


class TraceDiffScreen(Screen):
    """A trace diff's report; see the module docstring."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="trace_diff.back"),
        *tab_bindings("trace_diff"),
    ]
    FOOTER_KEYS = ("trace_diff.back",)

    def __init__(self, info: RunInfo, report: schema.TraceDiffReport) -> None:
        super().__init__()
        self.info, self.report = info, report

    def compose(self):
        yield Header()
        yield Static("", id="diff-totals", classes="report-title")
        with TabbedContent(id="diff-tabs"):
            for i, (_, _kind, label) in enumerate(TABS):
                with TabPane(label, id=f"tab-diff-{i}"):
                    yield DataGrid(COLUMNS, fixed_columns=1, id=f"diff-grid-{i}",
                                   row_class=lambda row: "muted" if row["status"] != "A B" else None)
        yield Static("Rows are matched by name and call site (the ops above, the annotations around). Movers: "
                     "largest |Δ time| first; a row in one trace only has its whole time as Δ.", classes="report-note")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.sub_title = self.info.name
        report = self.report
        if report.error:
            self.query_one("#diff-totals", Static).update(f"A = {report.a.get('path')}\nB = {report.b.get('path')}\n"
                                                          f"error: {report.error}")
        else:
            self.query_one("#diff-totals", Static).update(totals_text(report))
        for i, (what, kind, _) in enumerate(TABS):
            section = getattr(report, what) or {}
            rows = section.get("movers", []) if kind == "movers" else section.get("only_a", []) + section.get("only_b", [])
            self.query_one(f"#diff-grid-{i}", DataGrid).set_rows(diff_rows(rows))
        self.query_one("#diff-grid-0", DataGrid).focus()

    def action_next_tab(self) -> None:
        cycle_tab(self, 1)

    def action_previous_tab(self) -> None:
        cycle_tab(self, -1)

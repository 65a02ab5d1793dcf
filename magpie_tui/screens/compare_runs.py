"""Two compare runs side by side (the Runs list: mark two compare runs, ``v``).

One row per kernel: A's and B's speedup with its 95% interval, the difference, and what changed
(``higher`` / ``lower`` when B's interval lies wholly above or below A's, ``within noise`` when
they overlap), then both verdicts. The older run is A. The header says when the two runs do not
measure the same thing: another baseline (the speedups are then against different kernels and
are not compared), other kernels, another device, or kernel sources that changed.

``pair_rows`` and ``pair_warnings`` are plain functions, tested without a terminal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static

from engine.runs import schema
from engine.jobs.query import RunInfo
from magpie_tui.screens.reports import compare_rows
from magpie_tui.widgets.data_grid import Column, DataGrid
from magpie_tui.widgets.footer import KeysFooter

CompareLike = schema.CompareReport | schema.AnalyzeReport


def _ci_text(ci: tuple[float, float]) -> str:
    return f"{ci[0]:.3g}-{ci[1]:.3g}"


# What decides first (both speedups, their intervals, the difference and its reading) fits in 80
# columns; the verdicts, correctness and medians follow, the kernel stays put when scrolling.
PAIR_COLUMNS = [
    Column("kernel", "Kernel", max_width=16),
    Column("a_speedup", "A ×", "number", fmt=lambda v: f"{v:.3g}x"),
    Column("a_ci", "A 95% CI", fmt=_ci_text, max_width=13),
    Column("b_speedup", "B ×", "number", fmt=lambda v: f"{v:.3g}x"),
    Column("b_ci", "B 95% CI", fmt=_ci_text, max_width=13),
    Column("delta", "B-A", "number", fmt=lambda v: f"{v:+.3g}"),
    Column("change", "Change", max_width=24),
    Column("a_verdict", "A verdict", max_width=12),
    Column("b_verdict", "B verdict", max_width=12),
    Column("a_correct", "A correct", max_width=11),
    Column("b_correct", "B correct", max_width=11),
    Column("a_median_ms", "A median ms", "number", fmt=lambda v: f"{v:.4g}"),
    Column("b_median_ms", "B median ms", "number", fmt=lambda v: f"{v:.4g}"),
    Column("time_ratio", "B/A time", "number", fmt=lambda v: f"{v:.3g}"),
]

CHANGE_CLASS = {"higher": "correct", "lower": "incorrect", "within noise": "tie", "now incorrect": "incorrect",
                "now correct": "correct"}


def _baseline_id(report: CompareLike) -> str | None:
    baseline = getattr(report, "baseline", None)
    return baseline.id if baseline is not None else None


def _change(a: dict[str, Any] | None, b: dict[str, Any] | None, same_baseline: bool) -> str:
    """What changed from A to B for one kernel, in words (colour is never the only signal)."""
    if a is None:
        return "only in B"
    if b is None:
        return "only in A"
    if a["verdict"] == "baseline" and b["verdict"] == "baseline":
        return "baseline"
    if (a["correct"] == "yes") != (b["correct"] == "yes"):
        return "now correct" if b["correct"] == "yes" else "now incorrect"
    if a["speedup"] is None and b["speedup"] is None:  # neither timed (incorrect, cancelled): nothing to read
        return "-" if a["verdict"] == b["verdict"] else f"{a['verdict']} → {b['verdict']}"
    if not same_baseline:
        return "baselines differ"
    if a["ci"] is not None and b["ci"] is not None:
        if b["ci"][0] > a["ci"][1]:
            return "higher"
        if b["ci"][1] < a["ci"][0]:
            return "lower"
        return "within noise"
    return "no interval"  # a side without an interval (too few samples, or not timed): no reading


def pair_rows(a: CompareLike, b: CompareLike) -> list[dict[str, Any]]:
    """One row per kernel of A (in A's ranked order), then the kernels only B has."""
    rows_a = {row["kernel"]: row for row in compare_rows(a)}
    rows_b = {row["kernel"]: row for row in compare_rows(b)}
    same_baseline = _baseline_id(a) == _baseline_id(b)
    kernels = list(rows_a) + [k for k in rows_b if k not in rows_a]
    out = []
    for kernel in kernels:
        ra, rb = rows_a.get(kernel), rows_b.get(kernel)
        row: dict[str, Any] = {"kernel": kernel}
        for side, r in (("a", ra), ("b", rb)):
            row[f"{side}_speedup"] = r["speedup"] if r else None
            row[f"{side}_ci"] = r["ci"] if r else None
            row[f"{side}_verdict"] = str(r["verdict"]) if r else "absent"
            row[f"{side}_correct"] = r["correct"] if r else "absent"
            row[f"{side}_median_ms"] = r["median_ms"] if r else None
        both = ra is not None and rb is not None
        row["delta"] = (rb["speedup"] - ra["speedup"] if both and same_baseline and ra["speedup"] is not None
                        and rb["speedup"] is not None else None)
        row["time_ratio"] = (rb["median_ms"] / ra["median_ms"] if both and ra["median_ms"] and rb["median_ms"]
                             is not None else None)
        row["change"] = _change(ra, rb, same_baseline)
        out.append(row)
    return out


def _environment(report: CompareLike) -> dict[str, Any]:
    env = getattr(report, "environment", None)
    if env is None:
        return {}
    return env if isinstance(env, dict) else env.model_dump() if hasattr(env, "model_dump") else dict(env)


def pair_warnings(a: CompareLike, b: CompareLike) -> list[str]:
    """Why A and B may not measure the same thing, one line each (empty when they do)."""
    out = []
    base_a, base_b = _baseline_id(a), _baseline_id(b)
    if base_a != base_b:
        out.append(f"baselines differ (A {base_a}, B {base_b}): speedups are against different kernels and "
                   "are not compared; compare the medians (B/A time)")
    kernels_a = {row["kernel"] for row in compare_rows(a)}
    kernels_b = {row["kernel"] for row in compare_rows(b)}
    if kernels_a != kernels_b:
        only_a, only_b = sorted(kernels_a - kernels_b), sorted(kernels_b - kernels_a)
        out.append("different kernels:" + (f" only in A {', '.join(only_a)}" if only_a else "")
                   + (";" if only_a and only_b else "") + (f" only in B {', '.join(only_b)}" if only_b else ""))
    env_a, env_b = _environment(a), _environment(b)
    for key in ("gpu", "hostname", "torch"):
        if env_a.get(key) != env_b.get(key) and (env_a.get(key) or env_b.get(key)):
            out.append(f"{key} differs: A {env_a.get(key) or '-'}, B {env_b.get(key) or '-'}")
    hashes_a, hashes_b = env_a.get("source_hashes") or {}, env_b.get("source_hashes") or {}
    changed = sorted(Path(p).name for p in set(hashes_a) & set(hashes_b) if hashes_a[p] != hashes_b[p])
    if changed:
        out.append(f"sources changed between the runs: {', '.join(changed)}")
    for name, r in (("A", a), ("B", b)):
        if r.state != "completed":
            out.append(f"{name} is {r.state}: its kernels that did not finish read 'not reached' or 'cancelled'")
    return out


def run_line(name: str, info: RunInfo, report: CompareLike) -> str:
    winner = getattr(report, "winner_id", None)
    return (f"{name} = {info.name} · {report.state} · baseline {_baseline_id(report) or '-'} · "
            f"winner {winner or 'none'}")


class CompareRunsScreen(Screen):
    """Two compare (or analyze) runs' kernels next to each other; see the module docstring."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="compare_runs.back"),
        Binding("w", "swap", "Swap A/B", id="compare_runs.swap"),
    ]
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("compare_runs.back", "compare_runs.swap")

    def __init__(self, a: RunInfo, report_a: CompareLike, b: RunInfo, report_b: CompareLike) -> None:
        super().__init__()
        self.a, self.b = (a, report_a), (b, report_b)

    def compose(self):
        yield Header()
        yield Static("", id="pair-title", classes="report-title")
        yield Static("", id="pair-warnings", classes="incorrect-why")
        yield DataGrid(PAIR_COLUMNS, row_class=lambda row: CHANGE_CLASS.get(row["change"]) or (
            "muted" if row["change"].startswith("only") else None), fixed_columns=1, id="pair-grid")
        yield Static("×: speedup vs that run's baseline (baseline median / kernel median), 95% bootstrap interval. "
                     "Change: higher / lower when B's interval lies wholly above / below A's, within noise when they "
                     "overlap. w: swap A and B.", classes="report-note")
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

    def on_mount(self) -> None:
        self._show()
        self.query_one(DataGrid).focus()

    def _show(self) -> None:
        (info_a, a), (info_b, b) = self.a, self.b
        self.sub_title = f"{info_a.name} vs {info_b.name}"
        self.query_one("#pair-title", Static).update(f"{run_line('A', info_a, a)}\n{run_line('B', info_b, b)}")
        warnings = pair_warnings(a, b)
        box = self.query_one("#pair-warnings", Static)
        box.update("\n".join(f"warning: {w}" for w in warnings))
        box.display = bool(warnings)
        rows = pair_rows(a, b)
        self.query_one(DataGrid).set_rows(rows, keys=[row["kernel"] for row in rows])

    def action_swap(self) -> None:
        self.a, self.b = self.b, self.a
        self._show()

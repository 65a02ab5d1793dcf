"""Loop: one optimization loop (``magpie optimize``), live from its folder.

The chain of steps (baseline, profiled, bottlenecks, harness, candidates, integrate,
rebenchmark, verdict) comes from ``loop.json`` (``engine.loop.schema``); below it, tabs for the
highlighted step's details, the bottleneck table, the candidates' verdicts and the final verdict.
Enter on a step whose folder is a run folder opens the run screen (its report, roofline, kernel
source and diff views come from there); ``R`` resumes a loop that stopped or was killed.

Files are read by ``LoopReader.poll`` in a thread worker a few times a second: ``loop.json`` and
the bottleneck table are parsed again only when their size or mtime changed, and the run folders
of the steps are followed by a ``RunCatalog`` of their own, so a run screen opened from here
stays live. Step results are read through their typed models (``engine.loop.results``), which
leave a value of the wrong type unset, so a missing or unexpected key shows as a blank, never as
a crash; the bottleneck table is still a free dict read with type checks. The row builders are
plain functions that tests call without a terminal.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import yaml
from rich.cells import cell_len, set_cell_size
from rich.text import Text
from textual import events, work
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, Select, Static, TabbedContent, TabPane

from engine.errors import MagpieError
from engine.jobs import attach
from engine.jobs.query import (
    LOOP_FILE, BenchmarkStepResult, BottlenecksResult, CandidateRow, CandidatesResult, HarnessResult, IntegrateResult,
    LoopFile, LoopStep, Metric, ProfiledResult, RebenchmarkResult, RunCatalog, RunInfo, VerdictResult, load_loop_file,
    step_result,
)
from magpie_tui.errors import error_text
from magpie_tui.screens.reports import VERDICT_CLASS
from magpie_tui.screens.runs import format_elapsed
from magpie_tui.screens.tabs import cycle_tab, tab_bindings
from magpie_tui.widgets.data_grid import Column, DataGrid
from magpie_tui.widgets.footer import KeysFooter

# At 80 columns Tries and Elapsed step aside (the step tab has both) and Detail takes the rest of the line.
CHAIN_COLUMNS = [
    Column("n", "#", "number", width=1),
    Column("step", "Step", width=11),
    Column("state", "State", width=7),
    Column("elapsed", "Elapsed", fmt=format_elapsed, width=7, drop_order=2),
    Column("attempts", "Tries", "number", width=5, drop_order=1),
    Column("detail", "Detail", max_width=200, squeeze_to=16),
]
KILLED = "killed"  # shown for a step left ``running`` by a loop process that is gone
# The row colour (DataGrid row class) of each step state.
STEP_STATE_CLASSES = {"pending": "muted", "running": "running", "done": "correct", "failed": "incorrect",
                      "waiting": "suspect", "skipped": "tie", KILLED: "incorrect"}
SHORT_SCREEN = 36
"""Below this many lines the chain folds to its highlighted step on the bottlenecks, candidates
and verdict tabs, so that their tables have the room (at 80x24, 17 lines)."""
# Where Enter goes for a step without a run folder.
STEP_TABS = {"bottlenecks": "tab-bottlenecks", "candidates": "tab-candidates", "verdict": "tab-verdict"}
METRIC_NAMES = {"output_throughput": "output tok/s", "request_throughput": "requests/s", "median_ttft_ms": "TTFT ms",
                "median_tpot_ms": "TPOT ms", "median_itl_ms": "ITL ms", "median_e2el_ms": "E2EL ms",
                "failed": "failed"}


# -- reading values that may be of any type -------------------------------------------------------

def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def fmt_number(value: Any, spec: str = ".4g") -> str:
    number = _number(value)
    return format(number, spec) if number is not None else _text(value)


def fmt_ci(value: Any, spec: str = ".4g") -> str:
    """``[lo, hi]`` of a two-number list; blank otherwise."""
    pair = _list(value)
    if len(pair) != 2 or _number(pair[0]) is None or _number(pair[1]) is None:
        return ""
    return f"[{format(pair[0], spec)}, {format(pair[1], spec)}]"


def fmt_metric(value: Any) -> str:
    """A metric as the loop records it: ``{"mean", "ci95"}`` (over repeats) or a bare number."""
    if isinstance(value, dict):
        return " ".join(p for p in (fmt_number(value.get("mean")), fmt_ci(value.get("ci95"))) if p)
    return fmt_number(value)


def _metric_text(value: Metric | float) -> str:
    if isinstance(value, Metric):
        return " ".join(p for p in (fmt_number(value.mean), fmt_ci(value.ci95)) if p)
    return fmt_number(value)


def _metrics_line(r: BenchmarkStepResult) -> str:
    """Throughput, TTFT and TPOT (mean [95% CI]), failures when there were any, and the repeats."""
    parts = [f"{METRIC_NAMES[key]} {_metric_text(r.metrics[key])}" for key in ("output_throughput", "median_ttft_ms",
                                                                              "median_tpot_ms")
             if key in r.metrics and _metric_text(r.metrics[key])]
    failed = r.metrics.get("failed")
    failed = failed.mean if isinstance(failed, Metric) else failed
    if failed:
        parts.append(f"{fmt_number(failed, '.3g')} failed")
    if r.repeats is not None:
        parts.append(f"{r.repeats} repeats")
    return " · ".join(parts)


# -- one-line summaries ------------------------------------------------------------------------

def _short_profiled(r: ProfiledResult) -> str:
    fields = [(d.field or "").removeprefix("benchmark.") for d in r.config_diff]
    diff = f"{len(fields)} config change(s): {', '.join(f for f in fields if f)}" if fields else ""
    return " · ".join(p for p in (_metrics_line(r.model_copy(update={"repeats": None})), diff) if p)


def _short_bottlenecks(r: BottlenecksResult) -> str:
    top = r.top_replaceable
    device = f" · {r.device}" if r.device else ""
    if top is None:
        return f"no replaceable op ({r.device})" if r.device else ""
    extra = ", ".join(p for p in (f"{top.calls:.0f} calls" if top.calls is not None else "", top.confidence or "") if p)
    text = f"top replaceable: {top.registry_op or '?'} {fmt_number(top.share_pct, '.1f')}%"
    return text + (f" ({extra})" if extra else "") + device


def _short_harness(r: HarnessResult) -> str:
    return " · ".join(p for p in (r.op or "", f"{len(r.shapes)} shape(s)" if r.shapes else "", r.file or "") if p)


def _short_candidates(r: CandidatesResult) -> str:
    counted = f"{len([x for x in r.rows if x.origin != 'baseline'])} candidate(s)" if r.rows else ""
    if r.winner:
        row = next((x for x in r.rows if x.id == r.winner), CandidateRow())
        speed = f" {row.speedup:.3f}x" if row.speedup is not None else ""
        head = f"winner {r.winner}{speed} {fmt_ci(row.ci95, '.3f')}".rstrip()
    elif r.decided:
        head = "no winner" + (f" (stopped: {r.stopped})" if r.stopped else "")
    else:
        head = ""
    return " · ".join(p for p in (head, counted) if p)


def _short_integrate(r: IntegrateResult) -> str:
    parts = [", ".join(f"{k} -> {v}" for k, v in r.kernels.items()),
             f"{len(r.changed)} config change(s)" if r.changed else ""]
    return " · ".join(p for p in parts if p)


def _short_rebenchmark(r: RebenchmarkResult) -> str:
    after = r.kernel_after
    share = f"kernel now {after.share_pct:.1f}% of time" if after is not None and after.share_pct is not None else ""
    return " · ".join(p for p in (_metrics_line(r), share) if p)


def _short_verdict(r: VerdictResult) -> str:
    if not r.decided and not r.message:
        return ""
    head = "success" if r.success is True else "no success"
    return f"{head}: {r.message}" if r.message else head


_SHORT = {"baseline": _metrics_line, "profiled": _short_profiled, "bottlenecks": _short_bottlenecks,
          "harness": _short_harness, "candidates": _short_candidates, "integrate": _short_integrate,
          "rebenchmark": _short_rebenchmark, "verdict": _short_verdict}


def short_result(step: LoopStep) -> str:
    """The step's result in one line (blank when it has none, or none this screen knows)."""
    summary = _SHORT.get(step.name)
    return summary(step_result(step)) if summary is not None else ""


def step_state(step: LoopStep, dead: Iterable[str]) -> str:
    return KILLED if step.state == "running" and step.name in dead else step.state


def step_detail(step: LoopStep, dead: Iterable[str]) -> str:
    """What the chain says about a step: its error, that it was killed, its result, or why it waits."""
    if step.error:
        return step.error
    if step_state(step, dead) == KILLED:
        return f"process {step.pid} is gone: the loop was killed here (R resumes)"
    return short_result(step) or step.reason or ""


def chain_rows(loop: LoopFile, dead: Iterable[str], now: float | None = None) -> list[dict[str, Any]]:
    """One row per step: number, name, state (``killed`` for a dead running step), elapsed, attempts, detail."""
    now = time.time() if now is None else now
    dead = set(dead)
    rows = []
    for index, step in enumerate(loop.steps, 1):
        state = step_state(step, dead)
        elapsed = None
        if step.started is not None and state != KILLED:
            elapsed = max(0.0, (step.finished if step.finished is not None else now) - step.started)
        rows.append({"n": index, "step": step.name, "state": state, "elapsed": elapsed, "attempts": step.attempts,
                     "detail": step_detail(step, dead)})
    return rows


# -- the step pane -------------------------------------------------------------------------------

def _when(ts: Any) -> str:
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S") if _number(ts) is not None else "-"


def _field_changes(items: list) -> list[str] | None:
    """``field: a -> b`` lines for a list of {field, <before>, <after>} (config diffs); None if it is not one."""
    rows = [_dict(i) for i in items]
    if not rows or not all("field" in r and len(r) == 3 for r in rows):
        return None
    return [f"  {r['field']}: " + " -> ".join(repr(v) for k, v in r.items() if k != "field") for r in rows]


def step_text(step: LoopStep, index: int, dead: Iterable[str]) -> str:
    """Everything the loop recorded about one step, readable: metrics and config diffs laid out,
    the rest of the result as YAML."""
    state = step_state(step, dead)
    elapsed = format_elapsed(step.elapsed_s) if step.started is not None and state != KILLED else "-"
    lines = [f"{index}. {step.name} — {state}, attempt {step.attempts}, elapsed {elapsed} "
             f"(started {_when(step.started)}, finished {_when(step.finished)})",
             f"folder: {step.run_dir or '-'}   pid: {step.pid if step.pid is not None else '-'}"]
    if state == KILLED:
        lines.append(f"killed: process {step.pid} is gone and never finished the step; R resumes the loop")
    if step.error:
        lines.append(f"error: {step.error}")
    if step.reason:
        lines.append(f"reason: {step.reason}")
    result = dict(_dict(step.result))
    metrics = _dict(result.pop("metrics", None))
    if metrics:
        lines += ["", "metrics (mean [95% CI] over the repeats):"]
        lines += [f"  {METRIC_NAMES.get(k, k):<14} {fmt_metric(v)}" for k, v in metrics.items()]
    for key in [k for k, v in result.items() if isinstance(v, list)]:
        changes = _field_changes(result[key])
        if changes is not None:
            lines += ["", f"{key}:"] + changes
            del result[key]
    if result:
        lines += ["", "result:", yaml.safe_dump(result, sort_keys=False, default_flow_style=False,
                                                allow_unicode=True).rstrip()]
    elif not metrics:
        lines += ["", "no result recorded yet"]
    return "\n".join(lines)


# -- bottlenecks -----------------------------------------------------------------------------------

# At 80 columns: rank, op, share and what replaces it; the rest steps aside, the last first.
BOTTLENECK_COLUMNS = [
    Column("rank", "#", "number", fmt=lambda v: f"{v:.0f}", min_width=2),
    Column("name", "Op", max_width=36, squeeze_to=16),
    Column("share_pct", "Share %", "number", fmt=lambda v: f"{v:.1f}", width=7),
    Column("replace", "Replace", max_width=26, squeeze_to=14),
    Column("time_us", "Time us", "number", fmt=lambda v: f"{v:,.0f}", drop_order=8),
    Column("calls", "Calls", "number", fmt=lambda v: f"{v:.0f}", drop_order=6),
    Column("avg_us", "Avg us", "number", fmt=lambda v: f"{v:.4g}", drop_order=5),
    Column("confidence", "Mapping", max_width=30, drop_order=7),
    Column("bound", "Bound", max_width=14, drop_order=4),
    Column("roofline_pct", "% roof", "number", fmt=lambda v: f"{v:.1f}", drop_order=3),
    Column("why_not", "Why not replaceable", max_width=50, drop_order=2, squeeze_to=20),
    Column("behind", "Behind it", max_width=80, drop_order=1, squeeze_to=20),
]


def bottleneck_stages(table: Any) -> list[str]:
    return [str(s) for s in _dict(_dict(table).get("stages"))]


def bottleneck_rows(table: Any, stage: str) -> list[dict[str, Any]]:
    """The rows of one stage of ``bottlenecks.json``, flattened for the grid; replaceable rows say
    which registry op replaces them."""
    rows = []
    for i, raw in enumerate(_list(_dict(_dict(_dict(table).get("stages")).get(stage)).get("rows")), 1):
        row = _dict(raw)
        mapping = _dict(row.get("mapping"))
        behind = [_dict(b) for b in _list(row.get("behind"))]
        replaceable = row.get("replaceable") is True
        rows.append({
            "rank": _number(row.get("rank")) if _number(row.get("rank")) is not None else i,
            "name": _text(row.get("name")),
            "replace": (f"yes: {row.get('registry_op') or '?'}" if replaceable else ""),
            "replaceable": replaceable,
            "share_pct": _number(row.get("share_pct")),
            "time_us": _number(row.get("time_us")),
            "calls": _number(row.get("calls")),
            "avg_us": _number(row.get("avg_us")),
            "confidence": _mapping_text(mapping),
            "bound": _text(row.get("bound")),
            "roofline_pct": _number(row.get("roofline_pct")),
            "why_not": _text(row.get("why_not")),
            "behind": ", ".join(f"{_text(b.get('name'))} {fmt_number(b.get('time_us'), '.0f')}us" for b in behind
                                if b.get("name")),
        })
    return rows


def _mapping_text(mapping: dict) -> str:
    """How sure the trace-to-op mapping is (``high (call-site annotation)``); blank when there is none."""
    confidence, method = _text(mapping.get("confidence")), _text(mapping.get("method"))
    if confidence in ("", "none") and method in ("", "none"):
        return ""
    return f"{confidence} ({method})" if method and method != "none" else confidence


def bottleneck_note(table: Any, stage: str) -> str:
    t = _dict(table)
    st = _dict(_dict(t.get("stages")).get(stage))
    window = _dict(t.get("window"))
    parts = [f"device {t['device']}" if t.get("device") else "", _text(t.get("time_basis")),
             f"{st['steps']} step(s)" if _number(st.get("steps")) is not None else "",
             f"{fmt_number(st.get('accounted_time_us'), ',.0f')} of {fmt_number(st.get('step_time_us'), ',.0f')} us "
             "accounted" if _number(st.get("accounted_time_us")) is not None and _number(st.get("step_time_us"))
             is not None else "",
             _text(window.get("rule"))]
    return " · ".join(p for p in parts if p) + "\nn: next stage; Replace names the registry op of a replaceable row"


# -- candidates ----------------------------------------------------------------------------------

CANDIDATE_COLUMNS = [
    Column("winner", "W", min_width=1, max_width=1),
    Column("id", "Candidate", max_width=32, squeeze_to=12),
    Column("origin", "Origin", max_width=10, drop_order=3),
    Column("correct", "Correct", min_width=7, width=7),
    Column("verdict", "Verdict", squeeze_to=9),
    Column("speedup", "Speedup", "number", fmt=lambda v: f"{v:.3f}x", width=7),
    Column("ci_low", "95% CI", "number", fmt=lambda v: f"{v:.3f}", width=6),
    Column("ci_high", "high", "number", fmt=lambda v: f"{v:.3f}", width=6),
    Column("median_ms", "Median ms", "number", fmt=lambda v: f"{v:.4g}", drop_order=4),
    Column("reason", "Why", max_width=70, drop_order=2, squeeze_to=16),
    Column("source", "Source", max_width=60, drop_order=1),
]


def candidate_rows(result: Any) -> list[dict[str, Any]]:
    """The candidates step's rows, in the order the loop ranked them; the winner marked."""
    r = result if isinstance(result, CandidatesResult) else CandidatesResult.model_validate(result)
    rows = []
    for i, row in enumerate(r.rows):
        ci = row.ci95 or [None, None]
        rows.append({
            "key": f"{i}:{row.id}",
            "winner": "*" if r.winner is not None and row.id == r.winner else "",
            "id": row.id or "?",
            "origin": row.origin or "",
            "correct": {True: "yes", False: "no"}.get(row.correct, ""),
            "verdict": row.verdict or "",
            "speedup": row.speedup,
            "ci_low": ci[0],
            "ci_high": ci[1],
            "median_ms": row.median_ms,
            "reason": row.reason or "",
            "source": row.source or "",
        })
    return rows


def candidates_note(loop: LoopFile | None) -> str:
    if loop is None:
        return ""
    cand, harness = _step(loop, "candidates"), _step(loop, "harness")
    r = step_result(cand) if cand is not None else CandidatesResult()
    op = step_result(harness).op if harness is not None else None
    parts = [f"op {op}" if op else "", f"winner {r.winner}" if r.winner else
             ("no winner" if "winner" in r.model_fields_set else ""), f"stopped: {r.stopped}" if r.stopped else "",
             f"compare run {r.compare_run} (enter on the step opens it)" if r.compare_run else ""]
    text = " · ".join(p for p in parts if p)
    return text or "no candidates yet: the candidates step has not run"


# -- verdict ---------------------------------------------------------------------------------------

# Every column fits 80 columns whole (short labels; the means give way first): the intervals are
# what the verdict stands on.
E2E_COLUMNS = [
    Column("metric", "Metric", max_width=28, squeeze_to=12),
    Column("baseline_mean", "Base", "number", fmt=lambda v: f"{v:.4g}", squeeze_to=5),
    Column("baseline_ci95", "95% CI", max_width=26, squeeze_to=14),
    Column("new_mean", "New", "number", fmt=lambda v: f"{v:.4g}", squeeze_to=6),
    Column("new_ci95", "95% CI", max_width=26, squeeze_to=14),
    Column("delta_pct", "Δ%", "number", fmt=lambda v: f"{v:+.1f}" if abs(v) < 10 else f"{v:+.0f}"),
    Column("verdict", "Verdict", max_width=14, squeeze_to=12),
]
CHECK_COLUMNS = [Column("ok", "Check", width=5), Column("name", "Name", max_width=36),
                 Column("detail", "Detail", max_width=160, squeeze_to=24)]
E2E_CLASS = {"better": "correct", "worse": "incorrect", "within noise": "tie"}


def verdict_rows(result: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(end-to-end deltas, checks) of the verdict step."""
    r = result if isinstance(result, VerdictResult) else VerdictResult.model_validate(result)
    e2e = [{"metric": METRIC_NAMES.get(row.metric or "", row.metric or "") or "?",
            "baseline_mean": row.baseline_mean, "baseline_ci95": fmt_ci(row.baseline_ci95, ".3g"),
            "new_mean": row.new_mean, "new_ci95": fmt_ci(row.new_ci95, ".3g"),
            "delta_pct": row.delta_pct, "verdict": row.verdict or ""} for row in r.end_to_end]
    checks = [{"ok": {True: "pass", False: "FAIL"}.get(row.ok, "?"), "name": row.name or "?", "detail": row.detail or ""}
              for row in r.checks]
    return e2e, checks


def verdict_headline(step: LoopStep | None) -> tuple[str, str | None]:
    """(text, ``-success``/``-failure``/None) for the top of the verdict pane."""
    if step is None:
        return "this loop has no verdict step", None
    r = step_result(step)
    if step.state != "done" or not r.decided:
        why = step.error or step.reason or f"the verdict step is {step.state}"
        return f"no verdict yet: {why}", None
    success = r.success is True
    lines = [("SUCCESS" if success else "NO GAIN") + (f": {r.message}" if r.message else "")]
    if r.kernel is not None and r.kernel.speedup is not None:
        lines.append(f"kernel speedup {r.kernel.speedup:.3f}x {fmt_ci(r.kernel.ci95, '.3f')}".rstrip())
    if "top_bottleneck_after" in r.model_fields_set or "top_bottleneck_after" in (step.result or {}):
        lines.append(f"top bottleneck after: {r.top_bottleneck_after or 'none'}")
    return "\n".join(lines), "-success" if success else "-failure"


def _ending(info: RunInfo) -> tuple[str, str]:
    """How a finished loop ended, as its run state says (the Runs list's words)."""
    outcome = info.figures.outcome if info.figures is not None else None
    return outcome or "", f"exit {info.exit_code}" if info.exit_code else ""


def _step(loop: LoopFile, name: str) -> LoopStep | None:
    return next((s for s in loop.steps if s.name == name), None)


# -- reading the folder ----------------------------------------------------------------------------

@dataclass
class LoopView:
    """One poll of a loop folder, as the screen shows it."""

    root: Path
    loop: LoopFile | None = None
    problem: str | None = None  # why loop.json could not be read (the last good one is kept)
    dead: frozenset[str] = frozenset()  # steps left ``running`` by a process that is gone
    live: dict[str, int] = field(default_factory=dict)  # step -> pid of the live process running it
    runs: dict[str, RunInfo] = field(default_factory=dict)  # step -> its run folder
    table: dict | None = None  # bottlenecks.json
    table_problem: str | None = None
    loop_version: int = 0  # bumped when loop.json was parsed again
    table_version: int = 0


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def step_run_folders(root: Path, step: LoopStep) -> list[Path]:
    """Where a step's run folder may be, the first that exists wins: its ``run_dir``, then a
    compare run (candidates) or a run the result names (rebenchmark's profiled run)."""
    result = _dict(step.result)
    rels = [step.run_dir, result.get("compare_run"), result.get("run_dir")]
    return [root / rel for rel in rels if isinstance(rel, str) and rel]


class LoopReader:
    """Reads a loop folder. ``poll`` blocks (stats, JSON reads, a /proc read per running step):
    call it from a thread worker, one at a time."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.view = LoopView(self.root)
        self._loop_sig: tuple[int, int] | None = None
        self._table_sig: tuple[Path, tuple[int, int] | None] | None = None
        # The steps' run folders, kept live (and marked lost when their process died) as the app's catalog does.
        self._runs = RunCatalog([])

    def poll(self) -> LoopView:
        v = self.view
        sig = _signature(self.root / LOOP_FILE)
        if sig != self._loop_sig or v.loop is None:
            self._loop_sig = sig
            try:
                v.loop, v.problem = load_loop_file(self.root), None
                v.loop_version += 1
            except MagpieError as exc:
                v.problem = error_text(exc)
        if v.loop is not None:
            self._poll_processes(v.loop)
            self._poll_runs(v.loop)
            self._poll_table(v.loop)
        return dataclasses.replace(v)  # a snapshot: the next poll may replace the fields, never mutate them

    def _poll_processes(self, loop: LoopFile) -> None:
        dead, live = set(), {}
        for step in loop.steps:
            if step.state == "running" and step.pid is not None:
                if step.process_alive(self.root):  # pid and start time: a reused pid is not the loop
                    live[step.name] = step.pid
                else:
                    dead.add(step.name)
        self.view.dead, self.view.live = frozenset(dead), live

    def _poll_runs(self, loop: LoopFile) -> None:
        found: dict[str, Path] = {}
        for step in loop.steps:
            folder = next((p for p in step_run_folders(self.root, step) if (p / "events.jsonl").is_file()), None)
            if folder is not None:
                found[step.name] = folder
        self._runs.roots = list(found.values())
        self._runs.refresh()
        self.view.runs = {name: self._runs.runs[p] for name, p in found.items() if p in self._runs.runs}

    def _poll_table(self, loop: LoopFile) -> None:
        step = _step(loop, "bottlenecks")
        rel = _dict(step.result).get("table") if step is not None else None
        v = self.view
        if not isinstance(rel, str) or not rel:
            if v.table is not None or self._table_sig is not None:
                v.table, v.table_problem, self._table_sig = None, None, None
                v.table_version += 1
            return
        path = self.root / rel
        sig = (path, _signature(path))
        if sig == self._table_sig:
            return
        self._table_sig = sig
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            v.table, v.table_problem = (data, None) if isinstance(data, dict) else (None, f"{path}: not a table")
        except (OSError, ValueError) as exc:
            v.table, v.table_problem = None, f"{path}: {exc}"
        v.table_version += 1


# -- the screen ------------------------------------------------------------------------------------

MORE_HINT = " m: more"


class Note(Widget):
    """A note shown in one line (cut, ending in ``… m: more`` when there is more) until
    ``expanded``, then in all its lines. ``text`` is the whole note."""

    DEFAULT_CSS = "Note { height: auto; }"
    expanded: reactive[bool] = reactive(False, layout=True)

    def __init__(self, text: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.text = text

    def update(self, text: str | Text) -> None:
        text = text.plain if isinstance(text, Text) else str(text)
        if text != self.text:
            self.text = text
            self.refresh(layout=True)

    @property
    def folded(self) -> bool:
        """True when the one line shown leaves something out."""
        first, _, rest = self.text.partition("\n")
        return not self.expanded and (bool(rest.strip()) or cell_len(first) > self.size.width)

    def render(self) -> Text:
        if self.expanded:
            return Text(self.text)
        first = self.text.partition("\n")[0]
        width = self.size.width
        if not self.folded or width <= len(MORE_HINT) + 4:
            return Text(first, no_wrap=True, overflow="ellipsis")
        room = width - len(MORE_HINT) - 2
        line = Text(first + " ·" if cell_len(first) <= room else set_cell_size(first, room).rstrip() + "…",
                    no_wrap=True, overflow="ellipsis")
        line.append(MORE_HINT, style="italic")
        return line


class LoopScreen(Screen):
    DEFAULT_CSS = """
    LoopScreen #loop-status { padding: 0 1; background: $panel; }
    LoopScreen #loop-status.-running { color: $running; }
    LoopScreen #loop-status.-completed { color: $correct; }
    LoopScreen #loop-status.-failed, LoopScreen #loop-status.-lost { color: $incorrect; }
    LoopScreen #loop-status.-cancelled { color: $muted; }
    LoopScreen #loop-chain { height: auto; max-height: 12; }
    LoopScreen.-fold #loop-chain { height: 2; scrollbar-size-vertical: 0; }
    LoopScreen #loop-tabs { height: 1fr; }
    LoopScreen .loop-note { padding: 0 1; color: $text-muted; }
    LoopScreen #bottleneck-controls { height: auto; }
    LoopScreen #bottleneck-stage { width: 22; }
    LoopScreen #bottleneck-note { width: 1fr; }
    LoopScreen #verdict-headline { padding: 0 1; text-style: bold; }
    LoopScreen #verdict-headline.-success { color: $correct; }
    LoopScreen #verdict-headline.-failure { color: $incorrect; }
    LoopScreen #verdict-e2e { height: auto; max-height: 12; }
    LoopScreen #verdict-checks { height: 1fr; min-height: 3; }
    """

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back", id="loop.back"),
        Binding("enter,o", "open_step", "Open step", id="loop.open"),
        Binding("r", "open_report", "Report", id="loop.report"),
        Binding("R", "resume_loop", "Resume", id="loop.resume"),
        Binding("c", "cancel_loop", "Cancel loop", id="loop.cancel"),
        Binding("i", "show_tab('tab-step')", "Step", id="loop.step"),
        Binding("b", "show_tab('tab-bottlenecks')", "Bottlenecks", id="loop.bottlenecks"),
        Binding("a", "show_tab('tab-candidates')", "Candidates", id="loop.candidates"),  # j/k: rows
        Binding("v", "show_tab('tab-verdict')", "Verdict", id="loop.verdict"),
        Binding("n", "next_stage", "Next stage", id="loop.next_stage"),
        Binding("m", "toggle_notes", "More", id="loop.more",
                tooltip="Show the notes (status, bottleneck note, verdict headline) whole, or in one line again"),
    ] + tab_bindings("loop")
    # The keys the footer keeps longest at 80 columns, most needed first (KeysFooter).
    FOOTER_KEYS = ("loop.back", "loop.open", "loop.report", "loop.cancel", "loop.next_tab", "loop.resume")

    def __init__(self, root: Path, tab: str | None = None) -> None:
        super().__init__()
        self.root = Path(root)
        self.initial_tab = tab
        self.reader = LoopReader(self.root)
        self.view: LoopView | None = None
        self._reading = None  # the poll worker in flight
        self._shown = (-1, -1)  # (loop_version, table_version) on screen
        self._resuming = False
        self._resumed_pid: int | None = None
        self._step_text = ""
        self._chain: list[dict[str, Any]] = []

    def compose(self):
        yield Header()
        yield Note("reading loop.json ...", id="loop-status")
        yield DataGrid(CHAIN_COLUMNS, id="loop-chain", select_label="Open step",
                       row_class=lambda row: STEP_STATE_CLASSES.get(row["state"], "muted"))
        with TabbedContent(id="loop-tabs", initial=self.initial_tab or "tab-step"):
            with TabPane("Step", id="tab-step"):
                yield VerticalScroll(Static("", id="step-text"), id="step-scroll")
            with TabPane("Bottlenecks", id="tab-bottlenecks"):
                with Horizontal(id="bottleneck-controls"):
                    yield Select([], prompt="no table yet", id="bottleneck-stage", compact=True)
                    yield Note(id="bottleneck-note", classes="loop-note")
                yield DataGrid(BOTTLENECK_COLUMNS, id="bottleneck-grid", fixed_columns=2,
                               row_class=lambda row: "correct" if row["replaceable"] else None)
            with TabPane("Candidates", id="tab-candidates"):
                yield Note(id="candidates-note", classes="loop-note")
                yield DataGrid(CANDIDATE_COLUMNS, id="candidates-grid", fixed_columns=2,
                               row_class=lambda row: VERDICT_CLASS.get(row["verdict"]))
            with TabPane("Verdict", id="tab-verdict"):
                yield Note(id="verdict-headline")
                yield DataGrid(E2E_COLUMNS, id="verdict-e2e", fixed_columns=1,
                               row_class=lambda row: E2E_CLASS.get(row["verdict"]))
                yield DataGrid(CHECK_COLUMNS, id="verdict-checks",
                               row_class=lambda row: {"pass": "correct", "FAIL": "incorrect"}.get(row["ok"]))
        yield KeysFooter()  # its keys fit the width; ctrl+p still opens the palette, Help says so

    def on_mount(self) -> None:
        self.sub_title = self.root.name
        self.query_one("#loop-chain", DataGrid).focus()
        self._fold()
        self._poll()
        self.set_interval(getattr(self.app, "poll_interval", 0.5), self._poll)

    # -- folding for a short terminal ------------------------------------------------------------
    def on_resize(self, event: events.Resize) -> None:
        self._fold()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.tabbed_content.id == "loop-tabs":
            self._fold()

    def _fold(self) -> None:
        """On a short terminal the bottlenecks, candidates and verdict tabs take the chain's
        lines: it folds to its header and the highlighted step (j/k still move it; i unfolds)."""
        tabs = self.query_one("#loop-tabs", TabbedContent)
        self.set_class(self.size.height < SHORT_SCREEN and tabs.active not in ("tab-step", ""), "-fold")
        self.call_after_refresh(self.query_one("#loop-chain", DataGrid)._scroll_cursor_into_view)

    def action_toggle_notes(self) -> None:
        notes = list(self.query(Note))
        expand = not any(n.expanded for n in notes)
        for note in notes:
            note.expanded = expand

    # -- polling ---------------------------------------------------------------------------------
    def _poll(self) -> None:
        # Back-pressure: a slow disk skips ticks instead of piling up reads.
        if self._reading is None or self._reading.is_finished:
            self._reading = self._read()

    @work(thread=True, exclusive=True, group="loop-files", exit_on_error=False,
          description="read the loop file, the bottleneck table and the steps' run folders")
    def _read(self) -> None:
        view = self.reader.poll()
        self.app.call_from_thread(self._show, view)

    def _show(self, view: LoopView) -> None:
        if not self.is_mounted:
            return
        self.view = view
        self._show_status()
        self._show_chain()
        loop_version, table_version = self._shown
        self._show_step()  # a running step's elapsed time, a process that died
        if view.loop_version != loop_version:
            self._show_candidates()
            self._show_verdict()
        if view.table_version != table_version:
            self._show_stages()
        self._shown = (view.loop_version, view.table_version)

    # -- rendering -------------------------------------------------------------------------------
    def loop_info(self) -> RunInfo | None:
        """The loop's own run, as the app's catalog sees it (state, pid)."""
        return self.app.run_by_path(self.root) if hasattr(self.app, "run_by_path") else None

    def _show_status(self) -> None:
        view = self.view
        status = self.query_one("#loop-status", Note)
        if view is None or view.loop is None:
            status.update(Text(view.problem if view is not None and view.problem else "reading loop.json ..."))
            return
        loop, info = view.loop, self.loop_info()
        # Not under a results root the app watches: say what loop.json alone tells.
        state = info.state if info is not None else ("running" if view.live else "stopped")
        if view.dead:
            state = "killed"
        skipped = sum(1 for s in loop.steps if s.state == "skipped")  # counted as the Runs list counts them
        # What to do next before what the loop is: at 80 columns the line is cut at its end.
        parts = [state, f"{loop.settled_steps()}/{len(loop.steps)} steps done" + (f" ({skipped} skipped)" if skipped else ""),
                 *(_ending(info) if info is not None and info.is_finished else ()),
                 "R: resume" if self._resume_refusal() is None else "", view.problem or "",
                 loop.label, f"until {loop.until}" if loop.until else "", f"config {loop.config}"]
        status.update(Text("  ·  ".join(p for p in parts if p)))
        for name in ("running", "completed", "failed", "lost", "cancelled"):
            status.set_class(state == name or (name == "lost" and state == "killed"), f"-{name}")

    def _show_chain(self) -> None:
        if self.view is None or self.view.loop is None:
            return
        rows = chain_rows(self.view.loop, self.view.dead)
        for row in rows:
            row["detail"] = row["detail"].splitlines()[0] if row["detail"] else ""  # one line; the step tab has the rest
        if rows != self._chain:
            self._chain = rows
            self.query_one("#loop-chain", DataGrid).set_rows(rows, keys=[row["step"] for row in rows])

    def selected_step(self) -> tuple[int, LoopStep] | None:
        grid = self.query_one("#loop-chain", DataGrid)
        if self.view is None or self.view.loop is None or not grid.visible_count:
            return None
        index = grid.cursor_position
        steps = self.view.loop.steps
        return (index + 1, steps[index]) if 0 <= index < len(steps) else None

    def on_data_grid_row_highlighted(self, event: DataGrid.RowHighlighted) -> None:
        if event.grid.id == "loop-chain":
            self._show_step()

    def on_data_grid_row_selected(self, event: DataGrid.RowSelected) -> None:
        if event.grid.id == "loop-chain":
            event.stop()
            self.action_open_step()

    def _show_step(self) -> None:
        chosen = self.selected_step()
        text = step_text(chosen[1], chosen[0], self.view.dead) if chosen else "no step"
        if text != self._step_text:
            self._step_text = text
            self.query_one("#step-text", Static).update(Text(text))

    def _show_stages(self) -> None:
        view = self.view
        choice = self.query_one("#bottleneck-stage", Select)
        stages = bottleneck_stages(view.table) if view.table is not None else []
        current = None if choice.is_blank() else choice.value
        choice.set_options([(s, s) for s in stages])
        if stages:
            choice.value = current if current in stages else ("all" if "all" in stages else stages[0])
        self._show_bottlenecks()

    def _show_bottlenecks(self) -> None:
        view = self.view
        choice = self.query_one("#bottleneck-stage", Select)
        note = self.query_one("#bottleneck-note", Note)
        grid = self.query_one("#bottleneck-grid", DataGrid)
        if view is None or view.table is None:
            grid.set_rows([])
            step = _step(view.loop, "bottlenecks") if view is not None and view.loop is not None else None
            why = view.table_problem if view is not None and view.table_problem else (
                f"no bottleneck table yet: the bottlenecks step is {step.state if step else 'missing'}")
            note.update(Text(why))
            return
        stage = None if choice.is_blank() else str(choice.value)
        rows = bottleneck_rows(view.table, stage) if stage else []
        grid.set_rows(rows, keys=[f"{i}:{r['name']}" for i, r in enumerate(rows)])
        note.update(Text(bottleneck_note(view.table, stage) if stage else "the table has no stages"))

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "bottleneck-stage":
            self._show_bottlenecks()

    def _show_candidates(self) -> None:
        loop = self.view.loop if self.view is not None else None
        step = _step(loop, "candidates") if loop is not None else None
        rows = candidate_rows(step.result) if step is not None else []
        self.query_one("#candidates-grid", DataGrid).set_rows(rows, keys=[r["key"] for r in rows])
        self.query_one("#candidates-note", Note).update(Text(candidates_note(loop)))

    def _show_verdict(self) -> None:
        loop = self.view.loop if self.view is not None else None
        step = _step(loop, "verdict") if loop is not None else None
        text, cls = verdict_headline(step)
        headline = self.query_one("#verdict-headline", Note)
        headline.update(Text(text))
        headline.set_class(cls == "-success", "-success")
        headline.set_class(cls == "-failure", "-failure")
        e2e, checks = verdict_rows(step.result if step is not None else {})
        self.query_one("#verdict-e2e", DataGrid).set_rows(e2e, keys=[f"{i}:{r['metric']}" for i, r in enumerate(e2e)])
        self.query_one("#verdict-checks", DataGrid).set_rows(checks, keys=[f"{i}:{r['name']}"
                                                                           for i, r in enumerate(checks)])

    # -- actions ---------------------------------------------------------------------------------
    def action_show_tab(self, tab: str) -> None:
        self.query_one("#loop-tabs", TabbedContent).active = tab

    def action_next_tab(self) -> None:
        cycle_tab(self, 1, focus=False)  # the chain keeps the focus: enter, r and c act on its step

    def action_previous_tab(self) -> None:
        cycle_tab(self, -1, focus=False)

    def action_next_stage(self) -> None:
        choice = self.query_one("#bottleneck-stage", Select)
        stages = bottleneck_stages(self.view.table) if self.view is not None and self.view.table else []
        if not stages:
            self.notify("no bottleneck table yet", severity="warning")
            return
        self.action_show_tab("tab-bottlenecks")
        current = stages.index(choice.value) if not choice.is_blank() and choice.value in stages else -1
        choice.value = stages[(current + 1) % len(stages)]

    def action_open_step(self) -> None:
        chosen = self.selected_step()
        if chosen is None:
            return
        step = chosen[1]
        info = self.view.runs.get(step.name)
        if info is not None:
            self.app.open_run(info)
            return
        self.action_show_tab(STEP_TABS.get(step.name, "tab-step"))
        if step.name not in STEP_TABS:
            self.notify(f"step {step.name} has no run folder ({step.state})", severity="information")

    def action_open_report(self) -> None:
        chosen = self.selected_step()
        if chosen is None:
            return
        info = self.view.runs.get(chosen[1].name)
        if info is None:
            self.notify(f"step {chosen[1].name} has no run folder, so no report", severity="warning")
            return
        self.app.open_report(info)

    def _resume_refusal(self) -> str | None:
        """Why the loop cannot be resumed now, or None when it can (nothing of it runs)."""
        view = self.view
        if view is None or view.loop is None:
            return "the loop file has not been read"
        if self._resuming:
            return "a resume is starting"
        if view.live:
            name, pid = next(iter(view.live.items()))
            return f"step {name} is running (process {pid})"
        info = self.loop_info()
        if info is not None and info.state == "running":
            return f"the loop is running (process {info.pid})"
        started = getattr(self.app, "started", {}).get(self._resumed_pid)
        if started is not None and started.process.poll() is None:
            return f"the resume started in process {started.pid} is still running"
        return None

    def action_resume_loop(self) -> None:
        refusal = self._resume_refusal()
        if refusal is not None:
            self.notify(f"cannot resume: {refusal}", severity="warning")
            return
        info = self.loop_info()
        if info is not None and info.state == "completed":
            # Nothing is left to run: a resume of a completed loop is asked for, never assumed.
            from magpie_tui.screens.confirm import ConfirmScreen
            self.app.push_screen(ConfirmScreen(f"Resume the loop {info.name}?\nIt has completed "
                                               f"({info.progress_text}); steps that are done are not run again.",
                                               yes="Resume"),
                                 lambda yes: self._start_resume() if yes else None)
            return
        self._start_resume()

    def _start_resume(self) -> None:
        if self._resume_refusal() is not None:  # something started while the question was open
            return
        self._resuming = True
        self._resume()

    @work(thread=True, exclusive=True, group="loop-launch", exit_on_error=False,
          description="submit the loop's resume as a detached job")
    def _resume(self) -> None:
        from engine.jobs.launch import resume_request
        from magpie_tui.launching import start_run
        started, problem = None, "the engine failed (see the app log)"
        try:
            started = start_run(resume_request(self.root))
        except MagpieError as exc:
            problem = error_text(exc)
        except OSError as exc:
            problem = f"could not start: {exc}"
        finally:  # whatever happened, the screen takes resumes again
            self.app.call_from_thread(self._resumed, started, problem)

    def _resumed(self, started, problem: str | None) -> None:
        self._resuming = False
        if started is None:
            self.notify(f"resume refused: {problem}", severity="error")
            return
        self._resumed_pid = started.pid
        if hasattr(self.app, "track_started"):
            self.app.track_started(started)
        self.notify(f"resuming {self.root.name} in process {started.pid}")

    def action_cancel_loop(self) -> None:
        from magpie_tui.screens.confirm import ConfirmScreen
        info = self.loop_info()
        if info is None:
            self.notify("the loop is not in the runs list yet", severity="warning")
            return
        if info.is_finished:
            self.notify(f"the loop has already finished ({info.state})", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                try:
                    attach(info.path).cancel()
                    self.notify(f"cancelling {info.name} (the running step is stopped; R resumes later)")
                except MagpieError as exc:  # CancelRefused: finished, or no process proven to be the run's
                    self.notify(error_text(exc), severity="error")
        self.app.push_screen(ConfirmScreen(f"Cancel the loop {info.name}?\nIts running step is stopped; "
                                           "the loop can be resumed later."), answered)

"""One typed run state for every front end: where a run is, its latest live numbers and, once it
has finished, the report's own figures.

The engine writes the facts into ``events.jsonl`` (``progress`` with its request counts,
``capacity_level``, ``run_finished`` with :class:`~engine.runs.schema.RunFigures`); the run
catalog folds them into a :class:`RunStatus` per run (``RunInfo.status``); the workbench's
headers and lists, the job API and MCP's ``job_status`` all show that one state through
:func:`status_text`, so a header and a list never tell two stories, and a finished run never
shows a live number its report does not stand behind.

Example::

    info = RunCatalog([root]).refresh()[0]
    info.status.progress.requests.never_sent   # 475 after a cancel at 125 of 600
    status_text(info.status)                   # "cancelled at 125/600 completed · 475 never sent · exit 130"
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from engine.runs.schema import (
    FINISHED_RUN_STATES, CapacityLevel, Figure, ProgressEvent, RunFigures, RunState, StageEvent,
)

__all__ = ["RequestCounts", "LiveMetrics", "LiveSample", "add_sample", "run_eta_s", "RunProgress", "CapacityStep",
           "RunStatus", "status_text",
           "figures_text", "benchmark_figures", "kernel_figures", "progress_from_event", "no_roofline_reason",
           "KernelProgress", "fold_kernel_stage", "kernel_verdicts", "kernels_text", "stage_line"]


class _State(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestCounts(_State):
    """A benchmark repeat's measured requests so far. ``failed`` counts requests the server saw
    fail; ``never_sent`` the ones a cancel kept queued (never a server failure)."""
    total: Optional[int] = None
    sent: Optional[int] = None
    completed: Optional[int] = None
    failed: Optional[int] = None
    never_sent: Optional[int] = None


class LiveMetrics(_State):
    """A benchmark's running numbers over the measured requests finished so far (one repeat), and
    the server's own (its newest /metrics scrape). Every field but the first four came later:
    a run folder written before them reads them as None."""
    output_tok_s: Optional[float] = None
    ttft_p50_ms: Optional[float] = None
    tpot_p50_ms: Optional[float] = None
    elapsed_s: Optional[float] = None
    ttft_p99_ms: Optional[float] = None
    tpot_p99_ms: Optional[float] = None
    output_tokens: Optional[int] = None
    in_flight: Optional[int] = None
    eta_s: Optional[float] = None  # this repeat's measured load
    server_running: Optional[int] = None
    server_waiting: Optional[int] = None
    server_kv_cache: Optional[float] = None  # 0-1


class LiveSample(_State):
    """One point of a live run's recent history (the sparklines): when (the event's time), the
    output tok/s over the interval since the point before (the repeat's mean for the first point
    of a repeat, or where the event has no token count), and the p50s so far."""
    t: float
    output_tok_s: Optional[float] = None
    ttft_p50_ms: Optional[float] = None
    tpot_p50_ms: Optional[float] = None


HISTORY_S = 60.0  # how far back the history reaches


def add_sample(history: list[LiveSample], live: LiveMetrics, t: Optional[float],
               before: Optional[LiveMetrics]) -> list[LiveSample]:
    """``history`` with the point of ``live`` (at time ``t``) appended and the points older than
    ``HISTORY_S`` before it dropped. ``before`` is the previous live numbers (the rate's start)."""
    if t is None:
        return history
    rate = live.output_tok_s
    if (before is not None and history and live.output_tokens is not None and before.output_tokens is not None
            and live.elapsed_s is not None and before.elapsed_s is not None and live.elapsed_s > before.elapsed_s
            and live.output_tokens >= before.output_tokens):
        rate = (live.output_tokens - before.output_tokens) / (live.elapsed_s - before.elapsed_s)
    kept = [h for h in history if h.t >= t - HISTORY_S]
    kept.append(LiveSample(t=t, output_tok_s=rate, ttft_p50_ms=live.ttft_p50_ms, tpot_p50_ms=live.tpot_p50_ms))
    return kept


class RunProgress(_State):
    """Where a running run is: its phase, the generic done/total of that phase (kernels timed,
    loop steps, batch points, requests), the repeat (1-based) and the request counts."""
    phase: str = ""
    done: Optional[int] = None
    total: Optional[int] = None
    repeat: Optional[int] = None
    repeats: Optional[int] = None
    point: Optional[dict[str, Any]] = None
    warmup: bool = False
    requests: Optional[RequestCounts] = None


class CapacityStep(_State):
    level: float
    over: Optional[str] = None
    passed: Optional[bool] = None


class KernelProgress(_State):
    """Where one kernel of an analyze or compare is, folded from its ``stage`` events: the stage it
    is in (``compile``, ``testcase``, ``loading``, ``correctness``, ``checked``, ``timing``, ``timed``,
    ``done``, or the failed / cancelled stage), which step of it (input set i of n, timing round
    i of n), and, at the end, its verdict."""
    kernel: str
    index: Optional[int] = None
    stage: str = "waiting"
    state: Optional[str] = None  # the last stage event's state (running, SUCCESS, FAILED, ...)
    step: Optional[int] = None
    steps: Optional[int] = None
    detail: str = ""
    checked: Optional[bool] = None  # its correctness check ended: True passed, False failed
    median_ms: Optional[float] = None
    verdict: Optional[str] = None
    speedup: Optional[float] = None

    @property
    def where(self) -> str:
        """``correctness set 2/4``, ``timing round 3/10``, ``timing warm-up``, ``compile``."""
        name = {"performance": "timing", "harness": "loading"}.get(self.stage, self.stage)
        if self.step is not None and self.steps:
            unit = "round" if name == "timing" else "set"
            return f"{name} warm-up" if self.step == 0 else f"{name} {unit} {self.step}/{self.steps}"
        return name

    @property
    def detail_text(self) -> str:
        if self.stage == "done" and self.speedup is not None and self.verdict != "baseline":
            return f"{self.speedup:.3g}x" + (f" · {self.median_ms:.4g} ms" if self.median_ms is not None else "")
        if self.median_ms is not None and self.stage in ("timed", "done"):
            return f"median {self.median_ms:.4g} ms"
        return self.detail


# Stage events that end a stage: the stage a kernel is then in.
_AFTER = {("harness", "SUCCESS"): "checked", ("testcase", "SUCCESS"): "checked", ("accordo", "SUCCESS"): "checked",
          ("performance", "SUCCESS"): "timed", ("compile", "SUCCESS"): "compiled"}


# A failed stage in words: the harness runs the correctness check, performance is the timing.
_FAILED_AT = {"harness": "correctness", "performance": "timing"}


def fold_kernel_stage(rows: dict[str, KernelProgress], ev: StageEvent) -> None:
    """Fold one ``stage`` event of a kernel into ``rows`` (kernel id -> its progress). Events
    without the fine-grained fields (run folders written before them) fold just as well."""
    if not ev.kernel:
        return
    row = rows.get(ev.kernel) or KernelProgress(kernel=ev.kernel, index=ev.index)
    rows[ev.kernel] = row
    state = ev.state or ""
    if ev.stage == "done":
        # A kernel that failed a stage keeps where (its verdict, "incorrect", does not say).
        failed_at = _FAILED_AT.get(row.stage, row.stage) if row.state == "FAILED" and row.stage != "done" else None
        row.stage, row.state, row.step, row.steps = "done", state or None, None, None
        row.verdict, row.speedup = ev.verdict, ev.speedup
        row.detail = ev.detail or (f"{failed_at} failed" if failed_at else "")
        return
    if row.stage == "done":
        return
    row.state = state or None
    if state in ("FAILED", "CANCELLED", "SKIPPED"):
        row.stage, row.step, row.steps = ev.stage, None, None
        if ev.stage in ("harness", "testcase", "accordo", "correctness") and state == "FAILED":
            row.checked = False
        row.detail = {"FAILED": "failed", "CANCELLED": "cancelled", "SKIPPED": "not judged"}[state]
        return
    if state and state != "running":  # a stage ended
        row.stage = _AFTER.get((ev.stage, state), ev.stage)
        row.step = row.steps = None
        if row.stage == "checked":
            row.checked = True
        if ev.median_ms is not None:
            row.median_ms = ev.median_ms
        row.detail = ev.backend or ""
        return
    # running: the stage, and where in it
    stage = ev.stage
    if stage == "harness":
        stage = "loading"
    elif stage == "performance" and ev.step is None and row.stage == "timing" and row.step is not None:
        return  # the pipeline's own "timing started" after the harness's rounds: keep the last round
    row.stage = "timing" if stage == "performance" else stage
    row.step, row.steps = ev.step, ev.steps
    row.detail = ev.detail or (ev.backend or "")


def kernels_text(rows: list[KernelProgress]) -> str:
    """A running analyze/compare in one line, true when its kernels go in parallel:
    ``2 checked · timing round 3/10``, ``3 in correctness set 2/4``, ``1 failed · compile``."""
    if not rows:
        return ""
    counts: dict[str, int] = {}
    for r in rows:
        if r.stage == "done":
            key = "done"
        elif r.detail in ("failed", "cancelled", "not judged") and r.state in ("FAILED", "CANCELLED", "SKIPPED"):
            key = r.detail
        elif r.stage in ("timed",):
            key = "timed"
        elif r.checked or r.stage == "timing":
            key = "checked"
        else:
            key = ""
        if key:
            counts[key] = counts.get(key, 0) + 1
    parts = [f"{n} {k}" for k, n in counts.items() if k in ("checked", "timed", "failed", "not judged", "cancelled",
                                                            "done")]
    active = [r for r in rows if r.state == "running"]
    if active:
        # the furthest stage any kernel is in, where in it, and (checked in parallel) how many are in it
        rank = ("compile", "testcase", "accordo", "loading", "correctness", "timing")
        lead = max(active, key=lambda r: (rank.index(r.stage) if r.stage in rank else -1, r.step or 0))
        parts.append(lead.where)
        if lead.stage != "timing" and len(rows) > 1:  # checked in parallel: how many are at it
            parts.append(f"{sum(1 for r in rows if r.stage == lead.stage)} of {len(rows)} kernels")
    return " · ".join(parts)


def stage_line(event: dict, verbose: bool = True) -> Optional[str]:
    """One console line for a kernel ``stage`` event as it is written (the command line's and a
    detached run's console): ``  [one_pass] correctness set 2/4 (main inputs)``, ``  [one_pass]
    timing round 3/10 (20 calls)``, ``  [one_pass] done: faster (9.27x)``. ``verbose`` False leaves
    out the bare start of a stage (None); its steps and its end are always a line."""
    if event.get("event") != "stage" or not event.get("kernel"):
        return None
    stage, state = event.get("stage", "?"), event.get("state")
    if event.get("verdict") or stage == "done":
        sp = event.get("speedup")
        tail = f" ({sp:.3g}x)" if isinstance(sp, (int, float)) and event.get("verdict") != "baseline" else ""
        return f"  [{event['kernel']}] done: {event.get('verdict') or '-'}{tail}"
    step, steps = event.get("step"), event.get("steps")
    if state == "running" and not verbose and step is None:
        return None
    extra = f" ({event['backend']})" if event.get("backend") else ""
    if step is not None and steps:
        name = {"performance": "timing"}.get(stage, stage)
        unit = "round" if name == "timing" else "set"
        where = f"{name} warm-up" if step == 0 else f"{name} {unit} {step}/{steps}"
        detail = event.get("detail")
        return f"  [{event['kernel']}] {where}" + (f" ({detail})" if detail else "")
    return f"  [{event['kernel']}] {stage}{extra}: {state}"  # as the command line always wrote it


def kernel_verdicts(report: dict) -> list[tuple[str, str, Optional[float]]]:
    """(kernel id, verdict, speedup) of each kernel of an analyze or compare report as it is
    written: a compare's verdict, an analyze's correctness (``correct`` / ``incorrect`` / ``not
    judged``)."""
    results = report.get("results")
    rows = results.get("kernel_results") if isinstance(results, dict) else results
    if not isinstance(rows, list):
        return []
    not_judged = report.get("not_judged") if isinstance(report.get("not_judged"), dict) else {}
    out = []
    for r in rows:
        if not isinstance(r, dict) or not isinstance(r.get("kernel_id"), str):
            continue
        verdict = r.get("verdict")
        if not isinstance(verdict, str):
            verdict = ("not judged" if r.get("kernel_id") in not_judged else
                       {"SUCCESS": "correct", "FAILED": "incorrect"}.get(str(r.get("correctness_state")), "not judged"))
        sp = r.get("speedup")
        out.append((r["kernel_id"], verdict, float(sp) if isinstance(sp, (int, float)) else None))
    return out


class RunStatus(_State):
    """The state of one run as every front end shows it."""
    state: str = RunState.PENDING
    mode: str = "?"
    stage: str = ""
    kernels: list[KernelProgress] = Field(default_factory=list)  # analyze / compare: each kernel's stage
    progress: RunProgress = Field(default_factory=RunProgress)
    live: Optional[LiveMetrics] = None
    history: list[LiveSample] = Field(default_factory=list)  # the last minute of live numbers
    capacity: list[CapacityStep] = Field(default_factory=list)
    figures: Optional[RunFigures] = None  # the report's, once finished
    exit_code: Optional[int] = None
    error: Optional[str] = None

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_RUN_STATES

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


def progress_from_event(ev: ProgressEvent, before: RunProgress) -> tuple[RunProgress, Optional[LiveMetrics]]:
    """A ``progress`` event as the new progress and live numbers (None: none in this event)."""
    requests = None
    if ev.phase == "measure" and ev.done is not None:
        never = ev.never_sent if ev.never_sent is not None else None
        failed = ev.failed
        if failed is not None and never is not None:
            failed -= never  # the load generator ends never-sent requests as failed
        requests = RequestCounts(total=ev.total, sent=ev.done - never if never is not None else None,
                                 completed=ev.completed, failed=failed, never_sent=never)
    progress = RunProgress(phase=ev.phase or before.phase, done=ev.done if ev.done is not None else before.done,
                           total=ev.total if ev.total is not None else before.total,
                           repeat=ev.repeat + 1 if ev.repeat is not None else None, repeats=ev.repeats,
                           point=ev.point, warmup=ev.phase == "warmup", requests=requests)
    values = {k: getattr(ev, k) for k in LiveMetrics.model_fields}
    live = LiveMetrics(**values) if any(v is not None for k, v in values.items() if k != "elapsed_s") else None
    return progress, live


def run_eta_s(status: RunStatus) -> Optional[float]:
    """Seconds left of the point's measured load: this repeat's ETA, plus each repeat still to
    come at this repeat's estimated length (None when the run does not say)."""
    p, v = status.progress, status.live
    if status.is_finished or v is None or v.eta_s is None or p.warmup:
        return None
    left = v.eta_s
    if p.repeat is not None and p.repeats is not None and p.repeats > p.repeat:
        left += (p.repeats - p.repeat) * ((v.elapsed_s or 0.0) + v.eta_s)
    return left


def capacity_step(ev: CapacityLevel) -> CapacityStep:
    return CapacityStep(level=ev.level, over=ev.over, passed=ev.passed)


# ----------------------------------------------------------------------------- text

def _level(level: float, over: Optional[str]) -> str:
    return f"c{level:g}" if over in (None, "concurrency") else f"{level:g}/s"


def _rate(t: float) -> str:
    return f"{t / 1e3:.1f}k tok/s" if t >= 1e4 else f"{t:.0f} tok/s"


def _live_text(status: RunStatus, numbers: bool = True) -> str:
    """`` · 3 failed · 5.1k tok/s · TTFT 42 ms · TPOT 2.2 ms`` while a benchmark runs (``numbers``
    False: the failed count alone)."""
    parts = []
    req = status.progress.requests
    if req is not None and req.failed:
        parts.append(f"{req.failed} failed")
    v = status.live
    if v is not None and numbers:
        if v.output_tok_s is not None:
            parts.append(_rate(v.output_tok_s))
        if v.ttft_p50_ms is not None:
            parts.append(f"TTFT {v.ttft_p50_ms:.3g} ms")
        if v.tpot_p50_ms is not None:
            parts.append(f"TPOT {v.tpot_p50_ms:.3g} ms")
    return "".join(f" · {x}" for x in parts)


def _capacity_text(status: RunStatus) -> str:
    """``capacity c1 pass, c2 fail`` : the levels tried so far (the run's own, not its config's)."""
    if not status.capacity:
        return ""
    tried = ", ".join(f"{_level(s.level, s.over)} {'pass' if s.passed else 'fail'}" for s in status.capacity)
    return f"capacity {tried}"


def _running_text(status: RunStatus, numbers: bool = True) -> str:
    p = status.progress
    if status.kernels and status.mode in ("analyze", "compare"):
        # each kernel's stage, unless a run folder from before the steps counts its timing processes
        if not (p.done is not None and p.total and not any(r.step is not None for r in status.kernels)):
            return kernels_text(status.kernels)
    parts = []
    capacity = _capacity_text(status)
    if capacity:
        parts.append(capacity)
    if p.done is None or not p.total:
        return " · ".join(parts + ([status.stage] if status.stage else []))
    if p.repeats is not None and p.repeats > 1 and p.repeat is not None:
        parts.append(f"repeat {p.repeat}/{p.repeats}" + (" warm-up" if p.warmup else ""))
    elif p.warmup and p.repeats is not None:
        parts.append("warm-up")
    req = p.requests
    if req is not None and req.never_sent:
        counts = f"{req.completed}/{p.total} completed · {req.never_sent} never sent"
    else:
        counts = f"{p.done}/{p.total}"
    if not numbers:  # a narrow column: the counts lead, what else there is follows
        return counts + _live_text(status, numbers=False) + "".join(f" · {x}" for x in parts)
    return " · ".join(parts + [counts]) + _live_text(status)


def _finished_text(status: RunStatus) -> str:
    exit_part = f"exit {status.exit_code}" if status.exit_code is not None else ""
    f = status.figures
    if f is not None and f.steps_total:
        return " · ".join(p for p in (f"{f.steps_done}/{f.steps_total} steps", f.outcome or "", exit_part) if p)
    if f is not None and f.verdicts:
        return " · ".join(p for p in (_kernels_lead(status, f), _verdict_counts(f.verdicts), exit_part) if p)
    if f is not None and f.requests:
        lead = ""
        if f.capacity_levels:
            tried = ", ".join(_level(x, f.capacity_over) for x in f.capacity_levels)
            knee = _level(f.capacity_knee, f.capacity_over) if f.capacity_knee is not None else "none"
            lead = f"capacity {knee} (tried {tried}) · "
        if status.state == RunState.COMPLETED:
            core = f"{f.completed}/{f.requests}"
        else:
            core = f"{status.state} at {f.completed}/{f.requests} completed"
        if f.never_sent:
            core += f" · {f.never_sent} never sent"
        if f.failed:
            core += f" · {f.failed} failed"
        if f.repeat_cut:  # the figures are the repeats before it
            core += f" · repeat {f.repeat_cut}" + (f" of {f.repeats_planned}" if f.repeats_planned else "") + \
                " cut short, left out"
        return " · ".join(p for p in (lead + core, exit_part) if p)
    if status.error:
        return status.error
    p = status.progress
    if p.done is not None and p.total:
        if status.state == RunState.COMPLETED:
            return f"{p.done}/{p.total} · {exit_part}" if exit_part else f"{p.done}/{p.total}"
        # A cancel ends the requests still queued or in flight: they count as done (failed) but
        # were never served. What the run reached is the requests that completed.
        req = p.requests
        if req is not None and req.completed is not None:
            reached = f"{req.completed}/{p.total} completed" + (f" · {req.never_sent} never sent" if req.never_sent else "")
        else:
            reached = f"{p.done}/{p.total}"
        return f"{status.state} at {reached}" + (f" · {exit_part}" if exit_part else "")
    return exit_part or "-"


def _kernels_lead(status: RunStatus, f: RunFigures) -> str:
    """``winner one_pass 9.27x (95% CI 8.87–9.58)``, ``baseline three_pass stands``, ``no winner``;
    a run that did not complete says so first."""
    lead = "" if status.state == RunState.COMPLETED else str(status.state)
    if status.mode != "compare":
        return lead
    if f.winner is not None and f.winner != f.baseline:
        sp = f.winner_speedup
        what = f"winner {f.winner}" + (f" {sp.mean:.3g}x" if sp else "")
        if sp and sp.ci95:
            what += f" (95% CI {sp.ci95[0]:.3g}–{sp.ci95[1]:.3g})"
    elif f.winner is not None:
        what = f"baseline {f.winner} stands"
    else:
        what = "no winner"
    return f"{lead} · {what}" if lead else what


def _verdict_counts(verdicts: dict[str, int]) -> str:
    order = ("baseline", "faster", "tie", "slower", "correct", "incorrect", "rejected", "not measured", "not judged")
    names = sorted(verdicts, key=lambda v: (order.index(v) if v in order else len(order), v))
    return ", ".join(f"{verdicts[v]} {v}" for v in names if v != "baseline")


def _figure(fig: Figure, unit: str, fmt: str) -> str:
    if fig.n > 1 and fig.ci95:
        lo, hi = fig.ci95
        return f"{fig.mean:{fmt}} {unit} (mean of {fig.n}, 95% CI {lo:{fmt}}–{hi:{fmt}})"
    if fig.n > 1:  # too few repeats for an interval
        return f"{fig.mean:{fmt}} {unit} (mean of {fig.n})"
    return f"{fig.mean:{fmt}} {unit}"


def figures_text(figures: Optional[RunFigures]) -> str:
    """The report's headline numbers in one line: ``583 tok/s (mean of 3, 95% CI 277–889) · TTFT 42 ms``."""
    if figures is None:
        return ""
    parts = []
    if figures.output_tok_s is not None:
        parts.append(_figure(figures.output_tok_s, "tok/s", ".0f"))
    if figures.ttft_p50_ms is not None:
        parts.append("TTFT " + _figure(figures.ttft_p50_ms, "ms", ".3g"))
    if figures.tpot_p50_ms is not None:
        parts.append("TPOT " + _figure(figures.tpot_p50_ms, "ms", ".3g"))
    return " · ".join(parts)


def status_text(status: RunStatus, detail: bool = False, numbers: bool = True) -> str:
    """The run's progress in one line, the same in every front end. While running: the phase and
    counts with the live numbers; once finished: what the run reached and how it ended, from the
    report's figures when ``run_finished`` carried them (never a live number of its last repeat).
    ``detail`` adds the report's headline numbers (a header has room for them). ``numbers``
    False: a running benchmark's tok/s, TTFT and TPOT are left out and its request counts lead
    (for a list that shows those numbers in columns of their own: ``headline_numbers``)."""
    if not status.is_finished:
        return _running_text(status, numbers) or ("" if status.state != RunState.PENDING else "")
    text = _finished_text(status)
    extra = figures_text(status.figures) if detail else ""
    return " · ".join(p for p in (text, extra) if p)


def headline_numbers(status: RunStatus) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """A benchmark's output tok/s, TTFT p50 and TPOT p50 (ms): while it runs the live numbers over
    the requests finished so far, once finished the report's own (the mean over repeats); None
    where there is none (a run folder that never measured, another mode)."""
    f = status.figures
    if status.is_finished:
        if f is None:
            return None, None, None
        return tuple(x.mean if x is not None else None  # type: ignore[return-value]
                     for x in (f.output_tok_s, f.ttft_p50_ms, f.tpot_p50_ms))
    v = status.live
    if v is None:
        return None, None, None
    return v.output_tok_s, v.ttft_p50_ms, v.tpot_p50_ms


# ----------------------------------------------------------------------------- the writer's side

def _headline(repeats: Any, result: Any, key: str) -> Optional[Figure]:
    stat = repeats.get(key) if isinstance(repeats, dict) else None
    if isinstance(stat, dict) and isinstance(stat.get("mean"), (int, float)):
        ci = stat.get("ci95")
        return Figure(mean=stat["mean"], n=int(stat.get("n") or 1), ci95=list(ci) if ci else None)
    value = result.get(key) if isinstance(result, dict) else None
    return Figure(mean=value) if isinstance(value, (int, float)) else None


def benchmark_figures(report: dict) -> Optional[RunFigures]:
    """The headline figures of a benchmark report as it is written (engine.bench.run): requests
    over every point and repeat, the first point's throughput and latency (the mean over repeats
    with its interval, else the one run's), the capacity search's levels."""
    result, repeats = report.get("result") or {}, report.get("repeats")
    failures = report.get("failures")
    if isinstance(failures, dict):
        sent, failed, never = failures.get("sent"), failures.get("requests"), failures.get("never_sent")
        if not all(isinstance(x, int) for x in (sent, failed, never)):
            return None
        counts = {"requests": sent + never, "sent": sent, "completed": sent - failed, "failed": failed,
                  "never_sent": never}
    else:  # written before the failures section: what its runs counted, requests never sent unknown
        done = _requests_counted(report, result, repeats)
        if done is None:
            return None
        counts = {"sent": done[0] + done[1], "completed": done[0], "failed": done[1]}
    figures = RunFigures(**counts, output_tok_s=_headline(repeats, result, "output_throughput"),
                         ttft_p50_ms=_headline(repeats, result, "median_ttft_ms"),
                         tpot_p50_ms=_headline(repeats, result, "median_tpot_ms"))
    cut = report.get("repeats_cut")
    if isinstance(cut, list) and cut and isinstance(cut[0], dict):
        figures.repeat_cut, figures.repeats_planned = cut[0].get("repeat"), cut[0].get("repeats")
    capacity = report.get("capacity")
    if isinstance(capacity, dict):
        levels = [lv.get("level") for lv in capacity.get("levels") or [] if isinstance(lv, dict)]
        figures.capacity_over = capacity.get("over")
        figures.capacity_knee = capacity.get("knee")
        figures.capacity_levels = [x for x in levels if isinstance(x, (int, float))]
    return figures


def _requests_counted(report: dict, result: Any, repeats: Any) -> Optional[tuple[int, int]]:
    """(completed, failed) over every point and repeat of a report without a failures section."""
    def ints(values: Any) -> Optional[list[int]]:
        ok = isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values)
        return [int(v) for v in values] if ok else None

    runs = [run for point in report.get("sweep") or [] if isinstance(point, dict)
            for run in point.get("runs") or [] if isinstance(run, dict)]
    if runs and all(isinstance(r.get("completed"), int) and isinstance(r.get("failed"), int) for r in runs):
        return sum(r["completed"] for r in runs), sum(r["failed"] for r in runs)
    if isinstance(repeats, dict):
        done = ints((repeats.get("completed") or {}).get("values") if isinstance(repeats.get("completed"), dict) else None)
        bad = ints((repeats.get("failed") or {}).get("values") if isinstance(repeats.get("failed"), dict) else None)
        if done is not None and bad is not None:
            return sum(done), sum(bad)
    if isinstance(result, dict) and isinstance(result.get("completed"), int) and isinstance(result.get("failed"), int):
        return result["completed"], result["failed"]
    return None


def kernel_figures(report: dict) -> Optional[RunFigures]:
    """The headline of an analyze or compare report as it is written (engine.kernels.report): how
    many kernels got each verdict, the baseline, the winner and its speedup with its interval."""
    results = report.get("results")
    rows = results.get("kernel_results") if isinstance(results, dict) else results
    if not isinstance(rows, list):
        return None
    rows = [r for r in rows if isinstance(r, dict)]
    not_judged = report.get("not_judged") if isinstance(report.get("not_judged"), dict) else {}
    verdicts: dict[str, int] = {}
    for r in rows:
        verdict = r.get("verdict")
        if not isinstance(verdict, str):  # analyze: the correctness of each kernel
            verdict = ("not judged" if r.get("kernel_id") in not_judged else
                       {"SUCCESS": "correct", "FAILED": "incorrect"}.get(str(r.get("correctness_state")), "not judged"))
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    figures = RunFigures(verdicts=verdicts)
    baseline = report.get("baseline")
    if isinstance(baseline, dict) and isinstance(baseline.get("id"), str):
        figures.baseline = baseline["id"]
    winner = report.get("winner_id")
    if isinstance(winner, str):
        figures.winner = winner
        row = next((r for r in rows if r.get("kernel_id") == winner), {})
        speedup, ci = row.get("speedup"), row.get("speedup_ci")
        if isinstance(speedup, (int, float)) and winner != figures.baseline:
            ok_ci = isinstance(ci, list) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci)
            figures.winner_speedup = Figure(mean=speedup, ci95=list(ci) if ok_ci else None)
    return figures


def no_roofline_reason(report: dict) -> str:
    """Why a benchmark (or trace analysis) report has no roofline, in the report's own words: the
    analysis skipped (a CPU-only trace), a stage of it failed (the first error, by stage), or it
    was not asked for. A profiled run is never told to "run it profiled"."""
    tl = report.get("tracelens_analysis") if isinstance(report.get("tracelens_analysis"), dict) else {}
    if tl.get("skipped"):
        return str(tl["skipped"])
    errors = [str(e) for e in tl.get("errors") or []]
    stages = tl.get("stage_results") if isinstance(tl.get("stage_results"), dict) else {}
    errors += [f"stage {name}: {r['error']}" for name, r in stages.items() if isinstance(r, dict) and r.get("error")]
    errors += [str(e) for e in report.get("errors") or [] if str(e).startswith(("profiling:", "trace analysis:"))]
    errors += [str(e) for e in report.get("analysis_errors") or []]
    if errors:
        return f"the analysis failed: {errors[0].splitlines()[0] if errors[0] else errors[0]}"
    if report.get("profiling_enabled"):
        gap = report.get("gap_analysis") if isinstance(report.get("gap_analysis"), dict) else {}
        no_kernels = gap.get("enabled") and not gap.get("top_kernels") and not gap.get("total_kernel_time_us")
        if no_kernels or (report.get("kernel_summary") == [] and not tl.get("enabled")):
            return ("the trace has no GPU kernels (a CPU-only run): there is no GPU roofline to report, "
                    "with or without TraceLens")
        if not tl.get("enabled"):
            return "it was profiled, but TraceLens was off (profiler.tracelens.enabled: true runs it)"
        return "it was profiled with TraceLens on, but the analysis wrote no roofline tables (see the run's logs/)"
    return "run it profiled with tracelens on"

"""analyze_report.json / compare_report.json (Magpie's keys, plus ours) and the human summary."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import socket
import sys
from datetime import datetime
from io import StringIO
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.table import Table

import engine
from engine.kernels.pipeline import CANCELLED, FAILED, SKIPPED, SUCCESS, KernelOutcome
from engine.kernels.plan import Plan, compare_reference
from engine.kernels.sm_clock import not_read_line, verdict_note
from engine.kernels.stats import DEFAULT_TIE_MARGIN, bootstrap_speedup, bootstrap_speedup_rounds, verdict
from engine.runs.provenance import kernel_provenance
from engine.runs.schema import SCHEMA_VERSION


def _score(o: KernelOutcome) -> float:
    """Magpie's per-kernel score, kept with its meaning (it says nothing about speed):
    0 if compile failed; +0.5 correct; +0.5 performance measured; correct and perf skipped -> 1.0."""
    if o.compile.state == FAILED:
        return 0.0
    score = 0.0
    if o.correctness.state == SUCCESS:
        score += 0.5
        if o.performance.state in (SUCCESS, SKIPPED):
            score += 0.5
    return score


def kernel_state(o: KernelOutcome) -> dict:
    k = o.spec
    perf = o.performance.details
    return {
        "kernel_id": k.id,
        "compiling_state": o.compile.state,
        "correctness_state": o.correctness.state,
        "performance_state": o.performance.state,
        "errors": o.errors,
        "score": _score(o),
        "compiling_result": {"success": o.compile.state == SUCCESS, "errors": o.compile.errors, **o.compile.details},
        "correctness_result": {"success": o.correctness.state == SUCCESS, "errors": o.correctness.errors,
                               **o.correctness.details},
        "performance_result": {
            "success": o.performance.state == SUCCESS, "errors": o.performance.errors,
            "command": perf.get("command"), "summary": perf.get("summary", {}), "kernels": perf.get("kernels", []),
            **{key: v for key, v in perf.items() if key not in ("command", "summary", "kernels")},
        },
        "timing": o.timing,
        "guards": o.guards,
        "environment_problems": list(o.environment),
        "peak_memory": o.peak_memory,
        "extra": {"kernel_id": k.id, "kernel_type": k.type, "index": k.index, "baseline": k.baseline,
                  "origin": k.origin},
    }


def environment_fingerprint(plan: Plan, gpu: Optional[dict]) -> dict:
    def version(pkg: str) -> Optional[str]:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    sources = {}
    for k in plan.kernels:
        for f in k.source_files + ([k.reference_file] if k.reference_file else []):
            try:
                sources[str(f)] = "sha256:" + hashlib.sha256(f.read_bytes()).hexdigest()
            except OSError:
                sources[str(f)] = None
    return {
        "magpie_workbench": engine.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "gpu": gpu,
        "driver": (gpu or {}).get("driver"),
        "torch": version("torch"),
        "triton": version("triton"),
        "numpy": version("numpy"),
        "source_hashes": sources,
        "compile_commands": {k.id: k.to_config()["compile_command"] for k in plan.kernels},
        "testcase_commands": {k.id: k.to_config()["testcase_command"] for k in plan.kernels},
    }


def _fmt_ms(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if v < 1.0:
        return f"{v * 1e3:.4g} us"
    if v < 1000:
        return f"{v:.4g} ms"
    return f"{v / 1e3:.3g} s"


_STATE = {SUCCESS: "ok", FAILED: "FAIL", SKIPPED: "-", CANCELLED: "cancelled"}
_BACKEND = {"harness-cpu-perf_counter": "cpu timer", "harness-cuda-events": "cuda events",
            "harness-cuda-events+graph": "cuda graph", "harness-hip-events": "hip events",
            "harness-hip-events+graph": "hip graph", "harness-cuda-trace": "device trace",
            "harness-hip-trace": "device trace", "timing_json": "testcase json", "prof_command": "prof cmd"}


def _summary_table(plan: Plan, outcomes: list[KernelOutcome], speed: dict[int, dict],
                   verdicts: Optional[list[str]] = None) -> Table:
    """The run's table; a compare's ``speed`` and ``verdicts`` are compare_results'."""
    table = Table(title=f"magpie {plan.mode}", show_lines=False, pad_edge=False)
    for col in ("#", "kernel", "build", "correct", "timing", "median", "IQR", "CV", "n"):
        table.add_column(col, justify="right" if col in ("#", "median", "IQR", "CV", "n") else "left")
    if plan.mode == "compare":
        table.add_column("speedup", justify="right")
        table.add_column("95% CI", justify="right")
        table.add_column("verdict")
    for i, o in enumerate(outcomes):
        k, t = o.spec, o.timing
        name = k.id + (" *" if plan.mode == "compare" and k.baseline else "")
        backend = str(o.performance.details.get("backend", "-")) if o.performance.state == SUCCESS else "-"
        correct = ("not judged" if o.environment and not o.correct and not o.correctness.errors
                   else _STATE[o.correctness.state])
        row = [str(k.index), name, _STATE[o.compile.state], correct, _BACKEND.get(backend, backend),
               _fmt_ms(t["median"]) if t else "-", _fmt_ms(t["iqr"]) if t else "-",
               f"{t['cv'] * 100:.1f}%" if t else "-", str(t["n"]) if t else "-"]
        if plan.mode == "compare":
            sp = speed.get(k.index)
            if sp and not k.baseline:
                row += [f"{sp['speedup']:.2f}x", f"{sp['speedup_ci'][0]:.2f}-{sp['speedup_ci'][1]:.2f}",
                        (verdicts[i] if verdicts else sp["verdict"]) + verdict_note(o.flags)]
            else:
                row += ["1.00x" if sp else "-", "-", verdicts[i] if verdicts else
                        "baseline" if k.baseline and o.correct and not o.rejections else _verdict_without_speed(o)]
        table.add_row(*row)
    if plan.mode == "compare":
        table.caption = "* baseline"
    return table


def _render(renderables: list[Any], width: int = 140) -> str:
    buf = StringIO()
    console = Console(file=buf, width=width, no_color=True, color_system=None, highlight=False)
    for r in renderables:
        console.print(r)
    return buf.getvalue()


def _problem_lines(outcomes: list[KernelOutcome]) -> list[str]:
    lines = []
    for o in outcomes:
        lines += [f"{o.spec.id}: not judged: {e}" for e in o.environment]
        for e in o.errors:
            first = e.strip().splitlines()[0] if e.strip() else e
            lines.append(f"{o.spec.id}: {first}")
        reason = o.performance.details.get("reason")
        if o.performance.state == SKIPPED and reason and o.correct:
            lines.append(f"{o.spec.id}: performance {reason}")
        note = o.performance.details.get("note")
        if note:
            lines.append(f"{o.spec.id}: {note}")
    # Input sets redrawn from another distribution that the reference could not handle: the
    # same note in every kernel's correctness details, said once.
    for o in outcomes:
        dists = (o.correctness.details.get("harness") or {}).get("input_distributions") or {}
        lines += [d for d in dists.get("dropped") or [] if d not in lines]
    return lines


def build_analyze_report(plan: Plan, outcomes: list[KernelOutcome], state: str, ws_dir: str,
                         gpu: Optional[dict], degenerate: Optional[str] = None) -> tuple[dict, list[Any]]:
    results = [kernel_state(o) for o in outcomes]
    # A kernel a missing tool kept from being judged is not incorrect: it is listed apart.
    not_judged = [o.spec.id for o in outcomes if not o.correct and o.environment and not o.correctness.errors]
    incorrect = [o.spec.id for o in outcomes if not o.correct and o.spec.id not in not_judged]
    report = {
        "schema_version": SCHEMA_VERSION,
        "mode": "analyze",
        "timestamp": datetime.now().isoformat(timespec="seconds"),
        "state": state,
        "results": results,
        "all_correct": not incorrect and not not_judged,
        "not_judged": {o.spec.id: list(o.environment) for o in outcomes if o.spec.id in not_judged},
        "degenerate_test": degenerate,
        "sm_clock_note": sm_clock_line(outcomes),
        "workspace_dir": ws_dir,
        "overrides": plan.overrides,
        "warnings": plan.warnings,
        "settings": plan.settings.to_dict(),
        "environment": environment_fingerprint(plan, gpu),
        "provenance": kernel_provenance(ws_dir, gpu),
    }
    renderables: list[Any] = [_summary_table(plan, outcomes, {})]
    renderables += _problem_lines(outcomes)
    timing_line = command_timing_line(outcomes)
    if timing_line:
        renderables.append(timing_line)
    memory_line = peak_memory_line(outcomes)
    if memory_line:
        renderables.append(memory_line)
    if degenerate:
        renderables.append(degenerate)
    renderables.append(f"state: {state}; all correct: {not incorrect and not not_judged}" +
                       (f" (incorrect: {', '.join(incorrect)})" if incorrect else "") +
                       (f" (not judged, a problem of this machine: {', '.join(not_judged)})" if not_judged else ""))
    return report, renderables


def _verdict_without_speed(o: KernelOutcome) -> str:
    if o.rejections:
        return "rejected"
    if CANCELLED in (o.compile.state, o.correctness.state, o.performance.state):
        return "cancelled"
    if not o.correct:
        if o.correctness.state == SKIPPED and o.cancelled_stage:
            return "cancelled"
        # A tool missing here (compiler, testcase program, accordo) judged nothing.
        return "not judged" if o.environment and not o.correctness.errors else "incorrect"
    return "not measured"


CPU_TIE_MARGIN = 0.10


def effective_tie_margin(plan: Plan, base: KernelOutcome) -> float:
    """The margin set in the YAML or with --tie-margin; else 2% with a device timer and 10% with
    the CPU timer, where two processes running the same code differ by that much (memory layout,
    the other load of a shared machine)."""
    return tie_margin_and_reason(plan, base)[0]


def tie_margin_and_reason(plan: Plan, base: KernelOutcome) -> tuple[float, str]:
    """effective_tie_margin, and why: the setting, or the clock the baseline's samples came from
    (the harness's timer; for a kernel that times itself, the clock its timing line declared or,
    with none declared, the machine's: no GPU means CPU times; engine.kernels.command_timing)."""
    if plan.settings.tie_margin is not None:
        return plan.settings.tie_margin, "set by performance.tie_margin or --tie-margin"
    details = base.performance.details
    backend = str(details.get("backend", ""))
    if "cpu" in backend:
        return CPU_TIE_MARGIN, f"CPU clock: the baseline was timed with the harness's CPU timer ({backend})"
    clock, why = details.get("clock"), details.get("clock_reason")
    if clock == "cpu":
        return CPU_TIE_MARGIN, f"CPU clock: {why}"
    if clock == "device":
        return DEFAULT_TIE_MARGIN, f"device clock: {why}"
    return DEFAULT_TIE_MARGIN, f"device clock: the baseline was timed with {backend or 'a device timer'}"


def command_timing_line(outcomes: list[KernelOutcome]) -> Optional[str]:
    """How the kernels that time themselves were run (processes, rounds), or None when none did."""
    timed = [o for o in outcomes if o.performance.state == SUCCESS and "processes" in o.performance.details]
    if not timed:
        return None
    counts = sorted({o.performance.details["processes"] for o in timed})
    shared = len(timed) > 1 and all(o.performance.details.get("interleaved") for o in timed)
    return (f"Timing: {', '.join(o.spec.id for o in timed)}: their own MAGPIE_TIMING_JSON samples from "
            f"{'/'.join(map(str, counts))} {'process' if counts == [1] else 'processes'} each" +
            (", interleaved round by round (one process of each per round)" if shared else ""))


def sm_clock_line(outcomes: list[KernelOutcome]) -> Optional[str]:
    """"SM clock not read: why", once for the run (engine.kernels.sm_clock), or None."""
    return not_read_line([o.performance.details.get("method") or {} for o in outcomes])


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def peak_memory_line(outcomes: list[KernelOutcome]) -> Optional[str]:
    """The most GPU memory each kernel's harness worker held, and all of them at once (a worker's
    peak plus what the others kept meanwhile); None on a CPU run or without a harness."""
    peaks = [(o.spec.id, o.peak_memory) for o in outcomes
             if isinstance(o.peak_memory, dict) and isinstance(o.peak_memory.get("device_bytes"), int)]
    if not peaks:
        return None
    line = "Peak GPU memory: " + ", ".join(f"{k} {_gib(p['device_bytes'])}" for k, p in peaks)
    together = max((p.get("device_bytes_together") or 0 for _, p in peaks), default=0)
    if together:
        line += f"; all at once {_gib(together)}"
    sizes = peaks[0][1]
    if sizes.get("input_bytes"):
        line += f" (one call: inputs {_gib(sizes['input_bytes'])}" + (
            f", outputs {_gib(sizes['output_bytes'])})" if sizes.get("output_bytes") else ")")
    return line


def judged_by(o: KernelOutcome) -> Optional[str]:
    """The reference_file module a kernel's outputs were judged against, or None (the baseline's
    outputs, a testcase, or no check)."""
    ref = (o.correctness.details.get("harness") or {}).get("reference")
    return ref if ref and ref != "baseline outputs" else None


def baseline_problem(plan: Plan, outcomes: list[KernelOutcome]) -> str:
    """Why no winner can be declared when the baseline is not correct: it was not judged, or it
    is incorrect (against the reference_file, when one judged it: then the candidates that
    match that reference are named, since they are correct but have nothing to be ranked against)."""
    base = outcomes[plan.baseline_index]
    if base.environment and not base.correctness.errors:
        return f"the baseline was not judged ({base.environment[0]})"
    ref = judged_by(base)
    if ref is None:
        return "the baseline is incorrect"
    good = [o.spec.id for o in outcomes if o is not base and o.correct]
    return (f"the baseline {base.spec.id} is incorrect against the reference {Path(ref).name}: no winner can be "
            "declared against it" + (f" (correct against the reference: {', '.join(good)}; speedups are measured "
                                     "against the baseline)" if good else ""))


def _measurable(o: KernelOutcome) -> bool:
    """A kernel whose samples can be set against another's: correct, not rejected, two samples or more."""
    return o.correct and not o.rejections and len(o.samples_ms) >= 2


def _speed(plan: Plan, base: KernelOutcome, cand: KernelOutcome, margin: float) -> dict:
    paired = bool(base.sample_rounds and cand.sample_rounds and len(base.sample_rounds) == len(cand.sample_rounds))
    seed = plan.settings.seed or 0
    if paired:
        sp, lo, hi = bootstrap_speedup_rounds(base.sample_rounds, cand.sample_rounds, seed=seed)
    else:
        sp, lo, hi = bootstrap_speedup(base.samples_ms, cand.samples_ms, seed=seed)
    return {"speedup": sp, "speedup_ci": [lo, hi], "verdict": "rejected" if cand.rejections else verdict(lo, hi, margin),
            "interval": "paired rounds" if paired else "independent samples"}


def compare_results(plan: Plan, outcomes: list[KernelOutcome], cancelled: bool = False,
                    degenerate: Optional[str] = None,
                    pairs: Optional[dict[int, tuple[KernelOutcome, KernelOutcome]]] = None,
                    unranked: Optional[str] = None) -> dict:
    """The one decision of a compare, for every path (local, container, Ray): each kernel's speedup
    against the named baseline with its bootstrap interval, each kernel's verdict, the ranking, the
    winner and why.

    ``pairs`` (Ray): candidate index -> (the baseline timed beside it, the candidate as timed there);
    a candidate's speedup is then measured against its own run of the baseline, and a candidate
    without a pair has none. Without ``pairs`` every candidate is measured against
    ``outcomes[baseline]``. Either way the baseline as reported must be correct, not rejected and
    measured for any speedup, and one tie margin (the reported one) decides every verdict.
    ``unranked``: why the candidates cannot be ranked against each other (Ray: several GPU
    models); no winner is declared then."""
    b = plan.baseline_index
    base = outcomes[b]
    margin, margin_reason = tie_margin_and_reason(plan, base)
    speed: dict[int, dict] = {}
    if _measurable(base):
        for o in outcomes:
            if o is base:
                speed[o.spec.index] = {"speedup": 1.0, "speedup_ci": [1.0, 1.0], "verdict": "baseline"}
                continue
            if pairs is None:
                pair_base, cand = base, o
            elif o.spec.index in pairs:
                pair_base, cand = pairs[o.spec.index]
            else:
                continue
            if o.correct and len(o.samples_ms) >= 2 and _measurable(pair_base) and len(cand.samples_ms) >= 2:
                speed[o.spec.index] = _speed(plan, pair_base, cand, margin)
    verdicts = [speed[o.spec.index]["verdict"] if o.spec.index in speed else
                "baseline" if o.spec.baseline and o.correct and not o.rejections else _verdict_without_speed(o)
                for o in outcomes]
    correctness = [o.correct for o in outcomes]
    perf_scores = [speed[o.spec.index]["speedup"] if o.spec.index in speed else None for o in outcomes]
    ranked = sorted(((i, v) for i, v in speed.items() if v["verdict"] != "rejected"), key=lambda kv: -kv[1]["speedup"])
    faster = [(idx, v) for idx, v in ranked if v["verdict"] == "faster"]
    if cancelled:
        winner, why = None, "the run was cancelled before every kernel was measured; no winner is declared"
    elif degenerate:
        winner, why = None, degenerate + "; no winner is declared"
    elif unranked:
        winner, why, ranked = None, unranked, []
    elif faster:
        winner, why = faster[0][0], (f"fastest correct candidate whose speedup interval lies above 1 + "
                                     f"{margin:g} (the tie margin)")
    elif base.correct and speed:
        winner, why = b, "no correct candidate is faster beyond the noise and the tie margin; the baseline stands"
    else:
        winner, why = None, (baseline_problem(plan, outcomes) if not base.correct else
                             "the baseline was rejected" if base.rejections else "nothing could be measured")
    return {"speed": speed, "verdicts": verdicts, "correctness": correctness, "perf_scores": perf_scores,
            "rankings": [[idx, v["speedup"]] for idx, v in ranked], "winner": winner, "winner_reason": why,
            "tie_margin": margin, "tie_margin_reason": margin_reason}


def build_compare_report(plan: Plan, outcomes: list[KernelOutcome], state: str, ws_dir: str,
                         gpu: Optional[dict], degenerate: Optional[str] = None,
                         pairs: Optional[dict[int, tuple[KernelOutcome, KernelOutcome]]] = None,
                         unranked: Optional[str] = None,
                         kernel_notes: Optional[dict[int, str]] = None) -> tuple[dict, list[Any]]:
    """compare_report.json and the summary. ``pairs`` and ``unranked`` go to compare_results (the
    Ray path's per-candidate baselines and GPU-model refusal); ``kernel_notes``: a few words per
    kernel index for its summary line (Ray: the GPU that timed it)."""
    cmp = compare_results(plan, outcomes, cancelled=state == "cancelled", degenerate=degenerate, pairs=pairs,
                          unranked=unranked)
    speed = cmp["speed"]
    notes = kernel_notes or {}
    kernel_results = []
    for o, v in zip(outcomes, cmp["verdicts"]):
        st = kernel_state(o)
        sp = speed.get(o.spec.index)
        st["speedup"] = sp["speedup"] if sp else None
        st["speedup_ci"] = sp["speedup_ci"] if sp else None
        st["verdict"] = v
        kernel_results.append(st)
    ids = [o.spec.id for o in outcomes]
    winner = cmp["winner"]
    lines = [f"Baseline: {ids[plan.baseline_index]} (index {plan.baseline_index}, chosen by {plan.baseline_source})"]
    reference = compare_reference(plan.kernels)
    if reference is not None:
        lines.append(f"Reference: {reference} (judges the outputs of every kernel, the baseline included)")
    for o, st in zip(outcomes, kernel_results):
        t = o.timing
        judged = "not judged" if st["verdict"] == "not judged" else o.correct
        lines.append(f"  [{o.spec.index}] {o.spec.id}: correct={judged}"
                     + (f", {notes[o.spec.index]}" if o.spec.index in notes else "")
                     + (f", median {_fmt_ms(t['median'])} (CV {t['cv'] * 100:.1f}%, n={t['n']})" if t else "")
                     + (f", speedup {st['speedup']:.3f}x [{st['speedup_ci'][0]:.3f}, {st['speedup_ci'][1]:.3f}]"
                        f" {st['verdict']}{verdict_note(o.flags)}" if st["speedup"] is not None and not o.spec.baseline
                        else ""))
    lines.append(f"Winner: {ids[winner] if winner is not None else 'none'} ({cmp['winner_reason']})")
    summary = "\n".join(lines)
    report = {
        "schema_version": SCHEMA_VERSION,
        "mode": "compare",
        "timestamp": datetime.now().isoformat(timespec="seconds"),
        "state": state,
        "results": {
            "kernel_results": kernel_results,
            "comparison_metrics": {"correctness": cmp["correctness"], "all_correct": all(cmp["correctness"]),
                                   "perf_scores": cmp["perf_scores"], "perf_score_definition":
                                   "speedup of the median time vs the baseline (higher is better)"},
            "winner": winner,
            "rankings": cmp["rankings"],
            "summary": summary,
        },
        "baseline": {"index": plan.baseline_index, "id": ids[plan.baseline_index], "chosen_by": plan.baseline_source},
        # What the outputs were judged against: the baseline's, or a reference_file module's.
        "correctness_reference": ({"kind": "reference_file", "file": str(reference)} if reference is not None else
                                  {"kind": "baseline", "id": ids[plan.baseline_index]}),
        "winner_id": ids[winner] if winner is not None else None,
        "winner_reason": cmp["winner_reason"],
        "tie_margin": cmp["tie_margin"],
        "tie_margin_reason": cmp["tie_margin_reason"],
        "sm_clock_note": sm_clock_line(outcomes),
        "degenerate_test": degenerate,
        "workspace_dir": ws_dir,
        "overrides": plan.overrides,
        "warnings": plan.warnings,
        "settings": plan.settings.to_dict(),
        "environment": environment_fingerprint(plan, gpu),
        "provenance": kernel_provenance(ws_dir, gpu),
    }
    renderables: list[Any] = [_summary_table(plan, outcomes, speed, cmp["verdicts"])]
    renderables += _problem_lines(outcomes)
    timing_line = command_timing_line(outcomes)
    if timing_line:
        renderables.append(timing_line + f"; tie margin {report['tie_margin']:g} ({report['tie_margin_reason']})")
    memory_line = peak_memory_line(outcomes)
    if memory_line:
        renderables.append(memory_line)
    clock_line = sm_clock_line(outcomes)
    if clock_line and "the CPU" not in clock_line:  # on a CPU run there is nothing to say
        renderables.append(clock_line)
    renderables += [f"{o.spec.id}: {f['message']}" for o in outcomes for f in o.flags]
    if reference is not None:
        renderables.append(f"Reference: {reference} judged every kernel's outputs, the baseline's included")
    renderables.append(f"Winner: {ids[winner] if winner is not None else 'none'} — {cmp['winner_reason']}")
    return report, renderables


def render_text(renderables: list[Any], width: int = 140) -> str:
    return _render(renderables, width)

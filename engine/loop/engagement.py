"""The verdict's trace evidence: the profiled baseline's trace against the profiled run after the
winner was integrated (``engine.trace.diff``), and the proof that the winner ran in that run.

**Engagement.** The built-in server runs each registry call inside
``record_function("magpie_kernel::<op>")`` while profiling, so the kernels under that span in a
trace are the op's own: on a GPU the GPU kernels launched inside it, on a CPU (no GPU events)
the ``cpu_op`` calls inside it (named with their path below the span, ``aten::rms_norm >
aten::mul``, since the same aten names recur in another implementation). The loop's profiled
runs record Python stacks, so the winner's own function (``engine/library/rmsnorm.py(...):
rmsnorm_torch_fused``) is looked for among the Python frames too. The check holds when the op was called in the after-trace and

* the after-trace has Python frames: the winner's function is among them (its kernels listed);
* it has none: the kernels under the op's span differ from the before-trace's (names or calls).

Anything else fails, saying what was found: the op never called, the winner's function absent
(another implementation ran: the integration did not take), the same kernels as before. Without a
``magpie_kernel::`` span (a vLLM server) only the Python frames can prove it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from engine.loop.results import Engagement, KernelCalls, TraceDiffSummary, TraceMover
from engine.trace.diff import SEP, TraceDiff, TraceProfile, diff_profiles, profile_trace, write_csvs

ANNOTATION = "magpie_kernel::"
TOP_MOVERS = 10
DIFF_FOLDER = "trace_diff"
TRACE_DIFF_FILE = "trace_diff_report.json"
TAGS = ("before", "after")


def winner_function(winner_path: str) -> tuple[str, str]:
    """(the file its Python frames name, the function) of ``package.module:function``,
    ``package.module.function`` or ``/path/file.py:function``."""
    path = winner_path.strip()
    module, _, fn = path.rpartition(":") if ":" in path else path.rpartition(".")
    if module.endswith(".py") or "/" in module:
        return Path(module).name, fn
    return module.replace(".", "/") + ".py", fn


def watch_for(op: str, file: str, fn: str) -> Callable[[str], Optional[str]]:
    """Counts the op's annotation spans (``calls``) and the winner's Python frames (``frames``)."""
    span = ANNOTATION + op
    tail = f"): {fn}"

    def watch(name: str) -> Optional[str]:
        if name == span:
            return "calls"
        if name.endswith(tail):
            where = name[:name.rfind("(")]
            if where == file or where.endswith("/" + file):
                return "frames"
        return None
    return watch


def kernels_under(profile: TraceProfile, span: str) -> dict[str, int]:
    """The kernels whose call site passes through ``span``, named with their path below it, and
    their calls."""
    out: dict[str, int] = {}
    for (name, stack), row in profile.kernels.items():
        if span in stack:
            key = SEP.join(stack[stack.index(span) + 1:] + (name,))
            out[key] = out.get(key, 0) + row.calls
    return out


def _listed(kernels: dict[str, int]) -> list[KernelCalls]:
    return [KernelCalls(name=k, calls=c) for k, c in sorted(kernels.items(), key=lambda kv: (-kv[1], kv[0]))]


def _short(kernels: dict[str, int], n: int = 4) -> str:
    items = sorted(kernels.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} x{c}" for k, c in items[:n])
    return text + (f" (+{len(items) - n} more)" if len(items) > n else "") if items else "none"


def engagement(before: TraceProfile, after: TraceProfile, op: str, winner: str, winner_path: str) -> Engagement:
    """Whether the winner ran in the after-trace (see the module docstring); both profiles made
    with ``watch_for(op, *winner_function(winner_path))``."""
    file, fn = winner_function(winner_path)
    span = ANNOTATION + op
    k_before, k_after = kernels_under(before, span), kernels_under(after, span)
    calls_b, calls_a = before.watched.get("calls", 0), after.watched.get("calls", 0)
    fr_b = before.watched.get("frames", 0) if before.python_stacks else None
    fr_a = after.watched.get("frames", 0) if after.python_stacks else None
    what = "GPU kernels" if after.basis == "gpu" else "CPU ops (no GPU events: the ops under the call)"
    found = f"under kernels.{op} after: {_short(k_after)}; before: {_short(k_before)}"
    if not calls_a and not k_after and not fr_a:
        ok, detail = False, (f"no {span} call in the after-trace ({after.path}): kernels.{op} never ran there, or "
                             "the server does not annotate its registry calls; the winner's engagement is not proven")
    elif fr_a is not None and fr_a == 0:
        ok, detail = False, (f"the winner's function {fn} ({file}) is in none of the after-trace's Python frames: "
                             f"kernels.{op} ran another implementation ({calls_a} calls; {found})")
    elif fr_a is None and k_after == k_before:
        ok, detail = False, (f"the after-trace runs the same {what} under kernels.{op} as the before-trace "
                             f"({_short(k_after)}): nothing shows the winner ran")
    else:
        frames = f"; {fn} ({file}) in {fr_a} Python frames after, {fr_b or 0} before" if fr_a is not None else ""
        same = " (the same kernels as before: only the Python frames tell them apart)" if k_after == k_before else ""
        calls = (f"{calls_a} kernels.{op} calls after ({calls_b} before)" if calls_a else
                 f"no {span} span in the after-trace (a server that does not annotate its registry calls)")
        ok, detail = True, f"{calls}; {what} {found}{frames}{same}"
    return Engagement(ok=ok, op=op, winner=winner, function=f"{file}: {fn}", annotation=span, calls_before=calls_b,
                      calls_after=calls_a, kernels_before=_listed(k_before), kernels_after=_listed(k_after),
                      winner_frames_before=fr_b, winner_frames_after=fr_a, detail=detail)


def _mover(row: dict) -> TraceMover:
    tm, calls = row.get("time_us") or {}, row.get("calls") or {}

    def count(v: object) -> Optional[int]:
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    return TraceMover(name=row["name"], stack=list(row["stack"]), status=row["status"], before_us=tm.get("a"),
                      after_us=tm.get("b"), delta_us=tm.get("delta"), delta_pct=tm.get("pct"),
                      calls_before=count(calls.get("a")), calls_after=count(calls.get("b")))


def summary(diff: TraceDiff, root: Path, report: Path, top: int = TOP_MOVERS) -> TraceDiffSummary:
    rep = diff.report(top)
    tt = rep["totals"]["time_us"]
    return TraceDiffSummary(
        report=str(report.relative_to(root)), before=_rel(diff.a.path, root), after=_rel(diff.b.path, root),
        basis=diff.basis, total_before_us=tt["a"], total_after_us=tt["b"], total_delta_pct=tt["pct"],
        top_ops=[_mover(r) for r in rep["ops"]["movers"]], top_kernels=[_mover(r) for r in rep["kernels"]["movers"]],
        kernels_only_before=rep["totals"]["kernels"]["only_a"], kernels_only_after=rep["totals"]["kernels"]["only_b"])


def _rel(path: str, root: Path) -> str:
    p = Path(path)
    return str(p.relative_to(root)) if p.is_relative_to(root) else str(p)


def trace_evidence(root: Path, before: Optional[Path], after: Optional[Path], op: str, winner: str,
                   winner_path: str, out_dir: Path) -> tuple[TraceDiffSummary, Engagement]:
    """The diff of the two profiled traces (its report and CSVs into ``out_dir``) and the winner's
    engagement; a missing or unreadable trace fails the engagement, saying why."""
    file, fn = winner_function(winner_path)
    missing = "the profiled baseline" if before is None else "the profiled run after integration" if after is None else None
    if missing is not None:
        why = f"{missing} left no trace: the winner's engagement cannot be proven"
        return TraceDiffSummary(error=why), Engagement(ok=False, op=op, winner=winner, function=f"{file}: {fn}",
                                                       annotation=ANNOTATION + op, detail=why)
    assert before is not None and after is not None
    watch = watch_for(op, file, fn)
    try:
        a = profile_trace(before, watch=watch)
        b = profile_trace(after, watch=watch)
        diff = diff_profiles(a, b, TAGS)
    except Exception as exc:  # noqa: BLE001 - a trace the diff cannot read: the check says so, the verdict goes on
        why = f"the traces could not be compared: {exc}"
        return TraceDiffSummary(before=_rel(str(before), root), after=_rel(str(after), root), error=why), \
            Engagement(ok=False, op=op, winner=winner, function=f"{file}: {fn}", annotation=ANNOTATION + op,
                       detail=why)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = write_csvs(diff, out_dir)
    report = out_dir / TRACE_DIFF_FILE
    full = {"mode": "trace_diff", **diff.report(50), "output_files": [str(p) for p in files]}
    report.write_text(json.dumps(full, indent=1) + "\n", encoding="utf-8")
    return summary(diff, root, report), engagement(a, b, op, winner, winner_path)

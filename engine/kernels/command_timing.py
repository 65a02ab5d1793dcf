"""Interleaved timing of kernels that time themselves: a testcase (``timing_json``) or a
prof_command (``prof_command``) that prints ``MAGPIE_TIMING_JSON: {"samples_ms": [...]}``.

One process says little: two runs of one binary differ by 10-30% on a CPU (memory layout, the
other load of a shared machine), and by less, but not nothing, on a GPU. So every such kernel runs
in ``performance.rounds`` processes, and the processes of all kernels are interleaved round by
round, the order turned the way the harness turns its rounds (A B, B A, B A, A B, ...): a slow
spell of the machine lands on every kernel, and each round pairs one process of each kernel, which
the paired-round bootstrap (engine.kernels.stats.bootstrap_speedup_rounds) resamples as a unit.
The correctness run's own line is not a sample: it ran beside compiles and other testcases.

The timing line may say which clock its samples come from (``"clock": "cpu"`` for host wall
times, ``"clock": "device"`` for GPU events); without it, samples taken on a machine with no GPU
are CPU times. The compare's tie margin follows the baseline's clock
(engine.kernels.report.tie_margin_and_reason).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from engine.kernels.pipeline import Evaluator, KernelOutcome

COMMAND_TIMED = ("timing_json", "prof_command")
CPU_CLOCKS = frozenset({"cpu", "host", "wall"})
DEVICE_CLOCKS = frozenset({"device", "gpu", "cuda", "hip", "events"})
ORDER_NOTE = ("interleaved rounds, one process of each kernel per round; the order turns every second round and "
              "reverses every other one (A B, B A, B A, A B, ...)")


def round_order(items: list, r: int) -> list:
    """The order of round ``r`` (0-based): rotated every second round, reversed every other one,
    so no kernel always runs first or right after the same one (the harness's order)."""
    if not items:
        return []
    k = (r // 2) % len(items)
    order = items[k:] + items[:k]
    return order[::-1] if r % 2 else order


def sample_clock(declared: Optional[str], vendor: Optional[str]) -> tuple[str, str]:
    """("cpu" or "device", why) for samples a command printed. Raises ValueError for a clock name
    it does not know (a typo must not pick the margin)."""
    if declared is not None:
        name = str(declared).lower()
        if name in CPU_CLOCKS:
            return "cpu", f"the timing line declares \"clock\": \"{declared}\" (host wall times)"
        if name in DEVICE_CLOCKS:
            return "device", f"the timing line declares \"clock\": \"{declared}\" (device times)"
        raise ValueError(f"\"clock\": {declared!r} is not a clock this tool knows: say \"cpu\" (host wall times) or "
                         "\"device\" (GPU events or a device trace)")
    if vendor is None:
        return "cpu", "no GPU on this machine, so the samples the command printed are CPU (host) times"
    return "device", (f"a GPU ({vendor}) is on this machine and the timing line declares no clock: taken as device "
                      "times (print \"clock\": \"cpu\" in the line when the samples are host wall times)")


@dataclass
class _Timed:
    """One kernel's share of the interleaved timing."""
    outcome: Any  # KernelOutcome
    backend: str
    commands: list  # what one process of this kernel runs (the prof_commands: all of them, in order)
    rounds: list[list[float]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # sequence numbers, over all kernels, of its process starts
    runs: list[dict] = field(default_factory=list)
    clocks: list[Optional[str]] = field(default_factory=list)
    error: Optional[str] = None
    note: Optional[str] = None  # a prof_command that printed no timing line: nothing to rank on
    done: bool = False


def _commands(ev: "Evaluator", o: "KernelOutcome", backend: str) -> list:
    k = o.spec
    if backend == "prof_command":
        return list(k.prof)
    if not k.testcase:
        return []
    i = o.timing_command if 0 <= o.timing_command < len(k.testcase) else 0
    return [k.testcase[i]]


def _one_process(ev: "Evaluator", t: _Timed, r: int) -> None:
    """Run the kernel's command(s) once (round ``r``) and take its samples, or its error."""
    from engine.kernels.pipeline import TIMING_MARKER, MeasurementError, parse_timing_line
    k = t.outcome.spec
    n = len(t.commands)
    out = []
    for i, cmd in enumerate(t.commands, 1):
        name = f"timing_r{r + 1}" if t.backend == "timing_json" else f"prof_{i}_r{r + 1}"
        res = ev._run(k, cmd, name, ev.s.perf_timeout_s)
        t.runs.append(res.to_dict())
        if res.cancelled:
            t.done = True
            return
        if not res.ok:
            what = "timing run" if t.backend == "timing_json" else f"prof_command {i}/{n}"
            t.error = f"{what} failed in round {r + 1}: {res.describe_failure()}\n{res.stderr_tail(1000)}".rstrip()
            t.done = True
            return
        out.append(res.stdout)
    text = "\n".join(out)
    if t.backend == "prof_command" and TIMING_MARKER not in text and r == 0:
        t.note = f"prof_command ran; it printed no {TIMING_MARKER} line, so there is no timing to rank on"
        t.done = True
        return
    try:
        samples, data = parse_timing_line(text)
    except MeasurementError as exc:
        t.error = f"round {r + 1}: {exc}"
        t.done = True
        return
    t.rounds.append(samples)
    t.clocks.append(data.get("clock"))


def time_interleaved(ev: "Evaluator", outcomes: list["KernelOutcome"], backend: Optional[str] = None) -> None:
    """Time every correct kernel of ``outcomes`` whose backend runs its own command (or, given
    ``backend``, every kernel with that backend), in interleaved processes; each one's result
    waits in ``performance.details["command_timing"]`` for its backend's ``measure``
    (take_command_timing), and its rounds in ``sample_rounds``."""
    from engine.kernels.pipeline import RUNNING
    timed = []
    for o in outcomes:
        chosen = backend or ev._backend(o)
        if chosen in COMMAND_TIMED and (backend is not None or o.correct):
            cmds = _commands(ev, o, chosen)
            if cmds:
                timed.append(_Timed(o, chosen, cmds))
    if not timed:
        return
    n_rounds = max(1, int(ev.s.rounds))
    for t in timed:
        ev._event(t.outcome.spec, "performance", RUNNING, backend=t.backend)
    seq, total = 0, n_rounds * len(timed)
    for r in range(n_rounds):
        for t in round_order(timed, r):
            if ev.cancel.cancelled:
                break
            if t.done:
                continue
            t.starts.append(seq)
            seq += 1
            ev._event(t.outcome.spec, "performance", RUNNING, backend=t.backend, step=r + 1, steps=n_rounds,
                      detail="one process")
            _one_process(ev, t, r)
            ev.ws.events.emit("progress", phase="timing", done=seq, total=total)
    for t in timed:
        _finish(ev, t, timed, n_rounds)


def _finish(ev: "Evaluator", t: _Timed, timed: list[_Timed], n_rounds: int) -> None:
    from engine.kernels.pipeline import CANCELLED, StageResult, command_text
    o = t.outcome
    if ev.cancel.cancelled and not t.error and len(t.rounds) < n_rounds and not t.note:
        o.performance = StageResult(CANCELLED, details={"backend": t.backend, "commands": t.runs,
                                                        "reason": f"interrupted: run {ev.cancel.reason}"})
        o.cancelled_stage = "performance"
        ev._event(o.spec, "performance", CANCELLED, backend=t.backend)
        return
    details: dict = {"command": "; ".join(command_text(c) for c in t.commands), "commands": t.runs,
                     "processes": len(t.rounds), "rounds": len(t.rounds), "rounds_planned": n_rounds,
                     "samples_per_process": [len(x) for x in t.rounds],
                     "process_medians_ms": [statistics.median(x) for x in t.rounds],
                     "interleaved": len(timed) > 1,
                     "interleaved_with": [x.outcome.spec.id for x in timed if x is not t],
                     "process_starts": list(t.starts), "order": ORDER_NOTE}
    if t.backend == "prof_command":
        details["custom_profiling_complete"] = True
    if t.note:
        details["note"] = t.note
    error = t.error
    declared = [c for c in t.clocks if c is not None]
    if not error and t.rounds:
        if len(set(map(str, declared))) > 1:
            error = f"the processes declared different clocks ({', '.join(sorted(set(map(str, declared))))})"
        else:
            try:
                details["clock"], details["clock_reason"] = sample_clock(declared[0] if declared else None,
                                                                         ev.machine.vendor)
            except ValueError as exc:
                error = str(exc)
    o.performance.details["command_timing"] = {"error": error, "details": details}
    if not error:
        o.sample_rounds = [list(x) for x in t.rounds]


def take_command_timing(ev: "Evaluator", o: "KernelOutcome", backend: str) -> tuple[list[float], dict]:
    """A command-timed kernel's samples and details, from the interleaved timing (run here, for
    this kernel alone, when the Evaluator's run did not)."""
    from engine.kernels.pipeline import MeasurementError
    if "command_timing" not in o.performance.details:
        time_interleaved(ev, [o], backend)
    t = o.performance.details.pop("command_timing", None)
    if t is None:
        raise MeasurementError(f"backend {backend}: nothing to run")
    if t["error"]:
        o.sample_rounds = []
        raise MeasurementError(t["error"])
    details = dict(t["details"], backend=backend)
    return [x for r in o.sample_rounds for x in r], details

"""Compile -> correctness -> performance, for every kernel of a plan.

Compile and testcase runs may go in parallel (``--workers``); the harness and every
timing run go one at a time, baseline first, so that measurements never share the
machine with each other and candidates can be checked against the baseline's outputs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from engine.errors import MagpieError
from engine.kernels import environment
from engine.kernels.plan import KernelSpec, Plan, compare_reference
from engine.kernels.stats import summarize
from engine.runs.process import CancelToken, ProcessResult, command_text, engine_pythonpath, run_process
from engine.runs.schema import StageState
from engine.runs.workspace import Workspace

# The state strings' one home is engine.runs.schema; these names stay for importers.
SUCCESS, FAILED, SKIPPED, CANCELLED = StageState.SUCCESS, StageState.FAILED, StageState.SKIPPED, StageState.CANCELLED
RUNNING = StageState.RUNNING
TIMING_MARKER = "MAGPIE_TIMING_JSON:"
_TIMING_LINE = re.compile(r"^\s*MAGPIE_TIMING_JSON:\s*(\{.*\})\s*$", re.MULTILINE)


@dataclass
class StageResult:
    state: str = SKIPPED
    errors: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)


@dataclass
class KernelOutcome:
    spec: KernelSpec
    compile: StageResult = field(default_factory=StageResult)
    correctness: StageResult = field(default_factory=StageResult)
    performance: StageResult = field(default_factory=StageResult)
    timing: Optional[dict] = None  # summarize() of the samples
    samples_ms: list[float] = field(default_factory=list)
    testcase_stdout: str = ""
    timing_command: int = 0  # the testcase command (0-based) whose output carried the MAGPIE_TIMING_JSON line
    sample_rounds: list[list[float]] = field(default_factory=list)  # interleaved rounds of samples_ms
    rejections: list[dict] = field(default_factory=list)  # guard violations {guard, message}: never ranked
    flags: list[dict] = field(default_factory=list)  # guard findings that did not reject
    cancelled_stage: Optional[str] = None  # the stage a cancel interrupted
    # Problems of the machine, not of the kernel (a compiler, a testcase program or the accordo CLI
    # that is not there): a kernel with one is "not judged", never incorrect.
    environment: list[str] = field(default_factory=list)
    # The most memory the kernel's harness worker held (device bytes by request, host RSS), or None.
    peak_memory: Optional[dict] = None

    @property
    def correct(self) -> bool:
        return self.correctness.state == SUCCESS

    @property
    def errors(self) -> list[str]:
        errs = self.compile.errors + self.correctness.errors + self.performance.errors
        return errs + [r["message"] for r in self.rejections if r["message"] not in errs]

    @property
    def guards(self) -> dict:
        flags = [dict(r) for r in self.rejections] + list(self.flags)
        return {"flags": flags, "rejected": bool(self.rejections)}


@dataclass
class Machine:
    """What the evaluation can use on this host (from engine.hw detection)."""
    vendor: Optional[str] = None  # "nvidia" | "amd" | None
    ncu: Optional[str] = None
    rocprofv3: Optional[str] = None
    bandwidth_tbs: Optional[float] = None
    # The fastest dense math rate of any dtype the GPU has (TFLOP/s; int8 TOP/s counted too): a
    # floor that no kernel beats, whatever precision it computes in.
    peak_tflops: Optional[float] = None
    python: str = sys.executable

    @classmethod
    def from_gpu_info(cls, info: Any) -> "Machine":
        """``info`` is engine.hw.detect.GpuInfo or None (no GPU)."""
        m = cls()
        if info is not None:
            m.vendor = info.vendor
            for tool in info.profilers:
                if tool.name == "ncu":
                    m.ncu = tool.path
                elif tool.name == "rocprofv3":
                    m.rocprofv3 = tool.path
            if info.spec is not None:
                m.bandwidth_tbs = info.spec.memory_bw_tbs
                m.peak_tflops = max(info.spec.peak_tflops.values(), default=None)
        return m


def _reference_member(ref_file: Path, k0: KernelSpec):
    """The harness member that runs a ``reference_file`` module (its Model, or its function) to
    judge the others; it takes the inputs, working dir and environment of entry ``k0``."""
    from engine.kernels.harness import follows_convention
    from engine.kernels.session import Member
    ref_spec = replace(k0, id=f"reference_{ref_file.stem}", source_files=[ref_file], reference_file=ref_file,
                       model_class="Model" if follows_convention(ref_file, k0.get_inputs_func, "Model") else None,
                       baseline=False, harness_module=None, call_function=False)
    return Member(key=f"reference:{ref_file.name}", spec=ref_spec, role="reference")


def _input_distributions(set_meta: list[dict], dropped: dict[int, str]) -> dict:
    """Which distributions the correctness input sets came from, as the report gives them:
    each one's description and how many sets were judged from it, and the sets dropped because
    the reference could not handle them (with why)."""
    from engine.kernels.distributions import DESCRIPTIONS
    used: dict[str, dict] = {}
    for i, meta in enumerate(set_meta):
        d = meta.get("distribution", "problem")
        entry = used.setdefault(d, {"distribution": d, "description": DESCRIPTIONS.get(d, d), "sets": 0})
        if i not in dropped:
            entry["sets"] += 1
    return {"used": list(used.values()), "dropped": [dropped[i] for i in sorted(dropped)]}


class Evaluator:
    def __init__(self, plan: Plan, ws: Workspace, machine: Machine, cancel: CancelToken) -> None:
        self.plan, self.ws, self.machine, self.cancel = plan, ws, machine, cancel
        self.s = plan.settings
        self.outcomes = [KernelOutcome(spec=k) for k in plan.kernels]

    # ------------------------------------------------------------------ helpers
    def _event(self, kernel: KernelSpec, stage: str, state: str, **extra: Any) -> None:
        self.ws.events.emit("stage", kernel=kernel.id, index=kernel.index, stage=stage, state=state, **extra)

    def _env(self, k: KernelSpec) -> dict[str, str]:
        env = dict(k.env)
        current = env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")
        if k.pythonpath:  # Magpie's latency.pythonpath, first
            current = os.pathsep.join([str(p) for p in k.pythonpath] + ([current] if current else []))
        # Make `import engine` work in the harness wherever the kernel's working dir is.
        env["PYTHONPATH"] = engine_pythonpath(current)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _run(self, k: KernelSpec, cmd, log_name: str, timeout: float) -> ProcessResult:
        return run_process(cmd, cwd=k.working_dir, env=self._env(k), timeout_s=timeout,
                           cancel=self.cancel, log_stem=self.ws.log_stem(k.id, log_name))

    # ------------------------------------------------------------------ stages
    def compile(self, o: KernelOutcome) -> None:
        k = o.spec
        if not k.compile:
            o.compile = StageResult(SKIPPED, details={"reason": "no compile_command"})
            return
        self._event(k, "compile", RUNNING)
        runs = []
        for i, cmd in enumerate(k.compile, 1):
            r = self._run(k, cmd, f"compile_{i}", self.s.compile_timeout_s)
            runs.append(r.to_dict())
            if r.cancelled:
                o.compile = StageResult(CANCELLED, details={"commands": runs, "reason": "interrupted by the cancel"})
                o.cancelled_stage = "compile"
                self._event(k, "compile", CANCELLED)
                return
            if not r.ok:
                tail = r.stderr_tail(2000)
                missing = missing_program(r, cmd, k.working_dir)
                if missing:
                    o.environment.append(f"environment: {missing} (compile command {i}/{len(k.compile)})")
                o.compile = StageResult(FAILED, [f"compile command {i}/{len(k.compile)} failed: {r.describe_failure()}"
                                                 + (f"\n{tail}" if tail else "")], {"commands": runs})
                self._event(k, "compile", FAILED)
                return
        o.compile = StageResult(SUCCESS, details={"commands": runs})
        self._event(k, "compile", SUCCESS)

    def testcase(self, o: KernelOutcome) -> None:
        """Exit-code correctness: every testcase command, ``iteration_count`` times, must exit 0."""
        k = o.spec
        if self.s.correctness_backend == "accordo":
            self.accordo(o)
            return
        if not k.testcase or self.s.correctness_backend == "harness":
            return
        self._event(k, "testcase", RUNNING)
        runs, errors, stdout = [], [], []
        for it in range(self.s.iteration_count):
            for i, cmd in enumerate(k.testcase, 1):
                suffix = f"_{it + 1}" if self.s.iteration_count > 1 else ""
                r = self._run(k, cmd, f"testcase_{i}{suffix}", self.s.correctness_timeout_s)
                runs.append(r.to_dict())
                stdout.append(r.stdout)
                if TIMING_MARKER in r.stdout:
                    o.timing_command = i - 1
                if r.cancelled:
                    o.cancelled_stage = "correctness"
                    break
                if not r.ok:
                    tail = r.stderr_tail(1500)
                    missing = missing_program(r, cmd, k.working_dir)
                    if missing:  # the testcase never ran: nothing was judged
                        o.environment.append(f"environment: {missing} (testcase command {i}/{len(k.testcase)})")
                        break
                    # A testcase that stopped because the machine lacks what it needs (no GPU or
                    # driver, out of memory, a package) judged nothing either.
                    cause = environment.classify((r.stderr or "")[-20000:] + "\n" + (r.stdout or "")[-4000:])
                    if cause is not None:
                        o.environment.append(f"{cause.message()} (testcase command {i}/{len(k.testcase)} "
                                             f"{r.describe_failure()})")
                        break
                    errors.append(f"testcase failed: {r.describe_failure()}" + (f"\n{tail}" if tail else ""))
                    break
            if errors or self.cancel.cancelled:
                break
        o.testcase_stdout = "\n".join(stdout)
        if o.cancelled_stage == "correctness":
            o.correctness.details["testcase"] = {"commands": runs, "passed": None, "cancelled": True}
            self._event(k, "testcase", CANCELLED)
            return
        if o.environment and not errors:
            o.correctness.details["testcase"] = {"commands": runs, "passed": None, "not_judged": o.environment[-1]}
            self._event(k, "testcase", SKIPPED)
            return
        o.correctness.details["testcase"] = {"commands": runs, "passed": not errors}
        o.correctness.errors.extend(errors)
        self._event(k, "testcase", FAILED if errors else SUCCESS)

    def accordo(self, o: KernelOutcome) -> None:
        """correctness.backend accordo: IntelliKit Accordo compares the accordo block's reference and
        optimized binaries (Magpie's command line and verdict; engine.kernels.accordo)."""
        from engine.kernels import accordo as acc_mod
        k, acc = o.spec, self.s.accordo or {}
        program = acc_mod.find_accordo()
        if program is None:
            o.environment.append(acc_mod.not_installed_message())
            o.correctness.details["accordo"] = {"passed": None, "not_judged": o.environment[-1]}
            self._event(k, "accordo", SKIPPED)
            return
        timeout = acc_mod.accordo_timeout(acc, self.s.perf_timeout_s)
        cmd = acc_mod.accordo_command(program, acc, acc_mod.binaries_dir(acc, k.working_dir), timeout)
        cwd = self.ws.path("accordo", k.id)  # Magpie runs the CLI in the run's folder
        cwd.mkdir(parents=True, exist_ok=True)
        self._event(k, "accordo", RUNNING)
        r = run_process(cmd, cwd=cwd, env=self._env(k), timeout_s=timeout * 2 + 60, cancel=self.cancel,
                        log_stem=self.ws.log_stem(k.id, "accordo"))
        details = {"command": command_text(cmd), "cwd": str(cwd), "run": r.to_dict()}
        if r.cancelled:
            o.cancelled_stage = "correctness"
            o.correctness.details["accordo"] = {**details, "passed": None, "cancelled": True}
            self._event(k, "accordo", CANCELLED)
            return
        if r.timed_out or r.error:
            o.correctness.errors.append(f"accordo: {r.describe_failure()}")
            o.correctness.details["accordo"] = {**details, "passed": False}
            self._event(k, "accordo", FAILED)
            return
        verdict = acc_mod.parse_accordo_output(r.returncode, r.stdout, r.stderr)
        details.update(verdict)
        details["passed"] = verdict["valid"] is True
        o.correctness.details["accordo"] = details
        if verdict["valid"] is not True:
            o.correctness.errors.append(f"accordo: {verdict.get('error') or verdict.get('reason')}")
        self._event(k, "accordo", SUCCESS if verdict["valid"] is True else FAILED)

    def harness_all(self, outcomes: list[KernelOutcome], base: Optional[KernelOutcome]) -> None:
        """Output comparison (and, where performance uses it, interleaved timing) of every kernel
        the Python harness can run, through engine.kernels.session: one worker process each."""
        from engine.kernels.session import HarnessSession, Member, SessionSettings
        s = self.s
        runnable = [o for o in outcomes if o.spec.harness and s.correctness_backend in ("auto", "harness")
                    and o.compile.state != FAILED]
        if not runnable:
            return
        groups: list[tuple[Optional[Member], list[Member]]] = []

        def member(o: KernelOutcome, role: str) -> Member:
            return Member(key=o.spec.id, spec=o.spec, role=role, timed=self._backend(o) == "harness")

        compare_ref = compare_reference(self.plan.kernels) if self.plan.mode == "compare" else None
        if compare_ref is not None:
            # reference_file in a compare: it judges every kernel, the baseline too, which is timed
            # beside the candidates as the one their speedups are measured against.
            k0 = (base if base in runnable else runnable[0]).spec
            groups.append((_reference_member(compare_ref, k0), [member(o, "kernel") for o in runnable]))
        elif self.plan.mode == "compare":
            if base is not None and base in runnable:
                ref = member(base, "reference")
                groups.append((ref, [ref] + [member(o, "kernel") for o in runnable if o is not base]))
            else:
                for o in runnable:
                    o.correctness.errors.append("cannot compare outputs with the baseline: the baseline cannot run in "
                                                "the Python harness (it defines no Model and get_inputs())")
                    o.correctness.details["harness"] = {"checked": False}
        else:
            by_ref: dict[Optional[Path], list[KernelOutcome]] = {}
            for o in runnable:
                by_ref.setdefault(o.spec.reference_file, []).append(o)
            for ref_file, group in by_ref.items():
                if ref_file is None:
                    for o in group:
                        m = member(o, "self")
                        groups.append((None, [m]))
                    continue
                groups.append((_reference_member(ref_file, group[0].spec), [member(o, "kernel") for o in group]))
        settings = SessionSettings(
            seeds=s.seeds, seeds_hidden=s.seed is None, rtol=s.rtol, atol=s.atol, timer=s.timer,
            repeats=s.repeats, warmup=s.warmup, rounds=s.rounds, l2_flush=s.l2_flush, device="auto",
            load_timeout_s=s.correctness_timeout_s, correctness_timeout_s=s.correctness_timeout_s,
            perf_timeout_s=s.perf_timeout_s, bandwidth_tbs=self.machine.bandwidth_tbs,
            peak_tflops=self.machine.peak_tflops)
        self.ws.path("harness").mkdir(exist_ok=True)
        by_key = {o.spec.id: o for o in outcomes}

        def emit(m: Member, stage: str, state: str, **extra: Any) -> None:
            if m.key in by_key:
                self._event(by_key[m.key].spec, stage, state, **extra)

        def log_stem(m: Member, first: str) -> Path:
            # A kernel's worker logs to logs/<id>/harness.*; a reference module's to the first
            # kernel it judges, logs/<id>/reference.*.
            return self.ws.log_stem(m.key, "harness") if m.key in by_key else self.ws.log_stem(first, "reference")

        for ref, ms in groups:
            if self.cancel.cancelled:
                break
            first = ms[0].spec.id
            session = HarnessSession(members=ms, reference=ref, settings=settings, python=self.machine.python,
                                     env_for=self._env, cancel=self.cancel, emit=emit,
                                     log_stem_for=lambda m, first=first: log_stem(m, first))
            session.run()
            self.degenerate = self.degenerate or session.degenerate
            for m in ms:
                self._take_member(by_key[m.key], m, ref, session)

    def _take_member(self, o: KernelOutcome, m, ref, session) -> None:
        corr = o.correctness
        mode = "self-check" if m.role == "self" else ("compared with reference" if m.role == "kernel" else "reference")
        corr.details["harness"] = {
            "checked": bool(m.seeds), "passed": bool(m.seeds) and not m.errors and not m.rejections,
            "reference": (None if m.role != "kernel" or ref is None else
                          str(ref.spec.source_files[0]) if ref.key.startswith("reference:") else "baseline outputs"),
            "mode": mode, "seeds": m.seeds, "device": m.load.get("device"), "versions": m.load.get("versions"),
            "seeds_hidden": session.s.seeds_hidden, "weights_from_reference": m.adopted,
            "input_sets": len(m.load.get("set_meta", [])), "checked_timed_calls": m.checked_calls,
            "input_distributions": _input_distributions(m.load.get("set_meta", []), session.dropped_sets),
        }
        corr.errors.extend(m.errors)
        o.environment.extend(e for e in m.environment if e not in o.environment)  # not judged: the machine failed
        if m.worker is not None:
            o.peak_memory = {**m.worker.peak_memory(), "input_bytes": m.load.get("input_bytes"),
                             "output_bytes": m.output_bytes or None}
        # A guard tripped before timing (tampering, background threads) fails correctness; one that
        # tripped while timing (the hardware floor, the clock check) rejects the measured kernel.
        corr.errors.extend(r["message"] for r in m.rejections)
        o.rejections = list(m.rejections) + list(m.timing_rejections)
        o.flags = list(m.flags)
        if m.cancelled_in == "correctness":
            o.cancelled_stage = "correctness"
        elif m.cancelled_in == "performance":
            o.cancelled_stage = "performance"
        if m.timing:
            o.performance.details["harness_timing"] = dict(m.timing)
            o.sample_rounds = [list(r) for r in m.rounds]

    def finish_correctness(self, o: KernelOutcome) -> None:
        checked = bool(o.correctness.details.get("testcase") or o.correctness.details.get("accordo") or
                       o.correctness.details.get("harness", {}).get("checked"))
        if o.correctness.errors:
            o.correctness.state = FAILED
        elif o.environment:  # a check could not run here: not judged, and not a pass either
            o.correctness.state = SKIPPED
            o.correctness.details["reason"] = "not judged: " + "; ".join(o.environment)
        elif checked:
            o.correctness.state = SUCCESS
        else:
            o.correctness.state = FAILED
            o.correctness.errors.append("correctness was not checked (no testcase ran and the harness did not run)")

    # ------------------------------------------------------------------ performance
    def _backend(self, o: KernelOutcome) -> str:
        chosen = self.s.perf_backend
        if not self.s.perf_enabled:
            return "none"
        if chosen != "auto":
            return chosen
        # "auto": the first registered backend that can time this kernel here.
        return next((name for name, b in TIMING_BACKENDS.items() if b.auto(self, o)), "unavailable")

    def performance(self, o: KernelOutcome) -> None:
        k = o.spec
        backend = self._backend(o)
        p = o.performance
        p.details["backend"] = backend
        if backend == "none":
            p.state, p.details["reason"] = SKIPPED, "performance disabled (--no-perf)"
            return
        if not o.correct:
            p.state, p.details["reason"] = SKIPPED, "not measured: the kernel failed correctness"
            return
        self._event(k, "performance", RUNNING, backend=backend)
        try:
            samples, extra = self._measure(o, backend)
        except MeasurementError as exc:
            p.state = FAILED
            p.errors.append(str(exc))
            self._event(k, "performance", FAILED, backend=backend)
            return
        p.details.update(extra)
        if samples:
            o.samples_ms = samples
            o.timing = summarize(samples)
            p.details["timing"] = o.timing
        p.state = SUCCESS
        self._event(k, "performance", SUCCESS, backend=backend,
                    median_ms=o.timing["median"] if o.timing else None)

    def _measure(self, o: KernelOutcome, backend: str) -> tuple[list[float], dict]:
        impl = TIMING_BACKENDS.get(backend)
        if impl is None:
            raise MeasurementError(f"unknown performance backend {backend!r}")
        return impl.measure(self, o)

    # ------------------------------------------------------------------ driver
    def run(self) -> list[KernelOutcome]:
        order = list(self.outcomes)
        base = None
        if self.plan.baseline_index is not None:
            base = self.outcomes[self.plan.baseline_index]
            order = [base] + [o for o in self.outcomes if o is not base]
        self.degenerate = None

        def phase_a(o: KernelOutcome) -> None:
            if self.cancel.cancelled:
                return
            self.compile(o)
            if o.compile.state not in (FAILED, CANCELLED) and not self.cancel.cancelled:
                self.testcase(o)

        if self.s.workers > 1:
            with ThreadPoolExecutor(max_workers=self.s.workers) as pool:
                list(pool.map(phase_a, order))
        else:
            for o in order:
                phase_a(o)

        if not self.cancel.cancelled:
            self.harness_all(order, base)
        ready = [o for o in order if self._finish_checks(o)]
        if not self.cancel.cancelled:  # kernels that time themselves: their processes interleaved
            from engine.kernels.command_timing import time_interleaved
            time_interleaved(self, ready)
        for o in ready:  # serial: every timing run that is not the harness's own
            if self.cancel.cancelled or o.performance.state == CANCELLED:
                continue
            self.performance(o)
        if self.cancel.cancelled:
            for o in self.outcomes:
                for stage in (o.compile, o.correctness, o.performance):
                    if stage.state == SKIPPED and not stage.details.get("reason"):
                        stage.details["reason"] = f"not reached: run {self.cancel.reason}"
        return self.outcomes

    def _finish_checks(self, o: KernelOutcome) -> bool:
        """Settle the kernel's correctness (or why it has none); True when it goes on to be timed."""
        if o.compile.state == FAILED:
            o.correctness = StageResult(SKIPPED, details={"reason": "compile failed"})
            o.performance = StageResult(SKIPPED, details={"reason": "compile failed"})
            return False
        if o.compile.state == CANCELLED:
            return False
        if o.cancelled_stage == "correctness":
            o.correctness.state = CANCELLED
            o.correctness.details["reason"] = f"interrupted: run {self.cancel.reason}"
            return False
        if self._checks_finished(o):
            self.finish_correctness(o)
        if o.cancelled_stage == "performance":
            o.performance.state = CANCELLED
            o.performance.details["reason"] = f"interrupted: run {self.cancel.reason}"
            return False
        return True

    def _checks_finished(self, o: KernelOutcome) -> bool:
        """Every correctness check this kernel needs ran to its end (a cancel may have cut it)."""
        if o.cancelled_stage:
            return o.cancelled_stage != "correctness"
        if self.s.correctness_backend == "accordo":
            return "accordo" in o.correctness.details
        needs_testcase = bool(o.spec.testcase) and self.s.correctness_backend != "harness"
        needs_harness = o.spec.harness and self.s.correctness_backend != "testcase"
        if needs_testcase and "testcase" not in o.correctness.details:
            return False
        if needs_harness and "harness" not in o.correctness.details:
            return False
        return True


# ---------------------------------------------------------------------- timing backends
class TimingBackend:
    """One way of timing a kernel: ``performance.backend: <name>``.

    ``measure`` returns the samples (milliseconds; an empty list when the backend ran but has
    nothing to rank on) and the details the report keeps under ``performance``, or raises
    MeasurementError with a message that says what to do. ``auto`` says whether ``backend: auto``
    may pick it for this kernel on this machine; auto tries the backends in registration order.
    A new backend plugs in with ``register_timing_backend``.
    """

    name = ""

    def auto(self, ev: Evaluator, o: KernelOutcome) -> bool:
        return False

    def measure(self, ev: Evaluator, o: KernelOutcome) -> tuple[list[float], dict]:
        raise NotImplementedError


TIMING_BACKENDS: dict[str, TimingBackend] = {}


def register_timing_backend(backend: TimingBackend) -> TimingBackend:
    TIMING_BACKENDS[backend.name] = backend
    return backend


class ProfCommandBackend(TimingBackend):
    """The entry's own prof_command(s); timed only if they print a MAGPIE_TIMING_JSON line."""

    name = "prof_command"

    def auto(self, ev: Evaluator, o: KernelOutcome) -> bool:
        return bool(o.spec.prof)

    def measure(self, ev: Evaluator, o: KernelOutcome) -> tuple[list[float], dict]:
        if not o.spec.prof:
            raise MeasurementError("performance.backend is prof_command but the entry has no prof_command")
        from engine.kernels.command_timing import take_command_timing
        return take_command_timing(ev, o, self.name)


class HarnessBackend(TimingBackend):
    """The Python harness's interleaved timing, taken while it checked correctness (harness_all)."""

    name = "harness"

    def auto(self, ev: Evaluator, o: KernelOutcome) -> bool:
        return bool(o.spec.harness) and ev.s.correctness_backend in ("auto", "harness")

    def measure(self, ev: Evaluator, o: KernelOutcome) -> tuple[list[float], dict]:
        t = o.performance.details.pop("harness_timing", None)
        if not t or t.get("error"):
            raise MeasurementError((t or {}).get("error") or "the harness did not time the kernel (it needs a module "
                                   f"with Model and {o.spec.get_inputs_func}(); see the harness log)")
        samples = [x for r in o.sample_rounds for x in r]
        return samples, {"backend": t.pop("backend"), "method": t}


class TimingJsonBackend(TimingBackend):
    """The testcase's own MAGPIE_TIMING_JSON line (see parse_timing_line), printed by
    ``performance.rounds`` processes of the testcase command that printed it, interleaved with
    the other kernels' (engine.kernels.command_timing)."""

    name = "timing_json"

    def auto(self, ev: Evaluator, o: KernelOutcome) -> bool:
        return TIMING_MARKER in o.testcase_stdout

    def measure(self, ev: Evaluator, o: KernelOutcome) -> tuple[list[float], dict]:
        if not o.spec.testcase:
            raise MeasurementError("backend timing_json needs a testcase_command that prints "
                                   f"'{TIMING_MARKER} {{...}}'")
        from engine.kernels.command_timing import take_command_timing
        return take_command_timing(ev, o, self.name)


class ProfilerBackend(TimingBackend):
    """A vendor profiler run around the first testcase command: find the tool, run the profiled
    command through ``Evaluator._run``, read the launches it recorded, and turn them into
    per-iteration samples and per-kernel durations. Subclasses give the tool's own parts."""

    vendor = ""  # the machine vendor on which auto picks this profiler
    nothing_recorded = ""  # message when no launch was recorded; {raw} is the output path

    def tool(self, ev: Evaluator) -> Optional[str]:
        return getattr(ev.machine, self.name, None) or shutil.which(self.name)

    def output(self, ev: Evaluator, k: KernelSpec) -> Path:
        """Where the profiler writes (created here)."""
        raise NotImplementedError

    def command(self, ev: Evaluator, tool: str, argv: list[str], raw: Path) -> list[str]:
        raise NotImplementedError

    def read(self, raw: Path) -> list:
        """The KernelLaunch records in the profiler's output."""
        raise NotImplementedError

    def recorded(self, launches: list) -> bool:
        return bool(launches)

    def summary(self, ev: Evaluator, launches: list) -> dict:
        """Extra report keys after ``kernels``."""
        return {}

    def auto(self, ev: Evaluator, o: KernelOutcome) -> bool:
        return bool(o.spec.testcase) and ev.machine.vendor == self.vendor and bool(getattr(ev.machine, self.name, None))

    def measure(self, ev: Evaluator, o: KernelOutcome) -> tuple[list[float], dict]:
        from engine.kernels.profilers.common import aggregate_launches, iteration_samples_ns
        k = o.spec
        tool = self.tool(ev)
        if not tool:
            raise MeasurementError(f"backend {self.name}: {self.name} not found on PATH")
        raw = self.output(ev, k)
        argv = self.command(ev, tool, _profiled_argv(k), raw)
        r = ev._run(k, argv, self.name, ev.s.perf_timeout_s)
        if not r.ok:
            raise MeasurementError(f"{self.name} run failed: {r.describe_failure()}\n{r.stderr_tail(1500)}")
        launches = self.read(raw)
        if not self.recorded(launches):
            raise MeasurementError(self.nothing_recorded.format(raw=raw))
        samples_ns, note = iteration_samples_ns(launches)
        extra = {"backend": self.name, "command": command_text(argv), "raw": str(raw), "samples_note": note,
                 "kernels": aggregate_launches(launches), **self.summary(ev, launches)}
        return [v / 1e6 for v in samples_ns], extra


def _profiled_argv(k: KernelSpec) -> list[str]:
    if not k.testcase:
        raise MeasurementError("profiling needs a testcase_command to run under the profiler")
    cmd = k.testcase[0]
    return [shutil.which("bash") or "/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


class NcuBackend(ProfilerBackend):
    """Nsight Compute on NVIDIA: one CSV log per kernel entry."""

    name, vendor = "ncu", "nvidia"
    nothing_recorded = "ncu recorded no kernel launches (see {raw} and the ncu log)"

    def output(self, ev: Evaluator, k: KernelSpec) -> Path:
        log = ev.ws.path("performance", f"{k.id}.ncu.csv")
        log.parent.mkdir(exist_ok=True)
        return log

    def command(self, ev: Evaluator, tool: str, argv: list[str], raw: Path) -> list[str]:
        from engine.kernels.profilers.ncu import build_ncu_command
        return build_ncu_command(tool, argv, raw, extra_args=ev.s.ncu_args,
                                 metrics=ev.s.ncu_metrics or None, kernel_name=ev.s.ncu_kernel_name)

    def read(self, raw: Path) -> list:
        from engine.kernels.profilers.ncu import read_ncu_log
        return read_ncu_log(raw)

    def summary(self, ev: Evaluator, launches: list) -> dict:
        from engine.kernels.profilers.ncu import ncu_summary
        return {"summary": ncu_summary(launches, ev.machine.bandwidth_tbs)}


class Rocprofv3Backend(ProfilerBackend):
    """rocprofv3 kernel traces on AMD: one output folder per kernel entry; helper dispatches
    (copies, fills) alone do not count as a recording."""

    name, vendor = "rocprofv3", "amd"
    nothing_recorded = "rocprofv3 recorded no kernel dispatches under {raw}"

    def output(self, ev: Evaluator, k: KernelSpec) -> Path:
        out_dir = ev.ws.path("performance", f"{k.id}_rocprofv3")
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir

    def command(self, ev: Evaluator, tool: str, argv: list[str], raw: Path) -> list[str]:
        from engine.kernels.profilers.rocprof import build_rocprofv3_command
        return build_rocprofv3_command(tool, argv, raw, extra_args=ev.s.rocprof_args)

    def read(self, raw: Path) -> list:
        from engine.kernels.profilers.rocprof import read_rocprofv3_output
        return read_rocprofv3_output(raw)

    def recorded(self, launches: list) -> bool:
        return any(not x.helper for x in launches)


class UnavailableBackend(TimingBackend):
    """What auto resolves to when nothing else can time the kernel: a failure that says why."""

    name = "unavailable"

    def measure(self, ev: Evaluator, o: KernelOutcome) -> tuple[list[float], dict]:
        raise MeasurementError(
            "no timing backend for this kernel: no GPU profiler found (ncu on NVIDIA, rocprofv3 on AMD) "
            f"and the testcase printed no '{TIMING_MARKER} {{\"samples_ms\": [...]}}' line")


# Registration order is auto's order of preference.
for _b in (ProfCommandBackend(), HarnessBackend(), TimingJsonBackend(), NcuBackend(), Rocprofv3Backend(),
           UnavailableBackend()):
    register_timing_backend(_b)
del _b


_NOT_FOUND = re.compile(r"(?:^|[\s:])([^\s:]+): (?:command not found|No such file or directory)", re.MULTILINE)


def missing_program(r: ProcessResult, cmd: Any, cwd: Path) -> Optional[str]:
    """Why a command could not run at all (its program is not there), phrased with the fix; None
    when it ran (whatever its exit code said). The shell says so with exit code 127, an argv
    command by failing to start."""
    first = (shlex_split_first(cmd) if isinstance(cmd, str) else (str(cmd[0]) if cmd else "")) or "?"
    if r.error and ("No such file" in r.error or "not found" in r.error):
        prog = first
    elif r.returncode == 127 and not (r.timed_out or r.cancelled):
        m = _NOT_FOUND.search(r.stderr or "")
        prog = m.group(1) if m else first
    else:
        return None
    if "/" in prog:
        return (f"{prog} not found (in {cwd}): build it first (compile_command, or the config's prerequisite "
                "step) or check working_dir")
    return f"{prog} not found on PATH: install it or add its folder to PATH"


def shlex_split_first(text: str) -> str:
    import shlex
    try:
        parts = shlex.split(text)
    except ValueError:
        parts = text.split()
    return parts[0] if parts else ""


class MeasurementError(MagpieError):
    """The performance stage could not produce timings; the message names the backend and why."""

    title = "measurement failed"


def parse_timing_json(text: str) -> list[float]:
    """The samples of parse_timing_line, in milliseconds."""
    return parse_timing_line(text)[0]


def parse_timing_line(text: str) -> tuple[list[float], dict]:
    """The testcase's own timing: one ``MAGPIE_TIMING_JSON: {"samples_ms": [...]}`` line (or
    samples_us / samples_ns), optionally with ``"clock": "cpu"`` or ``"device"``. The last such
    line wins. Returns the samples in milliseconds and the line's whole object. Fewer than 2
    samples is an error: a single number has no spread and cannot support a verdict."""
    matches = _TIMING_LINE.findall(text)
    if not matches:
        raise MeasurementError(f"no '{TIMING_MARKER} {{...}}' line in the testcase output")
    try:
        data = json.loads(matches[-1])
    except json.JSONDecodeError as exc:
        raise MeasurementError(f"{TIMING_MARKER} line is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MeasurementError(f"{TIMING_MARKER} needs a JSON object, e.g. {{\"samples_ms\": [...]}}")
    for key, scale in (("samples_ms", 1.0), ("samples_us", 1e-3), ("samples_ns", 1e-6)):
        if key in data:
            vals = data[key]
            if not isinstance(vals, list) or not all(isinstance(v, (int, float)) for v in vals):
                raise MeasurementError(f"{TIMING_MARKER} {key} must be a list of numbers")
            if len(vals) < 2:
                raise MeasurementError(f"{TIMING_MARKER} {key} has {len(vals)} sample(s); print at least 2 "
                                       "(repeats of the timed region) so the spread can be reported")
            return [float(v) * scale for v in vals], data
    raise MeasurementError(f"{TIMING_MARKER} needs a samples_ms, samples_us or samples_ns list (got keys "
                           f"{sorted(data)})")

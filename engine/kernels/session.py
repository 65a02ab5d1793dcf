"""The parent side of the harness: one worker process per kernel, all alive at once.

Correctness: for every input set, the reference's worker (the compare baseline, or the entry's
reference module) computes the expected outputs; each kernel's worker computes its own on a
clone of the same inputs and hands the outputs and its inputs after the call over
(``engine.kernels.tensor_share``); the reference's worker judges them. Nothing is saved to disk.

Timing: the kernels are timed in interleaved rounds (baseline, A, B, then A, B, baseline, ...),
so slow drift of clocks or temperature lands on all of them; after each round, the outputs the
workers kept from timed calls are judged like correctness outputs.
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from engine.errors import MagpieError
from engine.kernels import forkserver
from engine.kernels.command_timing import round_order
from engine.kernels.environment import EnvironmentCause
from engine.kernels.environment import classify as classify_environment
from engine.kernels.harness import LoadSpec
from engine.kernels.sm_clock import ClockWatch
from engine.runs.process import WATCHDOG, CancelToken, read_escaped, stop_process_group, supervised


class WorkerError(MagpieError):
    """The worker could not answer: it died, timed out or was cancelled."""

    title = "kernel worker failed"


class KernelRaised(MagpieError):
    """User code raised inside the worker; the worker is still alive."""

    title = "kernel raised an exception"

    def __init__(self, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.traceback = tb

    def details(self) -> list[str]:
        return self.traceback.rstrip().splitlines()


class WorkerProcess:
    def __init__(self, name: str, python: str, cwd: Path, env: dict, log_stem: Path, scratch: Path,
                 cancel: CancelToken) -> None:
        self.name, self.cancel = name, cancel
        log_stem.parent.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_stem.with_name(log_stem.name + ".stdout.log")
        self.stderr_path = log_stem.with_name(log_stem.name + ".stderr.log")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        full_env = dict(os.environ)
        full_env.update({k: str(v) for k, v in env.items()})
        # Fixed malloc thresholds: glibc otherwise moves them with each process's history of
        # large frees, and two processes running the same code then differ by 40% on the CPU
        # (page faults on every call in one, none in the other).
        full_env.setdefault("MALLOC_MMAP_THRESHOLD_", str(4 << 30))
        full_env.setdefault("MALLOC_TRIM_THRESHOLD_", str(4 << 30))
        self._out = open(self.stdout_path, "ab")
        self._err = open(self.stderr_path, "ab")
        # Under reaper.py: a process the kernel's code leaves behind outside its group is stopped
        # and recorded here (the session rejects such a kernel).
        self.escaped_path = log_stem.with_name(log_stem.name + ".escaped.jsonl")
        self.escaped_path.unlink(missing_ok=True)
        WATCHDOG.ready()  # the worker's group is stopped even if this process is killed outright
        try:
            self.proc = self._start(python, cwd, full_env, scratch, to_child_r, from_child_w)
            WATCHDOG.watch(self.proc.pid)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._w = os.fdopen(to_child_w, "w", encoding="utf-8")
        self._r = from_child_r
        self._buf = b""
        self._sent_at = time.monotonic()
        self.closed = False
        self._exit_sent = False
        self.peak_device_by_op: dict[str, int] = {}
        self.peak_host_by_op: dict[str, int] = {}
        self.held_device_by_op: dict[str, int] = {}
        self.peak_host_rss = 0
        # Shared by the workers of one session (HarnessSession sets it): what each keeps between
        # requests, so a request's peak can be added to what the others hold at that moment.
        self.ledger: Optional[MemoryLedger] = None
        self.together: dict[str, int] = {}

    def _start(self, python: str, cwd: Path, env: dict, scratch: Path, read_fd: int, write_fd: int):
        # Forked from a server that has imported torch once (CPU machines): saves a torch import
        # (~2 s of CPU) per worker. Anything it cannot serve starts a fresh process instead.
        if forkserver.usable():
            try:
                return forkserver.start_worker(python, env, cwd, scratch, read_fd, write_fd, self._out.fileno(),
                                               self._err.fileno(), self.escaped_path)
            except OSError:
                pass
        argv = supervised([python, "-m", "engine.kernels.worker", str(read_fd), str(write_fd), str(scratch)],
                          self.escaped_path)
        return subprocess.Popen(argv, cwd=str(cwd), env=env, stdout=self._out, stderr=self._err,
                                stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(read_fd, write_fd))

    def send(self, op: str, **fields: Any) -> None:
        if self.closed:
            raise WorkerError(f"{self.name}: the worker was already stopped")
        self._sent_at = time.monotonic()
        try:
            self._w.write(json.dumps({"op": op, **fields}) + "\n")
            self._w.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(self._died(op)) from None

    def receive(self, op: str, timeout_s: float) -> dict:
        """The reply to the request sent last; the worker is stopped on a timeout or a cancel."""
        started = self._sent_at
        while b"\n" not in self._buf:
            if self.cancel.cancelled:
                self.stop()
                raise WorkerError(f"{self.name}: cancelled during {op}")
            if time.monotonic() - started > timeout_s:
                self.stop()
                raise WorkerError(f"{self.name}: {op} timed out after {timeout_s:.0f} s (worker's process group killed)")
            ready, _, _ = select.select([self._r], [], [], 0.05)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise WorkerError(self._died(op))
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        reply = json.loads(line)
        reply["_wall_s"] = time.monotonic() - started
        self._note_peak(op, reply.get("peak_memory"))
        if not reply.get("ok"):
            raise KernelRaised(reply.get("error", "error"), reply.get("traceback", ""))
        return reply

    def _note_peak(self, op: str, peak: Any) -> None:
        if not isinstance(peak, dict):
            return
        dev = peak.get("device_bytes")
        if isinstance(dev, int):
            self.peak_device_by_op[op] = max(self.peak_device_by_op.get(op, 0), dev)
        held = peak.get("device_held_bytes")
        if isinstance(held, int):
            self.held_device_by_op[op] = max(self.held_device_by_op.get(op, 0), held)
        rss = peak.get("host_rss_bytes")
        if isinstance(rss, int):
            self.peak_host_rss = max(self.peak_host_rss, rss)
            base = peak.get("host_base_bytes")
            net = max(0, rss - base) if isinstance(base, int) else rss
            self.peak_host_by_op[op] = max(self.peak_host_by_op.get(op, 0), net)
        if self.ledger is not None:
            for where, v in self.ledger.note(self.name, op, peak).items():
                self.together[where] = max(self.together.get(where, 0), v)

    def peak_memory(self) -> dict:
        """The most memory the worker held: on the device by request kind (load, run_set, time,
        audit, ...) and overall, and its resident host peak (by request kind too, above the
        process's own size less the tensors it keeps: the interpreter, torch, libraries); bytes.
        ``device_held_bytes_by_request``: what it kept on the device after each kind of request
        (the allocator's reserve, once its free blocks were given back);
        ``device_bytes_together``: the most the session's workers held on the device at once
        during this worker's requests (its peak plus what the others kept meanwhile);
        ``host_bytes_together`` the same for host memory above each process's base."""
        out: dict = {"host_rss_bytes": self.peak_host_rss or None}
        if self.peak_device_by_op:
            out["device_bytes"] = max(self.peak_device_by_op.values())
            out["device_bytes_by_request"] = dict(self.peak_device_by_op)
        if self.held_device_by_op:
            out["device_held_bytes_by_request"] = dict(self.held_device_by_op)
        if self.peak_host_by_op:
            out["host_bytes_by_request"] = dict(self.peak_host_by_op)
        for where in ("device", "host"):
            if where in self.together:
                out[f"{where}_bytes_together"] = self.together[where]
        return out

    def request(self, op: str, timeout_s: float, **fields: Any) -> dict:
        self.send(op, **fields)
        return self.receive(op, timeout_s)

    def _died(self, op: str) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.stop()
        tail = ""
        try:
            tail = self.stderr_path.read_text(errors="replace").strip()[-1500:]
        except OSError:
            pass
        return f"{self.name}: the worker exited (code {code}) during {op}" + (f"\n{tail}" if tail else "")

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._w.close()
        except OSError:
            pass
        grace_s = 3.0 if self.proc.poll() is None else 0.1
        if isinstance(self.proc, forkserver.ForkedWorker):
            self.proc.stop_group(grace_s)
        else:
            stop_process_group(self.proc, grace_s=grace_s)
        WATCHDOG.forget(self.proc.pid)
        if self.ledger is not None:
            self.ledger.forget(self.name)
        os.close(self._r)
        self._out.close()
        self._err.close()

    def escaped(self) -> list[dict]:
        """Processes the worker's descendants left running outside its group, stopped so far."""
        return read_escaped(self.escaped_path)

    def ask_exit(self) -> bool:
        """Send the exit request without waiting (``close`` waits): a session closing all its
        workers asks each of them first, so they wind down together. False when it could not be
        sent (the worker is stopped or its pipe is gone)."""
        if self.closed:
            return False
        if not self._exit_sent:
            try:
                self._w.write(json.dumps({"op": "exit"}) + "\n")
                self._w.flush()
            except OSError:
                return False
            self._exit_sent = True
        return True

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.ask_exit():
                self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.stop()


@dataclass
class Member:
    """One kernel in the session, with what its worker reported."""
    key: str
    spec: Any  # engine.kernels.plan.KernelSpec
    role: str  # "reference" (judges others), "kernel" (judged), "self" (no reference: self-check)
    timed: bool = False
    worker: Optional[WorkerProcess] = None
    load: dict = field(default_factory=dict)
    seeds: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # correctness failures
    # Failures of the machine (out of memory, no GPU, a missing package): the kernel was not judged.
    environment: list[str] = field(default_factory=list)
    # Guard violations, each {"guard": name, "message": text}: before timing (never timed) and
    # while timing (never ranked).
    rejections: list[dict] = field(default_factory=list)
    timing_rejections: list[dict] = field(default_factory=list)
    flags: list[dict] = field(default_factory=list)
    rounds: list[list[float]] = field(default_factory=list)
    events_rounds: list[list[float]] = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    checked_calls: int = 0
    other_stream_calls: int = 0
    addresses_reused: int = 0  # calls whose inputs could not be placed at a new address
    pinned_cpu: Optional[int] = None  # the CPU a CPU kernel's timed calls ran on (every worker the same)
    # Traced calls against the discovery call's kernels: calls, differ, empty, first example.
    kernel_sets: dict = field(default_factory=lambda: {"calls": 0, "differ": 0, "empty": 0, "example": None})
    state: str = "pending"  # pending -> checked -> timed; or failed / cancelled
    cancelled_in: Optional[str] = None
    output_bytes: int = 0
    flops: Optional[int] = None  # per call, counted when this member ran as a reference (its own, or the judge)
    adopted: Optional[bool] = None
    clock_audit: Optional[dict] = None  # the judge's own timing of a few calls (Session._clock_audit)


def environment_cause(exc: BaseException) -> Optional[EnvironmentCause]:
    """The failure of the machine an exception from a worker shows (its message, its traceback,
    or a dead worker's log tail), or None."""
    return classify_environment(f"{exc}\n{getattr(exc, 'traceback', '')}")


class MemoryLedger:
    """What each worker of a session keeps between requests, on the device and on the host.

    The session asks one worker at a time, so while one works the others only hold what they
    kept: a request's peak plus the others' holdings bounds what the workers took together
    (the loads run at once, so a load counts the others' load peaks). Host numbers are taken
    above each process's own size less the tensors it keeps (the interpreter, torch, libraries)."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, int]] = {"device": {}, "host": {}}
        self.loads: dict[str, dict[str, int]] = {"device": {}, "host": {}}

    def note(self, name: str, op: str, peak: dict) -> dict[str, int]:
        base = peak.get("host_base_bytes") if isinstance(peak.get("host_base_bytes"), int) else 0
        values = {"device": (peak.get("device_bytes"), peak.get("device_held_bytes"), 0),
                  "host": (peak.get("host_rss_bytes"), peak.get("host_held_bytes"), base)}
        together: dict[str, int] = {}
        for where, (top, held, zero) in values.items():
            if not isinstance(top, int):
                continue
            top = max(0, top - zero)
            others = {**self.held[where], **self.loads[where]} if op == "load" else self.held[where]
            together[where] = top + sum(v for k, v in others.items() if k != name)
            if op == "load":
                self.loads[where][name] = top
            if isinstance(held, int):
                self.held[where][name] = max(0, held - zero)
        return together

    def forget(self, name: str) -> None:
        """A stopped worker holds nothing."""
        for table in (*self.held.values(), *self.loads.values()):
            table.pop(name, None)


def audit_seen(real: list[float], null: list[float]) -> tuple[float, float]:
    """What the judge's batches saw per call (the medians' difference) and the noise of it."""
    import statistics
    return (statistics.median(real) - statistics.median(null),
            3 * (_mad(real) + _mad(null)) / math.sqrt(len(real)))


def audit_outcome(claimed_ms: float, real: list[float], null: list[float], ratio: float) -> str:
    """The clock audit's finding, from the kernel's claimed median per call and the judge's
    batches (per-call wall times with the calls, and without: ``real``, ``null``): "fine" (the
    claim is at least ``ratio`` of what the judge saw), "forged" (below it by more than the
    noise of the judge's medians), or "unsure" (below it, but within that noise).

    On a machine whose cores other processes share, a batch of calls is often put off the CPU
    while the median of single calls is not: a batch's time then counts the waits too (an honest
    kernel was seen claiming 0.23 of the judge's median on a 2-core machine running three test
    workers). What the judge's least-delayed quarter of batches saw is the other fair reading: a
    claim it confirms, clearly above the noise, is fine. A forged claim is below both (the
    adversaries' claims are under 0.01 of what their batches take)."""
    seen, noise = audit_seen(real, null)
    if claimed_ms >= ratio * seen:
        return "fine"
    if len(real) >= 4:
        import statistics
        seen_low = statistics.quantiles(real, n=4)[0] - statistics.median(null)
        # a reading of the work, not of the empty batches' noise
        null_noise = 3 * _mad(null) / math.sqrt(len(null))
        if seen_low > max(AUDIT_SLACK_MS, null_noise) and claimed_ms >= ratio * seen_low:
            return "fine"
    return "forged" if claimed_ms < ratio * seen - max(AUDIT_SLACK_MS, noise) else "unsure"


def _set_label(meta: dict) -> str:
    """How an input set is named in messages: "main inputs", "extra 0 inputs", "main inputs
    redrawn from a uniform distribution"."""
    dist = meta.get("distribution", "problem")
    return f"{meta['shape']} inputs" + ("" if dist == "problem" else f" redrawn from a {dist} distribution")


def _add_kernel_sets(m: "Member", found: Optional[dict]) -> None:
    """Sum a reply's kernel-set check (engine.kernels.worker.kernel_set_check) into ``m``'s."""
    if not found:
        return
    ks = m.kernel_sets
    for k in ("calls", "differ", "empty"):
        ks[k] += int(found.get(k) or 0)
    if ks["example"] is None and found.get("example"):
        ks["example"] = found["example"]


def _add_new(dst: list, items: list) -> None:
    """Append the messages ``dst`` does not hold yet (a guard reports on every request)."""
    dst.extend(e for e in items if e not in dst)


def hardware_floor(moved_bytes: int, flops: Optional[int], bandwidth_tbs: Optional[float],
                   peak_tflops: Optional[float]) -> Optional[tuple[float, str]]:
    """The least time a call can take, in ms, and why: its bytes at the memory bandwidth, or its
    flops (counted on the reference's call) at the fastest math rate of any dtype, whichever is
    longer. None when neither is known."""
    floors = []
    if moved_bytes and bandwidth_tbs:
        ms = moved_bytes / (bandwidth_tbs * 1e12) * 1e3
        floors.append((ms, f"reading its {moved_bytes / 1e6:.1f} MB of inputs (and outputs beyond L2) at "
                           f"{bandwidth_tbs:g} TB/s takes at least {ms * 1e3:.2f} us"))
    if flops and peak_tflops:
        ms = flops / (peak_tflops * 1e12) * 1e3
        floors.append((ms, f"its {flops / 1e9:.3g} GFLOP (counted on the reference's call) at {peak_tflops:g} "
                           f"TFLOP/s, the GPU's fastest rate in any precision, take at least {ms * 1e3:.2f} us"))
    return max(floors) if floors else None


# The clock audit: batches of back-to-back calls of about AUDIT_BATCH_MS (so the pipe's round trip
# and the first call's cold start are spread over many), enough real/null pairs for about
# AUDIT_BUDGET_S of calls within these bounds; a kernel is rejected when its samples claim under
# AUDIT_RATIO of what the judge's clock saw, beyond the audit's own noise (at least AUDIT_SLACK_MS).
AUDIT_BATCH_MS, AUDIT_MAX_BATCH = 2.0, 64
AUDIT_MIN_PAIRS, AUDIT_MAX_PAIRS, AUDIT_BUDGET_S = 6, 16, 0.5
AUDIT_RATIO, AUDIT_SLACK_MS = 0.6, 0.005
# On the CPU the audit's batches share the cores with everything else on the machine: honest
# kernels were seen claiming 0.55-0.6 of the judge's clock on a loaded 2-core machine, the
# forged samples of the adversary suite claim under 0.01 of it.
AUDIT_RATIO_CPU = 0.3


def _mad(xs: list[float]) -> float:
    import statistics
    med = statistics.median(xs)
    return statistics.median(abs(x - med) for x in xs)


def secret_seeds(n: int) -> list[int]:
    return [int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF for _ in range(n)]


@dataclass
class SessionSettings:
    seeds: list[int]
    seeds_hidden: bool
    rtol: Optional[float]
    atol: Optional[float]
    timer: str  # auto | trace | events | graph  (wall on a CPU)
    repeats: Optional[int]
    warmup: Optional[int]
    rounds: int
    l2_flush: bool
    device: str
    load_timeout_s: float
    correctness_timeout_s: float
    perf_timeout_s: float
    bandwidth_tbs: Optional[float]
    # Main input sets larger than this in all are made again from their seeds instead of kept
    # (default on a GPU: 1/16 of its memory; on a CPU, kept).
    keep_sets_bytes: Optional[int] = None
    peak_tflops: Optional[float] = None  # the GPU's fastest dense math rate, for the flop floor


class HarnessSession:
    """Correctness for every member against one reference, then interleaved timing of the timed ones."""

    def __init__(self, *, members: list[Member], reference: Optional[Member], settings: SessionSettings,
                 python: str, env_for, log_stem_for, cancel: CancelToken, emit) -> None:
        self.members, self.reference, self.s = members, reference, settings
        self.python, self.env_for, self.log_stem_for = python, env_for, log_stem_for
        self.cancel, self.emit = cancel, emit
        self.degenerate: Optional[str] = None
        # Variant input sets (redrawn from other distributions) the reference could not handle:
        # set index -> why; they are judged for no one.
        self.dropped_sets: dict[int, str] = {}
        self.floor_note: Optional[str] = None
        self.timer_used: Optional[str] = None
        self._scratch = Path(tempfile.mkdtemp(prefix="magpie-harness-"))
        self._ledger = MemoryLedger()
        self._clocks = ClockWatch(None, "no kernel was timed")

    # ------------------------------------------------------------ life cycle
    def _everyone(self) -> list[Member]:
        out = list(self.members)
        if self.reference is not None and self.reference not in out:
            out.insert(0, self.reference)
        return out

    def run(self) -> None:
        try:
            self._start()
            if not self.cancel.cancelled:
                self._correctness()
            if not self.cancel.cancelled:
                self._timing()
        finally:
            alive = [m for m in self._everyone() if m.worker is not None]
            for m in alive:  # all of them asked first: they exit together, not one after another
                m.worker.ask_exit()
            for m in alive:
                m.worker.close()
                self._check_escaped(m)
            for p in self._scratch.glob("*"):
                p.unlink(missing_ok=True)
            self._scratch.rmdir()
            if self.cancel.cancelled:
                for m in self.members:
                    if m.state in ("pending", "checked", "timing"):
                        m.cancelled_in = "correctness" if m.state == "pending" else "performance"

    def _fail(self, m: Member, message: str, exc: Optional[BaseException] = None) -> None:
        """``m`` is out. When ``exc`` (what the worker raised, or its log's tail when it died)
        shows a failure of the machine, it was not judged: an environment failure, not an error."""
        cause = environment_cause(exc) if exc is not None else None
        if cause is not None:
            where = message.split(":", 1)[0]
            m.environment.append(cause.message() + (f" ({where})" if where != "harness failed" else ""))
        else:
            m.errors.append(message)
        m.state = "failed"

    def _fail_with_ref(self, m: Member, ref: Member, what: str) -> None:
        """``m`` cannot be judged because its reference failed: not judged when the reference hit a
        failure of the machine, else an error naming the reference's."""
        if ref.environment and not ref.errors:
            m.environment.append(f"the {self._ref_name()} could not run here ({ref.environment[0]})")
        else:
            m.errors.append(f"cannot compare outputs with the reference: {what} "
                            f"({ref.errors[0] if ref.errors else 'see its log'})")
        m.state = "failed"

    def _start(self) -> None:
        ref = self.reference
        # Every worker imports torch at once; the replies are read in order below.
        for m in self._everyone():
            k = m.spec
            src = ref.spec if (ref is not None and m.role != "self") else k  # every input comes from the reference
            m.worker = WorkerProcess(m.key, self.python, k.working_dir, self.env_for(k), self.log_stem_for(m),
                                     self._scratch, self.cancel)
            m.worker.ledger = self._ledger
            self.emit(m, "harness", "running")
            try:
                spec = LoadSpec.for_kernel(k, src, seeds=self.s.seeds, device=self.s.device,
                                           share_state=m.role == "reference", keep_sets_bytes=self.s.keep_sets_bytes)
                m.worker.send("load", **spec.fields())
            except WorkerError as exc:
                self._fail(m, f"harness failed: could not start the worker: {exc}")
        for m in self._everyone():
            if m.state == "failed":
                continue
            try:
                m.load = m.worker.receive("load", self.s.load_timeout_s)
            except (KernelRaised, WorkerError) as exc:
                self._fail(m, f"harness failed: could not load the kernel: {exc}", exc)
                continue
            for i, meta in enumerate(m.load.get("set_meta", [])):
                own = meta["shape"] == "main" and meta.get("distribution", "problem") == "problem"
                meta["seed"] = self.s.seeds[i] if own else self.s.seeds[0]
            _add_new(m.rejections, m.load.get("guard_errors", []))
        if ref is not None and ref.state != "failed" and ref.load.get("state"):
            for m in self.members:
                if m is ref or m.state == "failed" or m.role != "kernel":
                    continue
                try:
                    m.adopted = m.worker.request("adopt", self.s.load_timeout_s, state=ref.load["state"])["adopted"]
                except (KernelRaised, WorkerError) as exc:
                    self._fail(m, f"harness failed: could not take the reference's weights: {exc}", exc)

    # ------------------------------------------------------------ correctness
    def _classify(self, m: Member, reply: dict) -> list[str]:
        _add_new(m.rejections, reply.get("guard_errors", []))
        return list(reply.get("errors", []))

    def _correctness(self) -> None:
        ref = self.reference
        judged = [m for m in self.members if m.role == "kernel"]
        if ref is not None and ref.state == "failed":
            for m in judged:
                if m.state != "failed":
                    self._fail_with_ref(m, ref, "it did not load")
        judges = [ref] if ref is not None else []
        selfs = [m for m in self.members if m.role == "self"]
        sets = (ref.load if ref is not None and ref.state != "failed" else
                (selfs[0].load if selfs and selfs[0].state != "failed" else {})).get("set_meta", [])
        for idx, meta in enumerate(sets):
            for m in self._everyone():  # where the check is: input set i of n, for every kernel still in
                if m.state != "failed" and not self.cancel.cancelled:
                    self.emit(m, "correctness", "running", step=idx + 1, steps=len(sets), detail=_set_label(meta))
            for j in judges + selfs:
                if j.state != "failed" and not self.cancel.cancelled:
                    self._self_check_set(j, idx, meta)
            if idx in self.dropped_sets:
                continue
            if ref is not None and ref.state == "failed":
                for m in judged:
                    if m.state != "failed":
                        self._fail_with_ref(m, ref, "it failed its own checks")
                break
            for m in judged:
                if m.state == "failed" or self.cancel.cancelled:
                    continue
                if not self._judge_set(m, idx, meta):
                    break
        for m in self.members:
            if m.state == "pending" and not self.cancel.cancelled:
                m.state = "checked"
            self.emit(m, "harness", {"failed": "FAILED", "checked": "SUCCESS"}.get(m.state, "CANCELLED"))
        if not self.cancel.cancelled and ref is not None and ref.state != "failed":
            self._check_degenerate(ref)

    def _self_check_set(self, j: Member, idx: int, meta: dict) -> None:
        """The reference (or a kernel checked against itself) on input set ``idx``: finite, fully
        written, the same answer twice, its inputs left alone. On a variant set (one redrawn from
        another distribution) a failure drops the set instead: the problem may not be defined
        there, and no kernel is called incorrect for what its reference cannot do."""
        variant = meta.get("distribution", "problem") != "problem"
        try:
            r = j.worker.request("run_set", self.s.correctness_timeout_s, index=idx, role="reference")
        except KernelRaised as exc:
            if variant:
                self._drop_set(j, idx, meta, f"it raised: {exc}")
            else:
                self._fail(j, f"harness failed: {exc}", exc)
            return
        except WorkerError as exc:
            self._fail(j, f"harness failed: {exc}", exc)
            return
        errs = self._classify(j, r)
        entry = {"seed": meta["seed"], "shape": meta["shape"], **r.get("self_check", {})}
        if r.get("inputs_check"):
            errs.append(r["inputs_check"])
        if errs:
            entry["passed"], entry["reason"] = False, errs[0]
        if variant:
            entry["distribution"] = meta["distribution"]
            if not entry.get("passed"):
                self._drop_set(j, idx, meta, entry.get("reason", "mismatch"))
                return
        j.seeds.append(entry)
        j.output_bytes = max(j.output_bytes, int(r.get("output_bytes", 0)))
        if r.get("flops"):
            j.flops = int(r["flops"])
        if not entry.get("passed"):
            self._fail(j, f"outputs failed the reference's self-check (seed {meta['seed']}, {meta['shape']} "
                          f"inputs): {entry.get('reason', 'mismatch')}")

    def _drop_set(self, j: Member, idx: int, meta: dict, why: str) -> None:
        name = self._ref_name() if j is self.reference else j.key
        self.dropped_sets[idx] = (f"input set {idx} ({_set_label(meta)}) dropped: the {name} fails its own check "
                                  f"there ({why}); no kernel is judged on it")
        j.seeds.append({"seed": meta["seed"], "shape": meta["shape"], "distribution": meta["distribution"],
                        "passed": None, "dropped": self.dropped_sets[idx]})

    def _judge_set(self, m: Member, idx: int, meta: dict) -> bool:
        """Kernel ``m`` on input set ``idx``, judged in the reference's worker. False when a cancel
        stopped it (the caller stops judging)."""
        ref = self.reference
        try:
            c = m.worker.request("run_set", self.s.correctness_timeout_s, index=idx, role="kernel")
            local = self._classify(m, c)
            res = ref.worker.request("judge", self.s.correctness_timeout_s, index=idx, perturb=None,
                                     outputs=c["outputs"], inputs=c["inputs"], rtol=self.s.rtol,
                                     atol=self.s.atol, inplace=bool(getattr(m.spec, "inplace", False)))
            m.worker.request("release", self.s.correctness_timeout_s, handles=[c["handle"]])
        except KernelRaised as exc:
            self._fail(m, f"the kernel raised on seed {meta['seed']} ({_set_label(meta)}): {exc}", exc)
            return True
        except WorkerError as exc:
            if self.cancel.cancelled:
                return False
            self._fail(m, f"harness failed: {exc}", exc)
            return True
        m.output_bytes = max(m.output_bytes, int(c.get("output_bytes", 0)))
        entry = {"seed": meta["seed"], "shape": meta["shape"],
                 **({"distribution": meta["distribution"]} if meta.get("distribution", "problem") != "problem" else {}),
                 **{k: v for k, v in res.items() if k not in ("ok", "inputs_check")}}
        problems = local + ([res["inputs_check"]] if res.get("inputs_check") else [])
        if problems:
            entry["passed"], entry["reason"] = False, problems[0]
        m.seeds.append(entry)
        if not entry.get("passed"):
            self._fail(m, f"outputs differ from the {self._ref_name()} (seed {meta['seed']}, {_set_label(meta)}): "
                          f"{entry.get('reason', 'mismatch')}")
        return True

    def _check_degenerate(self, ref: Member) -> None:
        """Would zeros, a constant or the input pass this test? Then it cannot tell kernels apart."""
        try:
            d = ref.worker.request("degenerate", self.s.correctness_timeout_s, rtol=self.s.rtol, atol=self.s.atol,
                                   skip=sorted(self.dropped_sets))
            self.degenerate = d.get("degenerate")
            ref.worker.request("release", self.s.correctness_timeout_s, references=True)
        except (KernelRaised, WorkerError) as exc:
            self.degenerate = None
            ref.flags.append({"guard": "degenerate_test", "message": f"the degenerate-test check failed: {exc}"})

    def _ref_name(self) -> str:
        ref = self.reference
        if ref is None:
            return "expected result"
        return "baseline" if not ref.key.startswith("reference:") else f"reference {ref.spec.reference_file.name}"

    # ------------------------------------------------------------ timing
    def _timer(self, m: Member) -> str:
        dev = (m.load.get("device") or {}).get("type")
        if dev != "cuda":
            return "wall"
        t = self.s.timer
        return "trace" if t == "auto" else t

    def _check_escaped(self, m: Member) -> None:
        """A kernel whose code left a process running outside its worker (fork, setsid, fork) did
        work where no guard and no clock sees it: rejected, the process already stopped."""
        if m.worker is None:
            return
        found = m.worker.escaped()
        if found:
            shown = ", ".join(f"pid {e.get('pid')} `{str(e.get('command', ''))[:80]}`" for e in found[:3])
            _add_new(m.rejections, [{
                "guard": "processes",
                "message": f"the kernel's code left {len(found)} process(es) running outside its worker after their "
                           f"parent ended ({shown}): work in a detached process escapes the timed window and the "
                           "checks; they were stopped"}])

    def _timing(self) -> None:
        for m in self._everyone():
            self._check_escaped(m)
        for m in self.members:
            # A kernel that is out can hold memory or run threads: stop it before anything is timed.
            if m.worker is not None and m is not self.reference and (m.state == "failed" or m.rejections):
                m.worker.close()
        timed = [m for m in self.members if m.timed and m.state == "checked" and not m.rejections]
        plans: dict[str, dict] = {}
        for m in timed:
            plan = self._warm(m)
            if self.cancel.cancelled:
                return
            if plan is not None:
                plans[m.key] = plan
        timed = [m for m in timed if m.key in plans and not m.rejections]
        if not timed:
            return
        n_rounds = max((plans[m.key]["rounds"] for m in timed), default=0)
        self._clocks = ClockWatch.for_members(timed, self.env_for)
        try:
            r = -1
            while r < n_rounds:
                # Round -1 warms every kernel up under the same conditions as the timed rounds (the
                # first rounds after the others' start-up and correctness ran slow on a busy CPU);
                # its samples are dropped. ABBA: rotate every second round and reverse every other
                # one, so no kernel always runs first, or right after the judge's work.
                if not self._round(r, round_order(timed, r) if r >= 0 else timed[::-1], plans):
                    return
                # A clock drop seen: the remaining rounds are split, with a cool-down before each.
                n_rounds = self._clocks.after_round(r, {m.key: plans[m.key] for m in timed})
                r += 1
        finally:
            self._clocks.close()
        for m in timed:
            if m.state == "timing" and plans[m.key]["timer"] in ("events", "graph"):
                self._audit_streams(m)
        for m in timed:
            if m.state == "timing" and not self.cancel.cancelled:
                self._clock_audit(m, plans[m.key])
        for m in timed:
            if m.state == "timing":
                m.state = "timed"
                self._finish_timing(m, plans[m.key])

    def _warm(self, m: Member) -> Optional[dict]:
        """Warm ``m`` up and plan its timing (repeats from the measured call time), or None."""
        timer = self._timer(m)
        m.state = "timing"
        self.emit(m, "performance", "running", detail="warm-up")
        try:
            w = m.worker.request("warm", self.s.perf_timeout_s, warmup=self.s.warmup, l2_flush=self.s.l2_flush,
                                 timer=timer)
        except (KernelRaised, WorkerError) as exc:
            self._timing_failed(m, f"warm-up failed: {exc}", exc)
            return None
        _add_new(m.rejections, w.get("guard_errors", []))
        est_s = max(w["estimate_ms"] / 1e3, 1e-7)
        if self.s.repeats:
            repeats = int(self.s.repeats)
        elif timer == "wall":
            repeats = int(min(200, max(10, math.ceil(2.0 / est_s))))
        else:
            repeats = int(min(1000, max(100, math.ceil(0.5 / est_s))))
        rounds = max(1, min(self.s.rounds, repeats))
        return {"timer": timer, "repeats": repeats, "rounds": rounds, "per_round": math.ceil(repeats / rounds),
                "warm": w}

    @cached_property
    def _timing_cpu(self) -> Optional[int]:
        """The one CPU every worker of this session makes its timed calls on, when they run on the
        CPU (``worker._pin_timing_thread``): the CPU this process was on when timing began (another
        session at the same time most likely picks another), chosen once; None with one CPU."""
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            return None
        if len(allowed) < 2:
            return None
        try:  # field 39 of /proc/self/stat: the CPU this process last ran on
            with open("/proc/self/stat", "rb") as f:
                now = int(f.read().rsplit(b")", 1)[1].split()[36])
        except (OSError, ValueError, IndexError):
            now = -1
        return now if now in allowed else max(allowed)

    def _round(self, r: int, order: list[Member], plans: dict[str, dict]) -> bool:
        """One round of every timed kernel in ``order``, then the judging of what they kept.
        False when the run was cancelled."""
        judge = self.reference
        pending: list[tuple[Member, list[dict]]] = []
        for m in order:
            if self.cancel.cancelled:
                return False
            if m.state != "timing" or r >= plans[m.key]["rounds"]:
                continue
            p = plans[m.key]
            if r < 0:
                self.emit(m, "performance", "running", step=0, steps=p["rounds"], detail="warm-up round")
            else:
                self.emit(m, "performance", "running", step=r + 1, steps=p["rounds"],
                          detail=f"{p['per_round']} call{'' if p['per_round'] == 1 else 's'}")
            self._clocks.cool_down(m.key, r)
            try:
                # Every timed kernel keeps outputs the same way (the judge's own are dropped
                # unjudged), so none of them runs under other allocation conditions.
                with self._clocks.during(m.key, r):
                    rep = m.worker.request("time", self.s.perf_timeout_s, n=p["per_round"], timer=p["timer"],
                                           keep=1 if judge is not None else 0, cpu=self._timing_cpu)
            except (KernelRaised, WorkerError) as exc:
                if self._timing_failed(m, f"timing failed in round {r + 1}: {exc}", exc):
                    return False
                continue
            _add_new(m.timing_rejections, rep.get("guard_errors", []))
            if rep.get("errors"):  # it answered a timed call from a cache: incorrect, never ranked
                self._fail(m, rep["errors"][0])
                continue
            wall, span = rep["_wall_s"], rep["round_span_s"]
            if span < 0.5 * wall - 0.05:
                m.timing_rejections.append({"guard": "clock", "message": "the kernel's process clock disagrees with "
                                            f"the harness's: it counted {span:.3f} s for a round the harness saw "
                                            f"take {wall:.3f} s (clock tampered?)"})
            if r >= 0:  # round -1's samples are dropped
                m.rounds.append(rep["samples_ms"])
                m.other_stream_calls += int(rep.get("other_stream_calls", 0))
                _add_kernel_sets(m, rep.get("kernel_sets"))
                m.addresses_reused = max(m.addresses_reused, int(rep.get("addresses_reused") or 0))
                m.pinned_cpu = rep.get("pinned_cpu")
                if rep.get("events_ms"):
                    m.events_rounds.append(rep["events_ms"])
            pending.append((m, rep.get("kept", [])))
        # Judged once the round is over: judging never sits between two kernels' timing.
        # The judge's own kept calls go first: it needs the memory to judge the others.
        pending.sort(key=lambda mk: mk[0] is not judge)
        for m, kept in pending:
            if m is judge:
                self._release(m, kept)
            else:
                self._judge_kept(m, kept)
        return True

    def _timing_failed(self, m: Member, why: str, exc: Optional[BaseException] = None) -> bool:
        """Record why ``m`` could not be timed; True when the run was cancelled (stop timing)."""
        if self.cancel.cancelled:
            return True
        cause = environment_cause(exc) if exc is not None else None
        if cause is not None:
            m.environment.append(f"{cause.message()} (timing)")
            why = f"{why.split(':', 1)[0]}: {cause.message()}"
        m.timing = {"error": why}
        m.state = "failed_timing"
        return False

    def _audit_streams(self, m: Member) -> None:
        """Events time only the launching stream: a few calls under the device trace show whether
        the kernel puts work elsewhere, which the events cannot see."""
        try:
            rep = m.worker.request("time", self.s.perf_timeout_s, n=5, timer="trace", keep=0)
        except (KernelRaised, WorkerError) as exc:
            m.flags.append({"guard": "escaped_stream", "message": f"the stream audit could not run: {exc}"})
            return
        import statistics
        spans = [x for x in rep.get("trace_spans_ms", []) if x is not None]
        ev = statistics.median(rep["events_ms"]) if rep.get("events_ms") else None
        span = statistics.median(spans) if spans else None
        _add_kernel_sets(m, rep.get("kernel_sets"))
        if rep.get("other_stream_calls") or (span is not None and ev is not None and span > ev * 1.10 + 0.002):
            m.timing_rejections.append({"guard": "escaped_stream", "message": (
                "work ran outside the timed stream: the device trace shows "
                + (f"{span * 1e3:.1f} us per call" if span is not None else "kernels")
                + f" on streams the events do not cover (events: {ev * 1e3 if ev else 0:.1f} us); the events "
                "timer cannot time this kernel: use the default timer (trace)")})

    def _floor(self, m: Member) -> Optional[tuple[float, str]]:
        """The hardware floor of one call of ``m`` (engine.kernels.session.hardware_floor), or None.

        The byte floor assumes every call reads all its inputs; a gather (a KV cache read by
        slot and length, an embedding lookup) reads a fraction of them. So a floor the judge's
        own median already breaks is not a floor for this problem: it is dropped for every kernel
        (``self.floor_note`` says why) rather than rejecting an honest kernel."""
        import statistics
        judge = self.reference
        l2 = int(m.load.get("l2_bytes") or 0)
        moved = int(m.load.get("input_bytes") or 0) + max(0, m.output_bytes - l2)
        # The judge's count for the kernels it judges; a kernel checked against itself has its own.
        flops = m.flops if m.role == "self" or self.reference is None else self.reference.flops
        if flops:
            m.timing["reference_flops"] = flops
        floor = hardware_floor(moved, flops, self.s.bandwidth_tbs, self.s.peak_tflops)
        if floor is None or judge is None or m.role == "self":
            return floor  # no trusted judge: the floor stands
        judge_samples = [x for r in judge.rounds for x in r]
        if judge_samples and statistics.median(judge_samples) < floor[0]:
            self.floor_note = (f"no hardware floor: the reference's own median ({statistics.median(judge_samples) * 1e3:.2f} "
                               f"us) is below it ({floor[1]}): the problem reads only part of its inputs")
            return None
        return floor

    def _clock_audit(self, m: Member, plan: dict) -> None:
        """Time a few batches of calls by this process's own clock, which no kernel can reach:
        each batch of ``k`` back-to-back calls (as in the timed rounds) against a null batch (the
        same requests without the calls), alternated. The kernel's samples travel back through
        its own process; if they claim much less than the judge saw, they were forged on the way
        (a rewritten sample list, a patched serializer) and the kernel is rejected. A couple of
        the audited calls' outputs are judged like the timed ones'."""
        import statistics
        est_ms = max(float(plan["warm"]["estimate_ms"]), 1e-4)
        k = int(min(AUDIT_MAX_BATCH, max(1, math.ceil(AUDIT_BATCH_MS / est_ms))))
        pairs = int(min(AUDIT_MAX_PAIRS, max(AUDIT_MIN_PAIRS, AUDIT_BUDGET_S * 1e3 / (est_ms * k))))
        real: list[float] = []
        null: list[float] = []
        n_kept = 0
        samples = [x for r in m.rounds for x in r]
        claimed = statistics.median(samples) if samples else None
        on_gpu = (m.load.get("device") or {}).get("type") == "cuda" or str(self.s.device).startswith("cuda")
        ratio = AUDIT_RATIO if on_gpu else AUDIT_RATIO_CPU

        def verdict() -> str:
            return audit_outcome(claimed, real, null, ratio)

        target = 2 * pairs
        try:
            i = 0
            while i < target:
                is_null = (i % 2 == 0) == ((i // 2) % 2 == 0)  # null, real, real, null, ...: no drift wins
                k = int(m.worker.request("audit_prepare", self.s.perf_timeout_s, k=k)["k"])  # memory may cap it
                rep = m.worker.request("audit_go", self.s.perf_timeout_s, null=is_null,
                                       keep=not is_null and n_kept < 2 and i >= pairs)
                (null if is_null else real).append(rep["_wall_s"] * 1e3 / k)
                kept = rep.get("kept", [])
                n_kept += len(kept)
                # Judged (or, the judge's own, let go) before the next batch, outside the batches'
                # clock: a kept output and its inputs are a call's worth of memory each.
                if self.reference is not None and m is not self.reference and m.state != "failed":
                    self._judge_kept(m, kept)
                else:
                    self._release(m, kept)
                if m.worker.closed:  # it died while its outputs were judged (already recorded)
                    return
                i += 1
                # A busy machine can hide a forged claim in the noise: more batches, up to four
                # times as many, until the audit can tell.
                if (i == target and claimed is not None and real and null and target < 8 * pairs
                        and verdict() == "unsure"):
                    target += 2 * pairs
            m.worker.request("release", self.s.correctness_timeout_s, handles=[])  # the last batch's inputs
        except (KernelRaised, WorkerError) as exc:
            if not self.cancel.cancelled:
                self._fail(m, f"harness failed during the clock audit: {exc}", exc)
            return
        if claimed is None or not real or not null:
            return
        seen, noise = audit_seen(real, null)
        m.clock_audit = {"batches": len(real), "calls_per_batch": k, "judge_seen_ms": seen,
                         "null_ms": statistics.median(null), "noise_ms": noise, "claimed_ms": claimed, "ratio": ratio}
        outcome = verdict()
        m.clock_audit["outcome"] = outcome
        if outcome == "unsure":
            # Neither confirmed nor disproved: its samples are not used, so it can neither win nor lose.
            m.timing = {"error": (f"not measured: the judge's own clock could not confirm its samples (they claim "
                                  f"{claimed * 1e3:.1f} us per call, the judge saw {seen * 1e3:.1f} us +- "
                                  f"{noise * 1e3:.1f} us over {len(real)} batches): the machine was too busy to "
                                  "tell; run it again on a quieter machine"), "clock_audit": dict(m.clock_audit)}
            m.state = "failed_timing"
        elif outcome == "forged":
            m.timing_rejections.append({"guard": "judge_clock", "message": (
                f"its samples claim a median of {claimed * 1e3:.1f} us per call, but the judge's own clock saw "
                f"{seen * 1e3:.1f} us per call ({len(real)} batches of {k} audited calls against as many empty "
                "ones): the numbers were changed on their way out of the kernel's process")})

    def _check_kernel_sets(self, m: Member) -> None:
        """Every traced call must launch the kernels the discovery call launched. A call that
        launched nothing returned an answer made elsewhere (kept from an earlier call, or work
        left to another one): rejected once it is more than a dropped trace record could explain.
        Other differences are flagged: work moved between calls, or skipped when unchecked."""
        ks = m.kernel_sets
        m.timing["kernel_sets"] = {k: ks[k] for k in ("calls", "differ", "empty")}
        if not ks["differ"]:
            return
        ex = ks["example"] or {}

        def shown(d: dict) -> str:
            return ", ".join(f"{name[:60]} x{n}" for name, n in sorted(d.items())[:4]) + (" ..." if len(d) > 4 else "") \
                if d else "nothing"
        detail = (f"call {ex.get('call')} launched {shown(ex.get('launched') or {})}; the discovery call launched "
                  f"{shown(ex.get('expected') or {})}")
        if ks["empty"] >= max(2, 0.05 * ks["calls"]):
            m.timing_rejections.append({"guard": "kernel_set", "message": (
                f"{ks['empty']} of {ks['calls']} traced calls launched no GPU work while the discovery call did "
                f"({detail}): their answers were not computed by the call")})
        else:
            m.flags.append({"guard": "kernel_set", "message": (
                f"{ks['differ']} of {ks['calls']} traced calls launched other kernels than the discovery call "
                f"({detail}): work moved between calls, or skipped in some")})

    def _release(self, m: Member, kept: list[dict]) -> None:
        if kept:
            try:
                m.worker.request("release", self.s.correctness_timeout_s, handles=[k["handle"] for k in kept])
            except (KernelRaised, WorkerError):
                pass

    def _judge_kept(self, m: Member, kept: list[dict]) -> None:
        judge = self.reference
        if not kept or judge is None:
            return
        handles = [k["handle"] for k in kept]
        try:
            for k in kept:
                shared = m.worker.request("export", self.s.correctness_timeout_s, handle=k["handle"])
                res = judge.worker.request("judge", self.s.correctness_timeout_s, index=k["index"], perturb=k["perturb"],
                                           outputs=shared["outputs"], inputs=shared["inputs"], rtol=self.s.rtol,
                                           atol=self.s.atol,
                                           inplace=bool(getattr(m.spec, "inplace", False)))
                m.checked_calls += 1
                problem = (None if res.get("passed") else res.get("reason", "mismatch")) or res.get("inputs_check")
                if problem:
                    seed = (judge.load.get("set_meta") or [{}] * (k["index"] + 1))[k["index"]].get("seed")
                    self._fail(m, f"timed call {m.checked_calls} (input set of seed {seed}, perturbed): outputs differ "
                                  f"from the reference: {problem}" if not res.get("passed") else
                               f"timed call {m.checked_calls}: {problem}")
                    break
            m.worker.request("release", self.s.correctness_timeout_s, handles=handles)
        except (KernelRaised, WorkerError) as exc:
            if not self.cancel.cancelled:
                self._fail(m, f"harness failed while judging timed outputs: {exc}", exc)

    def _finish_timing(self, m: Member, plan: dict) -> None:
        import statistics
        samples = [x for r in m.rounds for x in r]
        events = [x for r in m.events_rounds for x in r]
        timer = plan["timer"]
        backend = {"wall": "harness-cpu-perf_counter", "trace": "harness-cuda-trace", "events": "harness-cuda-events",
                   "graph": "harness-cuda-events+graph"}[timer]
        if (m.load.get("versions") or {}).get("hip"):
            backend = backend.replace("cuda", "hip")
        w = plan["warm"]
        m.timing = {"backend": backend, "timer": timer, "rounds": len(m.rounds), "per_round": plan["per_round"],
                    "repeats": len(samples), "warmup": w["warmup"], "estimate_ms": w["estimate_ms"],
                    "l2_flush": bool(w.get("l2_flush_bytes")), "l2_flush_bytes": w.get("l2_flush_bytes", 0),
                    "inputs": f"a fresh copy of one of {len(self.s.seeds)} input sets per call, sparsely perturbed, "
                              "at an address no earlier call's inputs had",
                    "checked_timed_calls": m.checked_calls, "interleaved": True,
                    "method_note": {
                        "trace": "device trace (CUPTI/roctracer via torch.profiler): from the first to the last kernel "
                                 "the call put on any stream; L2 flushed and the device synchronised between calls",
                        "events": "device events on the launching stream around each call (includes launch latency)",
                        "graph": "device events around a CUDA-graph replay of the call",
                        "wall": "time.perf_counter around each call (bound before the kernel's module was imported)",
                    }[timer]}
        m.timing["round_medians_ms"] = [statistics.median(r) for r in m.rounds if r]
        if m.pinned_cpu is not None:
            m.timing["pinned_cpu"] = m.pinned_cpu
        if m.clock_audit:
            m.timing["clock_audit"] = dict(m.clock_audit)
        if events:
            m.timing["events_median_ms"] = statistics.median(events)
        self._check_kernel_sets(m)
        if m.addresses_reused:
            m.flags.append({"guard": "addresses", "message": (
                f"{m.addresses_reused} call(s) got inputs at an address an earlier call had (the allocator kept "
                "handing back used ones): a cache keyed by pointer could have hit there")})
        if samples and timer == "trace" and m.other_stream_calls:
            m.flags.append({"guard": "escaped_stream", "message":
                            f"work ran outside the timed stream: {m.other_stream_calls} timed call(s) put kernels on "
                            "another stream than the call's; the device trace times them for what they cost"})
        if samples and timer != "wall" and m.timing["l2_flush"]:
            floor = self._floor(m)
            if floor is not None:
                m.timing["hardware_floor_ms"], why = floor
                med = statistics.median(samples)
                if med < floor[0]:
                    m.timing_rejections.append({"guard": "hardware_floor", "message": (
                        f"median {med * 1e3:.2f} us is faster than the hardware allows: {why}")})
            elif self.floor_note:
                m.timing["hardware_floor_note"] = self.floor_note
        m.timing["sm_clock"] = self._clocks.summary(m.key)
        m.flags.extend(self._clocks.flags(m.key))

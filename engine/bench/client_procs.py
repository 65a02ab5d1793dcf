"""Several client processes sharing one load, on one clock, merged into one result (`--client-procs N`).

One process can only stamp so many reads a second; past that its own queue shows up as latency.
A `ClientPool` spreads the load over N processes (`python -m engine.bench.client_procs SPEC`):

* the parent splits the concurrency into N shares (C=5, N=2: 3 and 2) and hands out the requests
  in release order, each to the process whose share is least used so far, so each process gets a
  part of the requests in proportion to its concurrency; with a request rate (or a trace's timestamps)
  the release schedule is computed once, for the whole list, and each process gets the times of its
  own requests, so the union of the releases is the schedule one client would follow. A
  duration-bounded run gives each process its share of the concurrency (closed loop) or of the rate.
* each process builds its request bodies, opens its connections and sends its share of the warm-up,
  then says it is ready; when all are, the parent runs `before_measure` (the profiler), picks one
  start instant a little ahead, and sends it to every process. `time.perf_counter()` is
  CLOCK_MONOTONIC on Linux (system-wide), so every stamp of every process is on one clock.
* the results come back as files (pickled `LoadResult`s, same Python), and are merged in the
  original request order into one `LoadResult`: one metrics computation, one report, as if one
  client ran. The duration is the latest end of any process.

The concurrency cap is per share: with a request rate that outruns it, a process whose share is
full queues its next request even when another process has a free slot (a cross-process semaphore
would cost a round trip per request).

Each child runs in its own process group (a Ctrl-C at the terminal reaches only the parent, which
cancels them through their stdin); a child whose stdin closes (the parent died) cancels itself.
A child that exits before its result is written fails the run: the others are cancelled and
`ClientProcessError` names the process, its exit code and the end of its log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from engine.bench.dataset import SampleRequest
from engine.bench.loadgen import LoadGenConfig, LoadGenerator, LoadResult, freeze_heap, release_offsets
from engine.eventloop import run_coroutine
from engine.bench.metrics import RequestOutput

# The start is set this far ahead of "all ready", so that it reaches every process before it is due.
_START_LEAD_S = 0.05
_PROGRESS_INTERVAL_S = 1.0
_STOP_GRACE_S = 10.0
_LOG_TAIL = 2000


class ClientProcessError(RuntimeError):
    """A client process of a pool failed (exited early, or sent what the parent cannot read)."""


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` in `parts` whole shares differing by at most one, the larger first (5, 2 -> [3, 2])."""
    base, extra = divmod(total, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def assign_requests(n: int, shares: Sequence[int]) -> list[list[int]]:
    """Request indices 0..n-1, in order, each to the process with the lowest (given + 1) / share:
    every process gets a part of the requests in proportion to its share, spread through the list."""
    given = [0] * len(shares)
    out: list[list[int]] = [[] for _ in shares]
    for i in range(n):
        k = min(range(len(shares)), key=lambda j: ((given[j] + 1) / shares[j], j))
        out[k].append(i)
        given[k] += 1
    return out


@dataclasses.dataclass
class ChildSpec:
    """What one client process runs (pickled into its spec file)."""
    index: int
    config: LoadGenConfig
    requests: list[SampleRequest]
    offsets: list[float] | None  # None: a duration-bounded run (the child releases on its own)
    warmup_id_start: int
    result_path: str


class ClientPool:
    """N client processes running one load; used in place of a `LoadGenerator`.

    It has what the benchmark run reads of one: `config`, `before_measure`, `cancel()`, the
    progress counters (`phase`, `phase_total`, `finished()`, `measure_start`, `measured`; the
    children report theirs once a second) and `run()`, which returns the merged `LoadResult`.
    """

    def __init__(self, config: LoadGenConfig, requests: Sequence[SampleRequest], procs: int, *,
                 log_dir: Path | str, timeout_s: float | None = None) -> None:
        if procs < 1:
            raise ValueError(f"client processes must be >= 1, got {procs}")
        if not requests:
            raise ValueError("no requests to send")
        if not config.max_concurrency or config.max_concurrency < procs:
            raise ValueError(f"{procs} client processes need a max concurrency of at least {procs} (one request "
                             f"at a time each), got {config.max_concurrency}")
        self.config = config
        self.requests = list(requests)
        self.procs = procs
        self.log_dir = Path(log_dir)
        self.timeout_s = timeout_s
        self.before_measure: Callable[[], Any] | None = None
        self.phase = "warmup" if config.num_warmups > 0 else "measure"
        self.phase_total = config.num_warmups if config.num_warmups > 0 else (
            0 if config.duration_s is not None else len(self.requests))
        self.measure_start: float | None = None
        self.measured: list[RequestOutput] = []
        self.pids: list[int] = []
        self._warm_done = [0] * procs
        self._cancelled = threading.Event()
        self._children: list[subprocess.Popen] = []
        self._stdin_lock = threading.Lock()
        self._events: queue.Queue[tuple[int, dict]] = queue.Queue()
        self._assigned: list[list[int]] = []

    # ---- what the benchmark run reads ---------------------------------------------------------

    def finished(self, phase: str) -> int:
        return sum(self._warm_done) if phase == "warmup" else len(self.measured)

    def cancel(self) -> None:
        self._cancelled.set()
        self._tell_all("cancel")

    # ---- the run ------------------------------------------------------------------------------

    def run(self) -> LoadResult:
        work = Path(tempfile.mkdtemp(prefix="magpie-clients-"))
        try:
            specs = self._specs(work)
            for spec in specs:
                self._start_child(spec, work)
            ready = self._wait_for_all("ready")
            if not ready or self._cancelled.is_set():
                self._tell_all("cancel")
                self._wait_for_all("done", failures_ok=True)
                return LoadResult(outputs=[], cancelled=True)
            if self.before_measure is not None:
                self.before_measure()
            t0 = time.perf_counter() + _START_LEAD_S
            self.measure_start = t0
            self.phase, self.phase_total = "measure", 0 if self.config.duration_s is not None else len(self.requests)
            self._tell_all(f"go {t0!r}")
            self._wait_for_all("done")
            self.phase = "done"
            return self._merge([self._read_result(s) for s in specs])
        finally:
            self._stop_children()
            shutil.rmtree(work, ignore_errors=True)

    def _specs(self, work: Path) -> list[ChildSpec]:
        cfg = self.config
        assert cfg.max_concurrency
        shares = split_evenly(cfg.max_concurrency, self.procs)
        warmups = split_evenly(cfg.num_warmups, self.procs)
        # Ids as one client would send them, whichever process sends them.
        requests = [r if r.request_id else dataclasses.replace(r, request_id=str(i)) for i, r in enumerate(self.requests)]
        specs = []
        if cfg.duration_s is not None:
            # Each process cycles the whole list at its share; its ids carry its number (c1-d5).
            for k in range(self.procs):
                rate = cfg.request_rate if math.isinf(cfg.request_rate) else cfg.request_rate * shares[k] / sum(shares)
                child_cfg = dataclasses.replace(cfg, max_concurrency=shares[k], num_warmups=warmups[k],
                                                request_rate=rate, seed=cfg.seed + k,
                                                request_id_prefix=f"{cfg.request_id_prefix}c{k}-")
                specs.append(ChildSpec(k, child_cfg, requests, None, sum(warmups[:k]), str(work / f"result{k}.pkl")))
            self._assigned = []
            return specs
        offsets = release_offsets(cfg, requests)
        self._assigned = assign_requests(len(requests), shares)
        for k, idx in enumerate(self._assigned):
            child_cfg = dataclasses.replace(cfg, max_concurrency=shares[k], num_warmups=warmups[k])
            specs.append(ChildSpec(k, child_cfg, [requests[i] for i in idx], [offsets[i] for i in idx],
                                   sum(warmups[:k]), str(work / f"result{k}.pkl")))
        return specs

    def _start_child(self, spec: ChildSpec, work: Path) -> None:
        spec_path = work / f"spec{spec.index}.pkl"
        spec_path.write_bytes(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"client_proc{spec.index}.log").open("wb")
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding `engine`
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            child = subprocess.Popen([sys.executable, "-m", "engine.bench.client_procs", str(spec_path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                     start_new_session=True)  # its own group: a terminal's Ctrl-C reaches only us
        finally:
            log.close()
        self._children.append(child)
        self.pids.append(child.pid)
        threading.Thread(target=self._read_child, args=(spec.index, child.stdout), daemon=True,
                         name=f"client-proc{spec.index}").start()

    def _read_child(self, k: int, stream: IO[bytes]) -> None:
        """The child's stdout, one JSON message a line, onto the event queue; then "eof"."""
        try:
            for line in stream:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "progress" in msg:
                    self._take_progress(k, msg["progress"])
                else:
                    self._events.put((k, msg))
        finally:
            self._events.put((k, {"eof": True}))

    def _take_progress(self, k: int, p: dict) -> None:
        self._warm_done[k] = p.get("warmup", self._warm_done[k])
        # Enough of each finished request for the live counters (ProgressTimer); the full ones come at the end.
        self.measured.extend(RequestOutput(success=bool(ok), output_tokens=int(tokens), ttft=ttft, latency=latency)
                             for ok, tokens, ttft, latency in p.get("finished", ()))

    def _wait_for_all(self, what: str, failures_ok: bool = False) -> bool:
        """Until every child has said `what` ("ready" or "done"). A child that ends first fails the
        run (ClientProcessError, the others cancelled), unless `failures_ok`. Returns False when
        waiting for "ready" was cut short by a cancel."""
        pending = set(range(len(self._children)))
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s + 30
        while pending:
            if what == "ready" and self._cancelled.is_set():
                return False
            if deadline is not None and time.monotonic() > deadline:
                self.cancel()
                raise ClientProcessError(f"client processes {sorted(pending)} did not get {what} within "
                                         f"{self.timeout_s:g} s")
            try:
                k, msg = self._events.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg.get(what):
                pending.discard(k)
            elif msg.get("eof") and k in pending:
                if failures_ok:
                    pending.discard(k)
                    continue
                self.cancel()
                raise ClientProcessError(self._exit_text(k, what))
        return True

    def _exit_text(self, k: int, what: str) -> str:
        child = self._children[k]
        try:
            code = child.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        log = self.log_dir / f"client_proc{k}.log"
        try:
            tail = log.read_text(errors="replace")[-_LOG_TAIL:].strip()
        except OSError:
            tail = ""
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return (f"client process {k + 1} of {self.procs} (pid {child.pid}) {how} before it was {what}; log: {log}"
                + (f"\n{tail}" if tail else ""))

    def _tell_all(self, line: str) -> None:
        with self._stdin_lock:
            for child in self._children:
                if child.stdin is None or child.poll() is not None:
                    continue
                try:
                    child.stdin.write(line.encode() + b"\n")
                    child.stdin.flush()
                except (BrokenPipeError, OSError, ValueError):
                    pass  # it has ended: its eof says so

    def _read_result(self, spec: ChildSpec) -> LoadResult:
        try:
            return pickle.loads(Path(spec.result_path).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError) as exc:
            raise ClientProcessError(f"client process {spec.index + 1} of {self.procs} said it was done but its "
                                     f"result cannot be read: {exc}") from None

    def _merge(self, results: list[LoadResult]) -> LoadResult:
        """One result, as one client would have returned it: outputs in release order."""
        warm = [o for r in results for o in r.warmup_outputs]
        cancelled = any(r.cancelled for r in results)
        # Every second token ACKed where every process did; else what the others saw.
        seen = {r.halved_acks for r in results}
        halved = True if seen == {True} else False if False in seen else None
        if self.config.duration_s is not None:
            outputs = sorted((o for r in results for o in r.outputs), key=lambda o: o.start_time)
            first = results[0]
            return LoadResult(outputs=outputs, warmup_outputs=warm, duration_s=first.duration_s, cancelled=cancelled,
                              window=first.window, excluded=sum(r.excluded for r in results), halved_acks=halved)
        by_index: list[tuple[int, RequestOutput]] = []
        for idx, r in zip(self._assigned, results):
            by_index.extend(zip(idx, r.outputs))  # a cancelled child returns only what it released
        by_index.sort(key=lambda t: t[0])
        return LoadResult(outputs=[o for _, o in by_index], warmup_outputs=warm,
                          duration_s=max(r.duration_s for r in results), cancelled=cancelled, halved_acks=halved)

    def _stop_children(self) -> None:
        """Every child ends: asked through stdin (closed), then its group terminated, then killed."""
        with self._stdin_lock:
            for child in self._children:
                try:
                    if child.stdin is not None:
                        child.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + _STOP_GRACE_S
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for child in self._children:
                try:
                    child.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(child.pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 5
        for child in self._children:
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                pass
            if child.stdout is not None:
                child.stdout.close()


# ---- the child process ----------------------------------------------------------------------


def _child_main(spec_path: str) -> int:
    # The protocol gets its own copy of stdout; anything a library prints goes to the log (stderr).
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    send_lock = threading.Lock()

    def send(msg: dict) -> None:
        with send_lock:
            proto.write(json.dumps(msg) + "\n")

    spec: ChildSpec = pickle.loads(Path(spec_path).read_bytes())
    lg = LoadGenerator(spec.config, spec.requests)
    lg.offsets = spec.offsets
    lg.warmup_id_start = spec.warmup_id_start
    start = _StartSignal(lg, send)
    lg.wait_for_start = start.wait
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it cancels us through stdin
    threading.Thread(target=start.read_stdin, daemon=True, name="pool-stdin").start()
    stop_progress = threading.Event()
    progress = threading.Thread(target=_report_progress, args=(lg, send, stop_progress), daemon=True,
                                name="pool-progress")
    progress.start()
    freeze_heap()
    result = run_coroutine(lg.run(), spec.config.event_loop, reads_streams=spec.config.http_client == "lean")
    stop_progress.set()
    progress.join()  # its last counts go out before "done"
    tmp = Path(spec.result_path + ".tmp")
    tmp.write_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(spec.result_path)
    send({"done": True})
    return 0


class _StartSignal:
    """The child's side of the start: "ready" out, then "go T" (or "cancel", or the end of stdin) in."""

    def __init__(self, lg: LoadGenerator, send: Callable[[dict], None]) -> None:
        self.lg, self.send = lg, send
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[float | None] | None = None
        self._early: list[float | None] = []  # a line that came before the loop asked
        self._lock = threading.Lock()

    async def wait(self) -> float | None:
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._future = self._loop.create_future()
            if self._early:
                self._future.set_result(self._early[0])
        self.send({"ready": True})
        return await self._future

    def _resolve(self, value: float | None) -> None:
        with self._lock:
            if self._future is None:
                self._early.append(value)
                return
            loop, fut = self._loop, self._future
        assert loop is not None

        def settle() -> None:
            if not fut.done():
                fut.set_result(value)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass  # the loop has closed: the run is over

    def read_stdin(self) -> None:
        # Unbuffered reads of fd 0: a daemon thread blocked in sys.stdin would hold its lock at exit.
        pending = b""
        while True:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                if line.startswith("go "):
                    self._resolve(float(line[3:]))
                elif line == "cancel":
                    self.lg.cancel()
                    self._resolve(None)
        # stdin closed: the parent is gone or done with us
        self.lg.cancel()
        self._resolve(None)


def _report_progress(lg: LoadGenerator, send: Callable[[dict], None], stop: threading.Event) -> None:
    seen = 0
    while True:
        stopped = stop.wait(_PROGRESS_INTERVAL_S)
        outs = lg.measured
        n = len(outs)
        finished = [[o.success, o.effective_output_tokens, o.ttft, o.latency] for o in outs[seen:n]]
        seen = n
        try:
            send({"progress": {"warmup": lg.finished("warmup"), "finished": finished}})
        except (OSError, ValueError):
            return
        if stopped:
            return


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m engine.bench.client_procs SPEC_FILE (started by engine.bench.client_procs)")
    sys.exit(_child_main(sys.argv[1]))

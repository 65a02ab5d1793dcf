"""SLO capacity by ramp and hold in one run (``client.capacity_mode: ramp``, ``--capacity-mode ramp``).

One load generator, one HTTP client and one set of connections for the whole run: the level
(concurrency, or request rate under the CONC cap) changes window by window while the load keeps
going. The levels are the capacity search's (``engine.bench.capacity``, ``client.capacity_search``:
margin or bisect, at most ``capacity_steps``; a level the margin search runs again takes another
window), and each is judged by the same SLOs and goodput target, over a window: the requests released in its first
``ramp_window`` seconds (longer until ``ramp_min_requests`` were released). When a window closes
the load stays at its level until the window's requests have ended, then the verdict picks the
next level; requests released during that drain belong to no window. A level below the one
before starts its window once the load has come down to it (at most the new concurrency in
flight; for a rate, no request waiting for a slot), so the excess of a failing level does not
count against the next.

Then it holds at the highest passing level (the knee) for ``ramp_hold`` seconds in back-to-back
windows, one per ``ramp_window`` seconds and at least 3 (the hold split evenly among them): the
hold's requests together are the run's headline result,
and the mean and 95% t-interval across its windows (goodput share, throughput, latency) say how
steady the knee is.

Against a run per level (``capacity_mode: search``) the server stays warm and in steady state
between levels, one warm-up serves the whole run, and the levels take a window each rather than a
run each; a window is shorter than a run of its own, so a verdict near the knee is noisier, which
the hold's interval measures.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from engine.bench.capacity import DEFAULT_CEILING, CapacitySearch, Level
from engine.bench.dataset import SampleRequest
from engine.bench.http_client import StreamingHTTPClient
from engine.bench.loadgen import LoadGenConfig, LoadGenerator, LoadResult
from engine.bench.metrics import RequestOutput, aggregate_repeats, format_interval

if TYPE_CHECKING:
    from engine.bench.run import BenchRun, LoadTarget

NEVER_SENT = "cancelled before sending"  # as the load generator names a request a cancel kept queued
_SETTLE_POLL_S = 0.01


class _Gate:
    """A concurrency limit that may change while requests wait for a slot (FIFO)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    async def acquire(self) -> None:
        if self.used < self.limit and not self.waiting:
            self.used += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # _wake counted the slot for us
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # woken and cancelled at once: the slot goes back
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        self.used -= 1
        self._wake()

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.used += 1
                fut.set_result(None)


@dataclass
class Window:
    """One judged stretch of the ramp (``kind`` ramp) or of the hold."""
    index: int
    kind: str
    level: float
    start: float  # perf_counter
    end: Optional[float] = None
    released: int = 0
    outputs: list[RequestOutput] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def check_done(self) -> None:
        if self.end is not None and len(self.outputs) >= self.released:
            self.done.set()


class RampGenerator(LoadGenerator):
    """A load generator whose level the capacity search moves window by window, then holds.

    ``config.max_concurrency`` is the cap of a request-rate ramp (None for a concurrency ramp);
    ``config.num_warmups`` warm-up requests go first, then ``before_measure``, then the ramp;
    ``before_hold(level)`` is called (in a thread) once the load is at the knee, before the hold's
    first window (the profiler: its trace holds the knee's load, and its cost moves no verdict).
    ``on_window(window, result, passed)`` is called on the event loop as each window is judged.
    ``run()`` returns every request released after the warm-up."""

    def __init__(self, config: LoadGenConfig, requests: Sequence[SampleRequest], search: CapacitySearch, *,
                 slos: dict[str, float], window_s: float, min_requests: int, hold_s: float) -> None:
        super().__init__(config, requests)
        self.search, self.slos = search, dict(slos)
        self.window_s, self.min_requests, self.hold_s = window_s, min_requests, hold_s
        self.over = search.over
        self.windows: list[Window] = []
        self.results: dict[int, dict[str, Any]] = {}  # window index -> its result
        self.on_window: Optional[Callable[[Window, dict, bool], None]] = None
        self.before_hold: Optional[Callable[[float], Any]] = None
        self.level = 0.0
        self.knee: Optional[float] = None
        # A concurrency ramp sets the limit at each level; a rate ramp keeps the CONC cap.
        self._gate = _Gate(1 if self.over == "concurrency" else (config.max_concurrency or 1 << 30))
        self._current: Optional[Window] = None
        self._stop = False
        # A window that cannot gather its minimum of requests ends this long after it should have.
        self._overrun_s = max(window_s, config.request_timeout_s or 60.0)

    async def _run(self) -> LoadResult:
        cfg = self.config
        with self._lock:
            self._loop = asyncio.get_running_loop()
            if self._cancelled:
                return LoadResult(outputs=[], cancelled=True)
        async with self._client() as client:
            warm = await self._warm_up(client, asyncio.Semaphore(cfg.max_concurrency or cfg.num_warmups))
            if self._cancelled:
                return LoadResult(outputs=[], warmup_outputs=warm, cancelled=True)
            if self.before_measure is not None:
                await asyncio.to_thread(self.before_measure)
            self.phase, self.phase_total = "measure", 0
            t0 = self.measure_start = time.perf_counter()
            tasks: list[asyncio.Task[RequestOutput]] = []
            self._arrivals = asyncio.create_task(self._control(client, tasks))
            error: Optional[Exception] = None
            try:
                await self._arrivals
            except asyncio.CancelledError:
                if not self._cancelled:
                    raise
            except Exception as exc:  # before_hold failed: the requests in flight end first
                error = exc
            outputs = list(await asyncio.gather(*tasks))
            duration = time.perf_counter() - t0
            self.phase = "done"
            if error is not None:
                raise error
        return LoadResult(outputs=outputs, warmup_outputs=warm, duration_s=duration, cancelled=self._cancelled)

    # ---- the controller -------------------------------------------------------------------------

    async def _control(self, client: Any, tasks: list[asyncio.Task[RequestOutput]]) -> None:
        feeder: Optional[asyncio.Task[None]] = None
        try:
            level = self.search.next_level()
            while level is not None and not self._cancelled:
                await self._apply(level)
                if feeder is None:
                    feeder = asyncio.create_task(self._feed(client, tasks))
                window = await self._window("ramp", level)
                await window.done.wait()  # the load stays at this level meanwhile
                self._judge(window)
                level = self.search.next_level()
            self.knee = self.search.knee()
            if self.knee is not None and self.hold_s > 0 and not self._cancelled:
                await self._apply(self.knee)
                if self.before_hold is not None:
                    await asyncio.to_thread(self.before_hold, self.knee)
                n = hold_windows(self.hold_s, self.window_s)
                held = []
                for _ in range(n):  # back to back
                    held.append(await self._window("hold", self.knee, self.hold_s / n))
                for window in held:
                    await window.done.wait()
                    self._judge(window)
        finally:
            self._stop = True
            if feeder is not None:
                feeder.cancel()
                try:
                    await feeder
                except asyncio.CancelledError:
                    pass

    async def _apply(self, level: float) -> None:
        """Move the load to ``level``; a lower one returns once the load has come down to it."""
        lower = level < self.level
        self.level = level
        if self.over == "concurrency":
            self._gate.set_limit(int(level))
        if not lower:
            return
        deadline = time.perf_counter() + self._overrun_s
        while not self._cancelled and time.perf_counter() < deadline:
            settled = self._gate.used <= level if self.over == "concurrency" else self._gate.waiting == 0
            if settled:
                return
            await asyncio.sleep(_SETTLE_POLL_S)

    async def _window(self, kind: str, level: float, length: Optional[float] = None) -> Window:
        """Open a window, close it after ``length`` seconds (default ``window_s``; longer until
        ``min_requests`` were released), return it."""
        length = self.window_s if length is None else length
        w = Window(len(self.windows), kind, level, time.perf_counter())
        self.windows.append(w)
        self._current = w
        while not self._cancelled:
            elapsed = time.perf_counter() - w.start
            if elapsed >= length and (w.released >= self.min_requests or elapsed >= length + self._overrun_s):
                break
            await asyncio.sleep(length - elapsed if elapsed < length else 0.02)
        w.end = time.perf_counter()
        self._current = None
        w.check_done()
        return w

    def _judge(self, w: Window) -> bool:
        assert w.end is not None
        result = window_result(w, self.slos, self.measure_start or w.start, self.search.target)
        self.results[w.index] = result
        if w.kind == "ramp":
            passed = self.search.record(w.level, [result]).passed
        else:
            passed = Level(w.level, [result], self.search.target).passed
        if self.on_window is not None:
            self.on_window(w, result, passed)
        return passed

    # ---- the requests ----------------------------------------------------------------------------

    async def _feed(self, client: Any, tasks: list[asyncio.Task[RequestOutput]]) -> None:
        """Release requests (the list cycled) until the controller stops: at the concurrency limit
        (a request goes when a slot frees), or gamma arrivals at the current rate."""
        cfg, loop = self.config, asyncio.get_running_loop()
        lean = isinstance(client, StreamingHTTPClient)
        bodies = [self._body(r) for r in self.requests]
        rng = np.random.RandomState(cfg.seed)
        closed = self.over == "concurrency"
        next_at, i, n = time.perf_counter(), 0, len(self.requests)
        while not self._stop and not self._cancelled:
            if closed:
                await self._gate.acquire()
                if self._stop or self._cancelled:
                    self._gate.release()
                    return
            else:
                rate, b = self.level, cfg.burstiness
                next_at = max(next_at, time.perf_counter() - 1.0)  # a stall is not made up in a burst
                next_at += 1.0 / rate if math.isinf(b) else float(rng.gamma(b, 1.0 / (rate * b)))
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._stop or self._cancelled:
                    return
            rid = f"{cfg.request_id_prefix}r{i}"
            body = bodies[i % n]
            payload = client.build_post(self._path, body, {**self._headers, "x-request-id": rid}) if lean else body
            w = self._current
            if w is not None:
                w.released += 1
            tasks.append(self._track(loop.create_task(
                self._one(client, self.requests[i % n], rid, payload, w, closed, time.perf_counter()))))
            i += 1

    async def _one(self, client: Any, req: SampleRequest, rid: str, payload: Any, w: Optional[Window],
                   held: bool, arrival: float) -> RequestOutput:
        try:
            if not held:
                await self._gate.acquire()
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            out = RequestOutput(prompt_len=req.prompt_len, request_id=rid, error=NEVER_SENT,
                                start_time=time.perf_counter())
        else:
            try:
                out = await self._send(client, req, rid, payload)
            finally:
                self._gate.release()
        out.queue_time = out.start_time - arrival
        self._finished["measure"] += 1
        self.measured.append(out)
        if w is not None:
            w.outputs.append(out)
            w.check_done()
        return out


def hold_windows(hold_s: float, window_s: float) -> int:
    """The hold's windows: one per ``window_s``, and at least 3 (the fewest a t-interval needs)."""
    return max(3, round(hold_s / window_s))


def window_result(w: Window, slos: dict[str, float], t0: float, target: Optional[float] = None) -> dict[str, Any]:
    """A window's requests as a result dict (``to_result()``, the goodput by the SLOs), with its
    place in the run and its failures by cause."""
    from engine.bench.run import failures_by_cause
    assert w.end is not None
    duration = w.end - w.start
    outputs = sorted(w.outputs, key=lambda o: o.start_time)
    result = LoadResult(outputs=outputs, duration_s=duration).metrics(goodput_slos=slos, slo_quantile=target).to_result()
    result["window_s"] = [round(w.start - t0, 3), round(w.end - t0, 3)]
    result["errors"] = sorted({o.error for o in outputs if not o.success and o.error})[:10]
    result["failed_by_cause"] = failures_by_cause(outputs)
    return result


# ---- the run ----------------------------------------------------------------------------------------

def run_ramp(run: "BenchRun", target: "LoadTarget") -> list[dict]:
    """The ramp and the hold against ``target``: ``report.capacity`` (the levels, every window, the
    hold), and the results as the run's points: the hold first (the headline), then each level."""
    from engine.bench.metrics import detailed_lists
    from engine.bench.run import (ProgressTimer, _requests, _run, _save, _Shape, _start_profiler, _stop_profiler,
                                  _watch_cancel)
    cfg, cl = run.cfg, run.cfg.client
    over = cl.capacity_over
    search = CapacitySearch(over=over, target=cl.goodput_target, ceiling=cl.capacity_max or DEFAULT_CEILING,
                            max_steps=cl.capacity_steps, search=cl.capacity_search)
    shape = _Shape.of({}, cfg, run.envs)
    ramp_point = {"capacity_ramp": over}
    if run.hooks is not None:
        run.hooks.reset_before(0, ramp_point, "the capacity ramp")
    config = LoadGenConfig(
        base_url=target.base_url, model=target.model,
        endpoint="/v1/chat/completions" if cl.endpoint == "chat" else "/v1/completions",
        burstiness=cl.burstiness, max_concurrency=shape.conc if over == "request_rate" else None,
        num_warmups=cl.warmup, seed=cl.seed, request_timeout_s=cfg.timeout_seconds,
        http_client=cl.http_client, event_loop=cl.event_loop)
    lg = RampGenerator(config, _requests(run, target, shape, 0), search, slos=cl.find_capacity,
                       window_s=cl.ramp_window, min_requests=cl.ramp_min_requests, hold_s=cl.ramp_hold)
    run.log(f"capacity ramp over {over}: windows of {cl.ramp_window:g} s (at least {cl.ramp_min_requests} requests), "
            f"then a hold of {cl.ramp_hold:g} s at the highest passing level")

    def on_window(w: Window, result: dict, passed: bool) -> None:
        share = goodput_of(result)
        run.log(f"capacity ramp: {w.kind} {over} {w.level:g}: {len(w.outputs)} requests, goodput {share:.1%} -> "
                f"{'pass' if passed else 'fail'}")
        # A ramp window is a level tried (as the search's); a hold window is the knee measured again.
        run.ws.events.emit("capacity_level" if w.kind == "ramp" else "capacity_hold", level=w.level, over=over,
                           passed=passed, window=w.index, kind=w.kind, goodput_share=share, requests=len(w.outputs))

    lg.on_window = on_window
    profiling = [False]
    if cfg.profiler.torch_profiler.enabled and run.hooks is not None:  # the hold only: the knee's load
        lg.before_hold = lambda level: _start_profiler(run, f"at the start of the hold ({over} {level:g})", profiling)
    cancel_watch = _watch_cancel(run.cancel, lg, run)
    progress = ProgressTimer(lg, lambda **f: run.ws.events.emit("progress", **f),
                             {"repeat": 0, "repeats": 1, "point": ramp_point, "point_index": 0},
                             scraper=run.scraper).start()
    try:
        result_obj = _run(lg)
    finally:
        progress.stop()
        cancel_watch()
        if profiling[0]:
            _stop_profiler(run, "the end of the hold")
    point = {**shape.to_dict(), "lengths": shape.lengths(cfg)}
    section, results = ramp_sections(lg, search, cl.find_capacity, point, run.server_gone)
    run.report["capacity"] = section
    _save(run, "requests/ramp.json", detailed_lists(result_obj.outputs))
    return results


def goodput_of(result: dict) -> float:
    from engine.bench.capacity import goodput_share
    return goodput_share(result)


def ramp_sections(lg: RampGenerator, search: CapacitySearch, slos: dict[str, float], point: dict,
                  server_gone: Optional[str] = None) -> tuple[dict, list[dict]]:
    """``report.capacity`` of a ramp (the search's summary, every window, the hold) and the results
    as points: the hold's (or, without one, the knee's window) first, then each level's window."""
    section = search.summary(slos)
    section.update(mode="ramp", window_s=lg.window_s, min_requests=lg.min_requests, hold_s=lg.hold_s)
    windows = []
    for w in lg.windows:
        r = lg.results.get(w.index)
        if r is None:  # cut short by a cancel or the server's exit: never judged
            continue
        windows.append({"index": w.index, "kind": w.kind, "level": w.level, "window_s": r["window_s"],
                        "requests": len(w.outputs), "completed": r.get("completed"), "failed": r.get("failed"),
                        "goodput_share": goodput_of(r), "passed": goodput_of(r) >= search.target,
                        "request_throughput": r.get("request_throughput"),
                        "output_throughput": r.get("output_throughput"),
                        "p99_ms": {m: r.get(f"p99_{m}_ms") for m in ("ttft", "tpot", "e2el")}})
    section["windows"] = windows
    hold = [lg.results[w.index] for w in lg.windows if w.kind == "hold" and w.index in lg.results]
    levels = [{"point": {**point, search.over: _level_value(search.over, w.level), "window": w.index},
               "runs": [lg.results[w.index]], "repeats": None, "level": w.level}
              for w in lg.windows if w.kind == "ramp" and w.index in lg.results]
    if hold:
        headline = _combined(lg, [w for w in lg.windows if w.kind == "hold" and w.index in lg.results], slos)
        agg = aggregate_repeats(hold)
        section["hold"] = {
            "level": lg.knee, "windows": len(hold), "seconds": round(sum(r["duration"] for r in hold), 3),
            "passed_windows": sum(goodput_of(r) >= search.target for r in hold),
            "summary": Level(lg.knee or 0.0, hold, search.target).to_dict(search.over),
            "interval": {k: agg[k] for k in ("request_throughput", "output_throughput", "median_ttft_ms",
                                             "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms",
                                             "p99_e2el_ms") if k in agg},
            "result": {k: headline.get(k) for k in ("completed", "failed", "duration", "request_throughput",
                                                   "output_throughput", "request_goodput")}}
        first = [{"point": {**point, search.over: _level_value(search.over, lg.knee or 0.0), "hold": True},
                  "runs": [headline], "repeats": None, "level": lg.knee}]
    else:
        section["hold"] = None
        knee = section["knee"]
        levels.sort(key=lambda r: r["level"] != knee)
        first = []
    if server_gone:
        section["cut_short"] = server_gone
    return section, first + levels


def _combined(lg: RampGenerator, windows: list[Window], slos: dict[str, float]) -> dict[str, Any]:
    """The hold's windows as one result (every request, the windows' time together)."""
    from engine.bench.run import failures_by_cause
    outputs = sorted((o for w in windows for o in w.outputs), key=lambda o: o.start_time)
    duration = sum((w.end or w.start) - w.start for w in windows)
    result = LoadResult(outputs=outputs, duration_s=duration).metrics(goodput_slos=slos).to_result()
    result["errors"] = sorted({o.error for o in outputs if not o.success and o.error})[:10]
    result["failed_by_cause"] = failures_by_cause(outputs)
    return result


def _level_value(over: str, level: float) -> float | int:
    return int(level) if over == "concurrency" else level


def ramp_lines(section: dict) -> list[str]:
    """The ramp as the terminal shows it: each window in time order with a bar as long as its
    level, its goodput and verdict, then the hold's mean and interval."""
    windows = section.get("windows") or []
    if not windows:
        return []
    over = section["over"]
    top = max(w["level"] for w in windows) or 1.0
    width = 24
    rows = [f"ramp over {over} in one run (windows of {section['window_s']:g} s), then the hold:",
            f"{'t (s)':>8} {'':5} {over:>12}  {'':{width}} {'goodput':>8} {'req/s':>8} {'TTFT p99':>9}  result"]
    for w in windows:
        bar = "#" * max(1, round(width * w["level"] / top))
        ttft = w["p99_ms"].get("ttft")
        rows.append(f"{w['window_s'][0]:>8.1f} {w['kind']:5} {w['level']:>12g}  {bar:<{width}} "
                    f"{w['goodput_share']:>8.1%} {w['request_throughput'] or 0:>8.2f} "
                    f"{(f'{ttft:9.1f}' if isinstance(ttft, (int, float)) and not math.isnan(ttft) else '-'):>9}  "
                    f"{'pass' if w['passed'] else 'FAIL'}")
    hold = section.get("hold")
    if hold:
        share = hold["summary"]
        ci = share.get("goodput_share_ci95")
        rows.append(f"hold at {over} {hold['level']:g}: {hold['windows']} windows, {hold['seconds']:g} s, "
                    f"{hold['passed_windows']} passed; goodput {share['goodput_share']:.1%}"
                    + (f" (95% CI [{max(0.0, ci[0]):.1%}, {min(1.0, ci[1]):.1%}])" if ci else ""))
        for key, label, fmt in (("output_throughput", "output tok/s", ".1f"), ("request_throughput", "req/s", ".2f"),
                                ("p99_ttft_ms", "TTFT p99 ms", ".1f")):
            stat = hold["interval"].get(key)
            if stat:
                rows.append(f"  {label} over the hold's windows: {stat['mean']:{fmt}} (95% CI "
                            f"{format_interval(stat, fmt)})")
    elif section.get("knee") is not None:
        rows.append("no hold (ramp_hold 0)")
    return rows

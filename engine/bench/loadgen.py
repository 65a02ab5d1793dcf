"""Asyncio load generator for OpenAI-compatible streaming servers, timed as `vllm bench serve` times.

Per request (serving-reference §1.1): `start_time` is taken just before the POST, after the
concurrency semaphore; the wait for the semaphore is `queue_time`. Every SSE message with a
non-empty `choices` array is stamped: the first gives TTFT, each later one appends one ITL gap,
and the last one ends E2EL. The trailing usage chunk (`choices: []`) sets the output and prompt
token counts but does not move the end time; `[DONE]` and `:` comments are ignored.

Where we deliberately differ from vLLM's client, because its behaviour hides failures:

* an in-stream error event (`data: {"error": ...}` after a 200) fails the request (vLLM skips it);
* a stream that ends without `data: [DONE]` fails the request (it was cut short);
* without a usage chunk vLLM re-tokenises the text; we count tokens without a tokenizer: the
  server's running `usage.completion_tokens` when it sends usage on content chunks (vLLM's
  `continuous_usage_stats`), otherwise one token per chunk with non-empty text. The latter
  undercounts when a server packs several tokens into one chunk, so ask for usage.

Cheap per chunk: the default HTTP client (`engine.bench.http_client`, "lean") parses each read
where it arrives, in the connection's `data_received`, and stamps it there with one
`perf_counter()` (every message completed by that read gets it), so a chunk costs no task wake-up
and its stamp does not wait behind the other streams that became readable at the same moment.
SSE is split at the byte level with no text decoding, and a typed msgspec decoder skips the
fields we do not read. `http_client="aiohttp"` reads through aiohttp instead, as vLLM's client
does; both feed the same `_CompletionStream`, so the two differ only in when a read is stamped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

import aiohttp
import msgspec
import numpy as np

from engine.bench.dataset import SampleRequest
from engine.bench.http_client import StreamingHTTPClient
from engine.bench.metrics import BenchmarkMetrics, RequestOutput, compute_metrics
from engine.eventloop import run_coroutine

# (phase, finished so far, total in phase, the finished request); phase is "warmup" or "measure".
ProgressCallback = Callable[[str, int, int, RequestOutput], None]

_ERROR_TEXT_LIMIT = 500
HTTP_CLIENTS = ("lean", "aiohttp")


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct, gc=False):
    text: str | None = None
    delta: _Delta | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None  # only present on error events, so decoding it generically costs nothing


_DECODE = msgspec.json.Decoder(_Chunk).decode
_DECODE_MANY = msgspec.json.Decoder(list[_Chunk]).decode
_ENCODE = msgspec.json.Encoder().encode


@dataclass
class LoadGenConfig:
    """What to send and how. `endpoint` picks the API: a path ending in `chat/completions` is chat."""

    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_warmups: int = 0
    ignore_eos: bool = True
    request_timeout_s: float | None = None
    seed: int = 0
    extra_body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    request_id_prefix: str = ""
    # "lean": engine.bench.http_client (parses and stamps each read where it arrives; the default);
    # "aiohttp": aiohttp's client session, as vLLM's client uses it.
    http_client: str = "lean"
    # A run bounded by time: requests (the list cycled) are released for duration_s seconds; only
    # those that start in [warmup_s, duration_s - cooldown_s] are measured (timestamps are ignored).
    duration_s: float | None = None
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    # Requests carrying a `timestamp` (a trace) are released at (timestamp - first) x this.
    timestamp_scale: float = 1.0
    # "auto": asyncio's loop where its turn runs in C and the client is lean, else uvloop where installed,
    # else asyncio's; "uvloop"; "asyncio" (see event_loop_name).
    event_loop: str = "auto"

    @property
    def is_chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("chat/completions")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/" + self.endpoint.lstrip("/")


@dataclass(repr=False)
class LoadResult:
    """Measured outputs in release order (when cancelled, only the requests that were released)."""

    outputs: list[RequestOutput]
    warmup_outputs: list[RequestOutput] = field(default_factory=list)
    duration_s: float = 0.0
    cancelled: bool = False
    # A duration-bounded run: the measured window (s from the start) and the requests left out of it.
    window: tuple[float, float] | None = None
    excluded: int = 0
    # The lean client ACKed every second token (True: its warm-up proved the server does not wait
    # for ACKs), or every token as the kernel does (False: tried, never proved; None: not tried);
    # see engine/bench/http_client.py.
    halved_acks: bool | None = None

    def __repr__(self) -> str:
        # Short: Python 3.11's asyncio.Runner formats the finished main task (and so its result)
        # when it restores the SIGINT handler, which took a full repr of every request's lists.
        return (f"LoadResult({len(self.outputs)} outputs, {len(self.warmup_outputs)} warm-up, "
                f"{self.duration_s:.3f} s, cancelled={self.cancelled})")

    def metrics(self, *, selected_percentiles: Sequence[float] = (50, 90, 99),
                goodput_slos: dict[str, float] | None = None, slo_quantile: float | None = None) -> BenchmarkMetrics:
        return compute_metrics(self.outputs, self.duration_s, selected_percentiles=selected_percentiles,
                               goodput_slos=goodput_slos, slo_quantile=slo_quantile)


def arrival_offsets(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Release times (s from the start) as vLLM's get_request computes them.

    Gaps are gamma(shape=burstiness, scale=1/(rate*burstiness)) (burstiness 1: Poisson), drawn
    from a legacy numpy RandomState(seed) — the same stream as vLLM's `np.random.seed(seed)` then
    one `np.random.gamma` per request. They are accumulated and rescaled so the last release is at
    exactly n/rate. Rate inf releases everything at 0; burstiness inf gives constant gaps.
    """
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if request_rate <= 0:
        raise ValueError(f"request rate must be positive, got {request_rate}")
    if n == 0 or math.isinf(request_rate):
        return [0.0] * n
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / request_rate)
    else:
        gaps = np.random.RandomState(seed).gamma(burstiness, 1.0 / (request_rate * burstiness), size=n)
    cum = np.cumsum(gaps)
    if cum[-1] != 0:
        cum *= (n / request_rate) / cum[-1]
    return [float(t) for t in cum]


def release_offsets(config: LoadGenConfig, requests: Sequence[SampleRequest]) -> list[float]:
    """Release times from the start: the requests' own timestamps (a trace replay, scaled by
    `timestamp_scale`), else vLLM's arrival process."""
    stamps = [r.timestamp for r in requests]
    if any(t is not None for t in stamps):
        base = min(t for t in stamps if t is not None)
        return [max(0.0, ((t if t is not None else base) - base) * config.timestamp_scale) for t in stamps]
    return arrival_offsets(len(requests), config.request_rate, config.burstiness, config.seed)


class LoadGenerator:
    """Runs one benchmark: warm-up (W copies of the first request, discarded), then the timed run.

    `cancel()` may be called from any thread: requests not yet released are dropped, released ones
    end as failed ("cancelled" in flight, "cancelled before sending" while queued for a slot), and
    `run()` returns them with `cancelled=True`.
    """

    def __init__(self, config: LoadGenConfig, requests: Sequence[SampleRequest], *,
                 on_progress: ProgressCallback | None = None) -> None:
        if not requests:
            raise ValueError("no requests to send")
        if config.is_chat and not isinstance(requests[0].prompt, str):
            raise ValueError("the chat endpoint needs text prompts; sample the dataset with a tokenizer")
        if config.http_client not in HTTP_CLIENTS:
            raise ValueError(f"http client {config.http_client!r}: choose one of {', '.join(HTTP_CLIENTS)}")
        if config.max_concurrency is not None and config.max_concurrency < 1:
            raise ValueError(f"max concurrency must be >= 1, got {config.max_concurrency}")
        if config.duration_s is not None:
            if config.duration_s <= config.warmup_s + config.cooldown_s:
                raise ValueError("the warm-up and cool-down windows leave nothing of the duration to measure")
            if math.isinf(config.request_rate) and not config.max_concurrency:
                raise ValueError("a duration-bounded run needs a max concurrency or a finite request rate")
        self.config = config
        self.requests = list(requests)
        self.on_progress = on_progress
        # Called (in a thread) after the warm-up requests and before the measured ones: a profiler
        # started here records the measured load, not the warm-up.
        self.before_measure: Callable[[], Any] | None = None
        # When the measured load starts (a perf_counter() value; None: when it is ready). Several
        # client processes sharing one load are given one start, so their releases share one clock.
        self.start_at: float | None = None
        # Set by a client process of a pool (engine.bench.client_procs): awaited once the bodies are
        # built and the connections open, it returns the common start (None: cancelled before it).
        self.wait_for_start: Callable[[], Awaitable[float | None]] | None = None
        # The release times (s from the start) a pool gave this process's share of its schedule;
        # None: computed here from the timestamps or the request rate.
        self.offsets: list[float] | None = None
        # The first warm-up's number, so that the warm-up ids of a pool's processes stay unique.
        self.warmup_id_start = 0
        self._cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._arrivals: asyncio.Task[Any] | None = None
        self._lock = threading.Lock()
        self._finished = {"warmup": 0, "measure": 0}
        # Read by a progress timer in another thread, never reported from the hot path: the phase
        # now running ("warmup", "measure", "done"), its request count, when the measured load
        # started (perf_counter) and the measured requests as they finish (a list append each).
        self.phase = "warmup" if config.num_warmups > 0 else "measure"
        self.phase_total = config.num_warmups if config.num_warmups > 0 else len(self.requests)
        self.measure_start: float | None = None
        self.measured: list[RequestOutput] = []
        # Requests sent to the server and not yet ended (a request waiting for a concurrency slot
        # is not in flight); read by the progress timer.
        self.in_flight = 0
        self.halved_acks: bool | None = None  # what the warm-up showed (LoadResult.halved_acks)
        self._headers = {"Content-Type": "application/json", **(config.headers or {})}
        self._path = "/" + config.endpoint.lstrip("/")  # the lean client adds the base URL's own path

    # ---- control ----------------------------------------------------------------------------

    def finished(self, phase: str) -> int:
        """Requests of ``phase`` ("warmup" or "measure") finished so far (any thread may ask)."""
        return self._finished.get(phase, 0)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_now)

    def _cancel_now(self) -> None:
        if self._arrivals is not None:
            self._arrivals.cancel()
        for t in list(self._tasks):
            t.cancel()

    # ---- the run ----------------------------------------------------------------------------

    async def run(self) -> LoadResult:
        with _fewer_collections():
            result = await self._run()
        result.halved_acks = self.halved_acks
        return result

    async def _warm_up(self, client: Any, sem: "asyncio.Semaphore | None") -> list[RequestOutput]:
        """The warm-up: ``num_warmups`` requests shaped as the first, not measured."""
        cfg = self.config
        if cfg.num_warmups <= 0:
            return []
        first = self.requests[0]
        requests = [self._limited(client, sem, first, f"{cfg.request_id_prefix}warmup-{i + self.warmup_id_start}",
                                  time.perf_counter(), "warmup", cfg.num_warmups) for i in range(cfg.num_warmups)]
        if not isinstance(client, StreamingHTTPClient):
            return await self._gather(requests)
        # The lean client may learn here, on requests nobody measures, whether the server lets it
        # ACK every second token (engine/bench/http_client.py: halved_acks).
        try:
            with client.trying_acks():
                return await self._gather(requests)
        finally:
            self.halved_acks = client.halved_acks

    async def _run(self) -> LoadResult:
        cfg = self.config
        with self._lock:
            self._loop = asyncio.get_running_loop()
            if self._cancelled:
                return LoadResult(outputs=[], cancelled=True)
        sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        async with self._client() as client:
            warm = await self._warm_up(client, sem)
            if self._cancelled:
                return LoadResult(outputs=[], warmup_outputs=warm, cancelled=True)
            if self.before_measure is not None:
                await asyncio.to_thread(self.before_measure)
            if cfg.duration_s is not None:
                return await self._run_for_duration(client, sem, warm)
            offsets = self._offsets()
            # Before the clock: every request's bytes, and the connections the load will hold at once.
            payloads = self._payloads(client)
            if isinstance(client, StreamingHTTPClient):
                try:
                    await client.open_connections(min(cfg.max_concurrency or len(self.requests), len(self.requests)))
                except OSError:
                    pass  # each request then meets the error on its own, and fails with it
            if not await self._await_start():
                return LoadResult(outputs=[], warmup_outputs=warm, cancelled=True)
            tasks: list[asyncio.Task[RequestOutput]] = []
            self.phase, self.phase_total = "measure", len(self.requests)
            t0 = self.measure_start = self.start_at if self.start_at is not None else time.perf_counter()
            self._arrivals = asyncio.create_task(self._release(client, sem, offsets, t0, tasks, payloads))
            try:
                await self._arrivals
            except asyncio.CancelledError:
                if not self._cancelled:
                    raise
            outputs = await asyncio.gather(*tasks)
            duration = time.perf_counter() - t0
            self.phase = "done"
        return LoadResult(outputs=list(outputs), warmup_outputs=warm, duration_s=duration,
                          cancelled=self._cancelled)

    async def _run_for_duration(self, client: Any, sem: asyncio.Semaphore | None,
                                warm: list[RequestOutput]) -> LoadResult:
        cfg = self.config
        assert cfg.duration_s is not None
        if isinstance(client, StreamingHTTPClient) and cfg.max_concurrency:
            try:
                await client.open_connections(cfg.max_concurrency)
            except OSError:
                pass
        bodies = [self._body(r) for r in self.requests]
        if not await self._await_start():
            return LoadResult(outputs=[], warmup_outputs=warm, cancelled=True)
        tasks: list[asyncio.Task[RequestOutput]] = []
        self.phase, self.phase_total = "measure", 0
        t0 = self.measure_start = self.start_at if self.start_at is not None else time.perf_counter()
        self._arrivals = asyncio.create_task(self._release_for_duration(client, sem, t0, tasks, bodies))
        try:
            await self._arrivals
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
        outputs = list(await asyncio.gather(*tasks))
        self.phase = "done"
        lo, hi = cfg.warmup_s, cfg.duration_s - cfg.cooldown_s
        measured = [o for o in outputs if t0 + lo <= o.start_time <= t0 + hi]
        return LoadResult(outputs=measured, warmup_outputs=warm, duration_s=hi - lo, cancelled=self._cancelled,
                          window=(lo, hi), excluded=len(outputs) - len(measured))

    async def _release_for_duration(self, client: Any, sem: asyncio.Semaphore | None, t0: float,
                                    tasks: list[asyncio.Task[RequestOutput]], bodies: list[bytes]) -> None:
        """Release requests (the list cycled) until the duration ends: closed loop at the concurrency
        cap when the rate is inf (a request goes when a slot frees), else gamma arrivals at the rate."""
        cfg = self.config
        assert cfg.duration_s is not None
        end = t0 + cfg.duration_s
        closed = sem is not None and math.isinf(cfg.request_rate)
        rng = np.random.RandomState(cfg.seed)
        lean = isinstance(client, StreamingHTTPClient)
        next_at, i, n, loop = t0, 0, len(self.requests), asyncio.get_running_loop()
        await _sleep_until(t0)  # a pool's common start, a little ahead
        while not self._cancelled:
            if closed:
                assert sem is not None
                await sem.acquire()
            elif time.perf_counter() < next_at:
                await asyncio.sleep(next_at - time.perf_counter())
            if time.perf_counter() >= end or self._cancelled:
                if closed:
                    sem.release()  # type: ignore[union-attr]
                return
            if not closed:
                rate, b = cfg.request_rate, cfg.burstiness
                next_at += 1.0 / rate if math.isinf(b) else float(rng.gamma(b, 1.0 / (rate * b)))
            req = self.requests[i % n]
            rid = f"{cfg.request_id_prefix}d{i}"
            body = bodies[i % n]
            payload = client.build_post(self._path, body, {**self._headers, "x-request-id": rid}) if lean else body
            tasks.append(self._track(loop.create_task(self._limited(
                client, None if closed else sem, req, rid, time.perf_counter(), "measure", 0, payload,
                held=sem if closed else None))))
            i += 1

    def _offsets(self) -> list[float]:
        return self.offsets if self.offsets is not None else release_offsets(self.config, self.requests)

    async def _await_start(self) -> bool:
        """In a pool's process: wait for the common start (False: cancelled before it)."""
        if self.wait_for_start is None:
            return True
        start = await self.wait_for_start()
        if start is None or self._cancelled:
            return False
        self.start_at = start
        return True

    def request_id(self, i: int) -> str:
        req = self.requests[i]
        return f"{self.config.request_id_prefix}{req.request_id or i}"

    def _payloads(self, client: Any) -> list[Any]:
        """What `_send` sends for each measured request, built once: the raw HTTP request for the
        lean client, the JSON body for aiohttp."""
        out: list[Any] = []
        for i, req in enumerate(self.requests):
            body = self._body(req)
            if isinstance(client, StreamingHTTPClient):
                out.append(client.build_post(self._path, body, {**self._headers, "x-request-id": self.request_id(i)}))
            else:
                out.append(body)
        return out

    def _client(self) -> Any:
        if self.config.http_client == "lean":
            return StreamingHTTPClient(self.config.base_url)
        limit = self.config.max_concurrency or 0
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=60)
        # trust_env: HTTP(S)_PROXY / NO_PROXY apply, as in vLLM's client (the lean client has no proxy).
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                     skip_auto_headers=("User-Agent",), trust_env=True)

    async def _gather(self, coros: list[Any]) -> list[RequestOutput]:
        tasks = [self._track(asyncio.create_task(c)) for c in coros]
        return list(await asyncio.gather(*tasks))

    def _track(self, task: asyncio.Task[RequestOutput]) -> asyncio.Task[RequestOutput]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _release(self, client: Any, sem: asyncio.Semaphore | None, offsets: list[float], t0: float,
                       tasks: list[asyncio.Task[RequestOutput]], payloads: list[Any]) -> None:
        n, loop = len(self.requests), asyncio.get_running_loop()
        for i, (req, off) in enumerate(zip(self.requests, offsets)):
            await _sleep_until(t0 + off)
            if self._cancelled:
                return
            tasks.append(self._track(loop.create_task(
                self._limited(client, sem, req, self.request_id(i), time.perf_counter(), "measure", n, payloads[i]))))

    async def _limited(self, client: Any, sem: asyncio.Semaphore | None, req: SampleRequest, rid: str,
                       arrival: float, phase: str, total: int, payload: Any = None,
                       held: asyncio.Semaphore | None = None) -> RequestOutput:
        """One request under the concurrency cap: it waits for a slot of `sem`, or was released
        holding one of `held` (a duration-bounded closed loop), given back when it ends."""
        try:
            if held is not None:
                try:
                    out = await self._send(client, req, rid, payload)
                finally:
                    held.release()
            elif sem is None:
                out = await self._send(client, req, rid, payload)
            else:
                async with sem:
                    out = await self._send(client, req, rid, payload)
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            # Cancelled while waiting for the semaphore: never sent.
            out = RequestOutput(prompt_len=req.prompt_len, request_id=rid, error="cancelled before sending",
                                start_time=time.perf_counter())
        out.queue_time = out.start_time - arrival
        self._finished[phase] += 1
        if phase == "measure":
            self.measured.append(out)
        if self.on_progress is not None:
            self.on_progress(phase, self._finished[phase], total, out)
        return out

    def _body(self, req: SampleRequest) -> bytes:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "stream": True, "stream_options": {"include_usage": True}}
        if cfg.is_chat:
            body["messages"] = [{"role": "user", "content": req.prompt}]
            body["max_completion_tokens"] = req.output_len
        else:
            body["prompt"] = req.prompt
            body["max_tokens"] = req.output_len
        if cfg.ignore_eos:
            body["ignore_eos"] = True
        if cfg.extra_body:
            body.update(cfg.extra_body)
        return _ENCODE(body)

    async def _send(self, client: Any, req: SampleRequest, rid: str, payload: Any = None) -> RequestOutput:
        """One request; `payload` is what `_payloads` built for it (None: build it now, untimed warm-up)."""
        out = RequestOutput(prompt_len=req.prompt_len, request_id=rid)
        lean = isinstance(client, StreamingHTTPClient)
        if payload is None:
            body = self._body(req)
            payload = client.build_post(self._path, body, {**self._headers, "x-request-id": rid}) if lean else body
        headers = {} if lean else {**self._headers, "x-request-id": rid}
        st = time.perf_counter()
        out.start_time = st
        stream = _CompletionStream(out, st)
        timeout = self.config.request_timeout_s
        self.in_flight += 1
        try:
            request = client.send(payload, stream.feed, stream.feed_many, stream.feed_data_lines, _DATA_LINE) \
                if lean else \
                self._exchange_aiohttp(client, payload, headers, stream)
            result = await (bounded(request, timeout, self._loop or asyncio.get_running_loop()) if timeout else request)
            status_error = result if not lean else (
                "" if result.status == 200 else _status_error(result.status, result.reason, result.error_body))
            if status_error:
                out.error = status_error
        except asyncio.TimeoutError:
            out.error = f"timeout after {timeout} s"
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            out.error = "cancelled"
        except Exception as exc:  # a malformed chunk, a dropped connection: this request fails, the run goes on
            out.error = f"{type(exc).__name__}: {exc}"[:_ERROR_TEXT_LIMIT]
        finally:
            self.in_flight -= 1
        stream.finish()
        return out

    # aiohttp: streams a 200 response into `stream` and returns "", or returns the error of any other status.

    async def _exchange_aiohttp(self, session: aiohttp.ClientSession, body: bytes, headers: dict[str, str],
                                stream: _CompletionStream) -> str:
        perf = time.perf_counter
        async with session.post(self.config.url, data=body, headers=headers) as resp:
            if resp.status != 200:
                return _status_error(resp.status, resp.reason or "", await resp.read())
            content = resp.content
            while True:
                data = await content.readany()
                if not data or stream.feed(data, perf()):
                    return ""


async def bounded(request: Awaitable[Any], timeout: float, loop: asyncio.AbstractEventLoop) -> Any:
    """`request` awaited in this task, cancelled with TimeoutError after `timeout` s. Not
    `asyncio.wait_for`: before Python 3.12 it runs the request in a task of its own, so the request
    is written one loop turn after its start stamp (behind every callback ready then, in a burst all
    the other requests' stamps) and each request pays for a second task. Not `asyncio.timeout`
    either: before 3.12 each lookup of the running loop, three per request there, is a getpid()
    system call; `loop` is the running loop, looked up once per run."""
    task = asyncio.current_task(loop)
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()
    handle = loop.call_later(timeout, expire)
    try:
        return await request
    except asyncio.CancelledError:
        if expired:
            if sys.version_info >= (3, 11):
                task.uncancel()  # this cancel was ours: the task is not being cancelled from outside
            raise asyncio.TimeoutError from None
        raise
    finally:
        handle.cancel()


async def _sleep_until(when: float) -> None:
    """Until perf_counter() reaches `when`: a loop's timers (uvloop's are in whole ms) can fire a
    little early, and a release before its time would start a pool's process before the others."""
    while (wait := when - time.perf_counter()) > 0:
        await asyncio.sleep(wait)


def _status_error(status: int, reason: str, body: bytes) -> str:
    detail = body[:_ERROR_TEXT_LIMIT].decode("utf-8", "replace")
    return f"HTTP {status} {reason}: {detail}".rstrip(": ")


class _CompletionStream:
    """The SSE body of one streamed completion, turned into its request's timings and counts.

    `feed(data, stamp)` takes the bytes of one read and the time they arrived; every message that
    read completes gets that stamp. It returns True when reading should stop (an error event or a
    malformed message: the request has failed). `finish()` settles the request once the body ended.
    """

    __slots__ = ("out", "start", "last", "buf", "got_choice", "done", "pieces", "running_usage", "text_len")

    def __init__(self, out: RequestOutput, start: float) -> None:
        self.out = out
        self.start = start
        self.last = start
        self.buf = b""
        self.got_choice = False
        self.done = False
        self.pieces = 0
        self.running_usage: int | None = None
        self.text_len = 0

    def feed(self, data: bytes, now: float) -> bool:
        out = self.out
        if self.done or out.error:
            return bool(out.error)
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" not in buf:
            self.buf = buf
            return False
        events = buf.split(b"\n\n")
        self.buf = events.pop()
        try:
            for ev in events:
                payload = _payload(ev)
                if payload is None:
                    continue
                if payload == b"[DONE]":
                    self.done = True
                    return False
                if self._take(_DECODE(payload), now):
                    return True
        except msgspec.DecodeError as exc:
            out.error = f"malformed message in stream: {exc}"[:_ERROR_TEXT_LIMIT]
            return True
        return False

    def feed_many(self, pieces: list[bytes], stamps: list[float]) -> bool:
        """`feed` for several reads; the reads that are each one whole `data: {...}` event (what
        servers write) are decoded together in one call. Returns True when reading should stop."""
        i, n = 0, len(pieces)
        if n > 2 and not (self.buf or self.done or self.out.error):
            # Every piece but the last one simple event each (told from the joined bytes in a few
            # C-level passes): their data as one JSON array, no per-piece slicing.
            head = pieces[:-1]
            body = b"".join(head)
            if (body.count(b"\n") == 2 * (n - 1) and body.count(b"\ndata:") == n - 2 and body.startswith(b"data:")
                    and all(map(bytes.endswith, head, repeat(b"\n\n"))) and b"\r" not in body and b"[DONE]" not in body):
                if self._take_array(b"[" + body[5:-2].replace(b"\n\ndata:", b",") + b"]", stamps[:n - 1]):
                    i = n - 1
                elif self.out.error:
                    return True
                # else not one message per piece: nothing was taken, the pieces go the general way
        while i < n:
            if self.buf or self.done or self.out.error:
                break
            matches = list(map(_SIMPLE_EVENT, pieces[i:] if i else pieces))
            j = i + (matches.index(None) if None in matches else len(matches))
            if j > i and not self._take_events(list(map(_EVENT_DATA, matches[:j - i])), stamps[i:j]):
                return bool(self.out.error)
            if j == n:
                return bool(self.out.error)
            if self.feed(pieces[j], stamps[j]):  # anything else, the general way
                return True
            i = j + 1
        return self._feed_each(pieces[i:], stamps[i:])

    def feed_data_lines(self, payloads: list[bytes], stamps: list[float]) -> bool:
        """`feed_many` for reads that were each one `data: <payload>\n\n` event (`_DATA_LINE`, what
        servers write): when no payload holds a line break, they are decoded as one JSON array."""
        if not (self.buf or self.done or self.out.error):
            # [DONE] in a read of its own (vLLM's way) ends the payloads
            ended = bool(payloads) and payloads[-1] == b"[DONE]"
            messages = payloads[:-1] if ended else payloads
            joined = b",".join(messages)
            if b"\n" not in joined and b"\r" not in joined:
                if not messages or self._take_array(b"[" + joined + b"]", stamps[:len(messages)]):
                    self.done = ended
                    return False
                if self.out.error:
                    return True
                # else not one message per payload ([DONE] among them, or a malformed one): the general way
        prefix, suffix = _DATA_LINE
        return self.feed_many([prefix + p + suffix for p in payloads], stamps)

    def _feed_each(self, pieces: list[bytes], stamps: list[float]) -> bool:
        for piece, at in zip(pieces, stamps):
            if self.feed(piece, at):
                return True
        return bool(self.out.error)

    def _take_events(self, payloads: list[bytes], stamps: list[float]) -> bool:
        """The data of whole simple events, decoded at once; False when a message was malformed
        (the general path then reports it) or one asked to stop."""
        done_at = payloads.index(b"[DONE]") if b"[DONE]" in payloads else -1
        if done_at >= 0:
            payloads = payloads[:done_at]
        if payloads and not self._take_array(b"[" + b",".join(payloads) + b"]", stamps[:len(payloads)]):
            if self.out.error or self._feed_each([b"data: " + p + b"\n\n" for p in payloads], stamps):
                return False
        if done_at >= 0:
            self.done = True
        return True

    def _take_array(self, array: bytes, stamps: list[float]) -> bool:
        """The messages of `array` (a JSON array of them, in order, arrived at `stamps`); False when
        it is not one message per stamp (nothing taken: the general path then reads them) or a
        message asked to stop (the request's error is set)."""
        try:
            chunks = _DECODE_MANY(array)
        except msgspec.DecodeError:
            return False
        if len(chunks) != len(stamps):
            return False
        out, start = self.out, self.start
        itl, last, got, pieces, text_len = out.itl, self.last, self.got_choice, self.pieces, self.text_len
        for chunk, at in zip(chunks, stamps):
            choices = chunk.choices
            if not choices or chunk.error is not None or chunk.usage is not None:
                self.last, self.got_choice, self.pieces, self.text_len = last, got, pieces, text_len
                if self._take(chunk, at):
                    return False
                last, got, pieces, text_len = self.last, self.got_choice, self.pieces, self.text_len
                continue
            # A plain token message: what `_take` does with one, inline (it is most of a stream).
            if got:
                itl.append(at - last)
            else:
                got = True
                out.ttft = at - start
            last = at
            c = choices[0]
            text = c.text if c.text is not None else (
                (c.delta.content or c.delta.reasoning_content) if c.delta is not None else None)
            if text:
                pieces += 1
                text_len += len(text)
        self.last, self.got_choice, self.pieces, self.text_len = last, got, pieces, text_len
        return True

    def _take(self, chunk: _Chunk, now: float) -> bool:
        """One decoded message that arrived at `now`; True when it ends the request (an error event)."""
        out = self.out
        if chunk.error is not None:
            out.error = ("error event in stream: " + _ENCODE(chunk.error).decode())[:_ERROR_TEXT_LIMIT]
            return True
        choices = chunk.choices
        if choices:
            if self.got_choice:
                out.itl.append(now - self.last)
            else:
                self.got_choice = True
                out.ttft = now - self.start
            self.last = now
            c = choices[0]
            text = c.text if c.text is not None else (
                (c.delta.content or c.delta.reasoning_content) if c.delta is not None else None)
            if text:
                self.pieces += 1
                self.text_len += len(text)
            if chunk.usage is not None and chunk.usage.completion_tokens is not None:
                self.running_usage = chunk.usage.completion_tokens
        elif chunk.usage is not None:
            out.output_tokens = chunk.usage.completion_tokens or 0
            if chunk.usage.prompt_tokens is not None:
                out.prompt_len = chunk.usage.prompt_tokens
        return False

    def finish(self) -> None:
        out = self.out
        if not self.done and not out.error:
            # A final `data:` line without its blank line still counts if it is [DONE].
            self.done = _payload(self.buf.strip()) == b"[DONE]"
        out.counted_tokens = self.running_usage if self.running_usage is not None else self.pieces
        out.generated_text_len = self.text_len
        out.latency = self.last - self.start
        if not out.error:
            if not self.got_choice:
                out.error = "no message with choices received"
            elif not self.done:
                out.error = "stream ended before [DONE]"
        out.success = not out.error


# How servers write an SSE message: one event of one data line (the framing `feed_data_lines` takes).
_DATA_LINE = (b"data: ", b"\n\n")

# One whole SSE event of one `data:` line and nothing before or after it; group 1 is its data.
_SIMPLE_EVENT = re.compile(rb"data: ?([^\r\n]*)\n\n").fullmatch
_EVENT_DATA = itemgetter(1)


def _payload(ev: bytes) -> bytes | None:
    """The data of one SSE event (data lines joined by newlines), or None for comments/no data."""
    if ev.startswith(b"data:") and b"\n" not in ev:
        return ev[5:].strip()
    lines = [ln[5:].strip() for ln in ev.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


@contextlib.contextmanager
def _fewer_collections(young: int = 50_000) -> Iterator[None]:
    """Inside: the garbage collector's youngest generation collected every `young` allocations of
    tracked objects instead of every 700. A run's objects are freed by reference counting; what a
    collection would find is the rare cycle, while each collection walks every young object alive,
    the in-flight requests' among them, thousands of times a second at high concurrency."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], young), *before[1:])
    try:
        yield
    finally:
        if gc.get_threshold()[0] == max(before[0], young):  # not changed meanwhile by someone else
            gc.set_threshold(*before)


def freeze_heap() -> None:
    """Put everything alive now out of the garbage collector's reach before a measured run, as
    `vllm bench serve` does: a full collection walking a large static heap (a tokenizer, torch)
    would otherwise stop the event loop for milliseconds in the middle of the run."""
    gc.collect()
    gc.freeze()


def run_load(config: LoadGenConfig, requests: Sequence[SampleRequest], *,
             on_progress: ProgressCallback | None = None) -> LoadResult:
    """Synchronous convenience: run a LoadGenerator in a fresh event loop (`config.event_loop`)."""
    return run_coroutine(LoadGenerator(config, requests, on_progress=on_progress).run(), config.event_loop,
                         reads_streams=config.http_client == "lean")

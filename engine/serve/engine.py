"""Continuous batching for the built-in server.

One engine thread owns the model. Each iteration it admits waiting requests (their whole prompt
is prefilled in this step), adds every running request's last token (one decode token each),
and runs them all in a single forward, so a new request joins the batch at the next step instead
of waiting for the batch to drain. Sampled tokens go back to the callers through callbacks;
``generate`` turns those into an async iterator for asyncio code (the HTTP server).

Each step runs inside ``torch.profiler.record_function`` named with vLLM's detailed step
annotation (TraceLens §5.1), so the trace analysis splits a profile of this server into
prefill, mixed and decode steps with the attention aggregates of each.

The profiler is started and stopped on the engine thread, between steps, so that it sees the
step annotations and the kernels of the thread that runs them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncGenerator, Callable, Sequence, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from engine.serve.model import KVCache, LlamaModel, greedy
from engine.serve.tokenizer import EOS_ID

T = TypeVar("T")


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of a request (``token``), or its end: ``finish_reason`` is ``"length"``
    or ``"stop"`` on the last token; ``error`` (with no token) when the request failed."""

    token: int | None
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    sink: Callable[[TokenEvent], None]
    output: list[int] = field(default_factory=list)
    cache: KVCache | None = None


def step_annotation(context: Sequence[tuple[int, int]], generation: Sequence[tuple[int, int]]) -> str:
    """vLLM's detailed step name from the (sq, sk) of each context (prefill) and generation
    (decode) request: sq = new tokens, sk = context length after the step. ``execute_<n>``
    carries the step's token count, as vLLM's does."""

    def agg(group: Sequence[tuple[int, int]]) -> str:
        sq = sum(q for q, _ in group)
        sk = sum(k for _, k in group)
        sqsq = sum(q * q for q, _ in group)
        sqsk = sum(q * k for q, k in group)
        return f"{len(group)}(sq{sq}sk{sk}sqsq{sqsq}sqsk{sqsk})"

    tokens = sum(q for q, _ in context) + sum(q for q, _ in generation)
    return f"execute_{tokens}_context_{agg(context)}_generation_{agg(generation)}"


class Engine:
    """Continuous-batching scheduler around a ``LlamaModel``. ``max_batch_size`` caps the
    running requests; ``max_prefill_tokens`` caps the prompt tokens admitted in one step (at
    least one request is always admitted, whatever its length)."""

    def __init__(self, model: LlamaModel, max_batch_size: int = 32, max_prefill_tokens: int = 8192,
                 eos_id: int = EOS_ID) -> None:
        if max_batch_size < 1 or max_prefill_tokens < 1:
            raise ValueError("max_batch_size and max_prefill_tokens must be at least 1")
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_id = eos_id
        self.steps = 0
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._aborted: set[str] = set()
        self._commands: deque[tuple[Callable[[], object], concurrent.futures.Future]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._profiler: profile | None = None
        self._profile_path: Path | None = None
        self._profile_steps_left: int | None = None  # auto-stop after this many steps
        self._auto_stopped: Path | None = None  # the trace an auto-stop wrote, for stop_profile

    # -- requests ---------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], max_tokens: int, ignore_eos: bool,
               sink: Callable[[TokenEvent], None]) -> str:
        """Queue a request; ``sink`` is called on the engine thread with each ``TokenEvent``.
        Raises ``ValueError`` for a request the model cannot run."""
        cfg = self.model.config
        if not prompt:
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        bad = next((t for t in prompt if not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {cfg.vocab_size})")
        if len(prompt) + max_tokens > cfg.max_seq_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                             f"max_seq_len {cfg.max_seq_len}")
        req = _Request(f"req-{next(self._ids)}", list(prompt), max_tokens, ignore_eos, sink)
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self._waiting.append(req)
            self._cond.notify()
        return req.request_id

    def abort(self, request_id: str) -> None:
        """Drop a request (its client went away); takes effect before the next step."""
        with self._cond:
            self._aborted.add(request_id)

    async def generate(self, prompt: Sequence[int], max_tokens: int, ignore_eos: bool) -> AsyncGenerator[TokenEvent, None]:
        """The request's events in the running event loop; closing the iterator early aborts it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def sink(ev: TokenEvent) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, ev)
            except RuntimeError:  # the loop closed (shutdown) while the request ran
                pass

        request_id = self.submit(prompt, max_tokens, ignore_eos, sink)
        finished = False
        try:
            while not finished:
                ev = await queue.get()
                finished = ev.finish_reason is not None or ev.error is not None
                yield ev
        finally:
            if not finished:
                self.abort(request_id)

    @property
    def num_unfinished(self) -> int:
        with self._cond:
            return len(self._waiting) + len(self._running)

    # -- the step ---------------------------------------------------------------------------

    def _admit(self) -> list[_Request]:
        with self._cond:
            if self._aborted:
                self._waiting = deque(r for r in self._waiting if r.request_id not in self._aborted)
                self._running = [r for r in self._running if r.request_id not in self._aborted]
                self._aborted.clear()
            admitted: list[_Request] = []
            budget = self.max_prefill_tokens
            while self._waiting and len(self._running) + len(admitted) < self.max_batch_size:
                if admitted and len(self._waiting[0].prompt) > budget:
                    break
                req = self._waiting.popleft()
                budget -= len(req.prompt)
                admitted.append(req)
            return admitted

    def step(self) -> str | None:
        """Run one scheduler step on the calling thread; returns its annotation, or None when
        there was nothing to do. (The engine thread calls this; tests may call it directly.)"""
        admitted = self._admit()
        decoding = list(self._running)
        if not admitted and not decoding:
            return None
        batch = admitted + decoding
        tokens = [r.prompt for r in admitted] + [[r.output[-1]] for r in decoding]
        name = step_annotation([(len(r.prompt), len(r.prompt)) for r in admitted],
                               [(1, len(r.prompt) + len(r.output)) for r in decoding])
        try:
            for req in admitted:  # inside the try: an out-of-memory here fails these requests only
                req.cache = self.model.new_cache(len(req.prompt) + req.max_tokens)
            caches = [r.cache for r in batch if r.cache is not None]
            with record_function(name):
                next_tokens = greedy(self.model.forward(tokens, caches))
        except Exception as exc:  # a bad candidate kernel or an OOM fails this step's requests, not the server
            traceback.print_exc(file=sys.stderr)
            with self._cond:
                self._running = []
            for req in batch:
                req.cache = None
                req.sink(TokenEvent(None, error=f"{type(exc).__name__}: {exc}"))
            return name
        self.steps += 1
        running: list[_Request] = []
        for req, tok in zip(batch, next_tokens):
            req.output.append(tok)
            finish = None
            if not req.ignore_eos and tok == self.eos_id:
                finish = "stop"
            elif len(req.output) >= req.max_tokens:
                finish = "length"
            req.sink(TokenEvent(tok, finish_reason=finish))
            if finish is None:
                running.append(req)
            else:
                req.cache = None  # free the KV cache now, not when the caller lets go
        with self._cond:
            self._running = running
        return name

    # -- the engine thread ------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="magpie-serve-engine", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the engine thread between two steps."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                fut.set_exception(RuntimeError("the engine is shutting down"))
                return fut
            self._commands.append((fn, fut))
            self._cond.notify()
        return fut

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self._running or self._commands):
                    self._cond.wait()
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
            for fn, fut in commands:
                try:
                    fut.set_result(fn())
                except Exception as exc:
                    fut.set_exception(exc)
            if self.step() is not None and self._profile_steps_left is not None and self._profiler is not None:
                self._profile_steps_left -= 1
                if self._profile_steps_left <= 0:
                    self._auto_stopped = self._stop_profile()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cond:
            pending = list(self._waiting) + self._running
            self._waiting.clear()
            self._running = []
            commands = list(self._commands)
            self._commands.clear()
        for req in pending:
            req.sink(TokenEvent(None, error="the server is shutting down"))
        for _, fut in commands:
            fut.set_exception(RuntimeError("the engine is shutting down"))
        if self._profiler is not None:
            path = self._stop_profile()
            print(f"magpie-serve: profiler stopped at shutdown, trace written to {path}", file=sys.stderr, flush=True)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread after the current step; unfinished requests get an error event and a
        running profile is written."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- profiling --------------------------------------------------------------------------

    def start_profile(self, directory: Path | str, num_steps: int | None = None) -> concurrent.futures.Future[Path]:
        """Start torch.profiler (CPU, plus CUDA/HIP on a GPU; shapes recorded); the future gives
        the trace path that ``stop_profile`` will write. With ``num_steps`` the profiler stops by
        itself after that many engine steps (a long profile takes minutes to export)."""
        return self.call(lambda: self._start_profile(Path(directory), num_steps))

    def stop_profile(self) -> concurrent.futures.Future[Path]:
        """Stop the profiler; the future gives the written ``*.pt.trace.json.gz``."""
        return self.call(self._stop_profile)

    def _start_profile(self, directory: Path, num_steps: int | None = None) -> Path:
        if self._profiler is not None:
            raise RuntimeError("the profiler is already running")
        if num_steps is not None and num_steps < 1:
            raise RuntimeError(f"num_steps {num_steps}: must be at least 1")
        self._profile_steps_left, self._auto_stopped = num_steps, None
        directory.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if self.model.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        # The name torch's tensorboard_trace_handler uses, so tools that glob for it find it.
        self._profile_path = directory / f"{socket.gethostname()}_{os.getpid()}.{time.time_ns() // 1_000_000}.pt.trace.json.gz"
        self._profiler = profile(activities=activities, record_shapes=True)
        self.model.annotate_kernels = True  # registry calls named in the trace (their call site)
        self._profiler.start()
        return self._profile_path

    def _stop_profile(self) -> Path:
        if self._profiler is None and self._auto_stopped is not None:
            path, self._auto_stopped = self._auto_stopped, None  # it stopped by itself after num_steps
            return path
        if self._profiler is None or self._profile_path is None:
            raise RuntimeError("the profiler is not running")
        self._profile_steps_left = None
        prof, path = self._profiler, self._profile_path
        self._profiler = self._profile_path = None
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()  # the last step's kernels belong in the trace
        prof.stop()
        self.model.annotate_kernels = False
        prof.export_chrome_trace(str(path))
        return path

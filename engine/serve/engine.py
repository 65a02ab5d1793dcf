"""Continuous batching for the built-in server.

One engine thread owns the model and a KV cache allocated once (``model.KVCache``: one slot per
running request, plus a pad slot for the padding rows of decode steps). Each iteration it
schedules prompt tokens up to ``max_prefill_tokens`` (continuing a prompt that did not fit the
previous step first: long prompts are prefilled in chunks), admits waiting requests while a slot
is free, and decodes one token for every running request, so a new request joins at the next
step instead of waiting for the batch to drain. The step's whole prompts run through
``graphs.PrefillRunner`` on a GPU (packed, padded to a token bucket, replayed from a CUDA graph
unless eager), a continued prompt chunk in one eager forward (``LlamaModel.prefill``); the
decode tokens run through ``graphs.DecodeRunner`` (a CUDA graph replay on a GPU unless eager).
Greedy sampling runs on the device and the step's new tokens come back in one device-to-host
copy. With ``overlap`` (on with CUDA graphs) a decode step whose every request goes on is
followed at once by the next one, queued on the device with this step's tokens as its inputs
before the host waits for them: the host hands out step N's tokens and schedules while the GPU
runs step N+1 (requests that ended in between, by EOS or abort, drop their rows). Tokens go
back to the callers through callbacks; ``generate`` turns those into an async iterator for
asyncio code (the HTTP server), waking its event loop once per step, not per token.

Each step runs inside ``torch.profiler.record_function`` named with vLLM's detailed step
annotation (TraceLens §5.1), so the trace analysis splits a profile of this server into
prefill, mixed and decode steps with the attention aggregates of each.

The profiler is started and stopped on the engine thread, between steps, so that it sees the
step annotations and the kernels of the thread that runs them. While it runs, decode steps run
eagerly (graph replays carry no ``magpie_kernel::`` annotations); counters say how many did.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import gzip
import itertools
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncGenerator, Callable, Sequence, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from engine.serve.graphs import DecodeRunner, PrefillRunner, batch_buckets, token_buckets
from engine.serve.model import LlamaModel
from engine.serve.prefix_cache import DEFAULT_BLOCK_SIZE, PrefixCache
from engine.serve.tokenizer import EOS_ID

T = TypeVar("T")
# Upper bounds of the decode batch-size histogram (``/metrics``).
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _start_profiler(prof: profile) -> None:
    """``prof.start()``, without the import of Inductor that torch's profiler makes at each start:
    it asks ``hasattr(torch, "_inductor")`` only to read whether Inductor's CUDA graphs are on
    (to work around CUPTI with them), and that lazy attribute imports Inductor and Dynamo, about
    a second of CPU, on the engine thread while requests wait. This server never compiles with
    Inductor (its CUDA graphs are its own, ``engine.serve.graphs``): where nothing imported
    Inductor, the profiler starts as it would with Inductor's graphs off."""
    lazy = torch.__dict__.get("__getattr__")
    if lazy is None or "torch._inductor" in sys.modules:
        prof.start()
        return

    def without_inductor(name: str) -> Any:
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = without_inductor  # type: ignore[attr-defined]  # a module's __getattr__ (PEP 562)
    try:
        prof.start()
    finally:
        torch.__getattr__ = lazy  # type: ignore[attr-defined]


def _export_trace(prof: profile, path: Path) -> None:
    """``prof.export_chrome_trace(path)``, gzipped in 1 MiB blocks at gzip's default level: for a
    ``.gz`` path torch writes the JSON to a temporary file and then gzips it line by line (one
    line an event) at level 9, a second of CPU for a few seconds of the tiny model, minutes for a
    long GPU trace; this takes a tenth of that, for a file about a tenth bigger."""
    if not path.name.endswith(".gz"):
        prof.export_chrome_trace(str(path))
        return
    fd, tmp = tempfile.mkstemp(suffix=".json")  # where torch writes its own
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as fin, gzip.open(path, "wb", compresslevel=6) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    finally:
        os.unlink(tmp)


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of a request (``token``), or its end: ``finish_reason`` is ``"length"``
    or ``"stop"`` on the last token; ``error`` (with no token) when the request failed."""

    token: int | None
    finish_reason: str | None = None
    error: str | None = None
    cached_tokens: int | None = None  # on a request's first token: its prompt tokens found in the prefix cache


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    sink: Callable[[TokenEvent], None]
    output: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0  # prompt tokens whose keys and values are in the cache
    cached: int = 0  # prompt tokens loaded from the prefix cache instead of prefilled


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


class _LoopBridge:
    """Hands token events from the engine thread to one asyncio loop: events queue up here and
    the loop is woken once per batch (``call_soon_threadsafe`` writes to its self-pipe); there
    each listener gets the events that arrived for it in one call."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[list[TokenEvent]], None], TokenEvent]] = []

    def push(self, listener: Callable[[list[TokenEvent]], None], ev: TokenEvent) -> None:
        with self._lock:
            self._pending.append((listener, ev))
            first = len(self._pending) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop closed (shutdown) while requests ran
                pass

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        batches: dict[Callable[[list[TokenEvent]], None], list[TokenEvent]] = {}
        for listener, ev in pending:
            batches.setdefault(listener, []).append(ev)
        for listener, events in batches.items():
            try:
                listener(events)
            except Exception:  # one broken listener must not starve the others of their tokens
                traceback.print_exc(file=sys.stderr)


@dataclass
class EngineStats:
    """Counters since the start (``/metrics``, the log line)."""

    steps: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0, "mixed": 0})
    step_seconds: dict[str, float] = field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0, "mixed": 0.0})
    batch_counts: list[int] = field(default_factory=lambda: [0] * (len(BATCH_BOUNDS) + 1))  # last: above the bounds
    batch_sum: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "error": 0, "abort": 0})
    # Steps with prompt tokens, by how their prompt forward ran (counted with the step, so that a
    # snapshot taken while a step runs never reads more replays than steps: counters only go up).
    prompt_replays: int = 0
    eager_prompt_steps: int = 0

    def record_step(self, prefill_tokens: int, decode_batch: int, seconds: float, prompt_replayed: bool = False) -> None:
        kind = "mixed" if prefill_tokens and decode_batch else "prefill" if prefill_tokens else "decode"
        self.steps[kind] += 1
        self.step_seconds[kind] += seconds
        self.prompt_tokens += prefill_tokens
        if prefill_tokens:
            if prompt_replayed:
                self.prompt_replays += 1
            else:
                self.eager_prompt_steps += 1
        if decode_batch:
            self.batch_counts[bisect.bisect_left(BATCH_BOUNDS, decode_batch)] += 1
            self.batch_sum += decode_batch


class Engine:
    """Continuous-batching scheduler around a ``LlamaModel``. ``max_batch_size`` caps the
    running requests (the KV cache has that many slots); ``max_prefill_tokens`` caps the prompt
    tokens of one step (a longer prompt is prefilled in chunks over several steps);
    ``max_model_len`` (default: the model's ``max_seq_len``) caps prompt + max_tokens and sizes
    every slot. ``cuda_graphs`` replays decode steps from CUDA graphs (on a GPU only, once
    ``warm_up()`` captured them) padded to ``graph_batch_sizes`` (see ``graphs.batch_buckets``),
    and steps of whole prompts from graphs per token bucket (``graphs.token_buckets``);
    ``packed_prompts`` (default: on a GPU) runs whole prompts padded to those buckets, with
    graphs or without, so that an eager engine computes what a graph engine does;
    ``stats_interval_s`` > 0 prints a stats line that often while steps run, and a last one at
    shutdown for the steps since. ``prefix_caching``
    keeps the keys and values of full blocks of ``prefix_block_size`` tokens in a pool of
    ``prefix_cache_blocks`` blocks (``engine.serve.prefix_cache``; default: a quarter of the KV
    cache's tokens, on a GPU at most a quarter of its free memory), and a request whose prompt
    starts with cached blocks skips their prefill."""

    def __init__(self, model: LlamaModel, max_batch_size: int = 32, max_prefill_tokens: int = 8192,
                 eos_id: int = EOS_ID, *, max_model_len: int | None = None, cuda_graphs: bool = False,
                 graph_batch_sizes: Sequence[int] | None = None, stats_interval_s: float = 0.0,
                 overlap: bool | None = None, packed_prompts: bool | None = None, prefix_caching: bool = False,
                 prefix_cache_blocks: int | None = None, prefix_block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if max_batch_size < 1 or max_prefill_tokens < 1:
            raise ValueError("max_batch_size and max_prefill_tokens must be at least 1")
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_len = max_model_len or model.config.max_seq_len
        self.eos_id = eos_id
        self.cuda_graphs = cuda_graphs and model.device.type == "cuda"
        self.cache = model.new_cache(max_batch_size + 1, self.max_len)
        self.pad_slot = max_batch_size  # the extra slot: decode padding rows write and read only this one
        self.prefix_cache: PrefixCache | None = None
        if prefix_caching:
            blocks = prefix_cache_blocks or self._default_prefix_blocks(prefix_block_size)
            self.prefix_cache = PrefixCache(self.cache, blocks, prefix_block_size)
        self.decoder = DecodeRunner(model, self.cache, self.pad_slot, batch_buckets(max_batch_size, graph_batch_sizes),
                                    max_batch_size)
        if packed_prompts is None:
            packed_prompts = model.device.type == "cuda"
        self.prefiller = (PrefillRunner(model, self.cache, self.pad_slot, token_buckets(max_prefill_tokens), max_batch_size,
                                        self.decoder) if packed_prompts else None)
        pinned = model.device.type == "cuda"
        self._tokens_host = torch.zeros(2 * max_batch_size, dtype=torch.long, pin_memory=pinned)
        self._tokens_copied = torch.cuda.Event() if pinned else None
        self.overlap = self.cuda_graphs if overlap is None else overlap
        # The decode step queued ahead: its requests (in row order) and its tokens on the device.
        self._ahead: tuple[list[_Request], torch.Tensor] | None = None
        self.ahead_steps = 0  # decode steps queued ahead and used
        self.joined_ahead = 0  # decode steps queued ahead with the rows of prompts just prefilled
        self.stats = EngineStats()
        self.stats_interval_s = stats_interval_s
        self._stats_lock = threading.Lock()
        self._last_stats: tuple[float, EngineStats] | None = None
        self._started = time.monotonic()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._prefilling: list[_Request] = []  # hold a slot, prompt not all in the cache yet
        self._running: list[_Request] = []  # decoding
        self._free_slots = list(range(max_batch_size - 1, -1, -1))  # pop() hands out slot 0 first
        self._aborted: set[str] = set()
        self._commands: deque[tuple[Callable[[], object], concurrent.futures.Future]] = deque()
        self._bridges: dict[asyncio.AbstractEventLoop, _LoopBridge] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._profiler: profile | None = None
        self._profile_path: Path | None = None
        self._profile_steps_left: int | None = None  # auto-stop after this many steps
        self._auto_stopped: Path | None = None  # the trace an auto-stop wrote, for stop_profile

    def _default_prefix_blocks(self, block_size: int) -> int:
        """A quarter of the KV cache's tokens; on a GPU at most a quarter of its free memory (the
        graphs and the steps' activations need the rest)."""
        blocks = max(1, self.cache.num_slots * self.max_len // 4 // block_size)
        if self.model.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.model.device)
            per_block = self.cache.nbytes // (self.cache.num_slots * self.max_len) * block_size
            blocks = max(1, min(blocks, free // 4 // per_block))
        return blocks

    @property
    def steps(self) -> int:
        return sum(self.stats.steps.values())

    def warm_up(self) -> None:
        """Run every path once on the pad slot (whole and continued prompts, a decode step per
        batch bucket), so that a broken kernel fails here naming its key (``KernelError``);
        then capture the decode graphs when ``cuda_graphs`` is on, and the prompt graphs (a
        kernel that cannot run or be captured there leaves prompts eager, with a warning)."""
        pad = self.pad_slot
        with self.model.tracking_kernels() as tracker:
            try:
                self.model.prefill(self.cache, [pad, pad], [0, 0], [[0, 1], [2]])
                if self.max_len >= 3:
                    self.model.prefill(self.cache, [pad], [2], [[3]])
                self.decoder.warm_up()
                self._sync()  # an asynchronous kernel error surfaces here
            except Exception as exc:
                raise tracker.error(exc, "the warm-up step", "fix it, or remove its override from the config") from exc
        if self.prefiller is not None:
            self._warm_up_prompts()
        if self.cuda_graphs:
            self.decoder.capture()
            if self.prefiller is not None and self.prefiller.disabled is None:
                self.prefiller.capture()

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    def _warm_up_prompts(self) -> None:
        # Padded prompt steps hand the attention empty sequences; a kernel that refuses them (it
        # is allowed to: the contract permits them but candidates are tested without) leaves
        # prompts unpadded, which changes nothing but the speed.
        assert self.prefiller is not None
        with self.model.tracking_kernels() as tracker:
            try:
                self.prefiller.warm_up()
                self._sync()
            except Exception as exc:
                self.prefiller.disabled = str(tracker.error(exc, "a padded prompt step", "prompts run unpadded"))
                print(f"magpie-serve: warning: {self.prefiller.disabled}", file=sys.stderr, flush=True)

    # -- requests ---------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], max_tokens: int, ignore_eos: bool,
               sink: Callable[[TokenEvent], None]) -> str:
        """Queue a request; ``sink`` is called on the engine thread with each ``TokenEvent``.
        Raises ``ValueError`` for a request the model cannot run."""
        self.validate(prompt, max_tokens)
        req = _Request(f"req-{next(self._ids)}", list(prompt), max_tokens, ignore_eos, sink)
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self._waiting.append(req)
            self._cond.notify()
        return req.request_id

    def validate(self, prompt: Sequence[int], max_tokens: int) -> None:
        """``ValueError`` for a request the model cannot run (``submit`` checks the same)."""
        cfg = self.model.config
        if not prompt:
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        bad = next((t for t in prompt if not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {cfg.vocab_size})")
        if len(prompt) + max_tokens > self.max_len:
            what = "max_seq_len" if self.max_len == cfg.max_seq_len else "max_model_len"
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                             f"{what} {self.max_len}")

    def abort(self, request_id: str) -> None:
        """Drop a request (its client went away); takes effect before the next step."""
        with self._cond:
            self._aborted.add(request_id)

    def _bridge(self, loop: asyncio.AbstractEventLoop) -> _LoopBridge:
        with self._cond:
            bridge = self._bridges.get(loop)
            if bridge is None:
                self._bridges = {lp: b for lp, b in self._bridges.items() if not lp.is_closed()}
                bridge = self._bridges[loop] = _LoopBridge(loop)
            return bridge

    def listen(self, prompt: Sequence[int], max_tokens: int, ignore_eos: bool,
               on_events: Callable[[list[TokenEvent]], None]) -> str:
        """Queue a request whose events are handed to ``on_events`` in the running event loop
        (call this from it), in batches of those that arrived together; returns its id (for
        ``abort``). The cheapest way to stream: no task is woken per token."""
        bridge = self._bridge(asyncio.get_running_loop())
        return self.submit(prompt, max_tokens, ignore_eos, lambda ev: bridge.push(on_events, ev))

    async def stream(self, prompt: Sequence[int], max_tokens: int,
                     ignore_eos: bool) -> AsyncGenerator[list[TokenEvent], None]:
        """The request's events in the running event loop, in batches of those that arrived
        together; closing the iterator early aborts the request."""
        queue: asyncio.Queue[list[TokenEvent]] = asyncio.Queue()
        request_id = self.listen(prompt, max_tokens, ignore_eos, queue.put_nowait)
        finished = False
        try:
            while not finished:
                batch = await queue.get()
                while not queue.empty():
                    batch.extend(queue.get_nowait())
                finished = any(ev.finish_reason is not None or ev.error is not None for ev in batch)
                yield batch
        finally:
            if not finished:
                self.abort(request_id)

    async def generate(self, prompt: Sequence[int], max_tokens: int, ignore_eos: bool) -> AsyncGenerator[TokenEvent, None]:
        """The request's events one at a time (see ``stream``)."""
        events = self.stream(prompt, max_tokens, ignore_eos)
        try:
            async for batch in events:
                for ev in batch:
                    yield ev
        finally:
            await events.aclose()

    @property
    def num_unfinished(self) -> int:
        with self._cond:
            return len(self._waiting) + len(self._prefilling) + len(self._running)

    # -- the step ---------------------------------------------------------------------------

    def _drop_aborted(self) -> None:
        """Under the lock: forget aborted requests and free their slots."""
        self._waiting = deque(r for r in self._waiting if r.request_id not in self._aborted)
        for group in (self._prefilling, self._running):
            for r in group:
                if r.request_id in self._aborted:
                    self._release(r, "abort")
        self._prefilling = [r for r in self._prefilling if r.request_id not in self._aborted]
        self._running = [r for r in self._running if r.request_id not in self._aborted]
        self._aborted.clear()

    def _release(self, req: _Request, reason: str) -> None:
        if req.slot is not None:
            self._free_slots.append(req.slot)
            req.slot = None
        self.stats.finished[reason] += 1

    def _schedule(self) -> tuple[list[tuple[_Request, int, int]], list[_Request]]:
        """This step's prompt chunks (request, start, length), the partly prefilled requests
        first, then waiting ones while a slot is free, within max_prefill_tokens; and the
        running requests, one decode token each."""
        with self._cond:
            if self._aborted:
                self._drop_aborted()
            budget = self.max_prefill_tokens
            chunks: list[tuple[_Request, int, int]] = []
            for req in self._prefilling:
                if not budget:
                    break
                n = min(len(req.prompt) - req.prefilled, budget)
                chunks.append((req, req.prefilled, n))
                budget -= n
            while budget and self._waiting and self._free_slots:
                req = self._waiting.popleft()
                req.slot = self._free_slots.pop()
                self._prefilling.append(req)
                if self.prefix_cache is not None:  # the cached blocks of its prompt go to its slot, not through the model
                    req.cached = req.prefilled = self.prefix_cache.load(self.cache, req.slot,
                                                                        self.prefix_cache.match(req.prompt))
                n = min(len(req.prompt) - req.prefilled, budget)
                chunks.append((req, req.prefilled, n))
                budget -= n
            return chunks, list(self._running)

    def step(self) -> str | None:
        """Run one scheduler step on the calling thread; returns its annotation, or None when
        there was nothing to do. (The engine thread calls this; tests may call it directly.)"""
        chunks, decoding = self._schedule()
        if not chunks and not decoding:
            self._ahead = None  # its requests were all aborted
            return None
        name = step_annotation([(n, s + n) for _, s, n in chunks],
                               [(1, len(r.prompt) + len(r.output)) for r in decoding])
        started = time.perf_counter()
        replays = self.prefiller.replays if self.prefiller is not None else 0
        try:
            with record_function(name):
                tokens = self._forward(chunks, decoding)
        except Exception as exc:  # a bad candidate kernel fails this step's requests, not the server
            self._ahead = None
            traceback.print_exc(file=sys.stderr)
            self._fail([r for r, _, _ in chunks] + decoding, f"{type(exc).__name__}: {exc}")
            return name
        self._finish(chunks, decoding, tokens)
        replayed = self.prefiller is not None and self.prefiller.replays > replays
        with self._stats_lock:
            self.stats.record_step(sum(n for _, _, n in chunks), len(decoding), time.perf_counter() - started, replayed)
        return name

    def _forward(self, chunks: list[tuple[_Request, int, int]], decoding: list[_Request]) -> list[int]:
        outs = []
        ahead, self._ahead = self._ahead, None
        decoded, staged = None, False
        if chunks:
            slots, starts = [r.slot for r, _, _ in chunks], [s for _, s, _ in chunks]
            prompts = [r.prompt[s:s + n] for r, s, n in chunks]
            pf = self.prefiller
            if pf is not None and pf.fits(starts, prompts):
                if ahead is None and pf.can_fuse(len(decoding)):  # the decode rows ride along in one forward
                    first, decoded = pf.run_mixed(slots, prompts, [r.output[-1] for r in decoding],
                                                  [len(r.prompt) + len(r.output) - 1 for r in decoding],
                                                  [r.slot for r in decoding])
                    staged = True
                else:
                    first = pf.run(slots, prompts)
            else:
                first = self.model.prefill(self.cache, slots, starts, prompts).argmax(dim=-1)
            outs.append(first)
        if decoding and decoded is None:
            decoded, staged = self._decode(decoding, ahead)
        if decoded is not None:
            outs.append(decoded)
        tokens = outs[0] if len(outs) == 1 else torch.cat(outs)
        go_on = self._can_run_ahead(chunks, decoding, staged)
        if self._tokens_copied is None:  # the CPU: the tokens are there already
            out = tokens.tolist()
            if go_on:
                self._queue_next(chunks, decoding, decoded, outs[0] if chunks else None)
            return out
        host = self._tokens_host[:tokens.numel()]
        host.copy_(tokens, non_blocking=True)
        self._tokens_copied.record()
        if go_on:  # queued behind the copy: the GPU starts the next step while the host waits for this one's tokens
            self._queue_next(chunks, decoding, decoded, outs[0] if chunks else None)
        # The one device-to-host copy of the step; waiting releases the GIL, so the HTTP thread
        # streams the previous step's tokens meanwhile.
        self._tokens_copied.synchronize()
        return host.tolist()

    def _decode(self, decoding: list[_Request], ahead: tuple[list[_Request], torch.Tensor] | None) -> tuple[torch.Tensor, bool]:
        """This step's decode tokens (on the device) and whether the decoder's staged rows are
        exactly ``decoding``'s (so the next step can be queued from them)."""
        if ahead is not None:
            reqs, tokens = ahead
            if len(reqs) == len(decoding) and all(a is b for a, b in zip(reqs, decoding)):
                self.ahead_steps += 1
                return tokens, True
            row = {id(r): i for i, r in enumerate(reqs)}
            if all(id(r) in row for r in decoding):  # some ended (EOS, abort): their rows are dropped
                self.ahead_steps += 1
                index = torch.tensor([row[id(r)] for r in decoding], device=tokens.device)
                return tokens.index_select(0, index), False
        positions = [len(r.prompt) + len(r.output) - 1 for r in decoding]
        return self.decoder.run([r.output[-1] for r in decoding], positions, [r.slot for r in decoding]), True

    def _can_run_ahead(self, chunks: list[tuple[_Request, int, int]], decoding: list[_Request], staged: bool) -> bool:
        # Not while profiling (one annotated step at a time), not when a request ends by length
        # now (its next position may lie past its slot), and only from the decoder's own staged
        # rows. Prompt chunks join the next step when each completes its prompt (their requests
        # decode next, after the running ones, as ``_finish`` orders them).
        if not self.overlap or self.model.annotate_kernels or not all(len(r.output) + 1 < r.max_tokens for r in decoding):
            return False
        if self._prompts_next():
            return False  # the next step runs its decode rows inside the prompt forward instead
        if not chunks:
            return staged
        return ((staged or not decoding) and len(decoding) + len(chunks) <= self.decoder.rows
                and all(s + n == len(r.prompt) and r.max_tokens > 1 for r, s, n in chunks))

    def _prompts_next(self) -> bool:
        """Whether the next step will admit a waiting prompt that a mixed step could carry."""
        pf = self.prefiller
        return (pf is not None and pf.decoder is not None and pf.disabled is None
                and bool(self._waiting) and bool(self._free_slots))

    def _queue_next(self, chunks: list[tuple[_Request, int, int]], decoding: list[_Request],
                    decoded: torch.Tensor | None, first_tokens: torch.Tensor | None) -> None:
        """Queue the next decode step on the device from this step's tokens (``_can_run_ahead``)."""
        if not chunks:
            self._ahead = (decoding, self.decoder.run_next(decoded))
            return
        joined = [r for r, _, _ in chunks]
        self.joined_ahead += 1
        self._ahead = (decoding + joined, self.decoder.run_joined(decoded, first_tokens, [len(r.prompt) for r in joined],
                                                                  [r.slot for r in joined]))

    def _settle(self, req: _Request, token: int, events: list[tuple[_Request, TokenEvent]]) -> bool:
        """Give ``token`` to the request and queue its event in ``events``; True when that finished
        it (its slot is freed and counted now, before any event of the step goes out)."""
        req.output.append(token)
        finish = None
        if not req.ignore_eos and token == self.eos_id:
            finish = "stop"
        elif len(req.output) >= req.max_tokens:
            finish = "length"
        events.append((req, TokenEvent(token, finish_reason=finish,
                                       cached_tokens=req.cached if len(req.output) == 1 else None)))
        if finish is not None:
            if self.prefix_cache is not None and req.slot is not None:
                # Its prompt and the tokens generated before the last (whose keys and values are in its slot).
                self.prefix_cache.store(self.cache, req.slot, req.prompt + req.output[:-1])
            with self._cond:
                self._release(req, finish)
        return finish is not None

    def _finish(self, chunks: list[tuple[_Request, int, int]], decoding: list[_Request], tokens: list[int]) -> None:
        """Settle a step's tokens, update the state and counters, then hand the tokens out: a client
        that has its last token and then reads ``/metrics`` finds the request counted."""
        started: list[_Request] = []  # whose prompt is now all in the cache, and not finished by its first token
        events: list[tuple[_Request, TokenEvent]] = []
        for (req, s, n), token in zip(chunks, tokens):
            req.prefilled = s + n
            if self.prefix_cache is not None and req.prefilled == len(req.prompt):
                self.prefix_cache.store(self.cache, req.slot, req.prompt)  # requests that share it can start now
            if req.prefilled == len(req.prompt) and not self._settle(req, token, events):
                started.append(req)
        running = [req for req, token in zip(decoding, tokens[len(chunks):]) if not self._settle(req, token, events)]
        with self._cond:
            self._prefilling = [r for r in self._prefilling if r.prefilled < len(r.prompt)]
            self._running = running + started
            self.stats.generation_tokens += len(decoding) + sum(1 for r, s, n in chunks if s + n == len(r.prompt))
        for req, event in events:
            req.sink(event)

    def _fail(self, batch: list[_Request], error: str) -> None:
        failed = {id(r) for r in batch}
        with self._cond:
            for req in batch:
                self._release(req, "error")
            self._prefilling = [r for r in self._prefilling if id(r) not in failed]
            self._running = [r for r in self._running if id(r) not in failed]
        for req in batch:
            req.sink(TokenEvent(None, error=error))

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """A consistent snapshot of the counters and the current state (``/metrics``)."""
        with self._stats_lock, self._cond:
            s = self.stats
            pc = self.prefix_cache
            running = len(self._prefilling) + len(self._running)
            return {"steps": dict(s.steps), "step_seconds": dict(s.step_seconds), "batch_bounds": BATCH_BOUNDS,
                    "batch_counts": list(s.batch_counts), "batch_sum": s.batch_sum, "prompt_tokens": s.prompt_tokens,
                    "generation_tokens": s.generation_tokens, "finished": dict(s.finished),
                    "running": running, "waiting": len(self._waiting), "kv_slots_used": running,
                    "kv_slots": self.max_batch_size, "graph_replays": self.decoder.replays,
                    "eager_decode_steps": self.decoder.eager_steps, "ahead_steps": self.ahead_steps,
                    "graph_batch_sizes": sorted(self.decoder.graphs),
                    "prompt_graph_replays": s.prompt_replays,
                    "mixed_forward_steps": self.prefiller.mixed_steps if self.prefiller else 0,
                    "eager_prompt_steps": s.eager_prompt_steps,
                    "graph_token_buckets": sorted(self.prefiller.graphs) if self.prefiller else [],
                    "prefix_cache": None if pc is None else {
                        "queries": pc.queries, "hits": pc.hits, "blocks_used": pc.used_blocks,
                        "blocks": pc.num_blocks, "block_size": pc.block_size, "evictions": pc.evictions}}

    def reset_prefix_cache(self) -> concurrent.futures.Future[bool]:
        """Empty the prefix cache between two steps (``POST /reset_prefix_cache``); the future
        gives False when prefix caching is off."""
        def reset() -> bool:
            if self.prefix_cache is None:
                return False
            self.prefix_cache.reset()
            return True
        return self.call(reset)

    def stats_line(self, now: float | None = None) -> str:
        """What happened since the previous call, one line (the server prints it every interval)."""
        now = time.monotonic() if now is None else now
        m = self.metrics()
        prev_t, prev = self._last_stats or (self._started, EngineStats())
        self._last_stats = (now, EngineStats(steps=dict(m["steps"]), prompt_tokens=m["prompt_tokens"],
                                             generation_tokens=m["generation_tokens"], batch_sum=m["batch_sum"],
                                             batch_counts=list(m["batch_counts"])))
        dt = max(now - prev_t, 1e-9)
        steps = sum(m["steps"].values()) - sum(prev.steps.values())
        batches = sum(m["batch_counts"]) - sum(prev.batch_counts)
        mean_batch = (m["batch_sum"] - prev.batch_sum) / batches if batches else 0.0
        return (f"magpie-serve stats: {sum(m['steps'].values())} steps (+{steps} in {dt:.1f} s, decode batch mean "
                f"{mean_batch:.1f}), running {m['running']}, waiting {m['waiting']}, kv slots {m['kv_slots_used']}/"
                f"{m['kv_slots']}, prompt {(m['prompt_tokens'] - prev.prompt_tokens) / dt:.1f} tok/s, generation "
                f"{(m['generation_tokens'] - prev.generation_tokens) / dt:.1f} tok/s, decode graph replays "
                f"{m['graph_replays']}, eager decode steps {m['eager_decode_steps']}, queued ahead {m['ahead_steps']}, "
                f"prompt graph replays {m['prompt_graph_replays']}, eager prompt steps {m['eager_prompt_steps']}, "
                f"decode inside the prompt forward {m['mixed_forward_steps']}")

    def _maybe_print_stats(self) -> None:
        if self.stats_interval_s <= 0:
            return
        now = time.monotonic()
        if now - (self._last_stats[0] if self._last_stats else self._started) >= self.stats_interval_s:
            print(self.stats_line(now), flush=True)

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
                while not (self._stopping or self._waiting or self._prefilling or self._running or self._commands):
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
            if self.step() is None:
                continue
            self._maybe_print_stats()
            if self._profile_steps_left is not None and self._profiler is not None:
                self._profile_steps_left -= 1
                if self._profile_steps_left <= 0:
                    self._auto_stopped = self._stop_profile()
        self._shutdown()

    def _shutdown(self) -> None:
        if self.stats_interval_s > 0:  # a last line for the steps since the previous one: the log counts them all
            prev = self._last_stats[1] if self._last_stats else EngineStats()
            if sum(self.metrics()["steps"].values()) > sum(prev.steps.values()):
                print(self.stats_line(), flush=True)
        with self._cond:
            pending = list(self._waiting) + self._prefilling + self._running
            self._waiting.clear()
            self._prefilling, self._running = [], []
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

    def start_profile(self, directory: Path | str, num_steps: int | None = None,
                      kernel_sites: bool = True) -> concurrent.futures.Future[Path]:
        """Start torch.profiler (CPU, plus CUDA/HIP on a GPU; shapes recorded); the future gives
        the trace path that ``stop_profile`` will write. With ``num_steps`` the profiler stops by
        itself after that many engine steps (a long profile takes minutes to export). With
        ``kernel_sites`` (the default) each registry call and model line is named in the trace,
        which only eager steps can carry: decode steps run eagerly while it runs. Without, the
        steps run as served (graph replays, the next decode step queued ahead), so the trace
        shows the GPU timeline of the server as it is measured, without the call sites."""
        return self.call(lambda: self._start_profile(Path(directory), num_steps, kernel_sites))

    def stop_profile(self) -> concurrent.futures.Future[Path]:
        """Stop the profiler; the future gives the written ``*.pt.trace.json.gz``."""
        return self.call(self._stop_profile)

    def _start_profile(self, directory: Path, num_steps: int | None = None, kernel_sites: bool = True) -> Path:
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
        self._profiler = profile(activities=activities, record_shapes=True, with_stack=True)
        self.model.annotate_kernels = kernel_sites  # registry calls named in the trace (their call site)
        _start_profiler(self._profiler)
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
        _export_trace(prof, path)
        return path

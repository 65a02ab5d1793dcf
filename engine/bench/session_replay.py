"""Replay of multi-turn sessions (``engine.bench.sessions``) against an OpenAI-compatible server.

Each turn's prompt is the session's history so far (system prompt, earlier inputs and answers)
plus the turn's input: on ``/v1/chat/completions`` a message list with the answers as assistant
messages, on ``/v1/completions`` the concatenation (text, or token ids). Token-id sessions have no
tokenizer to turn an answer back into ids, so an answer enters the history as as many fixed tokens
of its own as the server counted (``usage.completion_tokens``): the context grows by the answer's
length, and the answer's blocks are new to the server's prefix cache.

Two schedules (``mode``):

* ``closed``: a session sends its next turn ``delay_s`` after the previous answer ended; at most
  ``max_concurrency`` sessions run at once (a child session, a sub-agent, starts when its
  parent's turn ``parent_turn`` is answered, with the parent's history as the start of its own);
* ``open``: a turn goes at its recorded ``timestamp_s`` from the start (a turn without one:
  ``delay_s`` after the previous answer), or when the previous turn of its session is answered if
  that is later (its prompt needs the answer): the slip is recorded per turn (``late_s``).

``num_warmups`` short requests go first, one at a time and not measured, with prompts that share
no block with any session (the prefix cache stays cold for the sessions).

Every request carries the session-affinity header (``session_header``, default ``X-Session-ID``;
empty: none) with its session's id, so that a router can keep a session on one replica.

Per request: what ``metrics.compute_metrics`` takes (TTFT, ITL, E2EL, tokens), plus the session,
the turn index and ``usage.prompt_tokens_details.cached_tokens`` (vLLM sends it only when started
with ``--enable-prompt-tokens-details``, which a vLLM launched for a session replay gets; a server
that sends none leaves the cached tokens unreported, not 0). ``session_metrics`` adds per
turn index and per session: TTFT by turn, cached prompt tokens, fresh vs reused prompt-token
throughput, session duration and turns per session, and the prefix-cache hit rate from the
server's ``/metrics`` counters (vLLM's ``vllm:prefix_cache_queries`` / ``_hits``) read before and
after the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import aiohttp
import msgspec
import numpy as np

from engine.bench.http_client import HTTPError, StreamingHTTPClient
from engine.bench.loadgen import bounded
from engine.bench.metrics import RequestOutput, compute_metrics
from engine.bench.server_metrics import parse_exposition
from engine.bench.sessions import BlockTokens, Session
from engine.eventloop import run_coroutine

REPLAY_MODES = ("closed", "open")
DEFAULT_SESSION_HEADER = "X-Session-ID"
_QUERIES, _HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.decode


@dataclass
class SessionReplayConfig:
    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    mode: str = "closed"
    session_header: str = DEFAULT_SESSION_HEADER
    max_concurrency: int | None = None  # sessions at once (closed loop)
    request_timeout_s: float | None = 600.0
    ignore_eos: bool = True
    time_scale: float = 1.0  # delays and timestamps are multiplied by this
    num_warmups: int = 0  # unmeasured requests first, of tokens no session shares (the cache stays cold for them)
    extra_body: dict[str, Any] = field(default_factory=dict)
    # "lean": the load generator's own HTTP client (keep-alive pool, reads taken a poll at a time);
    # "aiohttp": aiohttp's (proxies from the environment apply).
    http_client: str = "lean"

    @property
    def is_chat(self) -> bool:
        return "chat" in self.endpoint


@dataclass(slots=True)
class TurnOutput:
    """One request of the replay: the client's view (``out``) and where it belongs."""

    out: RequestOutput
    session_id: str
    turn: int
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (None: the server gave none)
    server_prompt_tokens: int = 0
    release: float = 0.0  # s from the replay's start when it was due
    late_s: float = 0.0  # open loop: how long after its timestamp it went (waiting for the previous answer)
    text: str = ""


@dataclass
class SessionReplayResult:
    turns: list[TurnOutput]
    duration_s: float
    sessions: list[Session]
    metrics_before: dict[str, float] | None = None
    metrics_after: dict[str, float] | None = None
    cancelled: bool = False
    halved_acks: bool | None = None  # as the load generator's (engine/bench/loadgen.py: LoadResult)


def answer_key(session_id: str, turn: int) -> tuple[int, ...]:
    """The seed of the stand-in token ids of a session's answer to ``turn`` (token-id sessions keep
    no answer text): the same in every run, so a replay's prompts are reproducible (Python's
    ``hash`` of a string is salted per process)."""
    return (4, zlib.crc32(session_id.encode()), turn)


class _History:
    """A session's context: text, token ids, or chat messages."""

    def __init__(self, session: Session, chat: bool, filler: BlockTokens | None) -> None:
        self.chat, self.filler = chat, filler
        self.messages: list[dict[str, str]] = []
        self.text = ""
        self.ids: list[int] = []
        if session.system is not None:
            if isinstance(session.system, str):
                self.text = session.system
                self.messages.append({"role": "system", "content": session.system})
            else:
                self.ids = list(session.system)

    def copy(self) -> "_History":
        h = object.__new__(_History)
        h.chat, h.filler = self.chat, self.filler
        h.messages, h.text, h.ids = list(self.messages), self.text, list(self.ids)
        return h

    def prompt(self, inp: str | list[int]) -> Any:
        if self.chat:
            if not isinstance(inp, str):
                raise ValueError("the chat endpoint needs text inputs; token-id sessions go to /v1/completions")
            return [*self.messages, {"role": "user", "content": inp}]
        if isinstance(inp, str):
            return self.text + inp
        return self.ids + inp

    def add(self, inp: str | list[int], answer: str, answer_tokens: int, key: tuple[int, ...]) -> None:
        if self.chat:
            assert isinstance(inp, str)
            self.messages += [{"role": "user", "content": inp}, {"role": "assistant", "content": answer}]
        elif isinstance(inp, str):
            self.text += inp + answer
        else:
            self.ids += inp
            if answer_tokens and self.filler is not None:
                self.ids += self.filler.unique(key, answer_tokens)


async def _scrape(session: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
    try:
        async with session.get(base_url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                return None
            parsed = parse_exposition(await r.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    return {k: v for k, (_, v) in parsed.items()}


class SessionReplay:
    def __init__(self, config: SessionReplayConfig, sessions: Sequence[Session], *,
                 filler: BlockTokens | None = None,
                 on_turn: Callable[[TurnOutput], None] | None = None) -> None:
        if config.mode not in REPLAY_MODES:
            raise ValueError(f"replay mode {config.mode!r}: expected one of {', '.join(REPLAY_MODES)}")
        self.config, self.sessions = config, list(sessions)
        self.by_id = {s.session_id: s for s in self.sessions}
        self.filler = filler
        self.on_turn = on_turn
        self.turns: list[TurnOutput] = []
        self.total_turns = sum(len(s.turns) for s in self.sessions)
        self.warmup_errors = 0
        # What a live progress line reads (as of a LoadGenerator: engine.bench.run.ProgressTimer).
        self.phase = "warmup" if config.num_warmups else "measure"
        self.phase_total = config.num_warmups or self.total_turns
        self.measured: list[RequestOutput] = []
        self.measure_start: float | None = None
        self.in_flight = 0
        self._warm_done = 0
        self._cancelled = False
        self._tasks: set[asyncio.Task] = set()
        self._lean: StreamingHTTPClient | None = None
        self._path = "/" + config.endpoint.lstrip("/")

    def cancel(self) -> None:
        """Stop the replay (from any thread): requests in flight end as cancelled."""
        self._cancelled = True
        loop = getattr(self, "_loop", None)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_tasks)

    def _cancel_tasks(self) -> None:
        for t in list(self._tasks):
            t.cancel()

    async def run(self) -> SessionReplayResult:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s) if cfg.request_timeout_s else None
        connector = aiohttp.TCPConnector(limit=0)
        self._lean = StreamingHTTPClient(cfg.base_url) if cfg.http_client == "lean" else None
        try:
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:  # (and /metrics)
                await self._warm_up(http)
                before = await _scrape(http, cfg.base_url)
                if self._lean is not None and cfg.max_concurrency and cfg.mode == "closed":
                    try:  # the first turns then wait on no TCP handshake, as the load generator's requests
                        await self._lean.open_connections(min(cfg.max_concurrency, len(self.sessions)))
                    except OSError:
                        pass  # (each turn then connects, and fails, on its own)
                self.phase, self.phase_total = "measure", self.total_turns
                self.measure_start = time.perf_counter()
                self._sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency and cfg.mode == "closed" else None
                self._t0 = time.perf_counter()
                roots = [s for s in self.sessions if s.parent_id is None or s.parent_id not in self.by_id]
                for s in roots:
                    self._spawn(http, s, None)
                while self._tasks:
                    await asyncio.gather(*list(self._tasks), return_exceptions=True)
                duration = time.perf_counter() - self._t0
                after = await _scrape(http, cfg.base_url)
        finally:
            if self._lean is not None:
                await self._lean.close()
        return SessionReplayResult(self.turns, max(duration, 1e-9), self.sessions, before, after, self._cancelled,
                                   self._lean.halved_acks if self._lean is not None else None)

    async def _warm_up(self, http: aiohttp.ClientSession) -> None:
        """``num_warmups`` short requests, one at a time, not measured; their prompts share no
        block with any session's. The lean client may learn on them whether the server lets it ACK
        every second token (engine/bench/http_client.py: halved_acks): 8 tokens each, enough for it
        to see the server send one while the one before it was unacknowledged."""
        cfg = self.config
        with self._lean.trying_acks() if self._lean is not None else contextlib.nullcontext():
            for i in range(cfg.num_warmups):
                if self._cancelled:
                    return
                prompt: Any
                if cfg.is_chat:
                    prompt = [{"role": "user", "content": f"warm-up request {i}"}]
                elif self.filler is not None:
                    prompt = self.filler.unique((9, i), 16)
                else:
                    prompt = f"warm-up request {i}"
                rec = await self._send(http, "warmup", i, prompt, 8, 0)
                self.warmup_errors += 0 if rec.out.success else 1
                self._warm_done += 1

    def _spawn(self, http: aiohttp.ClientSession, session: Session, history: _History | None) -> None:
        task = asyncio.ensure_future(self._session(http, session, history))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _session(self, http: aiohttp.ClientSession, session: Session, inherited: _History | None) -> None:
        if self._sem is not None:
            async with self._sem:
                await self._turns(http, session, inherited)
        else:
            await self._turns(http, session, inherited)

    async def _turns(self, http: aiohttp.ClientSession, session: Session, inherited: _History | None) -> None:
        cfg = self.config
        history = inherited.copy() if inherited is not None else _History(session, cfg.is_chat, self.filler)
        if inherited is not None and session.system is not None:  # a child's own system prompt follows the parent's context
            if cfg.is_chat:
                history.messages.append({"role": "system", "content": str(session.system)})
            elif isinstance(session.system, str):
                history.text += session.system
            else:
                history.ids += session.system
        children = {}
        for cid in session.children:
            child = self.by_id.get(cid)
            if child is not None:
                children.setdefault(child.parent_turn or 0, []).append(child)
        last_end = time.perf_counter()
        for k, turn in enumerate(session.turns):
            if self._cancelled:
                return
            late = 0.0
            if cfg.mode == "open" and turn.timestamp_s is not None:
                due = self._t0 + turn.timestamp_s * cfg.time_scale
                late = max(0.0, last_end - due)
            else:
                due = last_end + turn.delay_s * cfg.time_scale
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                prompt = history.prompt(turn.input)
            except ValueError as exc:
                rec = TurnOutput(RequestOutput(error=str(exc), request_id=f"{session.session_id}:{k}"),
                                 session.session_id, k)
                self._record(rec)
                return
            rec = await self._send(http, session.session_id, k, prompt, turn.output_len,
                                   turn.input_tokens + self._history_tokens(history))
            rec.release, rec.late_s = due - self._t0, late
            self._record(rec)
            last_end = time.perf_counter()
            if not rec.out.success:
                return  # the rest of the session depends on this answer
            history.add(turn.input, rec.text, rec.out.output_tokens or rec.out.counted_tokens,
                        answer_key(session.session_id, k))
            for child in children.get(k, []):
                self._spawn(http, child, history.copy())  # its context: the parent's as of this answer

    @staticmethod
    def _history_tokens(history: _History) -> int:
        return len(history.ids)

    def finished(self, phase: str) -> int:
        return self._warm_done if phase == "warmup" else len(self.measured)

    def _record(self, rec: TurnOutput) -> None:
        self.turns.append(rec)
        self.measured.append(rec.out)
        if self.on_turn is not None:
            self.on_turn(rec)

    async def _send(self, http: aiohttp.ClientSession, sid: str, k: int, prompt: Any, output_len: int,
                    prompt_len: int) -> TurnOutput:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "stream": True, "stream_options": {"include_usage": True}}
        if cfg.is_chat:
            body["messages"], body["max_completion_tokens"] = prompt, output_len
        else:
            body["prompt"], body["max_tokens"] = prompt, output_len
        if cfg.ignore_eos:
            body["ignore_eos"] = True
        body.update(cfg.extra_body)
        headers = {"Content-Type": "application/json", "x-request-id": f"{sid}:{k}"}
        if cfg.session_header:
            headers[cfg.session_header] = sid
        out = RequestOutput(prompt_len=prompt_len, request_id=f"{sid}:{k}")
        rec = TurnOutput(out, sid, k)
        parts: list[str] = []
        payload = _ENCODE(body)
        lean = self._lean
        request = lean.build_post(self._path, payload, headers) if lean is not None else b""
        buf = b""
        done = failed = False
        seen = 0
        st = last = time.perf_counter()
        out.start_time = st

        def feed(chunk: bytes, now: float) -> bool:
            """The SSE messages of a read into ``rec``; True to stop (an error event)."""
            nonlocal buf, done, failed, seen, last
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                line = event.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                if not _take(_DECODE(data), rec, parts):
                    failed = True
                    return True
                if out.counted_tokens > seen:  # a token chunk
                    seen = out.counted_tokens
                    if out.ttft == 0.0:
                        out.ttft = now - st
                    else:
                        out.itl.append(now - last)
                    last = now
            return False

        self.in_flight += 1
        try:
            if lean is not None:
                exchange = lean.send(request, feed)
                # in this task (not wait_for's: before Python 3.12 that writes the request a loop turn after `st`)
                response = await (bounded(exchange, cfg.request_timeout_s, asyncio.get_running_loop())
                                  if cfg.request_timeout_s else exchange)
                if response.status != 200:
                    out.error = f"HTTP {response.status}: {response.error_body[:300].decode('utf-8', 'replace')}"
                    return rec
            else:
                url = cfg.base_url.rstrip("/") + self._path
                async with http.post(url, data=payload, headers=headers) as r:
                    if r.status != 200:
                        out.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                        return rec
                    async for chunk in r.content.iter_any():
                        if feed(chunk, time.perf_counter()):
                            break
        except asyncio.CancelledError:
            out.error = "cancelled"
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, HTTPError, OSError, ValueError) as exc:
            out.error = f"{type(exc).__name__}: {exc}"[:300]
            return rec
        finally:
            self.in_flight -= 1
            out.latency = last - st
            if not out.error and not done and not failed:
                out.error = "the stream ended without data: [DONE]"
            out.success = not out.error and out.ttft > 0
            rec.text = "".join(parts)
            out.generated_text_len = len(rec.text)
            if rec.server_prompt_tokens:
                out.prompt_len = rec.server_prompt_tokens
        return rec


def _take(msg: dict[str, Any], rec: TurnOutput, parts: list[str]) -> bool:
    """One SSE message into ``rec``; False for an error event (the request failed)."""
    out = rec.out
    if "error" in msg:
        err = msg["error"]
        out.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
        return False
    usage = msg.get("usage")
    if usage:
        out.output_tokens = int(usage.get("completion_tokens") or 0)
        rec.server_prompt_tokens = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            rec.cached_tokens = int(details["cached_tokens"])
    for choice in msg.get("choices") or []:
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        if text is None and choice.get("finish_reason") is None:
            continue  # the chat role chunk
        out.counted_tokens += 1
        if text:
            parts.append(text)
    return True


def run_sessions(config: SessionReplayConfig, sessions: Sequence[Session], *, filler: BlockTokens | None = None,
                 on_turn: Callable[[TurnOutput], None] | None = None) -> SessionReplayResult:
    return run_coroutine(SessionReplay(config, sessions, filler=filler, on_turn=on_turn).run(), "asyncio")


def _ms_stats(values: Sequence[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0, "mean_ms": 0.0, "median_ms": 0.0, "p99_ms": 0.0}
    a = np.asarray(values, dtype=float) * 1000
    return {"n": len(values), "mean_ms": float(a.mean()), "median_ms": float(np.median(a)),
            "p99_ms": float(np.percentile(a, 99))}


def session_metrics(result: SessionReplayResult) -> dict[str, Any]:
    """The ``sessions`` section of the report (see the module docstring)."""
    turns = result.turns
    ok = [t for t in turns if t.out.success]
    by_turn: dict[int, list[TurnOutput]] = {}
    for t in ok:
        by_turn.setdefault(t.turn, []).append(t)
    by_session: dict[str, list[TurnOutput]] = {}
    for t in turns:
        by_session.setdefault(t.session_id, []).append(t)
    durations = [max(t.out.start_time + t.out.latency for t in ts) - min(t.out.start_time for t in ts)
                 for ts in by_session.values() if all(t.out.success for t in ts)]
    planned = {s.session_id: len(s.turns) for s in result.sessions}
    completed = [sid for sid, ts in by_session.items()
                 if len(ts) == planned.get(sid, -1) and all(t.out.success for t in ts)]
    turn_counts = [sum(1 for t in ts if t.out.success) for ts in by_session.values()]
    reported = [t for t in ok if t.cached_tokens is not None]
    prompt_total = sum(t.out.prompt_len for t in ok)
    cached_total = sum(t.cached_tokens or 0 for t in reported)
    dur = result.duration_s
    per_turn = {}
    for k in sorted(by_turn):
        ts = by_turn[k]
        rep = [t.cached_tokens for t in ts if t.cached_tokens is not None]
        per_turn[str(k)] = {
            "requests": len(ts), "ttft": _ms_stats([t.out.ttft for t in ts]),
            "mean_prompt_tokens": float(np.mean([t.out.prompt_len for t in ts])),
            "mean_cached_tokens": float(np.mean(rep)) if rep else None}
    section: dict[str, Any] = {
        "sessions": len(result.sessions), "sessions_started": len(by_session),
        "sessions_completed": len(completed),
        "turns_planned": sum(planned.values()), "turns_completed": len(ok), "turns_failed": len(turns) - len(ok),
        "turns_per_session": {"mean": float(np.mean(turn_counts)) if turn_counts else 0.0,
                              "min": min(turn_counts, default=0), "max": max(turn_counts, default=0)},
        "session_duration": {k.replace("_ms", "_s"): (v / 1000 if k != "n" else v)
                             for k, v in _ms_stats(durations).items()},
        "ttft_by_turn": per_turn,
        "prompt_tokens": prompt_total,
        "cached_prompt_tokens": cached_total if reported else None,
        "cached_share": (cached_total / prompt_total if reported and prompt_total else None),
        "fresh_prompt_throughput": (prompt_total - cached_total) / dur,
        "reused_prompt_throughput": cached_total / dur,
        "max_late_s": max((t.late_s for t in turns), default=0.0),
    }
    before, after = result.metrics_before, result.metrics_after
    if before is not None and after is not None and _QUERIES in after:
        q = after[_QUERIES] - before.get(_QUERIES, 0.0)
        h = after.get(_HITS, 0.0) - before.get(_HITS, 0.0)
        section["server_prefix_cache"] = {"queries": q, "hits": h, "hit_rate": h / q if q > 0 else None}
    else:
        section["server_prefix_cache"] = None
    return section


def replay_report(result: SessionReplayResult, goodput_slos: dict[str, float] | None = None) -> dict[str, Any]:
    """The per-request metrics as every run reports them, plus the ``sessions`` section."""
    out = compute_metrics([t.out for t in result.turns], result.duration_s, goodput_slos=goodput_slos).to_result()
    out["sessions"] = session_metrics(result)
    return out


def detailed_turns(result: SessionReplayResult) -> dict[str, list[Any]]:
    """Per-request lists for ``requests/*.json`` (as ``metrics.detailed_lists``, plus the session's),
    and per session (``sessions``): its turns answered, duration, cached and prompt tokens."""
    ts = result.turns
    by_session: dict[str, list[TurnOutput]] = {}
    for t in ts:
        by_session.setdefault(t.session_id, []).append(t)
    per_session = {  # one entry per session that sent a request: turns answered, first start to last end
        "ids": list(by_session),
        "turns": [sum(t.out.success for t in g) for g in by_session.values()],
        "duration_s": [max(t.out.start_time + t.out.latency for t in g) - min(t.out.start_time for t in g)
                       for g in by_session.values()],
        "cached_tokens": [sum(t.cached_tokens or 0 for t in g) for g in by_session.values()],
        "prompt_tokens": [sum(t.out.prompt_len for t in g if t.out.success) for g in by_session.values()]}
    return {"sessions": per_session, "session_id": [t.session_id for t in ts], "turn": [t.turn for t in ts],
            "success": [t.out.success for t in ts], "error": [t.out.error for t in ts],
            "ttft": [t.out.ttft for t in ts], "latency": [t.out.latency for t in ts],
            "prompt_len": [t.out.prompt_len for t in ts], "output_tokens": [t.out.output_tokens for t in ts],
            "cached_tokens": [t.cached_tokens for t in ts], "start_time": [t.out.start_time for t in ts],
            "late_s": [t.late_s for t in ts]}


def summary_lines(section: dict[str, Any]) -> list[str]:
    """The sessions' lines of the run summary."""
    lines = [f"sessions: {section['sessions_completed']}/{section['sessions']} completed, "
             f"{section['turns_completed']} turns ({section['turns_failed']} failed), "
             f"turns/session mean {section['turns_per_session']['mean']:.1f}, "
             f"duration median {section['session_duration']['median_s']:.2f} s"]
    if section.get("cached_prompt_tokens") is not None:
        lines.append(f"prefix reuse: {section['cached_prompt_tokens']} of {section['prompt_tokens']} prompt tokens "
                     f"cached ({(section['cached_share'] or 0):.1%}); fresh {section['fresh_prompt_throughput']:.1f} "
                     f"tok/s, reused {section['reused_prompt_throughput']:.1f} tok/s")
    pc = section.get("server_prefix_cache")
    if pc and pc.get("hit_rate") is not None:
        lines.append(f"server prefix cache: hit rate {pc['hit_rate']:.1%} ({pc['hits']:.0f} of {pc['queries']:.0f} "
                     "queried tokens)")
    ttft = ", ".join(f"turn {k}: {v['ttft']['median_ms']:.1f} ms" for k, v in list(section["ttft_by_turn"].items())[:8])
    if ttft:
        lines.append(f"TTFT median by turn: {ttft}")
    return lines

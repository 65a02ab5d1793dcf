"""The built-in reference server: OpenAI-compatible HTTP in front of the continuous-batching
engine, with the routes a serving benchmark uses.

* ``GET /health``, ``GET /v1/models``;
* ``POST /v1/completions`` (``prompt``: text, token ids, or a one-element list of either) and
  ``POST /v1/chat/completions`` (``messages``, see ``engine.serve.tokenizer`` for the template),
  streamed as SSE ``data: {...}`` chunks (one token per chunk, the chat role chunk first, the
  usage chunk when ``stream_options.include_usage`` is true, then ``data: [DONE]``) or as one
  JSON response; ``max_tokens`` (chat also ``max_completion_tokens``, default: the rest of the
  context, as vLLM does), ``ignore_eos``. Sampling is greedy: ``temperature`` must be 0 or omitted, and ``n`` > 1 and
  ``logprobs`` are refused with 400 rather than ignored;
* ``POST /start_profile`` and ``POST /stop_profile``: torch.profiler (shapes recorded, CPU plus
  CUDA/HIP on a GPU) writing ``<host>_<pid>.<ms>.pt.trace.json.gz`` into the profiler directory
  (``--profiler-dir``, else ``$MAGPIE_SERVE_PROFILER_DIR``, else the config's ``profiler_dir``;
  without one these routes answer 400). The body may give ``num_steps`` (stop by itself after
  that many engine steps) and ``kernel_sites``: true (the default) names each registry kernel's
  call site in the trace and runs decode steps eagerly while the profiler runs; false profiles
  the steps as served (CUDA graphs, the next step queued ahead);
* ``GET /metrics``: the engine's counters in Prometheus text format (``engine.serve.metrics``);
* ``POST /reset_prefix_cache``: empty the prefix cache (as vLLM's route; 400 when it is off).

Prefix caching is on by default, as in vLLM (``--no-enable-prefix-caching``, config
``enable_prefix_caching: false`` turns it off; ``engine.serve.prefix_cache``): the usage of a
response gives ``prompt_tokens_details.cached_tokens``, the prompt tokens that were not prefilled
because their keys and values were cached.

On a GPU the decode steps are CUDA graph replays (``engine.serve.graphs``) unless ``--eager``
(config ``eager: true``); the graphs are captured before the ready line, with every kernel,
overrides included. A stats line is printed every ``stats_interval_s`` seconds while steps run (and a last one at
shutdown for the steps since).

``python -m engine.serve --config FILE | --model tiny [--host H] [--port N]`` prints one line
``magpie-serve ready: http://H:N ...`` when it accepts requests (``--port 0`` picks a free port
and the line says which), and stops on SIGTERM or SIGINT: unfinished requests end with an error
event, a running profile is written, the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, AsyncGenerator, Callable, Literal

import torch
from aiohttp import HttpVersion11, web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.config.yamlfile import ConfigError, format_loc, load_located_yaml
from engine.eventloop import EVENT_LOOPS, event_loop_name, run_coroutine
from engine.serve.engine import Engine, TokenEvent
from engine.serve.kernels import KernelError, check_triton_defaults, print_notes, resolve_kernels, triton_defaults_in_use
from engine.serve.metrics import CONTENT_TYPE, render
from engine.serve.model import LlamaModel, model_config
from engine.serve.tokenizer import StreamDecoder, chat_prompt, encode

PROFILER_DIR_ENV = "MAGPIE_SERVE_PROFILER_DIR"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ServeConfig(BaseModel):
    """The server YAML (every key optional; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = "tiny"
    model_overrides: dict[str, Any] = Field(default_factory=dict)
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_batch_size: int = Field(default=32, ge=1)
    max_prefill_tokens: int = Field(default=8192, ge=1)
    # Prompt + max_tokens cap and the length of every KV-cache slot (default: the model's max_seq_len).
    max_model_len: int | None = Field(default=None, ge=16)
    profiler_dir: str | None = None
    kernels: dict[str, str] = Field(default_factory=dict)
    # No CUDA graphs: every decode step runs eagerly (always so on the CPU).
    eager: bool = False
    # Batch sizes decode steps are padded to and captured at (default 1, 2, 4, ... up to max_batch_size).
    cuda_graph_batch_sizes: list[int] | None = None
    # On a GPU, Triton kernels as the defaults of rmsnorm, activation, rotary, decode_attention; false: PyTorch.
    triton_kernels: bool = True
    stats_interval_s: float = Field(default=10.0, ge=0)
    # The HTTP side's event loop: uvloop where installed (a dependency where it installs), else asyncio's.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # Prefix caching (vLLM's --enable-prefix-caching, on by default there too): blocks of
    # prefix_cache_block_size tokens, a pool of prefix_cache_blocks (default: a quarter of the KV
    # cache's tokens, on a GPU at most a quarter of its free memory), least recently used evicted.
    enable_prefix_caching: bool = True
    prefix_cache_block_size: int = Field(default=16, ge=1)
    prefix_cache_blocks: int | None = Field(default=None, ge=1)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


def load_serve_config(path: Path | str) -> ServeConfig:
    """Read a server YAML; ``ConfigError`` names file:line and the field. A relative
    ``profiler_dir`` is relative to the YAML file's folder."""
    located = load_located_yaml(path)
    data = located.data if located.data is not None else {}
    if not isinstance(data, dict):
        raise ConfigError([f"{located.path}: expected a mapping of server settings"])
    try:
        config = ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"{located.where(err['loc'])}: {format_loc(err['loc'])}: {err['msg']}"
                           for err in exc.errors()]) from None
    if config.profiler_dir and not Path(config.profiler_dir).is_absolute():
        config = config.model_copy(update={"profiler_dir": str(located.path.parent / config.profiler_dir)})
    return config


def build_engine(config: ServeConfig) -> Engine:
    """Model and engine from the config (``ValueError``/``KernelError`` for bad settings); the
    engine's warm-up runs every kernel once, and captures the decode graphs, so that a broken
    candidate fails here, not on a request."""
    device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available() else
                          "cpu" if config.device == "auto" else config.device)
    dtype = _DTYPES[config.dtype] if config.dtype != "auto" else torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        if device.index is None:  # "cuda": the current device, made explicit (set_device needs an index)
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # Triton launches and graph captures go to the current device
    shapes = model_config(config.model, **config.model_overrides)
    if config.max_model_len is not None and config.max_model_len > shapes.max_seq_len:
        raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's max_seq_len {shapes.max_seq_len} "
                         "(raise it with model_overrides: {max_seq_len: N})")
    kernels = resolve_kernels(config.kernels, device, config.triton_kernels)
    if triton_defaults_in_use(kernels):
        kernels = check_triton_defaults(kernels, shapes, device, dtype)
    print_notes(kernels)
    model = LlamaModel(shapes, device=device, dtype=dtype, kernels=kernels)
    engine = Engine(model, max_batch_size=config.max_batch_size, max_prefill_tokens=config.max_prefill_tokens,
                    max_model_len=config.max_model_len, cuda_graphs=not config.eager,
                    graph_batch_sizes=config.cuda_graph_batch_sizes, stats_interval_s=config.stats_interval_s,
                    prefix_caching=config.enable_prefix_caching, prefix_cache_blocks=config.prefix_cache_blocks,
                    prefix_block_size=config.prefix_cache_block_size)
    engine.warm_up()
    return engine


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _error(message: str, status: int) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _int_field(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadRequest(f"'{key}' must be an integer, got {value!r}")
    return value


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _completion_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or _is_token_ids(prompt[0])):
        prompt = prompt[0]  # the one-prompt batch forms ["text"] and [[ids]]
    if isinstance(prompt, str):
        return encode(prompt)
    if _is_token_ids(prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise _BadRequest("only one prompt per request is supported")
    raise _BadRequest("'prompt' must be a string or a list of token ids")


class _Handlers:
    def __init__(self, engine: Engine, config: ServeConfig, profiler_dir: Path | None) -> None:
        self.engine, self.config, self.profiler_dir = engine, config, profiler_dir
        self.created = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.config.name, "object": "model", "created": self.created, "owned_by": "magpie",
            "root": self.config.name, "max_model_len": self.engine.max_len}]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.engine.metrics()).encode(), headers={"Content-Type": CONTENT_TYPE})

    async def start_profile(self, request: web.Request) -> web.Response:
        if self.profiler_dir is None:
            return _error(f"profiling is off: start the server with --profiler-dir, ${PROFILER_DIR_ENV} "
                          "or profiler_dir in its config", 400)
        num_steps, kernel_sites = None, True
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return _error("the body of /start_profile must be JSON (optional: "
                              "{\"num_steps\": N, \"kernel_sites\": true|false})", 400)
            body = body if isinstance(body, dict) else {}
            num_steps, kernel_sites = body.get("num_steps"), body.get("kernel_sites", True)
            if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1):
                return _error(f"num_steps {num_steps!r}: expected a positive integer", 400)
            if not isinstance(kernel_sites, bool):
                return _error(f"kernel_sites {kernel_sites!r}: expected true or false", 400)
        try:
            path = await asyncio.wrap_future(self.engine.start_profile(self.profiler_dir, num_steps, kernel_sites))
        except RuntimeError as exc:
            return _error(str(exc), 400)
        return web.json_response({"status": "profiling", "trace": str(path), "num_steps": num_steps,
                                  "kernel_sites": kernel_sites})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        try:
            done = await asyncio.wrap_future(self.engine.reset_prefix_cache())
        except RuntimeError as exc:
            return _error(str(exc), 503)
        if not done:
            return _error("prefix caching is off (the server was started with --no-enable-prefix-caching)", 400)
        return web.Response(status=200)

    async def stop_profile(self, request: web.Request) -> web.Response:
        try:
            path = await asyncio.wrap_future(self.engine.stop_profile())
        except RuntimeError as exc:
            return _error(str(exc), 400)
        return web.json_response({"status": "stopped", "trace": str(path)})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("the request body is not valid JSON", 400)
        if not isinstance(body, dict):
            return _error("the request body must be a JSON object", 400)
        try:
            prompt, max_tokens, stream, include_usage = self._parse(body, chat)
            self.engine.validate(prompt, max_tokens)  # before any response: a bad request gets its 400
            ignore_eos = bool(body.get("ignore_eos", False))
        except _BadRequest as exc:
            return _error(str(exc), exc.status)
        except (ValueError, RuntimeError) as exc:
            return _error(str(exc), 400)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if stream:
            return await self._stream(request, prompt, max_tokens, ignore_eos, rid, chat, include_usage)
        async with contextlib.aclosing(self.engine.stream(prompt, max_tokens, ignore_eos)) as events:
            return await self._complete(events, rid, chat, len(prompt), self.engine.prefix_cache is not None)

    def _parse(self, body: dict[str, Any], chat: bool) -> tuple[list[int], int, bool, bool]:
        model = body.get("model")
        if model is not None and model != self.config.name:
            raise _BadRequest(f"The model `{model}` does not exist.", 404)
        if (_int_field(body, "n") or 1) != 1:
            raise _BadRequest("only n=1 is supported")
        if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
            raise _BadRequest("logprobs are not supported by the built-in server")
        temperature = body.get("temperature")
        if temperature is not None and (not isinstance(temperature, (int, float)) or temperature > 0):
            # Sampling is greedy; a request that asks for sampling must not be answered as if it got it.
            raise _BadRequest(f"temperature {temperature!r}: the built-in server samples greedily "
                              "(temperature 0 or omitted)")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise _BadRequest("'messages' must be a non-empty list of objects")
            prompt = encode(chat_prompt(messages))
            max_tokens = _int_field(body, "max_completion_tokens")
            if max_tokens is None:
                max_tokens = _int_field(body, "max_tokens")
        else:
            if "prompt" not in body:
                raise _BadRequest("'prompt' is required")
            prompt = _completion_prompt(body["prompt"])
            max_tokens = _int_field(body, "max_tokens")
        if max_tokens is None:
            max_tokens = self.engine.max_len - len(prompt)
        stream = bool(body.get("stream", False))
        options = body.get("stream_options")
        if options is not None and not stream:
            raise _BadRequest("stream_options can only be given when stream is true")
        if options is not None and not isinstance(options, dict):
            raise _BadRequest("'stream_options' must be an object")
        return prompt, max_tokens, stream, bool((options or {}).get("include_usage", False))

    def _chunk(self, rid: str, chat: bool, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
                "model": self.config.name, "choices": [choice]}

    def _token_head(self, rid: str, chat: bool, created: int) -> bytes:
        """The bytes of a token chunk before its JSON-quoted text, built once per request: a chunk
        per token is the hot path of a streaming benchmark, and json.dumps of the whole chunk
        costs more than the rest of it."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        return (f'data: {{"id":{json.dumps(rid)},"object":"{obj}","created":{created},"model":{json.dumps(self.config.name)},'
                f'"choices":[{{"index":0,' + ('"delta":{"content":' if chat else '"text":')).encode()

    @staticmethod
    def _token_tail(chat: bool, finish: str | None) -> bytes:
        """The bytes after a token chunk's text (what ``_chunk`` would give around it)."""
        return f'{"}" if chat else ""},"logprobs":null,"finish_reason":{json.dumps(finish)}}}]}}\n\n'.encode()

    async def _stream(self, request: web.Request, prompt: list[int], max_tokens: int, ignore_eos: bool, rid: str,
                      chat: bool, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if chat:
            await resp.write(_frame(self._chunk(rid, chat, None, None, role=True)))
        sse = _SSEStream(request, self._token_head(rid, chat, int(time.time())), lambda f: self._token_tail(chat, f))
        try:
            request_id = self.engine.listen(prompt, max_tokens, ignore_eos, sse.deliver)
        except RuntimeError as exc:  # the engine is shutting down: the headers are out, say it in the stream
            sse.pending.append(_error_frame(str(exc)))
            sse.failed = sse.finished = True
            request_id = None
        try:
            while True:
                await sse.wait()
                if sse.gone:  # the client went away: nothing more to write
                    return resp
                if sse.pending:
                    data, sse.pending = b"".join(sse.pending), []
                    await resp.write(data)
                    sse.direct = True  # aiohttp has written (headers and all): later tokens can go straight out
                if sse.finished and not sse.pending:
                    break
            if include_usage and not sse.failed:
                usage = self._chunk(rid, chat, None, None)
                usage["choices"] = []
                usage["usage"] = _usage(len(prompt), sse.completion_tokens,
                                        sse.cached_tokens if self.engine.prefix_cache is not None else None)
                await resp.write(_frame(usage))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            if request_id is not None and not sse.finished:
                self.engine.abort(request_id)

    async def _complete(self, events: AsyncGenerator[list[TokenEvent], None], rid: str, chat: bool,
                        prompt_tokens: int, caching: bool = False) -> web.Response:
        tokens: list[int] = []
        finish = None
        cached = 0
        decoder = StreamDecoder()
        async for batch in events:
            for ev in batch:
                if ev.token is None:
                    return _error(str(ev.error), 500)
                tokens.append(ev.token)
                finish = ev.finish_reason
                if ev.cached_tokens is not None:
                    cached = ev.cached_tokens
        text = "".join(decoder.feed(t) for t in tokens) + decoder.flush()
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": int(time.time()), "model": self.config.name, "choices": [choice],
                                  "usage": _usage(prompt_tokens, len(tokens), cached if caching else None)})


def _frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _error_frame(message: str) -> bytes:
    return _frame({"error": {"message": message, "type": "InternalServerError", "code": 500}})


class _SSEStream:
    """One streamed response's token chunks, formatted where the engine's events arrive (the
    event loop's drain, ``Engine.listen``) and written straight to the socket: no task is woken
    per token, the hot path of a streaming benchmark at high concurrency. The handler is woken
    only to write what could not go straight out (before aiohttp has sent the headers, or while
    the socket's buffer is full: backpressure through ``resp.write``), and at the end."""

    BUFFER_LIMIT = 64 * 1024  # bytes queued in the transport beyond which writes wait for the handler's drain

    def __init__(self, request: web.Request, head: bytes, tail: Callable[[str | None], bytes]) -> None:
        self.transport = request.transport
        self.chunked = request.version >= HttpVersion11  # no Content-Length: aiohttp frames HTTP/1.1 bodies as chunks
        self.head, self.tail, self.token_tail = head, tail, tail(None)
        self.decoder = StreamDecoder()
        self.pending: list[bytes] = []
        self.direct = False  # set once the handler's first write has gone through aiohttp
        self.finished = self.failed = self.gone = False
        self.completion_tokens = 0
        self.cached_tokens = 0
        self._waiter: asyncio.Future[None] | None = None

    def deliver(self, events: list[TokenEvent]) -> None:
        if self.finished or self.gone:
            return
        parts = []
        for ev in events:
            if ev.token is None:  # an error event: the only kind without a token
                parts.append(_error_frame(str(ev.error)))
                self.failed = self.finished = True
                break
            self.completion_tokens += 1
            if ev.cached_tokens is not None:
                self.cached_tokens = ev.cached_tokens
            if ev.finish_reason is None:
                parts.append(self.head + json.dumps(self.decoder.feed(ev.token)).encode() + self.token_tail)
            else:
                text = self.decoder.feed(ev.token) + self.decoder.flush()
                parts.append(self.head + json.dumps(text).encode() + self.tail(ev.finish_reason))
                self.finished = True
                break
        data = b"".join(parts)
        transport = self.transport
        if transport is None or transport.is_closing():
            self.gone = True
        elif self.direct and not self.pending and transport.get_write_buffer_size() < self.BUFFER_LIMIT:
            transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
            if not self.finished:
                return
        else:
            self.pending.append(data)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        """Until there is something for the handler to do."""
        if self.pending or self.finished or self.gone:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:  # OpenAI's field, as vLLM gives it
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


def make_app(engine: Engine, config: ServeConfig, profiler_dir: Path | None = None) -> web.Application:
    h = _Handlers(engine, config, profiler_dir)
    app = web.Application()
    app.add_routes([
        web.get("/health", h.health),
        web.get("/v1/models", h.models),
        web.post("/v1/completions", h.completions),
        web.post("/v1/chat/completions", h.chat_completions),
        web.post("/start_profile", h.start_profile),
        web.post("/stop_profile", h.stop_profile),
        web.post("/reset_prefix_cache", h.reset_prefix_cache),
        web.get("/metrics", h.metrics),
    ])
    return app


PARENT_PID_ENV = "MAGPIE_PARENT_PID"


async def _exit_with_parent(stop: asyncio.Event) -> None:
    """Stop when the process that launched us is gone (``$MAGPIE_PARENT_PID``): the server runs in
    a session of its own, so a SIGKILLed benchmark or loop could not stop it otherwise."""
    try:
        parent = int(os.environ.get(PARENT_PID_ENV, "0"))
    except ValueError:
        return
    if parent <= 1:
        return
    while not stop.is_set():
        if os.getppid() != parent:  # re-parented: the launcher died, whatever signal killed it
            print(f"magpie-serve: the launching process {parent} is gone; stopping", flush=True)
            stop.set()
            return
        await asyncio.sleep(0.5)


def _ready_line(engine: Engine, config: ServeConfig, port: int) -> str:
    m = engine.model
    overrides = ", ".join(f"{k}={v}" for k, v in m.kernels.sources.items() if k in config.kernels)
    triton = sorted(triton_defaults_in_use(m.kernels))
    defaults = f"defaults (Triton: {', '.join(triton)})" if triton else "defaults (PyTorch)"
    graphs = engine.decoder.graphs
    mode = (f"cuda_graphs={','.join(map(str, sorted(graphs)))}" if graphs else
            "cuda_graphs=off (" + ("eager" if config.eager else m.device.type) + ")")
    return (f"magpie-serve ready: http://{config.host}:{port} model={config.name} "
            f"({m.config.num_parameters() / 1e6:.1f}M parameters, {m.device.type} {str(m.dtype).removeprefix('torch.')}) "
            f"max_batch_size={engine.max_batch_size} {mode} kv_cache={engine.cache.num_slots}x{engine.max_len} tokens "
            f"({engine.cache.nbytes / 2**30:.2f} GiB) prefix_cache="
            f"{f'{engine.prefix_cache.num_blocks}x{engine.prefix_cache.block_size} tokens' if engine.prefix_cache else 'off'} "
            f"event_loop={event_loop_name(config.event_loop)} "
            f"kernels: {overrides + '; ' if overrides else ''}{defaults}")


async def serve(config: ServeConfig, profiler_dir: Path | None = None) -> None:
    """Run until SIGTERM/SIGINT; prints the ready line once the socket accepts requests."""
    # The engine thread and the HTTP thread share the GIL: a short switch interval bounds how
    # long a step that finished on the GPU waits for the HTTP thread to let go (default 5 ms).
    sys.setswitchinterval(0.0005)
    engine = build_engine(config)
    engine.start()
    runner = web.AppRunner(make_app(engine, config, profiler_dir), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watchdog = asyncio.ensure_future(_exit_with_parent(stop))
    print(_ready_line(engine, config, port), flush=True)
    try:
        await stop.wait()
    finally:
        watchdog.cancel()
        print("magpie-serve: shutting down", flush=True)
        await loop.run_in_executor(None, engine.stop)  # ends unfinished requests with an error event
        await runner.cleanup()


def _int_list(flag: str, text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError([f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4,8,16"]) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.serve", description="The built-in reference inference server.")
    ap.add_argument("--config", type=Path, help="server YAML (see examples/serve/); flags below override it")
    ap.add_argument("--model", help="model preset: tiny (CPU), 1b or 8b (GPU)")
    ap.add_argument("--served-model-name")
    ap.add_argument("--host")
    ap.add_argument("--port", type=int, help="0 picks a free port (the ready line names it)")
    ap.add_argument("--device", help="auto (cuda when available), cpu, cuda, cuda:N")
    ap.add_argument("--dtype", choices=["auto", *_DTYPES])
    ap.add_argument("--max-batch-size", type=int)
    ap.add_argument("--max-prefill-tokens", type=int, help="prompt tokens per step (longer prompts go in chunks)")
    ap.add_argument("--max-model-len", type=int, help="prompt + max_tokens cap, the length of every KV-cache slot")
    ap.add_argument("--seed", type=int, help="seed of the random weights")
    ap.add_argument("--eager", action="store_const", const=True, help="no CUDA graphs: every decode step eager")
    ap.add_argument("--cuda-graph-batch-sizes", metavar="N,N,...",
                    help="batch sizes decode steps are padded to and captured at (default 1,2,4,... up to max batch)")
    ap.add_argument("--stats-interval", dest="stats_interval_s", type=float, help="seconds between stats lines (0: none)")
    ap.add_argument("--event-loop", choices=list(EVENT_LOOPS),
                    help="the HTTP side's event loop (default auto: uvloop where installed)")
    ap.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                    help="cache the keys and values of repeated prompt prefixes (default on, as vLLM)")
    ap.add_argument("--prefix-cache-block-size", type=int, help="tokens per prefix-cache block (default 16)")
    ap.add_argument("--prefix-cache-blocks", type=int,
                    help="prefix-cache blocks kept, least recently used evicted (default: a quarter of the KV cache)")
    ap.add_argument("--profiler-dir", help=f"where /stop_profile writes traces (else ${PROFILER_DIR_ENV})")
    ap.add_argument("--kernel", action="append", default=[], metavar="KEY=PATH",
                    help="replace a registry kernel (rmsnorm, activation, rotary, attention, decode_attention) by the "
                         "function at PATH; "
                         "repeatable; over the config's kernels:")
    args = ap.parse_args(argv)
    try:
        config = load_serve_config(args.config) if args.config else ServeConfig()
        flags = {k: v for k, v in vars(args).items() if k not in ("config", "kernel", "seed") and v is not None}
        if args.seed is not None:
            flags["model_overrides"] = {**config.model_overrides, "seed": args.seed}
        if args.cuda_graph_batch_sizes is not None:
            flags["cuda_graph_batch_sizes"] = _int_list("--cuda-graph-batch-sizes", args.cuda_graph_batch_sizes)
        kernels = dict(config.kernels)
        for item in args.kernel:
            key, sep, path = item.partition("=")
            if not sep or not key or not path:
                raise ConfigError([f"--kernel {item!r}: expected KEY=PATH, e.g. rmsnorm=my_pkg.norms:rmsnorm"])
            kernels[key.strip()] = path.strip()
        config = ServeConfig.model_validate({**config.model_dump(), **flags, "kernels": kernels})
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    profiler_dir = args.profiler_dir or os.environ.get(PROFILER_DIR_ENV) or config.profiler_dir
    try:
        event_loop_name(config.event_loop)  # uvloop asked for and not installed: say so before loading a model
        run_coroutine(serve(config, Path(profiler_dir).resolve() if profiler_dir else None), config.event_loop)
    except (KernelError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

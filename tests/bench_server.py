"""A tiny OpenAI-compatible streaming server for load-generator tests and the overhead benchmark.

Behaviour is scripted per request (`Script`, or a function of the request's `x-request-id` and
body): delays before the first chunk and between chunks (against absolute deadlines, so sleep
jitter does not accumulate), tokens per chunk, empty chunks, the usage chunk on or off (also
running usage on every chunk), a mid-stream error event, an HTTP error status, a dropped
connection, no `[DONE]`. It records arrivals, the peak number of requests in flight, and, per
request id, the `perf_counter()` stamp taken just before each `choices` chunk is written (the
clock is system-wide on Linux, so a client in another process can compare against it).

In-process: `with BenchServer(Script(...)) as srv: srv.url`. As a process (for the overhead
benchmark): `python tests/bench_server.py --itl-ms 5` prints `PORT <n>`; `GET /stamps` returns
the stamps as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

logging.getLogger("aiohttp").setLevel(logging.CRITICAL)


@dataclass(frozen=True)
class Script:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    tokens: int | None = None  # None: the request's max_tokens
    tokens_per_chunk: int = 1
    empty_chunks_at: tuple[int, ...] = ()  # positions in the chunk sequence that carry no text
    usage: bool = True  # the final usage chunk, when the client asks for it
    continuous_usage: bool = False  # running usage on every content chunk (vLLM continuous_usage_stats)
    done: bool = True
    error_after_chunks: int | None = None
    close_after_chunks: int | None = None
    status: int = 200


ScriptFor = Callable[[str, dict], Script]


class BenchServer:
    def __init__(self, script: Script | ScriptFor = Script(), *, record_stamps: bool = True,
                 metrics_slots: int | None = None, nagle: bool = False) -> None:
        self.script_for: ScriptFor = script if callable(script) else (lambda _rid, _body: script)
        self.record_stamps = record_stamps
        # With a number: GET /metrics answers as vLLM does (requests running, waiting, KV-cache use as
        # the requests in flight over this many slots); None: no /metrics (404).
        self.metrics_slots = metrics_slots
        # Nagle's algorithm left on (asyncio turns it off): a small write waits while the one before
        # it is unacknowledged, as on a server that never set TCP_NODELAY.
        self.nagle = nagle
        self.stamps: dict[str, list[float]] = {}
        self.arrivals: list[tuple[str, float]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._switch_interval = 0.005

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stamps", self._stamps)
        if self.metrics_slots is not None:
            app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, _request: web.Request) -> web.Response:
        slots = self.metrics_slots or 1
        running = min(self.in_flight, slots)
        text = ("# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{engine=\"0\"}} {running}\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{engine=\"0\"}} {self.in_flight - running}\n"
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f"vllm:kv_cache_usage_perc{{engine=\"0\"}} {running / slots}\n")
        return web.Response(text=text, content_type="text/plain")

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake", "root": "fake"}]})

    async def _stamps(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stamps)

    async def start_async(self, port: int = 0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    # ---- background thread ------------------------------------------------------------------

    def __enter__(self) -> BenchServer:
        # The server thread shares the GIL with the client under test; the default 5 ms switch
        # interval would show up as 5 ms timing errors, so hand the GIL over faster while serving.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.start_async())
            ready.set()
            self._loop.run_forever()
            assert self._runner is not None
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="bench-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("bench server did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        sys.setswitchinterval(self._switch_interval)

    # ---- the streaming handler --------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        t_in = time.perf_counter()
        body = await request.json()
        rid = request.headers.get("x-request-id", "")
        self.arrivals.append((rid, t_in))
        script = self.script_for(rid, body)
        if script.status != 200:
            return web.json_response({"error": {"message": f"scripted status {script.status}",
                                                "type": "ServerError", "code": script.status}},
                                     status=script.status)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, rid, script, t_in)
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, body: dict, rid: str, script: Script,
                      t_in: float) -> web.StreamResponse:
        chat = "messages" in body
        n_tokens = script.tokens if script.tokens is not None else int(
            body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        prompt = body.get("prompt") if not chat else " ".join(str(m.get("content", "")) for m in body["messages"])
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if self.nagle and request.transport is not None:
            request.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        await resp.prepare(request)
        stamps: list[float] = []
        if self.record_stamps:
            self.stamps[rid] = stamps
        obj = "chat.completion.chunk" if chat else "text_completion"
        # Chunks are assembled from pre-encoded parts: json.dumps of a whole chunk per token would
        # make this server, not the client under test, the bottleneck of the overhead benchmark.
        head = ('data: {"id": %s, "object": "%s", "model": %s, "choices": [{"index": 0, '
                % (json.dumps(rid), obj, json.dumps(body.get("model")))).encode()
        sent_tokens = 0
        position = 0
        deadline = t_in + script.ttft_s
        while sent_tokens < n_tokens or position in script.empty_chunks_at:
            if script.error_after_chunks is not None and position == script.error_after_chunks:
                await resp.write(b'data: {"error": {"object": "error", "message": "scripted mid-stream error", '
                                 b'"type": "InternalServerError", "code": 500}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if script.close_after_chunks is not None and position == script.close_after_chunks:
                assert request.transport is not None
                request.transport.close()
                return resp
            wait = deadline - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            k = 0 if position in script.empty_chunks_at else min(script.tokens_per_chunk, n_tokens - sent_tokens)
            text = json.dumps("".join(f" t{sent_tokens + j}" for j in range(k)))
            sent_tokens += k
            last = sent_tokens >= n_tokens and (position + 1) not in script.empty_chunks_at
            if chat:
                role = '"role": "assistant", ' if position == 0 else ""
                field = f'"delta": {{{role}"content": {text}}}'
            else:
                field = f'"text": {text}'
            usage = ""
            if script.continuous_usage:
                usage = (f', "usage": {{"prompt_tokens": {prompt_tokens}, "completion_tokens": {sent_tokens}, '
                         f'"total_tokens": {prompt_tokens + sent_tokens}}}')
            finish = '"length"' if last else "null"
            data = head + f'{field}, "finish_reason": {finish}}}]{usage}}}\n\n'.encode()
            stamps.append(time.perf_counter())
            await resp.write(data)
            position += 1
            deadline += script.itl_s
        if want_usage and script.usage:
            final = {"prompt_tokens": prompt_tokens, "completion_tokens": sent_tokens,
                     "total_tokens": prompt_tokens + sent_tokens}
            await resp.write(b"data: " + json.dumps({"id": rid, "object": obj, "choices": [],
                                                     "usage": final}).encode() + b"\n\n")
        if script.done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    args = ap.parse_args()
    server = BenchServer(Script(ttft_s=args.ttft_ms / 1000, itl_s=args.itl_ms / 1000,
                                tokens_per_chunk=args.tokens_per_chunk))

    async def serve() -> None:
        await server.start_async(args.port)
        print(f"PORT {server.port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

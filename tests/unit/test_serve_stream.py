"""The built-in server's streamed responses, in process over real HTTP on loopback: token
chunks written straight to the socket from the engine's events, and the same bytes when every
chunk must wait for the handler (a full socket buffer: the backpressure path)."""

import json

import aiohttp
import pytest
from aiohttp import web

from engine.serve import server as serve_server
from engine.serve.server import ServeConfig, build_engine, make_app


@pytest.fixture(scope="module")
def engine():
    eng = build_engine(ServeConfig(model="tiny", eager=True, max_batch_size=4, stats_interval_s=0))
    eng.start()
    yield eng
    eng.stop()


async def _streams(engine, bodies: list[dict]) -> list[list[str]]:
    runner = web.AppRunner(make_app(engine, ServeConfig(model="tiny")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
    try:
        async with aiohttp.ClientSession() as s:
            out = []
            for body in bodies:
                async with s.post(url, json=body) as r:
                    assert r.status == 200
                    out.append([e for e in (await r.read()).decode().split("\n\n") if e])
            return out
    finally:
        await runner.cleanup()


def _payloads(events: list[str]) -> list:
    """Each SSE payload less what differs between two identical requests (id, created)."""
    out = []
    for e in events:
        assert e.startswith("data: ")
        body = e[6:] if e == "data: [DONE]" else json.loads(e[6:])
        if isinstance(body, dict):
            body.pop("id"), body.pop("created")
        out.append(body)
    return out


BODIES = [{"prompt": [3, 4, 5, 6], "max_tokens": 40, "stream": True, "ignore_eos": True},
          {"prompt": "hello there", "max_tokens": 25, "stream": True, "ignore_eos": True,
           "stream_options": {"include_usage": True}}]


async def test_a_full_socket_buffer_sends_the_same_stream_through_the_handler(engine, monkeypatch):
    straight_out: dict[int, list[bool]] = {}  # per stream, per delivery: did its chunk go straight to the socket?
    real = serve_server._SSEStream.deliver

    def deliver(self, events):
        real(self, events)
        straight_out.setdefault(id(self), []).append(self.pending == [] and not self.finished)
    monkeypatch.setattr(serve_server._SSEStream, "deliver", deliver)
    direct = await _streams(engine, BODIES)
    # Chunks wait for the handler until it has sent the headers, and again whenever the client
    # reads slowly enough that the socket's write buffer passes the limit (how often depends on
    # the machine's load); the others go straight out, and with the limit at 0 none does.
    for flags in straight_out.values():
        assert any(flags[:-1]), flags
    straight_out.clear()
    monkeypatch.setattr(serve_server._SSEStream, "BUFFER_LIMIT", 0)  # every chunk: "the buffer is full"
    queued = await _streams(engine, BODIES)
    assert straight_out and not any(any(f) for f in straight_out.values())  # nothing went straight out: all through resp.write
    assert len(direct[0]) == 41 and len(direct[1]) == 27  # tokens, (usage), [DONE]
    assert [_payloads(d) for d in direct] == [_payloads(q) for q in queued]
    assert json.loads(queued[1][-2][6:])["usage"]["completion_tokens"] == 25


def test_listen_hands_each_listener_its_own_events_in_the_loop(engine):
    import asyncio

    async def go():
        got: dict[int, list] = {0: [], 1: []}
        done = asyncio.Event()

        def listener(i):
            def on_events(events):
                got[i].extend(events)
                if len([e for k in got for e in got[k] if e.finish_reason]) == 2:
                    done.set()
            return on_events
        engine.listen([1, 2, 3], 5, True, listener(0))
        engine.listen([9, 8], 7, True, listener(1))
        await asyncio.wait_for(done.wait(), 60)
        return got

    got = asyncio.run(go())
    assert [len(got[0]), len(got[1])] == [5, 7]
    assert [e.finish_reason for e in got[1]] == [None] * 6 + ["length"]

"""The lean client ACKs every second streamed token, and only where the server was seen not to wait
for ACKs: counted from the client socket's own TCP counters against real servers on 127.0.0.1."""

import asyncio
import socket
import struct

import pytest
from bench_server import BenchServer, Script

from engine.bench.dataset import SampleRequest
from engine.bench.http_client import StreamingHTTPClient
from engine.bench.loadgen import LoadGenConfig, LoadGenerator
from engine.bench.session_replay import SessionReplay, SessionReplayConfig
from engine.bench.sessions import BlockTokens, synthetic_sessions
from engine.eventloop import c_loop_turn, run_coroutine

pytestmark = pytest.mark.skipif(not c_loop_turn(), reason="the ACK setting is the C loop turn's (engine/_streamread.c)")

TOKENS = 40
# The first token after 250 ms, longer than the kernel's delayed-ACK timer can be (40-200 ms): a
# keep-alive client that sent its request right after a response is "interactive" to the kernel,
# which then ACKs every second small segment by itself, until that timer fires while the client
# waits for the first token; from then on it ACKs each token as it is read. Then a token every 4 ms,
# well inside the timer, so on a server that does not wait for ACKs it need not fire again.
SCRIPT = Script(ttft_s=0.25, itl_s=0.004, tokens=TOKENS)
BODY = b'{"model": "m", "prompt": "hello", "max_tokens": 40, "stream": true}'


def _counters(sock) -> tuple[int, int]:
    """The socket's segments sent (ACKs included) and data segments received: struct tcp_info's
    tcpi_segs_out and tcpi_data_segs_in (Linux 4.6+)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160)
    return struct.unpack_from("I", info, 136)[0], struct.unpack_from("I", info, 152)[0]


async def _two_requests(url: str, try_first: bool) -> tuple[bool | None, int, int]:
    """One connection: a first request (tried, when `try_first`), then a second one measured by the
    socket's counters. Returns what the client concluded and the second request's segments out and
    data segments in."""
    client = StreamingHTTPClient(url)
    try:
        request = client.build_post("/v1/completions", BODY, {"Content-Type": "application/json"})
        await client.open_connections(1)
        client.try_acks = try_first
        first = await client.send(request, lambda _data, _stamp: None)
        client.try_acks = False
        assert first.status == 200
        (conn,) = client._idle
        sock = conn.transport.get_extra_info("socket")
        out0, in0 = _counters(sock)
        second = await client.send(request, lambda _data, _stamp: None)
        assert second.status == 200 and client._idle == [conn]  # the same connection, kept alive
        await asyncio.sleep(0.1)  # any delayed ACK of the last token goes out before the counters are read
        out1, in1 = _counters(sock)
        return client.halved_acks, out1 - out0, in1 - in0
    finally:
        await client.close()


def _run(url: str, try_first: bool) -> tuple[bool | None, int, int]:
    return run_coroutine(_two_requests(url, try_first), "asyncio", reads_streams=True)


def test_a_server_that_sends_each_token_at_once_gets_every_second_token_acked():
    with BenchServer(SCRIPT) as srv:
        halved, sent, received = _run(srv.url, try_first=False)
        # Not tried: the kernel's default, an ACK for each token as it is read.
        assert halved is None and received >= TOKENS and sent >= TOKENS - 2, (sent, received)
        # A busy machine can make one try see the delayed-ACK timer fire first (then the client stays
        # with an ACK per token): of three fresh clients, at least one sees the server not wait.
        for _ in range(3):
            halved, sent, received = _run(srv.url, try_first=True)
            if halved:
                break
        assert halved is True
        # The request after the try: one segment (the request) and an ACK for about every second token.
        assert received >= TOKENS and sent <= TOKENS // 2 + 6, (sent, received)


def test_a_nagle_server_keeps_an_ack_for_each_token():
    """A server whose next small write waits for the client's ACK of the last: the try sees an ACK
    go out before a second token arrives, and the client never halves the ACKs there (which would
    hold each token of such a server until the kernel's 40 ms delayed-ACK timer)."""
    with BenchServer(SCRIPT, nagle=True) as srv:
        for _ in range(2):
            halved, sent, received = _run(srv.url, try_first=True)
            assert halved is False
            assert received >= TOKENS - 2 and sent >= TOKENS - 2, (sent, received)


def _load(url: str, warmups: int) -> bool | None:
    requests = [SampleRequest(prompt="hello world", prompt_len=2, output_len=TOKENS, request_id=f"r{i}")
                for i in range(8)]
    config = LoadGenConfig(base_url=url, model="m", max_concurrency=4, num_warmups=warmups, event_loop="asyncio")
    result = run_coroutine(LoadGenerator(config, requests).run(), "asyncio", reads_streams=True)
    assert len(result.outputs) == 8 and all(o.success for o in result.outputs)
    return result.halved_acks


def test_the_load_generator_tries_on_its_warm_up_only():
    with BenchServer(SCRIPT) as fast, BenchServer(SCRIPT, nagle=True) as nagle:
        assert _load(fast.url, warmups=0) is None  # no request it does not measure: never tried
        assert any(_load(fast.url, warmups=2) for _ in range(3))
        assert _load(nagle.url, warmups=2) is False


def _replay(url: str) -> bool | None:
    blocks = BlockTokens(1000)
    sessions = synthetic_sessions(2, 2, blocks=blocks, input_len=16, output_len=TOKENS)
    config = SessionReplayConfig(url, "m", mode="closed", max_concurrency=2, num_warmups=2)
    result = run_coroutine(SessionReplay(config, sessions, filler=blocks).run(), "asyncio", reads_streams=True)
    assert len(result.turns) == 4 and all(t.out.success for t in result.turns)
    return result.halved_acks


def test_a_session_replay_tries_on_its_warm_up():
    with BenchServer(SCRIPT) as fast, BenchServer(SCRIPT, nagle=True) as nagle:
        assert any(_replay(fast.url) for _ in range(3))
        assert _replay(nagle.url) is False


def test_a_try_that_meets_slow_tokens_does_not_keep_the_next_from_proving():
    """Tokens slower than the delayed-ACK timer look like a server that waits for ACKs (an ACK goes
    out before the next token): such a try leaves `halved_acks` False, and the next request the
    caller lets try still can prove the server does not wait."""
    slow = Script(ttft_s=0.25, itl_s=0.12, tokens=5)

    async def two(url: str) -> list[bool | None]:
        client = StreamingHTTPClient(url)
        seen = []
        try:
            client.try_acks = True
            for rid in ("slow", "fast"):
                request = client.build_post("/v1/completions", BODY, {"Content-Type": "application/json",
                                                                      "x-request-id": rid})
                assert (await client.send(request, lambda _data, _stamp: None)).status == 200
                seen.append(client.halved_acks)
        finally:
            await client.close()
        return seen

    with BenchServer(lambda rid, _body: slow if rid == "slow" else SCRIPT) as srv:
        for _ in range(3):
            seen = run_coroutine(two(srv.url), "asyncio", reads_streams=True)
            assert seen[0] is False
            if seen[1]:
                break
        assert seen[1] is True

"""The lean HTTP client: its response parser on every way a response can be split into reads,
and the client against real servers on 127.0.0.1 (keep-alive, closes, retries, TLS)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from engine.bench.http_client import HTTPError, ResponseParser, StreamingHTTPClient
from engine.eventloop import stream_selector

SSE = b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n'


def chunked(*parts: bytes, ext: bool = False, trailer: bool = False) -> bytes:
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if ext else b"", p) for p in parts)
    return body + b"0\r\n" + (b"X-Trailer: t\r\n" if trailer else b"") + b"\r\n"


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

RESPONSES = {
    "chunked": (HEAD_CHUNKED + chunked(SSE[:20], SSE[20:]), 200, SSE, True),
    "chunked with extensions and trailers": (HEAD_CHUNKED + chunked(b"hello ", b"world", ext=True, trailer=True),
                                             200, b"hello world", True),
    "content-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world", 200, b"hello world", True),
    "interim 100 first": (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                          200, b"ok", True),
    "connection close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", False),
    "http/1.0": (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", False),
    "no content": (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", True),
    "error status": (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy", 503, b"", True),
}


def feed_in_reads(raw: bytes, cuts: list[int]) -> tuple[ResponseParser, bytes, list[float]]:
    got: list[bytes] = []
    stamps: list[float] = []

    def sink(data: bytes, now: float) -> None:
        got.append(data)
        stamps.append(now)

    p = ResponseParser(sink)
    bounds = [0, *cuts, len(raw)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        p.feed(raw[a:b], float(i))
    return p, b"".join(got), stamps


@pytest.mark.parametrize("name", RESPONSES)
def test_parser_gives_the_same_response_however_the_bytes_are_split(name):
    raw, status, body, keep = RESPONSES[name]
    splits = [[]] + [[i] for i in range(1, len(raw))] + [list(range(1, len(raw)))]  # whole, every cut, byte by byte
    for cuts in splits:
        p, got, stamps = feed_in_reads(raw, cuts)
        assert p.done, (name, cuts)
        assert p.response is not None and p.response.status == status
        assert got == body, (name, cuts)
        assert p.keep_alive is keep
        assert stamps == sorted(stamps)  # each delivery carries the stamp of the read that completed it
    if status == 503:
        p, _, _ = feed_in_reads(raw, [])
        assert p.response is not None and p.response.error_body == b"busy" and p.response.reason == "Service Unavailable"


def test_parser_delivers_each_read_once_with_its_stamp():
    raw = HEAD_CHUNKED + chunked(b"aa", b"bb", b"cc")
    cut1, cut2 = raw.index(b"2\r\nbb"), raw.index(b"2\r\ncc")
    p, got, stamps = feed_in_reads(raw, [cut1, cut2])
    assert got == b"aabbcc" and stamps == [0.0, 1.0, 2.0] and p.done


def test_body_until_close_ends_at_eof_and_a_cut_body_is_an_error():
    p, got, _ = feed_in_reads(b"HTTP/1.1 200 OK\r\n\r\nstreamed till close", [])
    assert not p.done and got == b"streamed till close"
    p.eof()
    assert p.done and not p.keep_alive
    for raw in (HEAD_CHUNKED + b"5\r\nhel", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhel", b"HTTP/1.1 20"):
        p, _, _ = feed_in_reads(raw, [])
        with pytest.raises(HTTPError, match="connection closed"):
            p.eof()


@pytest.mark.parametrize("raw, message", [
    (b"HTTX/1.1 200 OK\r\n\r\n", "bad status line"),
    (b"HTTP/1.1 2x0 OK\r\n\r\n", "bad status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
    (HEAD_CHUNKED + b"zz\r\nhello\r\n", "bad chunk-size"),
    (HEAD_CHUNKED + b"2\r\nhelloX", "not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "bad Content-Length"),
])
def test_parser_rejects_malformed_responses(raw, message):
    with pytest.raises(HTTPError, match=message):
        ResponseParser(lambda _d, _t: None).feed(raw, 0.0)


def test_bytes_after_the_response_make_the_connection_unusable():
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"
    p, got, _ = feed_in_reads(raw, [])
    assert p.done and got == b"ok" and not p.keep_alive


# ---- the client against real servers ----------------------------------------------------------


class RawServer:
    """An asyncio TCP server on 127.0.0.1 whose replies the test scripts: `reply(n_conn, n_req, request)`
    returns the bytes to send (None: close without answering)."""

    def __init__(self, reply, ssl_ctx: ssl.SSLContext | None = None) -> None:
        self.reply = reply
        self.ssl = ssl_ctx
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                n += 1
                out = self.reply(conn, n, request)
                if out is None:
                    break
                for piece in out if isinstance(out, list) else [out]:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
                if b"Connection: close" in out if isinstance(out, bytes) else False:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (extra, len(body), body)


async def post(client: StreamingHTTPClient, path: str = "/v1/completions", stop_after: int | None = None):
    got: list[tuple[bytes, float]] = []

    def sink(data: bytes, now: float) -> bool:
        got.append((data, now))
        return stop_after is not None and len(got) >= stop_after

    resp = await client.post(path, b'{"x": 1}', {"Content-Type": "application/json"}, sink)
    return resp, got


async def test_connections_are_kept_alive_and_reused():
    async with RawServer(lambda c, n, r: ok(b"reply %d" % n)) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}/base/") as client:
            bodies = [b"".join(d for d, _ in (await post(client))[1]) for _ in range(5)]
            together = await asyncio.gather(*(post(client) for _ in range(3)))
    assert bodies == [b"reply %d" % n for n in range(1, 6)]
    assert all(r.status == 200 for r, _ in together)
    assert srv.connections == 3  # one for the five in a row, two more for three at once
    first = srv.requests[0]
    assert first.startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
    assert b"\r\nHost: 127.0.0.1:%d\r\n" % srv.port in first and b"Content-Length: 8\r\n" in first
    assert first.endswith(b'\r\n\r\n{"x": 1}')


async def test_a_closing_response_is_not_reused():
    async with RawServer(lambda c, n, r: ok(extra=b"Connection: close\r\n")) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
            for _ in range(3):
                resp, _ = await post(client)
                assert resp.status == 200
    assert srv.connections == 3


async def test_a_kept_alive_connection_the_server_dropped_is_retried_once():
    # The server answers the first request, then drops the connection when the second arrives on it
    # (the race of a keep-alive timeout); on a fresh connection it answers again.
    async with RawServer(lambda c, n, r: ok() if n == 1 else None) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
            assert (await post(client))[0].status == 200
            assert (await post(client))[0].status == 200
    assert srv.connections == 2 and len(srv.requests) == 3


async def test_a_fresh_connection_closed_without_an_answer_fails():
    async with RawServer(lambda c, n, r: None) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
            with pytest.raises(HTTPError, match="before the response head"):
                await post(client)
    assert srv.connections == 1  # no retry: the request may have been acted on


async def test_streamed_body_arrives_per_read_with_rising_stamps_and_can_be_stopped():
    pieces = [HEAD_CHUNKED, b"3\r\none\r\n", b"3\r\ntwo\r\n", b"5\r\nthree\r\n", b"0\r\n\r\n"]
    async with RawServer(lambda c, n, r: pieces) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            resp, got = await post(client)
            assert resp.status == 200 and [d for d, _ in got] == [b"one", b"two", b"three"]
            stamps = [t for _, t in got]
            assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 0.015  # 10 ms apart on the wire
            assert loop.time() - t0 < 5
            resp, got = await post(client, stop_after=1)  # on the kept-alive connection
            assert [d for d, _ in got] == [b"one"]
            assert srv.connections == 1
            resp, got = await post(client)
            assert resp.status == 200 and len(got) == 3
    assert srv.connections == 2  # the stopped response closed its connection


async def test_error_status_keeps_the_body():
    reply = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 12\r\n\r\nit went bad!"
    async with RawServer(lambda c, n, r: reply) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
            resp, got = await post(client)
    assert (resp.status, resp.reason, resp.error_body, got) == (500, "Internal Server Error", b"it went bad!", [])


async def test_unreachable_server_raises_oserror():
    async with RawServer(lambda c, n, r: ok()) as srv:
        port = srv.port
    async with StreamingHTTPClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(OSError):
            await post(client)


async def test_cancelling_a_request_closes_its_connection():
    async with RawServer(lambda c, n, r: [HEAD_CHUNKED, b"1\r\na\r\n"] + [b"1\r\nb\r\n"] * 100) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
            task = asyncio.create_task(post(client))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not client._idle and not client._open


def test_bad_base_urls_are_refused():
    with pytest.raises(ValueError, match="scheme must be http or https"):
        StreamingHTTPClient("ftp://127.0.0.1:1")
    with pytest.raises(ValueError, match="has no host"):
        StreamingHTTPClient("http://:80")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_https(tmp_path: Path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with RawServer(lambda c, n, r: ok(b"secret"), ssl_ctx=server_ctx) as srv:
        async with StreamingHTTPClient(f"https://127.0.0.1:{srv.port}", ssl_context=client_ctx) as client:
            resp, got = await post(client)
            resp2, _ = await post(client)
    assert resp.status == resp2.status == 200 and b"".join(d for d, _ in got) == b"secret"
    assert srv.connections == 1


def test_kept_reads_of_whole_chunks_parse_as_the_general_parser_does():
    from engine.bench.http_client import ResponseParser

    def chunk(p: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(p), p)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    reads = [chunk(b"data: 1\n\n"), chunk(b"data: 2\n\n") + chunk(b"data: 3\n\n"), chunk(b"x;y") + b"0\r\n\r\n"]
    general: list[tuple[bytes, float]] = []
    p1 = ResponseParser(lambda d, t: general.append((d, t)))
    p1.feed(head, 0.0)
    for i, r in enumerate(reads):
        p1.feed(r, float(i + 1))
    batched: list[tuple[bytes, float]] = []
    p2 = ResponseParser(lambda d, t: batched.append((d, t)),
                        on_bodies=lambda ps, ts: batched.extend(zip(ps, ts)) and None)
    p2.feed(head, 0.0)
    p2.feed_reads(reads, [1.0, 2.0, 3.0])
    assert p1.done and p2.done and p2.keep_alive
    assert batched == general == [(b"data: 1\n\n", 1.0), (b"data: 2\n\ndata: 3\n\n", 2.0), (b"x;y", 3.0)]
    # a read that is not whole chunks goes the general way
    p3 = ResponseParser(lambda d, t: None, on_bodies=lambda ps, ts: None)
    p3.feed(head, 0.0)
    p3.feed_reads([b"5\r\nab", b"cde\r\n0\r\n\r\n"], [1.0, 2.0])
    assert p3.done


def _chunk(p: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(p), p)


_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("reads", [
    [_chunk(b"data: %d\n\n" % i) for i in range(8)] + [b"0\r\n\r\n"],
    # a size line with an extension, among single chunks: the whole-response short cut does not apply
    [_chunk(b"a"), b"1;x=y\r\nb\r\n", _chunk(b"c"), _chunk(b"d") + b"0\r\n\r\n"],
    # the response ends in the middle: what follows is not this response's
    [_chunk(b"a"), _chunk(b"b"), b"0\r\n\r\n", _chunk(b"c"), _chunk(b"d")],
    # a read that is a chunk and a half, then the rest
    [_chunk(b"a"), _chunk(b"b") + b"3\r\nxy", b"z\r\n", _chunk(b"e"), b"0\r\n\r\n"],
])
def test_many_kept_reads_parse_as_the_general_parser_does(reads):
    stamps = [float(i + 1) for i in range(len(reads))]
    general: list[tuple[bytes, float]] = []
    p1 = ResponseParser(lambda d, t: general.append((d, t)))
    p1.feed(_HEAD, 0.0)
    for r, t in zip(reads, stamps):
        if p1.done:
            break
        p1.feed(r, t)
    batched: list[tuple[bytes, float]] = []
    p2 = ResponseParser(lambda d, t: batched.append((d, t)), on_bodies=lambda ps, ts: batched.extend(zip(ps, ts)) and None)
    p2.feed(_HEAD, 0.0)
    p2.feed_reads(reads, stamps)
    assert p2.done and batched == general
    assert p2.keep_alive == (reads[-1].endswith(b"0\r\n\r\n") and b"0\r\n\r\n" not in b"".join(reads[:-1]))


def _outcome(feed_all) -> tuple[str, list[tuple[bytes, float]]]:
    got: list[tuple[bytes, float]] = []
    try:
        feed_all(got)
    except HTTPError as exc:
        return f"HTTPError: {exc}", got
    return "ok", got


@pytest.mark.parametrize("bad", [b"9\r\nabc\r\n", b"zz\r\nabc\r\n", b"3\r\nabcXY"])
def test_a_wrong_chunk_among_many_ends_as_in_the_general_parser(bad):
    reads = [_chunk(b"a"), _chunk(b"b"), bad, _chunk(b"c"), b"0\r\n\r\n"]

    def general(got):
        p = ResponseParser(lambda d, t: got.append((d, t)))
        p.feed(_HEAD, 0.0)
        for r in reads:
            p.feed(r, 1.0)

    def batched(got):
        p = ResponseParser(lambda d, t: got.append((d, t)), on_bodies=lambda ps, ts: got.extend(zip(ps, ts)) and None)
        p.feed(_HEAD, 0.0)
        p.feed_reads(reads, [1.0] * len(reads))
    want = _outcome(general)
    assert _outcome(batched) == want
    if bad != b"9\r\nabc\r\n":  # a size too large swallows the next chunk's framing instead
        assert want[0].startswith("HTTPError")


_LINE = (b"data: ", b"\n\n")


def _event_chunk(message: bytes) -> bytes:
    return _chunk(b"data: " + message + b"\n\n")


def _framed_reads(size: int) -> list[bytes]:
    """Reads of one event chunk each, with messages of `size` bytes and the two lengths either side."""
    return [_event_chunk(b"m" * n) for n in (size - 1, size, size + 1)]


_FRAMED_CASES = [
    ([_event_chunk(b"%d" % i) for i in range(8)] + [b"0\r\n\r\n"], True),
    # the size line grows a digit in the middle of the response (0xff -> 0x100 bytes of data)
    (_framed_reads(255 - 8) + _framed_reads(256 - 8) + [b"0\r\n\r\n"], True),
    (_framed_reads(4095 - 8) + _framed_reads(4096 - 8) + [b"0\r\n\r\n"], True),
    # size lines servers may write that the short cut does not rebuild: the general parser reads them
    ([_event_chunk(b"a"), b"A\r\ndata: bb\n\n\r\n", _event_chunk(b"c"), b"0\r\n\r\n"], False),
    ([_event_chunk(b"a"), b"0a\r\ndata: bb\n\n\r\n", _event_chunk(b"c"), b"0\r\n\r\n"], False),
    ([_event_chunk(b"a"), b"a;x=y\r\ndata: bb\n\n\r\n", _event_chunk(b"c"), b"0\r\n\r\n"], False),
    # the last read: messages and the end (how the scheduled server writes its last token, usage, [DONE])
    ([_event_chunk(b"%d" % i) for i in range(6)] + [_event_chunk(b"u") + _event_chunk(b"[DONE]") + b"0\r\n\r\n"], True),
    ([_event_chunk(b"%d" % i) for i in range(6)] + [_event_chunk(b"u") + _event_chunk(b"v")], True),
    # a last read the short cut does not take: its body goes the batched way, at its own stamp
    ([_event_chunk(b"%d" % i) for i in range(6)] + [_chunk(b"data:u\n\n") + b"0\r\n\r\n"], True),
    ([_event_chunk(b"%d" % i) for i in range(6)] + [_event_chunk(b"u") + b"0\r\n\r\nxx"], True),
    # chunks that are not one framed message each
    ([_event_chunk(b"a"), _chunk(b"data:bb\n\n"), _event_chunk(b"c"), b"0\r\n\r\n"], False),
    ([_event_chunk(b"a"), _chunk(b"data: bb\n"), _chunk(b"\n"), _event_chunk(b"c"), b"0\r\n\r\n"], False),
    ([_event_chunk(b"a"), _event_chunk(b"b") + _event_chunk(b"c"), _event_chunk(b"d"), b"0\r\n\r\n"], False),
    ([_event_chunk(b"a"), _event_chunk(b"b")[:5], _event_chunk(b"b")[5:], b"0\r\n\r\n"], False),
]


@pytest.mark.parametrize("reads, framed", _FRAMED_CASES)
def test_reads_of_one_framed_message_each_parse_as_the_general_parser_does(reads, framed):
    """The messages on_framed gets, framed again, are the bodies the general parser gives, read
    for read, and the short cut is taken exactly where every read but the last is one such chunk."""
    stamps = [float(i + 1) for i in range(len(reads))]
    general: list[tuple[bytes, float]] = []
    p1 = ResponseParser(lambda d, t: general.append((d, t)))
    p1.feed(_HEAD, 0.0)
    for r, t in zip(reads, stamps):
        p1.feed(r, t)
    got: list[tuple[bytes, float]] = []
    calls: list[int] = []

    def on_framed(messages, at):
        calls.append(len(messages))
        got.extend((_LINE[0] + m + _LINE[1], t) for m, t in zip(messages, at))
    p2 = ResponseParser(lambda d, t: got.append((d, t)), on_bodies=lambda ps, ts: got.extend(zip(ps, ts)) and None,
                        on_framed=on_framed, framing=_LINE)
    p2.feed(_HEAD, 0.0)
    p2.feed_reads(reads, stamps)
    assert p1.done == p2.done and p1.keep_alive == p2.keep_alive and _by_read(got) == _by_read(general)
    last = ResponseParser(lambda d, t: None, on_framed=lambda ms, ts: None, framing=_LINE).framed.last(reads[-1])
    assert calls == ([len(reads) - 1 + (len(last[0]) if last else 0)] if framed else [])


def _kept_kinds() -> list:
    from engine import eventloop
    return [pytest.param(eventloop.PyKept, id="PyKept"),
            pytest.param(eventloop._CKept, id="C", marks=pytest.mark.skipif(eventloop._CKept is None, reason="not built"))]


_WRONG_CHUNKS = [b"9\r\ndata: bb\n\n\r\n", b"b\r\ndata: bb\n\n\r\n", b"\n\n\r\n", b"x", b"9\r\nabc\r\n", b"zz\r\nabc\r\n",
                 b"3\r\nabcXY", b"10000000000000000\r\ndata: bb\n\n\r\n", b"1;x=y\r\nb\r\n", b"0\r\n\r\n"]


@pytest.mark.parametrize("kept_class", _kept_kinds())
@pytest.mark.parametrize("reads", [r for r, _f in _FRAMED_CASES] + [
    [_event_chunk(b"a"), bad, _event_chunk(b"c"), _event_chunk(b"d"), b"0\r\n\r\n"] for bad in _WRONG_CHUNKS] + [
    [_event_chunk(b"a"), _event_chunk(b"[DONE]") + b"0\r\n\r\n"],  # few reads, the end in the last
    [b"0\r\n\r\n"],  # nothing but the end
    [_event_chunk(b"a") + b"0\r\n\r\n" + _event_chunk(b"b")],  # the end, then bytes that are not this body's
    [_event_chunk(b"a"), _event_chunk(b"b") + b"0\r\n\r\n", _event_chunk(b"c")],  # the end in the middle
    [_event_chunk(b"a"), b"0\r\nX-Trailer: 1\r\n\r\n"],  # trailers
    [_event_chunk(b"a"), b""],
])
def test_kept_reads_taken_framed_parse_as_the_general_parser_does(reads, kept_class):
    """`ResponseParser.feed_kept` (the C Kept's framing in one pass where it applies, else the reads
    taken back) gives what the general parser gives read by read: bodies at their reads' stamps,
    the end, whether the connection may be kept, the same error."""
    stamps = [float(i + 1) for i in range(len(reads))]

    def general(got):
        p = ResponseParser(lambda d, t: got.append((d, t)))
        p.feed(_HEAD, 0.0)
        for r, t in zip(reads, stamps):
            if r:
                p.feed(r, t)
        got.append((b"done" if p.done else b"open", float(p.keep_alive)))

    def kept_way(got):
        p = ResponseParser(lambda d, t: got.append((d, t)), on_bodies=lambda ps, ts: got.extend(zip(ps, ts)) and None,
                           on_framed=lambda ms, ts: got.extend((_LINE[0] + m + _LINE[1], t) for m, t in zip(ms, ts)),
                           framing=_LINE)
        p.feed(_HEAD, 0.0)
        kept = kept_class()
        for r, t in zip(reads, stamps):
            if r:
                kept.add(r, t)
        p.feed_kept(kept)
        assert len(kept) == 0  # taken, either way
        got.append((b"done" if p.done else b"open", float(p.keep_alive)))

    want, have = _outcome(general), _outcome(kept_way)
    assert have[0] == want[0] and _by_read(have[1]) == _by_read(want[1])


def _by_read(bodies: list[tuple[bytes, float]]) -> list[tuple[bytes, float]]:
    """Bodies of one stamp (one read) joined: the general parser gives a read's chunks as one body."""
    out: list[tuple[bytes, float]] = []
    for data, at in bodies:
        if out and out[-1][1] == at:
            out[-1] = (out[-1][0] + data, at)
        else:
            out.append((data, at))
    return out


def test_a_wrong_size_line_on_a_framed_message_ends_as_in_the_general_parser():
    # one byte short, one too many (the chunk is cut inside the message, or swallows the next size
    # line), no size line, no chunk at all
    for bad in (b"9\r\ndata: bb\n\n\r\n", b"b\r\ndata: bb\n\n\r\n", b"\n\n\r\n", b"x"):
        reads = [_event_chunk(b"a"), bad, _event_chunk(b"c"), _event_chunk(b"d"), b"0\r\n\r\n"]

        def general(got, reads=reads):
            p = ResponseParser(lambda d, t: got.append((d, t)))
            p.feed(_HEAD, 0.0)
            for r in reads:
                p.feed(r, 1.0)

        def framed(got, reads=reads):
            p = ResponseParser(lambda d, t: got.append((d, t)), on_bodies=lambda ps, ts: got.extend(zip(ps, ts)) and None,
                               on_framed=lambda ms, ts: got.extend((b"data: " + m + b"\n\n", t) for m, t in zip(ms, ts)),
                               framing=_LINE)
            p.feed(_HEAD, 0.0)
            p.feed_reads(reads, [1.0] * len(reads))
        assert _outcome(framed) == _outcome(general), bad


async def test_a_body_read_by_the_selector_that_is_cut_short_fails_and_leaves_it():
    # The loop's StreamSelector reads a connection's socket (asyncio's loop made by new_asyncio_loop, plain TCP):
    # a server that closes mid-body ends the request as the transport's own reads would.
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for piece in [HEAD_CHUNKED, b"3\r\none\r\n", b"3\r\ntwo\r\n"]:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()  # mid-body

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with StreamingHTTPClient(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(HTTPError, match="in the middle of the body"):
                await asyncio.wait_for(post(client), 10)
            selector = stream_selector(asyncio.get_running_loop())
            assert selector is not None and not selector.members  # used, and left at the close
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_reads_its_next_response_after_a_body_read_by_the_selector():
    body = [HEAD_CHUNKED] + [b"4\r\nt%03d\r\n" % i for i in range(5)] + [b"0\r\n\r\n"]
    async with RawServer(lambda c, n, r: body) as srv:
        async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
            for _ in range(3):
                resp, got = await post(client)
                assert resp.status == 200 and [d for d, _ in got] == [b"t%03d" % i for i in range(5)]
                # the socket stays with the selector from request to request (no epoll change per request)
                selector = stream_selector(asyncio.get_running_loop())
                assert selector is not None and [reader for reader, _kept in selector.members.values()] == list(client._open)
    assert srv.connections == 1

"""engine.eventloop.StreamSelector: a selector asyncio's loop runs on, which also reads the joined
sockets of streaming connections itself. Real sockets (socketpairs, TCP on 127.0.0.1), real loops."""

from __future__ import annotations

import asyncio
import os
import selectors
import socket

import pytest

from engine.bench.http_client import StreamingHTTPClient
from engine.eventloop import StreamSelector, new_asyncio_loop, run_coroutine, stream_selector

pytestmark = pytest.mark.skipif(not hasattr(__import__("select"), "epoll"), reason="epoll is Linux's")


class Reader:
    """A StreamReader that records what the selector hands it."""

    def __init__(self, keeping: bool = False, fail: bool = False) -> None:
        self.keeping, self.fail = keeping, fail
        self.kept: list[bytes] = []
        self.kept_at: list[float] = []
        self.got: list[tuple[bytes, float]] = []
        self.eofs: list[int] = []
        self.failures: list[BaseException] = []

    def received(self, data: bytes, now: float) -> None:
        if self.fail:
            raise RuntimeError("on_body raised")
        self.got.append((data, now))

    def stream_eof(self, fd: int) -> None:
        self.eofs.append(fd)

    def stream_failed(self, exc: BaseException) -> None:
        self.failures.append(exc)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_it_is_a_selector_as_asyncio_uses_one(pair):
    a, b = pair
    sel = StreamSelector()
    try:
        key = sel.register(a, selectors.EVENT_READ, "data")
        assert sel.get_key(a) == key and sel.get_key(a.fileno()) == key and len(sel.get_map()) == 1
        with pytest.raises(KeyError):
            sel.register(a.fileno(), selectors.EVENT_WRITE)
        with pytest.raises(ValueError):
            sel.register(b, 0)
        assert sel.select(0) == []
        b.send(b"x")
        assert sel.select(1) == [(key, selectors.EVENT_READ)]
        key = sel.modify(a, selectors.EVENT_READ | selectors.EVENT_WRITE, "other")
        assert key.data == "other"
        assert sel.select(1) == [(key, selectors.EVENT_READ | selectors.EVENT_WRITE)]
        assert sel.unregister(a) == key
        assert sel.select(0) == [] and a not in sel.get_map()
        with pytest.raises(KeyError):
            sel.unregister(a)
        with pytest.raises(KeyError):
            sel.modify(a, selectors.EVENT_READ)
    finally:
        sel.close()


def test_a_joined_socket_is_read_by_the_selector_and_its_writer_still_waits_in_asyncio(pair):
    a, b = pair
    sel = StreamSelector()
    reader = Reader()
    try:
        sel.join(a.fileno(), reader)
        write_key = sel.register(a, selectors.EVENT_WRITE, "writer")  # the transport waits to write
        b.send(b"token 1")
        ready = sel.select(1)
        assert ready == [(write_key, selectors.EVENT_WRITE)]  # not a read for asyncio: the selector read it
        assert [d for d, _ in reader.got] == [b"token 1"]
        sel.unregister(a)
        b.send(b"token 2")
        assert sel.select(1) == [] and [d for d, _ in reader.got] == [b"token 1", b"token 2"]
        assert sel.leave(a.fileno(), reader) and not sel.leave(a.fileno())
        b.send(b"token 3")
        assert sel.select(0) == [] and len(reader.got) == 2  # left: nobody watches it any more
    finally:
        sel.close()


def test_kept_reads_are_stamped_inline_and_a_read_that_may_end_the_body_is_handed_over(pair):
    a, b = pair
    sel = StreamSelector()
    reader = Reader(keeping=True)
    try:
        sel.join(a.fileno(), reader)
        b.send(b"d\r\ndata: tok\n\n\r\n")  # a token's chunk: it cannot end a chunked body
        sel.select(1)
        assert reader.kept == [b"d\r\ndata: tok\n\n\r\n"] and len(reader.kept_at) == 1 and not reader.got
        b.send(b"0\r\n\r\n")  # the body's end
        sel.select(1)
        assert [d for d, _ in reader.got] == [b"0\r\n\r\n"] and reader.got[0][1] >= reader.kept_at[0]
    finally:
        sel.close()


def test_an_end_of_file_goes_to_the_reader_and_a_raising_reader_fails_alone(pair):
    a, b = pair
    c, d = socket.socketpair()
    sel = StreamSelector()
    failing, ending = Reader(fail=True), Reader()
    try:
        sel.join(a.fileno(), failing)
        sel.join(c.fileno(), ending)
        b.send(b"x")
        d.close()
        sel.select(1)
        assert len(failing.failures) == 1 and isinstance(failing.failures[0], RuntimeError)
        assert ending.eofs == [c.fileno()]
    finally:
        sel.close()
        c.close()


def test_a_descriptor_number_closed_and_reused_is_watched_again():
    sel = StreamSelector()
    first = socket.socket()
    fd = first.fileno()
    try:
        sel.register(fd, selectors.EVENT_READ)
        first.close()  # epoll forgets a closed file by itself
        sel.unregister(fd)  # asyncio unregisters after the close: the selector must not fail
        a, b = socket.socketpair()
        try:
            if a.fileno() != fd:  # the number is reused only when it is the lowest free one
                os.dup2(a.fileno(), fd)
                a.close()
                a = socket.socket(fileno=fd)
            key = sel.register(fd, selectors.EVENT_READ)
            b.send(b"x")
            assert sel.select(1) == [(key, selectors.EVENT_READ)]
        finally:
            a.close()
            b.close()
    finally:
        sel.close()


def test_the_product_loop_runs_on_it_and_closes_it():
    async def main():
        loop = asyncio.get_running_loop()
        selector = stream_selector(loop)
        await asyncio.sleep(0.01)  # a timer through the selector's timeout
        return selector

    selector = run_coroutine(main(), "asyncio")
    assert isinstance(selector, StreamSelector)
    with pytest.raises((OSError, ValueError)):
        selector._ep.fileno()  # closed with its loop


def test_the_client_reads_through_its_transport_on_a_loop_without_the_selector():
    # asyncio.run's loop is asyncio's own selector loop: the connection is read the usual way.
    from test_http_client import HEAD_CHUNKED, RawServer, post

    body = [HEAD_CHUNKED] + [b"4\r\nt%03d\r\n" % i for i in range(3)] + [b"0\r\n\r\n"]

    async def scenario():
        assert stream_selector(asyncio.get_running_loop()) is None
        async with RawServer(lambda c, n, r: body) as srv:
            async with StreamingHTTPClient(f"http://127.0.0.1:{srv.port}") as client:
                resp, got = await post(client)
                return resp.status, [d for d, _ in got], all(c.selector is None for c in client._open)

    assert asyncio.run(scenario()) == (200, [b"t000", b"t001", b"t002"], True)


def test_a_loop_made_for_the_product_is_a_selector_loop():
    loop = new_asyncio_loop()
    try:
        assert isinstance(stream_selector(loop), StreamSelector)
    finally:
        loop.close()


def test_a_socket_closed_since_it_was_registered_is_unregistered_by_its_object(pair):
    a, b = pair
    sel = StreamSelector()
    try:
        key = sel.register(a, selectors.EVENT_READ)
        a.close()  # its fileno() is -1 now
        assert sel.get_key(a) == key and sel.unregister(a) == key and not sel.get_map()
    finally:
        sel.close()

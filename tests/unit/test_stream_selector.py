"""engine.eventloop.StreamSelector: a selector asyncio's loop runs on, which also reads the joined
sockets of streaming connections itself. Real sockets (socketpairs, TCP on 127.0.0.1), real loops."""

from __future__ import annotations

import asyncio
import os
import selectors
import shutil
import signal
import socket
import sysconfig
import time
from pathlib import Path

import pytest

import engine.eventloop as eventloop
from engine.bench.http_client import StreamingHTTPClient
from engine.eventloop import StreamSelector, new_asyncio_loop, run_coroutine, stream_selector

pytestmark = pytest.mark.skipif(not hasattr(__import__("select"), "epoll"), reason="epoll is Linux's")


class Reader:
    """A StreamReader that records what the selector hands it."""

    kept_class = eventloop.Kept  # what the selector fixture's kind of loop turn runs with

    def __init__(self, keeping: bool = False, fail: bool = False) -> None:
        self.fail = fail
        self.kept = self.kept_class()
        self.kept.keeping = keeping
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


@pytest.fixture(params=["C", "Python"])
def make_selector(request, monkeypatch):
    """StreamSelector with its loop turn and kept reads in C (engine/_streamread.c), and in Python
    (as where that module was not built): the same behaviour."""
    if request.param == "C" and eventloop._poll is None:
        pytest.skip("engine._streamread was not built (test_the_c_loop_turn_is_built_where_it_can_be says whether it should be)")
    monkeypatch.setattr(Reader, "kept_class", eventloop.Kept if request.param == "C" else eventloop.PyKept)

    def make() -> StreamSelector:
        sel = StreamSelector()
        sel.in_c = request.param == "C"
        return sel

    return make


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_it_is_a_selector_as_asyncio_uses_one(pair, make_selector):
    a, b = pair
    sel = make_selector()
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


def test_a_joined_socket_is_read_by_the_selector_and_its_writer_still_waits_in_asyncio(pair, make_selector):
    a, b = pair
    sel = make_selector()
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


def test_kept_reads_are_stamped_inline_and_a_read_that_may_end_the_body_is_handed_over(pair, make_selector):
    a, b = pair
    sel = make_selector()
    reader = Reader(keeping=True)
    try:
        sel.join(a.fileno(), reader)
        b.send(b"d\r\ndata: tok\n\n\r\n")  # a token's chunk: it cannot end a chunked body
        before = time.perf_counter()
        time.sleep(0.001)
        sel.select(0.01)  # (the C turn waits on after a kept read, for the rest of its timeout)
        after = time.perf_counter()
        reads, stamps = reader.kept.take()
        assert reads == [b"d\r\ndata: tok\n\n\r\n"] and len(stamps) == 1 and not reader.got
        assert before < stamps[0] < after  # on perf_counter's clock, in C as in Python
        b.send(b"0\r\n\r\n")  # the body's end
        sel.select(1)
        assert [d for d, _ in reader.got] == [b"0\r\n\r\n"] and reader.got[0][1] >= stamps[0]
    finally:
        sel.close()


def test_an_end_of_file_goes_to_the_reader_and_a_raising_reader_fails_alone(pair, make_selector):
    a, b = pair
    c, d = socket.socketpair()
    sel = make_selector()
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


def test_a_descriptor_number_closed_and_reused_is_watched_again(make_selector):
    sel = make_selector()
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


def test_a_socket_closed_since_it_was_registered_is_unregistered_by_its_object(pair, make_selector):
    a, b = pair
    sel = make_selector()
    try:
        key = sel.register(a, selectors.EVENT_READ)
        a.close()  # its fileno() is -1 now
        assert sel.get_key(a) == key and sel.unregister(a) == key and not sel.get_map()
    finally:
        sel.close()


def test_the_c_loop_turn_is_built_where_it_can_be():
    # setup.py builds engine._streamread as optional: an install without a compiler or Python's
    # headers goes on with the loop turn in Python. Where both are here, it must have been built.
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.exists():
        pytest.skip("no C compiler or no Python headers here: the loop turn runs in Python")
    assert eventloop._poll is not None, "engine._streamread did not build: run `pip install -e .` and read its output"
    assert StreamSelector().in_c


def test_a_keyboard_interrupt_from_a_reader_stops_the_loop_turn(pair, make_selector):
    a, b = pair
    sel = make_selector()

    class Interrupted(Reader):
        def received(self, data: bytes, now: float) -> None:
            raise KeyboardInterrupt

    reader = Interrupted()
    try:
        sel.join(a.fileno(), reader)
        b.send(b"x")
        with pytest.raises(KeyboardInterrupt):
            sel.select(1)
        assert not reader.failures  # not a failure of its request: the whole run stops
    finally:
        sel.close()


def test_more_ready_sockets_than_a_turn_reads_on_its_stack(make_selector):
    # 300 joined sockets ready at once: the C loop turn takes its event array from the heap past 256.
    pairs = [socket.socketpair() for _ in range(300)]
    sel = make_selector()
    readers = [Reader() for _ in pairs]
    try:
        for (a, b), reader in zip(pairs, readers):
            a.setblocking(False)
            sel.join(a.fileno(), reader)
            b.send(b"token")
        assert sel.select(1) == []
        assert all([d for d, _ in r.got] == [b"token"] for r in readers)
    finally:
        sel.close()
        for a, b in pairs:
            a.close()
            b.close()


def test_a_signal_during_the_wait_runs_its_handler_and_the_turn_ends_empty(make_selector):
    # epoll_wait interrupted by a signal whose handler returns: the handler runs, the turn has nothing
    # (in C it ends there, in Python epoll waits out the rest of its timeout), asyncio asks again.
    sel = make_selector()
    got = []
    old = signal.signal(signal.SIGALRM, lambda *_: got.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        assert sel.select(0.3) == []
        assert got
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sel.close()


def test_auto_gives_a_lean_client_the_loop_turn_in_c_and_anything_else_uvloop(monkeypatch):
    import importlib.util

    has_uvloop = importlib.util.find_spec("uvloop") is not None
    other = "uvloop" if has_uvloop else "asyncio"
    monkeypatch.setattr(eventloop, "_poll", lambda *a: ([], 0.0))  # as if built
    assert eventloop.event_loop_name("auto", reads_streams=True) == "asyncio"
    assert eventloop.event_loop_name("auto") == other  # the built-in server, aiohttp's client
    assert eventloop.event_loop_name("asyncio") == "asyncio"
    monkeypatch.setattr(eventloop, "_poll", None)  # not built
    assert eventloop.event_loop_name("auto", reads_streams=True) == other
    if has_uvloop:
        assert eventloop.event_loop_name("uvloop", reads_streams=True) == "uvloop"


def test_a_turn_waits_on_through_kept_reads_and_returns_when_python_ran(pair, make_selector):
    import threading

    a, b = pair
    c, d = socket.socketpair()
    sel = make_selector()
    reader = Reader(keeping=True)
    token = b"d\r\ndata: tok\n\n\r\n"
    waker = threading.Timer(5.0, lambda: d.send(b"late"))  # ends a wait that should not be happening
    try:
        sel.join(a.fileno(), reader)
        asyncio_key = sel.register(c, selectors.EVENT_READ, "asyncio's")
        b.send(token)
        started = time.perf_counter()
        assert sel.select(0.05) == [] and reader.kept.take()[0] == [token]
        if sel.in_c:  # nothing for asyncio came: the C turn waited out its timeout
            assert time.perf_counter() - started >= 0.045
        # A read that may end the body runs the reader's Python code: the turn returns at once, even
        # with no timeout, for asyncio to run what that code scheduled.
        waker.start()
        b.send(b"0\r\n\r\n")
        assert sel.select(None) == [] and [g for g, _ in reader.got] == [b"0\r\n\r\n"]
        waker.cancel()
        d.send(b"now")  # and asyncio's own descriptors end a turn too
        assert sel.select(None) == [(asyncio_key, selectors.EVENT_READ)]
    finally:
        waker.cancel()
        sel.close()
        c.close()
        d.close()


def test_the_c_loop_turn_keeps_a_python_kept_its_own_way(pair):
    # A reader whose kept is a PyKept (not the C type) under the C loop turn: added through its method.
    if eventloop._poll is None:
        pytest.skip("engine._streamread was not built")
    a, b = pair
    sel = StreamSelector()
    reader = Reader()
    reader.kept = eventloop.PyKept()
    reader.kept.keeping = True
    try:
        sel.join(a.fileno(), reader)
        b.send(b"d\r\ndata: tok\n\n\r\n")
        sel.select(0.01)
        assert reader.kept.take()[0] == [b"d\r\ndata: tok\n\n\r\n"] and not reader.got
    finally:
        sel.close()


@pytest.mark.parametrize("kind", ["C", "Python"])
def test_kept_reads_come_back_in_order_with_their_stamps(kind):
    if kind == "C" and eventloop._CKept is None:
        pytest.skip("engine._streamread was not built")
    kept = eventloop.Kept() if kind == "C" else eventloop.PyKept()
    assert not kept.keeping and len(kept) == 0 and not kept
    big = bytes(range(256)) * 300  # past the first buffer: it grows
    for i in range(100):
        kept.add(b"read %d" % i, float(i))
    kept.add(big, 100.0)
    assert len(kept) == 101 and kept
    reads, stamps = kept.take()
    assert reads == [b"read %d" % i for i in range(100)] + [big] and stamps == [float(i) for i in range(101)]
    assert len(kept) == 0 and kept.take() == ([], [])
    kept.add(b"x", 1.0)
    kept.clear()
    assert kept.take() == ([], [])
    if kind == "C":
        with pytest.raises(TypeError):
            kept.add("text", 1.0)  # bytes only

"""The asyncio event loop a process runs on: uvloop where it is installed (a dependency on CPython
for Linux and macOS on x86-64 and ARM), else asyncio's own. The benchmark's load generator and the
built-in server both choose with ``event_loop: auto | uvloop | asyncio``.

asyncio's own loop runs here on `StreamSelector` where the platform has epoll: asyncio's selector,
which also reads the sockets of streaming connections itself. A connection's socket joins it
(`join`; its transport's reading is paused) and from then on the one `epoll_wait` of each loop
turn reports it with the loop's own descriptors; the selector reads each ready joined socket right
there (`os.read`), all stamped with one `perf_counter()` taken after the poll, and hands the bytes to
the connection. Per streamed token that skips asyncio's per-socket machinery (a handle run in a
context, two transport frames, a protocol call) and, against a read hub of its own registered as
one more reader of the loop, a second `epoll_wait` and a handle a loop turn.

The loop turn (poll, read, hand over) is C where `engine._streamread` was built (setup.py: with the
package, where a compiler and Python's headers are found), else the same in Python
(`StreamSelector._select_py`). In C a token's read is copied into its connection's `Kept` with no
Python object made, and while a wait brings nothing but such reads the turn waits again (for the
rest of asyncio's timeout) instead of going back to asyncio's loop. `auto` gives a lean client this
loop when its turn is C, uvloop's otherwise.
"""

from __future__ import annotations

import asyncio
import math
import os
import selectors
import sys
import time
import weakref
from collections.abc import Mapping
from selectors import EVENT_READ, EVENT_WRITE
from typing import Any, Protocol

try:
    from select import EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, epoll
except ImportError:  # not Linux: asyncio's own selector, and connections read by their transports
    epoll = None  # type: ignore[assignment,misc]
else:
    _NOT_IN, _NOT_OUT, _TO_WRITER = ~EPOLLIN, ~EPOLLOUT, EPOLLOUT | EPOLLERR | EPOLLHUP

try:  # the loop turn and the kept reads in C, built with the package where a compiler was found (setup.py)
    from engine._streamread import Kept as _CKept, poll as _poll
except ImportError:
    _CKept = _poll = None

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

# A read's size: below glibc's mmap threshold, so its buffer comes from the heap, not a fresh mapping.
STREAM_READ = 64 * 1024
_perf_counter = time.perf_counter


def c_loop_turn() -> bool:
    """Whether asyncio's loop, as `new_asyncio_loop` makes it, runs its turn in C (engine._streamread)."""
    return epoll is not None and _poll is not None


def event_loop_name(choice: str = "auto", *, reads_streams: bool = False) -> str:
    """The event loop a run gets. "auto": for a client whose streams the selector reads (the lean HTTP
    client: `reads_streams`), asyncio's own where its loop turn runs in C (about 11% less CPU per
    streamed token than uvloop's; docs/validation.md); otherwise uvloop where it is installed (a
    dependency where it installs), else asyncio's own. "uvloop" when it is not installed is an error."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop {choice!r}: choose one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio" or (choice == "auto" and reads_streams and c_loop_turn()):
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError("event loop uvloop: it is not installed (pip install uvloop)") from None
        return "asyncio"
    return "uvloop"


def run_coroutine(coro: Any, event_loop: str = "auto", *, reads_streams: bool = False) -> Any:
    """Run `coro` to its end in a fresh event loop of the kind `event_loop_name` picks (asyncio's
    own on `StreamSelector` where the platform has epoll)."""
    if event_loop_name(event_loop, reads_streams=reads_streams) == "asyncio":
        if sys.version_info >= (3, 11):
            with asyncio.Runner(loop_factory=new_asyncio_loop) as runner:
                return runner.run(coro)
        loop = new_asyncio_loop()
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(coro)
        finally:
            try:
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
    import uvloop
    loop = uvloop.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does with the tasks a coroutine left behind (Python 3.10 has no Runner)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


_STREAM_SELECTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StreamSelector] = weakref.WeakKeyDictionary()


def new_asyncio_loop() -> asyncio.AbstractEventLoop:
    """asyncio's selector loop, on a `StreamSelector` where the platform has epoll."""
    if epoll is None:
        return asyncio.new_event_loop()
    selector = StreamSelector()
    loop = asyncio.SelectorEventLoop(selector)
    _STREAM_SELECTORS[loop] = selector
    return loop


def stream_selector(loop: asyncio.AbstractEventLoop) -> StreamSelector | None:
    """The `StreamSelector` of a loop made by `new_asyncio_loop`, else None."""
    return _STREAM_SELECTORS.get(loop)


class PyKept:
    """The reads of a streaming body kept with their stamps until it may have ended (`Kept`, where
    engine._streamread was not built). While `keeping`, a read that cannot end the body is `add`ed;
    `take()` gives them back, in order, with their stamps. `take_framed` is the C type's short cut
    (the messages of a body of framed chunks in one pass): here always None, and the caller takes
    the reads (`ResponseParser.feed_reads` has its own short cuts in Python). `acks` is the C
    type's ACK setting (every second token's ACK, where a server is seen not to wait for them):
    here nothing reads it, so a server is never seen so and every token is ACKed as the kernel
    does by default."""

    __slots__ = ("keeping", "acks", "reads", "stamps")

    def __init__(self) -> None:
        self.keeping = False
        self.acks = 0
        self.reads: list[bytes] = []
        self.stamps: list[float] = []

    def add(self, data: bytes, stamp: float) -> None:
        self.reads.append(data)
        self.stamps.append(stamp)

    def take(self) -> tuple[list[bytes], list[float]]:
        reads, stamps = self.reads, self.stamps
        self.reads, self.stamps = [], []
        return reads, stamps

    def take_framed(self, prefix: bytes, suffix: bytes) -> None:
        return None

    def clear(self) -> None:
        self.reads, self.stamps = [], []

    def __len__(self) -> int:
        return len(self.reads)


# What a connection keeps its reads in: C where built (its loop turn copies a token's read there,
# no Python object made), else PyKept.
Kept = _CKept if _CKept is not None else PyKept


class StreamReader(Protocol):
    """A connection whose socket `StreamSelector` reads. While its `kept.keeping`, a read that
    cannot end its response (its fourth byte from the end is not a CR: a token's chunk ends
    "\\n\\n\\r\\n", a chunked body ends with a blank line) is only added to `kept` with its stamp;
    every other read goes to `received(data, stamp)`; an end of file or an error to `stream_eof(fd)`
    (the reader then leaves), an exception from `received` to `stream_failed(exc)`."""

    kept: Any  # a Kept (or PyKept)

    def received(self, data: bytes, now: float) -> None: ...

    def stream_eof(self, fd: int) -> None: ...

    def stream_failed(self, exc: BaseException) -> None: ...


class _KeyMap(Mapping):
    """`get_map()`: the registered file objects' keys by descriptor, read-only."""

    def __init__(self, keys: dict[int, selectors.SelectorKey]) -> None:
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, fileobj: Any) -> selectors.SelectorKey:
        try:
            return self._keys[_lookup(self._keys, fileobj)]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None

    def __iter__(self):
        return iter(self._keys)


def _fileno(fileobj: Any) -> int:
    fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
    if not isinstance(fd, int) or fd < 0:
        raise ValueError(f"invalid file descriptor: {fileobj!r}")
    return fd


def _check_events(events: int) -> None:
    if not events or events & ~(EVENT_READ | EVENT_WRITE):
        raise ValueError(f"invalid events: {events!r}")


def _lookup(keys: dict[int, selectors.SelectorKey], fileobj: Any) -> int:
    """`fileobj`'s descriptor; for a file object closed since it was registered (no descriptor any
    more), the one it was registered under, as the standard selectors find it."""
    try:
        return _fileno(fileobj)
    except ValueError:
        for key in keys.values():
            if key.fileobj is fileobj:
                return key.fd
        raise


class StreamSelector(selectors.BaseSelector):
    """An epoll selector for asyncio's loop that reads the joined sockets itself (see the module's
    doc). A descriptor may be both registered (asyncio waits to write to it) and joined (it is
    read here): its epoll mask is the union, and each side gets its own events."""

    def __init__(self) -> None:
        self._ep = epoll()
        self._keys: dict[int, selectors.SelectorKey] = {}
        self._map = _KeyMap(self._keys)
        self._masks: dict[int, int] = {}  # what epoll watches, per descriptor
        # joined sockets: fd -> (reader, its kept), what the loop turn (C or Python) looks up per read
        self.members: dict[int, tuple[StreamReader, Any]] = {}
        self.in_c = _poll is not None  # the loop turn in C (engine/_streamread.c) where it was built

    # --- the selector asyncio uses
    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        _check_events(events)
        fd = _fileno(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
        return self._store(selectors.SelectorKey(fileobj, fd, events, data))

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = _lookup(self._keys, fileobj)
        try:
            key = self._keys.pop(fd)
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        try:
            self._watch(fd)
        except OSError:  # closed since it was registered
            self._masks.pop(fd, None)
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = _lookup(self._keys, fileobj)
        try:
            key = self._keys[fd]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        if events != key.events or data is not key.data:
            _check_events(events)
            key = self._store(key._replace(events=events, data=data))
        return key

    def _store(self, key: selectors.SelectorKey) -> selectors.SelectorKey:
        """`key` as its descriptor's, epoll told; on a failure the descriptor has no key (as the
        standard selectors leave it)."""
        self._keys[key.fd] = key
        try:
            self._watch(key.fd)
        except BaseException:
            del self._keys[key.fd]
            raise
        return key

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._map

    def close(self) -> None:
        self._keys.clear()
        self._masks.clear()
        self.members.clear()
        self._ep.close()

    def _watch(self, fd: int) -> None:
        """Make epoll watch what the key and the membership of `fd` ask for."""
        key = self._keys.get(fd)
        want = 0
        if key is not None:
            if key.events & EVENT_READ:
                want |= EPOLLIN
            if key.events & EVENT_WRITE:
                want |= EPOLLOUT
        if fd in self.members:
            want |= EPOLLIN
        had = self._masks.get(fd, 0)
        if want == had:
            return
        if not want:
            del self._masks[fd]
            try:
                self._ep.unregister(fd)
            except OSError:  # closed already: epoll forgot it then
                pass
            return
        try:
            if had:
                self._ep.modify(fd, want)
            else:
                self._ep.register(fd, want)
        except FileExistsError:  # watched under a descriptor number closed and reused since
            self._ep.modify(fd, want)
        except FileNotFoundError:  # closed since, so epoll forgot it; this is a new socket of that number
            self._ep.register(fd, want)
        self._masks[fd] = want

    # --- the joined sockets
    def join(self, fd: int, reader: StreamReader) -> None:
        """Read `fd` here from now on (its transport's reading must be paused first)."""
        self.members[fd] = (reader, reader.kept)
        try:
            self._watch(fd)
        except BaseException:
            del self.members[fd]
            raise

    def leave(self, fd: int, reader: StreamReader | None = None) -> bool:
        """`fd` is not read here any more (only while it is `reader`'s, when named); False when it was not joined."""
        if fd not in self.members or (reader is not None and self.members[fd][0] is not reader):
            return False
        del self.members[fd]
        try:
            self._watch(fd)
        except OSError:
            self._masks.pop(fd, None)
        return True

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # epoll counts milliseconds: round up, to wait at least `timeout`
        ms = -1 if timeout is None else 0 if timeout <= 0 else math.ceil(timeout * 1e3)
        if self.in_c:
            _, fd_events = _poll(self._ep.fileno(), ms, max(len(self._masks), 1), self.members)
        else:
            fd_events = self._select_py(ms)
        ready = []
        keys_get = self._keys.get
        for fd, event in fd_events:
            key = keys_get(fd)
            if key is not None:
                events = 0
                if event & _NOT_IN:
                    events |= EVENT_WRITE
                if event & _NOT_OUT:
                    events |= EVENT_READ
                events &= key.events
                if events:
                    ready.append((key, events))
        return ready

    def _select_py(self, ms: int) -> list[tuple[int, int]]:
        """The loop turn of `engine._streamread.poll` in Python: poll, read and hand over the ready
        joined sockets, return the rest."""
        try:
            fd_events = self._ep.poll(ms * 1e-3 if ms > 0 else ms, max(len(self._masks), 1))
        except InterruptedError:
            return []
        now = _perf_counter()
        rest = []
        entries_get, read, size = self.members.get, os.read, STREAM_READ
        for fd, event in fd_events:
            entry = entries_get(fd)
            if entry is not None:
                reader, kept = entry
                if event & _NOT_OUT:  # readable, or an error or a hang-up that its read reports
                    try:
                        data = read(fd, size)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except OSError:
                        data = b""
                    if data:
                        # A streaming body's read that cannot end the response: kept with its stamp, inline.
                        if kept.keeping and len(data) >= 4 and data[-4] != 13:
                            kept.add(data, now)
                        else:
                            try:
                                reader.received(data, now)
                            except Exception as exc:  # its request fails, not the loop
                                reader.stream_failed(exc)
                    elif data is not None:  # end of file or an error: its transport's own read meets it
                        reader.stream_eof(fd)
                event &= _TO_WRITER  # what is left for asyncio: a writer of this socket, if it waits
                if not event:
                    continue
            rest.append((fd, event))
        return rest

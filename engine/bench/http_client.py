"""A lean HTTP/1.1 client for streamed POSTs, built on asyncio Protocols.

Why not aiohttp for the timed path: aiohttp hands each read to the request's task through a
StreamReader and a future, so every chunk costs a task wake-up and is stamped only when that task
next runs — after every other stream that became readable in the same loop turn. Here the response
is read where the bytes arrive (`data_received`), each read is stamped there with one
`perf_counter()`, and the request's task wakes once, when the response ends. Once the head of a
chunked response is parsed, a read is only stamped and kept: the chunk framing and the caller's
`on_body(data, stamp)` run over the kept reads when a read could be the response's last (it ends
with a blank line), so the work of parsing comes after the stream's tokens, not between them, and
a read's stamp never waits behind another stream's parsing. A caller that names how its messages
are framed (an SSE stream: `data: `, message, blank line) gets the bare messages of reads that are
one such chunk each, found for the whole response in a few list-wide passes (`_FramedChunks`). The
reads are kept in an `engine.eventloop.Kept`: where engine/_streamread.c was built, one buffer per
connection into which the selector's C loop turn copies a token's read (no Python object per read),
and whose `take_framed` frames a whole body of such chunks in one pass (`ResponseParser.feed_kept`).

On asyncio's loop as the product runs it (`engine.eventloop.new_asyncio_loop`: plain TCP, Linux)
a connection's socket is read outside asyncio's per-socket machinery from the moment it opens: the
transport's reading is paused and the socket joins the loop's selector (`StreamSelector`), which
reads every ready joined socket in the poll of each loop turn (in C where `engine._streamread` was
built, else `os.read`), all stamped with one `perf_counter()` reading taken right after it; a read
of a streaming body is kept there and then, any other read goes to the connection as the transport
would give it. Per token this skips the loop's
per-socket callback (a handle run in a context, two transport frames, a protocol call): a third of
the client's CPU per token at 128 streams. The socket stays joined from request to request (no epoll
changes per request); at end of file or an error it leaves, and the transport's own read meets it and
closes the connection. On another loop (uvloop's, or one made elsewhere) and over TLS the transport
reads. benchmarks/loadgen_overhead.py and benchmarks/client_cost.py measure the difference.

ACKs: the kernel ACKs each token as it is read, and on loopback that ACK's trip through the
server's TCP is charged to the client too (about half of a token's read). With the C loop turn the
client asks the kernel for an ACK every second token instead (TCP_QUICKACK off once per response,
after its first token; `engine/_streamread.c` says why that is safe only where the server sends
each token at once), and only for a server seen not to wait for ACKs: a caller lets the requests
it does not measure try (`with client.trying_acks():`, the load generator's warm-up), their first tokens show it
(the socket's own counters), and `halved_acks` says the outcome (True: a try proved it; False:
tried, never proved; None: not tried; but for True every token is ACKed).

What it speaks: HTTP/1.1 (and 1.0 responses), keep-alive with a pool of idle connections per
client, responses framed by `Transfer-Encoding: chunked`, `Content-Length`, or the connection's
close; interim 1xx responses are skipped; `https://` through asyncio's TLS. No proxies, no
redirects, no compression (it does not ask for any). A connection that the server closed while idle
is retried once on a fresh one, and only when not a byte of the response had arrived.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import repeat
from operator import getitem, itemgetter
from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.errors import MagpieError
from engine.eventloop import Kept, StreamSelector, stream_selector

# Kept.acks (engine/_streamread.c): leave the ACKs alone, halve them, try halving and watch,
# and the two outcomes of a try.
_ACKS_EACH, _ACKS_HALVE, _ACKS_TRY, _ACKS_PROVEN, _ACKS_REFUTED = 0, 1, 2, 4, 5

# on_body(data, stamp) gets the body bytes of one read and the perf_counter() of that read;
# returning True stops the response there (the connection is closed, not reused).
BodySink = Callable[[bytes, float], "bool | None"]

# on_bodies(pieces, stamps): the same for several reads at once (their body bytes and stamps, in order).
BodiesSink = Callable[[list[bytes], list[float]], "bool | None"]

# A caller that knows how its messages are written (an SSE server: b"data: ", message, b"\n\n") names
# that framing; reads that are each exactly one chunk holding one framed message then reach its
# on_framed(messages, stamps) as the bare messages, told from the reads in a few C-level passes.
Framing = tuple[bytes, bytes]

_MAX_HEAD = 64 * 1024
_perf_counter = time.perf_counter
_ERROR_BODY_LIMIT = 4096

# One read that is exactly one chunk (size line without extensions, data, CRLF): what an SSE
# server's one write per event arrives as. Its size is checked against the data it matched.
_ONE_CHUNK = re.compile(rb"([0-9a-fA-F]{1,16})\r\n(.+)\r\n", re.S).fullmatch
_SIZE, _DATA = itemgetter(1), itemgetter(2)

# parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)
_CHUNKED_STATES = frozenset((_CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER))


class HTTPError(MagpieError):
    """The response could not be read: malformed, or the connection ended before it was complete."""

    title = "bad HTTP response"


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str]
    # The body when the status is not 200 (its first 4 KiB): with 200 it went to on_body instead.
    error_body: bytes = b""


def _check_partial_head(size: int) -> None:
    """A read ended inside the response head, ``size`` bytes of it so far: refuse a head that is too large."""
    if size > _MAX_HEAD:
        raise HTTPError("response head larger than 64 KiB")


def _check_partial_chunk_size(size: int) -> None:
    """A read ended inside a chunk-size line, ``size`` bytes of it so far: refuse a line that is too long."""
    if size > 1024:
        raise HTTPError("chunk-size line longer than 1 KiB")


class ResponseParser:
    """Incremental HTTP/1.1 response parser: feed it reads as they come.

    With status 200 the body goes to `on_body`, one call per `feed` with everything that read
    carried (chunk framing removed); with any other status the body is kept in `error_body`.
    """

    def __init__(self, on_body: BodySink, *, head_request: bool = False,
                 on_bodies: BodiesSink | None = None, on_framed: BodiesSink | None = None,
                 framing: Framing | None = None) -> None:
        self.on_body = on_body
        self.on_bodies = on_bodies
        # Both or neither: on_framed takes the messages of reads that are one `framing` chunk each.
        self.framed = _framed_table(*framing) if (on_framed is not None and framing is not None) else None
        self.on_framed = on_framed
        self.head_request = head_request
        self.state = _HEAD
        self.buf = b""
        self.remaining = 0
        self.response: Response | None = None
        self.keep_alive = False
        self.stopped = False  # on_body asked to stop
        self.got_bytes = False

    @property
    def done(self) -> bool:
        return self.state == _DONE

    def feed(self, data: bytes, now: float) -> None:
        """Parse one read. Raises HTTPError on a malformed response."""
        self.got_bytes = True
        buf = self.buf + data if self.buf else data
        pos = 0
        n = len(buf)
        pieces: list[bytes] = []
        while pos < n or self.state == _DONE:
            st = self.state
            if st == _CHUNK_DATA or st == _LENGTH:
                take = min(self.remaining, n - pos)
                pieces.append(buf[pos:pos + take])
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.state = _CHUNK_END if st == _CHUNK_DATA else _DONE
            elif st == _CHUNK_SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:  # the read ended inside the chunk-size line
                    _check_partial_chunk_size(n - pos)
                    break
                line = buf[pos:eol].split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise HTTPError(f"bad chunk-size line {buf[pos:eol][:40]!r}") from None
                if size < 0:
                    raise HTTPError(f"bad chunk-size line {buf[pos:eol][:40]!r}")
                pos = eol + 2
                if size == 0:
                    self.state = _TRAILER
                else:
                    self.remaining = size
                    self.state = _CHUNK_DATA
            elif st == _CHUNK_END:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise HTTPError("chunk data not followed by CRLF")
                pos += 2
                self.state = _CHUNK_SIZE
            elif st == _UNTIL_CLOSE:
                pieces.append(buf[pos:])
                pos = n
            elif st == _HEAD:
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:  # the read ended inside the head
                    _check_partial_head(n - pos)
                    break
                head = buf[pos:end]
                pos = end + 4
                self._start_body(head)
            elif st == _TRAILER:  # once a response, after the last chunk
                pos = self._skip_trailer(buf, pos)
                if self.state != _DONE:
                    break
            else:  # _DONE
                if pos < n:
                    self.keep_alive = False  # bytes after the response: do not trust this connection
                break
        self.buf = buf[pos:] if pos < n and self.state != _DONE else b""
        if pieces:
            self._deliver(b"".join(pieces) if len(pieces) > 1 else pieces[0], now)

    def feed_reads(self, reads: list[bytes], stamps: list[float]) -> None:
        """`feed` each read in turn; reads made of whole chunks (how an SSE server writes its events)
        take a short cut: their bodies go to `on_bodies` together when it is given, or, when every
        read is one chunk of one `framing` message (the last read possibly several, and the end),
        their messages go to `on_framed`."""
        i, n = 0, len(reads)
        pieces: list[bytes] = []
        at: list[float] = []
        resp = self.response
        fast = (self.state == _CHUNK_SIZE and not self.buf and resp is not None and resp.status == 200
                and self.on_bodies is not None)
        if fast and n > 2:
            # Every read but the last one chunk each: framed in a few C-level passes, not a loop.
            head = reads[:-1]
            messages = self.framed.messages(head) if self.framed is not None else None
            if messages is not None:
                assert self.framed is not None and self.on_framed is not None
                framed_at, i = stamps[:n - 1], n - 1
                last = self.framed.last(reads[-1])
                if last is not None:  # the last read's messages go in the same batch, at its stamp
                    more, ended = last
                    messages += more
                    framed_at += [stamps[-1]] * len(more)
                    i = n
                    if ended:
                        self.state = _DONE
                if self.on_framed(messages, framed_at):
                    self.stopped = True
                    return
            else:
                singles = _single_chunks(head)
                if singles is not None:
                    pieces, at, i = singles, stamps[:n - 1], n - 1
        while fast and i < n:  # the state changes only where the loop ends
            whole = _whole_chunks(reads[i])
            if whole is None:
                break
            body, ended = whole
            if body:
                pieces.append(body)
                at.append(stamps[i])
            i += 1
            if ended:
                self.state = _DONE
                if i < n:
                    self.keep_alive = False  # bytes after the response: do not trust this connection
                break
        if pieces and self.on_bodies is not None and self.on_bodies(pieces, at):
            self.stopped = True
        if self.state == _DONE or self.stopped:
            return
        for j in range(i, n):
            self.feed(reads[j], stamps[j])
            if self.stopped:
                return

    def feed_kept(self, kept) -> None:
        """`feed_reads` for the reads kept in `kept` (an engine.eventloop `Kept`), taken out of it.
        When the messages of every kept read can be framed in one pass (`Kept.take_framed`: whole
        chunks of one `framing` message each, the last read possibly ending the body) they go to
        `on_framed` at their reads' stamps without a bytes object per read; else `feed_reads`."""
        resp = self.response
        if (self.framed is not None and self.state == _CHUNK_SIZE and not self.buf and resp is not None
                and resp.status == 200):
            framed = kept.take_framed(self.framed.prefix, self.framed.suffix)
            if framed is not None:
                messages, stamps, ended = framed
                if ended:
                    self.state = _DONE
                if messages and self.on_framed(messages, stamps):
                    self.stopped = True
                return
        reads, stamps = kept.take()
        self.feed_reads(reads, stamps)

    def _skip_trailer(self, buf: bytes, pos: int) -> int:
        """Skip the complete trailer lines from ``pos`` (trailers are not kept); the empty line that ends them
        ends the response. Returns where the unread bytes start."""
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return pos
            empty = eol == pos
            pos = eol + 2
            if empty:
                self.state = _DONE
                return pos

    def eof(self) -> None:
        """The connection closed. Raises HTTPError if the response was not complete."""
        if self.state == _UNTIL_CLOSE:
            self.state = _DONE
            self.keep_alive = False
        elif self.state != _DONE:
            where = "before the response head" if self.state == _HEAD else "in the middle of the body"
            raise HTTPError(f"connection closed {where}")

    def _deliver(self, data: bytes, now: float) -> None:
        assert self.response is not None
        if self.response.status == 200:
            if not self.stopped and data and self.on_body(data, now):
                self.stopped = True
        elif len(self.response.error_body) < _ERROR_BODY_LIMIT:
            self.response.error_body = (self.response.error_body + data)[:_ERROR_BODY_LIMIT]

    def _start_body(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HTTPError(f"bad status line {lines[0][:80]!r}")
        version, status = parts[0], int(parts[1])
        reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HTTPError(f"bad header line {line[:80]!r}")
            key = name.strip().decode("latin-1").lower()
            val = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers else val
        if 100 <= status < 200:  # interim response: the real one follows
            return
        self.response = Response(status=status, reason=reason, headers=headers)
        conn = headers.get("connection", "").lower()
        self.keep_alive = "close" not in conn and (version == b"HTTP/1.1" or "keep-alive" in conn)
        te = headers.get("transfer-encoding", "").lower()
        if self.head_request or status in (204, 304):
            self.state = _DONE
        elif te:
            if te.rsplit(",", 1)[-1].strip() != "chunked":
                raise HTTPError(f"unsupported Transfer-Encoding {te!r}")
            self.state = _CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self.remaining = int(headers["content-length"])
            except ValueError:
                raise HTTPError(f"bad Content-Length {headers['content-length']!r}") from None
            self.state = _LENGTH if self.remaining > 0 else _DONE
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False


def _single_chunks(reads: list[bytes]) -> list[bytes] | None:
    """The data of each read when every read is exactly one non-empty chunk; None otherwise (the
    chunk-by-chunk parser then takes them, and says what is wrong if anything is)."""
    matches = list(map(_ONE_CHUNK, reads))
    if None in matches:
        return None
    data = list(map(_DATA, matches))
    if list(map(int, map(_SIZE, matches), repeat(16))) != list(map(len, data)):
        return None
    return data


class _FramedChunks:
    """Reads that are each exactly one chunk whose data is `prefix + message + suffix`, checked
    and unframed in whole-list passes. A read's length fixes its size line (lowercase hex, no
    extensions: what servers write), so the expected head and the message's slice are looked up
    by length, and the reads are checked at once against the chunks rebuilt from them."""

    def __init__(self, prefix: bytes, suffix: bytes) -> None:
        self.prefix, self.suffix = prefix, suffix
        self.tail = suffix + b"\r\n"  # a chunk's data ends with the suffix, the chunk with CRLF
        self.heads = _ByLength(self._layout, 0)
        self.slices = _ByLength(self._layout, 1)

    def _layout(self, length: int) -> tuple[bytes, slice]:
        """The size line and prefix of a read of `length` bytes that is one such chunk, and its
        message's slice. A length no such chunk has gets a slice of the whole read, which makes
        the rebuilt chunk longer than the read, so the check below refuses it."""
        for width in range(1, 17):
            size = length - width - 4
            if size >= len(self.prefix) + len(self.suffix) and len(f"{size:x}") == width:
                head = b"%x\r\n%s" % (size, self.prefix)
                return head, slice(len(head), length - len(self.tail))
        return b"-", slice(0, None)

    def last(self, read: bytes) -> tuple[list[bytes], bool] | None:
        """(the messages of `read`, ended) when it is whole chunks of one framed message each, the
        last possibly the terminal chunk with no trailers (a response's last read); None otherwise."""
        chunks = _chunk_list(read)
        if chunks is None:
            return None
        datas, ended = chunks
        prefix, suffix = self.prefix, self.suffix
        start, trim = len(prefix), len(suffix)
        messages = []
        for data in datas:
            if len(data) < start + trim or not data.startswith(prefix) or not data.endswith(suffix):
                return None
            messages.append(data[start:len(data) - trim])
        return messages, ended

    def messages(self, reads: list[bytes]) -> list[bytes] | None:
        """The message of each read, or None when any read is not one such chunk."""
        lengths = list(map(len, reads))
        heads = list(map(self.heads.__getitem__, lengths))
        messages = list(map(getitem, reads, map(self.slices.__getitem__, lengths)))
        rebuilt = [self.tail] * (3 * len(reads))  # head, message, tail of each read, in order
        rebuilt[0::3] = heads
        rebuilt[1::3] = messages
        if b"".join(rebuilt) != b"".join(reads):
            return None
        return messages


class _ByLength(dict):
    """One part of `_FramedChunks._layout` by read length, computed on first use. Bounded: a
    server writes few distinct lengths, and past the bound a length is computed each time."""

    def __init__(self, layout: Callable[[int], tuple[bytes, slice]], part: int) -> None:
        super().__init__()
        self.layout, self.part = layout, part

    def __missing__(self, length: int) -> bytes | slice:
        value = self.layout(length)[self.part]
        if len(self) < 4096:
            self[length] = value
        return value


_FRAMED: dict[Framing, _FramedChunks] = {}


def _framed_table(prefix: bytes, suffix: bytes) -> _FramedChunks:
    table = _FRAMED.get((prefix, suffix))
    if table is None:
        table = _FRAMED[(prefix, suffix)] = _FramedChunks(prefix, suffix)
    return table


def _whole_chunks(data: bytes) -> tuple[bytes, bool] | None:
    """(body, ended) when `data` is a run of complete chunks, the last one possibly the terminal
    chunk with no trailers; None for anything else (the general parser takes it)."""
    chunks = _chunk_list(data)
    if chunks is None:
        return None
    datas, ended = chunks
    return (datas[0] if len(datas) == 1 else b"".join(datas)), ended


def _chunk_list(data: bytes) -> tuple[list[bytes], bool] | None:
    """(the data of each chunk, ended) when `data` is a run of complete chunks, the last one
    possibly the terminal chunk with no trailers; None for anything else."""
    pos, n = 0, len(data)
    out: list[bytes] = []
    while pos < n:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return None
        try:
            size = int(data[pos:eol], 16)
        except ValueError:  # chunk extensions, or malformed: the general parser says which
            return None
        if size < 0:
            return None
        if size == 0:
            if data[eol + 2:] != b"\r\n":
                return None
            return out, True
        end = eol + 2 + size
        if data[end:end + 2] != b"\r\n":
            return None
        out.append(data[eol + 2:end])
        pos = end + 2
    return out, False


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; it carries one request at a time."""

    __slots__ = ("transport", "loop", "parser", "waiter", "closed", "kept", "selector", "joined_fd")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        # Reads of a chunked body kept with their stamps, parsed when the response may have ended;
        # while `kept.keeping` (a chunked body is being read) a read is only stamped and kept.
        self.kept = Kept()
        self.selector: StreamSelector | None = None  # the loop's selector, while it reads this socket itself
        self.joined_fd = -1  # its socket's descriptor while the selector reads it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # A read the transport gives (uvloop's loop, TLS): most are a token's chunk, kept here without
        # a second call (what `received` does first).
        kept = self.kept
        if kept.keeping and len(data) >= 4 and data[-4] != 13:
            kept.add(data, _perf_counter())
            return
        self.received(data, _perf_counter())

    def received(self, data: bytes, now: float) -> None:
        kept = self.kept
        if kept.keeping:  # most reads: a token's chunk, kept with its stamp
            kept.add(data, now)
            # A chunked response ends with a blank line ("0\r\n" [trailers] "\r\n"): a read whose
            # fourth byte from the end is not that CR cannot be its last (a token's chunk ends
            # "\n\n\r\n"). One byte looked at, not a method call; a read too short to tell goes on.
            if len(data) >= 4 and data[-4] != 13:
                return
        parser, waiter = self.parser, self.waiter
        if parser is None or waiter is None or waiter.done():
            self._close()  # bytes nobody asked for: this connection cannot be trusted for the next request
            return
        try:
            if kept:
                parser.feed_kept(kept)
            else:
                parser.feed(data, now)
        except Exception as exc:  # a malformed response, or on_body raised: this request fails
            self._fail(exc)
            return
        if parser.stopped:
            self._close()
            waiter.set_result(None)
        elif parser.done:
            kept.keeping = False
            waiter.set_result(None)
        else:
            kept.keeping = parser.state in _CHUNKED_STATES

    # eof_received is left as asyncio's default (close the transport): connection_lost then decides
    # whether the response was complete.

    def stream_eof(self, fd: int) -> None:
        """The selector read an end of file or an error: its transport reads again, meets it and
        ends the connection (connection_lost decides whether the response was complete)."""
        self._leave_selector()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def stream_failed(self, exc: BaseException) -> None:
        self._fail(exc)

    def _leave_selector(self) -> None:
        if self.joined_fd >= 0 and self.selector is not None:  # before the descriptor is closed (and reused)
            self.selector.leave(self.joined_fd, self)
        self.joined_fd = -1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._leave_selector()
        parser, waiter = self.parser, self.waiter
        if parser is None or waiter is None or waiter.done():
            return
        try:
            if self.kept:
                parser.feed_kept(self.kept)
            if parser.done:  # the kept reads held the whole response
                waiter.set_result(None)
                return
            parser.eof()
        except Exception as err:  # cut short, malformed, or on_body raised
            waiter.set_exception(err)
            return
        waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def _close(self) -> None:
        self.closed = True
        self.kept.keeping = False
        self._leave_selector()
        if self.transport is not None:
            self.transport.abort()


class StreamingHTTPClient:
    """POSTs to one origin over a pool of keep-alive connections.

    The caller bounds concurrency (the load generator's semaphore); the pool keeps every idle
    connection so that a concurrency level, once warm, reconnects nothing.
    """

    def __init__(self, base_url: str, *, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"base URL {base_url!r}: the scheme must be http or https")
        if not parts.hostname:
            raise ValueError(f"base URL {base_url!r} has no host")
        default_port = 443 if parts.scheme == "https" else 80
        self.host = parts.hostname
        self.port = parts.port or default_port
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self.ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        # Every second token ACKed (see the module's doc): True once a request showed that the
        # server sends a token while the one before it is unacknowledged, False while the requests
        # tried only saw an ACK go first, None before either; `try_acks` lets the next requests show it.
        self.halved_acks: bool | None = None
        self.try_acks = False

    @contextmanager
    def trying_acks(self) -> Iterator[None]:
        """The requests sent inside try halving the ACKs (only requests nobody measures: on a
        server that waits for ACKs a try holds a token until the delayed-ACK timer)."""
        self.try_acks = True
        try:
            yield
        finally:
            self.try_acks = False

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port, ssl=self.ssl,
                                               server_hostname=self.host if self.ssl else None)
        conn.loop = loop
        # Plain TCP on asyncio's loop with a StreamSelector: the selector reads the socket from now on.
        selector = stream_selector(loop) if self.ssl is None else None
        transport = conn.transport
        sock = transport.get_extra_info("socket") if selector is not None and transport is not None else None
        if sock is not None:
            fd = sock.fileno()
            try:
                transport.pause_reading()
                selector.join(fd, conn)
            except (OSError, ValueError, RuntimeError):
                transport.resume_reading()
            else:
                conn.selector, conn.joined_fd = selector, fd
        self._open.add(conn)
        return conn

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._open.discard(conn)
        return None

    def build_post(self, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        """The bytes of one POST (build them before the clock starts, send them with `send`)."""
        lines = [f"POST {self.base_path}{path} HTTP/1.1", f"Host: {self.host_header}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def open_connections(self, count: int) -> int:
        """Open connections until `count` are idle in the pool, all at once; returns how many were opened.
        Done before a timed run, so that its requests do not pay for (or wait on) a TCP handshake.
        Raises the first OSError when some could not be opened (those that could stay in the pool)."""
        live = [c for c in self._idle if not c.closed]
        self._idle = live
        missing = max(0, count - len(live))
        if not missing:
            return 0
        opened = await asyncio.gather(*(self._connect() for _ in range(missing)), return_exceptions=True)
        self._idle.extend(c for c in opened if isinstance(c, _Connection))
        errors = [e for e in opened if isinstance(e, BaseException)]
        if errors:  # the ones that did open stay in the pool
            raise errors[0]
        return missing

    async def post(self, path: str, body: bytes, headers: Mapping[str, str], on_body: BodySink) -> Response:
        """Send one POST and read its response to the end (or until on_body returns True).

        Raises HTTPError when the response cannot be read, OSError when the server cannot be reached.
        """
        return await self.send(self.build_post(path, body, headers), on_body)

    async def send(self, request: bytes, on_body: BodySink, on_bodies: BodiesSink | None = None,
                   on_framed: BodiesSink | None = None, framing: Framing | None = None) -> Response:
        """Send the bytes of one request (`build_post`) and read its response, as `post` does;
        `on_bodies`, when given, takes the bodies of several kept reads at once, and `on_framed`
        the messages of kept reads that are one `framing` chunk each."""
        conn = self._take_idle()
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect()
            parser = ResponseParser(on_body, on_bodies=on_bodies, on_framed=on_framed, framing=framing)
            try:
                return await self._exchange(conn, request, parser)
            except HTTPError:
                # A kept-alive connection the server had already closed: nothing of this request
                # was answered, so one more try on a fresh connection is safe.
                if reused and not parser.got_bytes:
                    reused = False
                    conn = None
                    continue
                raise

    async def _exchange(self, conn: _Connection, request: bytes, parser: ResponseParser) -> Response:
        conn.parser = parser
        kept = conn.kept
        kept.clear()
        kept.keeping = False
        halved = self.halved_acks
        # Until a try proves it, every request the caller lets try does (a refuted try may have met slow tokens).
        kept.acks = _ACKS_HALVE if halved else _ACKS_TRY if self.try_acks else _ACKS_EACH
        # The loop the connection was opened on (before Python 3.12 each get_running_loop() is a getpid() call).
        conn.waiter = waiter = (conn.loop or asyncio.get_running_loop()).create_future()
        keep = False
        try:
            if conn.closed or conn.transport is None:
                raise HTTPError("connection closed before the request was sent")
            conn.transport.write(request)
            await waiter
            assert parser.response is not None
            keep = parser.done and parser.keep_alive and not parser.stopped and not conn.closed
            return parser.response
        finally:
            conn.parser = None
            conn.waiter = None
            kept.keeping = False
            outcome, kept.acks = kept.acks, _ACKS_EACH
            # A proof is certain (a server that waits for ACKs never sends a second small segment
            # before one); an ACK going first is not (tokens slower than the delayed-ACK timer, as
            # a cold server's first ones, look the same), so it counts only while nothing proved.
            if outcome == _ACKS_PROVEN:
                self.halved_acks = True
            elif outcome == _ACKS_REFUTED and self.halved_acks is None:
                self.halved_acks = False
            if keep:
                self._idle.append(conn)
            else:
                # Cancelled, failed, stopped early or not reusable: close it (what is in flight
                # on it is not ours to read any more).
                conn._close()
                self._open.discard(conn)

    async def close(self) -> None:
        for conn in list(self._open):
            conn._close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

    async def __aenter__(self) -> StreamingHTTPClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

"""An OpenAI-compatible streaming server on a fixed schedule, cheap enough to stay far below its own
capacity while a client under test is measured against it.

Every streamed completion sends its first token `--ttft-ms` after the request arrived and one token
every `--itl-ms` after that (absolute deadlines: a late wake-up does not push the next tokens back),
`--tokens` tokens (default: the request's `max_tokens`), then the usage chunk when asked for
(`stream_options.include_usage`) and `data: [DONE]`. It does no model work: one thread, one epoll
loop over non-blocking sockets, one heap of deadlines, and chunks whose bytes are built once, so a
token costs one `send()`. A zero-delay server is the wrong test of a client (it saturates its own
core and both clients then measure the server); on a schedule the server idles between tokens.

What it records, in `time.perf_counter()` (CLOCK_MONOTONIC on Linux: one clock for every process):

* per request id (`x-request-id`): arrival (when the request's first bytes reached the server's
  socket: the kernel's receive time stamp, `SO_TIMESTAMPNS`, moved onto `perf_counter`'s clock;
  where the platform has none, when the server read it), read (when the server had read and parsed
  it), the write time of the first and the last token, the tokens sent. The schedule counts from
  the arrival, so under a burst of requests the server's own intake (reading and parsing them one
  after another) neither delays the first token nor is charged to the client. Its own lateness
  (first write minus arrival plus TTFT) is reported apart from the client's error.
* the measured window: `POST /watch {"pid": N, "count": C, "skip_ids": [prefix, ...]}` names a
  client process and its load: C measured requests, told from its test and warm-up requests by
  their `x-request-id` (one that starts with a prefix in `skip_ids` is not measured; a request
  without the header is named `anon-<n>`), or by order (`"skip_first": N`: the first N requests
  not skipped by name are the warm-up, for a client whose ids do not tell). The window opens when the first measured request
  arrives and closes when the C-th has arrived and nothing is in flight any more; at both ends the
  server reads the CPU time (user + system, from `/proc/<pid>/task/*/schedstat`, nanoseconds)
  of that process and of every process below it, so a client's CPU is read only while its
  measured requests are in flight (its start-up, tokenizer loading, warm-up and report writing do
  not count). The same ends are also read from `/proc/<pid>/stat` (user + system clock ticks of
  the whole process, threads that have ended included, plus its reaped children's), and once more
  when the first request of any kind arrives after the `/watch` (a warm-up's or a test request's
  included), so a window can be taken from the client's first request too. A closed-loop client's waves can leave nothing
  in flight for a moment between them, so the window is bounded by request counts, not by idleness.

`GET /stats` returns both as JSON; `POST /reset` forgets them. `GET /health` and `GET /v1/models`
answer; any other path gets 404 (e.g. a client's `/metrics` scrape).

    python benchmarks/scheduled_server.py [--port 0 --ttft-ms 80 --itl-ms 10 --tokens 64] [--nagle]

Its sockets set TCP_NODELAY, as asyncio's and uvloop's servers (vLLM, SGLang) do; `--nagle` leaves
Nagle's algorithm on, for a server whose next small write waits for the client's ACK of the last.

prints `PORT <n>` once it listens.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import selectors
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_HEAD_LIMIT = 64 * 1024
# The kernel's receive time stamp of a read (Linux): SO_TIMESTAMPNS, a struct timespec on CLOCK_REALTIME.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)
_TIMESPEC = struct.Struct("@qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


def realtime_offset() -> float:
    """CLOCK_REALTIME minus perf_counter's clock (s), from the closest of a few paired reads."""
    best = None
    for _ in range(5):
        a = time.perf_counter_ns()
        wall = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, wall - (a + b) // 2)
    assert best is not None
    return best[1] / 1e9


def _chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk of `payload`."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces: fields after the last ')'
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_cpu_s(pids: list[int]) -> float:
    """CPU time (s) of the processes in `pids` from `/proc/<pid>/stat`: utime + stime (every thread,
    ended ones included) + cutime + cstime (children it has waited for), in clock ticks."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        total += sum(int(v) for v in fields[11:15])
    return total / _TICK


def cpu_ns(pids: list[int]) -> dict[int, int]:
    """CPU time (ns) run so far by the live threads of each process in `pids`."""
    out: dict[int, int] = {}
    for pid in pids:
        total = 0
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_bytes().split()[0])
                except (OSError, ValueError, IndexError):
                    pass  # a thread that just ended
        except OSError:
            continue  # the process ended
        out[pid] = total
    return out


@dataclass
class Window:
    """One busy period: completions in flight from `start` to `end`."""

    start: float
    end: float = 0.0
    requests: int = 0
    tokens: int = 0
    cpu_start: dict[int, int] = field(default_factory=dict)
    cpu_end: dict[int, int] = field(default_factory=dict)
    stat_start: float = 0.0  # /proc/<pid>/stat CPU of the tree (s) at the ends
    stat_end: float = 0.0
    first_any: float = 0.0  # the first request of any kind after /watch: its arrival and the tree's stat CPU then
    stat_first_any: float = 0.0

    def to_dict(self) -> dict:
        # processes alive at both ends; one that started inside the window counts whole
        cpu = sum(v - self.cpu_start.get(pid, 0) for pid, v in self.cpu_end.items())
        return {"start": self.start, "end": self.end, "requests": self.requests, "tokens": self.tokens,
                "client_cpu_s": cpu / 1e9 if self.cpu_end else None, "pids": sorted(self.cpu_end),
                "client_stat_cpu_s": self.stat_end - self.stat_start if self.cpu_end else None,
                "first_any": self.first_any, "stat_first_any": self.stat_first_any,
                "stat_start": self.stat_start, "stat_end": self.stat_end,
                "client_stat_cpu_from_first_any_s": self.stat_end - self.stat_first_any if self.cpu_end else None}


class _Stream:
    __slots__ = ("conn", "rid", "tokens", "sent", "due", "usage", "prompt_tokens", "chat", "arrival", "first",
                 "last", "measured", "read")

    def __init__(self, conn: "_Conn", rid: str, tokens: int, usage: bool, prompt_tokens: int, chat: bool,
                 arrival: float) -> None:
        self.conn, self.rid, self.tokens, self.usage = conn, rid, tokens, usage
        self.prompt_tokens, self.chat, self.arrival = prompt_tokens, chat, arrival
        self.sent = 0
        self.due = 0.0
        self.first = self.last = 0.0
        self.read = arrival
        self.measured = False


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "stream", "closed", "got")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.got = 0.0  # the arrival of the first unread bytes in inbuf (0: not known)
        self.inbuf = b""
        self.outbuf = b""
        self.stream: _Stream | None = None
        self.closed = False


class ScheduledServer:
    def __init__(self, ttft_s: float, itl_s: float, tokens: int | None = None, port: int = 0,
                 nagle: bool = False) -> None:
        self.ttft_s, self.itl_s, self.tokens = ttft_s, itl_s, tokens
        self.nagle = nagle
        self.listener = socket.create_server(("127.0.0.1", port), backlog=4096)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.heap: list[tuple[float, int, _Stream]] = []
        self.seq = 0
        self.in_flight = 0
        self.anon = 0
        self.requests: dict[str, dict] = {}
        self.windows: list[Window] = []
        self.watch_pid: int | None = None
        self.skip_ids: tuple[str, ...] = ()
        self.count = 0
        self.skip_first = 0
        self.arrived = 0  # measured completions arrived since the last /watch
        self.seen = 0  # completions arrived since the last /watch that no skip_ids prefix named
        self.first_any: tuple[float, float] | None = None  # (arrival, the tree's stat CPU) of the first since /watch
        self.tree: list[int] | None = None  # the watched process tree, found at its first request
        self.stamps = _SO_TIMESTAMPNS is not None and _ANC_SIZE > 0
        self.clock_offset = realtime_offset()
        self._token_bytes = {False: self._content(False), True: self._content(True)}

    @staticmethod
    def _content(chat: bool) -> bytes:
        if chat:
            data = b'{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" t"},' \
                   b'"finish_reason":null}]}'
        else:
            data = b'{"object":"text_completion","choices":[{"index":0,"text":" t","finish_reason":null}]}'
        return _chunk(b"data: " + data + b"\n\n")

    # ---- the loop -------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        perf = time.perf_counter
        while True:
            timeout = max(0.0, self.heap[0][0] - perf()) if self.heap else None
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    self._accept()
                elif mask & selectors.EVENT_READ:
                    self._read(key.data)
                if mask & selectors.EVENT_WRITE and not key.data.closed:
                    self._flush(key.data)
            now = perf()
            heap = self.heap
            while heap and heap[0][0] <= now:
                _, _, st = heapq.heappop(heap)
                self._send_token(st, now)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            if not self.nagle:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.stamps:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                except OSError:
                    self.stamps = False
            conn = _Conn(sock)
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        got = 0.0
        try:
            if self.stamps:
                data, anc, _flags, _addr = conn.sock.recvmsg(65536, _ANC_SIZE)
                for level, kind, cdata in anc:
                    if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(cdata) >= _TIMESPEC.size:
                        sec, nsec = _TIMESPEC.unpack_from(cdata)
                        got = sec + nsec / 1e9 - self.clock_offset
            else:
                data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if not conn.inbuf:
            conn.got = got
        conn.inbuf += data
        if len(conn.inbuf) > _HEAD_LIMIT + (1 << 20):
            self._close(conn)
            return
        self._parse_requests(conn)

    def _request(self, conn: _Conn, method: str, path: str, headers: dict[str, str], body: bytes,
                 got: float = 0.0) -> None:
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self._start_stream(conn, path.endswith("chat/completions"), headers, body, got)
        elif method == "GET" and path == "/health":
            self._reply(conn, 200, b"ok", b"text/plain")
        elif method == "GET" and path == "/v1/models":
            self._reply(conn, 200, b'{"object":"list","data":[{"id":"fake","object":"model","root":"fake"}]}')
        elif method == "GET" and path == "/stats":
            self._reply(conn, 200, json.dumps(self.stats()).encode())
        elif method == "POST" and path == "/watch":
            spec = json.loads(body or b"{}")
            self.watch_pid, self.count = int(spec["pid"]), int(spec["count"])
            self.skip_ids = tuple(spec.get("skip_ids", ()))
            self.skip_first = int(spec.get("skip_first", 0))
            self.arrived = self.seen = 0
            self.first_any = None
            self.tree = None
            self.clock_offset = realtime_offset()
            self._reply(conn, 200, b"{}")
        elif method == "POST" and path == "/reset":
            self.requests.clear()
            self.windows.clear()
            self._reply(conn, 200, b"{}")
        else:
            self._reply(conn, 404, b'{"error":"not found"}')

    def _reply(self, conn: _Conn, status: int, body: bytes, ctype: bytes = b"application/json") -> None:
        reason = b"OK" if status == 200 else b"Not Found"
        self._write(conn, b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, reason, ctype, len(body), body))

    def _start_stream(self, conn: _Conn, chat: bool, headers: dict[str, str], body: bytes, got: float) -> None:
        read = time.perf_counter()
        # the kernel's stamp when it is sane (not after the read, nor from before a clock step)
        now = got if read - 1.0 < got <= read else read
        req = json.loads(body)
        tokens = self.tokens or int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        prompt = req.get("prompt") if not chat else req.get("messages")
        prompt_tokens = len(prompt) if isinstance(prompt, list) and not chat else len(str(prompt).split())
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.anon += 1
        rid = headers.get("x-request-id") or f"anon-{self.anon}"
        st = _Stream(conn, rid, tokens, usage, prompt_tokens, chat, now)
        st.read = read
        conn.stream = st
        self.in_flight += 1
        if self.count and self.first_any is None:
            # the tree is found here, at a request that is not measured: a scan of /proc takes milliseconds,
            # which at the first measured request would hold up the rest of its burst
            self.tree = process_tree(self.watch_pid) if self.watch_pid is not None else None
            self.first_any = (now, stat_cpu_s(self.tree) if self.tree is not None else 0.0)
        named_skip = rid.startswith(self.skip_ids)
        if self.count and not named_skip:
            self.seen += 1
        st.measured = (bool(self.count) and not named_skip and self.seen > self.skip_first
                       and self.arrived < self.count)
        if st.measured:
            self.arrived += 1
            if self.arrived == 1:
                self._open_window(now)
            self.windows[-1].requests += 1
        self._write(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n")
        st.due = now + self.ttft_s
        self._schedule(st)

    def _schedule(self, st: _Stream) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (st.due, self.seq, st))

    def _send_token(self, st: _Stream, now: float) -> None:
        conn = st.conn
        if conn.closed:
            self._end_stream(st, now)
            return
        # stamped as it is written: a burst of tokens due at once goes out one send() after another
        written = time.perf_counter()
        if st.sent == 0:
            st.first = written
        st.sent += 1
        st.last = written
        out = self._token_bytes[st.chat]
        if st.sent >= st.tokens:
            if st.usage:
                out += _chunk(b'data: {"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,'
                              b'"total_tokens":%d}}\n\n' % (st.prompt_tokens, st.sent, st.prompt_tokens + st.sent))
            out += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
            self._write(conn, out)
            conn.stream = None
            self._end_stream(st, now)
            if conn.inbuf and not conn.closed:  # a pipelined next request
                self._parse_requests(conn)
            return
        self._write(conn, out)
        st.due += self.itl_s
        self._schedule(st)

    def _parse_requests(self, conn: _Conn) -> None:
        while conn.stream is None and not conn.closed:
            end = conn.inbuf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = conn.inbuf[:end].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
            length = int(headers.get("content-length", "0") or 0)
            if len(conn.inbuf) < end + 4 + length:
                return
            body = conn.inbuf[end + 4:end + 4 + length]
            conn.inbuf = conn.inbuf[end + 4 + length:]
            got = conn.got  # a pipelined request behind it is taken to have come with it
            if not conn.inbuf:
                conn.got = 0.0
            method, _, rest = head[0].partition(" ")
            self._request(conn, method, rest.split(" ", 1)[0].split("?", 1)[0], headers, body, got)

    def _end_stream(self, st: _Stream, now: float) -> None:
        self.requests[st.rid] = {"arrival": st.arrival, "read": st.read, "first": st.first, "last": st.last,
                                 "tokens": st.sent}
        self.in_flight -= 1
        if not self.windows or self.windows[-1].end:
            return
        w = self.windows[-1]
        if st.measured:
            w.tokens += st.sent
        if self.in_flight == 0 and self.arrived >= self.count:
            w.end = now
            if self.watch_pid is not None:
                tree = process_tree(self.watch_pid)
                w.cpu_end = cpu_ns(tree)
                w.stat_end = stat_cpu_s(tree)


    def _open_window(self, now: float) -> None:
        w = Window(start=now)
        if self.first_any is not None:
            w.first_any, w.stat_first_any = self.first_any
        if self.watch_pid is not None:
            tree = self.tree if self.tree is not None else process_tree(self.watch_pid)
            w.cpu_start = cpu_ns(tree)
            w.stat_start = stat_cpu_s(tree)
        self.windows.append(w)

    def _write(self, conn: _Conn, data: bytes) -> None:
        if conn.closed:
            return
        if conn.outbuf:
            conn.outbuf += data
            return
        try:
            n = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self._close(conn)
            return
        if n < len(data):
            conn.outbuf = data[n:]
            self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.outbuf = conn.outbuf[n:]
        if not conn.outbuf:
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def stats(self) -> dict:
        return {"ttft_s": self.ttft_s, "itl_s": self.itl_s, "requests": self.requests, "arrived": self.arrived,
                "in_flight": self.in_flight,
                "windows": [w.to_dict() for w in self.windows if w.end]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=80.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per completion (default: its max_tokens)")
    ap.add_argument("--nagle", action="store_true",
                    help="leave Nagle's algorithm on (no TCP_NODELAY): a server whose next small write waits "
                         "for the client's ACK of the last")
    args = ap.parse_args(argv)
    server = ScheduledServer(args.ttft_ms / 1000, args.itl_ms / 1000, args.tokens, args.port, nagle=args.nagle)
    print(f"PORT {server.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()

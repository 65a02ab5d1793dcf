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

* per request id (`x-request-id`): arrival (the request fully read), the write time of the first
  and the last token, the tokens sent. Its own lateness (first write minus arrival plus TTFT) is
  reported apart from the client's error.
* the measured window: `POST /watch {"pid": N, "count": C, "skip_ids": [prefix, ...]}` names a
  client process and its load: C measured requests, told from its test and warm-up requests by
  their `x-request-id` (one that starts with a prefix in `skip_ids` is not measured; a request
  without the header is named `anon-<n>`). The window opens when the first measured request
  arrives and closes when the C-th has arrived and nothing is in flight any more; at both ends the
  server reads the CPU time (user + system, from `/proc/<pid>/task/*/schedstat`, nanoseconds)
  of that process and of every process below it, so a client's CPU is read only while its
  measured requests are in flight (its start-up, tokenizer loading, warm-up and report writing do
  not count). A closed-loop client's waves can leave nothing
  in flight for a moment between them, so the window is bounded by request counts, not by idleness.

`GET /stats` returns both as JSON; `POST /reset` forgets them. `GET /health` and `GET /v1/models`
answer; any other path gets 404 (e.g. a client's `/metrics` scrape).

    python benchmarks/scheduled_server.py [--port 0 --ttft-ms 80 --itl-ms 10 --tokens 64]

prints `PORT <n>` once it listens.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_HEAD_LIMIT = 64 * 1024


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

    def to_dict(self) -> dict:
        # processes alive at both ends; one that started inside the window counts whole
        cpu = sum(v - self.cpu_start.get(pid, 0) for pid, v in self.cpu_end.items())
        return {"start": self.start, "end": self.end, "requests": self.requests, "tokens": self.tokens,
                "client_cpu_s": cpu / 1e9 if self.cpu_end else None, "pids": sorted(self.cpu_end)}


class _Stream:
    __slots__ = ("conn", "rid", "tokens", "sent", "due", "usage", "prompt_tokens", "chat", "arrival", "first",
                 "last", "measured")

    def __init__(self, conn: "_Conn", rid: str, tokens: int, usage: bool, prompt_tokens: int, chat: bool,
                 arrival: float) -> None:
        self.conn, self.rid, self.tokens, self.usage = conn, rid, tokens, usage
        self.prompt_tokens, self.chat, self.arrival = prompt_tokens, chat, arrival
        self.sent = 0
        self.due = 0.0
        self.first = self.last = 0.0
        self.measured = False


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "stream", "closed")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = b""
        self.outbuf = b""
        self.stream: _Stream | None = None
        self.closed = False


class ScheduledServer:
    def __init__(self, ttft_s: float, itl_s: float, tokens: int | None = None, port: int = 0) -> None:
        self.ttft_s, self.itl_s, self.tokens = ttft_s, itl_s, tokens
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
        self.arrived = 0  # measured completions arrived since the last /watch
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
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        if len(conn.inbuf) > _HEAD_LIMIT + (1 << 20):
            self._close(conn)
            return
        self._parse_requests(conn)

    def _request(self, conn: _Conn, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self._start_stream(conn, path.endswith("chat/completions"), headers, body)
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
            self.arrived = 0
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

    def _start_stream(self, conn: _Conn, chat: bool, headers: dict[str, str], body: bytes) -> None:
        now = time.perf_counter()
        req = json.loads(body)
        tokens = self.tokens or int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        prompt = req.get("prompt") if not chat else req.get("messages")
        prompt_tokens = len(prompt) if isinstance(prompt, list) and not chat else len(str(prompt).split())
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.anon += 1
        rid = headers.get("x-request-id") or f"anon-{self.anon}"
        st = _Stream(conn, rid, tokens, usage, prompt_tokens, chat, now)
        conn.stream = st
        self.in_flight += 1
        st.measured = bool(self.count) and not rid.startswith(self.skip_ids) and self.arrived < self.count
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
        if st.sent == 0:
            st.first = now
        st.sent += 1
        st.last = now
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
            method, _, rest = head[0].partition(" ")
            self._request(conn, method, rest.split(" ", 1)[0].split("?", 1)[0], headers, body)

    def _end_stream(self, st: _Stream, now: float) -> None:
        self.requests[st.rid] = {"arrival": st.arrival, "first": st.first, "last": st.last, "tokens": st.sent}
        self.in_flight -= 1
        if not self.windows or self.windows[-1].end:
            return
        w = self.windows[-1]
        if st.measured:
            w.tokens += st.sent
        if self.in_flight == 0 and self.arrived >= self.count:
            w.end = now
            if self.watch_pid is not None:
                w.cpu_end = cpu_ns(process_tree(self.watch_pid))


    def _open_window(self, now: float) -> None:
        w = Window(start=now)
        if self.watch_pid is not None:
            w.cpu_start = cpu_ns(process_tree(self.watch_pid))
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
    args = ap.parse_args(argv)
    server = ScheduledServer(args.ttft_ms / 1000, args.itl_ms / 1000, args.tokens, args.port)
    print(f"PORT {server.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()

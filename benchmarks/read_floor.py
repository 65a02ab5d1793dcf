"""The kernel's share of a streaming client's cost per token: a server process writes one 160-byte
chunk every 10 ms on each of N loopback connections; the client (uvloop, one Protocol per
connection) only counts and stamps each read. Printed: the client's user and system CPU per read
over the steady seconds, for each mode given:

* ``plain``: what any asyncio/uvloop client does;
* ``noquickack``: ``TCP_QUICKACK = 0`` set at connect and again after every read (Linux leaves
  quick-ack mode again by itself), to see whether the ACK each small read triggers is what the
  system time pays for.

    python benchmarks/read_floor.py [N] [plain noquickack ...]   (Linux; server on CPU 1, client on CPU 0)

This is the floor under ``benchmarks/client_cost.py``'s CPU-per-token figure: one read per token
is what a client that stamps every token must do.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import resource
import socket
import sys
import time

SECONDS, CHUNK = 6.0, b"x" * 160


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(0, {cpu})


def serve(n: int, port_queue: mp.Queue) -> None:
    _pin(1)

    async def main() -> None:
        writers: list[asyncio.StreamWriter] = []

        async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port_queue.put(server.sockets[0].getsockname()[1])
        while len(writers) < n:
            await asyncio.sleep(0.01)
        while writers and not any(w.is_closing() for w in writers):
            for w in writers:
                w.write(CHUNK)
            await asyncio.sleep(0.01)
        for w in writers:
            w.close()

    asyncio.run(main())


def measure(n: int, port: int, mode: str) -> str:
    _pin(0)
    import uvloop

    reads = [0]

    class Stamp(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.sock = transport.get_extra_info("socket")
            if mode == "noquickack":
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)

        def data_received(self, data: bytes) -> None:
            reads[0] += 1
            self.stamp = time.perf_counter()
            if mode == "noquickack":
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)

    async def main() -> str:
        loop = asyncio.get_running_loop()
        conns = [await loop.create_connection(Stamp, "127.0.0.1", port) for _ in range(n)]
        await asyncio.sleep(1.0)  # connections set up, the server in its steady schedule
        r0, n0 = resource.getrusage(resource.RUSAGE_SELF), reads[0]
        await asyncio.sleep(SECONDS - 1.0)
        r1, count = resource.getrusage(resource.RUSAGE_SELF), reads[0] - n0
        for transport, _ in conns:
            transport.close()
        return (f"{mode:<11} N={n} reads={count} user {1e6 * (r1.ru_utime - r0.ru_utime) / count:.2f} us/read "
                f"sys {1e6 * (r1.ru_stime - r0.ru_stime) / count:.2f} us/read")

    return uvloop.run(main())


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    for mode in sys.argv[2:] or ["plain", "noquickack"]:
        if mode not in ("plain", "noquickack"):
            raise SystemExit(f"unknown mode {mode!r}: plain or noquickack")
        ports: mp.Queue = mp.Queue()
        server = mp.Process(target=serve, args=(n, ports))
        server.start()
        print(measure(n, ports.get(timeout=30), mode), flush=True)
        server.join(timeout=10)
        if server.is_alive():
            server.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A small HTTP server on a unix socket, in a thread of the test: the stand-in for the Docker
Engine API that the docker SDK talks to (subclasses answer in ``_handle``)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from aiohttp import web


class UnixHTTPServer:
    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    def __enter__(self):
        def run() -> None:
            asyncio.set_event_loop(self._loop)
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.UnixSite(self._runner, str(self.sock)).start())
            self._ready.set()
            self._loop.run_forever()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), f"the test server on {self.sock} did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

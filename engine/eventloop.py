"""The asyncio event loop a process runs on: uvloop where it is installed (the ``fast`` extra),
else asyncio's own. The benchmark's load generator and the built-in server both choose with
``event_loop: auto | uvloop | asyncio``."""

from __future__ import annotations

import asyncio
from typing import Any

EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def event_loop_name(choice: str = "auto") -> str:
    """The event loop a run gets: uvloop where it is installed (the `fast` extra) unless asked for
    asyncio's own; "uvloop" when it is not installed is an error."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop {choice!r}: choose one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError("event loop uvloop: it is not installed (pip install 'magpie-workbench[fast]' "
                             "or pip install uvloop)") from None
        return "asyncio"
    return "uvloop"


def run_coroutine(coro: Any, event_loop: str = "auto") -> Any:
    """Run `coro` to its end in a fresh event loop of the kind `event_loop_name` picks."""
    if event_loop_name(event_loop) == "asyncio":
        return asyncio.run(coro)
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

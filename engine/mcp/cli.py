"""``magpie mcp`` / ``python -m engine.mcp``: serve the tools over stdio (default) or streamable HTTP.

Over HTTP every request needs ``Authorization: Bearer <token>``: the token comes from
``MAGPIE_MCP_TOKEN`` or is generated and printed once on stderr. The server binds 127.0.0.1 unless
``--allow-remote`` is given. stdout belongs to the stdio protocol, so everything else goes to stderr.

An HTTP session (``mcp-session-id``) that has had no request in flight for
``--session-idle-timeout`` seconds (no call being served, no open GET event stream) is closed by the
SDK's session manager and its memory freed; its id then answers 404 "Session not found", and the
client initializes a new one. A session in use is never closed, and jobs are the server's (detached
processes in the job API), never a session's: an expired session's jobs go on, and any session finds
them by id.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from pathlib import Path
from typing import Optional, Sequence

from engine.errors import MagpieError, format_error
from engine.mcp.security import TOKEN_ENV, BearerAuth, check_bind, new_token, transport_security

EXIT_USAGE = 2
DEFAULT_SESSION_IDLE_TIMEOUT_S = 30 * 60


def _idle_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds >= 0 (0: sessions never expire)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="magpie mcp", description="Serve the workbench's tools to agents (MCP).")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio (default; the client starts the server) or streamable HTTP")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1; others need "
                                                       "--allow-remote)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0 picks a free one)")
    p.add_argument("--path", default="/mcp", help="HTTP endpoint path (default /mcp)")
    p.add_argument("--root", action="append", default=[], metavar="DIR",
                   help="a folder tool paths may lie in (repeatable; default the current directory)")
    p.add_argument("-o", "--output-dir", help="results root for new runs (default ROOT/results, under a root)")
    p.add_argument("--allow-remote", action="store_true", help="allow an HTTP bind address other than loopback")
    p.add_argument("--allow-commands", action="store_true",
                   help="run caller-given code: compile/testcase command lines given as tool arguments, the "
                        "command keys and non-bundled kernel overrides of inline benchmark configs, and docker "
                        "images other than the engine's own (default: only configs on disk)")
    p.add_argument("--session-idle-timeout", type=_idle_seconds, default=None, metavar="SECONDS",
                   help="HTTP: close a session with no request in flight (no call being served, no open event "
                        f"stream) for this long; its id then answers 404 (default {DEFAULT_SESSION_IDLE_TIMEOUT_S}, "
                        "30 min; 0: never). Jobs are not the session's: they go on")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.transport == "stdio" and args.session_idle_timeout is not None:
        print("error: --session-idle-timeout applies to --transport http (a stdio session ends with its client)",
              file=sys.stderr)
        return EXIT_USAGE
    if args.transport == "http":
        refusal = check_bind(args.host, args.allow_remote)
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return EXIT_USAGE
    try:
        from engine.mcp.server import ServerOptions, build_server
    except ImportError as exc:  # the mcp extra is not installed: one line, not a traceback
        from engine.jobs.query import missing_extra_error
        missing = missing_extra_error(exc, "mcp", "magpie mcp (the MCP server)")
        if missing is None:
            raise
        print(format_error(missing), file=sys.stderr)
        return EXIT_USAGE
    options = ServerOptions(roots=[Path(r) for r in args.root] or [Path.cwd()], allow_commands=args.allow_commands,
                            output_dir=Path(args.output_dir) if args.output_dir else None)
    try:
        app = build_server(options)
    except MagpieError as exc:
        print(format_error(exc), file=sys.stderr)
        return EXIT_USAGE
    roots = ", ".join(map(str, app.state.roots.roots))
    print(f"magpie mcp: roots {roots}; results {app.state.results}; commands "
          f"{'allowed' if args.allow_commands else 'refused'}", file=sys.stderr, flush=True)
    if args.transport == "stdio":
        app.run("stdio")
        return 0
    idle = DEFAULT_SESSION_IDLE_TIMEOUT_S if args.session_idle_timeout is None else args.session_idle_timeout
    return serve_http(app, args.host, args.port, args.path, session_idle_timeout=idle or None)


def serve_http(app, host: str, port: int, path: str,
               session_idle_timeout: Optional[float] = DEFAULT_SESSION_IDLE_TIMEOUT_S) -> int:
    """Serve ``app`` over streamable HTTP; ``session_idle_timeout`` (seconds, None: never) is the
    SDK session manager's own expiry of idle sessions."""
    import anyio
    import uvicorn

    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        token = new_token()
        print(f"magpie mcp: generated token (shown once; set {TOKEN_ENV} to choose one): {token}", file=sys.stderr,
              flush=True)
    # On loopback (any loopback address) Host/Origin are checked against DNS rebinding; on another
    # address the bearer token is the gate (a browser page cannot add it).
    security = transport_security(host)
    asgi = BearerAuth(app.streamable_http_app(streamable_http_path=path, host=host, transport_security=security,
                                              session_idle_timeout=session_idle_timeout), token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        print(f"error: cannot bind {host}:{port}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    sock.listen(128)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    expiry = f"after {session_idle_timeout:g} s with nothing in flight" if session_idle_timeout else "never"
    print(f"magpie mcp: idle sessions expire {expiry}", file=sys.stderr, flush=True)
    print(f"magpie mcp: serving streamable HTTP on http://{shown}:{bound}{path}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    anyio.run(lambda: server.serve(sockets=[sock]))
    return 0

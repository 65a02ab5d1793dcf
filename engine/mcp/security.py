"""What the MCP server lets a caller touch: paths under the allowed roots, commands only when the
server was started with ``--allow-commands``, and over HTTP only a caller holding the bearer token.

Magpie's server binds every interface without authentication while its tools run caller-supplied
command lines; these checks are the reason this one can be left running on a shared GPU box.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import socket
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from engine.errors import MagpieError

TOKEN_ENV = "MAGPIE_MCP_TOKEN"
# Paths the HTTP transport serves without a token: a liveness probe that reveals nothing.
PUBLIC_PATHS = frozenset({"/health"})


class AccessRefused(MagpieError):
    """A path outside the roots, or a command the server was not allowed to run."""
    title = "refused"


class Roots:
    """The folders a caller's paths must lie in (after symlinks are resolved); the first is where
    relative paths start."""

    def __init__(self, roots: Iterable[Path | str]) -> None:
        resolved = [Path(r).expanduser().resolve() for r in roots]
        if not resolved:
            raise ValueError("at least one root is needed")
        missing = [str(r) for r in resolved if not r.is_dir()]
        if missing:
            raise AccessRefused(f"--root {missing[0]}: not a folder", hint="give existing folders with --root DIR")
        self.roots: list[Path] = list(dict.fromkeys(resolved))

    @property
    def first(self) -> Path:
        return self.roots[0]

    def contains(self, path: Path) -> bool:
        return any(path == r or path.is_relative_to(r) for r in self.roots)

    def resolve(self, value: str | Path, argument: str) -> Path:
        """``value`` as an absolute path inside a root, or AccessRefused naming the argument."""
        text = str(value).strip()
        if not text:
            raise AccessRefused(f"{argument}: empty path")
        p = Path(text).expanduser()
        p = (p if p.is_absolute() else self.first / p).resolve()
        if not self.contains(p):
            raise AccessRefused(
                f"{argument}: {text} resolves to {p}, outside the allowed roots ({', '.join(map(str, self.roots))})",
                hint="use a path under a root, or restart the server with --root DIR for that folder")
        return p

    def resolve_all(self, values: Sequence[str], argument: str) -> list[Path]:
        return [self.resolve(v, f"{argument}[{i}]") for i, v in enumerate(values)]

    def check_inside(self, path: Path, what: str) -> None:
        """A path that a config on disk names (a source file, a working directory)."""
        p = Path(path).resolve()
        if not self.contains(p):
            raise AccessRefused(f"{what}: {p} is outside the allowed roots ({', '.join(map(str, self.roots))})",
                                hint="move the files under a root, or restart the server with --root DIR")


def require_commands(allowed: bool, arguments: dict[str, Any]) -> None:
    """Refuse command lines given as tool arguments unless the server runs with --allow-commands."""
    given = [name for name, value in arguments.items() if value not in (None, "", [], {})]
    if given and not allowed:
        raise AccessRefused(
            f"{', '.join(given)}: this server does not run command lines given by a caller",
            hint="restart it with --allow-commands, or put the commands in a kernel config on disk under a root "
                 "and pass kernel_config")


def new_token() -> str:
    return secrets.token_urlsafe(32)


class BearerAuth:
    """ASGI middleware: every request but the public paths needs ``Authorization: Bearer <token>``,
    compared in constant time."""

    def __init__(self, app: Any, token: str) -> None:
        if not token:
            raise ValueError("an HTTP server needs a token")
        self.app, self._token = app, token.encode()

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for key, value in headers:
            if key.lower() == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)
        return False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in PUBLIC_PATHS or self.authorized(scope.get("headers", [])):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": "unauthorized", "message": "missing or wrong bearer token",
                           "hint": f"send 'Authorization: Bearer <token>' (the server's {TOKEN_ENV})"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="magpie"'),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class NotAnAddress(AccessRefused):
    """A --host that is neither an IP address nor a name that resolves."""


def host_addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``host`` stands for: itself when it is an IP address (IPv6 may be written in
    brackets), else every address the name resolves to. AccessRefused when it resolves to none."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return [ipaddress.ip_address(text.split("%", 1)[0])]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise NotAnAddress(f"--host {host}: not an IP address, and the name does not resolve ({exc})",
                           hint="give an address (127.0.0.1, ::1) or a name that resolves") from None
    found = []
    for info in infos:
        try:
            found.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    if not found:
        raise NotAnAddress(f"--host {host}: the name resolves to no IP address")
    return list(dict.fromkeys(found))


def is_loopback(host: str) -> bool:
    """True when every address ``host`` stands for is a loopback address (all of 127.0.0.0/8,
    ::1, an IPv4-mapped 127.x): checked as addresses, never as a string prefix. A name is
    resolved first; a name that does not resolve raises AccessRefused."""
    addresses = host_addresses(host)
    return all(a.is_loopback or (isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None
                                 and a.ipv4_mapped.is_loopback) for a in addresses)


def check_bind(host: str, allow_remote: bool) -> Optional[str]:
    """None when the bind is allowed, else the refusal's text."""
    try:
        loopback = is_loopback(host)
    except AccessRefused as exc:
        return exc.message
    if loopback or allow_remote:
        return None
    return (f"--host {host}: binding anything but loopback exposes the tools to the network; add --allow-remote "
            "if that is intended (a bearer token is still required)")


def _host_header(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def transport_security(host: str) -> Any:
    """The SDK's Host/Origin checks (DNS rebinding protection) for a server bound to ``host``.

    On loopback (any loopback address, not only the three the SDK knows, whose own default turns
    the checks off for every other address) they are on: a request must name the bound address,
    127.0.0.1, localhost or [::1] in Host, and an Origin, when sent, must be one of those over http.
    On another address (``--allow-remote``) they are off and the bearer token is the gate: Host
    names vary with the network, and a browser page cannot add the token."""
    from mcp.server.transport_security import TransportSecuritySettings
    if not is_loopback(host):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = list(dict.fromkeys([_host_header(host.strip()), "127.0.0.1", "localhost", "[::1]"]))
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[f"{n}:*" for n in names],
                                     allowed_origins=[f"http://{n}:*" for n in names])

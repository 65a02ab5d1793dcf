"""Abandoned MCP sessions: what they cost the server, and whether expiry gives it back.

Starts ``magpie mcp --transport http`` as a real subprocess on 127.0.0.1 (a checkout of your
choice: ``--repo``, default this one), then in each round opens ``--sessions`` streamable-HTTP
sessions (one ``initialize`` each, read to its end; no ``notifications/initialized``, no GET
stream, no DELETE: the client just goes away) and reads the server's resident memory (``VmRSS``
of /proc/PID/status) after they are open and again after waiting ``--wait`` seconds. A server
that expires idle sessions (``--session-idle-timeout``, given when the checkout's ``magpie mcp``
has the flag) has dropped them by then; one that keeps them holds their memory, and the next
round adds to it. At the end a sample of the ids opened is sent ``tools/list``: 404 is the SDK's
"session not found" (expired), 200 a session still held.

    python benchmarks/mcp_sessions.py [--sessions 2000 --rounds 2 --idle-timeout 5 --repo PATH --json FILE]

Before/after a change: run it once on a worktree of the old commit (``git worktree add
/tmp/mcp_before HEAD``, then ``--repo /tmp/mcp_before``) and once here, on the same machine state.
The server is started with this interpreter; only ``engine/`` comes from ``--repo``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "mcp_sessions", "version": "0"}}}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def has_idle_flag(repo: Path, env: dict) -> bool:
    out = subprocess.run([sys.executable, "-m", "engine.mcp", "--help"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=60)
    return "--session-idle-timeout" in out.stdout


def start_server(repo: Path, root: Path, env: dict, idle_timeout: float | None) -> tuple[subprocess.Popen, str, int]:
    cmd = [sys.executable, "-m", "engine.mcp", "--transport", "http", "--port", "0", "--root", str(root),
           "-o", str(root / "results")]
    if idle_timeout is not None:
        cmd += ["--session-idle-timeout", str(idle_timeout)]
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "serving streamable HTTP on " in line:
            url = line.rsplit(" ", 1)[1].strip()
            hostport, _, path = url.removeprefix("http://").partition("/")
            return proc, "/" + path, int(hostport.rsplit(":", 1)[1])
    proc.kill()
    raise RuntimeError(f"the server did not start: {proc.stderr.read()}")


class Client:
    """One keep-alive HTTP connection; every request a plain MCP POST with the token."""

    def __init__(self, port: int, path: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.path = path

    def post(self, body: dict, session: str | None = None) -> tuple[int, str | None]:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream"}
        if session:
            headers.update({"mcp-session-id": session, "mcp-protocol-version": "2025-06-18"})
        self.conn.request("POST", self.path, body=json.dumps(body), headers=headers)
        resp = self.conn.getresponse()
        resp.read()  # the SSE answer ends when the response is sent
        return resp.status, resp.getheader("mcp-session-id")

    def open_session(self) -> str:
        status, session = self.post(INITIALIZE)
        if status != 200 or not session:
            raise RuntimeError(f"initialize answered {status}")
        return session

    def close(self) -> None:
        self.conn.close()


def open_sessions(port: int, path: str, n: int, connections: int) -> list[str]:
    """``n`` sessions opened over ``connections`` keep-alive connections at once (each initialize
    answer takes about 40 ms to end here, so one connection would take minutes), then closed."""
    def some(count: int) -> list[str]:
        client = Client(port, path)
        try:
            return [client.open_session() for _ in range(count)]
        finally:
            client.close()
    shares = [n // connections + (i < n % connections) for i in range(connections)]
    with concurrent.futures.ThreadPoolExecutor(connections) as pool:
        return [sid for part in pool.map(some, shares) for sid in part]


def measure(args: argparse.Namespace) -> dict:
    repo = Path(args.repo).resolve()
    env = {**os.environ, "PYTHONPATH": str(repo), "MAGPIE_MCP_TOKEN": TOKEN}
    flag = has_idle_flag(repo, env)
    with tempfile.TemporaryDirectory(prefix="mcp_sessions_") as tmp:
        proc, path, port = start_server(repo, Path(tmp), env, args.idle_timeout if flag else None)
        try:
            client = Client(port, path)
            # One session opened and deleted first: the server's lazy imports are not counted as sessions' cost.
            warm = client.open_session()
            client.conn.request("DELETE", path, headers={"Authorization": f"Bearer {TOKEN}", "mcp-session-id": warm,
                                                         "mcp-protocol-version": "2025-06-18"})
            client.conn.getresponse().read()
            client.close()  # no connection stays open while the sessions sit idle
            time.sleep(1.0)
            rows = [{"point": "started", "rss_kib": rss_kib(proc.pid), "t_s": 0.0}]
            t0 = time.monotonic()
            opened: list[str] = []
            for r in range(1, args.rounds + 1):
                t_open = time.monotonic()
                opened += open_sessions(port, path, args.sessions, args.connections)
                rows.append({"point": f"round {r}: {args.sessions} sessions opened", "rss_kib": rss_kib(proc.pid),
                             "t_s": round(time.monotonic() - t0, 1), "open_s": round(time.monotonic() - t_open, 1)})
                time.sleep(args.wait)
                rows.append({"point": f"round {r}: after {args.wait:g} s idle", "rss_kib": rss_kib(proc.pid),
                             "t_s": round(time.monotonic() - t0, 1)})
            sample = random.Random(0).sample(opened, min(args.probe, len(opened)))
            client = Client(port, path)
            answers: dict[int, int] = {}
            for sid in sample:
                status, _ = client.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
                answers[status] = answers.get(status, 0) + 1
            client.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"repo": str(repo), "commit": commit, "idle_timeout_flag": flag,
            "idle_timeout_s": args.idle_timeout if flag else None, "sessions_per_round": args.sessions,
            "rounds": args.rounds, "wait_s": args.wait, "rows": rows,
            "probe": {"sessions": len(sample), "answers": {str(k): v for k, v in sorted(answers.items())}}}


def show(result: dict) -> None:
    flag = (f"--session-idle-timeout {result['idle_timeout_s']:g}" if result["idle_timeout_flag"]
            else "no --session-idle-timeout flag (the SDK's default applies)")
    print(f"{result['repo']} @ {result['commit']}: {flag}")
    base = result["rows"][0]["rss_kib"]
    for row in result["rows"]:
        print(f"  {row['point']:<42} RSS {row['rss_kib'] / 1024:8.1f} MiB  ({(row['rss_kib'] - base) / 1024:+7.1f})  "
              f"t={row['t_s']:.0f}s" + (f"  (opened in {row['open_s']:.1f} s)" if "open_s" in row else ""))
    answers = ", ".join(f"{n} x {code}" for code, n in result["probe"]["answers"].items())
    print(f"  tools/list on {result['probe']['sessions']} of the ids opened: {answers}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default=str(REPO), help="the checkout whose engine/ serves (default: this one)")
    p.add_argument("--sessions", type=int, default=2000, help="sessions opened and abandoned per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--connections", type=int, default=16, help="connections the sessions are opened over")
    p.add_argument("--idle-timeout", type=float, default=5.0, help="--session-idle-timeout given to the server")
    p.add_argument("--wait", type=float, default=None, help="seconds idle after each round (default 3 x timeout + 5)")
    p.add_argument("--probe", type=int, default=50, help="ids sent tools/list at the end")
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args()
    if args.wait is None:
        args.wait = 3 * args.idle_timeout + 5
    result = measure(args)
    show(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

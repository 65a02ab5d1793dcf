"""The MCP server: Magpie's tools (same names and arguments where Magpie has them) over the job API.

    app = build_server(ServerOptions(roots=[Path.cwd()]))
    app.run()                      # stdio; engine/mcp/cli.py serves HTTP with a bearer token

Long work (analyze, compare, benchmark, optimize, benchmark_batch, gap_analysis on a big trace) is
a job of ``engine.jobs`` run by the local-process executor: the tool returns its id at once, the
run goes on in its own process group whatever happens to the call or the server, and
``job_status`` / ``job_result`` / ``job_cancel`` / ``job_list`` read the run folder. No tool holds
a call for more than ``max_wait_s`` seconds; ``job_status(wait_s=...)`` sends progress
notifications while it waits.

Nothing here measures or judges: the tools translate arguments into the engine's requests (the
same ones the command line builds), and results are the reports the runs wrote.
"""

import functools
import inspect
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import anyio
import yaml
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import ConfigDict

from engine.errors import MagpieError
from engine.jobs.query import ConfigError, __version__
from engine.mcp import results as res
from engine.mcp.confine import Confinement
from engine.mcp.jobs import JobBook, describe, run_file_uri
from engine.mcp.security import AccessRefused, Roots, require_commands

SERVER_NAME = "magpie"
MAX_WAIT_S = 5.0
INSTRUCTIONS = (
    "Magpie workbench: kernel analyze/compare (correctness first), serving benchmarks, trace gap and "
    "roofline analysis, the optimization loop. analyze, compare, benchmark, benchmark_batch and optimize "
    "return a job_id at once; poll job_status (wait_s up to 5 s, with progress notifications), then "
    "job_result. Paths must lie under the server's roots.")


@dataclass
class ServerOptions:
    roots: list[Path] = field(default_factory=lambda: [Path.cwd()])
    allow_commands: bool = False
    output_dir: Optional[Path] = None  # results root; default <first root>/results
    max_wait_s: float = MAX_WAIT_S


class State:
    """What every tool needs: the roots, the results folder, the jobs, the command policy."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.roots = Roots(options.roots)
        self.confine = Confinement(self.roots, options.allow_commands)
        self.results = self.roots.resolve(options.output_dir or (self.roots.first / "results"), "--output-dir")
        self.results.mkdir(parents=True, exist_ok=True)
        self.book = JobBook([self.results], self.roots.first, self.roots)

    def output_dir(self, value: str) -> Path:
        return self.roots.resolve(value, "output_dir") if value else self.results

    def path(self, value: str, argument: str) -> Path:
        return self.roots.resolve(value, argument)

    def commands(self, **arguments: Any) -> None:
        require_commands(self.options.allow_commands, arguments)

    def file(self, path: Path, argument: str) -> Path:
        """A file a tool reads back: inside a root after links, or AccessRefused naming it."""
        return self.confine.file(path, argument)

    def read_text(self, path: Path, argument: str) -> Optional[str]:
        """The text of a file a tool reads back, None when there is none; confined like ``file``."""
        if not path.is_file():
            return None
        return self.file(path, argument).read_text(errors="replace")

    def read_json(self, path: Path, argument: str) -> dict:
        return res.read_json(self.file(path, argument))

    def scratch(self, kind: str, suffix: str = ".yaml") -> Path:
        """A file the server writes for a run (a generated config), beside the results."""
        folder = self.results / ".mcp" / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{time.strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(3)}{suffix}"

    def run_dir(self, value: str, argument: str) -> Path:
        """A run folder: a job id (found under the results folders) or a path under a root."""
        if value and "/" not in value and not os.path.lexists(self.roots.first / value):
            return self.book.find(value).run_dir
        p = self.path(value, argument)
        if not p.is_dir():
            raise res.ResultError(f"{argument}: {p} is not a folder")
        return p


def _error_text(exc: MagpieError) -> str:
    lines = [f"{exc.title}: {exc.message}" if exc.message else exc.title]
    lines += [f"  {d}" for d in (exc.problems if isinstance(exc, ConfigError) else exc.details())]
    if exc.hint:
        lines.append(f"hint: {exc.hint}")
    return "\n".join(lines)


def guard(fn: Callable) -> Callable:
    """Engine errors reach the client as tool errors with the engine's own text (file, field, fix)."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except MagpieError as exc:
                raise ToolError(_error_text(exc)) from None
        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MagpieError as exc:
            raise ToolError(_error_text(exc)) from None
    return run


class MagpieServer(MCPServer):
    """MCPServer whose resource list holds the files of recent runs (reports, CSVs, summaries)."""

    state: State

    async def list_resources(self):  # type: ignore[override]
        from mcp_types import Resource as MCPResource
        listed = await super().list_resources()

        def scan() -> list[MCPResource]:
            out = []
            for run in self.state.book.list(limit=20):
                run_dir = Path(run["run_dir"])
                for rel in res.run_files(run_dir, limit=100, inside=self.state.roots.contains):
                    out.append(MCPResource(uri=run_file_uri(run_dir, rel), name=f"{run_dir.name}/{rel}",
                                           mime_type=_mime(rel)))
            return out
        return listed + await anyio.to_thread.run_sync(scan)


def _mime(rel: str) -> str:
    return {".json": "application/json", ".csv": "text/csv", ".yaml": "application/yaml"}.get(
        Path(rel).suffix, "text/plain")


def add_tool(app: MCPServer, fn: Callable, name: Optional[str] = None) -> None:
    """Register a tool whose arguments are checked strictly: an unknown argument is an error that
    names it, never silently dropped."""
    app.add_tool(guard(fn), name=name or fn.__name__, description=inspect.getdoc(fn))
    tool = app._tool_manager.get_tool(name or fn.__name__)
    model = tool.fn_metadata.arg_model
    model.model_config = ConfigDict(**{**model.model_config, "extra": "forbid"})
    model.model_rebuild(force=True)


def build_server(options: Optional[ServerOptions] = None) -> MagpieServer:
    from engine.mcp import bench_tools, host_tools, job_tools, kernel_tools
    state = State(options or ServerOptions())
    app = MagpieServer(SERVER_NAME, instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
    app.state = state
    for module in (job_tools, kernel_tools, bench_tools, host_tools):
        module.register(app, state)
    _register_resources(app, state)

    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @app.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> JSONResponse:  # noqa: ARG001 - starlette's signature
        return JSONResponse({"status": "ok"})
    return app


def _register_resources(app: MCPServer, state: State) -> None:
    @app.resource("magpie://runs/{run_id}/{+path}", name="run_file", mime_type="text/plain",
                  description="a file of a run folder (report, summary, CSV, config), by job id and relative path")
    def run_file(run_id: str, path: str) -> str:
        try:
            run_dir = state.book.find(run_id).run_dir
        except MagpieError as exc:
            raise ResourceError(_error_text(exc)) from None
        target = (run_dir / path).resolve()
        if not target.is_relative_to(run_dir.resolve()) or not target.is_file():
            raise ResourceError(f"{run_id}: no file {path!r} in the run folder")
        if not state.roots.contains(target):
            raise ResourceError(f"{run_id}/{path}: resolves to {target}, outside the allowed roots")
        if target.suffix not in res.RESOURCE_SUFFIXES or target.stat().st_size > res.MAX_RESOURCE_BYTES:
            raise ResourceError(f"{path}: not offered as a resource (only {', '.join(res.RESOURCE_SUFFIXES)} "
                                f"files up to {res.MAX_RESOURCE_BYTES >> 20} MiB)")
        return target.read_text(errors="replace")

    @app.resource("magpie://jobs", name="jobs", mime_type="application/json",
                  description="the runs under the server's results folders, newest first")
    def jobs() -> str:
        return json.dumps(state.book.list(limit=100), indent=2)


def dump_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def refuse(message: str, hint: Optional[str] = None) -> AccessRefused:
    return AccessRefused(message, hint=hint)


async def wait_with_progress(ctx: Optional[Context], job: Any, wait_s: float) -> dict:
    """Wait up to ``wait_s`` for a job to finish, sending a progress notification whenever its
    progress changes; the job's description at the end."""
    deadline = time.monotonic() + wait_s
    last, changes = None, 0
    while True:
        info = await anyio.to_thread.run_sync(describe, job)
        key = (info["state"], info["stage"], info["done"], info["total"])
        if ctx is not None and key != last:
            last, changes = key, changes + 1
            # Progress must grow: requests done of total where the run counts them (a benchmark), else
            # the number of stage changes seen in this call.
            total = float(info["total"]) if info["total"] and info["done"] is not None else None
            done = float(info["done"]) if total is not None else float(changes)
            message = f"{info['job_id']}: {info['state']}" + (f", {info['stage']}" if info["stage"] else "")
            try:
                await ctx.report_progress(done, total, message)
            except ValueError:
                pass  # no request context (a direct call): nothing to notify
        if info["finished"] or time.monotonic() >= deadline:
            return info
        await anyio.sleep(0.25)

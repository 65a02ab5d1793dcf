"""Control hooks: the POSTs a benchmark sends to the server around its load, never part of it.

* **Prefix-cache reset** before each load point of a sweep or capacity search, so that no point
  inherits the cache the point before it left (a later point would otherwise prefill less and look
  faster). The route is the framework's: vLLM ``POST /reset_prefix_cache`` (mounted only with
  ``VLLM_SERVER_DEV_MODE=1``, which a server this tool launches gets while resets are on; HTTP 200,
  409 or ``{"success": false}`` when blocks are still held), SGLang ``POST /flush_cache`` (400 while
  requests run) and the built-in server's ``POST /reset_prefix_cache`` (400 when its prefix cache is
  off). ATOM has no such route. ``client.reset_prefix_cache`` (``--[no-]reset-prefix-cache``)
  decides; unset, resets are on for sweeps and capacity searches and off for one load point.
  The reset comes before the point's warm-up: it isolates one point from the next, and the warm-up
  then fills the cache as the load will (AIPerf's reset is the same per-cell boundary). A reset that
  fails is a warning in the report and the log, never silent, and the point runs on the cache it
  found.
* **Server profiler** start and stop (``/start_profile``, ``/stop_profile``, the same on vLLM,
  SGLang, ATOM and the built-in server): started after the warm-up, stopped when the measured load
  has ended. A start that fails ends the run (a profiled run exists for its traces); a stop that
  fails is a warning (the server may have stopped by itself after ``num_steps``).

Every hook's outcome (route, HTTP status, seconds, error) goes into ``report.control_hooks`` and
as a ``control_hook`` event into ``events.jsonl``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Optional

from engine.bench.launch import LaunchError
from engine.config.benchmark import BenchmarkConfig

# framework -> the route that empties its prefix cache (ATOM has none)
RESET_ROUTES = {"builtin": "/reset_prefix_cache", "vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
RESET_TIMEOUT_S = 60.0
# What the route may be sent with: SGLang waits up to ``timeout`` s for running requests to end
# (without it a flush while the server still finishes a request fails at once; older SGLang
# ignores the parameter).
_RESET_QUERY = {"sglang": "?timeout=30"}
# vLLM answers 409 while running requests still hold blocks: tried again this many times, 0.5 s apart.
_RESET_RETRIES = {"vllm": (409, 2)}
PROFILE_START_TIMEOUT_S = 60.0

# What to do when a route is missing, by framework.
_MISSING_ROUTE = {
    "vllm": "vLLM mounts /reset_prefix_cache only when started with VLLM_SERVER_DEV_MODE=1",
    "sglang": "SGLang refuses the flush while requests still run",
}


class ControlHookError(LaunchError):
    """A control hook the run cannot go on without (the profiler did not start)."""

    title = "server control hook failed"


@dataclass
class HookResult:
    hook: str  # reset_prefix_cache | start_profile | stop_profile
    route: str
    ok: bool
    status: Optional[int]  # the HTTP status (None: no answer)
    seconds: float
    error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return {"hook": self.hook, "route": self.route, "ok": self.ok, "status": self.status,
                "seconds": round(self.seconds, 4), "error": self.error}


def post_hook(base_url: str, route: str, hook: str, timeout_s: float, body: Optional[dict] = None) -> HookResult:
    """POST ``route`` on the server; ok on a 2xx answer whose JSON body does not say
    ``"success": false`` (vLLM's reset answers 200 with that when blocks are still held)."""
    url = base_url.rstrip("/") + route
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - the server under test
            status, text = r.status, r.read(4096)
    except urllib.error.HTTPError as exc:
        detail = _first_line(exc.read(500) if exc.fp is not None else b"")
        if detail.replace(":", "").split() == [str(exc.code), *str(exc.reason).split()]:
            detail = ""  # aiohttp's "404: Not Found" says nothing more
        return HookResult(hook, route, False, exc.code, time.perf_counter() - t0,
                          f"POST {url}: HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else ""))
    except (OSError, ValueError) as exc:  # refused, reset, timed out
        reason = getattr(exc, "reason", None) or exc
        return HookResult(hook, route, False, None, time.perf_counter() - t0, f"POST {url}: {reason}")
    seconds = time.perf_counter() - t0
    try:
        answer = json.loads(text) if text.strip() else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("success") is False:
        return HookResult(hook, route, False, status, seconds,
                          f"POST {url}: the server answered {status} but did not do it: {_first_line(text)}")
    return HookResult(hook, route, True, status, seconds)


def _first_line(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return text.splitlines()[0][:200] if text else ""


def reset_plan(cfg: BenchmarkConfig) -> tuple[bool, str]:
    """Whether this run resets the prefix cache before each load point, and why (for the report)."""
    cl = cfg.client
    route = RESET_ROUTES.get(cfg.framework)
    if cl.reset_prefix_cache is False:
        return False, "off: client.reset_prefix_cache false (--no-reset-prefix-cache)"
    if route is None:
        return False, f"off: {cfg.framework} has no prefix-cache reset route"
    if cfg.framework == "builtin" and not cfg.server.prefix_caching and not cl.base_url:
        return False, "off: the built-in server runs without prefix caching"
    if cl.reset_prefix_cache:
        return True, "on: client.reset_prefix_cache true (--reset-prefix-cache)"
    if cl.find_capacity:
        return True, f"on: a capacity {cl.capacity_mode} (the default for sweeps and capacity searches)"
    points = 1
    for values in cl.sweep.values():
        points *= len(values)
    if points > 1:
        return True, f"on: a sweep of {points} points (the default for sweeps and capacity searches)"
    return False, "off: one load point (the default; --reset-prefix-cache turns it on)"


def server_env(cfg: BenchmarkConfig) -> dict[str, str]:
    """What a server this tool launches needs in its environment for the hooks this run uses."""
    if cfg.framework == "vllm" and reset_plan(cfg)[0]:
        return {"VLLM_SERVER_DEV_MODE": "1"}  # vLLM mounts /reset_prefix_cache only in its dev mode
    return {}


class ControlHooks:
    """One run's hooks against one server: each call POSTs, records the outcome in
    ``report["control_hooks"]`` and an event, and warns (log and report) when it failed."""

    def __init__(self, cfg: BenchmarkConfig, base_url: str, report: dict, warnings: list[str],
                 log: Callable[[str], None], emit: Callable[..., None]) -> None:
        self.cfg, self.base_url, self.warnings, self.log, self.emit = cfg, base_url, warnings, log, emit
        self.resets_on, why = reset_plan(cfg)
        self.section = report.setdefault("control_hooks", {})
        self.section["prefix_cache_reset"] = {"enabled": self.resets_on, "why": why,
                                              "route": RESET_ROUTES.get(cfg.framework), "points": []}
        self._warned: set[str] = set()
        if cfg.client.reset_prefix_cache and not self.resets_on and "no prefix-cache reset route" in why:
            self._warn(f"--reset-prefix-cache: {why.removeprefix('off: ')}; no point is reset")

    # ---- the prefix cache ---------------------------------------------------------------------

    def reset_before(self, index: int, point: dict[str, Any], label: Optional[str] = None) -> Optional[HookResult]:
        """Empty the prefix cache before load point ``index`` (None: resets are off); ``label``
        names the point in the log (default: its values)."""
        if not self.resets_on:
            return None
        label = label or f"point {_name(point)}"
        fw = self.cfg.framework
        route = RESET_ROUTES[fw] + _RESET_QUERY.get(fw, "")
        status, tries = _RESET_RETRIES.get(fw, (None, 0))
        result = post_hook(self.base_url, route, "reset_prefix_cache", RESET_TIMEOUT_S)
        while tries and not result.ok and result.status == status:
            tries -= 1
            time.sleep(0.5)
            result = post_hook(self.base_url, route, "reset_prefix_cache", RESET_TIMEOUT_S)
        record = {"point_index": index, "point": dict(point), **result.to_dict()}
        self.section["prefix_cache_reset"]["points"].append(record)
        self.emit("control_hook", **record)
        if result.ok:
            self.log(f"prefix cache reset before {label} ({result.seconds * 1e3:.0f} ms)")
        else:
            hint = _MISSING_ROUTE.get(self.cfg.framework, "")
            self._warn(f"prefix-cache reset before {label} failed: {result.error}; the load ran on the cache "
                       f"it found" + (f" ({hint})" if hint else "")
                       + "; --no-reset-prefix-cache turns the reset off", key=result.error or "")
        return result

    # ---- the server profiler ------------------------------------------------------------------

    def start_profile(self, body: dict, after: str) -> HookResult:
        """Start the server's profiler (called after the warm-up); raises ControlHookError when it
        did not start: a profiled run without its traces has nothing to show."""
        at = round(time.time(), 3)  # when it was asked (the answer may take a while)
        result = post_hook(self.base_url, "/start_profile", "start_profile", PROFILE_START_TIMEOUT_S, body)
        record = {**result.to_dict(), "after": after, "body": body, "at": at}
        self.section.setdefault("profiler", {})["start"] = record
        self.emit("control_hook", **record)
        if not result.ok:
            raise ControlHookError(f"the server's profiler did not start: {result.error}",
                                   hint="vLLM needs --profiler-config (set when this tool launches it with "
                                        "--torch-profiler); SGLang needs SGLANG_TORCH_PROFILER_DIR")
        self.log(f"profiler started {after}")
        return result

    def stop_profile(self, timeout_s: float, until: str) -> HookResult:
        """Stop the server's profiler at the end of the measured load; a failure is a warning."""
        self.log("stopping the profiler (the server flushes its traces)...")
        at = round(time.time(), 3)  # the end of the measured load; the flush follows
        result = post_hook(self.base_url, "/stop_profile", "stop_profile", timeout_s)
        record = {**result.to_dict(), "until": until, "at": at}
        self.section.setdefault("profiler", {})["stop"] = record
        self.emit("control_hook", **record)
        if not result.ok:  # e.g. it already stopped by itself after num_steps
            self._warn(f"/stop_profile: {result.error}")
        return result

    def _warn(self, text: str, key: Optional[str] = None) -> None:
        """A warning in the report and the log; a failure repeated at every point is said once."""
        key = text if key is None else key
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(text)
        self.log(f"warning: {text}")


def _name(point: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in point.items()) \
        or "default"


def hook_lines(report: dict) -> list[str]:
    """The control hooks in the run's summary: the resets (how many worked, the first failure)
    and the profiler's window."""
    section = report.get("control_hooks") or {}
    lines = []
    reset = section.get("prefix_cache_reset") or {}
    points = reset.get("points") or []
    if points:
        ok = sum(1 for p in points if p.get("ok"))
        line = f"prefix cache: reset ({reset.get('route')}) before {ok} of {len(points)} load point(s)"
        failed = next((p for p in points if not p.get("ok")), None)
        if failed:
            line += f"; FAILED before {len(points) - ok}: {failed.get('error')}"
        lines.append(line)
    prof = section.get("profiler") or {}
    start, stop = prof.get("start") or {}, prof.get("stop") or {}
    if start:
        lines.append(f"profiler: started {start.get('after')}" + (
            f", stopped at {stop.get('until')}" + ("" if stop.get("ok") else f" (stop failed: {stop.get('error')})")
            if stop else ", never stopped"))
    return lines

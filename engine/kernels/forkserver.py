"""Harness workers forked from a process that has already imported torch (CPU machines only).

A harness worker is a fresh Python process that imports torch before anything else: about 2 s of
CPU each, several times a compare. A fork server does that once: ``python -m
engine.kernels.forkserver FD`` loads the worker module (as ``__main__``, exactly as ``python -m
engine.kernels.worker`` would, torch and the bound clocks included) and then, for each request
on its socket, forks:

* a reaper (``engine.runs.reaper``) in a session of its own, the worker's process group, a child
  subreaper: what escapes the group is stopped and recorded, as for a spawned worker;
* under it, the worker, which runs ``main()`` with the request's pipes, stdout and stderr log
  files and working directory. Nothing of another kernel was ever loaded in the server, so each
  worker starts from the same fresh module state; its random generators are seeded again from
  ``os.urandom`` after the fork.

The server serves one environment (a worker of another environment gets a server of its own) and
runs with the parent's exact environment, so a worker sees the same variables as a spawned one.
It never reaps a worker's reaper before the parent asks (``reap``): until then the pid stays
taken, so the parent's signals to that group can reach nothing else. It exits when its socket
closes, its parent is gone, or it has had no worker and no request for ``IDLE_EXIT_S``; the
parent's watchdog stops it and every worker group if the parent is killed outright.

A long-lived process that starts many runs as child processes (a test session, the workbench, the
MCP server) can share its servers with them (``share``): it listens on a private socket named in
``MAGPIE_FORKSERVER``, and a child that would start a server of its own asks it instead. The owner
starts the server for the child's python and environment (less the per-invocation variables in
``VOLATILE_ENV``, which the forked worker gets back exactly) and relays the child's requests; the
child's workers stay its own (its watchdog stops their groups if it is killed) and the ones it
never reaped are reaped by the server when they end. A child whose environment needs a server the
owner cannot start falls back to one of its own.

A process that has initialised CUDA or ROCm cannot be forked safely, so the server is used only
where no GPU device exists (``usable``); elsewhere, or with ``MAGPIE_WORKER_START=spawn``, each
worker is a fresh process (``engine.kernels.session``).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Optional

from engine.runs.process import WATCHDOG, is_supervised_here

# Device nodes of NVIDIA, AMD (ROCm) and WSL GPUs: with any of them the worker module initialises
# the GPU at import, and a fork of such a process cannot use it.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
_READY_TIMEOUT_S = 180.0
_MAX_SERVERS = 2  # one a distinct environment; a third closes the oldest
_MSG_BYTES = 1 << 16
# A server with no worker left exits after this long without a request (it holds torch's memory).
IDLE_EXIT_S = 300.0
SHARE_ENV = "MAGPIE_FORKSERVER"  # the socket of a process that shares its servers (``share``)
# Set per invocation, never read at import: a shared server ignores them when matching an
# environment, and the forked worker gets the asking process's values. MAGPIE_PREPARED_KEY
# (engine.jobs.requests): a random key of each submitting process (an MCP server, the
# workbench) that its run children hold, read only when a run loads its prepared request.
VOLATILE_ENV = ("PYTEST_CURRENT_TEST", "MAGPIE_PREPARED_KEY")


def usable() -> bool:
    """Whether workers are forked from a server here: Linux (a subreaper), no GPU, and not turned
    off with ``MAGPIE_WORKER_START=spawn``."""
    if os.environ.get("MAGPIE_WORKER_START", "").strip().lower() == "spawn":
        return False
    if not is_supervised_here() or not hasattr(socket, "send_fds") or not _has_pidfd():
        return False
    return not any(os.path.exists(p) for p in GPU_DEVICE_NODES)


def _has_pidfd() -> bool:  # Linux 5.3+
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):
        return False


# --------------------------------------------------------------------------- the parent's side

class ForkServerError(OSError):
    pass


class NotSent(ForkServerError):
    """The request never reached the server (it had exited): nothing was started."""


class _Channel:
    """Requests and replies on a SOCK_SEQPACKET socket, one request at a time."""

    sock: socket.socket

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.broken = False

    def _read(self) -> dict:
        data = self.sock.recv(_MSG_BYTES)
        if not data:
            self.broken = True
            raise ForkServerError("the other side closed its socket")
        return json.loads(data)

    def request(self, msg: dict, fds: tuple = ()) -> dict:
        with self._lock:
            try:
                socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))
            except OSError as exc:
                self.broken = True
                raise NotSent(str(exc)) from None
            reply = self._read()
        if "error" in reply:
            raise ForkServerError(reply["error"])
        return reply


class ForkServer(_Channel):
    """The parent's handle on one server process (one environment)."""

    def __init__(self, python: str, env: dict, preload: bool = False) -> None:
        super().__init__()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        WATCHDOG.ready()
        try:
            self.proc = subprocess.Popen([python, "-m", "engine.kernels.forkserver", str(theirs.fileno()),
                                          str(IDLE_EXIT_S), *(["preload"] if preload else [])], cwd="/",
                                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True,
                                         pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        WATCHDOG.watch(self.proc.pid)
        self.sock = ours
        try:
            ready, _, _ = select.select([ours], [], [], _READY_TIMEOUT_S)
            reply = self._read() if ready else {"why": "no answer"}
        except OSError as exc:
            reply = {"why": str(exc)}
        if not reply.get("ready"):
            self.close()
            raise ForkServerError(f"fork server not ready: {reply.get('why', '?')}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        WATCHDOG.forget(self.proc.pid)


class SharedForkServer(_Channel):
    """A connection to the servers of the process named in ``MAGPIE_FORKSERVER`` (``share``),
    with ForkServer's ``request``/``alive``/``close``; spawn requests carry this process's exact
    environment."""

    def __init__(self, path: str, python: str, env: dict) -> None:
        super().__init__()
        self.env = env
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.sock.settimeout(_READY_TIMEOUT_S)
            self.sock.connect(path)
            self.sock.send(json.dumps({"python": python, "env": env}).encode())
            data = self.sock.recv(_MSG_BYTES)
            self.sock.settimeout(None)
            reply = json.loads(data) if data else {"why": "the sharing process closed the connection"}
        except (OSError, ValueError) as exc:
            reply = {"why": f"{type(exc).__name__}: {exc}"}
        if not reply.get("ready"):
            self.close()
            raise ForkServerError(f"shared fork server not used: {reply.get('why', '?')}")

    def alive(self) -> bool:
        return not self.broken

    def close(self) -> None:
        self.broken = True
        try:
            self.sock.close()
        except OSError:
            pass


class ForkedWorker:
    """A forked worker as ``subprocess.Popen`` shows one (pid, poll, wait, returncode); the pid is
    its reaper's, the leader of the worker's process group. ``poll`` and ``wait`` read the exit
    status without reaping: only ``stop_group`` lets the server reap it, after its last signal,
    so until then the pid (the group's id) can name no other process."""

    def __init__(self, server: ForkServer, pid: int, pidfd: int) -> None:
        self.server, self.pid, self._pidfd = server, pid, pidfd
        self.returncode: Optional[int] = None
        self.args = f"forked harness worker {pid}"
        self.released = False

    def _exited(self, timeout: Optional[float]) -> bool:
        if self.released:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], timeout)
        return bool(ready)

    def _status(self) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(self.server.request({"op": "status", "pid": self.pid})["returncode"])
            except (OSError, ValueError, KeyError):
                self.returncode = 255  # the server is gone: the status went with it
        return self.returncode

    def poll(self) -> Optional[int]:
        if self.returncode is None and self._exited(0):
            self._status()
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None and not self._exited(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._status()

    def stop_group(self, grace_s: float) -> None:
        """SIGTERM the worker's group unless its leader has ended, SIGKILL whatever is left after
        ``grace_s``, then have the leader reaped."""
        if self.released:
            return
        if not self._exited(0):
            self._kill_group(signal.SIGTERM)
            self._exited(grace_s)
        self._kill_group(signal.SIGKILL)  # a worker whose reaper was killed outright is still in the group
        self._exited(None)
        self._status()
        try:
            self.server.request({"op": "reap", "pid": self.pid})
        except OSError:
            pass
        os.close(self._pidfd)
        self.released = True

    def _kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


_SERVERS: "OrderedDict[tuple, ForkServer]" = OrderedDict()
_SERVERS_LOCK = threading.Lock()
_FAILED: set = set()
_OWNER = [0]


def _server_for(python: str, env: dict, local: bool = False):
    shared = os.environ.get(SHARE_ENV)
    ours = _SHARER[0] is not None and _SHARER[0].path == shared  # this process shares them
    asks = bool(shared) and not local and not ours  # a sharing parent's server, for exactly this env
    # A server of our own runs without the per-invocation variables (start_worker hands them to
    # the worker): one server for every value of them, as a sharing process's servers are.
    own_env = {k: v for k, v in env.items() if k not in VOLATILE_ENV}
    key = (python, tuple(sorted((env if asks else own_env).items())), local)
    with _SERVERS_LOCK:
        if _OWNER[0] != os.getpid():  # a forked copy of this process starts servers of its own
            _SERVERS.clear()
            _OWNER[0] = os.getpid()
        server = _SERVERS.get(key)
        if server is not None and server.alive():
            _SERVERS.move_to_end(key)
            return server
        if server is not None:
            _SERVERS.pop(key).close()
        if key in _FAILED:  # e.g. that python has no torch: the spawned worker says so
            raise ForkServerError("no fork server for this environment")
        server = None
        if asks and (shared, key) not in _FAILED:
            try:
                server = SharedForkServer(shared, python, env)
            except OSError:
                _FAILED.add((shared, key))  # a server of its own, as without one to share
        if server is None:
            try:
                # One of a sharing process (for its children or itself) serves many runs: it
                # loads what their reference workers would each import (``_preload``).
                server = ForkServer(python, own_env, preload=local or ours)
            except OSError:
                _FAILED.add(key)
                raise
        _SERVERS[key] = server
        while len(_SERVERS) > _MAX_SERVERS:
            _SERVERS.popitem(last=False)[1].close()
        return server


def close_all() -> None:
    with _SERVERS_LOCK:
        while _SERVERS:
            _SERVERS.popitem()[1].close()


class Sharer:
    """This process's fork servers offered to its child processes (``share``): a private socket,
    a thread per connected child relaying its requests to the server of its environment."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="magpie-forkserver-")  # mode 0700: this user only
        self.path = os.path.join(self.dir, "socket")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.closed = False
        threading.Thread(target=self._accept, name="forkserver-sharer", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="forkserver-client", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        started: dict[int, ForkServer] = {}  # the child's workers it has not had reaped yet
        try:
            hello = json.loads(conn.recv(_MSG_BYTES) or b"{}")
            python, env = str(hello["python"]), dict(hello["env"])
            server_env = {k: v for k, v in env.items() if k not in VOLATILE_ENV}
            try:
                _server_for(python, server_env, local=True)
            except OSError as exc:
                conn.send(json.dumps({"ready": False, "why": str(exc)}).encode())
                return
            conn.send(json.dumps({"ready": True}).encode())
            while True:
                data, fds, _flags, _addr = socket.recv_fds(conn, _MSG_BYTES, 8)
                if not data:
                    return
                try:
                    msg = json.loads(data)
                    op, pid = msg.get("op"), msg.get("pid")
                    if op == "spawn":
                        msg["env"] = env  # the worker's environment, exactly the child's
                        server = _server_for(python, server_env, local=True)
                        try:
                            reply = server.request(msg, tuple(fds))
                        except NotSent:  # it had just exited (idle): once more, as start_worker does
                            server = _server_for(python, server_env, local=True)
                            reply = server.request(msg, tuple(fds))
                        started[int(reply["pid"])] = server
                    elif op in ("status", "reap") and pid in started:
                        reply = started[pid].request(msg)
                        if op == "reap":
                            started.pop(pid)
                    else:
                        reply = {"error": f"not a request this connection may make: {op!r} {pid!r}"}
                except (OSError, ValueError, KeyError) as exc:
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                finally:
                    for fd in fds:
                        os.close(fd)
                conn.send(json.dumps(reply).encode())
        except (OSError, ValueError, KeyError):
            return
        finally:
            conn.close()
            for pid, server in started.items():  # the child is gone: its server reaps them when they end
                try:
                    server.request({"op": "release", "pid": pid})
                except OSError:
                    pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.listener.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


_SHARER: list = [None]


@atexit.register
def _stop_sharing() -> None:
    if _SHARER[0] is not None:
        _SHARER[0].close()


def share() -> Optional[str]:
    """Offer this process's fork servers to the child processes it starts from now on (sets
    ``MAGPIE_FORKSERVER`` in ``os.environ``); returns the socket's path, or None where workers
    are not forked here. Idempotent; undone by ``close_all`` (at exit)."""
    if not usable():
        return None
    with _SERVERS_LOCK:
        if _SHARER[0] is None or _SHARER[0].closed or _OWNER[0] not in (0, os.getpid()):
            _SHARER[0] = Sharer()
        os.environ[SHARE_ENV] = _SHARER[0].path
        return _SHARER[0].path


atexit.register(close_all)


def start_worker(python: str, env: dict, cwd: Path, scratch: Path, read_fd: int, write_fd: int,
                 stdout_fd: int, stderr_fd: int, record: Path) -> ForkedWorker:
    """A harness worker forked from the server of this ``python`` and environment (started on
    first use): ``read_fd``/``write_fd`` are its request and reply pipes, as ``python -m
    engine.kernels.worker`` takes them. Raises ``OSError`` when no server could serve it."""
    msg = {"op": "spawn", "cwd": str(cwd), "scratch": str(scratch), "record": str(record)}
    for attempt in (1, 2):  # a server that has just exited (idle) is started again once
        server = _server_for(python, env)
        if isinstance(server, ForkServer) and any(k in env for k in VOLATILE_ENV):
            msg["env"] = env  # the worker's environment, exactly: its server runs without them
        try:
            reply = server.request(msg, (read_fd, write_fd, stdout_fd, stderr_fd))
            break
        except OSError as exc:
            with _SERVERS_LOCK:
                for key, s in list(_SERVERS.items()):
                    if s is server:
                        _SERVERS.pop(key).close()
            if attempt == 2 or not isinstance(exc, NotSent):
                raise
    pid = int(reply["pid"])
    # Still the server's unreaped child: the pid is this process, and a pidfd tells when it ends.
    return ForkedWorker(server, pid, os.pidfd_open(pid))


# --------------------------------------------------------------------------- the server's side

def _load_worker_as_main():
    """The worker module as ``python -m engine.kernels.worker`` runs it: module ``__main__``, with
    its spec, file and package; ``_FORKSERVER_PRELOAD`` keeps it from running ``main()`` now."""
    import importlib.util
    import types
    spec = importlib.util.find_spec("engine.kernels.worker")
    module = types.ModuleType("__main__")
    module.__dict__.update(__spec__=spec, __file__=spec.origin, __cached__=spec.cached, __loader__=spec.loader,
                           __package__="engine.kernels", __builtins__=__builtins__, _FORKSERVER_PRELOAD=True)
    sys.modules["__main__"] = module
    sys.argv = [spec.origin]
    exec(spec.loader.get_code("engine.kernels.worker"), module.__dict__)  # noqa: S102 - our own module
    del module._FORKSERVER_PRELOAD
    return module


def _not_forkable() -> Optional[str]:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the GPU was initialised"
    if threading.active_count() > 1:
        return "the worker module started a thread"
    return None


def _run_worker(worker_main, read_fd: int, write_fd: int, scratch: str) -> int:
    """In the forked worker: what ``python -m engine.kernels.worker`` would do from here on."""
    import atexit as _atexit
    import random
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as in a fresh process
    random.seed()  # from os.urandom: a fork shares the server's generator state
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    sys.argv = [sys.argv[0], str(read_fd), str(write_fd), scratch]
    code = 1
    try:
        code = worker_main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
        import traceback
        traceback.print_exc()
    try:
        _atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return code


def _fork_worker(worker_main, msg: dict, fds: list[int], sock: socket.socket) -> int:
    from engine.runs.reaper import Reaper
    read_fd, write_fd, out_fd, err_fd = fds
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(started_w)
        os.read(started_r, 1)  # the child leads its own session before its pid is handed out
        os.close(started_r)
        return pid
    # The reaper: the worker's session and group leader, its child subreaper.
    code = 1
    try:
        os.setsid()
        os.close(started_r)
        os.close(started_w)
        sock.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (devnull, out_fd, err_fd):
            os.close(fd)
        os.chdir(msg["cwd"])
        if "env" in msg:  # asked through a sharing process: the asking process's exact environment
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in msg["env"].items()})

        def start() -> int:
            return _run_worker(worker_main, read_fd, write_fd, msg["scratch"])
        code = Reaper(msg["record"], [], start=start).run()
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code)


def _preload(compiler_stack: bool, has_cuda: bool) -> None:
    """Before the first fork. Triton, which every worker imports when it describes its device
    (``op_load``), is imported once here. With ``compiler_stack`` (a server that serves the runs
    of other processes, ``share``: many reference workers), so is the flop counter, whose first
    use in each reference worker pulls in torch's compiler stack (torch._dynamo, about 1.2 s of
    CPU a process). Then everything is collected and frozen, so each worker's own collections
    skip torch and the worker module (a fork inherits the freeze; the worker unfreezes before it
    exits)."""
    import gc
    # Triton decides interpreter or compiler for each @triton.jit function when it is defined, and
    # its own library (triton.language.standard: tl.max, tl.sum ...) is defined at its import: it
    # is imported here only where every worker will run with the same TRITON_INTERPRET — set in
    # the environment already, or a machine without a GPU, where each worker sets it to 1 at its
    # load (op_load). On a GPU machine without it, a worker decides by its own device (a CUDA
    # worker compiles, a CPU one interprets), so Triton and torch's compiler stack, which imports
    # Triton, are left to the worker.
    unset = "TRITON_INTERPRET" not in os.environ
    if not (unset and has_cuda):
        if unset:
            os.environ["TRITON_INTERPRET"] = "1"
        try:
            _import_triton(compiler_stack)
        finally:
            if unset:
                os.environ.pop("TRITON_INTERPRET", None)
    gc.collect()
    gc.freeze()


def _import_triton(compiler_stack: bool) -> None:
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - no Triton, or a broken one: the worker says so itself, as before
        pass
    if compiler_stack:
        try:
            import torch._dynamo  # noqa: F401
            import torch.utils.flop_counter  # noqa: F401
        except Exception:  # noqa: BLE001 - a torch without them: the worker imports what it finds, as before
            pass


def serve(sock: socket.socket, idle_exit_s: float = IDLE_EXIT_S, compiler_stack: bool = False) -> None:
    this_module = sys.modules["__main__"]  # noqa: F841 - kept alive: the worker module takes its place
    worker = _load_worker_as_main()
    _preload(compiler_stack, worker._HAS_CUDA)
    why = _not_forkable()
    sock.send(json.dumps({"ready": why is None, "why": why}).encode())
    if why:
        return
    parent = os.getppid()
    children: set[int] = set()  # forked, not yet reaped
    released: set[int] = set()  # of those, the ones whose parent is gone: reaped here when they end
    last_request = time.monotonic()
    while True:
        ready, _, _ = select.select([sock], [], [], 1.0)
        for pid in list(released):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0] == pid
            except ChildProcessError:
                done = True
            if done:
                released.discard(pid)
                children.discard(pid)
        if not ready:
            if os.getppid() != parent:
                return  # the parent is gone
            if not children and time.monotonic() - last_request > idle_exit_s:
                return  # a long-lived parent (the workbench, the MCP server) starts another when needed
            continue
        last_request = time.monotonic()
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MSG_BYTES, 8)
        except OSError:
            return
        if not data:
            return
        try:
            msg = json.loads(data)
            if msg.get("op") == "spawn":
                if len(fds) != 4:
                    raise ValueError(f"spawn wants 4 descriptors, got {len(fds)}")
                reply = {"pid": _fork_worker(worker.main, msg, fds, sock)}
                children.add(reply["pid"])
            elif msg.get("op") == "status":  # the exit status, the child left unreaped
                info = os.waitid(os.P_PID, int(msg["pid"]), os.WEXITED | os.WNOWAIT)
                reply = {"returncode": info.si_status if info.si_code == os.CLD_EXITED else -info.si_status}
            elif msg.get("op") == "reap":
                os.waitpid(int(msg["pid"]), 0)
                children.discard(int(msg["pid"]))
                reply = {}
            elif msg.get("op") == "release":  # reaped when it ends, without blocking the others
                if int(msg["pid"]) in children:
                    released.add(int(msg["pid"]))
                reply = {}
            else:
                reply = {"error": f"unknown request {msg.get('op')!r}"}
        except (OSError, ValueError, KeyError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    serve(sock, float(argv[1]) if len(argv) > 1 else IDLE_EXIT_S, compiler_stack=argv[2:3] == ["preload"])
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Nothing in the server needs finalizing, and its parent waits for the exit: the interpreter's
    # teardown of torch (and of its compiler stack, where loaded) took 0.3-1 s.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

"""How harness workers start: forked from a fork server that has imported torch (CPU machines, the
default here) or spawned as fresh processes (GPU machines; MAGPIE_WORKER_START=spawn). Either way
a kernel's worker must see the same process: its own session and group under the reaper (a child
subreaper), stdin from /dev/null, its stdout/stderr logs, the kernel's working directory first on
its import path, the kernel's environment, Python's own SIGINT handler, the worker module as
__main__, and nothing of another kernel's worker (module state, random generator state).

Each kernel module of the compare imports ``probe``, which writes what its process sees to
probes/<pid>-<module>.json."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, read_report, run_magpie
from engine.kernels import forkserver

pytestmark = pytest.mark.slow

PROBE = '''
import json, os, random, signal, sys

def _link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""

def _cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\\0", b" ").decode(errors="replace")

def _ppid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

def record(module):
    main = sys.modules["__main__"]
    seen = getattr(sys, "_probe_seen_by", None)  # set by the first kernel module in this process
    sys._probe_seen_by = os.getpid()
    state = {
        "module": module, "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgrp(), "sid": os.getsid(0),
        "parent_cmdline": _cmdline(os.getppid()), "cmdline": _cmdline(os.getpid()),
        "seen_by": seen, "random": random.random(), "cwd": os.getcwd(), "path0": sys.path[0],
        "probe_var": os.environ.get("PROBE_VAR"), "malloc": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "volatile": os.environ.get("PYTEST_CURRENT_TEST"),
        "server_parent": _ppid(_ppid(os.getppid())),  # worker -> reaper -> server -> whoever started it
        "stdin": _link(0), "stdout": _link(1), "stderr": _link(2),
        "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "main_spec": getattr(getattr(main, "__spec__", None), "name", None),
        "main_has_worker": hasattr(main, "Worker"),
    }
    os.makedirs("probes", exist_ok=True)
    with open(f"probes/{os.getpid()}-{module}.json", "w") as f:
        json.dump(state, f)
'''

REFERENCE = '''
import torch
import probe

probe.record("reference")


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.rand(64, 64)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''
import torch
import probe

probe.record("candidate")

from reference import get_init_inputs, get_inputs  # noqa: E402,F401  (harness convention)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x + x
'''

YAML = '''
kernels:
  - id: reference
    type: pytorch
    source_files: [reference.py]
    baseline: true
    env: {PROBE_VAR: "from-the-yaml"}
  - id: candidate
    type: pytorch
    source_files: [candidate.py]
    env: {PROBE_VAR: "from-the-yaml"}
'''


@pytest.fixture(scope="module", params=["fork", "shared", "spawn"])
def probed(request, tmp_path_factory):
    """One compare per way of starting workers; every probe record it wrote. ``fork``: from the
    command's own fork server; ``shared``: from a server of this test process (forkserver.share),
    the command's per-invocation variable (PYTEST_CURRENT_TEST) set apart from this process's."""
    how = request.param
    if how != "spawn" and not forkserver.usable():
        pytest.skip("workers are not forked on this machine (a GPU, or MAGPIE_WORKER_START=spawn)")
    env = {"MAGPIE_WORKER_START": "spawn" if how == "spawn" else "fork",
           forkserver.SHARE_ENV: forkserver.share() if how == "shared" else "",
           "PYTEST_CURRENT_TEST": f"probe {how}"}
    folder = tmp_path_factory.mktemp(f"probe_{how}")
    for name, text in (("probe.py", PROBE), ("reference.py", REFERENCE), ("candidate.py", CANDIDATE),
                       ("compare.yaml", YAML)):
        (folder / name).write_text(textwrap.dedent(text))
    out = folder / "out"
    proc = run_magpie("compare", "-k", folder / "compare.yaml", "-o", out, "--no-perf", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted((folder / "probes").glob("*.json"))]
    return how, folder, records, read_report(out), os.getpgrp()


def test_a_shared_server_is_this_processs_and_the_worker_gets_the_commands_environment(probed):
    how, folder, records, _, _ = probed
    for r in records:
        assert r["volatile"] == f"probe {how}", r  # the command's own value, not the server's
        if how == "shared":
            assert r["server_parent"] == os.getpid(), r
        elif how == "fork":
            assert r["server_parent"] != os.getpid(), r


def test_each_kernel_gets_its_own_worker(probed):
    how, folder, records, report, _ = probed
    candidate_pids = {r["pid"] for r in records if r["module"] == "candidate"}
    reference_only = {r["pid"] for r in records if r["module"] == "reference"} - candidate_pids
    # The reference's worker never imported the candidate; the candidate's worker is another process.
    assert candidate_pids and reference_only, records
    states = {k["kernel_id"]: k["correctness_state"] for k in report["results"]["kernel_results"]}
    assert states == {"reference": "SUCCESS", "candidate": "SUCCESS"}, states


def test_workers_run_in_their_own_group_under_the_reaper(probed):
    how, folder, records, _, test_group = probed
    for r in records:
        # The worker's parent is its reaper, which leads the worker's session and group.
        assert r["pgid"] == r["sid"] == r["ppid"] != test_group, r
        if how == "spawn":
            assert "reaper.py" in r["parent_cmdline"] and "engine.kernels.worker" in r["cmdline"], r
        else:
            assert "engine.kernels.forkserver" in r["parent_cmdline"] and "engine.kernels.forkserver" in r["cmdline"], r


def test_workers_see_what_a_fresh_worker_sees(probed):
    how, folder, records, _, _ = probed
    for r in records:
        assert r["cwd"] == str(folder) and r["path0"] == str(folder), r
        assert r["probe_var"] == "from-the-yaml" and r["malloc"] == str(4 << 30), r
        assert r["stdin"] == "/dev/null", r
        assert r["stdout"].endswith(".stdout.log") and r["stderr"].endswith(".stderr.log"), r
        assert r["sigint_default"], r
        assert r["main_spec"] == "engine.kernels.worker" and r["main_has_worker"], r


def test_nothing_of_one_worker_is_seen_in_another(probed):
    how, folder, records, _, _ = probed
    assert len({r["pid"] for r in records}) >= 2, records
    for r in records:
        assert r["seen_by"] in (None, r["pid"]), f"{r['module']} in {r['pid']} saw a mark made in {r['seen_by']}"
    # One draw per process: forked workers must not share the fork server's generator state.
    first_draw = {r["pid"]: r["random"] for r in records if r["seen_by"] is None}
    assert len(set(first_draw.values())) == len(first_draw), first_draw


def test_the_fork_server_is_not_used_with_a_gpu(monkeypatch, tmp_path):
    """With a GPU device node present the worker module initialises the GPU at import, and a
    fork of that process could not use it: workers are spawned."""
    monkeypatch.delenv("MAGPIE_WORKER_START", raising=False)
    node = tmp_path / "nvidiactl"
    node.write_text("")
    monkeypatch.setattr(forkserver, "GPU_DEVICE_NODES", (str(node),))
    assert not forkserver.usable()
    monkeypatch.setattr(forkserver, "GPU_DEVICE_NODES", (str(tmp_path / "absent"),))
    assert forkserver.usable() == forkserver.is_supervised_here()
    monkeypatch.setenv("MAGPIE_WORKER_START", "spawn")
    assert not forkserver.usable()


def test_a_forked_workers_group_is_stopped_and_reaped(tmp_path):
    """stop_group signals only the worker's own group, and reaps its leader last."""
    if not forkserver.usable():
        pytest.skip("workers are not forked on this machine")
    import sys

    from engine.runs.process import engine_pythonpath
    env = dict(os.environ, PYTHONPATH=engine_pythonpath(os.environ.get("PYTHONPATH")))
    r_child, w_parent = os.pipe()
    r_parent, w_child = os.pipe()
    out, err = open(tmp_path / "w.stdout.log", "ab"), open(tmp_path / "w.stderr.log", "ab")
    try:
        worker = forkserver.start_worker(sys.executable, env, tmp_path, tmp_path, r_child, w_child, out.fileno(),
                                         err.fileno(), tmp_path / "w.escaped.jsonl")
    finally:
        for fd in (r_child, w_child):
            os.close(fd)
        out.close()
        err.close()
    try:
        assert os.getpgid(worker.pid) == worker.pid != os.getpgrp()
        assert worker.poll() is None
        worker.stop_group(5.0)
        assert worker.returncode == -signal.SIGTERM, worker.returncode
        assert worker.poll() == -signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            os.killpg(worker.pid, 0)
    finally:
        os.close(w_parent)
        os.close(r_parent)


# A process that starts one worker for itself; PARENT and SHARED_CHILD go on from here.
WORKER_STARTED = '''
import os, sys
from pathlib import Path
from engine.kernels import forkserver
tmp = Path(sys.argv[1])
r_child, w_parent = os.pipe()
r_parent, w_child = os.pipe()
out, err = open(tmp / "w.stdout.log", "ab"), open(tmp / "w.stderr.log", "ab")
worker = forkserver.start_worker(sys.executable, dict(os.environ), tmp, tmp, r_child, w_child, out.fileno(),
                                 err.fileno(), tmp / "w.escaped.jsonl")
'''

PARENT = WORKER_STARTED + '''
server = next(iter(forkserver._SERVERS.values())).proc.pid
print(server, worker.pid, flush=True)
sys.stdin.read()  # until killed
'''


def test_a_parent_killed_outright_leaves_no_fork_server_or_worker(tmp_path):
    """SIGKILL of the process that started them: its watchdog stops the server and the worker's group."""
    if not forkserver.usable():
        pytest.skip("workers are not forked on this machine")
    import subprocess
    import sys
    import time

    from conftest import REPO
    from engine.runs.process import engine_pythonpath
    env = dict(os.environ, PYTHONPATH=engine_pythonpath(os.environ.get("PYTHONPATH")))
    env.pop(forkserver.SHARE_ENV, None)  # a server of its own
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        server, worker = (int(x) for x in parent.stdout.readline().split())
        for group in (server, worker):
            os.killpg(group, 0)  # both running
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while _running_in_groups({server, worker}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running_in_groups({server, worker}), "processes outlived their parent"


def _running_in_groups(groups: set) -> list:
    """Processes of these process groups that still run (a zombie waiting for its reaping does not)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.append(int(entry))
    return found


def _forked_worker(tmp_path, name: str):
    """A worker forked for this process (its server started if needed), with the pipes it talks on."""
    import sys

    from engine.runs.process import engine_pythonpath
    env = dict(os.environ, PYTHONPATH=engine_pythonpath(os.environ.get("PYTHONPATH")))
    r_child, w_parent = os.pipe()
    r_parent, w_child = os.pipe()
    out, err = open(tmp_path / f"{name}.stdout.log", "ab"), open(tmp_path / f"{name}.stderr.log", "ab")
    try:
        worker = forkserver.start_worker(sys.executable, env, tmp_path, tmp_path, r_child, w_child, out.fileno(),
                                         err.fileno(), tmp_path / f"{name}.escaped.jsonl")
    finally:
        for fd in (r_child, w_child):
            os.close(fd)
        out.close()
        err.close()
    return worker, w_parent, r_parent


def test_an_idle_fork_server_exits_and_the_next_worker_starts_another(monkeypatch, tmp_path):
    if not forkserver.usable():
        pytest.skip("workers are not forked on this machine")
    import time
    forkserver.close_all()
    monkeypatch.setattr(forkserver, "IDLE_EXIT_S", 1.0)
    first, w, r = _forked_worker(tmp_path, "first")
    server = next(iter(forkserver._SERVERS.values()))
    time.sleep(2.5)
    assert server.alive(), "the server exited while its worker ran"
    os.close(w)  # the worker reads the end of its requests and exits
    assert first.wait(timeout=30) == 0
    first.stop_group(1.0)
    os.close(r)
    server.proc.wait(timeout=30)  # idle, no worker left: it exits
    second, w, r = _forked_worker(tmp_path, "second")
    assert next(iter(forkserver._SERVERS.values())) is not server
    os.close(w)
    assert second.wait(timeout=30) == 0
    second.stop_group(1.0)
    os.close(r)
    forkserver.close_all()


SHARED_CHILD = WORKER_STARTED + '''
assert isinstance(worker.server, forkserver.SharedForkServer), worker.server
print(worker.pid, flush=True)
sys.stdin.read()  # until killed
'''


def test_a_child_killed_outright_leaves_no_worker_and_the_shared_server_reaps_it(tmp_path):
    """SIGKILL of a process whose worker came from this process's shared server: its watchdog
    stops the worker's group, and the server (our grandchild) reaps the worker's reaper."""
    if not forkserver.usable():
        pytest.skip("workers are not forked on this machine")
    import subprocess
    import sys
    import time

    from conftest import REPO
    from engine.runs.process import engine_pythonpath
    env = dict(os.environ, PYTHONPATH=engine_pythonpath(os.environ.get("PYTHONPATH")))
    env[forkserver.SHARE_ENV] = forkserver.share()
    child = subprocess.Popen([sys.executable, "-c", SHARED_CHILD, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        worker = int(child.stdout.readline())
        os.killpg(worker, 0)  # running
        server = _ppid(worker)
        assert _ppid(server) == os.getpid(), "the worker was not forked from this process's server"
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{worker}"), "the worker's reaper is still running or was never reaped"


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("has_cuda,interpret", [(False, None), (True, None), (True, "1")])
def test_a_fork_server_imports_triton_only_as_every_worker_would_have_it(has_cuda, interpret):
    """Triton defines its own library (tl.max, tl.sum ...) as interpreted or compiled functions at
    its import. A server imports it before forking only where every worker will agree: no GPU
    (each worker interprets) or TRITON_INTERPRET set already; on a GPU machine without it, a CUDA
    worker compiles and a CPU worker interprets, so Triton is left to each of them."""
    pytest.importorskip("triton")
    code = ("import os, sys\nfrom engine.kernels.forkserver import _preload\n"
            f"_preload(False, {has_cuda})\n"
            "loaded = 'triton' in sys.modules\n"
            "kind = type(sys.modules['triton.language.standard'].max).__name__ if loaded else None\n"
            "print(loaded, kind, os.environ.get('TRITON_INTERPRET'))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = interpret
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=REPO).stdout.split()
    if has_cuda and interpret is None:
        assert out == ["False", "None", "None"]  # left to each worker
    else:
        assert out == ["True", "InterpretedFunction", str(interpret)]  # and the variable as it was

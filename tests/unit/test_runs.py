import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from engine.runs.process import CancelToken, run_process
from engine.runs.workspace import Workspace, atomic_write_json


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_workspaces_in_the_same_second_never_collide(tmp_path):
    names = {Workspace.create(tmp_path, "compare", "same label").root.name for _ in range(20)}
    assert len(names) == 20
    assert all(n.startswith("compare_same-label_") for n in names)


def test_events_and_atomic_reports(tmp_path):
    ws = Workspace.create(tmp_path, "analyze", "k")
    ws.events.emit("run_started", pid=1)
    ws.events.emit("stage", kernel="k", state="SUCCESS")
    lines = [json.loads(x) for x in (ws.root / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["run_started", "stage"] and all("ts" in e for e in lines)
    target = ws.root / "r.json"
    atomic_write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in ws.root.iterdir() if p.name.startswith(".r.json")] == []


def test_timeout_kills_the_whole_group_and_only_it(tmp_path):
    # An unrelated process of ours, outside the child's group, must survive.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file = tmp_path / "grandchild"
        cmd = f"{sys.executable} -c 'import time; time.sleep(60)' & echo $! > {pid_file}; wait"
        r = run_process(cmd, cwd=tmp_path, log_stem=tmp_path / "logs" / "t", timeout_s=1.0)
        assert r.timed_out and not r.ok and "timed out" in r.describe_failure()
        grandchild = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# The grandchild writes its pid whole (a rename) and the command waits for it before its own
# sleep: on a busy machine the grandchild could otherwise be stopped before it had written it.
_DETACH = ("import os, sys, time\n"
           "if os.fork() == 0:\n"
           "    os.setsid()\n"
           "    if os.fork() == 0:\n"
           "        open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
           "        os.replace(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(120)\n"
           "    os._exit(0)\n"
           "deadline = time.monotonic() + 30\n"
           "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
           "    time.sleep(0.01)\n"
           "time.sleep(float(sys.argv[2]))\n")


def _wait_gone(pid, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_grandchild_that_leaves_the_group_with_setsid_is_stopped_and_recorded(tmp_path):
    """fork, setsid, fork: the grandchild is in no group the run started; it is stopped once its
    parent has ended, recorded in the result, and the command's own exit code is kept."""
    pid_file = tmp_path / "escaped"
    r = run_process([sys.executable, "-c", _DETACH + "sys.exit(5)", str(pid_file), "0.3"], cwd=tmp_path,
                    log_stem=tmp_path / "logs" / "e")
    assert r.returncode == 5 and not r.error
    escaped = int(pid_file.read_text())
    assert _wait_gone(escaped, 0.5), "the detached grandchild outlived the command"
    assert [e["pid"] for e in r.escaped] == [escaped]
    assert "outlived its parent" in r.stderr
    assert r.to_dict()["escaped_processes"][0]["pid"] == escaped


def test_a_detached_grandchild_of_a_timed_out_command_is_stopped(tmp_path):
    pid_file = tmp_path / "escaped"
    r = run_process([sys.executable, "-c", _DETACH, str(pid_file), "60"], cwd=tmp_path,
                    log_stem=tmp_path / "logs" / "t", timeout_s=1.5)
    assert r.timed_out and r.returncode == -signal.SIGTERM
    assert _wait_gone(int(pid_file.read_text()))


def test_cancel_stops_a_running_child(tmp_path):
    token = CancelToken()
    threading.Timer(0.5, token.cancel).start()
    t = time.monotonic()
    r = run_process(["sleep", "30"], cwd=tmp_path, log_stem=tmp_path / "c", cancel=token)
    assert r.cancelled and time.monotonic() - t < 10
    assert r.returncode == -signal.SIGTERM


def test_logs_and_missing_program(tmp_path):
    r = run_process("echo out; echo err >&2; exit 4", cwd=tmp_path, log_stem=tmp_path / "x")
    assert r.returncode == 4 and r.stdout == "out\n" and r.stderr == "err\n"
    assert (tmp_path / "x.stdout.log").read_text() == "out\n"
    r = run_process(["/nonexistent/program"], cwd=tmp_path, log_stem=tmp_path / "y")
    assert r.error and not r.ok and "could not start" in r.describe_failure()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="commands run under the reaper on Linux")
def test_a_command_under_the_reaper_waits_for_go_and_a_dead_launcher_starts_nothing(tmp_path):
    """run_process's command starts only after the watchdog knows its group (a byte on the go fd);
    if the launcher dies before (the go pipe closes unwritten), the command never runs."""
    import subprocess
    from engine.runs.process import supervised
    for say_go in (True, False):
        marker = tmp_path / f"ran_{say_go}"
        r, w = os.pipe()
        proc = subprocess.Popen(supervised(["touch", str(marker)], None, go_fd=r), pass_fds=(r,))
        os.close(r)
        time.sleep(0.3)
        assert not marker.exists()  # waiting for go
        if say_go:
            os.write(w, b"1")
        os.close(w)
        assert proc.wait(timeout=30) == (0 if say_go else 1)
        assert marker.exists() == say_go

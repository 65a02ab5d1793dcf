import json
import os
import signal
import subprocess
import sys
import threading
import time

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

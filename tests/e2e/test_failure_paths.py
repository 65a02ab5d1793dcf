"""Timeouts, compile failures, cancel, config errors and exit codes, through the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, only_workspace, read_events, read_report, run_magpie

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_hung_testcase_is_killed_by_the_timeout(tmp_path, write_yaml):
    cfg = write_yaml(f"""
kernel:
  id: hangs
  type: cuda
  testcase_command: "echo $$ > {tmp_path}/pid && sleep 120 & wait"
""")
    started = time.monotonic()
    proc = run_magpie("analyze", "-k", cfg, "-o", tmp_path / "out", "--timeout", "2", "--no-perf")
    assert time.monotonic() - started < 60
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (res,) = read_report(tmp_path / "out")["results"]
    assert res["correctness_state"] == "FAILED"
    assert "timed out after" in res["errors"][0]
    run = res["correctness_result"]["testcase"]["commands"][0]
    assert run["timed_out"] is True
    shell_pid = int((tmp_path / "pid").read_text())
    assert not _alive(shell_pid)


def test_compile_failure_is_reported_with_stderr(tmp_path, write_yaml):
    cfg = write_yaml(f"""
kernel:
  id: broken
  type: cuda
  compile_command:
    - [{PY}, -c, "print('step one')"]
    - [{PY}, -c, "import sys; sys.stderr.write('kernel.cu(12): error: identifier x is undefined'); sys.exit(3)"]
  testcase_command: "true"
""")
    proc = run_magpie("analyze", "-k", cfg, "-o", tmp_path)
    assert proc.returncode == 1
    (res,) = read_report(tmp_path)["results"]
    assert res["compiling_state"] == "FAILED" and res["score"] == 0.0
    assert res["correctness_state"] == "SKIPPED" and res["performance_state"] == "SKIPPED"
    assert "compile command 2/2 failed" in res["errors"][0]
    assert "identifier x is undefined" in res["errors"][0]
    assert len(res["compiling_result"]["commands"]) == 2
    ws = only_workspace(tmp_path)
    assert "identifier x" in (ws / "logs" / "broken" / "compile_2.stderr.log").read_text()


def test_cancelled_run_keeps_its_report(tmp_path, write_yaml):
    cfg = write_yaml(f"""
kernels:
  - id: slow
    type: cuda
    testcase_command: "echo $$ > {tmp_path}/pid; sleep 120"
  - id: never_reached
    type: cuda
    testcase_command: "true"
""")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([PY, "-m", "engine.cli", "compare", "-k", str(cfg), "-o", str(tmp_path / "out")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "testcase never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    ws = only_workspace(tmp_path / "out")
    report = json.loads((ws / "compare_report.json").read_text())
    assert report["state"] == "cancelled" and report["exit_code"] == 130
    slow, never = report["results"]["kernel_results"]
    assert slow["correctness_result"]["testcase"]["commands"][0]["cancelled"] is True
    assert never["correctness_state"] == "SKIPPED"
    assert read_events(ws)[-1] == {**read_events(ws)[-1], "event": "run_finished", "state": "cancelled"}
    assert not _alive(int(pid_file.read_text()))


def _cancel_when(pid_file, argv, sig=signal.SIGTERM):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the step to interrupt never started"
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=90)
    return proc, out + err


def test_cancel_keeps_the_states_reached(tmp_path, write_yaml):
    """SIGTERM while the third testcase runs: the two that passed stay passed, only the
    interrupted one is CANCELLED, and the winner line blames the cancel, not the baseline."""
    cfg = write_yaml(f"""
kernels:
  - id: base
    type: cuda
    testcase_command: "true"
    baseline: true
  - id: second
    type: cuda
    testcase_command: "true"
  - id: third
    type: cuda
    testcase_command: "echo $$ > {tmp_path}/pid; sleep 120"
""")
    proc, text = _cancel_when(tmp_path / "pid", [PY, "-m", "engine.cli", "compare", "-k", str(cfg), "--no-perf",
                                                  "-o", str(tmp_path / "out")])
    assert proc.returncode == 130, text
    report = json.loads((only_workspace(tmp_path / "out") / "compare_report.json").read_text())
    base, second, third = report["results"]["kernel_results"]
    assert base["correctness_state"] == "SUCCESS" and second["correctness_state"] == "SUCCESS"
    assert third["correctness_state"] == "CANCELLED" and third["verdict"] == "cancelled"
    assert report["winner_id"] is None and "cancelled" in report["winner_reason"]
    assert "baseline is incorrect" not in report["winner_reason"]


def test_cancel_during_harness_timing_keeps_correctness(tmp_path, write_yaml):
    """A harness compare cancelled while timing: both kernels keep their passed correctness and
    their performance is CANCELLED."""
    slow = tmp_path / "slow.py"
    slow.write_text(f"""import os, time, torch
class Model(torch.nn.Module):
    calls = 0
    def forward(self, x):
        Model.calls += 1
        if Model.calls > 12:  # past correctness (3 seeds x 2 runs) and the warm-up: timing
            open({str(tmp_path / 'pid')!r}, "w").write(str(os.getpid()))
            time.sleep(0.5)
        return x * 2
def get_inputs():
    return [torch.randn(64)]
def get_init_inputs():
    return []
""")
    cfg = write_yaml(f"""
kernels:
  - id: base
    type: pytorch
    source_files: [{slow}]
    baseline: true
  - id: copy
    type: pytorch
    source_files: [{slow}]
""")
    proc, text = _cancel_when(tmp_path / "pid", [PY, "-m", "engine.cli", "compare", "-k", str(cfg), "--seed", "1",
                                                  "--repeats", "50", "-o", str(tmp_path / "out")])
    assert proc.returncode == 130, text
    report = json.loads((only_workspace(tmp_path / "out") / "compare_report.json").read_text())
    for k in report["results"]["kernel_results"]:
        assert k["correctness_state"] == "SUCCESS", k["errors"]
        assert k["performance_state"] == "CANCELLED"
    assert report["winner_id"] is None and "cancelled" in report["winner_reason"]


def test_config_error_names_file_line_and_field(tmp_path, write_yaml):
    cfg = write_yaml("""
kernels:
  - id: a
    type: cuda
    testcase_command: ./a
  - id: b
    type: cuda
    testcase_comand: ./b
""")
    proc = run_magpie("compare", "-k", cfg, "-o", tmp_path / "out")
    assert proc.returncode == 2
    assert f"{cfg}:8: kernels[1].testcase_comand: unknown field. Did you mean 'testcase_command'?" in proc.stderr
    assert "nothing was run" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_entry_without_correctness_check_is_an_error(tmp_path, write_yaml):
    cfg = write_yaml("""
kernel:
  id: unchecked
  type: hip
  compile_command: hipcc -O3 k.hip -o k
""")
    proc = run_magpie("analyze", "-k", cfg, "-o", tmp_path / "out")
    assert proc.returncode == 2
    assert f"{cfg}:2: unchecked: no way to check correctness" in proc.stderr


def test_bad_yaml_syntax_points_at_line(tmp_path, write_yaml):
    cfg = write_yaml("kernel:\n  id: x\n  type: [cuda\n")
    proc = run_magpie("analyze", "-k", cfg)
    assert proc.returncode == 2
    assert f"{cfg}:4" in proc.stderr and "invalid YAML" in proc.stderr


def _timing_kernel(name: str, samples: list[float], ok: bool = True) -> str:
    code = f"print('MAGPIE_TIMING_JSON: {{\\\"samples_ms\\\": {samples}}}'); raise SystemExit({0 if ok else 1})"
    return f"""  - id: {name}
    type: cuda
    testcase_command: [{PY}, -c, "{code}"]
"""


def test_timing_json_verdicts_and_winner(tmp_path, write_yaml):
    base = [10.0 + 0.01 * i for i in range(20)]
    cfg = write_yaml("kernels:\n" + _timing_kernel("base", base)
                     + _timing_kernel("fast", [5.0 + 0.01 * i for i in range(20)])
                     + _timing_kernel("same", list(reversed(base)))
                     + _timing_kernel("slow", [20.0 + 0.01 * i for i in range(20)]))
    proc = run_magpie("compare", "-k", cfg, "-o", tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = read_report(tmp_path)["results"]
    verdicts = [k["verdict"] for k in res["kernel_results"]]
    assert verdicts == ["baseline", "faster", "tie", "slower"]
    fast = res["kernel_results"][1]
    assert fast["performance_result"]["backend"] == "timing_json"
    assert 1.95 < fast["speedup"] < 2.0  # medians 10.095 / 5.095
    assert res["winner"] == 1
    ranked = [r[0] for r in res["rankings"]]
    assert ranked[0] == 1 and ranked[-1] == 3 and sorted(ranked) == [0, 1, 2, 3]


def test_incorrect_baseline_fails_compare(tmp_path, write_yaml):
    cfg = write_yaml("kernels:\n" + _timing_kernel("base", [1.0, 1.1, 1.2], ok=False)
                     + _timing_kernel("cand", [0.5, 0.6, 0.7]))
    proc = run_magpie("compare", "-k", cfg, "-o", tmp_path)
    assert proc.returncode == 1
    res = read_report(tmp_path)["results"]
    assert res["winner"] is None and res["rankings"] == []
    assert res["kernel_results"][1]["correctness_state"] == "SUCCESS"


def test_nothing_measured_fails_compare(tmp_path, write_yaml):
    cfg = write_yaml("""
kernels:
  - {id: a, type: cuda, testcase_command: "true"}
  - {id: b, type: cuda, testcase_command: "true"}
""")
    proc = run_magpie("compare", "-k", cfg, "-o", tmp_path)
    assert proc.returncode == 1
    res = read_report(tmp_path)["results"]
    assert res["comparison_metrics"]["correctness"] == [True, True]
    assert "no timing backend" in res["kernel_results"][0]["errors"][0]
    # With --no-perf nothing was asked to be measured: a correct baseline is success.
    proc = run_magpie("compare", "-k", cfg, "-o", tmp_path / "np", "--no-perf")
    assert proc.returncode == 0


def test_positional_files_with_shell_testcase(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("// kernel\n")
    marker = tmp_path / "ran"
    proc = run_magpie("analyze", src, "-t", f"echo 'two words' > {marker} && test -s {marker}",
                      "--type", "cuda", "-o", tmp_path / "out", "--no-perf")
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text().strip() == "two words"
    (res,) = read_report(tmp_path / "out")["results"]
    assert res["kernel_id"] == "k" and res["correctness_state"] == "SUCCESS"


def test_cli_overrides_are_listed(tmp_path, write_yaml):
    cfg = write_yaml("""
kernel:
  id: k
  type: cuda
  testcase_command: "false"
correctness:
  rtol: 0.5
""")
    proc = run_magpie("analyze", "-k", cfg, "-t", "true", "--rtol", "0.01", "-o", tmp_path, "--no-perf")
    assert proc.returncode == 0, proc.stderr
    report = read_report(tmp_path)
    fields = {o["field"]: o for o in report["overrides"]}
    assert fields["k.testcase_command"]["cli"] == ["true"] and fields["k.testcase_command"]["flag"] == "--testcase"
    assert fields["correctness.rtol"] == {"field": "correctness.rtol", "yaml": 0.5, "cli": 0.01, "flag": "--rtol"}
    assert report["settings"]["rtol"] == 0.01


def test_gpu_info_without_gpu(tmp_path):
    proc = run_magpie("--gpu-info")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0].startswith("No GPU detected")


def test_workers_and_framework_config(tmp_path, write_yaml):
    kernels = "".join(_timing_kernel(n, [float(i + 1) + 0.01 * j for j in range(10)])
                      for i, n in enumerate(["a", "b", "c"]))
    cfg = write_yaml("kernels:\n" + kernels)
    fw = tmp_path / "framework.yaml"
    fw.write_text("scheduler:\n  max_workers: 3\ngpu:\n  hardware:\n    enabled: true\n")
    proc = run_magpie("-c", fw, "compare", "-k", cfg, "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    report = read_report(tmp_path / "out")
    assert report["settings"]["workers"] == 3
    assert any("framework config gpu: hardware not used" in w for w in report["warnings"])
    # Timing reran serially (the parallel testcase runs are never used as measurements), in
    # performance.rounds processes per kernel.
    ws = only_workspace(tmp_path / "out")
    rounds = report["settings"]["rounds"]
    assert all((ws / "logs" / k / f"timing_r{r}.stdout.log").exists() for k in "abc" for r in (1, rounds))
    assert [k["verdict"] for k in report["results"]["kernel_results"]] == ["baseline", "slower", "slower"]
    assert "[a] performance (timing_json): SUCCESS" in proc.stderr

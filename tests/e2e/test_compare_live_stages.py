"""A compare says where each kernel is as it goes: a real compare, started detached as the
workbench starts it (the job API's local-process executor), writes per-kernel ``stage`` events in
order (loading, correctness input set i of n, checked, timing warm-up and round i of n, timed, done
with its verdict) before ``run_finished``; its console shows a line per step as it happens; the
run state folded from its events never says "kernel 3 of 3" while the kernels are checked in
parallel; and a run folder written before the fine-grained fields still reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.jobs import KernelRequest, submit
from engine.jobs.launch import find_console_log
from engine.jobs.query import RunInfo, status_text

ROOT = Path(__file__).resolve().parents[2]
MSE = ROOT / "examples" / "kernels" / "loss_functions"
OLD_COMPARE = ROOT / "examples" / "runs" / "compare_three_pass_20261129_191525_aa7d27"


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory) -> tuple[Path, Path]:
    """(run folder, console log) of a real two-kernel compare on the CPU, started detached."""
    work = tmp_path_factory.mktemp("live")
    shutil.copytree(MSE, work / "k", ignore=shutil.ignore_patterns("__pycache__"))
    job = submit(KernelRequest(mode="compare", kernel_config=str(work / "k" / "mse.compare.yaml"), repeats=20,
                               cwd=str(work)), work / "results", executor="local-process")
    assert job.wait(timeout=240) == "completed"
    info = RunInfo(path=job.run_dir)
    for line in (job.run_dir / "events.jsonl").read_text().splitlines():
        info.apply(json.loads(line))
    console = find_console_log(job.run_dir.parent, info.pid)
    assert console is not None
    return job.run_dir, console


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _steps(events: list[dict], kernel: str) -> list[str]:
    """The kernel's way through the run, one word per stage event."""
    out = []
    for e in events:
        if e["event"] != "stage" or e.get("kernel") != kernel:
            continue
        if e["stage"] == "done":
            out.append(f"done:{e['verdict']}")
        elif e.get("step") is not None:
            out.append(f"{e['stage']}:{e['step']}/{e['steps']}")
        else:
            out.append(f"{e['stage']}:{e['state']}")
    return out


def test_each_kernel_writes_its_stages_in_order_and_ends_with_its_verdict(compare_run):
    run_dir, _ = compare_run
    events = _events(run_dir)
    report = json.loads((run_dir / "compare_report.json").read_text())
    verdicts = {r["kernel_id"]: r["verdict"] for r in report["results"]["kernel_results"]}
    finished = next(i for i, e in enumerate(events) if e["event"] == "run_finished")
    for kernel in ("torch_mse", "manual_mse"):
        steps = _steps(events, kernel)
        sets = [s for s in steps if s.startswith("correctness:")]
        n_sets = int(sets[0].split("/")[1])
        assert sets == [f"correctness:{i}/{n_sets}" for i in range(1, n_sets + 1)], steps
        rounds = [s for s in steps if s.startswith("performance:") and "/" in s]
        n_rounds = int(rounds[0].split("/")[1])
        assert rounds == [f"performance:{i}/{n_rounds}" for i in range(0, n_rounds + 1)], steps  # 0: warm-up
        order = [steps.index(x) for x in ("harness:running", sets[0], "harness:SUCCESS", rounds[0], rounds[-1],
                                          "performance:SUCCESS", f"done:{verdicts[kernel]}")]
        assert order == sorted(order), steps
        assert steps[-1] == f"done:{verdicts[kernel]}"
        done = max(i for i, e in enumerate(events) if e.get("kernel") == kernel)
        assert done < finished


def test_the_state_folded_as_the_events_arrive_tells_the_truth(compare_run):
    run_dir, _ = compare_run
    info = RunInfo(path=run_dir)
    seen = []
    for e in _events(run_dir):
        info.apply(e)
        seen.append((e, status_text(info.status), [(r.kernel, r.where) for r in info.kernel_progress]))
    texts = [t for _, t, _ in seen]
    assert not any("kernel 2 of 2" in t or "kernel 1 of 2" in t for t in texts)
    # both kernels are checked on each input set in turn: the line says so
    assert "correctness set 1/5 · 2 of 2 kernels" in texts
    during = next(rows for e, _, rows in seen if e.get("stage") == "correctness" and e.get("step") == 3
                  and e["kernel"] == "manual_mse")
    assert during == [("torch_mse", "correctness set 3/5"), ("manual_mse", "correctness set 3/5")]
    assert any(t.startswith("2 checked · timing round ") for t in texts)
    assert texts[-1].startswith("baseline torch_mse stands") or texts[-1].startswith("winner manual_mse")
    assert [r.stage for r in info.kernel_progress] == ["done", "done"]
    assert info.kernel_progress[0].verdict == "baseline"


def test_the_console_of_a_detached_compare_shows_each_step(compare_run):
    _, console = compare_run
    text = console.read_text()
    for line in ("[torch_mse] correctness set 1/5", "[manual_mse] correctness set 5/5", "[torch_mse] harness: SUCCESS",
                 "[manual_mse] timing round 1/", "[torch_mse] done: baseline"):
        assert line in text, text[:3000]
    # a step's line comes before the summary the run prints at its end
    assert text.index("[manual_mse] correctness set 1/5") < text.index("Winner:")


def test_a_run_folder_from_before_the_steps_still_reads():
    info = RunInfo(path=OLD_COMPARE)
    for line in (OLD_COMPARE / "events.jsonl").read_text().splitlines():
        assert info.apply(json.loads(line))
    assert info.is_finished
    assert [r.stage for r in info.kernel_progress]  # folded from the old stage events
    assert all(r.step is None for r in info.kernel_progress)
    assert "kernel" not in status_text(info.status) or "of" not in status_text(info.status)

"""Kernels that time themselves (their testcase or prof_command prints MAGPIE_TIMING_JSON): each
runs in several processes, interleaved round by round with the other kernels', and the compare's
tie margin follows the clock the samples came from. Behaviour only: the samples here are fixed
numbers, so nothing depends on this machine's speed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.kernels.command_timing import round_order, sample_clock
from engine.kernels.pipeline import FAILED, SUCCESS, Evaluator, Machine
from engine.kernels.plan import KernelSpec, Plan, RunSettings
from engine.kernels.report import CPU_TIE_MARGIN, compare_results, tie_margin_and_reason
from engine.kernels.stats import DEFAULT_TIE_MARGIN
from engine.runs.process import CancelToken
from engine.runs.workspace import Workspace

# Appends "<kernel> <pid>" to the log, then prints fixed samples (and a clock, when given one).
STAMP = r"""
import os, sys
kid, log, clock = sys.argv[1], sys.argv[2], sys.argv[3]
fail_after = int(sys.argv[4]) if len(sys.argv) > 4 else 0
with open(log, "a") as f:
    f.write(f"{kid} {os.getpid()}\n")
if fail_after and sum(1 for line in open(log) if line.split()[0] == kid) > fail_after:
    sys.exit(3)
extra = f', "clock": "{clock}"' if clock != "-" else ""
print('MAGPIE_TIMING_JSON: {"samples_ms": [1.0, 1.1, 1.2, 1.3]' + extra + '}')
"""


def _kernel(tmp_path: Path, index: int, kid: str, clock: str = "-", fail_after: int = 0, prof: bool = False,
            ) -> KernelSpec:
    script = tmp_path / "stamp.py"
    script.write_text(STAMP)
    cmd = f"{sys.executable} {script} {kid} {tmp_path / 'starts.log'} {clock} {fail_after}"
    return KernelSpec(index=index, id=kid, type="hip", source_files=[], working_dir=tmp_path, env={}, compile=[],
                      testcase=[f"{sys.executable} -c 'pass'"] if prof else [cmd], prof=[cmd] if prof else [],
                      baseline=index == 0)


def _compare(tmp_path: Path, kernels: list[KernelSpec], machine: Machine | None = None, **settings):
    plan = Plan(mode="compare", kernels=kernels, settings=RunSettings(**settings), baseline_index=0)
    ev = Evaluator(plan, Workspace(tmp_path / "run"), machine or Machine(), CancelToken())
    return plan, ev, ev.run()


def _starts(tmp_path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in (tmp_path / "starts.log").read_text().splitlines()]


def test_round_order_turns_like_the_harness():
    assert [round_order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"], ["b", "a"], ["a", "b"]]
    assert [round_order([1, 2, 3], r)[0] for r in range(6)] == [1, 3, 2, 1, 3, 2]


def test_samples_come_from_interleaved_processes_and_the_cpu_margin_applies(tmp_path):
    plan, ev, (a, b) = _compare(tmp_path, [_kernel(tmp_path, 0, "a"), _kernel(tmp_path, 1, "b")], rounds=4)
    assert a.performance.state == b.performance.state == SUCCESS, (a.errors, b.errors)
    starts = _starts(tmp_path)
    # The correctness runs (a, b), then 4 rounds, one process of each kernel per round, turned ABBA.
    assert [kid for kid, _ in starts] == ["a", "b"] + ["a", "b", "b", "a", "b", "a", "a", "b"]
    timing = starts[2:]
    for o in (a, b):
        d = o.performance.details
        assert d["backend"] == "timing_json" and d["processes"] == d["rounds"] == 4 and d["interleaved"] is True
        assert d["process_starts"] == [i for i, (kid, _) in enumerate(timing) if kid == o.spec.id]
        assert d["samples_per_process"] == [4, 4, 4, 4] and len(o.sample_rounds) == 4 and o.timing["n"] == 16
        assert len({pid for kid, pid in timing if kid == o.spec.id}) == 4  # a process of its own each round
        assert d["clock"] == "cpu" and "no GPU" in d["clock_reason"]
    assert a.performance.details["interleaved_with"] == ["b"]
    margin, why = tie_margin_and_reason(plan, a)
    assert margin == CPU_TIE_MARGIN and why.startswith("CPU clock") and "no GPU" in why
    sp = compare_results(plan, [a, b])["speed"][1]
    assert sp["verdict"] == "tie" and sp["interval"] == "paired rounds"


@pytest.mark.parametrize("declared, vendor, clock", [
    (None, None, "cpu"), ("cpu", "nvidia", "cpu"), ("wall", "amd", "cpu"),
    (None, "nvidia", "device"), ("device", None, "device"), ("events", "amd", "device"),
])
def test_the_clock_comes_from_the_line_else_from_the_machine(declared, vendor, clock):
    assert sample_clock(declared, vendor)[0] == clock


def test_an_unknown_clock_name_is_an_error_not_a_guess(tmp_path):
    with pytest.raises(ValueError, match="not a clock"):
        sample_clock("gpu-ish", None)
    _, _, (a, b) = _compare(tmp_path, [_kernel(tmp_path, 0, "a", clock="gpuish"), _kernel(tmp_path, 1, "b")], rounds=2)
    assert a.performance.state == FAILED and "not a clock" in a.errors[-1]
    assert b.performance.state == SUCCESS


def test_declared_device_clock_keeps_the_device_margin_and_a_set_margin_wins(tmp_path):
    kernels = [_kernel(tmp_path, 0, "a", clock="device"), _kernel(tmp_path, 1, "b", clock="device")]
    plan, _, (a, _b) = _compare(tmp_path, kernels, Machine(vendor="nvidia"), rounds=2)
    assert tie_margin_and_reason(plan, a) == (DEFAULT_TIE_MARGIN, "device clock: " + a.performance.details["clock_reason"])
    plan.settings.tie_margin = 0.05
    assert tie_margin_and_reason(plan, a) == (0.05, "set by performance.tie_margin or --tie-margin")


def test_a_process_that_fails_fails_its_kernel_and_the_others_go_on(tmp_path):
    # b's 3rd start (correctness, round 1, round 2) exits 3.
    _, _, (a, b) = _compare(tmp_path, [_kernel(tmp_path, 0, "a"), _kernel(tmp_path, 1, "b", fail_after=2)], rounds=3)
    assert a.performance.state == SUCCESS and a.performance.details["processes"] == 3
    assert b.performance.state == FAILED and "timing run failed in round 2" in b.errors[-1]
    assert [kid for kid, _ in _starts(tmp_path)].count("b") == 3  # not run again after it failed


def test_prof_commands_are_interleaved_too(tmp_path):
    _, _, (a, b) = _compare(tmp_path, [_kernel(tmp_path, 0, "a", prof=True), _kernel(tmp_path, 1, "b", prof=True)],
                            rounds=3)
    assert [kid for kid, _ in _starts(tmp_path)] == ["a", "b", "b", "a", "b", "a"]
    assert a.performance.details["backend"] == "prof_command" and a.performance.details["processes"] == 3
    assert a.performance.details["custom_profiling_complete"] is True

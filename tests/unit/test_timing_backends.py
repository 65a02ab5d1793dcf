"""The performance stage's timing backends: a registry that auto walks in order, and one shared
profiler implementation for ncu and rocprofv3 (run in process here, with fake profilers)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from engine.kernels.pipeline import (
    SUCCESS,
    TIMING_BACKENDS,
    Evaluator,
    KernelOutcome,
    Machine,
    MeasurementError,
    ProfilerBackend,
    StageResult,
    TimingBackend,
    register_timing_backend,
)
from engine.kernels.plan import KernelSpec, Plan, RunSettings
from engine.runs.process import CancelToken
from engine.runs.workspace import Workspace

NCU_CSV = '''"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"
"0","vector_add","gpu__time_duration.sum","nsecond","1000"
"1","vector_add","gpu__time_duration.sum","nsecond","1200"
"2","vector_add","gpu__time_duration.sum","nsecond","1100"
'''


def _spec(tmp_path: Path, **kw) -> KernelSpec:
    base = dict(index=0, id="k0", type="cuda", source_files=[], working_dir=tmp_path, env={}, compile=[],
                testcase=[f"{sys.executable} -c 'print(1)'"], prof=[])
    base.update(kw)
    return KernelSpec(**base)


def _evaluator(tmp_path: Path, spec: KernelSpec, machine: Machine | None = None, **settings) -> Evaluator:
    plan = Plan(mode="analyze", kernels=[spec], settings=RunSettings(**settings))
    return Evaluator(plan, Workspace(tmp_path / "run"), machine or Machine(), CancelToken())


def test_every_backend_is_registered_in_auto_order():
    assert list(TIMING_BACKENDS)[:6] == ["prof_command", "harness", "timing_json", "ncu", "rocprofv3", "unavailable"]
    assert all(isinstance(b, TimingBackend) and b.name == n for n, b in TIMING_BACKENDS.items())
    assert isinstance(TIMING_BACKENDS["ncu"], ProfilerBackend)
    assert isinstance(TIMING_BACKENDS["rocprofv3"], ProfilerBackend)


@pytest.mark.parametrize("kw, machine, stdout, expected", [
    ({"prof": ["echo hi"], "harness": True}, Machine(), "", "prof_command"),
    ({"harness": True}, Machine(vendor="nvidia", ncu="/x/ncu"), "", "harness"),
    ({}, Machine(vendor="nvidia", ncu="/x/ncu"), "MAGPIE_TIMING_JSON: {}", "timing_json"),
    ({}, Machine(vendor="nvidia", ncu="/x/ncu"), "", "ncu"),
    ({}, Machine(vendor="amd", rocprofv3="/x/rocprofv3"), "", "rocprofv3"),
    ({}, Machine(vendor="amd", ncu="/x/ncu"), "", "unavailable"),
    ({"testcase": []}, Machine(vendor="nvidia", ncu="/x/ncu"), "", "unavailable"),
])
def test_auto_picks_as_before(tmp_path, kw, machine, stdout, expected):
    spec = _spec(tmp_path, **kw)
    ev = _evaluator(tmp_path, spec, machine)
    o = ev.outcomes[0]
    o.testcase_stdout = stdout
    assert ev._backend(o) == expected


def test_chosen_and_disabled_backends_are_kept(tmp_path):
    ev = _evaluator(tmp_path, _spec(tmp_path), perf_backend="rocprofv3")
    assert ev._backend(ev.outcomes[0]) == "rocprofv3"
    ev = _evaluator(tmp_path, _spec(tmp_path), perf_enabled=False)
    assert ev._backend(ev.outcomes[0]) == "none"


def test_unknown_and_unavailable_backends_fail_with_their_messages(tmp_path):
    ev = _evaluator(tmp_path, _spec(tmp_path))
    with pytest.raises(MeasurementError, match="unknown performance backend 'nope'"):
        ev._measure(ev.outcomes[0], "nope")
    with pytest.raises(MeasurementError, match="no timing backend for this kernel"):
        ev._measure(ev.outcomes[0], "unavailable")


def test_a_new_backend_plugs_in_by_registering(tmp_path, monkeypatch):
    class Constant(TimingBackend):
        name = "constant"

        def auto(self, ev, o):
            return o.spec.type == "constant"

        def measure(self, ev, o):
            return [1.0, 2.0, 3.0], {"note": "made up"}

    monkeypatch.setattr("engine.kernels.pipeline.TIMING_BACKENDS", dict(TIMING_BACKENDS))
    register_timing_backend(Constant())
    ev = _evaluator(tmp_path, _spec(tmp_path, type="constant", testcase=[]))
    o = ev.outcomes[0]
    o.correctness = StageResult(SUCCESS)
    assert ev._backend(o) == "constant"
    ev.performance(o)
    assert o.performance.state == SUCCESS
    assert o.performance.details["backend"] == "constant" and o.performance.details["note"] == "made up"
    assert o.timing["median"] == 2.0


def _fake_tool(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport sys, pathlib\nargs = sys.argv[1:]\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_ncu_through_the_shared_profiler_path(tmp_path):
    ncu = _fake_tool(tmp_path, "ncu", f"pathlib.Path(args[args.index('--log-file') + 1]).write_text({NCU_CSV!r})")
    ev = _evaluator(tmp_path, _spec(tmp_path), Machine(vendor="nvidia", ncu=ncu), perf_timeout_s=60)
    o: KernelOutcome = ev.outcomes[0]
    samples, extra = ev._measure(o, "ncu")
    assert [round(s * 1e6) for s in samples] == [1000, 1200, 1100]
    assert list(extra) == ["backend", "command", "raw", "samples_note", "kernels", "summary"]
    assert extra["backend"] == "ncu" and extra["raw"].endswith("k0.ncu.csv")
    assert extra["kernels"][0]["kernel_name"] == "vector_add" and extra["kernels"][0]["dispatch_count"] == 3


def test_profiler_failures_keep_their_messages(tmp_path):
    quiet = _fake_tool(tmp_path, "ncu", "pass")
    ev = _evaluator(tmp_path, _spec(tmp_path), Machine(vendor="nvidia", ncu=quiet), perf_timeout_s=60)
    with pytest.raises(MeasurementError, match=r"ncu recorded no kernel launches \(see .*k0\.ncu\.csv and the ncu log\)"):
        ev._measure(ev.outcomes[0], "ncu")
    failing = _fake_tool(tmp_path, "rocprofv3", "sys.exit(3)")
    ev = _evaluator(tmp_path, _spec(tmp_path), Machine(vendor="amd", rocprofv3=failing), perf_timeout_s=60)
    with pytest.raises(MeasurementError, match="^rocprofv3 run failed: "):
        ev._measure(ev.outcomes[0], "rocprofv3")
    quiet = _fake_tool(tmp_path, "rocprofv3", "pass")
    ev = _evaluator(tmp_path, _spec(tmp_path), Machine(vendor="amd", rocprofv3=quiet), perf_timeout_s=60)
    with pytest.raises(MeasurementError, match="rocprofv3 recorded no kernel dispatches under .*k0_rocprofv3"):
        ev._measure(ev.outcomes[0], "rocprofv3")
    ev = _evaluator(tmp_path, _spec(tmp_path, testcase=[]), Machine(vendor="amd", rocprofv3=quiet))
    with pytest.raises(MeasurementError, match="profiling needs a testcase_command"):
        ev._measure(ev.outcomes[0], "rocprofv3")

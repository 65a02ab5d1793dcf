"""Typed, versioned run files (engine.runs.schema): old folders open, new files carry
schema_version 1, renamed keys fail loudly, extra keys survive."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.kernels import pipeline
from engine.kernels.harness import LoadSpec
from engine.kernels.pipeline import KernelOutcome, StageResult
from engine.kernels.plan import CliOptions, build_plan
from engine.kernels.report import build_analyze_report, build_compare_report
from engine.runs import schema
from engine.runs.catalog import RunCatalog
from engine.runs.process import process_identity
from engine.runs.schema import (
    COMPARE_REPORT, REPORT_FILES, SCHEMA_VERSION, AnalyzeReport, BenchmarkReport, CompareReport, RunFileError,
    RunStarted, StageEvent, StageState, TraceAnalysisReport, load_report, parse_report, validate_event,
)
from engine.runs.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_RUNS = sorted(p for p in (REPO / "examples" / "runs").iterdir() if (p / "events.jsonl").is_file())
SOFTMAX = REPO / "examples" / "kernels" / "softmax_triton" / "compare.yaml"
SOFTMAX_ANALYZE = SOFTMAX.with_name("analyze.yaml")
TRACE = REPO / "tests" / "data" / "tracelens-golden" / "synthetic_vllm" / "synthetic_vllm.json.gz"


def _report_of(folder: Path) -> Path:
    return next(folder / name for name in REPORT_FILES if (folder / name).exists())


# ----------------------------------------------------------------------------- old run folders

@pytest.mark.parametrize("folder", EXAMPLE_RUNS, ids=lambda p: p.name)
def test_every_example_run_folder_loads_through_the_models(folder):
    for line in (folder / "events.jsonl").read_text().splitlines():
        record = json.loads(line)
        event = validate_event(record)
        assert event.to_dict() == record  # nothing lost, nothing added
    path = _report_of(folder)
    report = load_report(path)
    assert isinstance(report, schema.REPORT_MODELS[path.name])
    # The runs of 2026-11-29 were written before versioning; the GPU run after it.
    assert report.schema_version == (0 if "_20261129_" in folder.name else SCHEMA_VERSION)
    assert report.to_dict() == json.loads(path.read_text())
    assert report.state == "completed"


def test_example_reports_read_typed():
    compare = load_report(next(p for p in EXAMPLE_RUNS if p.name.startswith("compare_")) / COMPARE_REPORT)
    assert isinstance(compare, CompareReport)
    by_id = {k.kernel_id: k for k in compare.kernel_results}
    assert by_id["one_pass"].correct and by_id["one_pass"].verdict == "faster" and by_id["one_pass"].speedup > 1
    assert not by_id["unmasked"].correct and by_id["unmasked"].correctness_state == StageState.FAILED
    assert compare.baseline.id == "three_pass" and compare.rankings[0][0] == 1
    assert by_id["one_pass"].timing.n >= 2 and by_id["one_pass"].timing.median > 0
    bench = load_report(next(p for p in EXAMPLE_RUNS if p.name.startswith("benchmark_builtin-tiny_")) / schema.BENCHMARK_REPORT)
    assert isinstance(bench, BenchmarkReport) and bench.success and bench.errors == []
    assert bench.result.completed > 0 and bench.result.value("p99_ttft_ms") is not None  # an extra key, by name
    assert bench.repeats["output_throughput"].n >= 2


def test_catalog_reads_the_example_runs():
    cat = RunCatalog([REPO / "examples" / "runs"])
    cat.refresh()
    assert {r.path for r in cat.runs.values()} == set(EXAMPLE_RUNS)
    for info in cat.runs.values():
        assert info.state == "completed" and info.exit_code == 0 and info.report_path is not None
        assert info.events_read == len((info.path / "events.jsonl").read_text().splitlines())


# ----------------------------------------------------------------------------- written by the engine

def _plan(mode: str):
    return build_plan(mode, CliOptions(kernel_config=str(SOFTMAX if mode == "compare" else SOFTMAX_ANALYZE)))


def _outcomes(plan) -> list[KernelOutcome]:
    outcomes = []
    for k in plan.kernels:
        o = KernelOutcome(spec=k)
        o.compile = StageResult(StageState.SKIPPED, details={"reason": "no compile_command"})
        o.correctness = StageResult(StageState.SUCCESS if k.index != 2 else StageState.FAILED,
                                    errors=[] if k.index != 2 else ["out: 3 NaN/Inf where the reference is finite"])
        outcomes.append(o)
    return outcomes


@pytest.mark.parametrize("mode", ["analyze", "compare"])
def test_kernel_report_written_by_the_engine_round_trips_with_version_1(tmp_path, mode):
    plan = _plan(mode)
    build = build_compare_report if mode == "compare" else build_analyze_report
    report, _ = build(plan, _outcomes(plan), "completed", str(tmp_path), None)
    ws = Workspace(tmp_path)
    path = ws.write_json(schema.report_name_for_mode(mode), report)
    model = load_report(path)
    assert isinstance(model, CompareReport if mode == "compare" else AnalyzeReport)
    assert model.schema_version == SCHEMA_VERSION == 1
    assert model.to_dict() == json.loads(path.read_text())
    assert [k.kernel_id for k in model.kernel_results] == [k.id for k in plan.kernels]
    assert [k.correct for k in model.kernel_results] == [k.index != 2 for k in plan.kernels]
    ws.events.close()


def test_trace_analysis_report_round_trips_with_version_1(tmp_path):
    from engine.trace.analyze import TraceAnalysisOptions, run_trace_analysis
    ws = Workspace(tmp_path)
    result = run_trace_analysis(TRACE, TraceAnalysisOptions(tracelens=False), ws)
    result.report["state"] = "completed"
    path = ws.write_json(schema.TRACE_ANALYSIS_REPORT, result.report)
    model = load_report(path)
    assert isinstance(model, TraceAnalysisReport) and model.schema_version == 1
    assert model.to_dict() == json.loads(path.read_text())
    events = [validate_event(json.loads(x)) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert all(isinstance(e, StageEvent) for e in events)
    assert [e.state for e in events][:2] == ["SUCCESS", "running"]
    ws.events.close()


def test_events_are_validated_when_written_and_run_started_is_versioned(tmp_path):
    ws = Workspace.create(tmp_path, "compare", "k")
    ws.events.emit("run_started", mode="compare", pid=os.getpid(), workspace=str(ws.root))
    ws.events.emit("my_own_event", anything={"goes": [1, 2]})  # unknown kinds pass through
    with pytest.raises(ValueError, match="exit_code"):
        ws.events.emit("run_finished", state="completed", exit_code="zero")
    with pytest.raises(ValueError, match="pid"):
        ws.events.emit("run_started", pid="not a pid")
    ws.events.close()
    lines = [json.loads(x) for x in (ws.root / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["run_started", "my_own_event"]  # the bad ones never reached the file
    started = validate_event(lines[0])
    assert isinstance(started, RunStarted) and started.schema_version == 1 and started.pid == os.getpid()


def test_catalog_skips_a_line_that_does_not_match_its_model(tmp_path):
    run = tmp_path / "benchmark_x_20260101_000000_abc123"
    run.mkdir()
    good = {"ts": 1.0, "event": "run_started", "mode": "benchmark", **process_identity()}
    bad = {"ts": 2.0, "event": "run_finished", "state": "completed", "exit_code": "zero"}
    (run / "events.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    cat = RunCatalog([tmp_path])
    cat.refresh()
    info = cat.runs[run]
    assert info.state == "running" and info.events_read == 1


# ----------------------------------------------------------------------------- versions and keys

def _example_compare() -> dict:
    folder = next(p for p in EXAMPLE_RUNS if p.name.startswith("compare_"))
    return json.loads((folder / COMPARE_REPORT).read_text())


def test_a_version_0_file_loads(tmp_path):
    plan = _plan("compare")
    report, _ = build_compare_report(plan, _outcomes(plan), "completed", str(tmp_path), None)
    del report["schema_version"]
    path = tmp_path / COMPARE_REPORT
    path.write_text(json.dumps(report, default=str))
    model = load_report(path)
    assert model.schema_version == 0 and "schema_version" not in model.to_dict()


def test_a_renamed_required_key_fails_naming_the_field(tmp_path):
    data = _example_compare()
    data["status"] = data.pop("state")
    with pytest.raises(RunFileError, match=r"compare_report.json: state: Field required"):
        parse_report(COMPARE_REPORT, data)
    data = _example_compare()
    data["results"]["kernel_results"][1]["kernel"] = data["results"]["kernel_results"][1].pop("kernel_id")
    path = tmp_path / COMPARE_REPORT
    path.write_text(json.dumps(data))
    with pytest.raises(RunFileError, match=r"results\.kernel_results\.1\.kernel_id: Field required") as err:
        load_report(path)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(RunFileError, match="state"):
        parse_report(schema.BENCHMARK_REPORT, {"success": True, "framework": "builtin"})


def test_a_wrong_type_fails_naming_the_field():
    data = _example_compare()
    data["results"]["kernel_results"][0]["speedup"] = "fast"
    with pytest.raises(RunFileError, match=r"results\.kernel_results\.0\.speedup"):
        parse_report(COMPARE_REPORT, data)


def test_an_unknown_extra_key_survives():
    data = _example_compare()
    data["loop"] = {"iteration": 3, "parent": "run_x"}
    data["results"]["kernel_results"][0]["energy_j"] = 1.5
    model = parse_report(COMPARE_REPORT, data)
    assert model.loop == {"iteration": 3, "parent": "run_x"}
    assert model.kernel_results[0].energy_j == 1.5
    out = model.to_dict()
    assert out["loop"] == data["loop"] and out["results"]["kernel_results"][0]["energy_j"] == 1.5
    assert out == data


def test_not_a_report_file(tmp_path):
    with pytest.raises(RunFileError, match="not a report file"):
        load_report(tmp_path / "summary.txt")
    (tmp_path / COMPARE_REPORT).write_text("{ not json")
    with pytest.raises(RunFileError, match="cannot read the report"):
        load_report(tmp_path / COMPARE_REPORT)


# ----------------------------------------------------------------------------- state strings

def test_state_strings_have_one_home_and_stay_plain_strings():
    assert (pipeline.SUCCESS, pipeline.FAILED, pipeline.SKIPPED, pipeline.CANCELLED) == \
        ("SUCCESS", "FAILED", "SKIPPED", "CANCELLED")
    assert pipeline.SUCCESS is StageState.SUCCESS and type(StageState.SUCCESS) is str
    assert json.dumps({"state": StageState.RUNNING}) == '{"state": "running"}'
    assert schema.RunState.LOST in schema.FINISHED_RUN_STATES


# ----------------------------------------------------------------------------- the harness load request

def test_harness_load_spec_is_one_model_on_both_sides():
    plan = _plan("compare")
    base, kernel = plan.kernels[0], plan.kernels[1]
    spec = LoadSpec.for_kernel(kernel, base, seeds=[0, 1, 2], device="auto", keep_sets_bytes=None)
    line = json.dumps({"op": "load", **spec.fields()})
    back = LoadSpec.from_request(json.loads(line))
    assert back == spec
    assert back.kernel.module == str(kernel.source_files[0]) and back.inputs.module == str(base.source_files[0])
    assert back.init_seed == 0 and back.inputs.get_inputs_func == base.get_inputs_func
    req = json.loads(line)
    req["kernel"]["modul"] = req["kernel"].pop("module")
    with pytest.raises(ValidationError) as err:
        LoadSpec.from_request(req)
    text = str(err.value)
    assert "kernel.module" in text and "kernel.modul" in text  # missing, and the unknown key named

"""magpie benchmark --trace-diff: two traces matched op by op and kernel by kernel, by name and
call site (engine.trace.diff), on the real H200 trace of tests/data and on CPU traces recorded
here with the real torch profiler."""

import csv
import gzip
import json
from pathlib import Path

import pytest
from conftest import REPO, run_magpie

from engine.jobs import TraceDiffRequest, parse_request, run_request
from engine.jobs.query import ConfigError
from engine.trace.diff import diff_traces, profile_trace

H200 = REPO / "tests" / "data" / "tracelens-golden" / "h200_real" / "h200_block_bf16.json.gz"
GELU = "aten::gelu"


def _doc(path: Path = H200) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def _write(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _variant(tmp_path: Path) -> Path:
    """The H200 trace with aten::gelu's kernels made 10x slower, and the first aten::addmm call
    renamed aten::mm (an op, and a kernel call site, that only B has)."""
    doc = _doc()
    events = doc["traceEvents"]
    gelu_ext = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op" and e["name"] == GELU}
    slowed = 0
    for e in events:
        if e.get("cat") == "kernel" and (e.get("args") or {}).get("External id") in gelu_ext:
            e["dur"] *= 10
            slowed += 1
    assert slowed == 3
    first = min((e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"), key=lambda e: e["ts"])
    first["name"] = "aten::mm"
    return _write(doc, tmp_path / "variant.json")


def test_a_trace_against_itself_is_all_zeros():
    d = diff_traces(H200, H200)
    rep = d.report(limit=1000)
    assert rep["basis"] == "gpu" and rep["roofline"] and rep["a"]["arch"] == "H200"
    assert rep["totals"]["time_us"]["delta"] == 0 and rep["totals"]["time_us"]["pct"] == 0
    for what in ("ops", "kernels"):
        sec = rep[what]
        assert sec["only_a"] == [] and sec["only_b"] == [] and rep["totals"][what]["only_a"] == 0
        assert sec["rows"] == len(sec["movers"]) == sec["unchanged"] > 0
        for r in sec["movers"]:
            assert r["status"] == "both"
            for m in ("time_us", "calls", "share_pct"):
                assert r[m]["delta"] == 0 and r[m]["a"] == r[m]["b"], (r["name"], m)
    # Roofline figures where the report has a perf model: the GEMMs under aten::linear.
    addmm = next(r for r in rep["ops"]["movers"] if r["name"] == "aten::addmm")
    assert addmm["stack"] == ["aten::linear"] and addmm["calls"]["a"] == 12
    assert addmm["tflops_s"]["a"] > 100 and 0 < addmm["pct_roofline"]["a"] <= 100 and addmm["gb_s"]["a"] > 0
    assert rep["gpu_timeline"] and all(t["delta_ms"] == 0 for t in rep["gpu_timeline"])


def test_the_op_made_slower_comes_first_and_a_renamed_op_is_only_in_b(tmp_path):
    d = diff_traces(H200, _variant(tmp_path))
    rep = d.report(limit=50)
    top = rep["ops"]["movers"][0]
    assert top["name"] == GELU and top["status"] == "both"
    assert top["time_us"]["delta"] == pytest.approx(9 * top["time_us"]["a"]) and top["time_us"]["pct"] == pytest.approx(900)
    assert top["calls"]["delta"] == 0 and top["share_pct"]["b"] > top["share_pct"]["a"]
    ktop = rep["kernels"]["movers"][0]
    assert "GeluCUDAKernelImpl" in ktop["name"] and ktop["stack"] == [GELU]
    only_b = rep["ops"]["only_b"]
    assert [(r["name"], r["stack"], r["calls"]["b"]) for r in only_b] == [("aten::mm", ["aten::linear"], 1)]
    assert only_b[0]["time_us"]["a"] is None and only_b[0]["time_us"]["delta"] == only_b[0]["time_us"]["b"]
    assert rep["ops"]["only_a"] == []  # addmm still has 11 calls in B
    addmm = next(r for r in rep["ops"]["movers"] if r["name"] == "aten::addmm")
    assert (addmm["calls"]["a"], addmm["calls"]["b"]) == (12, 11) and addmm["time_us"]["delta"] < 0
    # The GEMM kernel launched from the renamed op is a kernel of another call site: only in B.
    only_kb = rep["kernels"]["only_b"]
    assert {tuple(r["stack"]) for r in only_kb} == {("aten::linear", "aten::mm")} and all(r["calls"]["b"] == 1 for r in only_kb)
    assert any(r["name"].startswith("nvjet_sm90") for r in only_kb)
    movers = [abs(r["time_us"]["delta"]) for r in rep["ops"]["movers"]]
    assert movers == sorted(movers, reverse=True)


def test_csvs_have_tracelens_compare_columns(tmp_path):
    out = tmp_path / "results"
    outcome = run_request(TraceDiffRequest(a=str(H200), b=str(_variant(tmp_path))), out)
    assert outcome.exit_code == 0 and outcome.state == "completed"
    folder = outcome.workspace / "trace_diff"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(["gpu_timeline.csv"] + [f"{s}{x}.csv" for s in ("ops_summary", "kernel_summary")
                                                   for x in ("", "_intersect_B", "_only_baseline_B", "_only_variant_B")])
    with open(folder / "ops_summary_intersect_B.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    cols = list(rows[0])
    assert cols[:5] == ["name", "call_stack", "status", "time_us__B_diff", "time_us__B_pct"]
    assert {"A::time_us", "B::time_us", "calls__B_diff", "share_pct__B_pct", "tflops_s__B_diff", "A::pct_roofline"} <= set(cols)
    assert rows[0]["name"] == GELU and float(rows[0]["time_us__B_pct"]) == pytest.approx(900)
    with open(folder / "ops_summary_only_variant_B.csv", newline="") as fh:
        only = list(csv.DictReader(fh))
    assert [(r["name"], r["call_stack"]) for r in only] == [("aten::mm", "aten::linear")]
    assert "A::time_us" not in only[0] and "time_us__B_diff" not in only[0] and float(only[0]["B::calls"]) == 1
    with open(folder / "gpu_timeline.csv", newline="") as fh:
        tl = {r["type"]: r for r in csv.DictReader(fh)}
    assert float(tl["computation_time"]["time ms__B_diff"]) > 0
    report = json.loads((outcome.workspace / "trace_diff_report.json").read_text())
    assert report["mode"] == "trace_diff" and report["state"] == "completed" and report["ops"]["movers"][0]["name"] == GELU
    assert (outcome.workspace / "request.json").is_file() and "aten::gelu" in (outcome.workspace / "summary.txt").read_text()
    events = [json.loads(x) for x in (outcome.workspace / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "run_started" and events[0]["mode"] == "trace_diff"
    assert events[-1]["event"] == "run_finished" and events[-1]["exit_code"] == 0


def test_request_round_trips_and_refuses_missing_files(tmp_path):
    from engine.jobs.launch import command_line
    req = TraceDiffRequest(a=str(H200), b=str(H200), top_k=5)
    assert parse_request(req.to_json()) == req
    argv = command_line(req, tmp_path / "out")
    assert argv[3:] == ["benchmark", "--trace-diff", str(H200), str(H200), "--top-k", "5", "-o", str(tmp_path / "out")]
    with pytest.raises(ConfigError) as err:
        TraceDiffRequest(a=str(H200), b=str(tmp_path / "nope.json")).prepare()
    assert "nope.json" in str(err.value.problems) and "B" in err.value.problems[0]


def test_a_side_may_be_a_benchmark_workspace(tmp_path):
    import shutil
    ws = tmp_path / "benchmark_x_20260101_000000_abcdef"
    (ws / "torch_trace").mkdir(parents=True)
    trace = ws / "torch_trace" / "rank0.pt.trace.json.gz"
    shutil.copy(H200, trace)
    prepared = TraceDiffRequest(a=str(ws), b=str(H200)).prepare()
    assert prepared.a == trace and prepared.b == H200.resolve() and not prepared.warnings


def _record_cpu_trace(path: Path, slow_norm: bool, extra_op: bool) -> Path:
    """A real torch-profiler trace on the CPU: aten::mul from two call sites (inside the
    ``norm`` annotation, and at the top level), aten::mm under ``norm``; ``slow_norm`` makes
    the mm inside ``norm`` far larger, ``extra_op`` adds an aten::tanh only this trace has."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function
    x = torch.randn(8, 8)
    big = torch.randn(384, 384)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            with record_function("norm"):
                y = x * 2.0
                m = big if slow_norm else x
                for _ in range(4):
                    m @ m
            z = y * 3.0
            if extra_op:
                torch.tanh(z)
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def cpu_traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu_traces")
    return (_record_cpu_trace(d / "a.pt.trace.json", False, False),
            _record_cpu_trace(d / "b.pt.trace.json", True, True))


def test_cpu_traces_match_by_call_site(cpu_traces):
    a_path, b_path = cpu_traces
    prof = profile_trace(a_path)
    assert prof.basis == "cpu" and not prof.timeline
    muls = sorted(k for k in prof.ops if k[0] == "aten::mul")
    assert muls == [("aten::mul", ()), ("aten::mul", ("norm",))]  # one name, two call sites: two rows
    assert all(prof.ops[k].calls == 3 and prof.kernels[k].calls == 3 for k in muls)
    # A "kernel" on the CPU is an op's self time: every op is one, nested ops at their own call site.
    assert prof.kernels[("aten::mm", ("norm", "aten::matmul"))].calls == 12
    assert prof.kernels_total_us == pytest.approx(prof.ops_total_us, rel=1e-6)  # self times add up to the whole
    same = diff_traces(a_path, a_path).report(100)
    assert same["totals"]["time_us"]["delta"] == 0 and not same["ops"]["only_a"] and not same["kernels"]["only_b"]
    rep = diff_traces(a_path, b_path).report(100)
    assert rep["basis"] == "cpu" and not rep["roofline"]
    top = rep["kernels"]["movers"][0]
    assert (top["name"], top["stack"]) == ("aten::mm", ["norm", "aten::matmul"]) and top["time_us"]["delta"] > 0
    assert rep["ops"]["movers"][0]["name"] == "aten::matmul" and rep["ops"]["movers"][0]["stack"] == ["norm"]
    assert [(r["name"], r["stack"]) for r in rep["kernels"]["only_b"]] == [("aten::tanh", [])]
    assert [(r["name"], r["stack"]) for r in rep["ops"]["only_b"]] == [("aten::tanh", [])]
    assert not rep["kernels"]["only_a"] and not rep["ops"]["only_a"]


def test_cli_exit_codes_and_bad_input(tmp_path, cpu_traces):
    a_path, b_path = cpu_traces
    ok = run_magpie("benchmark", "--trace-diff", a_path, b_path, "-o", tmp_path / "r", "--top-k", "5", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "largest kernel movers" in ok.stdout and "aten::mm" in ok.stdout and "kernels only in B" in ok.stdout
    assert "total CPU time" in ok.stdout and "trace_diff_report.json" in ok.stderr
    missing = run_magpie("benchmark", "--trace-diff", a_path, tmp_path / "missing.json", "-o", tmp_path / "m",
                         timeout=60)
    assert missing.returncode == 2 and "missing.json" in missing.stderr and "nothing was run" in missing.stderr
    assert not (tmp_path / "m").exists()
    notrace = _write({"schema": 1, "rows": [1, 2]}, tmp_path / "notrace.json")
    bad = run_magpie("benchmark", "--trace-diff", notrace, b_path, "-o", tmp_path / "n", timeout=60)
    assert bad.returncode == 2 and f"error: {notrace}" in bad.stderr and "traceEvents" in bad.stderr
    report = json.loads(next((tmp_path / "n").glob("tracediff_*/trace_diff_report.json")).read_text())
    assert report["state"] == "failed" and str(notrace) in report["error"]
    mixed = run_magpie("benchmark", "--trace-diff", H200, b_path, "-o", tmp_path / "x", timeout=60)
    assert mixed.returncode == 2 and "CPU-only trace" in mixed.stderr and "not compared" in mixed.stderr

"""magpie benchmark --trace-dir through the real command line."""

import gzip
import json
import shutil
from pathlib import Path

from conftest import REPO, only_workspace, run_magpie
from trace_builder import TraceBuilder

GOLDEN = REPO / "tests" / "data" / "tracelens-golden"
SYNTHETIC = GOLDEN / "synthetic_vllm" / "synthetic_vllm.json.gz"


def test_trace_file_gets_gap_idle_and_inference_stages(tmp_path):
    proc = run_magpie("benchmark", "--trace-dir", SYNTHETIC, "-o", tmp_path, "--gpu-arch", GOLDEN / "arch" / "H200.json",
                      "--top-k", "5", "--timings")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = only_workspace(tmp_path)
    assert ws.name.startswith("trace_synthetic_vllm_")
    report = json.loads((ws / "trace_analysis_report.json").read_text())
    times = report["stage_times_s"]  # wall-clock seconds by stage; --timings prints them
    assert {"load", "tree", "idle", "idle causes", "tracelens split", "tracelens stage load+tree", "tracelens report",
            "tracelens CSVs"} <= set(times) and all(v >= 0 for v in times.values())
    assert "time by stage: load " in proc.stdout
    gap = report["gap_analysis"]
    assert [k["Name"].split("(")[0] for k in gap["top_kernels"]][:2] == [
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4> >"]
    assert len(gap["top_kernels"]) == 5 and gap["top_kernels"][0]["Calls"] == 12
    assert gap["gpu_timeline"]["busy_time"]["time_ms"] == 6.72 and gap["gpu_timeline"]["total_time"]["time_ms"] == 110.69
    rows = (ws / "gap_analysis" / "gap_analysis.csv").read_text().splitlines()
    assert rows[0].startswith("Name,Calls,Self CUDA total (us),Avg time (us),% Total,Input Shapes,Min (us)")
    assert len(rows) == 6
    steps = (ws / "gap_analysis" / "gpu_idle_steps_rank0.csv").read_text().splitlines()
    assert len(steps) == 13  # header + 12 step annotations
    tl = report["tracelens_analysis"]
    assert tl["analysis_mode"] == "inference" and tl["gpu_arch"] == "H200"
    assert tl["stage_results"]["prefilldecode"]["phase_pick"]["idx"] == 4
    assert tl["stage_results"]["decode_only"]["phase_pick"]["idx"] == 6
    assert tl["stage_results"]["prefill_only"]["error"]
    simple = Path(tl["stage_results"]["decode_only"]["simple_summary_file"])
    assert simple.name == "decode_only_ISLunknown_OSLunknown_CONCunknown_kernel_roofline_simple.csv"
    assert simple.read_text().splitlines()[0].split(",")[:3] == ["source_category", "op_name", "param_signature"]
    assert (ws / "tracelens" / "prefilldecode" / "unified_perf_summary.csv").is_file()
    assert "GPU kernel time, top 5" in proc.stdout


def test_output_goes_into_the_benchmark_workspace(tmp_path):
    run_ws = tmp_path / "benchmark_vllm_20261129_120000_abc123"
    (run_ws / "torch_trace").mkdir(parents=True)
    shutil.copy(SYNTHETIC, run_ws / "torch_trace" / "host-rank-0.1.pt.trace.json.gz")
    proc = run_magpie("benchmark", "--trace-dir", run_ws, "--stages", "decode_only", "--no-rank-csv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_ws / "gap_analysis" / "gap_analysis.csv").is_file()
    assert not (run_ws / "gap_analysis" / "gap_analysis_rank0.csv").exists()
    assert (run_ws / "trace_analysis_report.json").is_file()
    assert (run_ws / "torch_trace" / "trace_split" / "execution_details.csv").is_file()
    assert sorted(p.name for p in (run_ws / "tracelens").iterdir() if p.is_dir()) == ["decode_only"]


def test_pytorch_mode_without_step_annotations(tmp_path):
    b = TraceBuilder()
    b.op_with_kernel("aten::mm", 0, "gemm", 100, 10, dims=[[64, 128], [128, 256]])
    b.op_with_kernel("aten::add", 20, "add", 120, 2, dims=[[64, 256], [64, 256]])
    trace = b.write(tmp_path / "plain.pt.trace.json", deviceProperties=[{"name": "NVIDIA H200"}])
    proc = run_magpie("benchmark", "--trace-dir", trace, "-o", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = only_workspace(tmp_path / "out")
    tl = json.loads((ws / "trace_analysis_report.json").read_text())["tracelens_analysis"]
    assert tl["analysis_mode"] == "pytorch" and tl["gpu_arch"]  # arch from deviceProperties
    assert (ws / "tracelens_rank0_csvs" / "unified_perf_summary.csv").is_file()


def test_errors(tmp_path):
    text = SYNTHETIC.read_bytes()
    raw = gzip.decompress(text)
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: len(raw) // 2])
    proc = run_magpie("benchmark", "--trace-dir", cut, "-o", tmp_path / "o1")
    assert proc.returncode == 1 and "truncated" in proc.stderr and str(cut) in proc.stderr
    assert "Traceback" not in proc.stderr
    cpu_only = TraceBuilder()
    cpu_only.op("aten::mm", 0, 10)
    p = cpu_only.write(tmp_path / "cpu.json")
    proc = run_magpie("benchmark", "--trace-dir", p, "-o", tmp_path / "o2")
    assert proc.returncode == 1 and "no kernel events" in proc.stderr
    proc = run_magpie("benchmark", "--trace-dir", SYNTHETIC, "--stages", "warmup")
    assert proc.returncode == 2 and "unknown stage(s) warmup" in proc.stderr
    proc = run_magpie("benchmark", "--trace-dir", SYNTHETIC, "--find-kernel-sources")
    assert proc.returncode == 2 and "never clones" in proc.stderr


def test_bad_gpu_arch_fails_before_anything_runs(tmp_path):
    bad = tmp_path / "arch.json"
    bad.write_text('{"name": "X", "mem_bw_gbps": "fast"}')
    for value, text in ((bad, "field 'mem_bw_gbps'"), ("Z9000", "unknown GPU name")):
        proc = run_magpie("benchmark", "--trace-dir", SYNTHETIC, "-o", tmp_path / "out", "--gpu-arch", value)
        assert proc.returncode == 2 and text in proc.stderr and "known names: " in proc.stderr
    assert not (tmp_path / "out").exists()

"""The MCP server's checks and read-only tools, in process through the SDK's own client: roots,
token, bind, command policy, config generation and validation, and the result tools on the run
folders shipped in examples/runs."""

import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from unix_http import UnixHTTPServer

from engine.mcp.security import AccessRefused, BearerAuth, Roots, check_bind, require_commands
from engine.mcp.server import ServerOptions, build_server

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "examples" / "runs"
TRACE_RUN = RUNS / "trace_synthetic_vllm_20261129_192730_d15ae4"
BENCH_A = RUNS / "benchmark_builtin-tiny_20261129_192715_db9427"
BENCH_B = RUNS / "benchmark_builtin-tiny_20261129_192724_793ef2"
SYNTHETIC = REPO / "tests" / "data" / "tracelens-golden" / "synthetic_vllm" / "synthetic_vllm.json.gz"
EAGER = REPO / "examples" / "kernels" / "rmsnorm_pytorch" / "rmsnorm_eager.py"


def test_roots_refuse_escapes_and_symlinks(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "link").symlink_to(tmp_path)  # points outside the root
    roots = Roots([root])
    assert roots.resolve("sub", "p") == root / "sub"
    for bad in ("../x", "/etc/passwd", "link/anything", str(root / "sub" / ".." / "..")):
        with pytest.raises(AccessRefused) as err:
            roots.resolve(bad, "kernel_path")
        assert "kernel_path" in str(err.value) and "outside the allowed roots" in str(err.value)
    with pytest.raises(AccessRefused):
        Roots([tmp_path / "missing"])


def test_bearer_token_comparison():
    auth = BearerAuth(app=None, token="s3cret")
    assert auth.authorized([(b"authorization", b"Bearer s3cret")])
    assert auth.authorized([(b"Authorization", b"bearer s3cret")])
    for value in (b"Bearer s3cre", b"Bearer s3cret2", b"Basic s3cret", b"s3cret", b""):
        assert not auth.authorized([(b"authorization", value)])
    assert not auth.authorized([])
    with pytest.raises(ValueError):
        BearerAuth(app=None, token="")


def test_bind_and_command_policy():
    assert check_bind("127.0.0.1", False) is None and check_bind("::1", False) is None
    assert "--allow-remote" in check_bind("0.0.0.0", False)
    assert check_bind("0.0.0.0", True) is None
    require_commands(False, {"testcase_command": "", "compile_command": None})  # nothing given: fine
    require_commands(True, {"testcase_command": "make test"})
    with pytest.raises(AccessRefused) as err:
        require_commands(False, {"testcase_command": "make test"})
    assert "--allow-commands" in err.value.hint


def test_remote_bind_needs_allow_remote(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "engine.mcp", "--transport", "http", "--host", "0.0.0.0",
                           "--root", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--allow-remote" in proc.stderr


@pytest.fixture
def call(tmp_path):
    app = build_server(ServerOptions(roots=[REPO, tmp_path], output_dir=tmp_path / "results"))

    def run(tool: str, args: dict, error: bool = False):
        async def go():
            async with Client(app) as client:
                return await client.call_tool(tool, args)
        result = anyio.run(go)
        assert result.is_error == error, result.content[0].text
        return result.content[0].text if error else json.loads(result.content[0].text)
    return run


def test_create_kernel_config_is_checked_by_the_engine(call, tmp_path):
    out = call("create_kernel_config", {"kernel_id": "eager", "kernel_path": str(EAGER), "kernel_type": "pytorch",
                                        "output_path": str(tmp_path / "k.yaml")})
    assert "source_files" in out["config_content"] and out["path"] == str(tmp_path / "k.yaml")
    assert (tmp_path / "k.yaml").read_text() == out["config_content"]
    # The file loads; the run check then says what a single PyTorch kernel still needs.
    checked = call("validate_config", {"config_path": str(tmp_path / "k.yaml")})
    assert checked["valid"] is False and "no way to check correctness" in checked["problems"][0]
    assert call("validate_config", {"config_path": str(REPO / "examples" / "kernels" / "rmsnorm_pytorch" /
                                                       "analyze.yaml")})["valid"] is True
    text = call("create_kernel_config", {"kernel_id": "x", "kernel_path": str(EAGER), "kernel_type": "fortran"},
                error=True)
    assert "type" in text and "hip" in text  # the loader's message names the field and the choices
    text = call("create_kernel_config", {"kernel_id": "x", "kernel_path": str(EAGER), "testcase_command": "make",
                                         "output_path": str(tmp_path / "c.yaml")}, error=True)
    assert "--allow-commands" in text and not (tmp_path / "c.yaml").exists()


def test_validate_config_names_file_and_line(call, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kernels:\n  - id: a\n    type: pytorch\n    source_file: [x.py]\n")
    out = call("validate_config", {"config_path": str(bad)})
    assert out["valid"] is False and out["kind"] == "kernel"
    assert any("bad.yaml:4" in p and "source_file" in p for p in out["problems"]), out["problems"]
    out = call("validate_config", {"config_path": str(REPO / "examples" / "benchmarks" / "builtin_tiny_cpu.yaml")})
    assert out == {**out, "valid": True, "kind": "benchmark"}
    # a Magpie config: the same plan as --dry-run (extra args on the command line, Magpie's length bounds)
    magpie = tmp_path / "magpie.yaml"
    magpie.write_text("benchmark:\n  framework: vllm\n  model: org/m\n  envs: {CONC: 4, ISL: 100, OSL: 10, "
                      "RANDOM_RANGE_RATIO: 0.8, VOCAB_SIZE: 1000, EXTRA_VLLM_ARGS: '--block-size 16', "
                      "VLLM_ROCM_USE_AITER: 1}\n")
    out = call("validate_config", {"config_path": str(magpie)})
    assert out["valid"] is True and out["plan"]["server"]["argv"][-2:] == ["--block-size", "16"]
    assert out["plan"]["server"]["env"]["VLLM_ROCM_USE_AITER"] == "1"
    assert out["plan"]["server"]["run_mode"] == "docker"  # Magpie's default when run_mode is not given
    assert out["plan"]["points"][0]["lengths"]["input"] == [80, 100]


def test_roofline_table_and_suggestions_come_from_the_csvs(call):
    table = call("roofline_table", {"workspace_dir": str(TRACE_RUN), "stage": "decode_only"})
    rows = table["rows"]
    assert rows and all(r["stage"] == "decode_only" for r in rows)
    times = [float(r["kernel_time_ms_sum"]) for r in rows]
    assert times == sorted(times, reverse=True)
    out = call("suggest_optimizations", {"workspace_dir": str(TRACE_RUN), "top": 10})
    by_op = {(s.get("op"), s.get("stage")): s for s in out["suggestions"] if "op" in s}
    addmm = by_op[("aten::addmm", "decode_only")]
    ev = addmm["evidence"]
    assert addmm["category"] == "memory" and ev["roofline_bound"] == "MEMORY_BOUND"
    share, pct = float(ev["time_pct"]), float(ev["pct_roofline_mean"])
    assert addmm["potential_gain_pct"] == pytest.approx(share * (1 - pct / 100), abs=0.01)
    launch = [s for s in out["suggestions"] if s["category"] == "launch"]
    assert launch and launch[0]["evidence"]["host_bound_idle_pct"] > 90  # the trace's idle is host-bound
    text = call("suggest_optimizations", {"analysis_result": {"results": [], "mode": "analyze"}}, error=True)
    assert "results" in text and "one element" in text


def test_benchmark_results_and_report_comparison(call, tmp_path):
    listed = call("list_benchmark_results", {"output_dir": str(RUNS)})
    # the two CPU runs, and the 1B server profiled on an H100
    assert {r["job_id"] for r in listed["runs"]} == {BENCH_A.name, BENCH_B.name, "benchmark_builtin-1b_20261206_204557_017c5f"}
    got = call("get_benchmark_result", {"workspace_dir": str(BENCH_A)})
    assert got["state"] == "completed" and got["summary_text"] and "tracelens_files" in got
    assert any(u.endswith("benchmark_report.json") for u in got["resources"])
    # A sweep against a single point: another workload, refused with the differences, no deltas, no files
    cmp = call("compare_benchmark_reports", {"workspace_dirs": [str(BENCH_A), str(BENCH_B)],
                                             "output_dir": str(tmp_path / "cmp")})
    assert cmp["success"] is False and cmp["refused"] is True and cmp["output_files"] == []
    assert "allow_different_workloads" in cmp["hint"] and "different workloads" in cmp["errors"][0]
    refused = cmp["comparisons"][0]
    assert refused["deltas"] is None and not (tmp_path / "cmp").exists()
    assert {"field": "benchmark.client.sweep.concurrency", "a": [1, 2, 4], "b": None, "kind": "workload",
            "why": ""} in refused["differences"]
    cmp = call("compare_benchmark_reports", {"workspace_dirs": [str(BENCH_A), str(BENCH_B)],
                                             "output_dir": str(tmp_path / "cmp"), "allow_different_workloads": True})
    assert cmp["success"] is True and cmp["refused"] is False
    deltas = cmp["comparisons"][0]["deltas"]
    assert "output_throughput" in deltas and deltas["output_throughput"]["noise"] in ("inside", "outside", "unknown")
    assert cmp["comparisons"][0]["differences"] == refused["differences"]  # returned with the deltas
    assert Path(cmp["output_files"][0]).is_file() and Path(cmp["output_files"][0]).is_relative_to(tmp_path)
    tl = call("get_benchmark_result", {"workspace_dir": str(TRACE_RUN)}, error=True)
    assert "benchmark_report.json" in tl


def test_report_comparison_allows_a_kernel_override_and_refuses_a_profiled_run(call, tmp_path):
    from test_report_compare import copy_run, profiled, profiled_report, with_kernel, with_kernel_report
    kern = copy_run(tmp_path, "kernel", with_kernel, with_kernel_report)
    prof = copy_run(tmp_path, "profiled", profiled, profiled_report)
    cmp = call("compare_benchmark_reports", {"workspace_dirs": [str(BENCH_B), str(kern)], "export_format": "json"})
    assert cmp["success"] is True and cmp["comparisons"][0]["message"] == "same workload (the server's kernels differ)"
    assert [d["kind"] for d in cmp["comparisons"][0]["differences"]] == ["kernel"]
    exported = json.loads(Path(cmp["output_files"][0]).read_text())
    assert exported[0]["differences"][0]["field"] == "benchmark.server.kernels.rmsnorm"
    # Three runs: each against the first; one refused pair refuses the call
    cmp = call("compare_benchmark_reports", {"workspace_dirs": [str(BENCH_B), str(kern), str(prof)]})
    assert cmp["refused"] is True and [c["refused"] for c in cmp["comparisons"]] == [False, True]
    assert cmp["comparisons"][1]["differences"][0]["field"] == "run_kind" and len(cmp["errors"]) == 1


def test_gap_analysis_runs_as_a_job_and_returns_its_report(call, tmp_path):
    out = call("gap_analysis", {"trace_dir": str(SYNTHETIC), "output_dir": str(tmp_path / "gaps"), "wait_s": 5})
    deadline = time.monotonic() + 120
    while not out["finished"] and time.monotonic() < deadline:
        out = call("job_status", {"job_id": out["job_id"], "wait_s": 5})
    assert out["state"] == "completed", out
    report = call("job_result", {"job_id": out["job_id"]})["report"]
    assert report["gap_analysis"]["top_kernels"][0]["Name"].startswith("ncclDevKernel")
    assert "outside the allowed roots" in call("gap_analysis", {"trace_dir": "/"}, error=True)


def test_trace_diff_runs_as_a_job_and_returns_its_report(call, tmp_path):
    h200 = REPO / "tests" / "data" / "tracelens-golden" / "h200_real" / "h200_block_bf16.json.gz"
    out = call("trace_diff", {"a": str(h200), "b": str(h200), "output_dir": str(tmp_path / "diff"), "top_k": 3,
                              "wait_s": 5})
    deadline = time.monotonic() + 120
    while not out["finished"] and time.monotonic() < deadline:
        out = call("job_status", {"job_id": out["job_id"], "wait_s": 5})
    assert out["state"] == "completed", out
    report = call("job_result", {"job_id": out["job_id"]})["report"]
    assert report["mode"] == "trace_diff" and report["basis"] == "gpu" and len(report["ops"]["movers"]) == 3
    assert report["totals"]["time_us"]["delta"] == 0 and not report["ops"]["only_b"]
    assert "outside the allowed roots" in call("trace_diff", {"a": "/", "b": str(h200)}, error=True)


def test_discover_kernels_finds_triton_kernels(call):
    out = call("discover_kernels", {"project_path": str(REPO / "examples" / "kernels" / "softmax_triton"),
                                    "kernel_type": "triton"})
    files = {Path(k["source_file"]).name for k in out["kernels"]}
    assert {"softmax_baseline.py", "softmax_onepass.py"} <= files
    assert all(k["suggested_config"]["type"] == "triton" for k in out["kernels"])


def test_inline_compare_writes_a_config_and_cancels(call, tmp_path):
    job = call("compare", {"kernel_paths": [str(EAGER), str(EAGER.with_name("rmsnorm_fused.py"))],
                           "kernel_type": "pytorch", "check_performance": False})
    cfg = Path(job["kernel_config"])
    assert cfg.is_relative_to(tmp_path / "results" / ".mcp")
    assert "kernel_0_rmsnorm_eager" in cfg.read_text() and "kernel_1_rmsnorm_fused" in cfg.read_text()
    cancelled = call("job_cancel", {"job_id": job["job_id"]})
    deadline = time.monotonic() + 120
    status = cancelled
    while not status["finished"] and time.monotonic() < deadline:
        status = call("job_status", {"job_id": job["job_id"], "wait_s": 5})
    # Cancelled before its process was ready: the cancel waits for it, so the run still writes its report.
    assert cancelled["cancelled"] is True and status["state"] == "cancelled", status
    assert call("job_result", {"job_id": job["job_id"]})["report"]["state"] == status["state"]
    assert "no job" in call("job_status", {"job_id": "compare_nothing_20200101_000000_abcdef"}, error=True)


class _ImageEngine(UnixHTTPServer):
    """Enough of the Docker Engine API on a unix socket for images.get: one image is present."""

    def __init__(self, sock: Path, present: str) -> None:
        super().__init__(sock)
        self.present, self.asked = present, []

    async def _handle(self, request):
        from aiohttp import web
        path = request.path.split("/", 2)[-1] if request.path.startswith("/v1.") else request.path.lstrip("/")
        if path in ("_ping", "version"):
            return web.json_response({"ApiVersion": "1.43", "Version": "24.0.0", "MinAPIVersion": "1.12"})
        if path.startswith("images/") and path.endswith("/json"):
            name = path[len("images/"):-len("/json")]
            self.asked.append(name)
            if name == self.present:
                return web.json_response({"Id": "sha256:" + "ab" * 32, "Size": 123,
                                          "RepoDigests": [name.split(":")[0] + "@sha256:" + "cd" * 32]})
            return web.json_response({"message": f"No such image: {name}"}, status=404)
        return web.json_response({"message": f"unexpected {request.method} {path}"}, status=404)


def test_list_benchmark_images_with_and_without_a_docker_engine(call, tmp_path, monkeypatch):
    pytest.importorskip("docker")
    from engine.bench.docker_launch import IMAGES
    sock = Path("/tmp") / f"mgimg{time.time_ns() % 10**8}.sock"  # short: unix socket paths
    with _ImageEngine(sock, present=IMAGES["vllm"]["nvidia"]) as engine:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
        out = call("list_benchmark_images", {"framework": "vllm"})
    sock.unlink(missing_ok=True)
    assert out["images"] == {"vllm": IMAGES["vllm"]}  # Magpie's shape: framework -> arch -> image
    assert out["docker"]["reachable"] is True and sorted(engine.asked) == sorted(IMAGES["vllm"].values())
    here = out["details"]["vllm"]["nvidia"]["local"]
    assert here["present"] is True and here["id"].startswith("sha256:") and here["repo_digests"]
    assert out["details"]["vllm"]["amd"]["local"] == {"present": False, "pull": f"docker pull {IMAGES['vllm']['amd']}"}

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    out = call("list_benchmark_images", {})
    assert set(out["images"]) == set(IMAGES)  # the table does not need an engine
    assert out["docker"]["reachable"] is False and "cannot reach the Docker engine" in out["docker"]["error"]
    assert all(d["local"] is None for archs in out["details"].values() for d in archs.values())
    assert "local" not in call("list_benchmark_images", {"check_local": False})["details"]["atom"]["amd"]
    assert "no image table" in call("list_benchmark_images", {"framework": "tgi"}, error=True)
    assert "run_mode local" in call("list_benchmark_images", {"framework": "builtin"}, error=True)


def test_configure_gpu_is_refused_by_name_with_the_reason(call):
    text = call("configure_gpu", {"device_ids": [0], "gpu_clock_mhz": [1000, 1500], "power_limit_watts": 500},
                error=True)
    assert "configure_gpu is not provided" in text and "root" in text and "nvidia-smi" in text
    assert "configure_gpu is not provided" in call("configure_gpu", {"reset": True}, error=True)


def test_a_tolerance_that_means_nothing_is_refused_not_replaced(call):
    text = call("analyze", {"kernel_config": str(REPO / "examples" / "kernels" / "rmsnorm_pytorch" / "analyze.yaml"),
                            "rtol": "NaN"}, error=True)
    assert "--rtol nan: a tolerance is a finite number >= 0" in text

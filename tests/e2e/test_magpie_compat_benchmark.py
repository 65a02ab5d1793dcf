"""Magpie benchmark YAML keeps Magpie's meaning: a corpus of configs in Magpie's shapes
(tests/data/magpie_compat/benchmark/) checked through the dry-run plan, and the parts that need a
server (length bounds, server_lifecycle) through real runs of the built-in server."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import only_workspace, run_magpie

from engine.bench.dataset import length_bounds
from engine.bench.plan import benchmark_plan, format_plan
from engine.config.yamlfile import ConfigError
from engine.jobs.requests import BenchmarkRequest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "magpie_compat" / "benchmark"


def _plan(name: str, **flags) -> dict:
    prepared = BenchmarkRequest(benchmark_config=str(CORPUS / name), flags=flags).prepare(plan_only=True)
    return benchmark_plan(prepared)


def _warned(plan: dict, text: str) -> bool:
    return any(text in w for w in plan["warnings"])


def test_magpie_range_ratio_bounds_are_inferencex_bounds():
    # Magpie hands RANDOM_RANGE_RATIO to InferenceX's client: lengths from [L*r, L]
    assert length_bounds(1024, 1024, 0.8, rule="magpie") == ((819, 1024), (819, 1024))
    assert length_bounds(1024, 128, 1.0, rule="magpie") == ((1024, 1024), (128, 128))
    assert length_bounds(1024, 512, 0.5, rule="magpie") == ((512, 1024), (256, 512))
    assert length_bounds(10, 10, 0.0, rule="magpie") == ((1, 10), (1, 10))  # never an empty prompt
    # vLLM's own spread stays available under its own name
    assert length_bounds(1024, 512, 0.5, rule="vllm") == ((512, 1536), (256, 768))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        length_bounds(10, 10, 1.5, rule="magpie")


def test_docker_vllm_plan_carries_extra_args_envs_and_magpie_lengths():
    plan = _plan("vllm_docker_extra_args.yaml")
    server = plan["server"]
    assert server["run_mode"] == "docker" and server["run_mode_why"] == "given"
    # EXTRA_VLLM_ARGS on the command line, split as a shell splits words
    assert server["argv"][-5:] == ["--no-enable-prefix-caching", "--block-size", "64", "--compilation-config",
                                   '{"level": 3}']
    assert server["argv"][:3] == ["vllm", "serve", "example-org/Example-70B-FP8"]
    assert "--tensor-parallel-size" in server["argv"] and "--max-model-len" in server["argv"]
    # every other envs key reaches the server's environment, as Magpie's scripts export it
    assert server["env"]["VLLM_ROCM_USE_AITER"] == "1" and server["env"]["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert "EXTRA_VLLM_ARGS" not in server["env"]
    assert plan["points"][0]["lengths"]["input"] == [1638, 2048]
    assert plan["points"][0]["lengths"]["output"] == [409, 512]
    assert plan["points"][0]["lengths"]["rule"] == "magpie"
    assert plan["gpus"]["policy"].startswith("the 4 most free GPU(s)")
    assert _warned(plan, "benchmark.benchmark_script: this tool starts the server itself")
    assert _warned(plan, "benchmark.gap_analysis.find_kernel_sources: no gap_analysis.kernel_source_repos")


def test_no_run_mode_means_docker_as_in_magpie_and_other_frameworks_args_are_named():
    plan = _plan("sglang_default_mode_fixed_len.yaml")
    server = plan["server"]
    assert server["run_mode"] == "docker" and server["run_mode_why"] == "not given: docker, Magpie's default"
    assert server["image"] == "lmsysorg/sglang:v0.5.12-rocm720-mi35x"
    assert server["argv"][-3:] == ["--context-length", "8192", "--disable-radix-cache"]
    assert "--block-size" not in server["argv"]  # EXTRA_VLLM_ARGS is for vLLM
    assert _warned(plan, "benchmark.envs.EXTRA_VLLM_ARGS: for vllm servers; this config runs sglang: not used")
    assert server["env"]["SGLANG_USE_AITER"] == "1"
    assert plan["points"][0]["lengths"]["input"] == [1000, 1000]  # ratio 1: fixed, as in Magpie
    # --run-mode on the command line still wins, and is listed as an override
    local = _plan("sglang_default_mode_fixed_len.yaml", run_mode="local")
    assert local["server"]["run_mode"] == "local"
    assert any(o["flag"] == "--run-mode" and o["yaml"] == "docker" for o in local["overrides"])


def test_local_reuse_config_plans_a_kept_server_on_its_port_and_names_misspelt_envs():
    plan = _plan("vllm_local_reuse.yaml")
    server = plan["server"]
    assert server["port"] == 8899 and server["argv"][server["argv"].index("--port") + 1] == "8899"
    assert "kept running after the run" in server["lifecycle"]
    assert server["ready_timeout_s"] == 1200
    assert _warned(plan, "benchmark.envs.ENABLE_PROFILE: not exported to the server")
    assert _warned(plan, "benchmark.envs.GPU_MEM_UTIL: not exported to the server: Magpie's scripts read "
                         "GPU_MEMORY_UTILIZATION")
    assert "ENABLE_PROFILE" not in server["env"] and "GPU_MEM_UTIL" not in server["env"]
    assert plan["points"][0]["lengths"]["input"] == [256, 512]


def test_ray_run_mode_runs_the_point_as_a_ray_task_with_magpies_ray_config(tmp_path):
    plan = _plan("vllm_ray.yaml")
    assert plan["kind"] == "batch" and plan["environment"] == "ray"
    assert plan["ray"]["address"] == "10.0.0.1:6379" and plan["ray"]["num_cpus"] == 8
    assert plan["ray"]["shared_storage"] is True and plan["ray"]["ship_engine"] is False
    point = plan["points"][0]
    assert point["server"]["run_mode"] == "local"  # on the Ray node, the server is a process of its own
    assert point["points"][0]["lengths"]["input"] == [102, 128]
    multi = tmp_path / "multi.yaml"
    multi.write_text("benchmark:\n  framework: vllm\n  model: m\n  run_mode: ray\n"
                     "  ray_config: {multi_node: true, num_nodes: 2}\n")
    with pytest.raises(ConfigError, match="multi-node serving"):
        BenchmarkRequest(benchmark_config=str(multi)).prepare(plan_only=True)


def test_client_only_envs_point_the_load_at_the_given_server():
    plan = _plan("sglang_client_only.yaml")
    assert plan["server"]["launched"] is False and plan["server"]["base_url"] == "http://10.0.0.2:8888"
    assert plan["points"][0]["num_prompts"] == 320


def test_unbounded_profile_gets_a_bound_and_magpie_tracelens_knobs_are_named():
    plan = _plan("atom_profiled_defaults.yaml")
    assert plan["profiling"]["torch_profiler"] and plan["profiling"]["num_steps"] == 64
    assert _warned(plan, "the profile stops after 64 engine steps")
    assert _warned(plan, "benchmark.profiler.tracelens.auto_patch_runtime: Magpie's TraceLens runtime setting")
    assert _warned(plan, "benchmark.gap_analysis.auto_clone_repos: this tool never clones")
    assert plan["server"]["argv"][-2:] == ["--kv_cache_dtype", "fp8"]
    assert plan["points"][0]["lengths"]["input"] == [512, 1024]  # Magpie's default ratio 0.5


def test_both_range_ratio_meanings_at_once_are_refused(tmp_path):
    p = tmp_path / "both.yaml"
    p.write_text("benchmark:\n  framework: builtin\n  envs: {RANDOM_RANGE_RATIO: 0.5}\n"
                 "  client: {vllm_range_ratio: 0.5}\n")
    with pytest.raises(ConfigError, match="two spreads of the lengths"):
        BenchmarkRequest(benchmark_config=str(p)).prepare()


def test_agentx_and_lm_eval_are_refused_by_name(tmp_path):
    p = tmp_path / "agentx.yaml"
    p.write_text("benchmark:\n  framework: sglang\n  model: m\n  agentx: enable\n")
    with pytest.raises(ConfigError, match="AgentX agentic-coding benchmark is not provided"):
        BenchmarkRequest(benchmark_config=str(p)).prepare(plan_only=True)
    p.write_text("benchmark:\n  framework: vllm\n  model: m\n  envs: {RUN_EVAL: 'true'}\n")
    with pytest.raises(ConfigError, match="lm-eval accuracy gate"):
        BenchmarkRequest(benchmark_config=str(p)).prepare(plan_only=True)
    # a multimodal load would silently become a text load: refused, naming the keys
    p.write_text("benchmark:\n  framework: vllm\n  model: m\n  envs: {MM_LIMIT_IMAGES: 1, MM_IMAGE_WIDTH: 256}\n")
    with pytest.raises(ConfigError, match=r"MM_IMAGE_WIDTH, MM_LIMIT_IMAGES: a multimodal load"):
        BenchmarkRequest(benchmark_config=str(p)).prepare(plan_only=True)


def test_newer_magpie_client_envs_set_the_rate_and_seed(tmp_path):
    p = tmp_path / "rate.yaml"
    p.write_text("benchmark:\n  framework: vllm\n  model: m\n  envs: {REQUEST_RATE: 4.5, SEED: 42, VOCAB_SIZE: 100}\n")
    prepared = BenchmarkRequest(benchmark_config=str(p)).prepare(plan_only=True)
    assert prepared.config.client.request_rate == 4.5 and prepared.config.client.seed == 42
    p.write_text("benchmark:\n  framework: vllm\n  model: m\n  envs: {REQUEST_RATE: inf, VOCAB_SIZE: 100}\n")
    assert BenchmarkRequest(benchmark_config=str(p)).prepare(plan_only=True).config.client.request_rate is None


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    proc = run_magpie("benchmark", "-b", CORPUS / "vllm_docker_extra_args.yaml", "--dry-run", "-o", tmp_path / "out",
                      timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert ("command: vllm serve example-org/Example-70B-FP8 --host 0.0.0.0 --port 8000 --tensor-parallel-size 4 "
            "--max-model-len 4096 --no-enable-prefix-caching --block-size 64 --compilation-config '{\"level\": 3}'"
            ) in out
    assert "VLLM_ROCM_USE_AITER=1" in out
    assert "lengths: input 1638-2048 tokens, output 409-512 tokens (RANDOM_RANGE_RATIO 0.8, Magpie's [L*r, L])" in out
    assert out.rstrip().endswith("dry run: nothing was started")
    assert not (tmp_path / "out").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("benchmark:\n  framework: vllm\n  model: m\n  envs: {CONC: lots, RANDOM_RANGE_RATIO: 2}\n")
    proc = run_magpie("benchmark", "-b", bad, "--dry-run", timeout=120)
    assert proc.returncode == 2
    assert "benchmark.envs.CONC" in proc.stderr and "benchmark.envs.RANDOM_RANGE_RATIO" in proc.stderr


def test_plan_text_lists_every_env_and_the_docker_candidates():
    lines = format_plan(_plan("vllm_docker_extra_args.yaml"))
    assert "    VLLM_LOGGING_LEVEL=WARNING" in lines
    assert any(line.startswith("  image: ") for line in lines)


@pytest.mark.slow
def test_a_run_draws_lengths_within_magpies_bounds_and_reports_them(tmp_path):
    proc = run_magpie("benchmark", "builtin", "--concurrency", "4", "--input-len", "40", "--output-len", "10",
                      "--num-prompts", "24", "--range-ratio", "0.5", "--warmup", "0", "-o", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = only_workspace(tmp_path)
    report = json.loads((ws / "benchmark_report.json").read_text())
    assert report["lengths"] == {"rule": "magpie", "ratio": 0.5, "source": "envs.RANDOM_RANGE_RATIO",
                                 "input": [20, 40], "output": [5, 10]}
    detail = json.loads((ws / "requests" / "point0_repeat0.json").read_text())
    assert all(20 <= n <= 40 for n in detail["input_lens"]) and len(set(detail["input_lens"])) > 1
    assert all(5 <= n <= 10 for n in detail["output_lens"])
    assert "lengths: input 20-40 tokens, output 5-10 tokens" in (ws / "summary.txt").read_text()
    assert "input 20-40 tokens" in proc.stderr  # said on the terminal before the load starts


def _lifecycle_yaml(tmp_path: Path, cleanup: bool) -> Path:
    p = tmp_path / f"keep_{cleanup}.yaml"
    p.write_text("benchmark:\n  framework: builtin\n  envs: {CONC: 2, ISL: 16, OSL: 4, NUM_PROMPTS: 4, "
                 "RANDOM_RANGE_RATIO: 1}\n  client: {warmup: 0}\n  profiler: {gpu_monitor: {enabled: false}}\n"
                 f"  server_lifecycle: {{enabled: true, cleanup: {str(cleanup).lower()}, "
                 f"pid_dir: {tmp_path / 'pids'}}}\n")
    return p


@pytest.mark.slow
def test_server_lifecycle_keeps_reuses_then_stops_the_server(tmp_path):
    from engine.bench.lifecycle import is_alive
    keep, stop = _lifecycle_yaml(tmp_path, False), _lifecycle_yaml(tmp_path, True)
    first = run_magpie("benchmark", "-b", keep, "-o", tmp_path / "a", timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    records = list((tmp_path / "pids").glob("*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert is_alive(record)
    try:
        report_a = json.loads((only_workspace(tmp_path / "a") / "benchmark_report.json").read_text())
        assert report_a["server"]["lifecycle"] == {"kept": str(records[0]), "stopped_at_end": False}
        second = run_magpie("benchmark", "-b", keep, "-o", tmp_path / "b", timeout=300)
        assert second.returncode == 0, second.stdout + second.stderr
        report_b = json.loads((only_workspace(tmp_path / "b") / "benchmark_report.json").read_text())
        assert report_b["server"]["launched"] is False and report_b["server"]["lifecycle"]["reused"] == str(records[0])
        assert report_b["server"]["base_url"] == record["base_url"] and report_b["success"] is True
        assert is_alive(record)
        third = run_magpie("benchmark", "-b", stop, "-o", tmp_path / "c", timeout=300)
        assert third.returncode == 0, third.stdout + third.stderr
        assert "it is stopped at the end (cleanup: true)" in third.stderr
        assert not is_alive(record) and not records[0].exists()
    finally:
        if is_alive(record):
            os.killpg(record["pgid"], 9)


def test_a_record_whose_pid_was_reused_is_never_signalled(tmp_path):
    """A kept-server record pointing at a live process that is not the recorded one (its start time
    differs: the pid was reused) is dropped, and that process is left alone."""
    from engine.bench import lifecycle
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        folder = tmp_path / "pids"
        folder.mkdir()
        from engine.runs.process import process_start_time
        start = process_start_time(other.pid)
        rec = {"settings_hash": "x", "settings": {"framework": "builtin"}, "base_url": "http://127.0.0.1:9",
               "port": None, "pid": other.pid, "pgid": other.pid, "start_time": start - 1}
        (folder / "builtin_x.json").write_text(json.dumps(rec))
        assert not lifecycle.is_alive(rec)
        lifecycle.stop_kept(rec)  # must not signal it
        kept, notes = lifecycle.find_kept(folder, {"framework": "builtin"}, None, False, stop_at_end=True)
        assert kept is None and "is gone; record removed" in notes[0]
        assert not (folder / "builtin_x.json").exists()
        assert other.poll() is None  # still running: never signalled
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_a_profiled_run_whose_analysis_fails_says_so_everywhere(tmp_path, monkeypatch):
    """The built-in server profiled for real; the trace analysis then fails (injected): the run is
    'completed_with_errors', not a success, and summary.txt and the log say which stage failed."""
    import engine.trace.analyze as analyze
    from engine.bench import run as bench_run
    from engine.config.benchmark import load_benchmark_config
    from engine.runs.process import CancelToken
    from engine.runs.workspace import Workspace

    def broken(*_a, **_k):
        raise RuntimeError("the stage split found no steady state")

    monkeypatch.setattr(analyze, "run_trace_analysis", broken)
    p = tmp_path / "prof.yaml"
    p.write_text("benchmark:\n  framework: builtin\n  envs: {CONC: 2, ISL: 16, OSL: 4, NUM_PROMPTS: 4, "
                 "RANDOM_RANGE_RATIO: 1}\n  client: {warmup: 1}\n  profiler:\n    gpu_monitor: {enabled: false}\n"
                 "    torch_profiler: {enabled: true, num_steps: 8}\n    tracelens: {enabled: true}\n")
    cfg, _ = load_benchmark_config(p)
    logged: list[str] = []
    code, report = bench_run.run_benchmark(cfg, Workspace(tmp_path / "run"), CancelToken(), overrides=[],
                                           warnings=[], log=logged.append)
    assert report["throughput"]["completed_requests"] == 4  # the load's numbers stand
    assert report["state"] == "completed_with_errors" and report["success"] is False and code == 1
    assert report["analysis_errors"] == ["trace analysis: RuntimeError: the stage split found no steady state"]
    summary = (tmp_path / "run" / "summary.txt").read_text()
    assert summary.splitlines()[0].startswith("COMPLETED WITH ERRORS: the load was measured, 1 analysis stage(s) "
                                              "failed: trace analysis: RuntimeError")
    assert "error: trace analysis: RuntimeError: the stage split found no steady state" in logged


def test_every_magpie_envs_key_has_its_meaning():
    plan = _plan("vllm_every_env.yaml")
    server = plan["server"]
    argv = server["argv"]
    # MODEL_REVISION pins the model on the server's command line; MAX_MODEL_LEN, GPU_MEMORY_UTILIZATION too
    assert argv[argv.index("--revision") + 1] == "0123456789abcdef0123456789abcdef01234567"
    assert argv[argv.index("--max-model-len") + 1] == "8192"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert plan["gpus"]["policy"] == "pinned by HIP_VISIBLE_DEVICES" and server["env"]["HIP_VISIBLE_DEVICES"] == "2,3"
    assert plan["client"]["endpoint"] == "chat"  # MAGPIE_BENCHMARK_ENDPOINT /v1/chat/completions
    assert plan["points"][0] == {**plan["points"][0], "concurrency": 8, "num_prompts": 24, "input_len": 256,
                                 "output_len": 64}
    assert plan["points"][0]["lengths"]["input"] == [64, 256]
    for key in ("TL_EXTENSION", "MAGPIE_BENCHMARK_BACKEND"):
        assert _warned(plan, f"benchmark.envs.{key}: not exported to the server") and key not in server["env"]
    assert _warned(plan, "benchmark.envs.MAGPIE_EVAL_LIMIT: a setting of Magpie's lm-eval gate")


@pytest.mark.slow
def test_a_local_batch_shares_one_server_across_its_points_then_stops_it(tmp_path):
    """server_lifecycle in a batch: the first point's server serves the later points with the same server
    settings (other client loads), and the batch stops it at its end."""
    base = _lifecycle_yaml(tmp_path, True)
    batch = tmp_path / "batch.yaml"
    batch.write_text(f"sweep:\n  config: {base.name}\n  over: {{concurrency: [1, 2, 3]}}\n")
    proc = run_magpie("benchmark", "--batch", batch, "-o", tmp_path / "out", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = only_workspace(tmp_path / "out")
    reports = [json.loads(p.read_text()) for p in sorted((ws / "points").glob("*/benchmark_report.json"))]
    assert len(reports) == 3 and all(r["success"] for r in reports)
    assert reports[0]["server"]["launched"] is True
    assert [r["server"]["launched"] for r in reports[1:]] == [False, False]
    assert {r["server"]["base_url"] for r in reports} == {reports[0]["server"]["base_url"]}
    assert not list((tmp_path / "pids").glob("*.json"))  # stopped and its record removed at the batch's end
    from engine.bench.launch import _get
    assert _get(reports[0]["server"]["base_url"] + "/health", timeout=2.0)[0] == 0

"""Magpie's own kernel-config shapes load unchanged and mean what they meant in Magpie.

The corpus (tests/data/magpie_compat/kernel) is laid out like a Magpie checkout; every config
is run through the real command line with ``--dry-run`` from that folder (Magpie's examples say
"cd /path/to/Magpie" first), and its plan checked: the resolved folders, the commands, and the
Magpie fields that map onto this tool's settings or are named as not used. Runs that execute
(Accordo through a stand-in ``accordo`` program, a missing compiler, a bench_target) work on a
copy of the corpus.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from conftest import REPO, read_report, run_magpie

CORPUS = REPO / "tests" / "data" / "magpie_compat" / "kernel"
HIP = CORPUS / "examples" / "simple_hip_test"
TRITON = CORPUS / "examples" / "simple_triton_test"


def dry_run(mode: str, config: str, *args, cwd: Path = CORPUS, env: dict | None = None, out: Path | None = None):
    argv = [mode, "-k", config, "--dry-run", *args] + (["-o", out] if out else [])
    proc = run_magpie(*argv, cwd=cwd, env=env)
    return proc, proc.stdout.splitlines()


def line(lines: list[str], start: str) -> str:
    found = [x for x in lines if x.strip().startswith(start)]
    assert found, f"no line starting with {start!r} in:\n" + "\n".join(lines)
    return found[0]


# ----------------------------------------------------------------------------- working_dir and ${VAR}

def test_relative_working_dir_is_relative_to_the_current_directory(tmp_path):
    out = tmp_path / "results"
    proc, lines = dry_run("analyze", "configs/analyze_cwd.yaml", out=out)
    assert proc.returncode == 0, proc.stderr
    assert line(lines, "working_dir:") == f"  working_dir: {HIP}  <- working_dir"
    assert line(lines, "source_files:") == f"  source_files: {HIP / 'vector_add.hip'}"
    assert line(lines, "compile_command:").startswith(
        "  compile_command: hipcc -g -O2 -o vector_add vector_add.hip   (argv, no shell)")
    assert line(lines, "testcase_command:").startswith("  testcase_command: ./vector_add")
    assert line(lines, "env:") == "  env: HIP_VISIBLE_DEVICES=0"
    assert line(lines, "current directory:").startswith(f"current directory: {CORPUS} ")
    assert not out.exists()  # nothing started, no run folder

    # From another folder the same config means another folder, as in Magpie: an error that says so.
    proc, _ = dry_run("analyze", str(CORPUS / "configs" / "analyze_cwd.yaml"), cwd=tmp_path)
    assert proc.returncode == 2
    assert (f"analyze_cwd.yaml:9: vector_add.working_dir examples/simple_hip_test: folder "
            f"{tmp_path.resolve()}/examples/simple_hip_test does not exist (a relative working_dir is relative to the "
            f"current directory {tmp_path.resolve()}, as in Magpie)") in proc.stderr
    assert "nothing was run" in proc.stderr


def test_magpie_config_dir_names_the_yaml_folder_from_anywhere(tmp_path):
    proc, lines = dry_run("analyze", str(CORPUS / "configs" / "analyze_config_dir.yaml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert line(lines, "working_dir:") == f"  working_dir: {HIP}  <- working_dir"


def test_an_unset_variable_in_working_dir_is_named(tmp_path):
    assert "MAGPIE_COMPAT_CK_HOME" not in os.environ
    proc, _ = dry_run("analyze", "configs/analyze_env_var.yaml", out=tmp_path / "out")
    assert proc.returncode == 2
    assert ("configs/analyze_env_var.yaml:8: ck_gemm_like.working_dir ${MAGPIE_COMPAT_CK_HOME}/build: "
            "$MAGPIE_COMPAT_CK_HOME is not set") in proc.stderr
    assert ("configs/analyze_env_var.yaml:5: ck_gemm_like.source_files: ${MAGPIE_COMPAT_CK_HOME}/test/gemm_add/"
            "test_gemm_add.cpp: $MAGPIE_COMPAT_CK_HOME is not set") in proc.stderr
    assert not (tmp_path / "out").exists()
    # Set, it is expanded like the shell would (Magpie's os.path.expandvars).
    ck = tmp_path / "ck"
    (ck / "build").mkdir(parents=True)
    (ck / "test" / "gemm_add").mkdir(parents=True)
    (ck / "test" / "gemm_add" / "test_gemm_add.cpp").write_text("")
    proc, lines = dry_run("analyze", "configs/analyze_env_var.yaml", env={"MAGPIE_COMPAT_CK_HOME": str(ck)})
    assert proc.returncode == 0, proc.stderr
    assert line(lines, "working_dir:") == f"  working_dir: {ck / 'build'}  <- working_dir"
    assert line(lines, "source_files:") == f"  source_files: {ck / 'test' / 'gemm_add' / 'test_gemm_add.cpp'}"


def test_kernel_and_kernels_merge_with_list_commands_and_no_working_dir():
    proc, lines = dry_run("compare", "configs/compare_merged.yaml")
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(lines)
    assert "kernel 0: baseline_O2 (hip) [baseline]" in text and "kernel 1: candidate_O3 (hip)" in text
    assert "baseline: baseline_O2 (index 0, chosen by first entry)" in text
    assert "  testcase_command 1/2: ./vector_add_O2   (argv, no shell)" in text
    assert "  testcase_command 2/2: echo checked   (argv, no shell)" in text
    assert "  prof_command: rocprofv3 --stats ./vector_add_O2   (argv, no shell)" in text
    assert "  env: HIP_VISIBLE_DEVICES=0, OMP_NUM_THREADS=4" in text
    assert "timing (prof_command)" in text
    # Commands and no working_dir: run in the current directory, as Magpie runs them.
    assert (f"  working_dir: {CORPUS}  <- the current directory (no working_dir: Magpie runs the commands "
            "there)") in text
    assert f"  source_files: {HIP / 'vector_add.hip'}" in text


# ----------------------------------------------------------------------------- latency and bench_target

def test_latency_block_maps_what_maps_and_names_the_rest():
    proc, lines = dry_run("analyze", "configs/analyze_latency.yaml")
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(lines)
    assert "warmup 5" in text and "seed 42" in text and "600/600/60 s" in text
    for note in ("latency.warmup_iters 5 -> performance.warmup",
                 "latency.seed 42 -> the harness's input seeds 42, 43",
                 "latency.timeout_seconds 60 -> performance.timeout_seconds",
                 "latency.kernel_filter 'vector_add' -> ncu --kernel-name regex:vector_add and rocprofv3 "
                 "--kernel-include-regex vector_add",
                 "latency.method kernel_trace -> device-side kernel times",
                 "latency.primary_metric kernel_median_ms -> the median"):
        assert f"  - {note}" in text, note
    for warning in ("latency.rep_ms 20: not used: the harness picks the calls per round itself",
                    "latency.n_retries 5: not used: performance.rounds (10) interleaved rounds",
                    "latency.estimate_reps 5: not used",
                    "latency.output_dir latency_results: not used: results are in the run folder"):
        assert f"  - {warning}" in text, warning


def test_cuda_graph_method_and_wall_metric_are_named():
    proc, lines = dry_run("analyze", "configs/analyze_hipgraph_latency.yaml")
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(lines)
    assert "  - latency.method cuda_graph: vector_add_hipgraph not run by the Python harness" in text
    assert "MAGPIE_LATENCY_JSON line is not read" in text
    assert "  - latency.primary_metric wall_median_ms: not available" in text


def test_bench_target_is_called_by_the_harness():
    proc, lines = dry_run("analyze", "configs/analyze_triton_latency.yaml")
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(lines)
    module = TRITON / "triton_vector_add.py"
    assert line(lines, "working_dir:") == f"  working_dir: {TRITON}  <- working_dir"
    assert f"  harness module: {module} (function triton_vector_add, inputs get_inputs())" in text
    assert f"  pythonpath: {TRITON}" in text
    assert "timing (harness)" in text and "seeds 42..44" in text
    assert f"  - latency.pythonpath -> first on the PYTHONPATH of every kernel process: {TRITON}" in text
    assert "  - latency.kernel_filter '_vector_add_kernel': not used for triton_vector_add: the Python harness" in text


def test_bench_target_compare_runs_two_functions_of_one_module(tmp_path):
    proc, lines = dry_run("compare", "configs/compare_triton_blocksize.yaml")
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(lines)
    assert "(function triton_vector_add_block1024, inputs get_inputs())" in text
    assert "harness: outputs vs the baseline triton_vector_add_block256" in text
    assert "  - latency.method both: the wall-minus-kernel dispatch overhead" in text
    # And it runs: the harness calls each function on the module's inputs and compares the outputs.
    copy = tmp_path / "magpie"
    shutil.copytree(CORPUS, copy)
    proc = run_magpie("compare", "-k", "configs/compare_triton_blocksize.yaml", "--no-perf", "-o", tmp_path / "out",
                      cwd=copy, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_report(tmp_path / "out")["results"]["kernel_results"]
    assert [r["correctness_state"] for r in results] == ["SUCCESS", "SUCCESS"]
    harness = results[1]["correctness_result"]["harness"]
    assert harness["passed"] and harness["reference"] == "baseline outputs"
    assert results[1]["correctness_result"]["testcase"]["passed"]


# ----------------------------------------------------------------------------- ray_config

def test_ray_config_selects_ray_and_maps_its_keys():
    proc, lines = dry_run("analyze", "configs/analyze_ray.yaml")
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(lines)
    env = line(lines, "environment:")
    assert env.startswith("environment: ray (address=ray://head:10001") and "num_cpus=4.0" in env
    assert "shared_storage=True" in env and "ship_engine=False" in env and "HF_HOME" in env
    for note in ("ray_config -> environment ray", "ray_config.cluster_address ray://head:10001 -> scheduler.ray.address",
                 "ray_config.entrypoint_num_cpus 4 -> scheduler.ray.num_cpus",
                 "ray_config.install_magpie false -> scheduler.ray.ship_engine"):
        assert f"  - {note}" in text, note
    for key in ("entrypoint_num_gpus", "multi_node", "total_num_gpus", "num_nodes", "gpus_per_node", "pip_packages",
                "metadata", "magpie_install_path"):
        assert f": ray_config.{key}: not used: " in text, key
    # -e local keeps the kernels here, and says ray_config is not used.
    proc = run_magpie("-e", "local", "analyze", "-k", "configs/analyze_ray.yaml", "--dry-run", cwd=CORPUS)
    assert proc.returncode == 0, proc.stderr
    assert "environment: local" in proc.stdout and "ray_config: not used" in proc.stdout


# ----------------------------------------------------------------------------- accordo

ACCORDO_STANDIN = r'''#!{python}
"""A stand-in for IntelliKit's accordo CLI: records its call, answers in Accordo's JSON."""
import json, os, sys
with open(os.environ["ACCORDO_STANDIN_LOG"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd()}}, f)
mode = os.environ.get("ACCORDO_STANDIN_MODE", "valid")
print("INFO capturing snapshots ...")
if mode == "error":
    print(json.dumps({{"error": "Failed to auto-extract kernel arguments"}}))
    sys.exit(1)
if mode == "valid":
    print(json.dumps({{"is_valid": True, "num_arrays_validated": 1, "matched_arrays": {{"c": {{}}}}}}))
else:
    print(json.dumps({{"is_valid": False, "num_mismatches": 1, "error_message": "c differs",
                      "mismatches": [{{"arg_name": "c", "dispatch_index": 0, "max_difference": 0.5}}]}}))
'''


def _accordo_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "accordo"
    script.write_text(ACCORDO_STANDIN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_accordo_plan_shows_magpies_command_line():
    proc, lines = dry_run("analyze", "configs/analyze_accordo.yaml", env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(lines)
    assert "settings: correctness.backend accordo" in text
    cmd = line(lines, "accordo command:")
    assert cmd == ("  accordo command: accordo validate --kernel-name 'vector_add(float const*, float const*, float*, int)'"
                   " --ref-binary ./vector_add --opt-binary ./vector_add --atol 1e-06 --rtol 1e-05 --timeout 45"
                   f" --working-dir {HIP} --log-level INFO --equal-nan --kernel-args 'a:float*,b:float*,c:float*,n:int'")
    assert "'accordo' is not on PATH" in text and "install IntelliKit Accordo" in text


@pytest.mark.parametrize("mode,state,passed", [("valid", "SUCCESS", True), ("invalid", "FAILED", False),
                                                ("error", "FAILED", False)])
def test_accordo_judges_by_its_json(tmp_path, mode, state, passed):
    copy = tmp_path / "magpie"
    shutil.copytree(CORPUS, copy)
    log = tmp_path / "accordo_call.json"
    env = {"PATH": f"{_accordo_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}", "ACCORDO_STANDIN_LOG": str(log),
           "ACCORDO_STANDIN_MODE": mode}
    proc = run_magpie("analyze", "-k", "configs/analyze_accordo.yaml", "--no-perf", "-o", tmp_path / "out",
                      cwd=copy, env=env)
    assert proc.returncode == (0 if passed else 1), proc.stdout + proc.stderr
    report = read_report(tmp_path / "out")
    (res,) = report["results"]
    assert res["correctness_state"] == state
    acc = res["correctness_result"]["accordo"]
    assert acc["passed"] is passed
    call = json.loads(log.read_text())
    argv = call["argv"]
    assert argv[:3] == ["validate", "--kernel-name", "vector_add(float const*, float const*, float*, int)"]
    assert argv[argv.index("--working-dir") + 1] == str(copy / "examples" / "simple_hip_test")
    assert argv[argv.index("--timeout") + 1] == "45" and "--equal-nan" in argv
    assert Path(call["cwd"]).parent.parent == Path(report["workspace_dir"])  # the run's folder, as in Magpie
    if mode == "invalid":
        assert acc["mismatches"][0]["arg_name"] == "c" and "accordo: c differs" in res["errors"]
    if mode == "error":
        assert "Failed to auto-extract kernel arguments" in res["errors"][0]
    assert not report["not_judged"]


def test_accordo_missing_is_not_judged_never_incorrect(tmp_path):
    copy = tmp_path / "magpie"
    shutil.copytree(CORPUS, copy)
    if shutil.which("accordo", path="/usr/bin:/bin"):
        pytest.skip("an accordo program is installed in /usr/bin or /bin")
    proc = run_magpie("analyze", "-k", "configs/analyze_accordo.yaml", "--no-perf", "-o", tmp_path / "out",
                      cwd=copy, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2  # nothing could be judged here
    report = read_report(tmp_path / "out")
    (res,) = report["results"]
    assert res["correctness_state"] == "SKIPPED" and not res["correctness_result"]["errors"]
    assert "'accordo' is not on PATH" in res["environment_problems"][0]
    assert "install IntelliKit Accordo" in res["environment_problems"][0]
    assert "correctness.backend harness or testcase" in res["environment_problems"][0]
    assert report["not_judged"] == {"vector_add": res["environment_problems"]}
    assert "incorrect" not in proc.stdout and "not judged" in proc.stdout


# ----------------------------------------------------------------------------- a missing toolchain

def test_missing_compiler_is_an_environment_problem_not_incorrect(tmp_path):
    if shutil.which("hipcc", path="/usr/bin:/bin"):
        pytest.skip("hipcc is installed in /usr/bin or /bin")
    copy = tmp_path / "magpie"
    shutil.copytree(CORPUS, copy)
    proc, lines = dry_run("analyze", "configs/analyze_cwd.yaml", cwd=copy, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0
    assert "  - vector_add.compile_command 1: hipcc: not found on PATH (install it or add its folder to PATH)" in lines
    proc = run_magpie("analyze", "-k", "configs/analyze_cwd.yaml", "--no-perf", "-o", tmp_path / "out", cwd=copy,
                      env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2  # nothing could be judged here
    report = read_report(tmp_path / "out")
    (res,) = report["results"]
    assert res["compiling_state"] == "FAILED" and res["correctness_state"] == "SKIPPED"
    assert res["environment_problems"] == [
        "environment: hipcc not found on PATH: install it or add its folder to PATH (compile command 1/1)"]
    assert "vector_add" in report["not_judged"]
    assert "incorrect" not in proc.stdout and "not judged" in proc.stdout

    # A testcase program that was never built: not judged either, with what to do.
    proc = run_magpie("analyze", "-k", "configs/analyze_cwd.yaml", "--compile-cmd", "true", "--no-perf",
                      "-o", tmp_path / "out2", cwd=copy)
    assert proc.returncode == 2
    (res,) = read_report(tmp_path / "out2")["results"]
    assert res["correctness_state"] == "SKIPPED"
    assert res["environment_problems"][0].startswith("environment: ./vector_add not found (in ")
    assert "build it first" in res["environment_problems"][0]


def test_compare_verdict_of_a_kernel_whose_compiler_is_missing(tmp_path):
    cfg = tmp_path / "k.yaml"
    cfg.write_text("kernels:\n"
                   "  - {id: base, type: hip, testcase_command: 'true'}\n"
                   "  - {id: cand, type: hip, compile_command: 'magpie-no-such-compiler -O3 k.hip', "
                   "testcase_command: 'true'}\n")
    proc = run_magpie("compare", "-k", cfg, "--no-perf", "-o", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cand = read_report(tmp_path / "out")["results"]["kernel_results"][1]
    assert cand["verdict"] == "not judged"
    assert "magpie-no-such-compiler not found on PATH" in cand["environment_problems"][0]
    assert "cand: correct=not judged" in read_report(tmp_path / "out")["results"]["summary"]


def test_a_testcase_stopped_by_the_machine_is_not_judged_a_failing_one_is_incorrect(tmp_path):
    """A compiled testcase whose CUDA runtime finds no driver (what stencil.cu prints on a machine
    without a GPU) or that runs out of memory judged nothing; one that reports a mismatch is
    incorrect. The messages are the real ones of the CUDA runtime and libstdc++."""
    no_driver = ("echo 'stencil.cu:56: cudaMalloc(&a, bytes): CUDA driver version is insufficient for CUDA "
                 "runtime version' >&2; exit 3")
    bad_alloc = "echo \"terminate called after throwing an instance of 'std::bad_alloc'\" >&2; exit 134"
    mismatch = "echo 'mismatch at (1, 2): got 0.5, want 0.25' >&2; exit 1"
    cfg = tmp_path / "k.yaml"
    cfg.write_text("kernels:\n"
                   f"  - {{id: base, type: cuda, baseline: true, testcase_command: {json.dumps(no_driver)}}}\n"
                   f"  - {{id: oom, type: cuda, testcase_command: {json.dumps(bad_alloc)}}}\n"
                   f"  - {{id: wrong, type: cuda, testcase_command: {json.dumps(mismatch)}}}\n")
    proc = run_magpie("compare", "-k", cfg, "--no-perf", "-o", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the baseline could not be judged here
    base, oom, wrong = read_report(tmp_path / "out")["results"]["kernel_results"]
    assert base["verdict"] == "not judged" and oom["verdict"] == "not judged"
    assert base["environment_problems"][0].startswith(
        "environment: no usable GPU or driver here (CUDA driver version is insufficient)")
    assert "exited with code 3" in base["environment_problems"][0]
    assert oom["environment_problems"][0].startswith("environment: out of memory (std::bad_alloc)")
    assert wrong["verdict"] == "incorrect" and not wrong.get("environment_problems")
    assert "the baseline was not judged" in proc.stdout


import pytest

from engine.config.kernel import load_kernel_config, normalize_commands
from engine.config.yamlfile import ConfigError
from engine.kernels.plan import CliOptions, build_plan


def test_command_forms():
    assert normalize_commands("nvcc a.cu && ./a") == ["nvcc a.cu && ./a"]
    assert normalize_commands(["nvcc", "-O3", "a b.cu"]) == [["nvcc", "-O3", "a b.cu"]]
    assert normalize_commands([["make"], ["./run", "1"]]) == [["make"], ["./run", "1"]]
    assert normalize_commands(None) == []
    with pytest.raises(ValueError, match="list of lists"):
        normalize_commands(["nvcc a.cu", "nvcc b.cu"])
    with pytest.raises(ValueError, match="expected a string"):
        normalize_commands({"cmd": "x"})


def test_kernel_and_kernels_are_merged_and_aliases_resolved(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("kernel: {id: one, type: torch}\nkernels:\n  - {id: two, type: py}\n  - {id: three, type: HIP}\n")
    cfg, _ = load_kernel_config(p)
    assert [(e.id, e.type) for e in cfg.entries()] == [("one", "pytorch"), ("two", "pytorch"), ("three", "hip")]


def test_env_var_expansion_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGPIE_TEST_ARCH", "sm_90")
    sub = tmp_path / "cfg"
    (sub / "src").mkdir(parents=True)
    (sub / "src" / "k.cu").write_text("")
    p = sub / "k.yaml"
    p.write_text("""
kernel:
  id: k
  type: cuda
  source_files: [src/k.cu]
  working_dir: src
  compile_command: nvcc -arch=$MAGPIE_TEST_ARCH k.cu -o k
  testcase_command: "./k ${MAGPIE_TEST_UNSET_VAR}"
""")
    # As in Magpie, a relative working_dir is relative to the current directory ...
    with pytest.raises(ConfigError, match=r"k.yaml:6: k.working_dir src: folder .* does not exist \(a relative "
                                          r"working_dir is relative to the current directory .*\$\{MAGPIE_CONFIG_DIR\}/src"):
        build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(tmp_path)))
    plan = build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(sub)))
    (k,) = plan.kernels
    assert k.working_dir == (sub / "src").resolve() and k.working_dir_from == "working_dir"
    # ... and a relative source file is found in the working_dir, else the current directory ...
    assert k.source_files == [(sub / "src" / "k.cu").resolve()]
    assert not any("is not in the working_dir" in w for w in plan.warnings)
    assert k.compile == ["nvcc -arch=sm_90 k.cu -o k"]
    assert k.testcase == ["./k ${MAGPIE_TEST_UNSET_VAR}"]
    assert any("MAGPIE_TEST_UNSET_VAR is not set" in w and f"{p}:8" in w for w in plan.warnings)
    # ${MAGPIE_CONFIG_DIR} names the YAML's folder, wherever the command runs from; a source found
    # only next to the YAML is taken from there, with a warning.
    p.write_text(p.read_text().replace("working_dir: src", "working_dir: ${MAGPIE_CONFIG_DIR}/src"))
    plan = build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(tmp_path)))
    (k,) = plan.kernels
    assert k.working_dir == (sub / "src").resolve() and k.source_files == [(sub / "src" / "k.cu").resolve()]
    assert any("k.source_files: src/k.cu is not in the working_dir" in w and "${MAGPIE_CONFIG_DIR}/src/k.cu" in w
               for w in plan.warnings)


def test_errors_collect_every_problem_with_lines(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("""kernels:
  - id: a
    type: cuda
    testcase_command: ./a
    source_files: [missing.cu]
  - id: a
    type: cuda
    testcase_command: ./b
correctness:
  rtol: -1
""")
    with pytest.raises(ConfigError) as info:
        build_plan("compare", CliOptions(kernel_config=str(p)))
    text = str(info.value)
    assert f"{p}:10: correctness.rtol: Input should be greater than or equal to 0" in text


def test_plan_level_problems(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("""kernels:
  - id: a
    type: cuda
    testcase_command: ./a
    source_files: [missing.cu]
  - id: a
    type: cuda
    testcase_command: ./b
""")
    with pytest.raises(ConfigError) as info:
        build_plan("compare", CliOptions(kernel_config=str(p)))
    problems = info.value.problems
    assert any("missing.cu does not exist" in x and f"{p}:5: a.source_files" in x for x in problems)
    assert any("id 'a' is used twice" in x for x in problems)


@pytest.mark.parametrize("flag,expected", [("1", 1), ("b", 1), ("0", 0)])
def test_baseline_by_index_or_id(tmp_path, flag, expected):
    p = tmp_path / "k.yaml"
    p.write_text("kernels:\n  - {id: a, type: cuda, testcase_command: x}\n  - {id: b, type: cuda, testcase_command: y}\n")
    plan = build_plan("compare", CliOptions(kernel_config=str(p), baseline=flag))
    assert plan.baseline_index == expected and plan.baseline_source == "--baseline"
    assert [k.baseline for k in plan.kernels] == [expected == 0, expected == 1]


def test_bad_baseline_and_environment(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("kernels:\n  - {id: a, type: cuda, testcase_command: x}\n  - {id: b, type: cuda, testcase_command: y}\n"
                 "scheduler: {environment: ray}\n")
    with pytest.raises(ConfigError) as info:
        build_plan("compare", CliOptions(kernel_config=str(p), baseline="7"))
    text = str(info.value)
    assert "--baseline 7: index out of range (0..1)" in text
    assert "execution environment" not in text  # ray runs the plan now (engine.cluster)
    plan = build_plan("compare", CliOptions(kernel_config=str(p), environment="local"))
    assert {"field": "scheduler.environment", "yaml": "ray", "cli": "local", "flag": "--environment"} in plan.overrides


def test_counter_backends_are_rejected_with_the_alternative(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("kernel: {id: a, type: hip, testcase_command: x}\nperformance:\n  backend: rocprof_compute\n"
                 "correctness:\n  backend: accordo\n")
    with pytest.raises(ConfigError) as info:
        load_kernel_config(p)
    text = str(info.value)
    assert f"{p}:3: performance.backend" in text and "use 'rocprofv3'" in text
    assert "correctness" not in text  # Accordo is run (engine.kernels.accordo)


def test_accordo_needs_its_kernel_and_binaries(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("kernel: {id: a, type: hip, testcase_command: x}\ncorrectness:\n  backend: accordo\n"
                 "  accordo: {reference_binary: ./ref, atol: 1.0e-4, kernel_args: [[a, float*], 'n:int']}\n")
    with pytest.raises(ConfigError, match=r"k.yaml:2: correctness.backend accordo needs correctness.accordo."
                                          r"kernel_name, optimized_binary"):
        build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(tmp_path)))
    p.write_text(p.read_text().replace("reference_binary: ./ref", "reference_binary: ./ref, optimized_binary: ./opt, "
                                       "kernel_name: k"))
    plan = build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(tmp_path), atol=1e-3))
    acc = plan.settings.accordo
    assert acc["atol"] == 1e-3 and acc["rtol"] == 1e-5 and acc["kernel_args"] == [["a", "float*"], ["n", "int"]]
    assert {"field": "correctness.accordo.atol", "yaml": 1e-4, "cli": 1e-3, "flag": "--atol"} in plan.overrides


def test_harness_modules_need_no_testcase_in_compare_but_a_reference_in_analyze(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("class Model: pass\ndef get_inputs(): return []\n")
    p = tmp_path / "k.yaml"
    p.write_text("kernel: {id: a, type: pytorch, source_files: [m.py]}\n")
    with pytest.raises(ConfigError, match="add testcase_command, or reference_file"):
        build_plan("analyze", CliOptions(kernel_config=str(p)))
    p.write_text("kernels:\n  - {id: a, type: pytorch, source_files: [m.py]}\n  - {id: b, type: triton, source_files: [m.py]}\n")
    plan = build_plan("compare", CliOptions(kernel_config=str(p)))
    assert all(k.harness for k in plan.kernels)


def test_only_runs_a_subset_and_keeps_the_baseline():
    from pathlib import Path

    from engine.kernels.plan import CliOptions, build_plan
    cfg = Path(__file__).resolve().parents[2] / "examples" / "kernels" / "softmax_triton" / "compare.yaml"
    plan = build_plan("compare", CliOptions(kernel_config=str(cfg), only=["unmasked"]))
    assert [k.id for k in plan.kernels] == ["three_pass", "unmasked"]
    assert plan.kernels[plan.baseline_index].id == "three_pass"
    assert {"field": "kernels", "yaml": ["three_pass", "one_pass", "unmasked"], "cli": ["three_pass", "unmasked"],
            "flag": "--only"} in plan.overrides
    # a numeric --baseline keeps meaning the config's numbering
    plan = build_plan("compare", CliOptions(kernel_config=str(cfg), only=["unmasked"], baseline="1"))
    assert [k.id for k in plan.kernels] == ["three_pass", "one_pass", "unmasked"]
    assert plan.kernels[plan.baseline_index].id == "one_pass"
    with pytest.raises(ConfigError, match="--only: no kernel with id nope"):
        build_plan("compare", CliOptions(kernel_config=str(cfg), only=["nope"]))


def test_verdict_settings_from_yaml_and_flags(tmp_path):
    (tmp_path / "m.py").write_text("class Model: pass\ndef get_inputs(): return []\n")
    p = tmp_path / "k.yaml"
    p.write_text("kernels:\n  - {id: a, type: pytorch, source_files: [m.py]}\n"
                 "  - {id: b, type: pytorch, source_files: [m.py], inplace: true}\n"
                 "performance: {timer: events, tie_margin: 0.05, rounds: 4}\n")
    plan = build_plan("compare", CliOptions(kernel_config=str(p)))
    s = plan.settings
    assert (s.timer, s.tie_margin, s.rounds) == ("events", 0.05, 4)
    assert [k.inplace for k in plan.kernels] == [False, True]
    # hidden seeds: drawn once per run, not written before they are drawn
    assert s.to_dict()["seeds_used"] is None and s.to_dict()["seeds_hidden"] is True
    assert s.seeds == s.seeds and len(set(s.seeds)) == 3
    plan = build_plan("compare", CliOptions(kernel_config=str(p), tie_margin=0.01, seed=7))
    assert plan.settings.tie_margin == 0.01 and plan.settings.seeds == [7, 8, 9]
    assert {"field": "performance.tie_margin", "yaml": 0.05, "cli": 0.01, "flag": "--tie-margin"} in plan.overrides
    with pytest.raises(ConfigError, match="--tie-margin 1.5"):
        build_plan("compare", CliOptions(kernel_config=str(p), tie_margin=1.5))
    p.write_text("kernel: {id: a, type: pytorch, source_files: [m.py]}\nperformance: {timer: cupti}\n")
    with pytest.raises(ConfigError, match="timer"):
        build_plan("analyze", CliOptions(kernel_config=str(p)))


def test_plan_describe_is_plain_data(tmp_path):
    import json
    from pathlib import Path
    corpus = Path(__file__).resolve().parents[1] / "data" / "magpie_compat" / "kernel"
    plan = build_plan("compare", CliOptions(kernel_config="configs/compare_triton_blocksize.yaml", cwd=str(corpus)))
    d = json.loads(json.dumps(plan.describe()))
    k = d["kernels"][1]
    assert k["working_dir"] == str(corpus / "examples" / "simple_triton_test") and k["working_dir_from"] == "working_dir"
    assert k["harness"]["function"] == "triton_vector_add_block1024" and k["timing"]["backend"] == "harness"
    assert d["baseline"]["id"] == "triton_vector_add_block256" and d["cwd"] == str(corpus)
    assert any(n.startswith("latency.seed 42") for n in d["notes"])
    assert plan.plan_lines()[0].startswith("magpie compare --dry-run")
    assert plan.effective_config()["kernels"][1]["bench_target"]["callable"] == "triton_vector_add_block1024"


def test_latency_switches_and_bench_targets_that_do_not_apply_are_named(tmp_path):
    (tmp_path / "m.py").write_text("def get_inputs(): return []\n")
    p = tmp_path / "k.yaml"
    p.write_text("kernels:\n"
                 "  - {id: h, type: hip, testcase_command: 'true', bench_target: {module: m, callable: f}}\n"
                 "  - {id: t, type: triton, testcase_command: 'true', bench_target: {module: nowhere, callable: f}}\n"
                 "  - {id: u, type: triton, testcase_command: 'true', bench_target: {module: m, callable: f}}\n"
                 "latency: {enabled: false, method: none, pythonpath: missing_dir}\n")
    plan = build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(tmp_path)))
    text = "\n".join(plan.warnings)
    assert "h.bench_target: not used: the Python harness runs pytorch and triton kernels" in text
    assert "t.bench_target: module nowhere not found" in text and "latency.pythonpath" in text
    assert f"u.bench_target: {tmp_path / 'm.py'} defines no f() and get_inputs()" in text
    assert "latency.enabled false: kernels are still timed" in text and "latency.method none" in text
    assert f"latency.pythonpath: {tmp_path / 'missing_dir'} does not exist" in text
    assert not any(k.harness for k in plan.kernels)


def test_unknown_magpie_block_keys_are_errors_with_the_known_fields(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("kernel: {id: a, type: hip, testcase_command: x}\nlatency: {methd: auto}\n"
                 "ray_config: {cluster_adress: auto}\n")
    with pytest.raises(ConfigError) as info:
        load_kernel_config(p)
    text = str(info.value)
    assert f"{p}:2: latency.methd: unknown field. Did you mean 'method'?" in text
    assert f"{p}:3: ray_config.cluster_adress: unknown field. Did you mean 'cluster_address'?" in text


def test_sources_as_magpies_template_writes_them_are_found_in_the_current_directory(tmp_path):
    # Magpie's kernel_config.yaml.example: working_dir ./kernels and source ./kernels/matmul.hip, both
    # relative to where magpie runs.
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "matmul.hip").write_text("")
    (tmp_path / "Magpie").mkdir()
    p = tmp_path / "Magpie" / "kernel_config.yaml"
    p.write_text('kernel:\n  id: m\n  type: hip\n  source_files: ["./kernels/matmul.hip"]\n  working_dir: "./kernels"\n'
                 '  testcase_command: "./run_test.sh"\n  env: {HIP_VISIBLE_DEVICES: "0"}\n')
    plan = build_plan("analyze", CliOptions(kernel_config="Magpie/kernel_config.yaml", cwd=str(tmp_path)))
    (k,) = plan.kernels
    assert k.working_dir == tmp_path / "kernels" and k.source_files == [tmp_path / "kernels" / "matmul.hip"]
    assert not plan.warnings


def test_framework_config_accordo_defaults_under_the_kernel_yaml(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("kernel: {id: a, type: hip, testcase_command: x}\ncorrectness:\n"
                 "  accordo: {kernel_name: k, reference_binary: ./r, optimized_binary: ./o, atol: 1.0e-4}\n")
    framework = {"correctness": {"backend": "accordo", "accordo": {"atol": 1e-6, "timeout_seconds": 30}}}
    plan = build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(tmp_path)), framework)
    assert plan.settings.correctness_backend == "accordo"
    assert plan.settings.accordo["atol"] == 1e-4 and plan.settings.accordo["timeout_seconds"] == 30
    # Magpie's default "testcase" is this tool's auto: the harness still compares outputs where it can.
    plan = build_plan("analyze", CliOptions(kernel_config=str(p), cwd=str(tmp_path)),
                      {"correctness": {"backend": "testcase"}})
    assert plan.settings.correctness_backend == "auto" and plan.settings.accordo is None
    assert any("correctness.accordo: not used" in w for w in plan.warnings)

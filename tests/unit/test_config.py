
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
    plan = build_plan("analyze", CliOptions(kernel_config=str(p)))
    (k,) = plan.kernels
    assert k.working_dir == (sub / "src").resolve()
    assert k.source_files == [(sub / "src" / "k.cu").resolve()]
    assert k.compile == ["nvcc -arch=sm_90 k.cu -o k"]
    assert k.testcase == ["./k ${MAGPIE_TEST_UNSET_VAR}"]
    assert any("MAGPIE_TEST_UNSET_VAR is not set" in w and f"{p}:8" in w for w in plan.warnings)


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
    assert any("missing.cu does not exist" in x and f"{p}:2" in x for x in problems)
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
    assert f"{p}:5: correctness.backend" in text and "use 'harness'" in text


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

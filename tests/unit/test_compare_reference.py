"""A compare's one reference_file (engine.kernels.plan): the module every kernel is judged
against, the baseline included; two different ones are a configuration error naming the
entries, and an entry that names none takes the one named."""

from pathlib import Path

import pytest

from engine.config.yamlfile import ConfigError
from engine.kernels.plan import CliOptions, build_plan, compare_reference

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kernels" / "reference_file"


def _plan(tmp_path, text: str, mode: str = "compare"):
    p = tmp_path / "k.yaml"
    p.write_text(text.replace("@", str(EXAMPLE) + "/"))
    return build_plan(mode, CliOptions(kernel_config=str(p)))


def test_different_reference_files_are_a_configuration_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        _plan(tmp_path, """kernels:
  - {id: base, type: pytorch, source_files: ["@gelu_torch.py"], reference_file: "@gelu_reference.py", baseline: true}
  - {id: cand, type: pytorch, source_files: ["@gelu_erf.py"], reference_file: "@gelu_tanh.py"}
  - {id: other, type: pytorch, source_files: ["@gelu_erf.py"], reference_file: "@gelu_tanh.py"}
""")
    [problem] = [p for p in info.value.problems if "reference_file" in p]
    assert "different reference_file modules" in problem
    assert "gelu_reference.py (base)" in problem and "gelu_tanh.py (cand, other)" in problem


def test_one_reference_judges_every_entry_and_the_plan_says_so(tmp_path):
    plan = _plan(tmp_path, """kernels:
  - {id: base, type: pytorch, source_files: ["@gelu_torch.py"], baseline: true}
  - {id: cand, type: pytorch, source_files: ["@gelu_erf.py"], reference_file: "@gelu_reference.py"}
""")
    ref = (EXAMPLE / "gelu_reference.py").resolve()
    assert compare_reference(plan.kernels) == ref
    assert [k.reference_file for k in plan.kernels] == [ref, ref]  # carried to Ray and container workers
    note = next(n for n in plan.notes if n.startswith("reference_file"))
    assert "named by cand" in note and "the baseline base included" in note and "also base" in note
    checks = [c for k in plan.describe()["kernels"] for c in k["correctness"]["checks"]]
    assert all("gelu_reference.py" in c for c in checks), checks


def test_no_reference_file_keeps_the_baseline_as_the_reference(tmp_path):
    plan = _plan(tmp_path, """kernels:
  - {id: base, type: pytorch, source_files: ["@gelu_torch.py"], baseline: true}
  - {id: cand, type: pytorch, source_files: ["@gelu_erf.py"]}
""")
    assert compare_reference(plan.kernels) is None
    assert not any(n.startswith("reference_file") for n in plan.notes)


def test_every_entry_takes_the_reference_to_ray_and_container_workers(tmp_path):
    """Ray time tasks (baseline + one candidate) and the container's pickled plan see the specs
    only: every spec must carry the reference, its folder among the ones uploaded or mounted."""
    from engine.cluster.raytasks import kernel_roots, remap_spec
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / "gelu_reference.py").write_text((EXAMPLE / "gelu_reference.py").read_text())
    plan = _plan(tmp_path, f"""kernels:
  - {{id: base, type: pytorch, source_files: ["@gelu_torch.py"], baseline: true}}
  - {{id: cand, type: pytorch, source_files: ["@gelu_erf.py"], reference_file: "{refs}/gelu_reference.py"}}
""")
    for k in plan.kernels:
        assert k.reference_file == (refs / "gelu_reference.py").resolve()
        assert any(r == refs.resolve() or r in refs.resolve().parents for r in kernel_roots(k))
        moved = remap_spec(k, [(str(refs.resolve()), "/worker/refs")])
        assert str(moved.reference_file) == "/worker/refs/gelu_reference.py"

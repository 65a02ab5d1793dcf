"""compare with reference_file, through the CLI (examples/kernels/reference_file): the reference
module judges every kernel, the baseline included, and speedups are still measured against the
baseline. A wrong baseline must be reported incorrect against the reference, never used to fail
a correct candidate."""

import json
import shutil

import pytest
import yaml

from conftest import EXAMPLES, local_ray_head, only_workspace, read_report, run_magpie

pytestmark = pytest.mark.slow  # no timed verdict is asserted (any speed verdict passes): not serial

FOLDER = EXAMPLES / "reference_file"
REFERENCE = str((FOLDER / "gelu_reference.py").resolve())


def _run(tmp_path, name: str, exit_code: int = 0):
    proc = run_magpie("compare", "-k", FOLDER / name, "-o", tmp_path, "--seed", "1", "--repeats", "20")
    assert proc.returncode == exit_code, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = read_report(tmp_path)
    by_id = {r["kernel_id"]: r for r in report["results"]["kernel_results"]}
    return proc, report, by_id


def test_wrong_baseline_is_incorrect_against_the_reference_and_the_candidate_correct(tmp_path):
    # an incorrect baseline fails the run (exit 1), as it does without a reference_file
    proc, report, by_id = _run(tmp_path, "wrong_baseline.compare.yaml", exit_code=1)
    base, cand = by_id["tanh_baseline"], by_id["erf_candidate"]
    detail = f"{proc.stdout[-2000:]}\nbase: {base['errors']}\ncand: {cand['errors']}"
    assert report["correctness_reference"] == {"kind": "reference_file", "file": REFERENCE}, detail
    # the baseline is judged by the reference, and fails it
    assert base["correctness_state"] == "FAILED", detail
    assert base["verdict"] == "incorrect", detail
    assert base["correctness_result"]["harness"]["reference"] == REFERENCE, detail
    assert any("differ from the reference gelu_reference.py" in e for e in base["errors"]), detail
    # the correct candidate is correct: not "outputs differ from the baseline"
    assert cand["correctness_state"] == "SUCCESS", detail
    assert cand["correctness_result"]["harness"]["reference"] == REFERENCE, detail
    assert not any("baseline" in e for e in cand["errors"]), detail
    # nothing to rank against: no winner, and the reason names the wrong baseline and the reference
    assert report["winner_id"] is None, detail
    why = report["winner_reason"]
    assert "tanh_baseline is incorrect against the reference gelu_reference.py" in why, why
    assert "erf_candidate" in why, why
    assert "Reference:" in proc.stdout and "incorrect against the reference" in proc.stdout


def test_reference_named_once_judges_every_kernel_and_speed_is_against_the_baseline(tmp_path):
    proc, report, by_id = _run(tmp_path, "correct_baseline.compare.yaml")
    base, good, wrong = by_id["torch_gelu"], by_id["erf_candidate"], by_id["tanh_candidate"]
    detail = f"{proc.stdout[-2000:]}\n{by_id}"
    for r in (base, good, wrong):
        assert r["correctness_result"]["harness"]["reference"] == REFERENCE, detail
    assert base["correctness_state"] == "SUCCESS" and base["verdict"] == "baseline", detail
    assert good["correctness_state"] == "SUCCESS", detail
    assert good["verdict"] in ("faster", "slower", "tie") and good["speedup"] is not None, detail
    assert wrong["correctness_state"] == "FAILED" and wrong["verdict"] == "incorrect", detail
    assert any("differ from the reference gelu_reference.py" in e for e in wrong["errors"]), detail
    assert report["winner_id"] in ("torch_gelu", "erf_candidate"), detail
    config = yaml.safe_load((only_workspace(tmp_path) / "config.yaml").read_text())
    assert any(n.startswith("reference_file") and "named by torch_gelu" in n for n in config["notes"]), config["notes"]


def test_entries_naming_different_reference_files_are_refused(tmp_path, write_yaml):
    path = write_yaml(f"""kernels:
  - {{id: base, type: pytorch, source_files: [{FOLDER}/gelu_torch.py], reference_file: {REFERENCE}, baseline: true}}
  - {{id: cand, type: pytorch, source_files: [{FOLDER}/gelu_erf.py], reference_file: {FOLDER}/gelu_tanh.py}}
""")
    proc = run_magpie("compare", "-k", path, "-o", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "different reference_file modules" in proc.stderr
    assert "gelu_reference.py (base)" in proc.stderr and "gelu_tanh.py (cand)" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_on_ray_the_reference_judges_the_baseline_in_every_time_task(tmp_path):
    """-e ray: each time task runs the baseline beside one candidate; the reference_file travels
    with them (every entry carries it) and judges both there."""
    pytest.importorskip("ray")
    src = tmp_path / "src"
    shutil.copytree(FOLDER, src)
    cfg = yaml.safe_load((src / "wrong_baseline.compare.yaml").read_text())
    del cfg["kernels"][1]["reference_file"]  # named on the baseline only: the candidate's task still gets it
    cfg["scheduler"] = {"ray": {"gpu_resource": "sim_gpu"}}
    (src / "wrong_baseline.compare.yaml").write_text(yaml.safe_dump(cfg))
    # No idle workers started ahead for this process's own job: it submits nothing, and the CLI's
    # tasks run in workers of their own runtime environment (two Python processes, ~1.3 s of CPU).
    no_prestart = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
    with local_ray_head("mgref", resources={"sim_gpu": 1}, _system_config=no_prestart) as address:
        proc = run_magpie("-e", "ray", "--ray-address", address, "compare", "-k", src / "wrong_baseline.compare.yaml",
                          "--seed", "1", "--repeats", "10", "-o", tmp_path / "out", timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((only_workspace(tmp_path / "out") / "compare_report.json").read_text())
    by_id = {r["kernel_id"]: r for r in report["results"]["kernel_results"]}
    reference = str((src / "gelu_reference.py").resolve())
    assert report["correctness_reference"] == {"kind": "reference_file", "file": reference}
    assert by_id["tanh_baseline"]["correctness_state"] == "FAILED", by_id["tanh_baseline"]["errors"]
    assert by_id["erf_candidate"]["correctness_state"] == "SUCCESS", by_id["erf_candidate"]["errors"]
    assert by_id["erf_candidate"]["correctness_result"]["harness"]["reference"] == reference
    assert by_id["erf_candidate"]["execution"]["environment"] == "ray"
    assert report["winner_id"] is None
    assert "tanh_baseline is incorrect against the reference gelu_reference.py" in report["winner_reason"]

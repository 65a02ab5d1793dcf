"""analyze through the CLI: reference comparison, exit codes."""

import pytest

from conftest import EXAMPLES, read_report, run_magpie

pytestmark = pytest.mark.slow


def test_triton_vector_add_against_reference(tmp_path):
    proc = run_magpie("analyze", "-k", EXAMPLES / "vector_add" / "triton" / "analyze.yaml", "-o", tmp_path,
                      "--repeats", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = read_report(tmp_path)
    (res,) = report["results"]
    assert (res["compiling_state"], res["correctness_state"], res["performance_state"]) == \
        ("SKIPPED", "SUCCESS", "SUCCESS")
    assert res["score"] == 1.0
    assert res["correctness_result"]["harness"]["mode"] == "compared with reference"
    assert res["timing"]["n"] == 5
    assert report["all_correct"] is True


def test_unmasked_softmax_wrong_only_off_block_multiples(tmp_path):
    ok = run_magpie("analyze", "-k", EXAMPLES / "softmax_triton" / "analyze_unmasked_multiple_of_block.yaml",
                    "-o", tmp_path / "a", "--no-perf")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (res,) = read_report(tmp_path / "a")["results"]
    assert res["correctness_state"] == "SUCCESS" and res["performance_state"] == "SKIPPED"

    folder = EXAMPLES / "softmax_triton"
    bad = tmp_path / "cols1000.yaml"
    bad.write_text(f"""
kernel:
  id: unmasked_1000
  type: triton
  source_files: [{folder / 'softmax_unmasked.py'}]
  reference_file: {folder / 'reference.py'}
  env: {{SOFTMAX_COLS: "1000"}}
""")
    proc = run_magpie("analyze", "-k", bad, "-o", tmp_path / "b", "--no-perf")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (res,) = read_report(tmp_path / "b")["results"]
    assert res["correctness_state"] == "FAILED" and res["performance_state"] == "SKIPPED"
    assert "outputs differ from the" in res["errors"][0] and "reference.py" in res["errors"][0]

"""Correctness on input sets redrawn from other distributions, through the CLI: the report names
the distributions judged, and a set the reference itself cannot handle is dropped for every
kernel with a note, never held against a candidate. Correctness only (--no-perf): small and fast."""

import textwrap

import pytest

from conftest import read_report, run_magpie

pytestmark = pytest.mark.slow

# A reference that refuses heavy-tailed values (as a problem defined on a bounded domain would):
# the redrawn Pareto set makes it raise, the uniform one does not.
BOUNDED = '''
    import torch

    class Model(torch.nn.Module):
        def forward(self, x):
            if x.abs().max() > 20:
                raise ValueError("values beyond the problem's domain")
            return torch.tanh(x) * 2

    def get_inputs():
        return [torch.randn(64, 50)]

    def get_init_inputs():
        return []
'''


def test_a_set_the_reference_cannot_handle_is_dropped_with_a_note(tmp_path, write_yaml):
    (tmp_path / "bounded.py").write_text(textwrap.dedent(BOUNDED).lstrip())
    yaml_path = write_yaml(textwrap.dedent("""\
        kernels:
          - id: ref
            type: pytorch
            source_files: [bounded.py]
            baseline: true
          - id: copy
            type: pytorch
            source_files: [bounded.py]
        """), "compare.yaml")
    proc = run_magpie("compare", "-k", yaml_path, "-o", tmp_path / "out", "--seed", "1", "--no-perf")
    report = read_report(tmp_path / "out")
    ref, copy = report["results"]["kernel_results"]
    detail = proc.stdout[-3000:] + proc.stderr[-2000:] + f"\n{copy}"
    assert proc.returncode == 0, detail
    assert ref["correctness_state"] == "SUCCESS" and copy["correctness_state"] == "SUCCESS", detail
    dists = copy["correctness_result"]["harness"]["input_distributions"]
    assert [(d["distribution"], d["sets"]) for d in dists["used"]] == [("problem", 3), ("uniform", 1), ("pareto", 0)]
    assert len(dists["dropped"]) == 1 and "pareto" in dists["dropped"][0] and "raised" in dists["dropped"][0], dists
    judged = [(s.get("distribution"), s["passed"]) for s in copy["correctness_result"]["harness"]["seeds"]]
    assert judged == [(None, True)] * 3 + [("uniform", True)], judged
    assert report["degenerate_test"] is None
    assert "dropped: the baseline fails its own check there" in " ".join(proc.stdout.split()), detail  # said once

"""The output comparison and the poisoning, on real torch tensors (CPU)."""

import torch

from engine.kernels.harness import compare_outputs, follows_convention, poisoned_allocations


def test_float32_tolerance_and_report():
    ref = torch.linspace(-1, 1, 1000)
    ok = compare_outputs(ref, ref + 1e-6, None, None)
    assert ok["passed"] and ok["tensors"][0]["max_abs_err"] > 0
    bad = ref.clone()
    bad[123] += 0.01
    res = compare_outputs(ref, bad, None, None)
    assert not res["passed"] and "1/1000 elements" in res["reason"]
    assert res["tensors"][0]["first_mismatch"]["index"] == [123]
    assert compare_outputs(ref, bad, None, 0.02)["passed"]  # atol override


def test_half_types_get_looser_defaults():
    ref = torch.randn(256).to(torch.bfloat16)
    noisy = (ref.float() * 1.005).to(torch.bfloat16)
    assert compare_outputs(ref, noisy, None, None)["passed"]
    assert not compare_outputs(ref.float(), noisy.float() , None, None)["passed"]


def test_nan_where_reference_is_finite_fails_even_with_huge_tolerance():
    ref = torch.ones(10)
    out = ref.clone()
    out[3] = float("nan")
    res = compare_outputs(ref, out, 1e9, 1e9)
    assert not res["passed"] and "NaN/Inf where the reference is finite" in res["reason"]
    ref_nan = ref.clone()
    ref_nan[3] = float("nan")
    assert compare_outputs(ref_nan, out, None, None)["passed"]  # same NaN as the reference


def test_structure_shape_dtype_mismatch():
    a = torch.zeros(4)
    assert "structure" in compare_outputs((a, a), (a,), None, None)["reason"]
    assert "shape" in compare_outputs(a, torch.zeros(5), None, None)["reason"]
    assert "dtype" in compare_outputs(a, a.double(), None, None)["reason"]
    assert compare_outputs(torch.arange(5), torch.arange(5), None, None)["passed"]
    assert not compare_outputs(torch.arange(5), torch.arange(5) + 1, None, None)["passed"]


def test_poisoned_allocations_expose_unwritten_outputs():
    def kernel(x):
        out = torch.empty_like(x)
        out[:-1] = x[:-1] * 2  # forgets the last element
        return out

    x = torch.ones(8)
    with poisoned_allocations(torch.device("cpu")):
        out = kernel(x)
        ints = torch.empty(3, dtype=torch.int32)
    assert torch.isnan(out[-1]) and torch.all(out[:-1] == 2)
    assert torch.all(ints == torch.iinfo(torch.int32).max)
    assert not torch.isnan(torch.empty(2).fill_(0)).any()  # restored afterwards
    assert torch.empty is not None and torch.empty.__name__ == "empty"


def test_convention_is_read_without_importing(tmp_path):
    m = tmp_path / "m.py"
    m.write_text("raise SystemExit('must not be imported')\nclass ModelNew: ...\nfrom x import get_inputs\n")
    assert follows_convention(m)
    assert not follows_convention(m, model_class="Model")
    (tmp_path / "n.py").write_text("def get_inputs(): ...\n")
    assert not follows_convention(tmp_path / "n.py")

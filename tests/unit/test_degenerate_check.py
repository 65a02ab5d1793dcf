"""The degenerate-test check (engine.kernels.worker.Worker.op_degenerate) on reference outputs
set by hand, one per input set: an output that ignores the inputs (zeros, one constant, the
first set's output, the input itself) must pass on EVERY input set for the test to be called
degenerate. A one-element output (a loss) whose value moves with the inputs is a real test."""

from pathlib import Path

import pytest
import torch

from engine.kernels.worker import Worker


def _worker(refs: list, inputs: list | None = None) -> Worker:
    """A worker whose main input sets are already run: ``refs[i]`` is the reference's output on set i."""
    w = Worker(Path("/nonexistent"))
    for i, ref in enumerate(refs):
        w.sets.append(inputs[i] if inputs else [torch.zeros(1)])
        w.main_sets.append(i)
        w.set_meta.append({"shape": "main"})
        w.ref_outputs[i] = ref
    return w


def _verdict(refs: list, inputs: list | None = None) -> str | None:
    return _worker(refs, inputs).op_degenerate({"rtol": None, "atol": None})["degenerate"]


def test_a_scalar_that_moves_with_the_inputs_is_a_real_test():
    # mean squared errors of three input sets, each scaled differently
    assert _verdict([torch.tensor(0.21), torch.tensor(0.034), torch.tensor(0.29)]) is None


def test_a_scalar_that_is_the_same_on_every_set_is_degenerate():
    said = _verdict([torch.tensor(1.0), torch.tensor(1.0 + 1e-7), torch.tensor(1.0 - 1e-7)])
    assert said and "degenerate test" in said and "constant" in said and "all 3 input sets" in said


def test_zeros_must_pass_every_set():
    # zeros pass the first set (below atol) but not the others: kernels returning zeros fail
    assert _verdict([torch.tensor(1e-7), torch.tensor(0.5), torch.tensor(0.7)]) is None
    said = _verdict([torch.full((4,), 1e-7), torch.full((4,), -2e-6), torch.full((4,), 3e-6)])
    assert said and "all-zeros" in said


def test_one_input_set_and_a_scalar_output_is_not_evidence():
    # one set: the constant would be the output itself, so it proves nothing
    assert _verdict([torch.tensor(8.3)]) is None
    # ... but zeros passing it still says the tolerance swallows the output
    assert "all-zeros" in _verdict([torch.tensor(1e-7)])


def test_a_constant_tensor_within_one_set_is_still_degenerate():
    assert "constant" in _verdict([torch.full((16,), 2.5)])
    assert _verdict([torch.arange(16.0)]) is None


def test_a_tensor_output_that_does_not_depend_on_the_inputs_is_degenerate():
    fixed = torch.linspace(-1, 1, 32)
    said = _verdict([fixed.clone(), fixed.clone(), fixed.clone()])
    assert said and "same output on all 3 input sets" in said
    assert _verdict([fixed, fixed.flip(0), fixed * 2]) is None


@pytest.mark.parametrize("same_everywhere", [True, False])
def test_returning_the_input_must_pass_every_set(same_everywhere):
    xs = [torch.randn(8, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    refs = [x.clone() if same_everywhere or i == 0 else x * 2 for i, x in enumerate(xs)]
    said = _verdict(refs, inputs=[[x] for x in xs])
    if same_everywhere:
        assert said and "input unchanged" in said
    else:
        assert said is None

"""KernelBench-convention problems through `compare` on the CPU, each against an identical copy.

A module with ``Model``, ``get_inputs()`` and ``get_init_inputs()`` must reach the model as written:
several inputs in order, constructor args, integer and boolean tensors uncast, plain Python numbers
untouched, and tuple or 0-d outputs compared element by element. An identical copy must then pass
the gate and be called a tie; a copy that is wrong only on the integer-index path must be incorrect.
Tiny shapes: each compare is two harness processes, dominated by importing torch.
"""

import os
import textwrap

import pytest

from conftest import EXAMPLES, read_report, run_magpie

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: timed verdicts need the machine alone

# Several tensor inputs plus a Python float and int in get_inputs(); constructor args of three kinds
# (int, float, tuple), and a parameter created from them.
SEVERAL_INPUTS = '''
    """Several inputs (two tensors, a float, an int) and constructor args (an int, a float, a tuple)."""
    import torch

    ROWS, FEATURES = 6, 5


    class Model(torch.nn.Module):
        def __init__(self, features: int, gain: float, out_shape: tuple):
            super().__init__()
            assert isinstance(features, int) and isinstance(gain, float) and isinstance(out_shape, tuple)
            self.weight = torch.nn.Parameter(torch.rand(features) * gain)
            self.out_shape = out_shape

        def forward(self, x, y, alpha, shift):
            assert type(alpha) is float and type(shift) is int, (type(alpha), type(shift))
            return (x * self.weight + alpha * y.roll(shift, dims=-1)).reshape(self.out_shape)


    def get_inputs():
        return [torch.rand(ROWS, FEATURES), torch.rand(ROWS, FEATURES), 0.5, 2]


    def get_init_inputs():
        return [FEATURES, 1.5, (FEATURES, ROWS)]
'''

# Integer (int64 index) and boolean (mask) tensor inputs; a tuple output that holds a float tensor,
# a 0-d float tensor, an int64 tensor and a bool tensor.
INT_BOOL = '''
    """Integer and boolean tensor inputs; a tuple output (float, 0-d float, int64, bool)."""
    import torch

    ROWS, COLS, PICKS = 4, 9, 3


    class Model(torch.nn.Module):
        def forward(self, x, index, mask):
            assert index.dtype == torch.int64 and mask.dtype == torch.bool, (index.dtype, mask.dtype)
            picked = x.gather(1, index)
            masked_total = x.masked_fill(~mask, 0.0).sum()
            count = mask.sum(dim=1)
            return picked, masked_total, count, ~mask


    def get_inputs():
        return [torch.rand(ROWS, COLS), torch.randint(0, COLS, (ROWS, PICKS)), torch.rand(ROWS, COLS) > 0.5]


    def get_init_inputs():
        return []
'''
CORRECT_INDEX = "picked = x.gather(1, index)"
OFF_BY_ONE = "picked = x.gather(1, (index + 1) % COLS)"


def _module(tmp_path, name: str, source: str) -> str:
    (tmp_path / name).write_text(textwrap.dedent(source).lstrip())
    return name


def _compare_yaml(write_yaml, baseline: str, candidate: str) -> object:
    return write_yaml(textwrap.dedent(f"""\
        kernels:
          - id: ref
            type: pytorch
            source_files: [{baseline}]
            baseline: true
          - id: copy
            type: pytorch
            source_files: [{candidate}]
        """), "compare.yaml")


def _compare(yaml_path, out, **kw):
    proc = run_magpie("compare", "-k", yaml_path, "-o", out, "--seed", "1", **kw)
    report = read_report(out)
    results = report["results"]["kernel_results"]
    assert [k["kernel_id"] for k in results] == ["ref", "copy"]
    return proc, results


def _assert_tie(proc, results):
    ref, copy = results
    detail = proc.stdout + proc.stderr + f"\nref: {ref}\ncopy: {copy}"
    assert proc.returncode == 0, detail
    assert ref["correctness_state"] == "SUCCESS", detail
    assert copy["correctness_state"] == "SUCCESS", detail
    assert ref["verdict"] == "baseline", detail
    assert copy["verdict"] == "tie", detail
    # Both kernels' timed calls ran on one CPU (each kernel has a worker of its own; two cores of
    # one machine are not equally fast), one this process may use.
    pinned = {r["performance_result"]["method"].get("pinned_cpu") for r in results}
    if len(os.sched_getaffinity(0)) > 1:
        assert len(pinned) == 1 and pinned <= os.sched_getaffinity(0), pinned


def test_several_inputs_init_args_and_python_numbers_tie(tmp_path, write_yaml):
    name = _module(tmp_path, "several.py", SEVERAL_INPUTS)
    proc, results = _compare(_compare_yaml(write_yaml, name, name), tmp_path / "out")
    _assert_tie(proc, results)


def test_integer_and_bool_inputs_with_tuple_output_tie(tmp_path, write_yaml):
    name = _module(tmp_path, "int_bool.py", INT_BOOL)
    proc, results = _compare(_compare_yaml(write_yaml, name, name), tmp_path / "out")
    _assert_tie(proc, results)


def test_integer_targets_and_scalar_output_tie(tmp_path):
    """The shipped KernelBench cross-entropy problem (int64 targets, 0-d output), scaled down."""
    yaml_path = EXAMPLES / "kernelbench_l1" / "kb095_cross_entropy.compare.yaml"
    proc, results = _compare(yaml_path, tmp_path / "out", env={"KB_SCALE": "0.001"})
    _assert_tie(proc, results)


def test_off_by_one_on_the_index_path_is_incorrect(tmp_path, write_yaml):
    assert CORRECT_INDEX in INT_BOOL
    base = _module(tmp_path, "int_bool.py", INT_BOOL)
    wrong = _module(tmp_path, "int_bool_off_by_one.py", INT_BOOL.replace(CORRECT_INDEX, OFF_BY_ONE))
    proc, results = _compare(_compare_yaml(write_yaml, base, wrong), tmp_path / "out")
    ref, copy = results
    detail = proc.stdout + proc.stderr + f"\nref: {ref}\ncopy: {copy}"
    assert proc.returncode == 0, detail  # a wrong candidate is a result, not a failed run
    assert ref["correctness_state"] == "SUCCESS", detail
    assert copy["correctness_state"] == "FAILED", detail
    assert copy["verdict"] == "incorrect", detail
    assert copy["speedup"] is None, detail
    assert copy["errors"], detail  # the mismatch is reported

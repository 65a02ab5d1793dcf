"""What each call of a kernel under test gets from the worker: inputs at addresses no earlier
call saw, judged calls drawn from the operating system after the call returned (exactly one a
round), a copy of the judged call taken at once, and the kernels each traced call launched
checked against a discovery call. The worker runs in this process on the CPU."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.kernels import worker
from engine.kernels.session import HarnessSession


def _recording_problem(folder: Path) -> Path:
    """A softmax whose module records every call's input address and keeps every output."""
    p = folder / "recording.py"
    p.write_text(textwrap.dedent("""
        import torch
        ADDRESSES, OUTPUTS = [], []
        class Model(torch.nn.Module):
            def forward(self, x):
                ADDRESSES.append(x.data_ptr())
                y = torch.softmax(x, dim=1)
                OUTPUTS.append(y)
                return y
        def get_inputs():
            return [torch.randn(16, 64)]
        def get_correctness_inputs():
            return [[torch.randn(3, 5)], [torch.randn(1, 64)]]
        def get_init_inputs():
            return []
    """))
    return p


def _loaded(folder: Path, **extra) -> worker.Worker:
    problem = _recording_problem(folder)
    w = worker.Worker(folder)
    w.op_load({"kernel": {"module": str(problem)}, "inputs": {"module": str(problem)}, "seeds": [1, 2, 3],
               "device": "cpu", **extra})
    return w


def _module(w: worker.Worker):
    import sys
    return sys.modules[type(w.model).__module__]


@pytest.mark.parametrize("keep_sets_bytes", [None, 1])  # sets kept, and made again from their seeds
def test_every_call_gets_inputs_at_an_address_no_earlier_call_had(tmp_path, keep_sets_bytes):
    w = _loaded(tmp_path, **({"keep_sets_bytes": keep_sets_bytes} if keep_sets_bytes else {}))
    for i in range(len(w.sets)):
        w.op_run_set({"index": i, "role": "kernel"})
    w.op_warm({"warmup": 3})
    for _ in range(3):
        assert len(w.op_time({"n": 40, "timer": "wall", "keep": 1})["kept"]) == 1
    for null in (False, True, False):
        w.op_audit_prepare({"k": 4})
        w.op_audit_go({"null": null, "keep": True})
    seen = _module(w).ADDRESSES
    assert len(seen) > 120
    assert len(set(seen)) == len(seen)  # the allocator hands freed blocks back: without the shift, few
    assert w.addresses_reused == 0


def test_exactly_one_call_a_round_is_judged_and_it_is_a_copy_taken_when_the_call_returned(tmp_path):
    w = _loaded(tmp_path)
    w.op_warm({"warmup": 1})
    outputs = _module(w).OUTPUTS
    for n in (1, 2, 7, 60):
        before = len(outputs)
        rep = w.op_time({"n": n, "timer": "wall", "keep": 1})
        assert len(rep["kept"]) == 1
        held = w.held[rep["kept"][0]["handle"]]
        returned = outputs[before:]  # the kernel holds every answer it gave (untimed first call too)
        assert len(returned) == n + 1
        ptr = held["out"].data_ptr()
        assert all(ptr != o.data_ptr() for o in returned)  # the kernel cannot reach what is judged
        assert any(torch.equal(held["out"], o) for o in returned[1:])  # and it is one timed call's answer
        # the judged inputs are those of that call
        assert torch.allclose(torch.softmax(held["inputs"][0], dim=1), held["out"])
        w.op_release({"handles": None})
    assert w.op_time({"n": 5, "timer": "wall", "keep": 0})["kept"] == []


def test_which_call_is_judged_is_spread_over_the_round(tmp_path):
    w = _loaded(tmp_path)
    w.op_warm({"warmup": 1})
    outputs = _module(w).OUTPUTS
    positions = []
    for _ in range(60):
        before = len(outputs)
        rep = w.op_time({"n": 4, "timer": "wall", "keep": 1})
        held = w.held[rep["kept"][0]["handle"]]["out"]
        positions.append(next(i for i, o in enumerate(outputs[before + 1:]) if torch.equal(o, held)))
        w.op_release({"handles": None})
    # Each of the 4 positions is drawn with probability 1/4: all of them turn up in 60 rounds
    # (the chance one never does is 4 * 0.75**60, about 1e-7).
    assert set(positions) == {0, 1, 2, 3}


def test_the_draws_come_from_the_operating_system():
    assert isinstance(worker._secure_random, random.SystemRandom)
    with pytest.raises(NotImplementedError):
        worker._secure_random.getstate()  # no state a kernel could copy to predict the next draw


def _member(calls: int, differ: int, empty: int) -> SimpleNamespace:
    example = {"call": 3, "expected": {"gemm": 1}, "launched": {}} if differ else None
    return SimpleNamespace(kernel_sets={"calls": calls, "differ": differ, "empty": empty, "example": example},
                           timing={}, flags=[], timing_rejections=[])


def test_calls_that_launch_nothing_are_rejected_and_other_differences_flagged():
    m = _member(200, 150, 150)
    HarnessSession._check_kernel_sets(None, m)
    assert [r["guard"] for r in m.timing_rejections] == ["kernel_set"] and not m.flags
    assert "150 of 200 traced calls launched no GPU work" in m.timing_rejections[0]["message"]
    m = _member(200, 1, 1)  # one call: a trace record the profiler dropped could explain it
    HarnessSession._check_kernel_sets(None, m)
    assert not m.timing_rejections and [f["guard"] for f in m.flags] == ["kernel_set"]
    m = _member(200, 0, 0)
    HarnessSession._check_kernel_sets(None, m)
    assert not m.timing_rejections and not m.flags
    assert m.timing["kernel_sets"] == {"calls": 200, "differ": 0, "empty": 0}

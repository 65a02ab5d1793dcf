"""The pieces under the verdicts: device-trace attribution, perturbation, tensor hand-over,
tamper detection and the paired interval with its tie margin."""

import time

import numpy as np
import torch

from engine.kernels import tensor_share, worker
from engine.kernels.stats import DEFAULT_TIE_MARGIN, bootstrap_speedup_rounds, verdict


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_device_spans_count_every_stream_and_skip_the_harness_kernels():
    ev = [
        _x("user_annotation", "magpie_prep", 0, 10), _x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=1),
        _x("kernel", "flush", 20, 30, tid=7, correlation=1, stream=7),
        _x("user_annotation", "magpie_call", 60, 40), _x("cuda_runtime", "cudaLaunchKernel", 61, 1, correlation=2),
        _x("kernel", "softmax", 100, 25, tid=9, correlation=2, stream=9),  # a private stream
        _x("user_annotation", "magpie_prep", 110, 5), _x("cuda_runtime", "cudaLaunchKernel", 111, 1, correlation=3),
        _x("kernel", "flush", 130, 30, tid=7, correlation=3, stream=7),
        _x("user_annotation", "magpie_call", 170, 40), _x("cuda_runtime", "cudaLaunchKernel", 171, 1, correlation=4),
        _x("kernel", "a", 180, 10, tid=7, correlation=4, stream=7),
        # launched by another thread during the next prep: still the kernel's work, not the harness's
        _x("cuda_runtime", "cudaLaunchKernel", 112, 1, tid=2, correlation=5),
        _x("kernel", "late", 200, 20, tid=7, correlation=5, stream=7),
    ]
    spans, other, _ = worker._device_spans({"traceEvents": ev}, 2)
    # call 0: softmax (100-125) plus the late kernel launched in its window (200-220)
    assert abs(spans[0] - (220 - 100) / 1e3) < 1e-9
    assert abs(spans[1] - (190 - 180) / 1e3) < 1e-9
    assert other == 1  # only call 0 put work on a stream the harness does not use


def test_each_traced_call_lists_the_kernels_it_launched():
    ev = [
        _x("user_annotation", "magpie_prep", 0, 10), _x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=1),
        _x("kernel", "flush", 20, 30, tid=7, correlation=1, stream=7),
        _x("user_annotation", "magpie_call", 60, 40), _x("cuda_runtime", "cudaLaunchKernel", 61, 1, correlation=2),
        _x("kernel", "gemm", 100, 25, tid=7, correlation=2, stream=7),
        _x("cuda_runtime", "cudaLaunchKernel", 62, 1, correlation=3),
        _x("kernel", "bias", 126, 5, tid=7, correlation=3, stream=7),
        _x("user_annotation", "magpie_call", 170, 40),  # launches nothing
        _x("user_annotation", "magpie_call", 300, 40), _x("cuda_runtime", "cudaLaunchKernel", 301, 1, correlation=4),
        _x("kernel", "gemm", 310, 25, tid=7, correlation=4, stream=7),
    ]
    spans, other, names = worker._device_spans({"traceEvents": ev}, 3)
    assert names == [{"gemm": 1, "bias": 1}, {}, {"gemm": 1}]
    assert spans[1] is None and other == 0
    found = worker.kernel_set_check({"gemm": 1, "bias": 1}, names)
    assert (found["calls"], found["differ"], found["empty"]) == (3, 2, 1)
    assert found["example"] == {"call": 2, "expected": {"gemm": 1, "bias": 1}, "launched": {}}
    assert worker.kernel_set_check(None, names)["differ"] == 0  # no discovery call: nothing to hold them to


def test_perturbation_is_sparse_deterministic_and_keeps_values():
    x = torch.randn(64, 1000)
    a, b = x.clone(), x.clone()
    worker.perturb_([a], 42)
    worker.perturb_([b], 42)
    assert torch.equal(a, b)
    changed = int((a != x).sum())
    assert 0 < changed <= x.numel() // 512
    c = x.clone()
    worker.perturb_([c], 43)
    assert not torch.equal(a, c)
    ints = torch.arange(100)
    worker.perturb_([ints], 1)
    assert torch.equal(ints, torch.arange(100))  # indices are left alone


def test_tensor_hand_over_round_trip():
    files = []
    tree = (torch.randn(3, 4), {"m": torch.tensor([True, False])}, 7, torch.zeros(0))
    back = tensor_share.import_tree(tensor_share.export_tree(tree, files))
    assert torch.equal(back[0], tree[0]) and torch.equal(back[1]["m"], tree[1]["m"]) and back[2] == 7
    assert back[3].numel() == 0
    tensor_share.remove_files(files)
    assert files == []


def test_replacing_a_clock_or_a_torch_function_is_seen():
    table = worker._watch_table([])
    assert worker._tampered(table, []) == []
    real = time.perf_counter
    try:
        time.perf_counter = lambda: 0.0
        assert "time.perf_counter" in worker._tampered(table, [])
    finally:
        time.perf_counter = real
    real_softmax = torch.softmax
    try:
        torch.softmax = lambda *a, **k: None
        assert "torch.softmax" in worker._tampered(table, [])
    finally:
        torch.softmax = real_softmax
    assert worker._tampered(table, []) == []


def test_paired_rounds_and_the_tie_margin():
    rng = np.random.default_rng(0)
    drift = np.linspace(1.0, 1.3, 10)  # the machine slows down over the run
    base = [list(d * (1 + 0.01 * rng.standard_normal(20))) for d in drift]
    same = [list(d * (1 + 0.01 * rng.standard_normal(20))) for d in drift]
    sp, lo, hi = bootstrap_speedup_rounds(base, same)
    assert lo <= sp <= hi and verdict(lo, hi, DEFAULT_TIE_MARGIN) == "tie"
    fast = [list(np.asarray(r) / 1.2) for r in same]
    _, lo, hi = bootstrap_speedup_rounds(base, fast)
    assert verdict(lo, hi, DEFAULT_TIE_MARGIN) == "faster"
    assert verdict(1.01, 1.015, 0.02) == "tie"  # real but inside the margin
    assert verdict(0.90, 0.95, 0.02) == "slower"


def test_input_sets_made_again_from_their_seeds_match_kept_ones(tmp_path):
    """Sets too large to keep are regenerated per call; every call must see the same values a
    worker that kept them would, and the pristine set must not be handed out."""
    problem = tmp_path / "problem.py"
    problem.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x, y):\n"
        "        return x + y\n"
        "def get_inputs():\n"
        "    return [torch.randn(64, 33), torch.rand(64, 33)]\n"
        "def get_init_inputs():\n"
        "    return []\n")
    req = {"kernel": {"module": str(problem)}, "inputs": {"module": str(problem)}, "seeds": [11, 12],
           "device": "cpu"}
    kept, regen = worker.Worker(tmp_path), worker.Worker(tmp_path)
    info_kept = kept.op_load(dict(req))
    info_regen = regen.op_load(dict(req, keep_sets_bytes=1))
    assert info_kept["input_sets_kept"] and not info_regen["input_sets_kept"]
    assert info_regen["input_bytes"] == info_kept["input_bytes"] == 2 * 64 * 33 * 4
    assert all(regen.sets[i] is None for i in regen.main_sets)
    for index in regen.main_sets:
        for perturb in (None, 99):
            a, b = kept._fresh(index, perturb), regen._fresh(index, perturb)
            assert all(torch.equal(x, y) for x, y in zip(a, b))
            a[0].zero_()  # a fresh set is the caller's: the next one is untouched
            assert not torch.equal(regen._fresh(index, perturb)[0], a[0])
    # The generator is reseeded at random afterwards: the kernel cannot read the seed back.
    assert torch.initial_seed() not in (11, 12)
    assert regen._inputs_check(regen.main_sets[0], None, kept._fresh(kept.main_sets[0], None)) is None
    # As the judge it keeps no outputs of those sets and computes them again for each judgement.
    ref_reply = regen.op_run_set({"index": regen.main_sets[1], "role": "reference"})
    assert ref_reply["self_check"]["passed"] and ref_reply["inputs_check"] is None and regen.ref_outputs == {}
    cand = kept.op_run_set({"index": kept.main_sets[1]})
    verdict_ = regen.op_judge({"index": kept.main_sets[1], "outputs": cand["outputs"], "inputs": cand["inputs"]})
    assert verdict_["passed"] and verdict_["inputs_check"] is None
    kept.op_release({})


def test_the_hardware_floor_takes_bytes_or_flops_whichever_is_longer():
    from engine.kernels.session import hardware_floor
    assert hardware_floor(0, None, 4.8, 1979.0) is None and hardware_floor(10**9, 10**12, None, None) is None
    ms, why = hardware_floor(131_000_000, None, 4.8, None)  # 131 MB at 4.8 TB/s
    assert abs(ms - 131e6 / 4.8e12 * 1e3) < 1e-12 and "131.0 MB" in why
    # A 4096^3 matmul: 137 GFLOP; at 1979 TFLOP/s at least 69 us, longer than moving its 201 MB.
    flops, moved = 2 * 4096 ** 3, 3 * 4096 * 4096 * 4
    ms, why = hardware_floor(moved, flops, 4.8, 1979.0)
    assert abs(ms - flops / 1979e12 * 1e3) < 1e-12 and "GFLOP" in why and ms > moved / 4.8e12 * 1e3


def test_the_reference_worker_counts_the_flops_of_a_call(tmp_path):
    problem = tmp_path / "mm.py"
    problem.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, a, b):\n"
        "        return a @ b\n"
        "def get_inputs():\n"
        "    return [torch.randn(64, 32), torch.randn(32, 16)]\n"
        "def get_init_inputs():\n"
        "    return []\n")
    w = worker.Worker(tmp_path)
    w.op_load({"kernel": {"module": str(problem)}, "inputs": {"module": str(problem)}, "seeds": [1, 2], "device": "cpu"})
    first = w.op_run_set({"index": w.main_sets[0], "role": "reference"})
    assert first["flops"] == 2 * 64 * 32 * 16
    assert "flops" not in w.op_run_set({"index": w.main_sets[1], "role": "reference"})  # counted once


def test_the_clock_audit_never_lets_a_claim_it_cannot_check_through():
    """A forged claim far below what the judge saw is forged; the same claim against batches so
    noisy (a busy machine) that the gap is within the noise of the judge's medians is "unsure",
    and an unsure kernel is not measured: it can neither win nor lose."""
    from engine.kernels.session import AUDIT_RATIO_CPU, audit_outcome
    steady_real, steady_null = [0.60, 0.61, 0.59, 0.60, 0.62, 0.60], [0.10, 0.11, 0.10, 0.09, 0.10, 0.10]
    assert audit_outcome(0.001, steady_real, steady_null, AUDIT_RATIO_CPU) == "forged"
    assert audit_outcome(0.5, steady_real, steady_null, AUDIT_RATIO_CPU) == "fine"
    noisy_real, noisy_null = [0.6, 3.0, 0.2, 5.0, 0.6, 2.2], [0.1, 2.5, 0.05, 4.0, 0.1, 1.9]
    assert audit_outcome(0.001, noisy_real, noisy_null, AUDIT_RATIO_CPU) == "unsure"


def test_the_clock_audit_reads_a_busy_machine_by_its_least_delayed_batches():
    """Seen in CI (2 cores, three test workers): an honest kernel's median single call 0.19 ms, the
    judge's batches 0.82 ms a call at their median, because half of them waited for a core. Its
    fastest quarter of batches agrees with the claim: fine. A forged claim is never fine (here the
    median's noise makes it unsure: not measured, it can neither win nor lose)."""
    from engine.kernels.session import AUDIT_RATIO_CPU, audit_outcome
    real = [0.21, 0.22, 0.20, 0.23, 0.24, 0.22, 0.21, 0.25, 1.40, 1.50, 1.35, 1.60, 1.45, 1.38, 1.52, 1.41]
    null = [0.04, 0.05, 0.04, 0.04, 0.05, 0.04, 0.04, 0.05] * 2
    assert audit_outcome(0.19, real, null, AUDIT_RATIO_CPU) == "fine"
    assert audit_outcome(0.0015, real, null, AUDIT_RATIO_CPU) == "unsure"
    steady = [0.22, 0.21, 0.23, 0.22, 0.24, 0.21, 0.22, 0.23] * 2
    assert audit_outcome(0.0015, steady, null, AUDIT_RATIO_CPU) == "forged"
    # with the median alone the honest claim would have been called forged
    import statistics
    assert 0.19 < AUDIT_RATIO_CPU * (statistics.median(real) - statistics.median(null))

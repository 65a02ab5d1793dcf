"""Memory of the harness: what a compare holds per request, measured on the CPU.

A compare of a problem whose inputs and outputs take M bytes must fit in about 3 M for its
workers together (KernelBench's level 1 at its own sizes on an 80 GB GPU). Here both workers run
in this process, so the resident peak of each request (reset through /proc/self/clear_refs) is
what the two hold together; tensors this large are mmapped by glibc and leave the resident set
when freed, so the peak follows the live tensors."""

from __future__ import annotations

import gc
import textwrap
from pathlib import Path

import pytest
import torch

from engine.kernels import harness, worker
from engine.kernels.harness import compare_outputs


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _can_reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status("VmHWM")
        return True
    except (OSError, KeyError):
        return False


needs_proc = pytest.mark.skipif(not _can_reset_peak(), reason="needs /proc/self/clear_refs and VmHWM")


def _peak_above(base: int, fn, *args):
    """fn(*args) and the most resident memory above ``base`` while it ran."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    out = fn(*args)
    return out, _status("VmHWM") - base


def _softmax_problem(folder: Path, rows: int, cols: int) -> Path:
    p = folder / f"softmax_{rows}x{cols}.py"
    p.write_text(textwrap.dedent(f"""
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.softmax(x, dim=1)
        def get_inputs():
            return [torch.rand({rows}, {cols})]
        def get_init_inputs():
            return []
    """))
    return p


def _compare_run(folder: Path, rows: int, cols: int) -> dict[str, int]:
    """The requests of one compare (a kernel against the reference, in the session's order), with
    input sets made again from their seeds as for KernelBench's sizes on a GPU; the peak of
    each kind of request, both workers together, above what the process held before."""
    problem = _softmax_problem(folder, rows, cols)
    req = {"kernel": {"module": str(problem)}, "inputs": {"module": str(problem)}, "seeds": [5, 6],
           "device": "cpu", "keep_sets_bytes": 1}
    ref, cand = worker.Worker(folder), worker.Worker(folder)
    gc.collect()
    base = _status("VmRSS")
    peaks: dict[str, int] = {}

    def op(name: str, fn, arg: dict) -> dict:
        reply, peak = _peak_above(base, fn, arg)
        peaks[name] = max(peaks.get(name, 0), peak)
        return reply

    def judge(kept: list[dict]) -> None:
        for k in kept:
            shared = op("export", cand.op_export, {"handle": k["handle"]})
            res = op("judge", ref.op_judge, {"index": k["index"], "perturb": k["perturb"],
                                             "outputs": shared["outputs"], "inputs": shared["inputs"]})
            assert res["passed"] and res["inputs_check"] is None
            op("release", cand.op_release, {"handles": [k["handle"]]})

    op("load", ref.op_load, dict(req, share_state=True))
    op("load", cand.op_load, dict(req))
    assert len(ref.variants) == 2  # the first set redrawn from two other distributions, made again when used
    for index in range(len(ref.set_meta)):
        own = op("run_set", ref.op_run_set, {"index": index, "role": "reference"})
        assert own["self_check"]["passed"] and own["inputs_check"] is None
        c = op("run_set", cand.op_run_set, {"index": index, "role": "kernel"})
        res = op("judge", ref.op_judge, {"index": index, "outputs": c["outputs"], "inputs": c["inputs"]})
        assert res["passed"] and res["inputs_check"] is None
        op("release", cand.op_release, {"handles": [c["handle"]]})
    assert op("degenerate", ref.op_degenerate, {})["degenerate"] is None
    op("release", ref.op_release, {"references": True})
    op("warm", cand.op_warm, {"warmup": 1})
    judge(op("time", cand.op_time, {"n": 3, "timer": "wall", "keep": 1})["kept"])
    for i in range(4):
        op("audit_prepare", cand.op_audit_prepare, {"k": 4})
        judge(op("audit_go", cand.op_audit_go, {"null": i % 3 == 0, "keep": i % 3 != 0})["kept"])
    op("release", cand.op_release, {"handles": []})
    return peaks


@needs_proc
def test_a_compare_holds_about_three_times_one_calls_memory(tmp_path, monkeypatch):
    # Pieces of 1 MiB: the comparison's temporaries stay small beside these 40 MiB tensors.
    monkeypatch.setattr(harness, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(worker, "CHUNK_BYTES", 1 << 20)
    _compare_run(tmp_path, 8, 64)  # imports and first uses, outside the measurement
    gc.collect()
    gc.freeze()  # each request's collection below then scans only what the compare made
    monkeypatch.setattr(gc, "freeze", lambda: None)  # and the workers' own freezes keep off the test's heap
    rows, cols = 1280, 8192  # 40 MiB of inputs, as much output: M = 80 MiB
    m = 2 * rows * cols * 4
    # An audit batch's inputs plus two outputs within this budget: one call per batch here.
    monkeypatch.setattr(worker, "AUDIT_BATCH_BYTES", m + m // 2)
    peaks = _compare_run(tmp_path, rows, cols)
    in_m = {k: round(v / m, 2) for k, v in peaks.items()}
    # One input set alive at a time while the sets are made.
    assert peaks["load"] <= 0.75 * m, in_m
    # The reference's own check holds its output, a second run's and one set of inputs at a
    # time; a judgement the kernel's output and inputs (shared here through files) and the
    # reference's new call. Nothing exceeds 2.5 M, both workers together.
    assert max(peaks.values()) <= 2.5 * m, in_m


def test_audit_batches_count_the_outputs_too(tmp_path, monkeypatch):
    problem = _softmax_problem(tmp_path, 64, 256)
    w = worker.Worker(tmp_path)
    w.op_load({"kernel": {"module": str(problem)}, "inputs": {"module": str(problem)}, "seeds": [1], "device": "cpu"})
    w.op_warm({"warmup": 1})
    one = 64 * 256 * 4
    monkeypatch.setattr(worker, "AUDIT_BATCH_BYTES", 5 * one)
    assert w.op_audit_prepare({"k": 16})["k"] == 3  # 3 inputs + 2 outputs
    monkeypatch.setattr(worker, "AUDIT_BATCH_BYTES", one)
    assert w.op_audit_prepare({"k": 16})["k"] == 1  # never fewer than one call
    w.op_audit_go({"null": False, "keep": False})
    assert w.audit_done is not None
    w.op_release({"handles": []})
    # what stays: the input sets (the main one and its copies redrawn from other distributions)
    assert w.audit_done is None and w.kept_bytes("cpu") == sum(t.numel() * 4 for s in w.sets for t in s)


def test_a_reference_with_large_outputs_computes_them_again(tmp_path):
    """Inputs small enough to keep, outputs too large (a convolution's): the reference keeps
    its input sets but not its outputs, and judges against a new call."""
    problem = tmp_path / "widen.py"
    problem.write_text(textwrap.dedent("""
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return x.repeat(1, 8) * 2
        def get_inputs():
            return [torch.randn(32, 16)]
        def get_init_inputs():
            return []
    """))
    req = {"kernel": {"module": str(problem)}, "inputs": {"module": str(problem)}, "seeds": [1, 2, 3],
           "device": "cpu"}
    ref, cand = worker.Worker(tmp_path), worker.Worker(tmp_path)
    in_bytes = 32 * 16 * 4
    info = ref.op_load(dict(req, keep_sets_bytes=3 * in_bytes + 1))
    cand.op_load(dict(req))
    assert info["input_sets_kept"]
    for index in ref.main_sets:
        assert ref.op_run_set({"index": index, "role": "reference"})["self_check"]["passed"]
    assert ref.ref_outputs == {} and ref.outputs_dropped == set(ref.main_sets)
    c = cand.op_run_set({"index": ref.main_sets[1]})
    assert ref.op_judge({"index": ref.main_sets[1], "outputs": c["outputs"], "inputs": c["inputs"]})["passed"]
    bad = cand.op_run_set({"index": ref.main_sets[2]})
    assert not ref.op_judge({"index": ref.main_sets[0], "outputs": bad["outputs"], "inputs": bad["inputs"]})["passed"]
    assert ref.op_degenerate({})["degenerate"] is None
    cand.op_release({})


def _cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    r = torch.randn(40, 37, generator=g)
    o = r + 1e-7 * torch.randn(40, 37, generator=g)
    o[17, 3] += 1
    o[30, 20] = float("nan")
    inf_r = r.clone()
    inf_r[5, 5] = float("inf")
    inf_o = inf_r.clone()
    inf_o[9, 9] = -float("inf")
    c = torch.randn(23, 17, dtype=torch.complex64, generator=g)
    c_o = c.clone()
    c_o[3, 4] += 0.5j
    nhwc = torch.randn(2, 3, 10, 12, generator=g).permute(0, 2, 3, 1)
    return [(r, o), (r.t(), o.t()), (inf_r, inf_o), (c, c_o), (c[:, ::2], c_o[:, ::2]),
            (r.half(), (r * 1.003).half()), (torch.arange(1000), torch.arange(1000).flip(0)),
            (torch.tensor(3.0), torch.tensor(3.1)), (r, torch.zeros(()).expand(40, 37)),
            (nhwc, nhwc + 1e-3 * torch.randn(2, 3, 10, 12, generator=g).permute(0, 2, 3, 1)),
            (torch.zeros(0, 5), torch.zeros(0, 5))]


def test_comparing_in_pieces_reports_what_one_piece_does(monkeypatch):
    """Verdicts, counts, maxima and the first mismatch do not depend on the piece size; the
    relative L2 error only up to rounding."""
    whole = [compare_outputs(r, o, rtol, atol) for r, o in _cases() for rtol, atol in ((None, None), (1e-3, 1e-3))]
    for piece in (8, 96, 1000):
        monkeypatch.setattr(harness, "CHUNK_BYTES", piece)
        parts = [compare_outputs(r, o, rtol, atol) for r, o in _cases() for rtol, atol in ((None, None), (1e-3, 1e-3))]
        for a, b in zip(whole, parts):
            ta, tb = a.pop("tensors", []), b.pop("tensors", [])
            assert a == b
            for x, y in zip(ta, tb):
                assert x.pop("rel_l2_err") == pytest.approx(y.pop("rel_l2_err"), rel=1e-12, abs=1e-300)
                assert x == y
    res = compare_outputs(*_cases()[0], None, None)
    assert not res["passed"] and res["tensors"][0]["first_mismatch"]["index"] == [17, 3]


@needs_proc
def test_comparing_large_tensors_makes_no_copy_of_their_size(monkeypatch):
    monkeypatch.setattr(harness, "CHUNK_BYTES", 256 << 10)
    g = torch.Generator().manual_seed(1)
    ref = torch.rand(2048, 4096, generator=g)  # 32 MiB
    out = ref.t().contiguous().t()  # the same values, laid out column-major
    out[7, 9] += 1
    size = ref.numel() * 4
    compare_outputs(ref[:8], out[:8], None, None)
    gc.collect()
    res, peak = _peak_above(_status("VmRSS"), compare_outputs, ref, out, None, None)
    assert res["tensors"][0]["mismatches"] == 1 and res["tensors"][0]["first_mismatch"]["index"] == [7, 9]
    assert peak < size // 4, f"{peak / 2**20:.1f} MiB for 32 MiB tensors"
    monkeypatch.setattr(worker, "CHUNK_BYTES", 256 << 10)
    a = torch.complex(ref, ref)
    b = a.t().contiguous().t()
    b[3, 4] += 1j
    gc.collect()
    res, peak = _peak_above(_status("VmRSS"), worker._same_bits, a, b)
    assert res is False and peak < size // 4


def test_the_ledger_adds_a_request_to_what_the_others_hold():
    from engine.kernels.session import MemoryLedger
    led = MemoryLedger()
    gib = 1 << 30
    # The loads run at once: each counts the other's load peak.
    assert led.note("ref", "load", {"device_bytes": 6 * gib, "device_held_bytes": 0})["device"] == 6 * gib
    assert led.note("copy", "load", {"device_bytes": 6 * gib, "device_held_bytes": 0})["device"] == 12 * gib
    led.note("copy", "run_set", {"device_bytes": 12 * gib, "device_held_bytes": 12 * gib})
    assert led.note("ref", "judge", {"device_bytes": 12 * gib, "device_held_bytes": gib // 4})["device"] == 24 * gib
    led.note("copy", "release", {"device_bytes": 12 * gib, "device_held_bytes": 0})
    assert led.note("ref", "time", {"device_bytes": 24 * gib, "device_held_bytes": 0})["device"] == 24 * gib
    # Host numbers are counted above each process's own base.
    led.note("copy", "warm", {"host_rss_bytes": 900, "host_held_bytes": 600, "host_base_bytes": 500})
    assert led.note("ref", "time", {"host_rss_bytes": 800, "host_held_bytes": 500,
                                    "host_base_bytes": 500})["host"] == 300 + 100
    led.forget("copy")
    assert led.note("ref", "time", {"device_bytes": gib, "device_held_bytes": 0})["device"] == gib


def test_the_summary_names_each_kernels_peak_gpu_memory():
    from types import SimpleNamespace

    from engine.kernels.report import peak_memory_line
    gib = 1 << 30

    def outcome(kid, peak):
        return SimpleNamespace(spec=SimpleNamespace(id=kid), peak_memory=peak)

    line = peak_memory_line([
        outcome("ref", {"device_bytes": 24 * gib, "device_bytes_together": 25 * gib, "input_bytes": 6 * gib,
                        "output_bytes": 6 * gib}),
        outcome("copy", {"device_bytes": 18 * gib + gib // 2, "device_bytes_together": 19 * gib})])
    assert line == ("Peak GPU memory: ref 24.00 GiB, copy 18.50 GiB; all at once 25.00 GiB "
                    "(one call: inputs 6.00 GiB, outputs 6.00 GiB)")
    assert peak_memory_line([outcome("k", {"host_rss_bytes": gib}), outcome("t", None)]) is None

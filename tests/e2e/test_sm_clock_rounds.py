"""The SM clock during a real compare's timing rounds (engine.kernels.sm_clock), on this CPU
machine: a fake reader object stands in for NVML (the session's one reader factory is replaced;
nothing below it is mocked) and throttles mid-run, or never; with no reader, a CPU compare reads
nothing, flags nothing and says why once."""

import textwrap

import pytest

from engine.jobs.modes import run_compare
from engine.jobs.requests import KernelRequest
from engine.kernels import sm_clock
from engine.kernels.report import render_text
from engine.kernels.sm_clock import ClockReading

# Not with the timed verdicts alone: the clock readers are fakes and nothing here asserts a verdict
# a busy machine could change (rounds and flags follow the reader's counts).
pytestmark = pytest.mark.slow

KERNEL = """\
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(128, 128)]


def get_init_inputs():
    return []
"""


class ThrottlingReader:
    """Reads 1980 MHz until ``drop_after`` reads, then 1650 MHz under a thermal slowdown; read
    inline only (the start and end of each round request), so the reads are counted exactly."""
    source, gpu, sample_every_s, inline = "fake NVML", "GPU-fake", None, True

    def __init__(self, drop_after=None):
        self.drop_after, self.n = drop_after, 0

    def read(self):
        self.n += 1
        if self.drop_after is not None and self.n > self.drop_after:
            return ClockReading(1650.0, 1980.0, ("sw_thermal_slowdown",))
        return ClockReading(1980.0, 1980.0, ())


def _compare(tmp_path, reader=None, monkeypatch=None):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(KERNEL)
    (tmp_path / "compare.yaml").write_text(textwrap.dedent("""\
        kernels:
          - id: a
            type: pytorch
            source_files: [a.py]
            baseline: true
          - id: b
            type: pytorch
            source_files: [b.py]
        """))
    if reader is not None:
        monkeypatch.setattr(sm_clock, "READER_FACTORY", lambda device, versions, env: (reader, ""))
    req = KernelRequest(mode="compare", kernel_config=str(tmp_path / "compare.yaml"), seed=1, repeats=40,
                        cwd=str(tmp_path))
    out = run_compare(req, tmp_path / "out", detect_gpu=lambda: None)
    results = {k["kernel_id"]: k for k in out.report["results"]["kernel_results"]}
    return out, results, render_text(out.display)


def _clock(result):
    return result["performance_result"]["method"]["sm_clock"]


def _clock_flags(result):
    return [f for f in result["guards"]["flags"] if f["guard"].startswith("sm_clock")]


def test_a_throttle_mid_run_is_flagged_and_shortens_the_rounds(tmp_path, monkeypatch):
    monkeypatch.setattr(sm_clock, "COOLDOWN_MAX_S", 0.05)
    monkeypatch.setattr(sm_clock, "COOLDOWN_BUDGET_S", 0.5)
    # 3 reads to price a read, 4 in round -1 (two kernels, start and end), 4 in each of rounds
    # 0 and 1: the GPU throttles from round 2 (0-based) on.
    reader = ThrottlingReader(drop_after=3 + 4 + 8)
    out, res, text = _compare(tmp_path, reader, monkeypatch)
    a, b = res["a"], res["b"]
    assert a["correctness_state"] == b["correctness_state"] == "SUCCESS", text
    for r in (a, b):
        clock = _clock(r)
        assert clock["read"] and clock["source"] == "fake NVML" and clock["min_mhz"] == 1650.0
        assert clock["reasons"]["sw_thermal_slowdown"] > 0
        short = clock["short_rounds"]
        assert short["from_round"] == 4 and short["split"] == 2 and "sw_thermal_slowdown" in short["why"]
        assert 0 < short["cooldown_s"] <= 0.5 + 1e-9  # bounded
        method = r["performance_result"]["method"]
        # The 7 rounds left became 14 of half the calls (per_round 4 -> 2): 3 + 14 rounds in all.
        assert method["rounds"] == 17 and method["repeats"] == 3 * 4 + 14 * 2
    assert any("throttled during b's rounds" in f["message"] for f in _clock_flags(b))
    assert any(f["guard"] == "sm_clock_short_rounds" for f in _clock_flags(a))
    assert "GPU throttled" in out.report["results"]["summary"]  # the verdict line says so
    assert "throttled during b's rounds" in text and "from round 4 on" in text
    assert out.report["sm_clock_note"] is None


def test_a_steady_clock_flags_nothing(tmp_path, monkeypatch):
    reader = ThrottlingReader(drop_after=None)
    out, res, text = _compare(tmp_path, reader, monkeypatch)
    for r in res.values():
        clock = _clock(r)
        assert clock["read"] and clock["median_mhz"] == 1980.0 and "short_rounds" not in clock
        assert _clock_flags(r) == [] and r["performance_result"]["method"]["rounds"] == 10
    assert "SM clock" not in text and "throttled" not in text


def test_a_cpu_compare_reads_no_clock(tmp_path):
    out, res, text = _compare(tmp_path)
    for r in res.values():
        assert _clock(r) == {"read": False, "why": "the kernels ran on the CPU"} and _clock_flags(r) == []
    assert out.report["sm_clock_note"] == "SM clock not read: the kernels ran on the CPU"
    assert "SM clock" not in text  # nothing to say on a terminal for a CPU run

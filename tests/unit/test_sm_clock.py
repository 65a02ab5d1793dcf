"""The SM clock reader of the timing rounds (engine.kernels.sm_clock): the tools' recorded output
(tests/data/sm_clock/README.md says what was captured and what was written from the documented
formats), which GPU is read, and the watch's drop detection, short rounds and flags, driven by
fake reader objects."""

import json
import time
from pathlib import Path

import pytest

from engine.kernels import sm_clock
from engine.kernels.sm_clock import (ClockReading, ClockWatch, NvmlReader, device_ids, open_reader, parse_amd_clocks,
                                     parse_nvidia_clocks, parse_rocm_smi_clocks, verdict_note)

DATA = Path(__file__).resolve().parents[1] / "data" / "sm_clock"
UUID = "GPU-5a1b3c0e-8f2d-4e6a-9b7c-1d2e3f405162"


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_nvidia_smi_rows():
    [r] = parse_nvidia_clocks(_text("nvidia_smi_clocks_h100.csv"))
    assert (r.mhz, r.max_mhz, r.reasons, r.temperature_c) == (1980.0, 1980.0, (), 41.0)
    [t] = parse_nvidia_clocks(_text("nvidia_smi_clocks_h100_throttled.csv"))
    assert t.mhz == 1650.0 and t.reasons == ("sw_power_cap", "sw_thermal_slowdown")
    [i] = parse_nvidia_clocks(_text("nvidia_smi_clocks_h100_idle.csv"))
    assert i.reasons == ("gpu_idle",)
    [n] = parse_nvidia_clocks(_text("nvidia_smi_clocks_no_reasons.csv"))
    assert n.mhz == 1980.0 and n.reasons == ()


def test_amd_smi_and_rocm_smi_rows():
    [old] = parse_amd_clocks(_text("amd_smi_metric_mi300x.json"))  # bare list (ROCm 6.0-6.3)
    assert (old.mhz, old.max_mhz, old.reasons, old.temperature_c) == (1841.0, 2100.0, ("throttled",), 93.0)
    [new] = parse_amd_clocks(_text("amd_smi_metric_mi355x.json"))  # {"gpu_data": [...]}
    assert (new.mhz, new.max_mhz, new.reasons) == (2400.0, 2400.0, ())
    assert [r.mhz for r in parse_rocm_smi_clocks(_text("rocm_smi_showclocks.json"))] == [2089.0]


def test_which_gpu_is_read():
    dev = {"type": "cuda", "index": 1, "uuid": UUID[4:], "pci_bus_id": "0000:18:00.0"}
    # torch's UUID lacks nvidia-smi's "GPU-"; bus ids are written as each tool writes them.
    assert device_ids(dev, {"CUDA_VISIBLE_DEVICES": "2,3"}, "nvidia") == [UUID, "00000000:18:00.0", "3"]
    assert device_ids({"index": 0}, {"CUDA_VISIBLE_DEVICES": f"{UUID},1"}, "nvidia") == [UUID]
    assert device_ids({"index": 0, "pci_bus_id": "0000:c1:00.0"}, {}, "amd") == ["0000:c1:00.0", "0"]
    # HIP_VISIBLE_DEVICES numbers what ROCR_VISIBLE_DEVICES left.
    assert device_ids({"index": 1}, {"ROCR_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "0,2"}, "amd") == ["6"]
    assert device_ids({"index": 3}, {"CUDA_VISIBLE_DEVICES": "0"}, "nvidia") == []


def test_no_gpu_no_reader():
    assert open_reader({"type": "cpu"}, {}, {}) == (None, "the kernels ran on the CPU")
    reader, why = open_reader({"type": "cuda", "index": 0}, {}, {}, runner=lambda argv: (127, ""), nvml=False)
    assert reader is None and "nvidia-smi" in why


def test_nvidia_smi_reader_falls_back_to_the_old_field_name():
    calls = []

    def runner(argv):
        calls.append(argv)
        if any("clocks_event_reasons" in a for a in argv):  # a pre-R535 driver
            return 2, _text("nvidia_smi_unknown_field.txt")
        return 0, _text("nvidia_smi_clocks_h100_throttled.csv")

    reader, why = open_reader({"type": "cuda", "index": 0, "uuid": UUID}, {}, {}, runner=runner, nvml=False)
    assert reader is not None and reader.source == "nvidia-smi" and reader.gpu == UUID
    assert "clocks_throttle_reasons.active" in reader.argv[1] and reader.argv[-2:] == ["-i", UUID]
    assert reader.read().reasons == ("sw_power_cap", "sw_thermal_slowdown")


def test_amd_reader_is_given_the_bus_id():
    seen = []

    def runner(argv):
        seen.append(argv)
        return 0, _text("amd_smi_metric_mi355x.json")

    reader, _ = open_reader({"type": "cuda", "index": 0, "pci_bus_id": "0000:c1:00.0"}, {"hip": "6.4"}, {},
                            runner=runner)
    assert reader.source == "amd-smi" and seen[0][-2:] == ["-g", "0000:c1:00.0"]
    assert reader.read().mhz == 2400.0


class FakeNvml:
    """pynvml's calls the reader makes, answering with recorded values (tests/data/sm_clock/nvml_h100.json)."""
    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        rec = json.loads(_text("nvml_h100.json"))
        self.max, self.readings, self.i = rec["max_clock_sm"], rec["readings"], 0

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return self.max

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self.readings[self.i][0]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        mask = self.readings[self.i][1]
        self.i += 1
        return mask


def test_nvml_reader_on_recorded_values():
    r = NvmlReader(FakeNvml(), "handle", UUID)
    got = [r.read() for _ in range(6)]
    assert [x.mhz for x in got] == [1980, 1980, 1965, 1755, 1650, 345]
    assert got[3].reasons == ("sw_power_cap",) and got[4].reasons == ("sw_power_cap", "sw_thermal_slowdown")
    assert got[5].reasons == ("gpu_idle",) and got[0].max_mhz == 1980


class SetReader:
    """A fake reader whose next readings the test sets; read inline only (no thread)."""
    source, gpu, sample_every_s, inline = "fake", "0", None, True

    def __init__(self, mhz=1980.0, reasons=()):
        self.now = ClockReading(mhz, 1980.0, tuple(reasons))

    def read(self):
        return self.now


def _watch(reader) -> ClockWatch:
    w = ClockWatch(reader, read_cost_s=1e-5)
    w.baseline = "A"
    return w


def _rounds(w: ClockWatch, reader: SetReader, clocks: dict, rounds=range(0, 4)):
    for r in rounds:
        for key in ("A", "B"):
            reader.now = ClockReading(clocks[key], 1980.0, ())
            with w.during(key, r):
                pass


def test_a_clock_drop_between_kernels_is_flagged_with_its_size():
    reader = SetReader()
    w = _watch(reader)
    _rounds(w, reader, {"A": 1980.0, "B": 1755.0})
    [flag] = w.flags("B")
    assert flag["guard"] == "sm_clock" and flag["clock_change"] == pytest.approx(-0.1136, abs=1e-3)
    assert "dropped between A's and B's rounds" in flag["message"] and "-11.4%" in flag["message"]
    assert verdict_note([flag]) == " (SM clock -11.4% vs baseline)"
    assert w.flags("A") == []
    s = w.summary("B")
    assert s["median_mhz"] == 1755.0 and s["min_mhz"] == 1755.0 and s["readings"] == 8 and s["read"]


def test_no_drop_no_flag():
    reader = SetReader()
    w = _watch(reader)
    _rounds(w, reader, {"A": 1980.0, "B": 1965.0})  # one boost step apart: within CLOCK_DROP
    plans = {"A": {"rounds": 10, "per_round": 20}, "B": {"rounds": 10, "per_round": 20}}
    assert w.after_round(3, plans) == 10 and w.short_from is None
    assert w.flags("A") == w.flags("B") == []
    assert "short_rounds" not in w.summary("A")


def test_idle_readings_do_not_count():
    reader = SetReader()
    w = _watch(reader)
    reader.now = ClockReading(345.0, 1980.0, ("gpu_idle",))
    with w.during("B", 0):
        reader.now = ClockReading(1980.0, 1980.0, ())
    _rounds(w, reader, {"A": 1980.0, "B": 1980.0}, rounds=[1])
    assert w.summary("B")["median_mhz"] == 1980.0 and w.flags("B") == []


def test_a_throttle_reason_splits_the_remaining_rounds_with_cool_downs(monkeypatch):
    monkeypatch.setattr(sm_clock, "COOLDOWN_MAX_S", 0.01)
    monkeypatch.setattr(sm_clock, "COOLDOWN_BUDGET_S", 0.05)
    reader = SetReader()
    w = _watch(reader)
    plans = {"A": {"rounds": 10, "per_round": 20}, "B": {"rounds": 10, "per_round": 20}}
    _rounds(w, reader, {"A": 1980.0, "B": 1980.0}, rounds=[0, 1])
    assert w.after_round(1, plans) == 10
    reader.now = ClockReading(1650.0, 1980.0, ("sw_thermal_slowdown",))
    with w.during("A", 2):
        pass
    assert w.after_round(2, plans) == 3 + 7 * 2  # the 7 rounds left become 14 of half the calls
    assert plans["A"] == {"rounds": 17, "per_round": 10} and w.short_from == 3
    w.round_wall["A"] = 1.0  # a pause lasts as long as the kernel's last round, up to COOLDOWN_MAX_S
    t0 = time.monotonic()
    for r in range(3, 17):
        w.cool_down("A", r)
    assert w.paused_s == pytest.approx(0.05, abs=1e-6)  # bounded by the budget
    assert time.monotonic() - t0 >= 0.05
    assert w.after_round(5, plans) == 17  # split once
    short = [f for f in w.flags("A") if f["guard"] == "sm_clock_short_rounds"]
    assert short and "from round 4 on" in short[0]["message"] and "sw_thermal_slowdown" in short[0]["message"]
    assert any("throttled during A's rounds" in f["message"] for f in w.flags("A"))
    assert w.summary("B")["short_rounds"]["split"] == 2


def test_the_clock_falling_over_the_rounds_is_a_drop():
    reader = SetReader()
    w = _watch(reader)
    plans = {"A": {"rounds": 6, "per_round": 4}, "B": {"rounds": 6, "per_round": 4}}
    _rounds(w, reader, {"A": 1980.0, "B": 1980.0}, rounds=[0])
    _rounds(w, reader, {"A": 1900.0, "B": 1900.0}, rounds=[1])
    assert w.after_round(1, plans) == 2 + 4 * 2
    assert "fell from 1980 MHz in round 1 to 1900 MHz in round 2" in w.short_why


def test_a_slow_reader_is_sampled_from_a_thread():
    class Slow:
        source, gpu = "slow-tool", "0"

        def read(self):
            time.sleep(0.002)
            return ClockReading(1980.0)

    w = ClockWatch(Slow(), read_cost_s=0.002 * 4)  # above INLINE_COST_S: the thread only
    assert not w.inline
    w.start()
    try:
        with w.during("A", 0):
            time.sleep(0.2)
    finally:
        w.close()
    assert w.summary("A")["readings"] >= 2


def test_an_unread_watch_says_why_once():
    w = ClockWatch(None, "the kernels ran on the CPU")
    with w.during("A", 0):
        pass
    assert w.after_round(0, {"A": {"rounds": 3, "per_round": 5}}) == 3
    assert w.summary("A") == {"read": False, "why": "the kernels ran on the CPU"} and w.flags("A") == []
    timings = [{"sm_clock": w.summary("A")}, {"sm_clock": w.summary("B")}]
    assert sm_clock.not_read_line(timings) == "SM clock not read: the kernels ran on the CPU"


def test_a_power_cap_at_the_rated_clock_is_no_drop():
    reader = SetReader(1980.0, ("sw_power_cap",))  # a heavy matmul at the cap, clock still at its maximum
    w = _watch(reader)
    for r in range(3):
        with w.during("A", r):
            pass
        assert w.after_round(r, {"A": {"rounds": 5, "per_round": 8}}) == 5
    assert w.flags("A") == [] and w.summary("A")["reasons"] == {"sw_power_cap": 6}


def test_kernels_on_different_gpus_are_not_read():
    from types import SimpleNamespace as NS

    def member(key, uuid, baseline=False):
        return NS(key=key, role="kernel", spec=NS(baseline=baseline, env={}),
                  load={"device": {"type": "cuda", "index": 0, "uuid": uuid}, "versions": {}})

    w = ClockWatch.for_members([member("a", "u1", True), member("b", "u2")], lambda spec: spec.env)
    assert w.reader is None and "different GPUs" in w.summary("a")["why"] and w.baseline == "a"
    cpu = ClockWatch.for_members([NS(key="x", role="reference", spec=NS(env={}), load={"device": {"type": "cpu"}})],
                                 lambda spec: spec.env)
    assert cpu.summary("x") == {"read": False, "why": "the kernels ran on the CPU"} and cpu.baseline == "x"


def test_a_hung_tool_is_tried_once():
    calls = []

    def runner(argv):
        calls.append(argv)
        return 124, ""  # run_tool's answer for a tool killed at its timeout

    reader, why = open_reader({"type": "cuda", "index": 0, "uuid": UUID, "pci_bus_id": "0000:18:00.0"}, {}, {},
                              runner=runner, nvml=False)
    assert reader is None and len(calls) == 1 and "hung" in why  # not once per field name and id

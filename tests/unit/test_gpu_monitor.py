import json

from engine.bench.gpu_monitor import GpuMonitor, parse_amd_sample, parse_nvidia_sample


def test_nvidia_samples_and_summary():
    rows = parse_nvidia_sample("GPU-a, 45, 1980, 512.3\nGPU-b, [N/A], 1755, 300\n")
    assert rows[0] == {"gpu": "GPU-a", "temperature_c": 45.0, "gpu_clock_mhz": 1980.0, "power_watts": 512.3}
    assert rows[1]["temperature_c"] is None
    readings = iter(["GPU-a, 40, 1500, 200\nGPU-b, 50, 1000, 100\n", "GPU-a, 60, 1980, 600\nGPU-b, 1, 1, 1\n"])
    mon = GpuMonitor(["GPU-a"], interval_s=0.01, runner=lambda argv: (0, next(readings)))
    mon.sample_once()
    mon.sample_once()
    mon.stop()
    s = mon.summary()
    assert s["sample_count"] == 2 and s["available"] is True
    assert s["temperature_c"] == {"min": 40.0, "max": 60.0, "avg": 50.0}
    assert s["power_watts"]["max"] == 600.0


def test_amd_sample_and_no_tool():
    text = json.dumps([{"gpu": 0, "temperature": {"edge": {"value": 38, "unit": "C"}, "hotspot": {"value": 44, "unit": "C"}},
                        "clock": {"gfx_0": {"clk": {"value": 2100, "unit": "MHz"}}},
                        "power": {"socket_power": {"value": 640, "unit": "W"}}}])
    assert parse_amd_sample(text) == [{"gpu": "0", "temperature_c": 44.0, "gpu_clock_mhz": 2100.0, "power_watts": 640.0}]
    mon = GpuMonitor(runner=lambda argv: (127, "")).start()
    mon.stop()
    assert mon.summary()["sample_count"] == 0

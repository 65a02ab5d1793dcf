"""GPU monitor: temperature, SM/GFX clock and power of the server's GPUs, sampled in a thread while
the benchmark runs (Magpie's ``gpu_monitor`` report section: each of them as min / max / avg)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional, Sequence

from engine.bench.gpu_select import _rows
from engine.hw.detect import find_tool, run_tool

Runner = Callable[[Sequence[str]], "tuple[int, str]"]
FIELDS = ("temperature_c", "gpu_clock_mhz", "power_watts")


def parse_nvidia_sample(text: str) -> list[dict]:
    """``nvidia-smi --query-gpu=uuid,temperature.gpu,clocks.sm,power.draw --format=csv,noheader,nounits``"""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        vals = []
        for p in parts[1:4]:
            try:
                vals.append(float(p))
            except ValueError:  # "[N/A]" on GPUs that do not report it
                vals.append(None)
        out.append({"gpu": parts[0], **dict(zip(FIELDS, vals))})
    return out


def _value(entry: object) -> Optional[float]:
    if isinstance(entry, dict):
        entry = entry.get("value")
    try:
        return float(entry)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def parse_amd_sample(text: str) -> list[dict]:
    """``amd-smi metric --temperature --clock --power --json``: hotspot (or edge) temperature, the
    GFX clock, socket power."""
    out = []
    for r in _rows(text):
        temp = r.get("temperature") or {}
        clock = (r.get("clock") or {}).get("gfx_0") or (r.get("clock") or {}).get("gfx") or {}
        power = r.get("power") or {}
        out.append({"gpu": str(r.get("gpu")),
                    "temperature_c": _value(temp.get("hotspot", temp.get("edge"))),
                    "gpu_clock_mhz": _value(clock.get("clk", clock)),
                    "power_watts": _value(power.get("socket_power", power.get("average_socket_power")))})
    return out


class GpuMonitor:
    """Samples every ``interval_s`` until stopped; ``summary()`` gives Magpie's section."""

    def __init__(self, gpus: Optional[Sequence[str]] = None, interval_s: float = 2.0,
                 runner: Optional[Runner] = None) -> None:
        self.gpus = set(gpus) if gpus else None
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self._run = runner or (lambda argv: run_tool(argv, timeout_s=5.0))
        self._argv, self._parse = self._tool(runner)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = self._t1 = 0.0

    @staticmethod
    def _tool(runner: Optional[Runner]) -> tuple[Optional[list[str]], Callable[[str], list[dict]]]:
        smi = "nvidia-smi" if runner else find_tool("nvidia-smi")
        if smi:
            return [smi, "--query-gpu=uuid,temperature.gpu,clocks.sm,power.draw",
                    "--format=csv,noheader,nounits"], parse_nvidia_sample
        amd = "amd-smi" if runner else find_tool("amd-smi")
        if amd:
            return [amd, "metric", "--temperature", "--clock", "--power", "--json"], parse_amd_sample
        return None, parse_nvidia_sample

    @property
    def available(self) -> bool:
        return self._argv is not None

    def sample_once(self) -> None:
        if self._argv is None:
            return
        rc, out = self._run(self._argv)
        if rc != 0:
            return
        try:
            rows = self._parse(out)
        except (ValueError, TypeError):
            return
        now = time.time()
        for row in rows:
            if self.gpus is None or row["gpu"] in self.gpus:
                self.samples.append({"t": now, **row})

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self) -> "GpuMonitor":
        self._t0 = time.time()
        if self.available:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._t1 = time.time()

    def summary(self) -> dict:
        out: dict = {"enabled": True, "available": self.available, "sample_count": len(self.samples),
                     "duration_sec": round(self._t1 - self._t0, 3) if self._t1 else None,
                     "interval_sec": self.interval_s}
        for f in FIELDS:
            vals = [s[f] for s in self.samples if s.get(f) is not None]
            out[f] = {"min": min(vals), "max": max(vals), "avg": sum(vals) / len(vals)} if vals else None
        return out

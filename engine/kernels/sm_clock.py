"""The GPU's SM clock during the harness's timing rounds (issue 31).

A GPU that heats up or reaches its power limit lowers its SM clock (thermal or power
throttling), and a kernel timed at a lower clock looks slower for it. Interleaved rounds spread a
slow drift over every kernel, but a throttle that starts or stops between two kernels' rounds
still lands on one of them. So the parent reads the clock of the GPU the workers run on while
each kernel's round request is in flight:

* NVIDIA: NVML (``pynvml`` from nvidia-ml-py when importable, else the driver's own
  ``libnvidia-ml.so.1`` through ctypes): the SM clock, the rated maximum and the clock event
  (throttle) reasons, a few microseconds a read; without NVML, ``nvidia-smi --query-gpu=...``.
* AMD: ``amd-smi metric --temperature --clock --power --json`` (gfx_0 clock, its maximum, the
  power section's throttle_status), else ``rocm-smi --showclocks --json`` (clock only).

The GPU is found by the UUID or PCI bus id the worker's load reply gives (the visibility
variables renumber devices), else by its index mapped through those variables. A reader cheap
enough (NVML) reads at the start and the end of every round request and every
``SAMPLE_EVERY_S`` in between from a thread of the parent; a slow one (a tool run per read) only
from the thread, resting twice its own cost between reads. On a CPU, or without any tool, nothing is read and the report
says why, once.

What follows from the readings: each kernel's median and lowest clock and the slowdown reasons
seen go into its timing section; a median that differs from the baseline's by more than
``CLOCK_DROP`` or a thermal/power slowdown reason during a kernel's rounds is a flag on its
verdict; and once a drop is seen during the rounds (a slowdown reason, the clock falling from the
first round's, or kernels' clocks apart), each remaining round is split into ``SHORT_SPLIT``
shorter ones, each kernel's preceded by a cool-down pause (at most ``COOLDOWN_MAX_S``, all of
them together at most ``COOLDOWN_BUDGET_S``), as tritonbench does for throttling MI350s: short
replicas with sleeps between, pooled into one distribution.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence

from engine.bench.gpu_monitor import _value, parse_amd_sample, parse_nvidia_sample
from engine.bench.gpu_select import _rows
from engine.hw.detect import find_tool, run_tool

Runner = Callable[[Sequence[str]], "tuple[int, str]"]

# A compute-bound kernel's time follows 1/clock, so a clock difference between two kernels' rounds
# larger than the device tie margin (2%, engine.kernels.stats.DEFAULT_TIE_MARGIN) can by itself
# turn a tie into "faster" or "slower". An unthrottled GPU's median stays within a boost step or
# two (15 MHz, 0.75% of an H100's 1980 MHz), well inside it.
CLOCK_DROP = 0.02
# A reader this cheap per read (NVML) also reads at the start and end of every round request.
INLINE_COST_S = 0.005
SAMPLE_EVERY_S = 0.02
# After a drop: each remaining round becomes SHORT_SPLIT rounds of 1/SHORT_SPLIT the calls, and
# every kernel's short round waits first as long as its last round took, at most COOLDOWN_MAX_S
# (the heat of one round, let go), all pauses together at most COOLDOWN_BUDGET_S.
SHORT_SPLIT = 2
COOLDOWN_MAX_S = 1.0
COOLDOWN_BUDGET_S = 15.0

# NVML's clocks event (throttle) reason bits (nvmlClocksEventReason*, the same bits nvidia-smi's
# clocks_throttle_reasons.active prints as a hex mask).
NVML_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                0x80: "hw_power_brake_slowdown", 0x100: "display_clocks"}
# The reasons that mean thermal or power throttling ("throttled": amd-smi's throttle_status).
SLOWDOWN = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                      "hw_power_brake_slowdown", "throttled"})


@dataclass
class ClockReading:
    mhz: float
    max_mhz: Optional[float] = None
    reasons: tuple[str, ...] = ()
    temperature_c: Optional[float] = None


class ClockReader(Protocol):
    source: str  # "NVML", "nvidia-smi", "amd-smi", "rocm-smi", or a test's name
    gpu: str  # the id the tool was given

    def read(self) -> ClockReading: ...


def slowed(x: ClockReading) -> tuple[str, ...]:
    """The thermal/power reasons of a reading whose clock they really lowered: a power cap that
    holds the clock at its rated maximum costs nothing (heavy matmuls sit at the cap)."""
    slow = tuple(s for s in x.reasons if s in SLOWDOWN)
    if slow and x.max_mhz and x.mhz >= x.max_mhz * (1 - CLOCK_DROP):
        return ()
    return slow


def reasons_from_mask(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in NVML_REASONS.items() if mask & bit)


def _mask(text: str) -> Optional[int]:
    try:
        return int(text.strip(), 16)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _float(text: str) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- parsers


def parse_nvidia_clocks(text: str) -> list[ClockReading]:
    """``nvidia-smi --query-gpu=uuid,temperature.gpu,clocks.sm,power.draw,clocks.max.sm,
    clocks_event_reasons.active --format=csv,noheader,nounits``: the GPU monitor's four columns
    (engine.bench.gpu_monitor), then the rated maximum and the reasons mask (either may be
    missing)."""
    out = []
    for row, line in zip(parse_nvidia_sample(text), [ln for ln in text.splitlines() if ln.count(",") >= 3]):
        if row["gpu_clock_mhz"] is None:
            continue
        extra = [p.strip() for p in line.split(",")][4:]
        mask = _mask(extra[1]) if len(extra) > 1 else None
        out.append(ClockReading(row["gpu_clock_mhz"], _float(extra[0]) if extra else None,
                                reasons_from_mask(mask) if mask is not None else (), row["temperature_c"]))
    return out


def parse_amd_clocks(text: str) -> list[ClockReading]:
    """``amd-smi metric --temperature --clock --power --json`` (a bare list before ROCm 6.4,
    ``{"gpu_data": [...]}`` after): the GPU monitor's gfx clock and temperature, gfx_0's
    ``max_clk``, and ``power.throttle_status`` ("THROTTLED" / "UNTHROTTLED" / "N/A")."""
    out = []
    for row, raw in zip(parse_amd_sample(text), _rows(text)):
        if row["gpu_clock_mhz"] is None:
            continue
        clock = (raw.get("clock") or {}).get("gfx_0") or (raw.get("clock") or {}).get("gfx") or {}
        status = str((raw.get("power") or {}).get("throttle_status", "")).upper()
        out.append(ClockReading(row["gpu_clock_mhz"], _value(clock.get("max_clk")) if isinstance(clock, dict) else None,
                                ("throttled",) if status == "THROTTLED" else (), row["temperature_c"]))
    return out


_SCLK = re.compile(r"\((\d+(?:\.\d+)?)\s*Mhz\)", re.IGNORECASE)


def parse_rocm_smi_clocks(text: str) -> list[ClockReading]:
    """``rocm-smi --showclocks --json``: {"card0": {"sclk clock speed:": "(1700Mhz)", ...}}."""
    out = []
    for _card, fields in sorted(json.loads(text).items()):
        if not isinstance(fields, dict):
            continue
        m = _SCLK.search(str(fields.get("sclk clock speed:", "")))
        if m:
            out.append(ClockReading(float(m.group(1))))
    return out


# --------------------------------------------------------------------------- readers


class ToolReader:
    """One run of a vendor tool per read (tens of ms for nvidia-smi, more for amd-smi)."""

    def __init__(self, source: str, argv: list[str], parse: Callable[[str], list[ClockReading]], gpu: str,
                 runner: Optional[Runner] = None) -> None:
        self.source, self.argv, self.parse, self.gpu = source, argv, parse, gpu
        self._run = runner or (lambda a: run_tool(a, timeout_s=5.0))

    def read(self) -> ClockReading:
        rc, out = self._run(self.argv)
        if rc != 0:
            raise OSError(f"{self.source} exited {rc}: {out.strip()[:200]}")
        rows = self.parse(out)
        if not rows:
            raise OSError(f"{self.source} printed no clock: {out.strip()[:200]}")
        return rows[0]


class NvmlReader:
    """NVML's SM clock and clock event reasons for one device handle: microseconds a read."""

    source = "NVML"

    def __init__(self, nvml: Any, handle: Any, gpu: str) -> None:
        self.nvml, self.handle, self.gpu = nvml, handle, gpu
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        try:
            self.max_mhz: Optional[float] = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        except Exception:
            self.max_mhz = None

    def read(self) -> ClockReading:
        mhz = float(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
        reasons: tuple[str, ...] = ()
        if self._reasons is not None:
            try:
                reasons = reasons_from_mask(int(self._reasons(self.handle)))
            except Exception:  # not supported on this board: the clock alone
                self._reasons = None
        return ClockReading(mhz, self.max_mhz, reasons)


class LibNvml:
    """The few NVML calls NvmlReader makes, under pynvml's names, straight from the driver's
    libnvidia-ml.so.1 (no Python package needed)."""

    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        self._lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self._lib.nvmlInit_v2())
        if hasattr(self._lib, "nvmlDeviceGetCurrentClocksEventReasons"):
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons_fn("nvmlDeviceGetCurrentClocksEventReasons")
        elif hasattr(self._lib, "nvmlDeviceGetCurrentClocksThrottleReasons"):
            self.nvmlDeviceGetCurrentClocksThrottleReasons = self._reasons_fn(
                "nvmlDeviceGetCurrentClocksThrottleReasons")

    @staticmethod
    def _check(rc: int) -> None:
        if rc != 0:
            raise OSError(f"NVML error {rc}")

    def _handle(self, fn: str, arg: Any) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        self._check(getattr(self._lib, fn)(arg, ctypes.byref(h)))
        return h

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> ctypes.c_void_p:
        return self._handle("nvmlDeviceGetHandleByUUID", uuid.encode())

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> ctypes.c_void_p:
        return self._handle("nvmlDeviceGetHandleByPciBusId_v2", bus.encode())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:
        return self._handle("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index))

    def _clock(self, fn: str, handle: Any, kind: int) -> int:
        v = ctypes.c_uint()
        self._check(getattr(self._lib, fn)(handle, ctypes.c_int(kind), ctypes.byref(v)))
        return v.value

    def nvmlDeviceGetClockInfo(self, handle: Any, kind: int) -> int:
        return self._clock("nvmlDeviceGetClockInfo", handle, kind)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, kind: int) -> int:
        return self._clock("nvmlDeviceGetMaxClockInfo", handle, kind)

    def _reasons_fn(self, name: str) -> Callable[[Any], int]:
        def get(handle: Any) -> int:
            v = ctypes.c_ulonglong()
            self._check(getattr(self._lib, name)(handle, ctypes.byref(v)))
            return v.value
        return get


def load_nvml() -> Any:
    """pynvml (nvidia-ml-py) when importable, else LibNvml; raises when neither loads."""
    try:
        import pynvml  # type: ignore[import-not-found]
        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return LibNvml()


# --------------------------------------------------------------------------- which GPU


def _pci_parts(bus: str) -> Optional[tuple[int, int, int, int]]:
    m = re.fullmatch(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", bus.strip())
    if not m:
        return None
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4))


def pci_for(bus: str, vendor: str) -> Optional[str]:
    """A PCI bus id as each tool writes it: 00000000:18:00.0 (NVIDIA), 0000:0c:00.0 (amd-smi)."""
    p = _pci_parts(bus)
    if p is None:
        return None
    return f"{p[0]:08X}:{p[1]:02X}:{p[2]:02X}.{p[3]}" if vendor == "nvidia" else f"{p[0]:04x}:{p[1]:02x}:{p[2]:02x}.{p[3]}"


def physical_index(index: int, env: Mapping[str, str], vendor: str) -> Optional[str]:
    """The runtime's device ``index`` as the tools number it (or a UUID from the list), through
    the visibility variables: CUDA_VISIBLE_DEVICES on NVIDIA; HIP_VISIBLE_DEVICES (or
    CUDA_VISIBLE_DEVICES) and then ROCR_VISIBLE_DEVICES, which HIP applies under it, on AMD."""
    names = ["CUDA_VISIBLE_DEVICES"] if vendor == "nvidia" else ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]
    if vendor != "nvidia" and not env.get("HIP_VISIBLE_DEVICES") and env.get("CUDA_VISIBLE_DEVICES"):
        names[0] = "CUDA_VISIBLE_DEVICES"
    ident: str = str(index)
    for name in names:
        value = env.get(name)
        if value is None or not value.strip():
            continue
        entries = [e.strip() for e in value.split(",") if e.strip()]
        if not ident.isdigit() or int(ident) >= len(entries):
            return None
        ident = entries[int(ident)]
    return ident


def device_ids(device: Mapping[str, Any], env: Mapping[str, str], vendor: str) -> list[str]:
    """The ids to try for the worker's device, best first: its UUID (NVIDIA), its PCI bus id,
    its index through the visibility variables."""
    ids: list[str] = []
    uuid = device.get("uuid")
    if vendor == "nvidia" and uuid:
        ids.append(uuid if str(uuid).startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    if device.get("pci_bus_id"):
        bus = pci_for(str(device["pci_bus_id"]), vendor)
        if bus:
            ids.append(bus)
    idx = physical_index(int(device.get("index") or 0), env, vendor)
    if idx is not None:
        ids.append(idx)
    return list(dict.fromkeys(ids))


def _nvml_reader(ids: list[str]) -> Optional[NvmlReader]:
    try:
        nvml = load_nvml()
    except Exception:
        return None
    for ident in ids:
        try:
            if ident.startswith(("GPU-", "MIG-")):
                h = nvml.nvmlDeviceGetHandleByUUID(ident)
            elif ":" in ident:
                h = nvml.nvmlDeviceGetHandleByPciBusId(ident)
            else:
                h = nvml.nvmlDeviceGetHandleByIndex(int(ident))
            reader = NvmlReader(nvml, h, ident)
            reader.read()
            return reader
        except Exception:
            continue
    return None


class _Hung(Exception):
    pass


def _tool_reader(source: str, argv_for: Callable[[str, str], list[str]], parse: Callable[[str], list[ClockReading]],
                 ids: list[str], runner: Optional[Runner] = None) -> Optional[ToolReader]:
    tool = source if runner else find_tool(source)
    if not tool:
        return None
    for ident in ids:
        reader = ToolReader(source, argv_for(tool, ident), parse, ident, runner)
        try:
            reader.read()
            return reader
        except (OSError, ValueError, TypeError, KeyError) as exc:
            if "exited 124" in str(exc):  # the tool hung (killed after 5 s): no more tries of it
                raise _Hung(source) from exc
    return None


def nvidia_smi_argv(smi: str, ident: str, reasons: str = "clocks_event_reasons.active") -> list[str]:
    return [smi, f"--query-gpu=uuid,temperature.gpu,clocks.sm,power.draw,clocks.max.sm,{reasons}",
            "--format=csv,noheader,nounits", "-i", ident]


def open_reader(device: Mapping[str, Any], versions: Mapping[str, Any], env: Mapping[str, str],
                runner: Optional[Runner] = None, nvml: bool = True) -> tuple[Optional[ClockReader], str]:
    """A reader for the worker's GPU, or None and why none."""
    if device.get("type") != "cuda":
        return None, "the kernels ran on the CPU"
    vendor = "amd" if versions.get("hip") else "nvidia"
    ids = device_ids(device, env, vendor)
    if not ids:
        return None, "the GPU could not be matched to the tools' devices (visibility variables)"
    if vendor == "nvidia":
        reader: Optional[ClockReader] = _nvml_reader(ids) if nvml else None
        # Drivers before R535 know the reasons field only by its old name; an unknown field fails
        # the whole query, so each name is tried, then none.
        try:
            for field in ("clocks_event_reasons.active", "clocks_throttle_reasons.active", None):
                if reader is not None:
                    break
                reader = _tool_reader("nvidia-smi", lambda t, i, f=field: (
                    nvidia_smi_argv(t, i, f) if f else nvidia_smi_argv(t, i)[:1] + [
                        "--query-gpu=uuid,temperature.gpu,clocks.sm,power.draw,clocks.max.sm"] + nvidia_smi_argv(t, i)[2:]),
                    parse_nvidia_clocks, ids, runner)
        except _Hung:
            return None, "nvidia-smi hung (no NVML either)"
        return reader, "" if reader else "neither NVML nor nvidia-smi could read this GPU's clock"
    reader = None
    for tool, argv_for, parse, tool_ids in (
            ("amd-smi", lambda t, i: [t, "metric", "--temperature", "--clock", "--power", "--json", "-g", i],
             parse_amd_clocks, ids),
            ("rocm-smi", lambda t, i: [t, "--showclocks", "--json", "-d", i], parse_rocm_smi_clocks,
             [i for i in ids if i.isdigit()])):
        try:
            reader = reader or _tool_reader(tool, argv_for, parse, tool_ids, runner)
        except _Hung:
            continue
    return reader, "" if reader else "neither amd-smi nor rocm-smi could read this GPU's clock"


# Tests (and benchmarks) put a factory here: (device, versions, env) -> (reader or None, why).
READER_FACTORY: Optional[Callable[[Mapping, Mapping, Mapping], "tuple[Optional[ClockReader], str]"]] = None


# --------------------------------------------------------------------------- the session's watch


def _pct(a: float, b: float) -> str:
    return f"{(a - b) / b * 100:+.1f}%"


class ClockWatch:
    """The readings of one session's timing rounds, tagged by kernel and round."""

    def __init__(self, reader: Optional[ClockReader], why_not: str = "", read_cost_s: Optional[float] = None) -> None:
        self.reader, self.why_not, self.read_cost_s = reader, why_not, read_cost_s
        self.readings: list[tuple[str, int, ClockReading]] = []
        self.round_wall: dict[str, float] = {}
        self.short_from: Optional[int] = None  # the first round cut short
        self.short_why = ""
        self.split = 1
        self.pauses, self.paused_s = 0, 0.0
        self.baseline: Optional[str] = None
        self.errors = 0
        cheap = read_cost_s is not None and read_cost_s <= INLINE_COST_S
        every = getattr(reader, "sample_every_s", SAMPLE_EVERY_S if cheap else max(SAMPLE_EVERY_S, 2 * (read_cost_s or 0)))
        self.inline = getattr(reader, "inline", cheap)
        self.every_s: Optional[float] = every
        self._current: Optional[tuple[str, int]] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def for_members(cls, members: Sequence[Any], env_for: Callable[[Any], Mapping[str, Any]]) -> "ClockWatch":
        """The watch of a session's timed members (engine.kernels.session.Member: their load
        replies and their kernels' environments), its baseline the compare's baseline, else the
        judge, else the first."""
        places = [((m.load.get("device") or {}), (m.load.get("versions") or {}), env_of(env_for(m.spec)))
                  for m in members]
        dev, versions, env = places[0]
        vendor = "amd" if versions.get("hip") else "nvidia"
        gpus = {tuple(device_ids(d, e, vendor)[:1]) for d, _v, e in places if d.get("type") == "cuda"}
        watch = (cls(None, "the kernels ran on different GPUs (their own visibility variables)") if len(gpus) > 1
                 else cls.open(dev, versions, env))
        watch.baseline = next((m.key for m in members if getattr(m.spec, "baseline", False)),
                              next((m.key for m in members if m.role == "reference"), members[0].key))
        return watch

    @classmethod
    def open(cls, device: Mapping[str, Any], versions: Mapping[str, Any], env: Mapping[str, str]) -> "ClockWatch":
        """The watch of the GPU the workers run on (the first timed kernel's load reply), its
        sampling thread started; an unread one where there is no GPU or no tool."""
        factory = READER_FACTORY or open_reader
        try:
            reader, why = factory(device, versions, env)
        except Exception as exc:  # a tool that misbehaves never fails the compare
            reader, why = None, f"the clock reader failed: {exc}"
        if reader is None:
            return cls(None, why)
        costs = []
        for _ in range(3):
            t0 = time.perf_counter()
            try:
                reader.read()
            except Exception as exc:
                return cls(None, f"{reader.source} failed: {exc}")
            costs.append(time.perf_counter() - t0)
        watch = cls(reader, read_cost_s=statistics.median(costs))
        watch.start()
        return watch

    # ---------------------------------------------------------- reading
    def _take(self, tag: tuple[str, int]) -> None:
        try:
            reading = self.reader.read()  # type: ignore[union-attr]
        except Exception:
            self.errors += 1
            return
        with self._lock:
            self.readings.append((tag[0], tag[1], reading))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s or SAMPLE_EVERY_S):
            tag = self._current
            if tag is not None:  # tagged with the request in flight when the read began
                self._take(tag)

    def start(self) -> None:
        if self.reader is not None and self.every_s is not None:
            self._thread = threading.Thread(target=self._loop, name="sm-clock", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    @contextmanager
    def during(self, key: str, r: int) -> Iterator[None]:
        """Around kernel ``key``'s round-``r`` request: the clock is read while it is in flight."""
        if self.reader is None:
            yield
            return
        t0 = time.monotonic()
        if self.inline:
            self._take((key, r))
        self._current = (key, r)
        try:
            yield
        finally:
            self._current = None
            if self.inline:
                self._take((key, r))
            self.round_wall[key] = time.monotonic() - t0

    # ---------------------------------------------------------- short rounds
    def _work(self, rs: list[ClockReading]) -> list[ClockReading]:
        """Readings of a busy GPU (an idle one drops its clock for no fault of the kernel)."""
        busy = [x for x in rs if "gpu_idle" not in x.reasons]
        return busy or rs

    def _drop_seen(self, r: int) -> str:
        this = self._work([x for _k, rr, x in self.readings if rr == r])
        slow = sorted({s for x in this for s in slowed(x)})
        if slow:
            return f"the GPU reported {', '.join(slow)} in round {r + 1}"
        first = self._work([x for _k, rr, x in self.readings if rr == 0])
        if this and first:
            a, b = statistics.median(x.mhz for x in first), statistics.median(x.mhz for x in this)
            if b < a * (1 - CLOCK_DROP):
                return f"the SM clock fell from {a:.0f} MHz in round 1 to {b:.0f} MHz in round {r + 1}"
        by_key: dict[str, list[float]] = {}
        for k, rr, x in self.readings:
            if 0 <= rr <= r and "gpu_idle" not in x.reasons:
                by_key.setdefault(k, []).append(x.mhz)
        meds = {k: statistics.median(v) for k, v in by_key.items() if v}
        if len(meds) > 1 and min(meds.values()) < max(meds.values()) * (1 - CLOCK_DROP):
            lo, hi = min(meds, key=meds.__getitem__), max(meds, key=meds.__getitem__)
            return f"the SM clock was {meds[lo]:.0f} MHz during {lo}'s rounds against {meds[hi]:.0f} MHz during {hi}'s"
        return ""

    def after_round(self, r: int, plans: dict[str, dict]) -> int:
        """After round ``r`` (0-based): when a drop is first seen, every plan's remaining rounds
        are split into SHORT_SPLIT shorter ones. Returns the number of rounds to run in all."""
        total = max((p["rounds"] for p in plans.values()), default=0)
        if self.reader is None or self.short_from is not None or r < 0:
            return total
        why = self._drop_seen(r)
        if not why:
            return total
        self.short_from, self.short_why = r + 1, why
        self.split = SHORT_SPLIT if all(p["per_round"] >= SHORT_SPLIT for p in plans.values()) else 1
        for p in plans.values():
            left = p["rounds"] - (r + 1)
            if left > 0 and self.split > 1:
                p["rounds"] = r + 1 + left * self.split
                p["per_round"] = -(-p["per_round"] // self.split)
        return max((p["rounds"] for p in plans.values()), default=0)

    def cool_down(self, key: str, r: int) -> None:
        """Before ``key``'s short round ``r``: let the heat of its last round go first."""
        if self.short_from is None or r < self.short_from:
            return
        pause = min(COOLDOWN_MAX_S, self.round_wall.get(key, COOLDOWN_MAX_S), COOLDOWN_BUDGET_S - self.paused_s)
        if pause > 0:
            time.sleep(pause)
            self.pauses += 1
            self.paused_s += pause

    # ---------------------------------------------------------- the report
    def _of(self, key: str) -> list[ClockReading]:
        return self._work([x for k, r, x in self.readings if k == key and r >= 0])

    def summary(self, key: str) -> dict:
        """The timing section's ``sm_clock`` for kernel ``key``."""
        if self.reader is None:
            return {"read": False, "why": self.why_not}
        rs = self._of(key)
        out: dict = {"read": bool(rs), "source": self.reader.source, "gpu": self.reader.gpu,
                     "read_cost_ms": round(self.read_cost_s * 1e3, 3) if self.read_cost_s is not None else None,
                     "sampled": self._how(), "readings": len(rs)}
        if not rs:
            out["why"] = f"no reading came back during its rounds ({self.errors} failed)"
            return out
        mhz = [x.mhz for x in rs]
        out.update({"median_mhz": statistics.median(mhz), "min_mhz": min(mhz), "max_mhz": max(mhz),
                    "rated_max_mhz": next((x.max_mhz for x in rs if x.max_mhz), None)})
        temps = [x.temperature_c for x in rs if x.temperature_c is not None]
        if temps:
            out["max_temperature_c"] = max(temps)
        reasons: dict[str, int] = {}
        for x in rs:
            for s in x.reasons:
                reasons[s] = reasons.get(s, 0) + 1
        out["reasons"] = reasons
        rounds: dict[int, list[float]] = {}
        for k, r, x in self.readings:
            if k == key and r >= 0 and "gpu_idle" not in x.reasons:
                rounds.setdefault(r, []).append(x.mhz)
        out["round_median_mhz"] = [statistics.median(rounds[r]) for r in sorted(rounds)]
        if self.short_from is not None:
            out["short_rounds"] = self.short_note()
        return out

    def _how(self) -> str:
        if not self.inline:
            return f"from a thread every {self.every_s:.2f} s (one read takes that long) while each round request ran"
        return "at the start and end of each round request" + (
            f" and every {self.every_s * 1e3:.0f} ms during it" if self.every_s else "")

    def short_note(self) -> dict:
        return {"from_round": (self.short_from or 0) + 1, "why": self.short_why, "split": self.split,
                "cooldown_pauses": self.pauses, "cooldown_s": round(self.paused_s, 3),
                "cooldown_budget_s": COOLDOWN_BUDGET_S}

    def flags(self, key: str) -> list[dict]:
        """Verdict flags of kernel ``key``: its clock apart from the baseline's, a slowdown
        reason during its rounds, and (on the baseline) the switch to short rounds."""
        out: list[dict] = []
        rs = self._of(key)
        if self.reader is None or not rs:
            return out
        slow: dict[str, int] = {}
        for x in rs:
            for s in slowed(x):
                slow[s] = slow.get(s, 0) + 1
        if slow:
            n = max(slow.values())
            out.append({"guard": "sm_clock", "reasons": sorted(slow), "message": (
                f"the GPU throttled during {key}'s rounds ({', '.join(sorted(slow))} in {n} of {len(rs)} "
                f"clock readings; median SM clock {statistics.median(x.mhz for x in rs):.0f} MHz): its times "
                "include the slowdown")})
        base = self.baseline
        if base is not None and base != key and self._of(base):
            b = statistics.median(x.mhz for x in self._of(base))
            c = statistics.median(x.mhz for x in rs)
            change = (c - b) / b
            if abs(change) > CLOCK_DROP:
                lo, hi, lo_mhz, hi_mhz = (key, base, c, b) if c < b else (base, key, b, c)
                out.append({"guard": "sm_clock", "clock_change": round(change, 4), "message": (
                    f"the SM clock dropped between {hi}'s and {lo}'s rounds: median {lo_mhz:.0f} MHz during "
                    f"{lo}'s against {hi_mhz:.0f} MHz during {hi}'s ({_pct(lo_mhz, hi_mhz)}, more than the "
                    f"{CLOCK_DROP:.0%} a verdict tolerates): the speedup may be the clock's, not the kernel's")})
        if key == base and self.short_from is not None:
            n = self.short_note()
            out.append({"guard": "sm_clock_short_rounds", "message": (
                f"clock drop seen during the rounds ({n['why']}): from round {n['from_round']} on, each round was "
                f"split in {n['split']} shorter ones with a cool-down pause before each kernel's "
                f"({n['cooldown_pauses']} pauses, {n['cooldown_s']:.1f} s in all, at most {COOLDOWN_BUDGET_S:g} s)")})
        return out


def verdict_note(flags: Sequence[Mapping[str, Any]]) -> str:
    """What the terminal's verdict line adds for a kernel whose clock moved: " (SM clock -11.4%)"."""
    parts = [f"SM clock {f['clock_change'] * 100:+.1f}% vs baseline" for f in flags
             if f.get("guard") == "sm_clock" and "clock_change" in f]
    parts += ["GPU throttled" for f in flags if f.get("guard") == "sm_clock" and "reasons" in f]
    return f" ({'; '.join(parts)})" if parts else ""


def not_read_line(timings: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """"SM clock not read: why", once for a run, from its kernels' timing sections."""
    whys = [t["sm_clock"].get("why") for t in timings if isinstance(t.get("sm_clock"), dict)
            and not t["sm_clock"].get("read")]
    return f"SM clock not read: {whys[0]}" if whys and whys[0] else None


def env_of(spec_env: Mapping[str, Any]) -> dict[str, str]:
    """The environment a worker sees: this process's, under its kernel's own variables."""
    return {**os.environ, **{k: str(v) for k, v in spec_env.items()}}

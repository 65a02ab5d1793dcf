"""GPU detection from the vendors' command-line tools, without importing torch.

Tools are tried in order: nvidia-smi, then amd-smi, then rocminfo. Each runs with a
10 s timeout in its own process session (so a hung tool and its helpers can be killed
as a group), and a missing, failing or hanging tool never raises: detection then moves
on, and ``detect_gpu`` returns None when no tool reports a GPU.

Device numbering follows the runtime's:

* NVIDIA: nvidia-smi lists GPUs in PCI bus order, which is CUDA's order under
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. CUDA's default order (fastest first) differs only on
  boxes that mix GPU models; we keep nvidia-smi's order.
* AMD: rocminfo lists GPU agents in HIP's order; amd-smi's order is kept as printed
  (the same on the usual one-model boxes).

Then the visibility variables filter and renumber the list as the runtime would:
``CUDA_VISIBLE_DEVICES`` on NVIDIA; ``ROCR_VISIBLE_DEVICES`` and then
``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``, which HIP also reads) on AMD.
Only integer lists are applied; UUID lists are left alone. The tools themselves run
without these variables so that they list every device (rocminfo would apply
``ROCR_VISIBLE_DEVICES`` itself, and we would filter twice).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from engine.hw.specs import ArchSpec, get_arch_spec, normalize_arch

Runner = Callable[[Sequence[str]], tuple[int, str]]
Which = Callable[[str], str | None]

TOOL_TIMEOUT_S = 10.0
GPU_TOOLS: tuple[str, ...] = ("nvidia-smi", "amd-smi", "rocminfo")
COMPILERS: dict[str, str] = {"nvidia": "nvcc", "amd": "hipcc"}
PROFILERS: dict[str, tuple[str, ...]] = {
    "nvidia": ("ncu", "compute-sanitizer", "nsys"),
    "amd": ("rocprofv3", "rocprof-compute", "rocprof"),
}
NVIDIA_SMI_FIELDS: tuple[str, ...] = (
    "index", "name", "compute_cap", "memory.total", "driver_version", "pci.bus_id", "uuid",
)
VISIBILITY_VARS: tuple[str, ...] = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_VENDOR_LABEL = {"nvidia": "NVIDIA", "amd": "AMD"}


@dataclass
class GpuDevice:
    index: int
    name: str
    vendor: str
    arch: str | None
    memory_mb: int | None
    driver: str | None
    uuid: str | None = None
    pci_bus_id: str | None = None


@dataclass
class ToolInfo:
    name: str
    path: str
    version: str | None


@dataclass
class GpuInfo:
    devices: list[GpuDevice]
    vendor: str
    name: str
    arch: str | None
    driver: str | None
    runtime: str | None
    compiler: ToolInfo | None
    profilers: list[ToolInfo] = field(default_factory=list)
    spec: ArchSpec | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["spec"] = self.spec.to_dict() if self.spec else None
        return out


# --------------------------------------------------------------------------- running tools


def _tool_dirs() -> list[str]:
    roots = (os.environ.get("CUDA_HOME"), "/usr/local/cuda", os.environ.get("ROCM_PATH"), "/opt/rocm")
    return list(dict.fromkeys(os.path.join(r, "bin") for r in roots if r))


def find_tool(name: str) -> str | None:
    """Path of an executable on PATH or in the CUDA / ROCm bin folders, else None."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(_tool_dirs()))


def run_tool(argv: Sequence[str], timeout_s: float | None = None) -> tuple[int, str]:
    """Run a tool and return (returncode, stdout, or stderr when stdout is empty).

    Never raises: a tool that cannot start gives 127 and one that times out 124, as
    shells report them; on timeout its whole process group is killed.
    """
    env = {k: v for k, v in os.environ.items() if k not in VISIBILITY_VARS}
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError:
        return 127, ""
    try:
        out, err = proc.communicate(timeout=TOOL_TIMEOUT_S if timeout_s is None else timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        # A helper that left the group could hold the pipes open; do not wait on it for long.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=2)
        return 124, ""
    return proc.returncode, out if out.strip() else err


def _run(runner: Runner, argv: Sequence[str]) -> tuple[int, str]:
    """An injected runner's errors count as a failed run, like a missing tool."""
    try:
        return runner(argv)
    except (OSError, subprocess.SubprocessError, ValueError):
        return -1, ""


def _run_ok(runner: Runner, argv: Sequence[str]) -> str | None:
    """Output of a successful run, or None."""
    code, out = _run(runner, argv)
    return out if code == 0 else None


# --------------------------------------------------------------------------- parsers


def _na(value: Any) -> str | None:
    """None for the placeholders the tools print for a missing value."""
    text = str(value).strip() if value is not None else ""
    return None if text.strip("[]").lower() in ("", "n/a", "not supported", "unknown") else text


def _arch_from_name(name: str) -> str | None:
    spec = get_arch_spec(name)
    return spec.arch if spec else None


def parse_nvidia_smi_csv(text: str) -> list[GpuDevice]:
    """Parse ``nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version,
    pci.bus_id,uuid --format=csv,noheader,nounits``.

    Rows of 6 columns (the same query without compute_cap, for drivers older than R510
    that reject that field) and "[N/A]" compute_cap values fall back to the arch of the
    spec matching the GPU's name. Lines that are not data rows (error messages) are skipped.
    """
    devices: list[GpuDevice] = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 6:
            cols.insert(2, "[N/A]")
        if len(cols) != 7 or not cols[0].isdigit():
            continue
        index, name, cc, mem, driver, bus, uuid = cols
        cc_value = _na(cc)
        arch = f"sm_{cc_value.replace('.', '')}" if cc_value and re.fullmatch(r"\d+\.\d+", cc_value) else None
        memory = _na(mem)
        devices.append(
            GpuDevice(
                index=int(index),
                name=name,
                vendor="nvidia",
                arch=arch or _arch_from_name(name),
                memory_mb=int(float(memory)) if memory and re.fullmatch(r"[\d.]+", memory) else None,
                driver=_na(driver),
                uuid=_na(uuid),
                pci_bus_id=_na(bus),
            )
        )
    return devices


def parse_nvidia_smi_cuda_version(text: str) -> str | None:
    """The "CUDA Version: 13.0" of plain ``nvidia-smi``'s header (the driver's CUDA)."""
    m = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return m.group(1) if m else None


def parse_rocminfo(text: str) -> list[GpuDevice]:
    """GPU agents of ``rocminfo`` (CPU agents skipped), with the ROCk driver version."""
    m = re.search(r"ROCk module version (\S+) is loaded", text)
    driver = m.group(1) if m else None
    blocks = re.split(r"^\s*Agent \d+\s*$", text, flags=re.M)[1:]
    devices: list[GpuDevice] = []
    for block in blocks:
        info: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                # First occurrence wins: the nested "ISA Info" block repeats "Name:".
                info.setdefault(key.strip(), value.strip())
        if info.get("Device Type") != "GPU":
            continue
        arch = normalize_arch(info.get("Name", ""))
        name = _na(info.get("Marketing Name")) or info.get("Name", "")
        size = re.search(r"^\s*Size:\s*(\d+)\(0x[0-9a-fA-F]+\)\s*KB", block, flags=re.M)
        devices.append(
            GpuDevice(
                index=len(devices),
                name=name,
                vendor="amd",
                arch=arch or _arch_from_name(name),
                memory_mb=int(size.group(1)) // 1024 if size else None,
                driver=driver,
                uuid=_na(info.get("Uuid")),
            )
        )
    return devices


def _to_mb(value: Any) -> int | None:
    """amd-smi sizes: {"value": 196592, "unit": "MB"}, "196592 MB" or a bare MB number."""
    unit = "MB"
    if isinstance(value, dict):
        value, unit = value.get("value"), str(value.get("unit", "MB"))
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?i?B)?\s*", value)
        if not m:
            return None
        value, unit = m.group(1), m.group(2) or "MB"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    scale = {"B": 2**-20, "KB": 2**-10, "MB": 1, "GB": 2**10, "TB": 2**20}.get(unit.upper().replace("I", ""))
    return int(number * scale) if scale else None


def _section(entry: dict[str, Any], key: str) -> dict[str, Any]:
    value = entry.get(key)
    return value if isinstance(value, dict) else {}


def parse_amd_smi_static_json(text: str) -> list[GpuDevice]:
    """``amd-smi static --json``: a list of GPUs (ROCm 6.0-6.3) or {"gpu_data": [...]} (newer)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", [data] if "asic" in data else [])
    if not isinstance(data, list):
        return []
    devices: list[GpuDevice] = []
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("asic"), dict):
            continue
        asic, vram, driver, bus = (_section(entry, k) for k in ("asic", "vram", "driver", "bus"))
        name = _na(asic.get("market_name")) or ""
        gfx = _na(asic.get("target_graphics_version")) or _na(asic.get("gfx_version")) or ""
        devices.append(
            GpuDevice(
                index=len(devices),
                name=name,
                vendor="amd",
                arch=normalize_arch(gfx) or _arch_from_name(name),
                memory_mb=_to_mb(vram.get("size", vram.get("vram_size"))),
                driver=_na(driver.get("version")),
                pci_bus_id=_na(bus.get("bdf")),
            )
        )
    return devices


def _amd_smi_version_field(text: str, label: str) -> str | None:
    """A field of ``amd-smi version``'s "AMDSMI Tool: ... | ROCm version: 6.3.1 | amdgpu version: ..." line."""
    m = re.search(rf"{label}:\s*([^|\s]+)", text)
    return _na(m.group(1)) if m else None


def parse_nvcc_version(text: str) -> str | None:
    """nvcc's "Cuda compilation tools, release 13.0, V13.0.88" -> "13.0"."""
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def parse_hipcc_version(text: str) -> str | None:
    """hipcc's "HIP version: 6.3.42131-fa1d09cbd" -> "6.3.42131"."""
    m = re.search(r"HIP version:\s*(\d+(?:\.\d+)*)", text)
    return m.group(1) if m else None


def parse_ncu_version(text: str) -> str | None:
    """ncu's (and compute-sanitizer's) "Version 2025.3.1.0 (build 36398880) ..." -> "2025.3.1.0"."""
    m = re.search(r"^\s*Version\s+(\d+(?:\.\d+)+)", text, flags=re.M)
    return m.group(1) if m else None


def parse_rocprofv3_version(text: str) -> str | None:
    """rocprofv3 prints "key: value" lines; its "version: 1.0.0" line -> "1.0.0"."""
    m = re.search(r"^\s*version:\s*(\S+)", text, flags=re.M)
    return m.group(1) if m else None


def first_meaningful_line(text: str) -> str | None:
    """First line that is not blank, a copyright notice or a rule of punctuation."""
    for line in text.splitlines():
        s = line.strip()
        if s and not s.lower().startswith("copyright") and re.search(r"[A-Za-z0-9]", s):
            return s
    return None


_VERSION_PARSERS: dict[str, Callable[[str], str | None]] = {
    "nvcc": parse_nvcc_version,
    "hipcc": parse_hipcc_version,
    "ncu": parse_ncu_version,
    "compute-sanitizer": parse_ncu_version,
    "rocprofv3": parse_rocprofv3_version,
}


def parse_tool_version(name: str, text: str) -> str | None:
    """The version a tool's ``--version`` prints: a tool's own parser, else the number after
    "version", else the first meaningful line."""
    parser = _VERSION_PARSERS.get(name)
    if parser and (found := parser(text)):
        return found
    m = re.search(r"(?i)\bversion\b\s*:?\s*v?(\d+(?:\.\d+)+[\w.+-]*)", text)
    return m.group(1) if m else first_meaningful_line(text)


# --------------------------------------------------------------------------- detection


class _Found(NamedTuple):
    devices: list[GpuDevice]
    runtime: str | None
    driver: str | None


def _detect_nvidia(runner: Runner, which: Which) -> _Found | None:
    smi = which("nvidia-smi")
    if smi is None:
        return None
    fmt = "--format=csv,noheader,nounits"
    code, out = _run(runner, [smi, f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", fmt])
    if code != 0 and "compute_cap" in out:  # drivers before R510 reject that field by name
        no_cc = [f for f in NVIDIA_SMI_FIELDS if f != "compute_cap"]
        code, out = _run(runner, [smi, f"--query-gpu={','.join(no_cc)}", fmt])
    devices = parse_nvidia_smi_csv(out) if code == 0 else []
    if not devices:
        return None
    cuda = parse_nvidia_smi_cuda_version(_run_ok(runner, [smi]) or "")
    return _Found(devices, f"CUDA {cuda}" if cuda else None, devices[0].driver)


def _detect_amd(runner: Runner, which: Which) -> _Found | None:
    smi = which("amd-smi")
    devices = parse_amd_smi_static_json(_run_ok(runner, [smi, "static", "--json"]) or "") if smi else []
    # Ask amd-smi for versions only when it works: a hung one would cost another timeout.
    version = (_run_ok(runner, [smi, "version"]) or "") if smi and devices else ""
    if not devices and (rocminfo := which("rocminfo")):
        devices = parse_rocminfo(_run_ok(runner, [rocminfo]) or "")
    if not devices:
        return None
    rocm = _amd_smi_version_field(version, "ROCm version")
    driver = devices[0].driver or _amd_smi_version_field(version, "amdgpu version")
    return _Found(devices, f"ROCm {rocm}" if rocm else None, driver)


def _apply_visible(devices: list[GpuDevice], value: str | None) -> list[GpuDevice]:
    """Filter and renumber like the runtime: "2,0" -> devices 2 and 0 as 0 and 1; an empty
    value hides all; listing stops at the first invalid index. Non-integer lists (UUIDs)
    are not applied."""
    if value is None:
        return devices
    items = [s.strip() for s in value.split(",")] if value.strip() else []
    if not all(re.fullmatch(r"-?\d+", s) for s in items):
        return devices
    picked: list[int] = []
    for s in items:
        i = int(s)
        if not 0 <= i < len(devices) or i in picked:
            break
        picked.append(i)
    return [replace(devices[i], index=n) for n, i in enumerate(picked)]


def _visible_devices(devices: list[GpuDevice], vendor: str, env: Mapping[str, str]) -> list[GpuDevice]:
    devices = [replace(d, index=n) for n, d in enumerate(devices)]
    if vendor == "nvidia":
        return _apply_visible(devices, env.get("CUDA_VISIBLE_DEVICES"))
    devices = _apply_visible(devices, env.get("ROCR_VISIBLE_DEVICES"))
    return _apply_visible(devices, env.get("HIP_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES")))


def _tool_infos(names: Sequence[str], runner: Runner, which: Which) -> list[ToolInfo]:
    """Found tools with their versions; the --version runs go in parallel since some take seconds."""

    def one(name: str) -> ToolInfo | None:
        path = which(name)
        if path is None:
            return None
        out = _run_ok(runner, [path, "--version"])
        return ToolInfo(name, path, parse_tool_version(name, out) if out else None)

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return [t for t in pool.map(one, names) if t is not None]


def detect_tools(runner: Runner | None = None, which: Which | None = None) -> list[ToolInfo]:
    """Every compiler and profiler of either vendor that is installed, with its version."""
    names = (*COMPILERS.values(), *PROFILERS["nvidia"], *PROFILERS["amd"])
    return _tool_infos(names, runner or run_tool, which or find_tool)


def _spec_for(device: GpuDevice) -> ArchSpec | None:
    spec = get_arch_spec(device.name) if device.name else None
    # Fall back to the arch only when the name says no more than the arch does (rocminfo
    # without a marketing name): a known arch with an unknown name (an "H100 NVL") has
    # other peaks than the arch's default part.
    if spec is None and device.arch and (not device.name or normalize_arch(device.name)):
        spec = get_arch_spec(device.arch)
    return spec


def detect_devices(runner: Runner | None = None, which: Which | None = None) -> tuple[str, list[GpuDevice], str | None] | None:
    """(vendor, the GPUs the runtime would see, driver), or None when no tool reports a GPU: what
    ``detect_gpu`` finds without the compiler and profiler versions it adds (those cost seconds),
    for callers that need only names and the driver (a report's provenance)."""
    seen = _seen_devices(runner or run_tool, which or find_tool)
    return (seen[0], seen[1], seen[2].driver) if seen is not None else None


def _seen_devices(runner: Runner, which: Which) -> tuple[str, list[GpuDevice], Any] | None:
    """(vendor, the visible GPUs, what the vendor tool found), or None when none is seen."""
    found = _detect_nvidia(runner, which) or _detect_amd(runner, which)
    if found is None:
        return None
    vendor = found.devices[0].vendor
    devices = _visible_devices(found.devices, vendor, os.environ)
    return (vendor, devices, found) if devices else None


def detect_gpu(runner: Runner | None = None, which: Which | None = None) -> GpuInfo | None:
    """Detect the GPUs the runtime would see, with compiler, profilers and arch spec.

    ``runner`` runs an argv and returns (returncode, output) (default: ``run_tool``);
    ``which`` resolves a tool name to a path or None (default: ``find_tool``). Both are
    injectable so tests can replay recorded tool output. Returns None when no GPU is seen.
    """
    runner = runner or run_tool
    which = which or find_tool
    seen = _seen_devices(runner, which)
    if seen is None:
        return None
    vendor, devices, found = seen
    tools = _tool_infos((COMPILERS[vendor], *PROFILERS[vendor]), runner, which)
    compiler = next((t for t in tools if t.name == COMPILERS[vendor]), None)
    runtime = found.runtime
    if runtime is None and vendor == "amd" and compiler and compiler.version:
        runtime = f"HIP {compiler.version}"  # no amd-smi: HIP's major.minor is ROCm's
    first = devices[0]
    spec = _spec_for(first)
    return GpuInfo(
        devices=devices,
        vendor=vendor,
        name=first.name,
        arch=first.arch or (spec.arch if spec else None),
        driver=found.driver,
        runtime=runtime,
        compiler=compiler,
        profilers=[t for t in tools if t is not compiler],
        spec=spec,
    )


# --------------------------------------------------------------------------- formatting


def _tool_lines(label: str, tools: Sequence[ToolInfo]) -> list[str]:
    if not tools:
        return [f"{label}: not found"]
    return [f"{label}: {t.name} {t.version or '(version unknown)'} ({t.path})" for t in tools]


def _spec_line(info: GpuInfo) -> str:
    spec = info.spec
    if spec is None:
        return f"Arch spec: none known for {info.name!r} ({info.arch or 'arch unknown'}); supply an arch spec JSON file"
    parts = [f"{spec.memory_bw_tbs:g} TB/s"]
    bf16 = spec.peak_tflops_for("bf16")
    if bf16 is not None:
        parts.append(f"bf16 {bf16:g} TFLOP/s dense")
    line = f"Arch spec: {spec.key} — {', '.join(parts)} (datasheet)"
    if spec.measured:
        measured = [
            f"{v:g} TB/s" if k == "memory_bw_tbs" else f"{k} {v:g} TFLOP/s" for k, v in spec.measured.items()
        ]
        line += f"; measured {', '.join(measured)}"
    return line


def format_gpu_info(
    info: GpuInfo | None,
    tools: Sequence[ToolInfo] | None = None,
    which: Which | None = None,
) -> str:
    """The text ``magpie --gpu-info`` prints.

    With no GPU the first line is exactly "No GPU detected", followed by the tools looked
    for and the compilers and profilers still installed (``tools``; detected when None).
    """
    if info is None:
        which = which or find_tool
        looked = ", ".join(
            f"{t} ({p}: no GPU reported)" if (p := which(t)) else f"{t} (not found)" for t in GPU_TOOLS
        )
        lines = ["No GPU detected", f"Looked for: {looked}", f"Searched: PATH, {', '.join(_tool_dirs())}"]
        lines += [f"Note: {v}={os.environ[v]!r} is set" for v in VISIBILITY_VARS if v in os.environ]
        found = list(detect_tools(which=which) if tools is None else tools)
        compilers = [t for t in found if t.name in COMPILERS.values()]
        lines += _tool_lines("Compiler", compilers)
        lines += _tool_lines("Profiler", [t for t in found if t not in compilers])
        return "\n".join(lines)

    counts = Counter(d.name for d in info.devices)
    memory = sorted({d.memory_mb for d in info.devices if d.memory_mb})
    lines = [
        f"Vendor: {_VENDOR_LABEL.get(info.vendor, info.vendor)}",
        "GPU: " + ", ".join(f"{name} (x{n})" for name, n in counts.items()),
    ]
    if memory:
        lines.append("Memory: " + ", ".join(f"{m} MiB" for m in memory))
    lines += [
        f"Architecture: {info.arch or 'unknown'}",
        f"Driver: {info.driver or 'unknown'}",
        f"Runtime: {info.runtime or 'unknown'}",
    ]
    lines += _tool_lines("Compiler", [info.compiler] if info.compiler else [])
    lines += _tool_lines("Profiler", info.profilers)
    lines.append(_spec_line(info))
    return "\n".join(lines)

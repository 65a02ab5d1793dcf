"""GPU selection for a server: free GPUs (enough free memory, no compute processes), pinned with the
variable the runtime reads, in the runtime's own numbering.

NVIDIA: ``CUDA_VISIBLE_DEVICES`` takes GPU UUIDs, so the choice does not depend on CUDA's device
order (FASTEST_FIRST by default, not nvidia-smi's PCI order). AMD: ``HIP_VISIBLE_DEVICES`` takes
HIP indices, which follow the KFD node order; ``amd-smi``'s own index follows the PCI order, and
mixing the two picked busy GPUs in Magpie (its issue #92), so indices are re-derived from the node
ids ``amd-smi list`` reports.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

from engine.errors import MagpieError
from engine.hw.detect import find_tool, run_tool

Runner = Callable[[Sequence[str]], "tuple[int, str]"]


@dataclass
class GpuState:
    vendor: str
    runtime_index: int  # the index the runtime (CUDA / HIP) gives this GPU
    smi_index: int
    uuid: str
    bus_id: str
    free_mb: float
    total_mb: float
    processes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class GpuSelectionError(MagpieError):
    """No usable set of GPUs could be chosen, or the vendor tool's output was not understood."""

    title = "GPU selection failed"


def parse_nvidia(gpus_csv: str, apps_csv: str) -> list[GpuState]:
    """``nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.free,memory.total --format=csv,noheader,nounits``
    and ``--query-compute-apps=gpu_uuid,pid --format=csv,noheader``."""
    procs: dict[str, list[int]] = {}
    for line in apps_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].startswith("GPU-") and parts[1].isdigit():
            procs.setdefault(parts[0], []).append(int(parts[1]))
    out = []
    for line in gpus_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        idx, uuid, bus = int(parts[0]), parts[1], parts[2]
        out.append(GpuState("nvidia", idx, idx, uuid, bus, _num(parts[3]), _num(parts[4]), procs.get(uuid, [])))
    return out


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _rows(text: str) -> list[dict]:
    data = json.loads(text)
    if isinstance(data, dict):  # newer amd-smi wraps the list
        data = data.get("gpu_data") or data.get("gpus") or []
    return [d for d in data if isinstance(d, dict)]


def _mb(entry: object) -> float:
    """amd-smi values come as {"value": N, "unit": "MB"} or bare numbers."""
    if isinstance(entry, dict):
        value, unit = float(entry.get("value", 0) or 0), str(entry.get("unit", "MB")).upper()
        return value * {"B": 1 / 2**20, "KB": 1 / 1024, "MB": 1, "GB": 1024}.get(unit, 1)
    try:
        return float(entry)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def parse_amd(list_json: str, mem_json: str, proc_json: str) -> list[GpuState]:
    """``amd-smi list --json``, ``amd-smi metric --mem-usage --json``, ``amd-smi process --json``."""
    listed = _rows(list_json)
    mem = {r.get("gpu"): r.get("mem_usage", r) for r in _rows(mem_json)}
    procs: dict[object, list[int]] = {}
    for r in _rows(proc_json):
        plist = r.get("process_list") or []
        pids = []
        for p in plist if isinstance(plist, list) else []:
            info = p.get("process_info", p) if isinstance(p, dict) else {}
            if isinstance(info, dict) and str(info.get("pid", "")).isdigit():
                pids.append(int(info["pid"]))
        procs[r.get("gpu")] = pids
    # HIP numbers GPUs in KFD node order.
    order = sorted(listed, key=lambda r: (int(r.get("node_id", r.get("kfd_id", r.get("gpu", 0))) or 0)))
    out = []
    for hip_index, r in enumerate(order):
        g = r.get("gpu")
        m = mem.get(g) or {}
        total = _mb(m.get("total_vram"))
        free = _mb(m.get("free_vram")) if "free_vram" in m else total - _mb(m.get("used_vram"))
        out.append(GpuState("amd", hip_index, int(g) if g is not None else hip_index, str(r.get("uuid", "")),
                            str(r.get("bdf", "")), free, total, procs.get(g, [])))
    return out


def gpu_states(runner: Optional[Runner] = None) -> list[GpuState]:
    """The GPUs of this host with their free memory and compute processes; [] without GPU tools."""
    run = runner or (lambda argv: run_tool(argv))
    smi = find_tool("nvidia-smi") if runner is None else "nvidia-smi"
    if smi:
        rc, gpus = run([smi, "--query-gpu=index,uuid,pci.bus_id,memory.free,memory.total",
                        "--format=csv,noheader,nounits"])
        if rc == 0 and gpus.strip():
            _, apps = run([smi, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"])
            return parse_nvidia(gpus, apps)
    amd = find_tool("amd-smi") if runner is None else "amd-smi"
    if amd:
        rc, listed = run([amd, "list", "--json"])
        if rc == 0 and listed.strip():
            _, mem = run([amd, "metric", "--mem-usage", "--json"])
            _, procs = run([amd, "process", "--json"])
            try:
                return parse_amd(listed, mem or "[]", procs or "[]")
            except (ValueError, TypeError) as exc:
                raise GpuSelectionError(f"amd-smi output not understood: {exc}") from None
    return []


def select_gpus(states: list[GpuState], count: int, *, min_free_gb: float = 8.0,
                candidates: Optional[Sequence[int]] = None) -> tuple[list[GpuState], list[str]]:
    """``count`` free GPUs in runtime order; raises with the reason for every GPU passed over."""
    chosen, skipped = [], []
    for s in sorted(states, key=lambda s: s.runtime_index):
        if candidates is not None and s.runtime_index not in candidates:
            continue
        if s.processes:
            skipped.append(f"GPU {s.runtime_index} ({s.bus_id}): busy, processes {s.processes}")
        elif s.free_mb < min_free_gb * 1024:
            skipped.append(f"GPU {s.runtime_index} ({s.bus_id}): {s.free_mb / 1024:.1f} GB free < {min_free_gb} GB")
        elif len(chosen) < count:
            chosen.append(s)
    if len(chosen) < count:
        raise GpuSelectionError(f"{count} free GPU(s) needed, {len(chosen)} found" +
                                (": " + "; ".join(skipped) if skipped else ""))
    return chosen, skipped


def visible_devices(selected: list[GpuState]) -> dict[str, str]:
    if not selected:
        return {}
    if selected[0].vendor == "nvidia":
        return {"CUDA_VISIBLE_DEVICES": ",".join(s.uuid for s in selected)}
    return {"HIP_VISIBLE_DEVICES": ",".join(str(s.runtime_index) for s in selected)}

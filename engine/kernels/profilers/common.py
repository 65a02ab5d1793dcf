"""Profiler-neutral kernel launches and the statistics the engine ranks on.

Both backends (ncu on NVIDIA, rocprofv3 on AMD) reduce their output to a list of
``KernelLaunch``; everything downstream only sees that list.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

# Kernels the HIP runtime launches on the user's behalf (hipMemset fills, blits):
# they are not the kernel under test and must not count towards its time.
HELPER_KERNEL_PREFIXES = ("__amd_rocclr_", "__hip_")


def is_helper_kernel(name: str) -> bool:
    """True for runtime helper kernels (``__amd_rocclr_*``, ``__hip_*``)."""
    # A demangler may print a return type in front of the name ("void __amd_rocclr_...").
    return name.strip().removeprefix("void ").startswith(HELPER_KERNEL_PREFIXES)


@dataclass
class KernelLaunch:
    """One kernel launch as a profiler reports it."""

    name: str  # demangled kernel name, as the tool prints it
    duration_ns: float
    dram_read_bytes: float | None
    dram_write_bytes: float | None
    grid: str | None
    block: str | None
    launch_id: int
    helper: bool


def _dram_total(launches: Iterable[KernelLaunch]) -> float | None:
    """Read + write bytes over the launches; None when the tool measured none of them."""
    values = [v for la in launches for v in (la.dram_read_bytes, la.dram_write_bytes) if v is not None]
    return sum(values) if values else None


def _by_kernel(launches: Iterable[KernelLaunch]) -> dict[str, list[KernelLaunch]]:
    """Non-helper launches grouped by kernel name, each group in launch order."""
    groups: dict[str, list[KernelLaunch]] = defaultdict(list)
    for la in sorted(launches, key=lambda la: la.launch_id):
        if not la.helper:
            groups[la.name].append(la)
    return dict(groups)


def aggregate_launches(launches: Iterable[KernelLaunch]) -> list[dict]:
    """Magpie's per-kernel summary, most expensive kernel first, helpers excluded."""
    result = []
    for name, group in _by_kernel(launches).items():
        durations = [la.duration_ns for la in group]
        result.append({
            "kernel_name": name,
            "dispatch_count": len(group),
            "duration_ns": {
                "avg": sum(durations) / len(durations),
                "min": min(durations),
                "max": max(durations),
                "total": sum(durations),
                "median": statistics.median(durations),
            },
            "dram_bytes": _dram_total(group),
        })
    result.sort(key=lambda k: k["duration_ns"]["total"], reverse=True)
    return result


def iteration_samples_ns(launches: Iterable[KernelLaunch]) -> tuple[list[float], str]:
    """Timing samples to rank on, and a one-line note of how they were formed.

    When every kernel ran the same number of times n, the testcase most likely
    loops n times over the same sequence of kernels, so sample i is the GPU time
    of iteration i: the sum of every kernel's i-th launch. Otherwise the
    iterations cannot be told apart and the samples are the launches of the
    kernel with the largest total time.
    """
    groups = _by_kernel(launches)
    if not groups:
        return [], "no kernel launches (runtime helper kernels are not counted)"
    counts = {name: len(group) for name, group in groups.items()}
    if len(set(counts.values())) == 1:
        n = next(iter(counts.values()))
        samples = [sum(group[i].duration_ns for group in groups.values()) for i in range(n)]
        if len(groups) == 1:
            return samples, f"{n} launches of {next(iter(groups))}"
        return samples, (f"{n} iterations; each sample sums the i-th launch of each of "
                         f"{len(groups)} kernels ({', '.join(groups)})")
    top = max(groups, key=lambda name: sum(la.duration_ns for la in groups[name]))
    spread = ", ".join(f"{name} x{count}" for name, count in counts.items())
    return ([la.duration_ns for la in groups[top]],
            f"launch counts differ ({spread}); samples are the {counts[top]} launches of "
            f"the kernel with the largest total time, {top}")

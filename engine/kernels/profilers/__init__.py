"""Profiler backends for compiled kernels: ncu (NVIDIA) and rocprofv3 (AMD).

Each backend builds the profiler's command line and parses what it writes into
``KernelLaunch`` records; ``common`` turns those into per-kernel summaries and
timing samples.
"""

from engine.kernels.profilers.common import (
    KernelLaunch,
    aggregate_launches,
    is_helper_kernel,
    iteration_samples_ns,
)
from engine.kernels.profilers.ncu import build_ncu_command, ncu_summary, parse_ncu_csv, read_ncu_log
from engine.kernels.profilers.rocprof import (
    build_rocprofv3_command,
    find_kernel_trace_files,
    parse_rocprofv3_kernel_trace,
    read_rocprofv3_output,
)

__all__ = [
    "KernelLaunch",
    "aggregate_launches",
    "build_ncu_command",
    "build_rocprofv3_command",
    "find_kernel_trace_files",
    "is_helper_kernel",
    "iteration_samples_ns",
    "ncu_summary",
    "parse_ncu_csv",
    "parse_rocprofv3_kernel_trace",
    "read_ncu_log",
    "read_rocprofv3_output",
]

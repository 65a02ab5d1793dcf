"""rocprofv3 backend: per-dispatch GPU time of HIP kernels from kernel traces.

Flags and CSV columns are those of ROCprofiler-SDK's "Using rocprofv3" guide
(rocprofiler-sdk, source/docs/how-to/using-rocprofv3.rst).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

from engine.kernels.profilers.common import KernelLaunch, is_helper_kernel

# -o names the files <out>/run_kernel_trace.csv (without -o: <out>/<hostname>/<pid>_kernel_trace.csv).
OUTPUT_FILE = "run"


def build_rocprofv3_command(rocprofv3: str, argv: Sequence[str], out_dir: Path,
                            extra_args: Sequence[str] = ()) -> list[str]:
    """The rocprofv3 command line that traces every kernel dispatch of ``argv`` into ``out_dir``."""
    return [rocprofv3, "--kernel-trace", "--output-format", "csv", "-d", str(out_dir), "-o", OUTPUT_FILE,
            *extra_args, "--", *argv]


def find_kernel_trace_files(out_dir: Path) -> list[Path]:
    """Every kernel trace under ``out_dir``, whichever layout the rocprofv3 version wrote."""
    return sorted(out_dir.rglob("*kernel_trace.csv"))


def read_rocprofv3_output(out_dir: Path) -> list[KernelLaunch]:
    """The launches of every kernel trace under ``out_dir`` (``build_rocprofv3_command``'s folder)."""
    launches: list[KernelLaunch] = []
    for f in find_kernel_trace_files(out_dir):
        launches.extend(parse_rocprofv3_kernel_trace(f.read_text(errors="replace")))
    return launches


def _dims(row: dict[str, str], prefix: str) -> str | None:
    """"(x, y, z)" from the <prefix>_X/_Y/_Z columns, or None if the trace has none."""
    if f"{prefix}_X" not in row:
        return row.get(prefix) or None
    return f"({row[f'{prefix}_X']}, {row[f'{prefix}_Y']}, {row[f'{prefix}_Z']})"


def parse_rocprofv3_kernel_trace(text: str) -> list[KernelLaunch]:
    """Launches of a rocprofv3 ``kernel_trace.csv``, in the order they started.

    Also reads the older ``rocprof --stats`` / ``--timestamp on`` ``results.csv``
    (KernelName, grd, wgr, BeginNs, EndNs). Grid sizes are as the tool prints them:
    work-items, not blocks. rocprofv3 has no DRAM byte counts in a kernel trace.
    """
    rows = list(csv.DictReader(io.StringIO(text)))
    launches = []
    for index, row in enumerate(rows):
        if "Kernel_Name" in row:
            if row.get("Kind", "KERNEL_DISPATCH") != "KERNEL_DISPATCH":
                continue
            name, start, end = row["Kernel_Name"], int(row["Start_Timestamp"]), int(row["End_Timestamp"])
            grid, block = _dims(row, "Grid_Size"), _dims(row, "Workgroup_Size")
            launch_id = int(row.get("Dispatch_Id") or index)
        else:
            # rocprof v1 prints the code object symbol: "name(args) [clone .kd]"
            name = row["KernelName"].removesuffix(" [clone .kd]").removesuffix(".kd")
            start, end = int(row["BeginNs"]), int(row["EndNs"])
            grid, block = row.get("grd") or None, row.get("wgr") or None
            launch_id = int(row.get("Index") or index)
        launches.append((start, KernelLaunch(
            name=name,
            duration_ns=float(end - start),
            dram_read_bytes=None,
            dram_write_bytes=None,
            grid=grid,
            block=block,
            launch_id=launch_id,
            helper=is_helper_kernel(name),
        )))
    # Rows are written per queue as buffers flush, not in dispatch order.
    launches.sort(key=lambda pair: pair[0])
    return [la for _, la in launches]

"""Nsight Compute (ncu) backend: per-launch GPU time and DRAM traffic of CUDA kernels.

Options are those of the Nsight Compute CLI manual
(https://docs.nvidia.com/nsight-compute/NsightComputeCli/, "Command Line Options").
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable, Sequence

from engine.kernels.profilers.common import KernelLaunch, is_helper_kernel

DURATION_METRIC = "gpu__time_duration.sum"
DRAM_READ_METRIC = "dram__bytes_read.sum"
DRAM_WRITE_METRIC = "dram__bytes_write.sum"
DEFAULT_METRICS = (DURATION_METRIC, DRAM_READ_METRIC, DRAM_WRITE_METRIC)
# The label sections such as SpeedOfLight give gpu__time_duration.sum on the details page.
DURATION_LABEL = "Duration"

# Units ncu prints without --print-units base: SI prefixes with factor 1000 for both
# bytes and time (manual, "Metrics and Units").
_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
            "second": 1e9, "s": 1e9}
_BYTES = {"byte": 1.0, "B": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6,
          "Gbyte": 1e9, "GB": 1e9, "Tbyte": 1e12, "TB": 1e12}

# An option the caller gives in extra_args replaces build_ncu_command's default for it,
# since a single-valued ncu option given twice is an error rather than an override.
_SHORT_ALIASES = {"-k": "--kernel-name"}


def build_ncu_command(ncu: str, argv: Sequence[str], log_file: Path, extra_args: Sequence[str] = (),
                      metrics: Sequence[str] | None = None, kernel_name: str | None = None) -> list[str]:
    """The ncu command line that profiles every launch of ``argv`` into ``log_file``.

    ``--clock-control none`` leaves the GPU clocks as the application would see them
    (ncu otherwise locks them: to base in older releases, to boost in 2026.1),
    ``--page raw`` gives one CSV row per launch.
    """
    given = {_SHORT_ALIASES.get(a, a.split("=", 1)[0]) for a in extra_args if a.startswith("-")}
    defaults: list[tuple[str, ...]] = [
        ("--clock-control", "none"),
        ("--target-processes", "all"),
        ("--csv",),
        ("--print-units", "base"),
        ("--page", "raw"),
        ("--metrics", ",".join(metrics or DEFAULT_METRICS)),
    ]
    if kernel_name:
        defaults.append(("--kernel-name", kernel_name))
    defaults.append(("--log-file", str(log_file)))
    cmd = [ncu]
    for option in defaults:
        if option[0] not in given:
            cmd.extend(option)
    return [*cmd, *extra_args, "--", *argv]


def _number(value: str) -> float | None:
    """ncu's value text as a float: thousands separators dropped, "n/a" and blanks as None."""
    text = value.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def _scaled(value: str, unit: str, table: dict[str, float], metric: str) -> float | None:
    number = _number(value)
    if number is None:
        return None
    unit = unit.strip()
    if not unit:
        return number  # no unit printed: the base unit
    factor = table.get(unit, table.get(unit.removesuffix("s")))  # "Kbytes" is "Kbyte"
    if factor is None:
        raise ValueError(f"ncu printed {metric} in an unknown unit {unit!r}")
    return number * factor


def _csv_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """The CSV header and rows of an ncu log, without ncu's own and the application's lines.

    Every field ncu writes is quoted, so CSV records are the lines that start with '"';
    ``==PROF==``, ``==WARNING==`` and program output do not.
    """
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(lines))
    for i, row in enumerate(rows):
        if "ID" in row and "Kernel Name" in row:
            return row, [r for r in rows[i + 1:] if len(r) == len(row)]
    return [], []


def _launch(row: dict[str, str], metrics: dict[str, tuple[str, str]]) -> KernelLaunch:
    """One launch from its identity columns and {metric: (value, unit)}."""
    launch_id = int(row["ID"])
    duration = metrics.get(DURATION_METRIC) or metrics.get(DURATION_LABEL)
    duration_ns = _scaled(*duration, _TIME_NS, DURATION_METRIC) if duration else None
    if duration_ns is None:
        raise ValueError(f"ncu output has no {DURATION_METRIC} value for launch ID {launch_id}")
    read, write = metrics.get(DRAM_READ_METRIC), metrics.get(DRAM_WRITE_METRIC)
    name = row["Kernel Name"]
    return KernelLaunch(
        name=name,
        duration_ns=duration_ns,
        dram_read_bytes=_scaled(*read, _BYTES, DRAM_READ_METRIC) if read else None,
        dram_write_bytes=_scaled(*write, _BYTES, DRAM_WRITE_METRIC) if write else None,
        grid=row.get("Grid Size") or None,
        block=row.get("Block Size") or None,
        launch_id=launch_id,
        helper=is_helper_kernel(name),
    )


def parse_ncu_csv(text: str) -> list[KernelLaunch]:
    """Launches from ncu ``--csv`` output of the raw page or the details page.

    Raw page: one row per launch, one column per metric, and a units row under the
    header. Details page: one row per (launch, metric) with "Metric Name", "Metric
    Unit" and "Metric Value" columns. Returns [] when ncu profiled no kernel.
    """
    header, rows = _csv_rows(text)
    records = [dict(zip(header, r)) for r in rows]
    if not records:
        return []
    if "Metric Name" in header:
        launches: dict[int, dict[str, str]] = {}
        metrics: dict[int, dict[str, tuple[str, str]]] = {}
        for rec in records:
            launch_id = int(rec["ID"])
            launches.setdefault(launch_id, rec)
            metrics.setdefault(launch_id, {})[rec["Metric Name"]] = (
                rec["Metric Value"], rec.get("Metric Unit", ""))
        return [_launch(launches[i], metrics[i]) for i in sorted(launches)]
    units: dict[str, str] = {}
    if not records[0]["ID"].strip():  # the raw page's units row
        units = records.pop(0)
    metric_columns = [c for c in header if c in (DURATION_METRIC, DRAM_READ_METRIC, DRAM_WRITE_METRIC)]
    parsed = [_launch(rec, {c: (rec[c], units.get(c, "")) for c in metric_columns}) for rec in records]
    return sorted(parsed, key=lambda la: la.launch_id)


def read_ncu_log(log_file: Path) -> list[KernelLaunch]:
    """The launches in the log ``build_ncu_command`` wrote; none if ncu wrote no log."""
    return parse_ncu_csv(log_file.read_text(errors="replace")) if log_file.exists() else []


def ncu_summary(launches: Iterable[KernelLaunch], spec_bandwidth_tbs: float | None) -> dict:
    """Total DRAM traffic and the bandwidth it achieved over the kernels' GPU time.

    ``spec_bandwidth_tbs`` is the architecture's peak DRAM bandwidth in TB/s; with it
    the achieved bandwidth is also given as a percent of that peak.
    """
    measured = [la for la in launches if not la.helper]
    gpu_time_ns = sum(la.duration_ns for la in measured)
    reads = [la.dram_read_bytes for la in measured if la.dram_read_bytes is not None]
    writes = [la.dram_write_bytes for la in measured if la.dram_write_bytes is not None]
    dram_bytes = sum(reads) + sum(writes) if reads or writes else None
    # bytes per ns is GB/s; / 1000 gives TB/s
    achieved_tbs = dram_bytes / gpu_time_ns / 1e3 if dram_bytes is not None and gpu_time_ns > 0 else None
    return {
        "kernel_launches": len(measured),
        "gpu_time_ns": gpu_time_ns,
        "dram_read_bytes": sum(reads) if reads else None,
        "dram_write_bytes": sum(writes) if writes else None,
        "dram_bytes": dram_bytes,
        "achieved_bandwidth_tbs": achieved_tbs,
        "peak_bandwidth_tbs": spec_bandwidth_tbs,
        "pct_of_peak_bandwidth": (100.0 * achieved_tbs / spec_bandwidth_tbs
                                  if achieved_tbs is not None and spec_bandwidth_tbs else None),
    }

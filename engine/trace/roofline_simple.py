"""Magpie's compact per-stage table ``<stage>_ISL<i>_OSL<o>_CONC<c>_kernel_roofline_simple.csv``
(spec §5.5 step 4): one row per ``unified_perf_summary.csv`` row, in its order, with the op's
parameters taken from the matching row of a roofline sheet (``GEMM.csv``, ``SDPA_fwd.csv``, ...).

Input is a stage's CSV folder as TraceLens writes it (ours or TraceLens's own), read with the
csv module; cells are copied as text, only ``kernel_time_ms_sum`` is computed (µs / 1000, six
significant digits). Without a GPU arch the unified sheet has no roofline columns, and the three
``roofline_*`` / ``pct_roofline_mean`` columns are left out (18 columns instead of 21).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

SIMPLE_COLUMNS = (
    "source_category", "op_name", "param_signature", "operation_count", "num_kernels", "kernel_time_ms_sum",
    "time_pct", "kernel_time_us_mean", "gflops", "data_moved_mb", "arithmetic_intensity_flops_per_byte",
    "achieved_tflops_mean", "achieved_tbps_mean", "compute_spec", "roofline_bound", "pct_roofline_mean",
    "roofline_time_us", "has_perf_model", "params_json", "input_dims", "input_type",
)
# Output column <- unified_perf_summary column, for the plain copies.
_COPIED = {
    "source_category": "op category", "op_name": "name", "operation_count": "operation_count",
    "time_pct": "Percentage (%)", "kernel_time_us_mean": "Kernel Time (µs)_mean", "gflops": "GFLOPS",
    "data_moved_mb": "Data Moved (MB)", "arithmetic_intensity_flops_per_byte": "FLOPS/Byte",
    "achieved_tflops_mean": "TFLOPS/s_mean", "achieved_tbps_mean": "TB/s_mean", "compute_spec": "Compute Spec",
    "roofline_bound": "Roofline Bound", "pct_roofline_mean": "Pct Roofline_mean",
    "roofline_time_us": "Roofline Time (µs)_first", "has_perf_model": "has_perf_model",
    "input_dims": "Input Dims", "input_type": "Input type",
}
_ARCH_ONLY = ("roofline_bound", "pct_roofline_mean", "roofline_time_us")
# Sheets that are not per-family roofline tables.
GENERIC_SHEETS = frozenset({"gpu_timeline.csv", "ops_summary.csv", "ops_summary_by_category.csv",
                            "ops_unique_args.csv", "unified_perf_summary.csv"})
_PARAM = "param: "


def sanitise_name_value(value: Any) -> str:
    """A value as it goes into the file name: '.' -> 'p', other non-alphanumerics dropped,
    missing or empty -> 'unknown' (``0.8`` -> ``0p8``)."""
    text = "" if value is None else str(value).strip()
    text = re.sub(r"[^A-Za-z0-9]+", "", text.replace(".", "p"))
    return text or "unknown"


def simple_csv_name(stage: str, isl: Any, osl: Any, conc: Any) -> str:
    dims = "_".join(f"{key}{sanitise_name_value(v)}" for key, v in (("ISL", isl), ("OSL", osl), ("CONC", conc)))
    return f"{stage}_{dims}_kernel_roofline_simple.csv"


def _normalise(label: str) -> str:
    """Sheet name or op category as a match key: lower case, no trailing ``_fwd``, alphanumerics
    only (``Normalization_fwd`` -> ``normalization``; ``NORM_fwd`` -> ``norm``, so they differ)."""
    text = label.strip().lower()
    if text.endswith("_fwd"):
        text = text[:-4]
    return re.sub(r"[^a-z0-9]+", "", text)


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _ms(us: str | None) -> str:
    if not us:
        return ""
    try:
        return f"{float(us) / 1000.0:.6g}"
    except ValueError:
        return ""


def write_roofline_simple(stage_dir: Path | str, out_path: Path | str) -> Path:
    """Write the compact table for the stage folder ``stage_dir`` to ``out_path``.

    Matching a unified row to a roofline-sheet row: rows of every sheet but the generic five are
    keyed by (normalised sheet name, ``name``); a unified row takes, and uses up, the first row
    with key (normalised ``op category``, ``name``), else the only row left with that ``name``,
    else nothing (empty parameters). The two lookups are used up independently, as in Magpie, so
    a row taken by key can still be the name fallback of a later row. ``param_signature`` and
    ``params_json`` are therefore best effort for ops with several shapes.
    """
    stage = Path(stage_dir)
    columns, unified = _read(stage / "unified_perf_summary.csv")
    by_key: dict[tuple[str, str], list[dict[str, str]]] = {}
    by_name: dict[str, list[dict[str, str]]] = {}
    for sheet in sorted(stage.glob("*.csv")):
        if sheet.name in GENERIC_SHEETS:
            continue
        fields, rows = _read(sheet)
        if not any(f.startswith(_PARAM) for f in fields):
            continue
        for row in rows:
            name = row.get("name", "")
            by_key.setdefault((_normalise(sheet.stem), name), []).append(row)
            by_name.setdefault(name, []).append(row)

    out_columns = [c for c in SIMPLE_COLUMNS if c not in _ARCH_ONLY or _COPIED[c] in columns]
    out_rows: list[dict[str, str]] = []
    for row in unified:
        name = row.get("name", "")
        keyed = by_key.get((_normalise(row.get("op category", "")), name))
        named = by_name.get(name)
        match = keyed.pop(0) if keyed else named.pop(0) if named is not None and len(named) == 1 else None
        params = {k[len(_PARAM):]: v for k, v in (match or {}).items() if k.startswith(_PARAM) and v}
        simple = {c: row.get(src, "") for c, src in _COPIED.items()}
        simple.update({
            "param_signature": ",".join(f"{k}={v}" for k, v in params.items()),
            "num_kernels": match.get("num_kernels", "") if match else "",
            "kernel_time_ms_sum": _ms(row.get("Kernel Time (µs)_sum", "")),
            "params_json": json.dumps(params, sort_keys=True, separators=(",", ":")) if params else "",
        })
        out_rows.append({c: simple[c] for c in out_columns})

    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=out_columns)  # csv's default \r\n, as Magpie writes it
        writer.writeheader()
        writer.writerows(out_rows)
    return path

"""Datasheet specs of the GPUs the workbench knows, for rooflines and L2 flushing.

Conventions, held by every entry:

* ``peak_tflops`` holds DENSE peaks (no 2:4 sparsity), in TFLOP/s (TOP/s for int8).
  Where a datasheet only prints sparse figures we halve them and say so in ``sources``.
* ``fp32`` is the plain (non-tensor) FP32 rate on NVIDIA and the vector FP32 rate on AMD;
  ``tf32`` is the tensor/matrix TF32 rate.
* ``fp64`` is the vector (non-tensor) rate; ``fp64_tensor`` is the tensor-core (NVIDIA)
  or matrix-core (AMD) FP64 rate, which DGEMM-like kernels can reach.
* ``l2_cache_mb`` is the last on-chip cache level a cache-flush buffer must exceed: L2
  on NVIDIA, the Infinity Cache (MALL) on MI300-class and later.
* ``memory_bw_tbs`` is the datasheet HBM/GDDR bandwidth in TB/s (10^12 bytes/s).
* ``measured`` holds ceilings measured on real hardware, keyed ``memory_bw_tbs`` or by
  a dtype name; ``measured_sources`` says where each came from.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

DTYPES: tuple[str, ...] = ("fp64", "fp64_tensor", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4")

# Spellings used by torch, triton, numpy and people, mapped to the keys of peak_tflops.
_DTYPE_ALIASES: dict[str, str] = {
    **{a: "fp64" for a in ("fp64", "float64", "double", "f64")},
    **{a: "fp64_tensor" for a in ("fp64_tensor", "fp64_matrix", "dgemm")},
    **{a: "fp32" for a in ("fp32", "float32", "float", "f32", "single")},
    **{a: "tf32" for a in ("tf32", "tensorfloat32", "tensor_float32", "xf32")},
    **{a: "fp16" for a in ("fp16", "float16", "half", "f16")},
    **{a: "bf16" for a in ("bf16", "bfloat16")},
    **{
        a: "fp8"
        for a in (
            "fp8", "float8", "e4m3", "e5m2", "fp8_e4m3", "fp8_e5m2", "float8_e4m3fn",
            "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "fp8e4nv", "fp8e5",
            "fp8e4b8", "fp8e5b16",
        )
    },
    **{a: "int8" for a in ("int8", "i8", "s8")},
    **{a: "fp4" for a in ("fp4", "float4", "e2m1", "fp4_e2m1", "float4_e2m1fn_x2", "nvfp4", "mxfp4")},
}


def canonical_dtype(dtype: str) -> str | None:
    """The peak_tflops key for a dtype spelling ("torch.bfloat16" -> "bf16"), or None."""
    key = dtype.strip().lower().removeprefix("torch.").replace("-", "_")
    return _DTYPE_ALIASES.get(key)


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    key: str
    name: str
    vendor: str  # "nvidia" | "amd" ("" for a user file that does not say)
    arch: str  # "sm_90", "gfx942", ...
    memory_bw_tbs: float
    peak_tflops: dict[str, float]
    memory_gb: float | None = None
    l2_cache_mb: float | None = None
    sources: dict[str, str] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    measured_sources: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # names nvidia-smi / amd-smi / rocminfo / torch print

    def peak_tflops_for(self, dtype: str) -> float | None:
        """Dense datasheet peak for a dtype in any common spelling; None if unknown/unsupported."""
        key = canonical_dtype(dtype)
        return self.peak_tflops.get(key) if key else None

    def ceiling_tflops_for(self, dtype: str) -> float | None:
        """Measured ceiling for the dtype when one is recorded, else the datasheet peak."""
        key = canonical_dtype(dtype)
        if key is None:
            return None
        return self.measured.get(key, self.peak_tflops.get(key))

    def ceiling_bandwidth_tbs(self) -> float:
        """Measured memory bandwidth when recorded, else the datasheet figure."""
        return self.measured.get("memory_bw_tbs", self.memory_bw_tbs)

    def ridge_point(self, dtype: str, *, measured: bool = False) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound.

        TFLOP/s divided by TB/s is FLOP/byte. ``measured=True`` pairs the measured ceilings
        (falling back to datasheet values one by one) instead of the two datasheet figures.
        """
        if measured:
            flops, bw = self.ceiling_tflops_for(dtype), self.ceiling_bandwidth_tbs()
        else:
            flops, bw = self.peak_tflops_for(dtype), self.memory_bw_tbs
        return flops / bw if flops is not None and bw > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["aliases"] = list(self.aliases)
        return out


_HOPPER_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5 column, dense)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (prints sparse tensor figures; dense = sparse/2)"
_CDNA3_WP = "AMD CDNA 3 architecture whitepaper / AMD Instinct MI300X data sheet"
_CDNA4_WP = "AMD CDNA 4 architecture whitepaper / AMD Instinct MI355X data sheet (256 CU x 2.4 GHz)"


def _nvidia(**kw: Any) -> ArchSpec:
    return ArchSpec(vendor="nvidia", **kw)


def _amd(**kw: Any) -> ArchSpec:
    return ArchSpec(vendor="amd", **kw)


_SPECS: tuple[ArchSpec, ...] = (
    _nvidia(
        key="A100",
        name="NVIDIA A100 SXM4 80GB",
        arch="sm_80",
        memory_gb=80,
        memory_bw_tbs=2.039,
        l2_cache_mb=40,
        peak_tflops={
            "fp64": 9.7, "fp64_tensor": 19.5, "fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312, "int8": 624,
        },
        sources={
            "peak_tflops": "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB; dense, sparse figures not used)",
            "memory_bw_tbs": "NVIDIA A100 datasheet, A100 80GB SXM: 2,039 GB/s",
            "l2_cache_mb": "NVIDIA A100 Tensor Core GPU Architecture whitepaper: 40 MB L2",
        },
        aliases=("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB", "A100 SXM"),
    ),
    _nvidia(
        key="H100",
        name="NVIDIA H100 SXM5 80GB",
        arch="sm_90",
        memory_gb=80,
        memory_bw_tbs=3.35,
        l2_cache_mb=50,
        peak_tflops={
            "fp64": 33.5, "fp64_tensor": 66.9, "fp32": 66.9, "tf32": 494.7,
            "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9, "int8": 1978.9,
        },
        sources={
            "peak_tflops": _HOPPER_WP,
            "memory_bw_tbs": "NVIDIA H100 datasheet, H100 SXM: 3.35 TB/s",
            "l2_cache_mb": "Hopper whitepaper: 50 MB L2",
        },
        aliases=("NVIDIA H100 80GB HBM3", "H100 SXM", "H100 SXM5", "NVIDIA H100 SXM5 80GB", "NVIDIA H100"),
    ),
    _nvidia(
        key="H100-PCIe",
        name="NVIDIA H100 PCIe 80GB",
        arch="sm_90",
        memory_gb=80,
        memory_bw_tbs=2.0,
        l2_cache_mb=50,
        peak_tflops={
            "fp64": 25.6, "fp64_tensor": 51.2, "fp32": 51.2, "tf32": 378,
            "fp16": 756, "bf16": 756, "fp8": 1513, "int8": 1513,
        },
        sources={
            "peak_tflops": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 PCIe column, dense); "
            "agrees with the H100 datasheet's PCIe sparse figures halved",
            "memory_bw_tbs": "NVIDIA H100 datasheet, H100 PCIe: 2 TB/s",
            "l2_cache_mb": "Hopper whitepaper: 50 MB L2",
        },
        aliases=("NVIDIA H100 PCIe", "H100 PCIe"),
    ),
    _nvidia(
        key="H200",
        name="NVIDIA H200 SXM 141GB",
        arch="sm_90",
        memory_gb=141,
        memory_bw_tbs=4.8,
        l2_cache_mb=50,
        peak_tflops={
            "fp64": 33.5, "fp64_tensor": 66.9, "fp32": 66.9, "tf32": 494.7,
            "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9, "int8": 1978.9,
        },
        sources={
            "peak_tflops": f"{_H200_DS}; the decimals are the {_HOPPER_WP} values, the same GH100 configuration",
            "memory_bw_tbs": "NVIDIA H200 datasheet, H200 SXM: 4.8 TB/s",
            "l2_cache_mb": "Hopper whitepaper: 50 MB L2 (same GH100 die as H100)",
        },
        measured={"memory_bw_tbs": 4.3, "bf16": 788.0},
        measured_sources={
            "memory_bw_tbs": "device-to-device copy, bytes read + written; "
            "measured on a lent NVIDIA H200, torch 2.11, 2026-10-28",
            "bf16": "dense bf16 matmul on random data; measured on a lent NVIDIA H200, torch 2.11, 2026-10-28",
        },
        aliases=("NVIDIA H200", "H200 SXM", "NVIDIA H200 141GB HBM3e"),
    ),
    _nvidia(
        key="B200",
        name="NVIDIA B200 (HGX B200, 1000 W)",
        arch="sm_100",
        memory_gb=180,
        memory_bw_tbs=8.0,
        l2_cache_mb=126,
        peak_tflops={
            "fp64": 40, "fp64_tensor": 40, "fp32": 80, "tf32": 1100,
            "fp16": 2250, "bf16": 2250, "fp8": 4500, "int8": 4500, "fp4": 9000,
        },
        sources={
            "peak_tflops": "NVIDIA HGX B200 datasheet, per GPU (prints sparse tensor figures; dense = sparse/2)",
            "memory_bw_tbs": "NVIDIA HGX B200 datasheet: 8 TB/s per GPU",
            "memory_gb": "NVIDIA HGX B200 datasheet: 1,440 GB HBM3e per 8 GPUs",
            "l2_cache_mb": "not in the datasheet; 126 MB as the CUDA device query and Chips and Cheese's "
            "B200 article report",
        },
        aliases=("NVIDIA B200",),
    ),
    _nvidia(
        key="L40S",
        name="NVIDIA L40S 48GB",
        arch="sm_89",
        memory_gb=48,
        memory_bw_tbs=0.864,
        l2_cache_mb=96,
        peak_tflops={"fp64": 1.43, "fp32": 91.6, "tf32": 183, "fp16": 362.05, "bf16": 362.05, "fp8": 733, "int8": 733},
        sources={
            "peak_tflops": "NVIDIA L40S datasheet (prints dense and sparse; dense used); "
            "fp64 is not in the datasheet: Ada runs FP64 at 1/64 of FP32, 91.6/64",
            "memory_bw_tbs": "NVIDIA L40S datasheet: 864 GB/s GDDR6",
            "l2_cache_mb": "AD102 full-die L2 (96 MB); an upper bound, which is what a flush buffer needs",
        },
        aliases=("NVIDIA L40S",),
    ),
    _amd(
        key="MI250X",
        name="AMD Instinct MI250X (one GCD)",
        arch="gfx90a",
        memory_gb=64,
        memory_bw_tbs=1.6384,
        l2_cache_mb=8,
        peak_tflops={"fp64": 23.95, "fp64_tensor": 47.85, "fp32": 23.95, "fp16": 191.5, "bf16": 191.5, "int8": 191.5},
        sources={
            "peak_tflops": "AMD Instinct MI250X data sheet halved: the runtime shows each of the two GCDs as "
            "its own device (220 CU x 1.7 GHz per package; fp32 is vector, packed FP32 doubles it)",
            "memory_bw_tbs": "AMD Instinct MI250X data sheet, 3.2768 TB/s per package, halved per GCD",
            "l2_cache_mb": "AMD CDNA 2 whitepaper: 8 MB L2 per GCD, no Infinity Cache",
        },
        aliases=("AMD Instinct MI250X",),
    ),
    _amd(
        key="MI300X",
        name="AMD Instinct MI300X 192GB",
        arch="gfx942",
        memory_gb=192,
        memory_bw_tbs=5.3,
        l2_cache_mb=256,
        peak_tflops={
            "fp64": 81.7, "fp64_tensor": 163.4, "fp32": 163.4, "tf32": 653.7,
            "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9, "int8": 2614.9,
        },
        sources={
            "peak_tflops": f"{_CDNA3_WP} (304 CU x 2.1 GHz; dense; fp32 vector = fp32 matrix)",
            "memory_bw_tbs": "AMD Instinct MI300X data sheet: 5.3 TB/s",
            "l2_cache_mb": "256 MB AMD Infinity Cache (MALL), the last level; L2 is 4 MB per XCD",
        },
        aliases=("AMD Instinct MI300X", "Instinct MI300X"),
    ),
    _amd(
        key="MI325X",
        name="AMD Instinct MI325X 256GB",
        arch="gfx942",
        memory_gb=256,
        memory_bw_tbs=6.0,
        l2_cache_mb=256,
        peak_tflops={
            "fp64": 81.7, "fp64_tensor": 163.4, "fp32": 163.4, "tf32": 653.7,
            "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9, "int8": 2614.9,
        },
        sources={
            "peak_tflops": "AMD Instinct MI325X data sheet: same CDNA 3 compute as MI300X (304 CU x 2.1 GHz)",
            "memory_bw_tbs": "AMD Instinct MI325X data sheet: 6 TB/s HBM3E",
            "l2_cache_mb": "256 MB AMD Infinity Cache (MALL), the last level; L2 is 4 MB per XCD",
        },
        aliases=("AMD Instinct MI325X",),
    ),
    _amd(
        key="MI355X",
        name="AMD Instinct MI355X 288GB",
        arch="gfx950",
        memory_gb=288,
        memory_bw_tbs=8.0,
        l2_cache_mb=256,
        peak_tflops={
            "fp64": 78.6, "fp64_tensor": 78.6, "fp32": 157.3, "fp16": 2516.6, "bf16": 2516.6,
            "fp8": 5033.2, "int8": 5033.2, "fp4": 10066.3,
        },
        sources={
            "peak_tflops": f"{_CDNA4_WP}; dense; CDNA 4 has no TF32 matrix path, so tf32 is absent",
            "memory_bw_tbs": "AMD Instinct MI355X data sheet: 8 TB/s HBM3E",
            "l2_cache_mb": "256 MB AMD Infinity Cache (MALL), the last level; L2 is 4 MB per XCD",
        },
        aliases=("AMD Instinct MI355X",),
    ),
)

ARCH_SPECS: dict[str, ArchSpec] = {s.key: s for s in _SPECS}

# Which spec an arch alone stands for: the most common part of that generation.
_ARCH_DEFAULTS: dict[str, str] = {
    "sm_80": "A100", "sm_89": "L40S", "sm_90": "H100", "sm_100": "B200",
    "gfx90a": "MI250X", "gfx942": "MI300X", "gfx950": "MI355X",
}


def _normalize_name(text: str) -> str:
    s = re.sub(r"[\s_\-/]+", " ", text.strip().lower())
    s = re.sub(r"^(nvidia |amd )?(instinct )?", "", s)
    # SR-IOV guests print "MI300X VF"; the silicon is the same.
    return re.sub(r" (vf|oam)$", "", s).strip()


def normalize_arch(text: str) -> str | None:
    """Canonical arch: "sm_90a", "SM90", "compute_90" -> "sm_90"; "gfx942:xnack-" -> "gfx942"; else None."""
    s = text.strip().lower()
    m = re.fullmatch(r"(?:sm|compute)_?(\d{2,3})[a-z]?", s)
    if m:
        return f"sm_{m.group(1)}"
    m = re.fullmatch(r"(gfx[0-9a-f]{3,4})(?::.*)?", s)
    return m.group(1) if m else None


_BY_NAME: dict[str, ArchSpec] = {
    _normalize_name(n): s for s in _SPECS for n in (s.key, s.name, *s.aliases)
}


def get_arch_spec(query: str) -> ArchSpec | None:
    """Spec for a key ("h200"), a printed product name ("NVIDIA H100 80GB HBM3",
    "AMD Instinct MI300X VF") or an arch ("gfx942", "sm_90"); None when unknown.

    Names are matched exactly (after case/punctuation folding), never fuzzily: a
    near-miss such as "H100 NVL" has different peaks, and a wrong roofline is worse
    than none.
    """
    if not query or not query.strip():
        return None
    spec = _BY_NAME.get(_normalize_name(query))
    if spec is not None:
        return spec
    arch = normalize_arch(query)
    return ARCH_SPECS.get(_ARCH_DEFAULTS.get(arch, "")) if arch else None


_REQUIRED = ("memory_bw_tbs", "peak_tflops")
_STR_FIELDS = ("key", "name", "vendor", "arch")
_NUM_FIELDS = ("memory_bw_tbs", "memory_gb", "l2_cache_mb")
_DICT_STR_FIELDS = ("sources", "measured_sources")


def _positive(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _bad_field(p: Path, field_name: str, expected: str, got: Any) -> ValueError:
    return ValueError(f"{p}: field '{field_name}': expected {expected}, got {got!r}")


def _read_json_object(p: Path) -> dict[str, Any]:
    """The JSON object in ``p``; ValueError when it cannot be read, is not JSON or is not an object."""
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{p}: cannot read arch spec file: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a JSON object with ArchSpec fields, got {type(data).__name__}")
    return data


def _check_spec_fields(p: Path, data: dict[str, Any]) -> None:
    """Field names (no unknown ones, the required ones present) and the types of every field but the dtype
    tables, which :func:`_dtype_table` checks as it reads them."""
    known = {f.name for f in fields(ArchSpec)}
    for name in data:
        if name not in known:
            raise ValueError(f"{p}: field '{name}': unknown field; expected one of {', '.join(sorted(known))}")
    for name in _REQUIRED:
        if name not in data:
            raise ValueError(f"{p}: field '{name}': required but missing")

    for name in _STR_FIELDS:
        if name in data and not isinstance(data[name], str):
            raise _bad_field(p, name, "a string", data[name])
    if "vendor" in data and data["vendor"] not in ("nvidia", "amd"):
        raise _bad_field(p, "vendor", '"nvidia" or "amd"', data["vendor"])
    for name in _NUM_FIELDS:
        if name in data and not _positive(data[name]):
            raise _bad_field(p, name, "a positive number", data[name])

    for name in _DICT_STR_FIELDS:
        table = data.get(name, {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise _bad_field(p, name, "an object of strings", table)
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise _bad_field(p, "aliases", "a list of strings", aliases)


def _dtype_table(p: Path, data: dict[str, Any], name: str, extra_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """Field ``name`` as a dtype -> positive number table with canonical dtype keys (``extra_keys`` kept as
    they are); ``peak_tflops`` must not be empty."""
    table = data.get(name, {})
    if not isinstance(table, dict) or (name == "peak_tflops" and not table):
        raise _bad_field(p, name, "a non-empty object of dtype -> number", table)
    out: dict[str, float] = {}
    for k, v in table.items():
        canon = k if k in extra_keys else canonical_dtype(k)
        if canon is None:
            raise _bad_field(p, f"{name}.{k}", f"a dtype key, one of {', '.join(DTYPES + extra_keys)}", k)
        if not _positive(v):
            raise _bad_field(p, f"{name}.{k}", "a positive number", v)
        out[canon] = float(v)
    return out


def load_arch_spec_file(path: str | Path) -> ArchSpec:
    """Read a user's ArchSpec JSON (same fields as ArchSpec; memory_bw_tbs and
    peak_tflops required). Raises ValueError naming the file, the field and what
    was expected."""
    p = Path(path)
    data = _read_json_object(p)
    _check_spec_fields(p, data)
    key = str(data.get("key", p.stem))
    return ArchSpec(
        key=key,
        name=str(data.get("name", key)),
        vendor=data.get("vendor", ""),
        arch=data.get("arch", ""),
        memory_bw_tbs=float(data["memory_bw_tbs"]),
        peak_tflops=_dtype_table(p, data, "peak_tflops"),
        memory_gb=data.get("memory_gb"),
        l2_cache_mb=data.get("l2_cache_mb"),
        sources=dict(data.get("sources", {})),
        measured=_dtype_table(p, data, "measured", ("memory_bw_tbs",)),
        measured_sources=dict(data.get("measured_sources", {})),
        aliases=tuple(data.get("aliases", [])),
    )

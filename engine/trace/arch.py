"""GPU arch dicts in TraceLens's ``--gpu_arch_json_path`` format (tracelens-reference §4.11).

The dict has ``name``, ``mem_bw_gbps`` (decimal GB/s) and ``max_achievable_tflops`` keyed
``<matrix|vector>_<fp16|bf16|fp32|fp64|fp8|int8|fp4|fp6>``; the roofline of the perf report reads
``max_achievable_tflops[Compute Spec]`` and ``mem_bw_gbps``, nothing else.

``arch_from_spec`` builds such a dict from our own ``engine.hw.specs.ArchSpec`` the way the golden
``H200.json`` was made from the datasheet:

* ``matrix_fp16/bf16/fp8/int8/fp4`` = the dense tensor-core peak of that dtype;
* ``matrix_fp32`` = the plain (non-tensor) fp32 peak, because PyTorch leaves TF32 matmul off by
  default, so an fp32 GEMM runs at the fp32 rate, not the tf32 one;
* ``matrix_fp64`` = the tensor/matrix-core fp64 peak (``fp64_tensor``), else plain fp64;
* ``vector_fp32`` / ``vector_fp64`` = the non-tensor fp32 / fp64 peaks;
* ``vector_fp16`` / ``vector_bf16`` = 2 x ``vector_fp32`` (packed half-precision math), as the
  golden H200.json does; no datasheet prints a separate non-tensor half rate.

With ``measured=True`` the measured ceilings of the spec (``ArchSpec.measured``) replace the
datasheet figures where one is recorded, which is what TraceLens's own (AMD) arch files hold.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from engine.hw.specs import ArchSpec, get_arch_spec

MAF_KEYS = tuple(f"{kind}_{p}" for kind in ("matrix", "vector")
                 for p in ("fp16", "bf16", "fp32", "fp64", "fp8", "int8", "fp4", "fp6"))


def _positive(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def validate_arch(data: Any, where: str = "arch") -> dict:
    """Check a TraceLens arch dict; raise ValueError naming ``where`` and the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if "mem_bw_gbps" not in data:
        raise ValueError(f"{where}: field 'mem_bw_gbps': required but missing")
    if not _positive(data["mem_bw_gbps"]):
        raise ValueError(f"{where}: field 'mem_bw_gbps': expected a positive number, got {data['mem_bw_gbps']!r}")
    maf = data.get("max_achievable_tflops")
    if not isinstance(maf, dict) or not maf:
        raise ValueError(f"{where}: field 'max_achievable_tflops': expected a non-empty object of "
                         f"'<matrix|vector>_<dtype>' -> TFLOP/s, got {maf!r}")
    for key, value in maf.items():
        if not isinstance(key, str) or not key.startswith(("matrix_", "vector_")):
            raise ValueError(f"{where}: field 'max_achievable_tflops.{key}': expected a key like "
                             f"'matrix_bf16' or 'vector_fp32'")
        if not _positive(value):
            raise ValueError(f"{where}: field 'max_achievable_tflops.{key}': expected a positive number, "
                             f"got {value!r}")
    if "name" in data and not isinstance(data["name"], str):
        raise ValueError(f"{where}: field 'name': expected a string, got {data['name']!r}")
    return data


def load_arch_json(path: str | Path) -> dict:
    """Read a TraceLens arch JSON file (``_reference`` and other extra keys are kept, as TraceLens
    ignores them). Errors name the file and the field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{p}: cannot read arch file: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: not valid JSON: {exc}") from exc
    return validate_arch(data, str(p))


def arch_from_spec(spec: ArchSpec, *, measured: bool = False) -> dict:
    """The TraceLens arch dict for one of our ArchSpecs (see the module docstring for the mapping)."""
    def peak(key: str) -> float | None:
        if measured and key in spec.measured:
            return spec.measured[key]
        return spec.peak_tflops.get(key)

    maf: dict[str, float] = {}
    for dtype in ("fp16", "bf16", "fp8", "int8", "fp4"):
        v = peak(dtype)
        if v is not None:
            maf[f"matrix_{dtype}"] = v
    fp32, fp64, fp64_tensor = peak("fp32"), peak("fp64"), peak("fp64_tensor")
    if fp32 is not None:
        maf["matrix_fp32"] = fp32  # TF32 matmul is off by default in PyTorch
        maf["vector_fp32"] = fp32
        maf["vector_fp16"] = 2 * fp32  # packed half math, as the golden H200.json
        maf["vector_bf16"] = 2 * fp32
    if fp64_tensor is not None or fp64 is not None:
        maf["matrix_fp64"] = fp64_tensor if fp64_tensor is not None else fp64  # type: ignore[assignment]
    if fp64 is not None:
        maf["vector_fp64"] = fp64
    bw_tbs = spec.ceiling_bandwidth_tbs() if measured else spec.memory_bw_tbs
    out: dict[str, Any] = {"name": spec.key, "mem_bw_gbps": bw_tbs * 1000.0, "max_achievable_tflops": maf}
    if spec.memory_gb is not None:
        out["memory_gb"] = spec.memory_gb
    out["_reference"] = ("measured ceilings where recorded, else datasheet peaks" if measured
                         else "datasheet dense peaks (engine.hw.specs), not measured ceilings")
    return out


def resolve_arch(value: str | Path | dict | None, trace: Any = None, *, measured: bool = False) -> dict | None:
    """The arch for a ``--gpu-arch NAME|FILE.json`` option.

    A dict is validated and returned; a path to an existing file (or a value ending in ``.json``) is
    read with ``load_arch_json``; any other string is looked up with ``get_arch_spec`` (unknown names
    raise ValueError). Without a value, the trace's ``deviceProperties[0].name`` is looked up; an
    unknown or missing device gives None, and the report then has no roofline columns.
    """
    if isinstance(value, dict):
        return validate_arch(value)
    if value is not None and str(value).strip():
        text = str(value).strip()
        p = Path(text)
        if text.endswith(".json") or p.is_file():
            return load_arch_json(p)
        spec = get_arch_spec(text)
        if spec is None:
            raise ValueError(f"--gpu-arch {text!r}: unknown GPU name and not a JSON file")
        return arch_from_spec(spec, measured=measured)
    if trace is None:
        return None
    props = trace.device_properties() if hasattr(trace, "device_properties") else []
    if props and isinstance(props[0], dict):
        name = props[0].get("name")
        if isinstance(name, str):
            spec = get_arch_spec(name)
            if spec is not None:
                return arch_from_spec(spec, measured=measured)
    return None

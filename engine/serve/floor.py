"""The ``floor`` of a built-in server benchmark report: the weight-read time of one decode step
on the GPU that ran it (``engine.serve.shapes.decode_floor``) and the measured TPOT against it.
No torch import: the benchmark process calls this after the server is gone."""

from __future__ import annotations

from typing import Any, Optional

from engine.serve.shapes import PRESETS, decode_floor


def _arch_spec(gpu_arch: Optional[str]) -> Any:
    from engine.hw.specs import get_arch_spec
    if gpu_arch:
        return get_arch_spec(gpu_arch)
    from engine.hw.detect import detect_gpu
    info = detect_gpu()
    return info.spec if info is not None else None


def builtin_floor(size: str, gpu_arch: Optional[str] = None, tpot_median_ms: Optional[float] = None) -> dict[str, Any]:
    """The report's ``floor`` section for preset ``size`` (bf16 on a GPU): bytes read per decode
    step, the bandwidth used (the arch spec's measured ceiling when recorded, else its datasheet
    figure; ``gpu_arch`` or the detected GPU), the floor in ms and ``tpot_over_floor``."""
    config = PRESETS.get(size)
    if config is None:
        return {"error": f"unknown built-in model {size!r}"}
    spec = _arch_spec(gpu_arch)
    out = decode_floor(config, spec.ceiling_bandwidth_tbs() if spec is not None else None)
    out["gpu"] = spec.key if spec is not None else None
    out["bandwidth_source"] = None if spec is None else (
        "measured" if "memory_bw_tbs" in spec.measured else "datasheet")
    if spec is None:
        out["note"] = "no GPU arch spec (CPU run, or an unknown GPU: give --gpu-arch)"
    out["tpot_median_ms"] = tpot_median_ms
    out["tpot_over_floor"] = (round(tpot_median_ms / out["ms_per_step"], 2)
                              if tpot_median_ms and out["ms_per_step"] else None)
    return out

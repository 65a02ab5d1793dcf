"""Bound and % of roofline for the rows of the loop's bottleneck table.

A row's work is summed over the calls the trace recorded: for a registry op, from the arguments
each call carried (``magpie_args::`` spans: shapes, dtypes, and the values of small integer
tensors such as cu_seqlens and lengths), with the op's own count of FLOPs and bytes below; for
any other op, from its top-level torch op and that op's recorded input shapes through the trace
analysis's perf models (``engine.trace.perf_models``, TraceLens's). The ceilings are the GPU's
(``engine.hw.specs``, named by the trace's ``deviceProperties``): the least time a call can
take is max(FLOPs / peak, bytes / bandwidth); ``roofline_pct`` is that least time over the
measured one, ``bound`` which of the two terms is larger. A CPU trace, an unknown GPU or a row
whose calls carry no usable shapes gets none, with the reason.
"""

from __future__ import annotations

import json
from math import prod
from typing import Any, Optional

_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "int64": 8, "int32": 4,
          "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
_PRECISION = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
              "float64": "fp64"}
# Registry ops whose FLOPs run on the matrix units (tl.dot / SDPA); the others are vector math.
_MATRIX_OPS = ("attention", "decode_attention")


class Work:
    """FLOPs and bytes of one call, and the compute ceiling that applies (``matrix_bf16``...)."""

    __slots__ = ("flops", "bytes", "spec")

    def __init__(self, flops: float, nbytes: float, spec: Optional[str]) -> None:
        self.flops, self.bytes, self.spec = flops, nbytes, spec


def _tensor(arg: dict) -> tuple[list[int], int, Optional[str]]:
    return arg["shape"], _BYTES.get(arg.get("dtype", ""), 0), _PRECISION.get(arg.get("dtype", ""))


def registry_work(op: str, args: list[dict]) -> Optional[Work]:
    """The work of one registry call from its recorded arguments; None when they do not say enough."""
    try:
        first, e, prec = _tensor(args[0]) if op != "rotary" else _tensor(args[1])
        spec = f"{'matrix' if op in _MATRIX_OPS else 'vector'}_{prec}" if prec else None
        if op == "rmsnorm":  # read x and the weight, write the output
            t, h = prod(first[:-1]), first[-1]
            return Work(4.0 * t * h, e * (2 * t * h + h), spec)
        if op == "activation":  # read [T, 2I], write [T, I]
            t, i = prod(first[:-1]), first[-1] // 2
            return Work(5.0 * t * i, 3.0 * e * t * i, spec)
        if op == "rotary":  # q and k read and written, positions and one float32 cos/sin row per token
            (t, hq, d), (_, hkv, _) = args[1]["shape"], args[2]["shape"]
            return Work(3.0 * t * (hq + hkv) * d, 2.0 * e * t * (hq + hkv) * d + t * (8 + 4 * d), spec)
        if op == "attention":
            return _varlen_work(args, e, spec)
        if op == "decode_attention":
            (b, hq, d), (_, _, hkv, _) = first, args[1]["shape"]
            lengths = args[4].get("values")
            if lengths is None:
                return None
            ctx = float(sum(lengths))
            return Work(4.0 * ctx * hq * d, e * (2.0 * ctx * hkv * d + 2.0 * b * hq * d), spec)
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return None


def _varlen_work(args: list[dict], e: int, spec: Optional[str]) -> Optional[Work]:
    (t, hq, d), (s, hkv, _) = args[0]["shape"], args[1]["shape"]
    cu_q, cu_k = args[3].get("values"), args[4].get("values")
    if cu_q is None or cu_k is None or len(cu_q) != len(cu_k):
        return None
    pairs = 0.0  # (query, key) pairs a causal, bottom-right aligned mask lets through
    for i in range(len(cu_q) - 1):
        sq, sk = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        pairs += sq * (sk - sq) + sq * (sq + 1) / 2
    return Work(4.0 * pairs * hq * d, e * (2.0 * t * hq * d + 2.0 * s * hkv * d), spec)


# Top-level ops the trace's perf models do not list under this name: ``aten::linear`` is x @ W^T.
_ALIASES = {"aten::linear": "vllm::rocm_unquantized_gemm"}


def op_work(name: str, args: dict, kernel_names: tuple[str, ...] = ()) -> Optional[Work]:
    """The work of one torch op from its trace args (TraceLens's perf models); None when unmodelled."""
    from engine.trace.perf_models import OpView, model_class
    cls = model_class(_ALIASES.get(name, name))
    if cls is None:
        return None
    try:
        model = cls(OpView(name, args, kernel_names))
        flops, nbytes = model.flops(), model.bytes()
        spec = model.compute_spec()
    except Exception:  # a model that cannot read these args: no roofline for this call
        return None
    if flops is None or nbytes is None:
        return None
    return Work(float(flops), float(nbytes), spec)


def arch_of_trace(data: dict) -> Optional[dict]:
    """The TraceLens arch dict of the trace's first device (engine.hw.specs), or None."""
    from engine.hw.specs import get_arch_spec
    from engine.trace.arch import arch_from_spec
    props = data.get("deviceProperties") or []
    name = props[0].get("name") if props and isinstance(props[0], dict) else None
    spec = get_arch_spec(name) if isinstance(name, str) else None
    return arch_from_spec(spec) if spec is not None else None


def row_roofline(works: list[tuple[Work, int, float]], arch: Optional[dict]) -> dict[str, Any]:
    """``bound``, ``roofline_pct`` and the row's achieved rates from (work per call, calls, time us)."""
    if arch is None:
        return {"bound": None, "roofline_pct": None, "roofline_note": "no GPU ceilings (a CPU trace or an unknown GPU)"}
    peaks, bw = arch.get("max_achievable_tflops") or {}, float(arch["mem_bw_gbps"]) * 1e9
    flops = nbytes = compute_s = memory_s = time_us = 0.0
    for w, calls, t in works:
        peak = peaks.get(w.spec) if w.spec else None
        if peak is None or calls <= 0 or t <= 0:
            continue
        flops, nbytes, time_us = flops + w.flops * calls, nbytes + w.bytes * calls, time_us + t
        compute_s += w.flops * calls / (peak * 1e12)
        memory_s += w.bytes * calls / bw
    if time_us <= 0:
        return {"bound": None, "roofline_pct": None, "roofline_note": "no call of this row has shapes a perf model reads"}
    least_us = max(compute_s, memory_s) * 1e6
    return {"bound": "compute" if compute_s >= memory_s else "memory", "roofline_pct": round(100.0 * least_us / time_us, 1),
            "tflops_s": round(flops / time_us / 1e6, 3), "tb_s": round(nbytes / time_us / 1e6, 3),
            "roofline_time_us": round(least_us, 3), "modelled_time_us": round(time_us, 3)}


def works_of(call_args: dict[str, list], op_calls: dict[str, list], registry: Optional[str]) -> list[tuple[Work, int, float]]:
    """(work, calls, time) per recorded argument set of a row: registry args or top-level op args."""
    out = []
    if registry is not None:
        for key, (calls, t) in call_args.items():
            w = registry_work(registry, json.loads(key))
            if w is not None:
                out.append((w, calls, t))
        return out
    for key, (calls, t) in op_calls.items():
        name, args = json.loads(key)
        w = op_work(name, args)
        if w is not None:
            out.append((w, calls, t))
    return out

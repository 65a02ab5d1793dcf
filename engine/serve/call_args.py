"""The arguments of a registry call, recorded in the profiled trace and read back by the loop.

While the engine profiles, each registry call opens a zero-length ``record_function`` named
``magpie_args::<args>`` at its start (inside its ``magpie_kernel::<key>`` span), ``<args>`` in a
quote-free form because the profiler writes annotation names into its JSON trace unescaped:
``bfloat16[16,2048];int32[3]=0,5,9;s=1e-05`` -- tensors as dtype and shape (with the values of
small integer ones, such as cu_seqlens), scalars after ``s=``. The optimization loop's harness
rebuilds the call from it (engine.loop.bottlenecks, engine.loop.harness). No torch import here:
the workbench reads traces through this module.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

ARGS_ANNOTATION = "magpie_args::"
MAX_VALUES = 256  # integer tensors up to this many elements carry their values


def describe_args(args: Sequence[Any]) -> str:
    out: list[str] = []
    for a in args:
        if hasattr(a, "shape") and hasattr(a, "dtype") and hasattr(a, "is_floating_point"):
            item = f"{str(a.dtype).removeprefix('torch.')}[{','.join(str(d) for d in a.shape)}]"
            if not a.is_floating_point() and a.numel() <= MAX_VALUES:
                item += "=" + ",".join(str(int(v)) for v in a.flatten().tolist())
            out.append(item)
        elif isinstance(a, (bool, int, float)):
            out.append(f"s={a!r}")
        else:
            out.append(f"?{type(a).__name__}")
    return ";".join(out)


def _scalar(text: str) -> Optional[object]:
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return None


def parse_call_args(text: str) -> Optional[list[dict]]:
    """What describe_args wrote, as [{"shape", "dtype"[, "values"]} | {"scalar"} | {"type"}];
    None when the text is not that form."""
    out: list[dict] = []
    for item in text.split(";") if text else []:
        if item.startswith("s="):
            value = _scalar(item[2:])
            if value is None:
                return None
            out.append({"scalar": value})
            continue
        if item.startswith("?"):
            out.append({"type": item[1:]})
            continue
        head, _, values = item.partition("=")
        dtype, bracket, dims = head.partition("[")
        if not bracket or not dims.endswith("]"):
            return None
        try:
            arg: dict = {"shape": [int(d) for d in dims[:-1].split(",") if d], "dtype": dtype}
            if values:
                arg["values"] = [int(v) for v in values.split(",")]
        except ValueError:
            return None
        out.append(arg)
    return out

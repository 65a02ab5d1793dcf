"""The Python harness for PyTorch and Triton kernels that follow the KernelBench convention:
a module defining ``Model`` (or ``ModelNew``), ``get_inputs()`` and ``get_init_inputs()``.

It runs in a child process (``python -m engine.kernels.harness SPEC.json``) so that a
crash, a hang or a CUDA error in user code cannot take the run down with it, and so the
run's timeout and cancel apply to it like to any other command.

Correctness: for each seed, fresh random inputs; the reference (a reference module, or
the baseline's saved outputs) and the kernel run on clones of the same inputs; every
``torch.empty*`` the kernel allocates is poisoned with NaN (integers: their max) so an
output element the kernel never writes cannot pass; outputs are compared with
dtype-aware tolerances, and a non-finite value where the reference is finite fails.

Timing: device events around each call on a GPU (warm-up, L2 flushed between
repeats, optional CUDA-graph replay), ``time.perf_counter`` on the CPU.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

# (rtol, atol) by dtype name. Float32 allows re-associated reductions; half types their
# own rounding; integers and bools must match exactly.
DEFAULT_TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
    "float8_e4m3fn": (1.25e-1, 1e-1),
    "float8_e5m2": (2.5e-1, 1e-1),
}


def module_convention(path: Path) -> dict:
    """Which harness names a source file defines, read without importing it."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return {"names": sorted(names)}


def follows_convention(path: Path, get_inputs: str = "get_inputs", model_class: str | None = None) -> bool:
    names = set(module_convention(path).get("names", []))
    classes = {model_class} if model_class else {"Model", "ModelNew"}
    return get_inputs in names and bool(names & classes)


# ----------------------------------------------------------------------------- child side

def _load_module(path: str, name: str):
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _pick_class(module, requested: str | None):
    if requested:
        if not hasattr(module, requested):
            raise AttributeError(f"{module.__file__} defines no class {requested!r}")
        return getattr(module, requested)
    for name in ("ModelNew", "Model"):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"{module.__file__} defines neither ModelNew nor Model")


def _map_tensors(obj: Any, fn: Callable) -> Any:
    import torch
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _flatten(obj: Any, prefix: str = "out") -> list[tuple[str, Any]]:
    import torch
    if isinstance(obj, torch.Tensor) or not isinstance(obj, (list, tuple, dict)):
        return [(prefix, obj)]
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    out: list[tuple[str, Any]] = []
    for k, v in items:
        out.extend(_flatten(v, f"{prefix}[{k!r}]" if isinstance(obj, dict) else f"{prefix}[{k}]"))
    return out


def _poison_(t) -> None:
    import torch
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(True)
        elif t.numel():
            t.fill_(torch.iinfo(t.dtype).max)


@contextlib.contextmanager
def poisoned_allocations(device):
    """Fill every tensor the kernel allocates with ``torch.empty*`` with NaN (or int max),
    and on a GPU first dirty the caching allocator's free blocks the same way."""
    import torch
    if device.type == "cuda":
        free = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        if free > 0:
            block = torch.empty(free // 4, dtype=torch.float32, device=device)
            block.fill_(float("nan"))
            del block
    names = ("empty", "empty_like", "empty_strided")
    originals = {n: getattr(torch, n) for n in names}
    orig_new_empty = torch.Tensor.new_empty

    def wrap(fn):
        def poisoned(*args, **kwargs):
            t = fn(*args, **kwargs)
            _poison_(t)
            return t
        return poisoned

    try:
        for n in names:
            setattr(torch, n, wrap(originals[n]))
        torch.Tensor.new_empty = wrap(orig_new_empty)
        yield
    finally:
        for n, fn in originals.items():
            setattr(torch, n, fn)
        torch.Tensor.new_empty = orig_new_empty


def _tolerance(dtype_name: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    d_rtol, d_atol = DEFAULT_TOLERANCES.get(dtype_name, (0.0, 0.0))
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


def compare_outputs(ref: Any, out: Any, rtol: float | None, atol: float | None) -> dict:
    """Element-wise ``|out - ref| <= atol + rtol*|ref|`` on every tensor of the output structure."""
    import torch
    ref_items, out_items = _flatten(ref), _flatten(out)
    if len(ref_items) != len(out_items):
        return {"passed": False, "reason": f"output structure differs: {len(out_items)} values, "
                                           f"reference has {len(ref_items)}"}
    tensors = []
    for (name, r), (_, o) in zip(ref_items, out_items):
        if not isinstance(r, torch.Tensor):
            if r != o:
                return {"passed": False, "reason": f"{name}: {o!r} != reference {r!r}"}
            continue
        if not isinstance(o, torch.Tensor):
            return {"passed": False, "reason": f"{name}: got {type(o).__name__}, reference is a tensor"}
        if tuple(o.shape) != tuple(r.shape):
            return {"passed": False, "reason": f"{name}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"}
        if o.dtype != r.dtype:
            return {"passed": False, "reason": f"{name}: dtype {o.dtype} != reference {r.dtype}"}
        dtype_name = str(r.dtype).replace("torch.", "")
        t_rtol, t_atol = _tolerance(dtype_name, rtol, atol)
        o64, r64 = o.detach().to("cpu", torch.float64), r.detach().to("cpu", torch.float64)
        if o.is_complex():
            o64, r64 = torch.view_as_real(o.detach().cpu()).double(), torch.view_as_real(r.detach().cpu()).double()
        ref_finite = torch.isfinite(r64)
        bad_nonfinite = int((ref_finite & ~torch.isfinite(o64)).sum())
        # Where the reference itself is NaN/Inf the output must be the same non-finite value.
        same_nonfinite = (~ref_finite) & ((o64 == r64) | (torch.isnan(o64) & torch.isnan(r64)))
        diff = (o64 - r64).abs()
        close = (diff <= t_atol + t_rtol * r64.abs()) | same_nonfinite
        n_bad = int((~close).sum())
        finite_diff = torch.where(ref_finite & torch.isfinite(o64), diff, torch.zeros_like(diff))
        denom = r64.abs().clamp_min(t_atol if t_atol > 0 else 1e-30)
        rel = torch.where(ref_finite & torch.isfinite(o64), diff / denom, torch.zeros_like(diff))
        ref_norm = float(torch.linalg.vector_norm(torch.where(ref_finite, r64, torch.zeros_like(r64))))
        item = {
            "name": name, "dtype": dtype_name, "shape": list(r.shape), "rtol": t_rtol, "atol": t_atol,
            "max_abs_err": float(finite_diff.max()) if diff.numel() else 0.0,
            "max_rel_err": float(rel.max()) if diff.numel() else 0.0,
            "rel_l2_err": float(torch.linalg.vector_norm(finite_diff)) / ref_norm if ref_norm > 0 else 0.0,
            "mismatches": n_bad, "numel": int(r.numel()), "nonfinite_where_reference_finite": bad_nonfinite,
        }
        if n_bad:
            idx = tuple(int(i) for i in torch.nonzero(~close)[0].tolist())
            item["first_mismatch"] = {"index": list(idx), "value": float(o64[idx]), "reference": float(r64[idx])}
        tensors.append(item)
    failed = [t for t in tensors if t["mismatches"]]
    if failed:
        t = failed[0]
        why = (f"{t['name']}: {t['nonfinite_where_reference_finite']} NaN/Inf where the reference is finite"
               if t["nonfinite_where_reference_finite"] else
               f"{t['name']}: {t['mismatches']}/{t['numel']} elements outside rtol={t['rtol']:g}, "
               f"atol={t['atol']:g} (max abs err {t['max_abs_err']:.3g})")
        return {"passed": False, "reason": why, "tensors": tensors}
    return {"passed": True, "tensors": tensors}


class _Kernel:
    """A module following the convention, instantiated on a device."""

    def __init__(self, spec: dict, device, seed: int, tag: str):
        import torch
        self.module = _load_module(spec["module"], f"_magpie_{tag}")
        self.cls = _pick_class(self.module, spec.get("model_class"))
        self.get_inputs = getattr(self.module, spec.get("get_inputs_func") or "get_inputs", None)
        get_init = getattr(self.module, spec.get("get_init_inputs_func") or "get_init_inputs", None)
        torch.manual_seed(seed)
        init_inputs = get_init() if get_init else []
        self.model = self.cls(*init_inputs)
        if isinstance(self.model, torch.nn.Module):
            self.model = self.model.to(device).eval()

    def __call__(self, inputs):
        import torch
        with torch.no_grad():
            return self.model(*inputs)

    def make_inputs(self, seed: int, device):
        import torch
        if self.get_inputs is None:
            raise AttributeError(f"{self.module.__file__} defines no get_inputs()")
        torch.manual_seed(seed)
        return _map_tensors(list(self.get_inputs()), lambda t: t.to(device))

    def adopt_weights(self, state: dict) -> bool:
        """Load the reference's weights when the parameter layout matches, so a candidate that
        creates its parameters in another order still computes with the same numbers."""
        import torch
        if not isinstance(self.model, torch.nn.Module) or not state:
            return False
        own = self.model.state_dict()
        if set(own) != set(state) or any(own[k].shape != state[k].shape for k in own):
            return False
        self.model.load_state_dict(state)
        return True


def _synchronize(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_kernel(kernel: _Kernel, inputs, device, cfg: dict) -> dict:
    import torch
    requested = cfg.get("repeats")
    fn = lambda: kernel(inputs)  # noqa: E731
    # The first call compiles/loads; it is never timed. Its length sets the default warm-up:
    # slow calls (Triton's CPU interpreter) need few, fast GPU calls more.
    t0 = time.perf_counter()
    fn()
    _synchronize(device)
    first_s = time.perf_counter() - t0
    warmup = int(cfg["warmup"]) if cfg.get("warmup") is not None else (10 if first_s < 0.05 else 2)
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    _synchronize(device)
    est_s = (time.perf_counter() - t0) / warmup if warmup else first_s
    if requested:
        repeats = int(requested)
    elif device.type == "cuda":
        repeats = int(min(1000, max(100, math.ceil(0.5 / max(est_s, 1e-6)))))
    else:
        repeats = int(min(200, max(10, math.ceil(2.0 / max(est_s, 1e-6)))))
    info: dict = {"warmup": warmup, "repeats": repeats, "estimate_ms": est_s * 1e3}
    samples: list[float] = []
    if device.type == "cuda":
        flush = None
        if cfg.get("l2_flush", True):
            props = torch.cuda.get_device_properties(device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            # Twice the last-level cache (MI300's 256 MB Infinity Cache included), at least 256 MB.
            flush = torch.empty(max(2 * l2, 256 << 20), dtype=torch.int8, device=device)
            info["l2_flush_bytes"] = int(flush.numel())
        call = fn
        if cfg.get("cuda_graph"):
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            call = graph.replay
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            if flush is not None:
                flush.zero_()
            starts[i].record()
            call()
            ends[i].record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        info["backend"] = ("harness-hip-events" if torch.version.hip else "harness-cuda-events") + (
            "+graph" if cfg.get("cuda_graph") else "")
        info["l2_flush"] = flush is not None
    else:
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
        info["backend"] = "harness-cpu-perf_counter"
        info["l2_flush"] = False
    info["samples_ms"] = samples
    return info


def _save_reference(path: str, records: dict, state: dict) -> None:
    import torch
    to_cpu = lambda t: t.detach().to("cpu")  # noqa: E731
    torch.save({"seeds": {s: {"inputs": _map_tensors(r["inputs"], to_cpu), "outputs": _map_tensors(r["outputs"], to_cpu)}
                          for s, r in records.items()},
                "state_dict": {k: v.detach().cpu() for k, v in state.items()}}, path)


def run(spec: dict) -> dict:
    result: dict = {"ok": False, "errors": []}
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() and spec.get("device", "auto") != "cpu" else "cpu")
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"  # Triton kernels run in its interpreter on the CPU
    result["device"] = {"type": device.type,
                        "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1"}
    result["versions"] = {"torch": torch.__version__, "hip": torch.version.hip, "cuda": torch.version.cuda}
    try:
        import triton  # noqa: F401
        result["versions"]["triton"] = triton.__version__
    except Exception:
        result["versions"]["triton"] = None

    seeds = [int(s) for s in spec.get("seeds", [0, 1, 2])]
    rtol, atol = spec.get("rtol"), spec.get("atol")
    kernel = _Kernel(spec, device, seeds[0], "kernel")
    correctness: dict = {"checked": False, "passed": None, "seeds": []}
    ref_kernel = None
    saved = None
    if spec.get("reference_data"):
        saved = torch.load(spec["reference_data"], map_location="cpu", weights_only=False)
        correctness["reference"] = "baseline outputs"
        correctness["weights_from_reference"] = kernel.adopt_weights(saved.get("state_dict") or {})
    elif spec.get("reference"):
        ref_kernel = _Kernel(spec["reference"], device, seeds[0], "reference")
        correctness["reference"] = spec["reference"]["module"]
        ref_state = ref_kernel.model.state_dict() if isinstance(ref_kernel.model, torch.nn.Module) else {}
        correctness["weights_from_reference"] = kernel.adopt_weights(ref_state)

    records: dict = {}
    first_inputs = None
    for seed in seeds:
        if saved is not None:
            rec = saved["seeds"].get(seed)
            if rec is None:
                raise KeyError(f"the baseline's saved outputs have no seed {seed}")
            inputs = _map_tensors(rec["inputs"], lambda t: t.to(device))
            ref_out = _map_tensors(rec["outputs"], lambda t: t.to(device))
        elif ref_kernel is not None:
            inputs = ref_kernel.make_inputs(seed, device)
            ref_out = ref_kernel(_map_tensors(inputs, lambda t: t.clone()))
        else:
            inputs = kernel.make_inputs(seed, device)
            ref_out = None
        if first_inputs is None:
            first_inputs = inputs
        with poisoned_allocations(device):
            out = kernel(_map_tensors(inputs, lambda t: t.clone()))
        _synchronize(device)
        entry: dict = {"seed": seed}
        if ref_out is not None:
            cmp = compare_outputs(ref_out, out, rtol, atol)
            entry.update(cmp)
        else:
            # No reference to compare with (this kernel IS the reference): it must at least write
            # every element with finite values and give the same answer twice.
            with poisoned_allocations(device):
                again = kernel(_map_tensors(inputs, lambda t: t.clone()))
            _synchronize(device)
            cmp = compare_outputs(out, again, rtol, atol)
            nonfinite = [n for n, t in _flatten(out) if isinstance(t, torch.Tensor)
                         and (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())]
            entry.update(cmp)
            entry["self_check"] = "finite, fully written, same result on a second run"
            if nonfinite:
                entry["passed"] = False
                entry["reason"] = f"{nonfinite[0]}: NaN/Inf in the output (unwritten elements are poisoned with NaN)"
            elif not cmp["passed"]:
                entry["reason"] = "two runs on the same inputs disagree: " + cmp["reason"]
        records[seed] = {"inputs": inputs, "outputs": out}
        correctness["seeds"].append(entry)
    correctness["checked"] = True
    correctness["passed"] = all(e["passed"] for e in correctness["seeds"])
    correctness["mode"] = "compared with reference" if (saved is not None or ref_kernel is not None) else "self-check"
    result["correctness"] = correctness
    if spec.get("save_reference"):
        state = kernel.model.state_dict() if isinstance(kernel.model, torch.nn.Module) else {}
        _save_reference(spec["save_reference"], records, state)

    timing_cfg = spec.get("timing") or {}
    if timing_cfg.get("enabled") and correctness["passed"]:
        result["timing"] = _time_kernel(kernel, first_inputs, device, timing_cfg)
    result["ok"] = True
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m engine.kernels.harness SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    out_path = Path(spec["result"])
    try:
        result = run(spec)
        code = 0
    except BaseException as exc:  # noqa: BLE001 - report whatever user code raised
        traceback.print_exc()
        result = {"ok": False, "errors": [f"{type(exc).__name__}: {exc}"],
                  "traceback": traceback.format_exc()[-4000:]}
        code = 1
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, out_path)
    return code


if __name__ == "__main__":
    sys.exit(main())

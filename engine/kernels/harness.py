"""What the harness workers share: the module convention (KernelBench's ``Model`` or
``ModelNew``, ``get_inputs()``, ``get_init_inputs()``), output comparison with dtype-aware
tolerances, and the poisoning of fresh allocations.

The workers themselves are in ``engine.kernels.worker`` (the child side) and
``engine.kernels.session`` (the parent that drives them).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field

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


# ----------------------------------------------------------------------------- the load request

class _Spec(BaseModel):
    # One repository writes and reads this across a pipe: an unknown key is a typo or a
    # renamed field on one side only, so it fails on the side that sent it.
    model_config = ConfigDict(extra="forbid")


class KernelModule(_Spec):
    """The module whose class is built and timed (or, with ``function``, whose function is called
    with the inputs: Magpie's ``bench_target``)."""
    module: str
    model_class: Optional[str] = None  # None: ModelNew, else Model
    get_init_inputs_func: Optional[str] = "get_init_inputs"
    function: bool = False  # model_class names a function, called as it is (no init inputs)


class InputsModule(_Spec):
    """The module the inputs (and, first, the init inputs) come from: the reference's for a
    kernel judged against one, else the kernel's own."""
    module: str
    get_inputs_func: Optional[str] = "get_inputs"
    get_init_inputs_func: Optional[str] = "get_init_inputs"


class LoadSpec(_Spec):
    """What a harness worker's ``load`` request carries: written by ``engine.kernels.session``
    (:meth:`for_kernel`, :meth:`fields`), read by ``engine.kernels.worker`` (:meth:`from_request`)."""
    kernel: KernelModule
    inputs: InputsModule
    seeds: list[int] = Field(min_length=1)
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    init_seed: int = 0
    inplace: bool = False  # the kernel writes its inputs on purpose
    share_state: bool = False  # the reference: export its weights for the kernels to adopt
    keep_sets_bytes: Optional[int] = None  # above this, input sets are made again from their seeds

    @classmethod
    def for_kernel(cls, kernel: Any, inputs_from: Any, *, seeds: list[int], device: str = "auto",
                   share_state: bool = False, keep_sets_bytes: Optional[int] = None) -> "LoadSpec":
        """From two ``engine.kernels.plan.KernelSpec``: the kernel, and the one its inputs come from."""
        return cls(kernel=KernelModule(module=str(kernel.module_file), model_class=kernel.model_class,
                                       get_init_inputs_func=kernel.get_init_inputs_func,
                                       function=bool(getattr(kernel, "call_function", False))),
                   inputs=InputsModule(module=str(inputs_from.module_file),
                                       get_inputs_func=inputs_from.get_inputs_func,
                                       get_init_inputs_func=inputs_from.get_init_inputs_func),
                   seeds=list(seeds), device=device, init_seed=seeds[0],
                   inplace=bool(getattr(kernel, "inplace", False)), share_state=share_state,
                   keep_sets_bytes=keep_sets_bytes)

    def fields(self) -> dict:
        """The request's keys (without ``op``), JSON-ready: ``send("load", **spec.fields())``."""
        return self.model_dump(mode="json")

    @classmethod
    def from_request(cls, req: dict) -> "LoadSpec":
        """The worker's side: a request line (``op`` included) validated; a missing or unknown key
        raises :class:`pydantic.ValidationError` naming it."""
        return cls.model_validate({k: v for k, v in req.items() if k != "op"})


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
        # Up to 2 GiB of the allocator's free blocks (the ones a fresh output most likely gets);
        # more could push another worker on the same GPU out of memory.
        free = min(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), 2 << 30)
        if free > 0:
            try:
                block = torch.empty(free // 4, dtype=torch.float32, device=device)
                block.fill_(float("nan"))
                del block
            except torch.OutOfMemoryError:
                pass
    names = ("empty", "empty_like", "empty_strided")
    originals = {n: getattr(torch, n) for n in names}
    orig_new_empty = torch.Tensor.new_empty
    own_new_empty = "new_empty" in vars(torch.Tensor)  # else it lives on the C base class

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
        if own_new_empty:
            torch.Tensor.new_empty = orig_new_empty
        else:
            del torch.Tensor.new_empty


def _tolerance(dtype_name: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    d_rtol, d_atol = DEFAULT_TOLERANCES.get(dtype_name, (0.0, 0.0))
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


# Outputs and inputs are compared a piece of this many bytes (in float64) at a time: a KernelBench
# output of 8 GB would otherwise need several float64 temporaries of twice its size.
CHUNK_BYTES = 64 << 20


def flat_chunks(t, limit: int):
    """``t`` in row-major order as 1-D pieces of at most ``limit`` elements: views where the
    layout allows, else a copy of one piece (never of the whole tensor). Two tensors of one
    shape give pieces of the same lengths, whatever their strides."""
    if t.dim() == 0 or t.numel() <= limit:
        yield t.reshape(-1)
    elif t.dim() == 1:
        for i in range(0, t.shape[0], limit):
            yield t[i:i + limit]
    elif t[0].numel() <= limit:
        step = max(1, limit // t[0].numel())
        for i in range(0, t.shape[0], step):
            yield t[i:i + step].reshape(-1)
    else:
        for i in range(t.shape[0]):
            yield from flat_chunks(t[i], limit)


def _close_stats(o, r, t_rtol: float, t_atol: float, complex_: bool) -> dict:
    """Element statistics of ``o`` against ``r``, in float64 on ``r``'s device, a piece of
    CHUNK_BYTES at a time, so a multi-GB output costs no host memory, no copy off the GPU and
    no temporary of its own size. Complex tensors are compared as their real and imaginary parts
    (indices count both)."""
    import torch
    limit = max(1, CHUNK_BYTES // 8 // (2 if complex_ else 1))
    stats = {"mismatches": 0, "nonfinite": 0, "max_abs": 0.0, "max_rel": 0.0, "sq_err": 0.0, "sq_ref": 0.0,
             "first": None}
    lo = 0
    for o_c, r_c in zip(flat_chunks(o.detach(), limit), flat_chunks(r.detach(), limit)):
        if not r_c.numel():
            continue
        if o_c.device != r_c.device:
            o_c = o_c.to(r_c.device)
        if complex_:
            o_c, r_c = torch.view_as_real(o_c.contiguous()).reshape(-1), torch.view_as_real(r_c.contiguous()).reshape(-1)
        # .to is the tensor itself for float64: nothing below writes into o64 or r64.
        o64, r64 = o_c.to(torch.float64), r_c.to(torch.float64)
        del o_c, r_c
        ref_finite = torch.isfinite(r64)
        out_finite = torch.isfinite(o64)
        nonfinite = (ref_finite & ~out_finite).sum()
        diff = torch.sub(o64, r64).abs_()
        tol = r64.abs().mul_(t_rtol).add_(t_atol)
        close = diff <= tol
        del tol
        # Where the reference itself is NaN/Inf the output must be the same non-finite value.
        close |= (~ref_finite) & ((o64 == r64) | (torch.isnan(o64) & torch.isnan(r64)))
        bad = close.logical_not_()
        n_bad = bad.sum()
        fdiff = diff.masked_fill_(~(ref_finite & out_finite), 0.0)
        del out_finite
        max_abs = fdiff.max()
        denom = r64.abs().clamp_min_(t_atol if t_atol > 0 else 1e-30)
        max_rel = torch.div(fdiff, denom, out=denom).max()
        del denom
        sq_err = fdiff.square_().sum()
        del fdiff
        sq_ref = r64.masked_fill(~ref_finite, 0.0).square_().sum()
        # One transfer to the host per piece (counts are exact in float64 up to 2**53).
        v = torch.stack([nonfinite.double(), n_bad.double(), max_abs, max_rel, sq_err, sq_ref]).tolist()
        stats["nonfinite"] += int(v[0])
        stats["max_abs"] = max(stats["max_abs"], v[2])
        stats["max_rel"] = max(stats["max_rel"], v[3])
        stats["sq_err"] += v[4]
        stats["sq_ref"] += v[5]
        if v[1] and stats["first"] is None:
            i = int(torch.nonzero(bad)[0])
            stats["first"] = (lo + i, float(o64[i]), float(r64[i]))
        stats["mismatches"] += int(v[1])
        lo += r64.numel()
        del o64, r64, ref_finite, bad
    return stats


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
        st = _close_stats(o, r, t_rtol, t_atol, o.is_complex())
        item = {
            "name": name, "dtype": dtype_name, "shape": list(r.shape), "rtol": t_rtol, "atol": t_atol,
            "max_abs_err": st["max_abs"], "max_rel_err": st["max_rel"],
            "rel_l2_err": (st["sq_err"] ** 0.5) / (st["sq_ref"] ** 0.5) if st["sq_ref"] > 0 else 0.0,
            "mismatches": st["mismatches"], "numel": int(r.numel()),
            "nonfinite_where_reference_finite": st["nonfinite"],
        }
        if st["first"] is not None:
            flat_i, val, refv = st["first"]
            if o.is_complex():
                flat_i //= 2
            idx = [int(v) for v in torch.unravel_index(torch.tensor(flat_i), tuple(r.shape))] if r.dim() else []
            item["first_mismatch"] = {"index": idx, "value": val, "reference": refv}
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



"""A harness worker: one process per kernel, driven by ``engine.kernels.session``.

``python -m engine.kernels.worker READ_FD WRITE_FD SCRATCH_DIR`` reads one JSON request a line
from READ_FD and answers each with one JSON line on WRITE_FD; the kernel's own prints go to
the log files that are its stdout and stderr.

What makes its numbers hard to game:
* the clocks, event and profiler APIs are bound here, before any user module is imported,
  and a kernel whose code replaces them (or a torch function, or the input functions) is
  rejected by name;
* inputs come from the reference's ``get_inputs`` under seeds the kernel does not know,
  generated before the kernel's module is imported;
* every call gets its own inputs: a copy of one of several input sets, sparsely perturbed
  with a fresh seed and placed at an address no earlier call saw, so no two calls see the same
  values or pointers; which set, which perturbation and which call of a round is judged are
  drawn from the operating system's random source (nothing in this process can predict them),
  the last after the call returned, and the judged call's outputs and inputs are copied at
  once, so a kernel cannot tell afterwards which call was judged and repair it;
* outputs and inputs are judged in the reference's worker, a process the kernel never ran in
  (``engine.kernels.tensor_share``);
* on a GPU the default timer reads every kernel the call put on any stream from the device
  trace (CUPTI / roctracer through torch.profiler), not only the launching stream's events.
"""

from __future__ import annotations

import os as _os  # noqa: I001
import sys as _sys

# ``-m`` put the working directory first on the import path: a kernel folder's copy.py would be
# imported by torch as the standard ``copy``. It comes back (first) when the kernel's modules are
# loaded, after torch and the standard library are in.
_WORKDIR_ON_PATH = bool(_sys.path) and _sys.path[0] in ("", _os.getcwd())
if _WORKDIR_ON_PATH:
    _sys.path.pop(0)

# Bound first: nothing a kernel module does later can change what these names refer to.
import time as _time_module  # noqa: E402

_perf_counter = _time_module.perf_counter
_monotonic = _time_module.monotonic
_setaffinity = getattr(_os, "sched_setaffinity", None)  # Linux: the timed calls' CPU (_pin_timing_thread)

import contextlib  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
import weakref  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Optional  # noqa: E402

import torch  # noqa: E402

from engine.kernels import tensor_share  # noqa: E402
from engine.kernels.harness import (  # noqa: E402
    CHUNK_BYTES, LoadSpec, _flatten, _load_module, _map_tensors, _pick_class, compare_outputs, flat_chunks,
    poisoned_allocations,
)
from engine.kernels.harness import _tolerance as _default_tolerance  # noqa: E402
from engine.kernels.input_variants import (  # noqa: E402
    DISTRIBUTIONS, any_redrawable, keep_half_, redraw_, variant_seed,
)

_HAS_CUDA = torch.cuda.is_available()
if _HAS_CUDA:
    _Event = torch.cuda.Event
    _event_record = torch.cuda.Event.record
    _event_elapsed = torch.cuda.Event.elapsed_time
    _cuda_sync = torch.cuda.synchronize
    _gpu_spin = getattr(torch.cuda, "_sleep", None)  # a kernel that spins for a number of cycles
    from torch.profiler import ProfilerActivity as _Activity
    from torch.profiler import profile as _profile
    from torch.profiler import record_function as _record_function
_clone = torch.Tensor.clone
# Draws a kernel cannot predict: it runs in this process and could copy a seeded generator's
# state (found through gc or a frame) to learn which calls are judged.
_secure_random = random.SystemRandom()


AUDIT_BATCH_BYTES = 1 << 30


def _make_serializer():
    """JSON text of a reply through the C encoder, built now, before any kernel is imported: it
    keeps its own references to the functions it calls, so a kernel that later rewrites
    json.dumps or json.JSONEncoder cannot change what reaches the judge."""
    from json import encoder as _enc
    make = getattr(_enc, "c_make_encoder", None)
    if make is None:  # a Python without the C accelerator: the module function, bound now
        dumps = json.dumps
        return lambda obj: dumps(obj, default=str)
    c_encode = make(None, str, _enc.encode_basestring_ascii, None, ": ", ", ", False, False, True)
    join = "".join
    return lambda obj: join(c_encode(obj, 0))


_serialize = _make_serializer()

# What a kernel must not replace: the clocks and event APIs the harness times with, the
# profiler, and the public functions of torch (a kernel that swaps torch.softmax for its own
# would change the reference it is judged against).
_CLOCK_NAMES = ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
                "process_time", "sleep")


def _watch_table(extra_modules: list) -> dict[str, Any]:
    import time
    table: dict[str, Any] = {f"time.{n}": getattr(time, n) for n in _CLOCK_NAMES if hasattr(time, n)}
    spaces: list[tuple[str, Any]] = [("torch", torch), ("torch.nn.functional", torch.nn.functional),
                                     ("torch.Tensor", torch.Tensor), ("torch.linalg", torch.linalg)]
    if _HAS_CUDA:
        spaces += [("torch.cuda", torch.cuda), ("torch.cuda.Event", torch.cuda.Event)]
        import torch.profiler as tprof
        spaces.append(("torch.profiler", tprof))
    # The replies to the judge are serialized by json: a kernel that rewrote json.dumps could
    # shrink its own samples on their way out.
    spaces += [("json", json), ("json.JSONEncoder", json.JSONEncoder)]
    # Which calls are judged comes from the OS: the draws' functions must stay the harness's.
    spaces += [("random", random), ("random.SystemRandom", random.SystemRandom)]
    spaces += extra_modules
    for prefix, space in spaces:
        for name, obj in list(vars(space).items()):
            if name.startswith("__") or isinstance(obj, type(sys)):
                continue
            if callable(obj) or isinstance(obj, (staticmethod, classmethod)):
                table[f"{prefix}.{name}"] = obj
    me = sys.modules[__name__]
    for name in ("_perf_counter", "_monotonic", "_Event", "_event_record", "_event_elapsed", "_cuda_sync",
                 "_profile", "_record_function", "_clone", "_time_call", "_before_gpu_call", "_device_spans",
                 "_gpu_spin", "_secure_random", "_discover_kernels", "kernel_set_check", "_draw_call"):
        if hasattr(me, name):
            table[f"{__name__}.{name}"] = getattr(me, name)
    return table


_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def _torch_own_wrapper(new: Any, old: Any) -> bool:
    """torch wraps some of its own functions when a submodule loads (torch._dynamo wraps
    torch.manual_seed, for one): a wrapper whose code lives in torch and unwraps to the original."""
    import inspect
    try:
        code_file = getattr(getattr(new, "__code__", None), "co_filename", "") or ""
        return inspect.unwrap(new) is old and str(Path(code_file).resolve()).startswith(_TORCH_DIR)
    except Exception:
        return False


def _tampered(before: dict[str, Any], extra_modules: list) -> list[str]:
    now = _watch_table(extra_modules)
    changed = [k for k, v in before.items() if k in now and now[k] is not v and not _torch_own_wrapper(now[k], v)]
    # A new attribute on torch.Tensor shadows the C base class's method of that name.
    base = vars(torch._C.TensorBase)
    changed += [k for k in now if k not in before and k.startswith("torch.Tensor.")
                and k.split(".")[-1] in base]
    return sorted(set(changed))


def _tensors(obj: Any) -> list:
    return [t for _, t in _flatten(obj) if isinstance(t, torch.Tensor)]


def _storage_span(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def perturb_(inputs: list, seed: int) -> None:
    """Give a clone of an input set values no earlier call saw: about one element in 1024 of each
    contiguous floating-point tensor takes the value of another element of the same tensor
    (the distribution is kept; integer and boolean tensors, often indices, are left alone)."""
    g = torch.Generator().manual_seed(seed)
    for t in _tensors(inputs):
        if not (t.is_floating_point() and t.is_contiguous() and t.numel() > 1):
            continue
        n = t.numel()
        m = max(1, n >> 10)
        dst = torch.unique(torch.randint(0, n, (m,), generator=g))
        src = torch.randint(0, n, (dst.numel(),), generator=g)
        flat = t.view(-1)
        with torch.no_grad():
            flat[dst.to(t.device)] = flat[src.to(t.device)].clone()


def _same_bits(a, b) -> bool:
    """Equal element for element (NaN where the other has NaN), a piece at a time: the
    temporaries of a whole multi-GB tensor (or of a copy to another device) would not fit."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    floating = a.is_floating_point() or a.is_complex()
    limit = max(1, CHUNK_BYTES // max(1, a.element_size()))
    for x, y in zip(flat_chunks(a, limit), flat_chunks(b, limit)):
        if y.device != x.device:
            y = y.to(x.device)
        same = x == y
        if floating:
            same |= torch.isnan(x) & torch.isnan(y)
        if not bool(same.all()):
            return False
    return True


def _all_finite(t) -> bool:
    limit = max(1, CHUNK_BYTES // max(1, t.element_size()))
    return all(bool(torch.isfinite(c).all()) for c in flat_chunks(t, limit))


def _abs_max(t) -> float:
    """``float(t.abs().max())`` a piece at a time (NaN if any element is NaN)."""
    limit = max(1, CHUNK_BYTES // max(1, t.element_size()))
    values = [float(c.abs().max()) for c in flat_chunks(t, limit) if c.numel()]
    return float("nan") if any(v != v for v in values) else max(values, default=0.0)


def _mean(t) -> float:
    """``float(t.double().mean())``, in float64 a piece at a time when ``t`` is large."""
    limit = max(1, CHUNK_BYTES // 8)
    if t.numel() <= limit:
        return float(t.double().mean())
    return sum(float(c.double().sum()) for c in flat_chunks(t, limit)) / t.numel()


def _like(t, value):
    """``torch.full_like(t, value)`` without the memory: one element, expanded to t's shape."""
    return torch.full((), value, dtype=t.dtype, device=t.device).expand(t.shape)


def _sync(device) -> None:
    if device.type == "cuda":
        _cuda_sync(device)


class Worker:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.device = torch.device("cpu")
        self.sets: list[list] = []
        self.set_meta: list[dict] = []
        self.main_sets: list[int] = []
        self.ref_outputs: dict[int, Any] = {}
        self.held: dict[int, dict] = {}
        self.next_handle = 1
        # The output tensors of recent calls (weakly: an honest kernel's die with the call) and the
        # first call that returned one of them again: a cache, whose values belong to other inputs.
        self.returned: list[weakref.ref] = []
        self.reuse_error: Optional[str] = None
        self.model_state_ids: Optional[set[int]] = None
        self.calls_seen = 0
        self.model: Any = None
        self.watch: dict[str, Any] = {}
        self.watch_modules: list = []
        self.threads_before: set[int] = set()
        self.flush = None
        self.flush_sink = 0
        # Every input tensor's address so far, and the shift of the next copy: a call's inputs sit
        # where no earlier call's did, so a cache keyed by pointer never hits.
        self.seen_addresses: set[int] = set()
        self.address_shift = 0
        self.addresses_reused = 0
        self.pinned_cpu: Optional[int] = None  # where a CPU kernel's timed calls run (_pin_timing_thread)
        self.graph = None
        self.inplace = False
        self.state_files: list[str] = []  # the reference's weights, shared with the others
        # Main input sets too large to keep (several GB each, KernelBench's sizes) are made again
        # from their seeds whenever a call needs one: on a GPU that costs what a clone costs.
        self.regen: Optional[tuple] = None  # (get_inputs, made on the device)
        self.set_seeds: dict[int, int] = {}
        # Copies of the first main set redrawn from other distributions, judged in correctness
        # only: index -> (the main set's index, distribution, seed). Kept like the main sets when
        # they all fit the keep limit, else made again whenever a request needs one.
        self.variants: dict[int, tuple[int, str, int]] = {}
        self.variants_kept = True
        self.main_bytes = 0
        self.out_bytes = 0  # one call's outputs, once a call has run
        # Above this (all main sets' inputs, or the reference's outputs on them), nothing is kept
        # between requests: made again from seeds, computed again. None: keep everything.
        self.keep_limit: Optional[int] = None
        self.outputs_dropped: set[int] = set()  # sets whose reference outputs are computed again
        self.sleep_cycles = 0  # a spin kernel before the start event hides the host's dispatch
        self.audit: Optional[tuple] = None  # (inputs, index, perturb) of the next clock-audit call
        self.audit_done: Optional[tuple] = None
        self.audit_spin: Optional[int] = None
        self.discovery_kernels: Optional[dict[str, int]] = None  # what one traced call launches

    # ----------------------------------------------------------------- helpers
    def _call(self, inputs):
        with torch.no_grad():
            return self.model(*inputs)

    def _note_reuse(self, out, what: str) -> None:
        """Record (once) a call that returned a tensor object an earlier call returned. The harness
        drops every output it does not keep, so only the kernel can hold one alive: it is
        answering from a cache (values computed for other inputs) or handing back a buffer the
        next call overwrites. Checked outside the timed window."""
        self.calls_seen += 1
        if self.model_state_ids is None:  # the module's own parameters and buffers may be returned as they are
            module = self.model if isinstance(self.model, torch.nn.Module) else None
            self.model_state_ids = ({id(t) for t in module.parameters()} | {id(t) for t in module.buffers()}
                                    if module is not None else set())
        tensors = [t for _, t in _flatten(out) if isinstance(t, torch.Tensor) and id(t) not in self.model_state_ids]
        if self.reuse_error is None and self.returned:
            ids = {id(t) for t in tensors}
            if any(ref() is not None and id(ref()) in ids for ref in self.returned):
                self.reuse_error = (f"{what} (call {self.calls_seen}) returned a tensor object an earlier call returned: "
                                    "outputs must be computed for each call's inputs (a cache, or a buffer the next "
                                    "call overwrites)")
        self.returned = [r for r in self.returned if r() is not None][-63:] + [weakref.ref(t) for t in tensors]

    def _pristine(self, index: int) -> list:
        """Input set ``index`` as made; a new copy when sets are made again, else the kept one
        (never hand that to a kernel: use ``_fresh``)."""
        if index in self.variants and self.sets[index] is None:
            return self._make_variant(index)
        if self.regen is None or index not in self.set_seeds:
            return self.sets[index]
        fn, on_device = self.regen
        torch.manual_seed(self.set_seeds[index])
        try:
            if on_device:
                with torch.device(self.device):
                    return self._on_device(fn())
            return self._on_device(fn())
        finally:
            torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    def _fresh(self, index: int, perturb: Optional[int], moved: bool = True) -> list:
        """A copy of input set ``index`` (perturbed) for one call, every tensor at an address no
        earlier call's inputs had (``moved``; the judge's own copies, never handed to a kernel
        under test, are plain clones: a set made again from its seed is not copied twice)."""
        if self.regen is not None and index in self.set_seeds:
            inputs = self._pristine(index)  # made anew: already a copy
            if moved:  # one tensor at a time, each original let go: such a set takes GBs
                for i in range(len(inputs)):
                    inputs[i] = _map_tensors(inputs[i], self._at_new_address)
        else:
            inputs = _map_tensors(self.sets[index], self._at_new_address if moved else _clone)
        if perturb is not None:
            perturb_(inputs, perturb)
        return inputs

    def _at_new_address(self, t):
        """A copy of ``t`` (the layout clone() gives) whose data starts at an address no earlier
        copy's did: the copy sits ``address_shift`` bytes into a buffer of its own, the shift
        growing by 256 bytes a copy (alignment kept for vector loads), so the allocator handing
        back the same block still gives a new pointer; one seen before (the shift wraps at 1 MiB)
        is moved again while its buffer is held, so the next comes from another block."""
        if t.layout != torch.strided or t.is_quantized or t.numel() == 0 or type(t) is not torch.Tensor:
            return _clone(t)
        stride = torch.empty_like(t, device="meta").stride()  # what clone() would give
        extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, stride))
        held = []  # buffers at used addresses, kept until a new one is found
        for _ in range(16):
            self.address_shift = (self.address_shift + 256) % (1 << 20)
            skip = self.address_shift // t.element_size()
            buf = torch.empty(skip + extent, dtype=t.dtype, device=t.device)
            new = buf.as_strided(t.shape, stride, skip)
            if new.data_ptr() not in self.seen_addresses:
                break
            held.append(buf)
        else:
            self.addresses_reused += 1
        self.seen_addresses.add(new.data_ptr())
        new.copy_(t)
        return new

    def _guard_errors(self) -> list[dict]:
        """Guard violations so far, each ``{"guard": name, "message": text}``."""
        errors = []
        bad = _tampered(self.watch, self.watch_modules)
        if bad:
            errors.append({"guard": "tamper", "message": f"tampering: the kernel's code replaced {', '.join(bad[:6])}"
                           + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
                           + " (clocks, event and profiler APIs, torch functions and the input functions "
                           "must stay as the harness found them)"})
        new = [t for t in threading.enumerate() if t.ident not in self.threads_before and t.is_alive()]
        if new:
            errors.append({"guard": "threads", "message": "the kernel started Python threads that outlive its call "
                           f"({', '.join(t.name for t in new)}): work on background threads escapes the timed window"})
        return errors

    def _output_checks(self, out, inputs) -> list[str]:
        errors = []
        for name, t in _flatten(out):
            if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
                errors.append(f"output {name} is a {type(t).__name__}, not a plain torch.Tensor "
                              "(a subclass can defer or fake its values)")
        if not self.inplace:
            spans = [_storage_span(t) for t in _tensors(inputs)]
            for name, t in _flatten(out):
                if not isinstance(t, torch.Tensor) or t.numel() == 0:
                    continue
                lo, hi = _storage_span(t)
                for i, (a, b) in enumerate(spans):
                    if lo < b and a < hi:
                        errors.append(f"output {name} aliases input {i} (its storage overlaps the input's); "
                                      "declare `inplace: true` on the entry if the kernel works in place")
                        break
        return errors

    def kept_bytes(self, device_type: str) -> int:
        """Bytes of the tensors this worker keeps between requests on ``device_type`` (input sets,
        reference outputs, held outputs and inputs, the clock audit's batches, the L2 flush
        buffer, a graph's static buffers), each storage once."""
        graph = list(self.graph[1:]) if self.graph is not None else []
        keep = [self.sets, list(self.ref_outputs.values()), [(e["out"], e["inputs"]) for e in self.held.values()],
                [b[0] for b in self.audit or []], [b[0] for b in self.audit_done or []], self.flush, graph]
        storages = {}
        for t in _tensors(keep):
            if t.device.type == device_type:
                st = t.untyped_storage()
                storages[st.data_ptr()] = st.nbytes()
        return sum(storages.values())

    def _hold(self, out, inputs, meta: dict) -> int:
        h = self.next_handle
        self.next_handle += 1
        self.held[h] = {"out": out, "inputs": inputs, "meta": meta, "files": []}
        return h

    def _export(self, h: int) -> dict:
        e = self.held[h]
        return {"handle": h, **e["meta"], "outputs": tensor_share.export_tree(e["out"], e["files"]),
                "inputs": tensor_share.export_tree(e["inputs"], e["files"])}

    # ----------------------------------------------------------------- operations
    def op_load(self, req: dict) -> dict:
        spec = LoadSpec.from_request(req)
        self.device = torch.device("cuda" if _HAS_CUDA and spec.device != "cpu" else "cpu")
        if self.device.type == "cpu" and "TRITON_INTERPRET" not in os.environ:
            os.environ["TRITON_INTERPRET"] = "1"  # Triton kernels run in its interpreter on the CPU
        if self.device.type == "cpu":
            # One intra-op thread: a multi-threaded op stalls whenever any other process takes a
            # core, which on a small shared machine decides a verdict more than the kernel does.
            torch.set_num_threads(1)
        self.inplace = spec.inplace
        info = self._describe_device()
        if _WORKDIR_ON_PATH and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # the kernel may import modules of its working directory
        in_mod = _load_module(spec.inputs.module, "_magpie_inputs")
        get_inputs = getattr(in_mod, spec.inputs.get_inputs_func or "get_inputs", None)
        if get_inputs is None:
            raise AttributeError(f"{spec.inputs.module} defines no {spec.inputs.get_inputs_func or 'get_inputs'}()")
        # Inputs first, before the kernel's module exists in this process.
        self._make_sets(spec, get_inputs, getattr(in_mod, "get_correctness_inputs", None),
                        tuple(getattr(in_mod, "INPUT_DISTRIBUTIONS", DISTRIBUTIONS)))
        torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self.watch_modules = [(f"inputs module {Path(spec.inputs.module).name}", in_mod)]
        self.watch = _watch_table(self.watch_modules)
        self.threads_before = {t.ident for t in threading.enumerate()}
        self._build_model(spec, in_mod)
        # The generator must not tell the kernel which seeds made its inputs (torch.initial_seed()).
        torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        _settle_heap()  # the imports and the kernel's module are here to stay
        info["n_sets"] = len(self.sets)
        info["set_meta"] = self.set_meta
        info["input_bytes"] = self.main_bytes
        info["input_sets_kept"] = self.regen is None
        info["guard_errors"] = self._guard_errors()
        if spec.share_state and isinstance(self.model, torch.nn.Module):
            info["state"] = tensor_share.export_tree(dict(self.model.state_dict()), self.state_files)
        return info

    def _describe_device(self) -> dict:
        info: dict = {"device": {"type": self.device.type,
                                 "name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
                                 "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1"},
                      "versions": {"torch": torch.__version__, "hip": torch.version.hip, "cuda": torch.version.cuda}}
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            info["l2_bytes"] = int(getattr(props, "L2_cache_size", 0) or 0)
            # Which physical GPU this is (the visibility variables renumber them): the parent reads
            # its SM clock by these (engine.kernels.sm_clock).
            dev = info["device"]
            dev["index"] = self.device.index if self.device.index is not None else torch.cuda.current_device()
            dev["uuid"] = str(props.uuid) if getattr(props, "uuid", None) is not None else None
            if getattr(props, "pci_bus_id", None) is not None:
                dev["pci_bus_id"] = (f"{int(getattr(props, 'pci_domain_id', 0) or 0):04x}:{int(props.pci_bus_id):02x}:"
                                     f"{int(getattr(props, 'pci_device_id', 0) or 0):02x}.0")
        try:
            import triton
            info["versions"]["triton"] = triton.__version__
        except Exception:
            info["versions"]["triton"] = None
        return info

    def _make_sets(self, spec: LoadSpec, get_inputs, more, distributions: tuple = DISTRIBUTIONS) -> None:
        """One main input set per seed (kept, or made again from its seed when all of them would
        take more than ``keep_sets_bytes``: 1/16 of the GPU's memory by default), then the
        extra shapes of ``get_correctness_inputs()``, then the first main set redrawn from each
        of ``distributions`` (engine.kernels.input_variants)."""
        keep_limit = spec.keep_sets_bytes
        if keep_limit is None and os.environ.get("MAGPIE_KEEP_SETS_BYTES"):
            keep_limit = int(os.environ["MAGPIE_KEEP_SETS_BYTES"])
        if keep_limit is None and self.device.type == "cuda":
            keep_limit = torch.cuda.get_device_properties(self.device).total_memory // 16
        self.keep_limit = keep_limit
        for seed in spec.seeds:
            index = len(self.sets)
            self.set_seeds[index] = seed
            self.main_sets.append(index)
            self.set_meta.append({"shape": "main", "distribution": "problem"})
            if self.regen is not None:  # made again from its seed when needed: never made here
                self.sets.append(None)
                continue
            torch.manual_seed(seed)
            made, on_device = self._make(get_inputs)
            if index == 0:  # no floating-point data to redraw (indices only): no variant sets
                distributions = distributions if any_redrawable(made) else ()
            self.main_bytes = self.main_bytes or _nbytes(made)
            if on_device and keep_limit is not None and _nbytes(made) * len(spec.seeds) > keep_limit:
                self.regen = (get_inputs, on_device)
                made = None  # one set alive at a time: those of KernelBench take GBs each
            self.sets.append(made)
        if self.regen is not None:
            for i in self.main_sets:
                self.sets[i] = None
        if more is not None:
            torch.manual_seed(spec.seeds[0])
            for i, extra in enumerate(self._make(more)[0]):
                self.sets.append(self._on_device(extra))
                self.set_meta.append({"shape": f"extra {i}", "distribution": "problem"})
        self._add_variants(spec.seeds[0], distributions)

    def _add_variants(self, seed: int, distributions: tuple) -> None:
        """The variant sets: kept when they fit the keep limit beside the main sets, made again
        from the first set's seed when the main sets are, else made for each request that uses
        one (``_variant_held``): never more memory kept than the main sets alone would keep."""
        n = len(self.main_sets) + len(distributions)
        self.variants_kept = self.regen is None and (self.keep_limit is None or n * self.main_bytes <= self.keep_limit)
        for k, dist in enumerate(distributions):
            index = len(self.sets)
            self.variants[index] = (self.main_sets[0], dist, variant_seed(seed, k))
            self.set_meta.append({"shape": "main", "distribution": dist})
            self.sets.append(None)
            if self.regen is not None:
                self.set_seeds[index] = seed  # through _pristine, like the main sets
            elif self.variants_kept:
                self.sets[index] = self._make_variant(index)

    def _make_variant(self, index: int) -> list:
        """Variant set ``index`` made: the first main set, its floating-point data redrawn."""
        base, dist, seed = self.variants[index]
        inputs = self._copy_of(base)
        redraw_(inputs, dist, seed)
        return inputs

    def _copy_of(self, index: int) -> list:
        """Input set ``index`` as made, in tensors of its own (a kept set is cloned), for the
        harness's own use: never handed to a kernel."""
        inputs = self._pristine(index)
        return _map_tensors(inputs, _clone) if inputs is self.sets[index] else inputs

    @contextlib.contextmanager
    def _variant_held(self, index: int):
        """Variant set ``index`` in ``self.sets`` for the length of one request when it is not
        kept (and not made again from seeds, as _fresh does for those)."""
        if index in self.variants and self.regen is None and self.sets[index] is None:
            self.sets[index] = self._make_variant(index)
            try:
                yield
            finally:
                self.sets[index] = None
        else:
            yield

    def _build_model(self, spec: LoadSpec, in_mod) -> None:
        same = Path(spec.kernel.module).resolve() == Path(spec.inputs.module).resolve()
        module = in_mod if same else _load_module(spec.kernel.module, "_magpie_kernel")
        if spec.kernel.function:  # Magpie's bench_target: module.callable(*get_inputs())
            fn = getattr(module, spec.kernel.model_class or "", None)
            if not callable(fn):
                raise AttributeError(f"{spec.kernel.module} defines no function {spec.kernel.model_class!r}")
            self.model = fn
            return
        cls = _pick_class(module, spec.kernel.model_class)
        get_init = getattr(in_mod, spec.inputs.get_init_inputs_func or "get_init_inputs", None) or \
            getattr(module, spec.kernel.get_init_inputs_func or "get_init_inputs", None)
        torch.manual_seed(spec.init_seed)
        init_inputs = get_init() if get_init else []
        self.model = cls(*init_inputs)
        if isinstance(self.model, torch.nn.Module):
            self.model = self.model.to(self.device).eval()

    def _make(self, fn) -> tuple[list, bool]:
        """Inputs made on the device when the function allows it (a KernelBench problem's
        torch.rand of several GB takes seconds on a CPU, milliseconds on a GPU), else on the CPU;
        and whether they were made on the device. Every worker takes the same path, so every
        worker gets the same values."""
        if self.device.type != "cpu":
            try:
                with torch.device(self.device):
                    return self._on_device(fn()), True
            except Exception:
                pass
        return self._on_device(fn()), self.device.type == "cpu"

    def _on_device(self, inputs) -> list:
        return _map_tensors(list(inputs), lambda t: t.to(self.device))

    def op_adopt(self, req: dict) -> dict:
        state = tensor_share.import_tree(req["state"])
        if not isinstance(self.model, torch.nn.Module) or not state:
            return {"adopted": False}
        own = self.model.state_dict()
        if set(own) != set(state) or any(own[k].shape != state[k].shape for k in own):
            return {"adopted": False}
        self.model.load_state_dict({k: v.to(self.device) for k, v in state.items()})
        return {"adopted": True}

    def op_run_set(self, req: dict) -> dict:
        """A correctness call on a clone of input set ``index``, with fresh allocations poisoned."""
        with self._variant_held(int(req["index"])):
            return self._run_set(req)

    def _run_set(self, req: dict) -> dict:
        index = int(req["index"])
        inputs = self._fresh(index, None)
        with poisoned_allocations(self.device):
            out = self._call(inputs)
        _sync(self.device)
        self._note_reuse(out, "a correctness call")
        errors = self._output_checks(out, inputs) + ([self.reuse_error] if self.reuse_error else [])
        reply: dict = {"errors": errors, "guard_errors": self._guard_errors(), "output_bytes": _nbytes(out)}
        self.out_bytes = max(self.out_bytes, reply["output_bytes"])
        if req.get("role") == "reference":
            # Each step frees what the next does not need: KernelBench's inputs and outputs take
            # GBs each, and the kernels judged share the device.
            reply["inputs_check"] = self._inputs_check(index, None, inputs)
            del inputs
            # The reference must at least be finite where it is written, and give the same
            # answer twice; NaN in its output means an element it never wrote. On a variant set
            # once is enough: the main sets showed it repeats itself.
            if index in self.variants:
                reply["self_check"] = self._self_check(out, out)
                reply["self_check"]["self_check"] = "finite, fully written"
            else:
                again_in = self._fresh(index, None)
                with poisoned_allocations(self.device):
                    again = self._call(again_in)
                _sync(self.device)
                del again_in
                reply["self_check"] = self._self_check(out, again)
                del again
            if self._keeps_outputs(index):
                self.ref_outputs[index] = out
            else:  # judged against a new call: the reference gives the same answer twice (checked)
                self.outputs_dropped.add(index)
            del out
            if index == self.main_sets[0]:
                reply["flops"] = self._count_flops(index)
            return reply
        h = self._hold(out, inputs, {"index": index, "perturb": None})
        reply.update(self._export(h))
        return reply

    def _keeps_outputs(self, index: int) -> bool:
        """Whether the reference keeps its output on set ``index`` for the judging to come: not
        for sets made again from seeds, nor when its outputs on all main sets, with the kept
        inputs, would pass the keep limit."""
        if self.regen is not None and index in self.set_seeds:
            return False
        if index in self.variants and not self.variants_kept:
            return False
        if self.keep_limit is None:
            return True
        n = len(self.main_sets) + (len(self.variants) if index in self.variants else 0)
        kept_inputs = 0 if self.regen is not None else self.main_bytes * n
        return kept_inputs + self.out_bytes * n <= self.keep_limit

    def _count_flops(self, index: int) -> Optional[int]:
        """The flops of one call as torch's flop counter sees them (matmuls, convolutions,
        attention; work inside a custom kernel is not seen, so this is a lower bound)."""
        try:
            from torch.utils.flop_counter import FlopCounterMode
            inputs = self._fresh(index, None)
            with FlopCounterMode(display=False) as counter:
                self._call(inputs)
            _sync(self.device)
            return int(counter.get_total_flops()) or None
        except Exception:  # a model the counter cannot trace: no flop floor, never a failure
            return None
        finally:
            _settle_heap()  # the counter's first use imports torch's compiler stack

    def _self_check(self, out, again) -> dict:
        cmp = compare_outputs(out, again, None, None)
        nonfinite = [n for n, t in _flatten(out) if isinstance(t, torch.Tensor)
                     and (t.is_floating_point() or t.is_complex()) and not _all_finite(t)]
        entry = dict(cmp)
        entry["self_check"] = "finite, fully written, same result on a second run"
        if nonfinite:
            entry["passed"] = False
            entry["reason"] = f"{nonfinite[0]}: NaN/Inf in the output (unwritten elements are poisoned with NaN)"
        elif not cmp["passed"]:
            entry["reason"] = "two runs on the same inputs disagree: " + cmp["reason"]
        return entry

    def _inputs_check(self, index: int, perturb: Optional[int], after) -> Optional[str]:
        if self.inplace:
            return None
        pristine = self._fresh(index, perturb, moved=False) if perturb is not None else self._pristine(index)
        for i, (p, a) in enumerate(zip(pristine, after)):
            if isinstance(p, torch.Tensor) and isinstance(a, torch.Tensor) and not _same_bits(p, a):
                return (f"wrote into input {i} during the call (its values changed); declare `inplace: true` on the "
                        "entry if the kernel is meant to work in place")
        return None

    def _reference_output(self, index: int, perturb: Optional[int]):
        """This reference's output on input set ``index`` (perturbed): kept from the correctness
        run when the set is kept, else computed again (the reference is deterministic: checked)."""
        if perturb is None and index in self.ref_outputs:
            return self.ref_outputs[index]
        if perturb is None and self.regen is None and index not in self.outputs_dropped:
            return None
        out = self._call(self._fresh(index, perturb, moved=False))
        _sync(self.device)
        return out

    def op_judge(self, req: dict) -> dict:
        """Compare another worker's outputs (and its inputs after the call) with this reference."""
        with self._variant_held(int(req["index"])):
            return self._judge(req)

    def _judge(self, req: dict) -> dict:
        index = int(req["index"])
        perturb = req.get("perturb")
        ref = self._reference_output(index, perturb)  # its inputs are freed once it returns
        if ref is None:
            raise RuntimeError(f"the reference has no output for input set {index}: run it on that set first")
        out = tensor_share.import_tree(req["outputs"])
        result = compare_outputs(ref, out, *self._tolerance(index, ref, req.get("rtol"), req.get("atol")))
        del ref, out  # the pristine inputs below need the room
        result["inputs_check"] = None
        if not req.get("inplace"):
            after = tensor_share.import_tree(req["inputs"])
            result["inputs_check"] = self._inputs_check(index, perturb, after)
            del after
        return result

    def _tolerance(self, index: int, ref, rtol: Optional[float], atol: Optional[float]) -> tuple:
        """(rtol, atol) for judging set ``index``: as given, except on a variant set whose
        reference output is larger than 1 somewhere, where atol is taken relative to the output's
        largest magnitude: redrawn inputs reach far beyond the problem's own, and an honest
        kernel's rounding (another order of summation over a few huge terms) grows with them."""
        if index not in self.variants:
            return rtol, atol
        if any(not (t.is_floating_point() or t.is_complex()) for t in _tensors(ref)):
            return rtol, atol  # one atol for every tensor: indices and masks must stay exact
        floats = [t for t in _tensors(ref) if t.is_floating_point() and t.numel()]
        big = max([_abs_max(t) for t in floats], default=0.0)
        if not big > 1 or big == float("inf"):
            return rtol, atol
        base = atol if atol is not None else _default_tolerance(str(floats[0].dtype).replace("torch.", ""), None, None)[1]
        return rtol, base * big

    def op_degenerate(self, req: dict) -> dict:
        """Would an output that ignores the inputs pass this test: all zeros, one constant, the
        reference's output on one input set, or the input itself? A trivial kernel gives the same
        answer whatever its inputs, so each is tried on every main input set and every variant set
        (the first one redrawn from other distributions; ``skip``: those the session dropped) and
        must pass all of them: a scalar output (a loss) whose value moves with the inputs is a real
        test, one that is the same on every set is not. Last, would an output computed from half
        the inputs pass on all of them (``_half_inputs_pass``)?"""
        skip = {int(i) for i in req.get("skip") or []}
        sets = list(self.main_sets) + [i for i in self.variants if i not in skip] if self.sets else []
        first = self._reference_output(sets[0], None) if sets else None
        if first is None:
            return {"degenerate": None}
        tensors = [t for t in _tensors(first) if t.is_floating_point() or t.is_complex()]
        if not tensors:
            return {"degenerate": None}
        rtol, atol = req.get("rtol"), req.get("atol")
        largest = [0.0]

        def passes_everywhere(make) -> bool:
            for i in sets:
                with self._variant_held(i):
                    ref = first if i == sets[0] else self._reference_output(i, None)
                    got = make(i, ref) if ref is not None else None
                    if got is None or not compare_outputs(ref, got, *self._tolerance(i, ref, rtol, atol))["passed"]:
                        return False
                largest[0] = max([largest[0]] + [_abs_max(t) for t in _tensors(ref)
                                                 if (t.is_floating_point() or t.is_complex()) and t.numel()])
                ref = None  # freed before the next set's output is computed
            return True

        n = len(sets)
        on_all = f"on all {n} input sets" if n > 1 else "on the one input set"
        if passes_everywhere(lambda i, ref: _map_tensors(ref, lambda t: _like(t, 0))):
            return {"degenerate": f"degenerate test: an all-zeros output passes it {on_all} (the reference's largest "
                                  f"magnitude is {largest[0]:.3g}, inside the tolerance): it cannot tell kernels apart; "
                                  "use inputs with larger outputs or set correctness.atol lower"}
        # One constant, or the first set's whole output, passing on one set says nothing about a
        # one-element output (it is that output): it takes a second set to count.
        informative = n > 1 or any(t.numel() > 1 for t in tensors)
        means = [_mean(t) if t.is_floating_point() and t.numel() else None for t in _tensors(first)]

        def constant(i: int, ref):
            values = iter(means)

            def fill(t):
                v = next(values, None)  # the i-th tensor of this set takes the first set's i-th mean
                return t if v is None or not t.is_floating_point() else _like(t, v)
            return _map_tensors(ref, fill)

        if informative and passes_everywhere(constant):
            where = f"passes on all {n} input sets" if n > 1 else "passes it"
            return {"degenerate": f"degenerate test: one constant output (the reference's mean on the first input set) "
                                  f"{where}: it cannot tell kernels apart"}
        if n > 1 and passes_everywhere(lambda i, ref: first):
            return {"degenerate": f"degenerate test: the reference gives the same output on all {n} input sets, so a "
                                  "kernel that returns it whatever its inputs passes: it cannot tell kernels apart; "
                                  "make the output depend on the values get_inputs() draws"}

        def the_input(i: int, ref):
            inputs = self._pristine(i)
            return inputs[0] if inputs else None

        if isinstance(first, torch.Tensor) and passes_everywhere(the_input):
            return {"degenerate": f"degenerate test: returning the input unchanged passes it {on_all}: it cannot tell "
                                  "kernels apart"}
        return {"degenerate": self._half_inputs_pass(passes_everywhere, on_all)}

    def _half_inputs_pass(self, passes_everywhere, on_all: str) -> Optional[str]:
        """The partial-computation check: the reference's output on inputs that hold only half
        their values (each floating-point tensor's elements paired, both of a pair given one of
        the two values: ``input_variants.keep_half_``) against its output on the inputs as made.
        A mean over many elements hardly moves when half of them are left out; if that passes on
        every set, a kernel that reads half its inputs passes too. Pairs of neighbours (half of
        every row) and pairs half the tensor apart (half of every column) are both tried."""
        if self.model is None:  # outputs set without a model (nothing to run again)
            return None
        for stride, what in (("adjacent", "half of every row"), ("halves", "half of every column")):
            def halved(i: int, ref, stride=stride):
                inputs = self._copy_of(i)
                if not keep_half_(inputs, 7919 + i, stride):
                    return None  # no floating-point data to leave out
                out = self._call(inputs)
                _sync(self.device)
                return out
            if passes_everywhere(halved):
                return (f"degenerate test: an output computed from half the inputs passes it {on_all} (the reference's "
                        f"own output on inputs of which half the values were replaced by the other half, {what} "
                        "kept): a kernel that reads only part of its inputs would pass; make each output depend "
                        "on more of its inputs' values (fewer elements per reduced output, heavier-tailed inputs "
                        "in get_inputs()) or set correctness.rtol and atol lower")
        return None

    def op_export(self, req: dict) -> dict:
        return self._export(int(req["handle"]))

    def op_release(self, req: dict) -> dict:
        handles = req.get("handles")
        for h in list(self.held) if handles is None else handles:
            e = self.held.pop(int(h), None)
            if e:
                tensor_share.remove_files(e["files"])
        if req.get("references"):
            self.ref_outputs.clear()
        self.audit_done = None  # the last clock-audit batch's inputs, kept past the judge's clock
        gc.collect()
        if _HAS_CUDA and torch.cuda.is_initialized():
            torch.cuda.ipc_collect()  # blocks a judge has opened by IPC and let go of
        return {"held": len(self.held)}

    def op_warm(self, req: dict) -> dict:
        """The first call compiles or loads and is never timed; its length sets the warm-up."""
        inputs = self._fresh(self.main_sets[0], _secure_random.getrandbits(62))
        t0 = _perf_counter()
        out = self._call(inputs)
        _sync(self.device)
        first_s = _perf_counter() - t0
        self.out_bytes = max(self.out_bytes, _nbytes(out))  # sizes the clock audit's batches
        del out
        n = req.get("warmup")
        n = int(n) if n is not None else (10 if first_s < 0.05 else 2)
        spent = 0.0
        for _ in range(n):  # each on inputs of its own, as every call: their making is not timed
            inputs = None  # the last call's freed first: a set made again from its seed takes GBs
            inputs = self._fresh(*_draw_call(self))
            _sync(self.device)
            t0 = _perf_counter()
            self._call(inputs)
            _sync(self.device)
            spent += _perf_counter() - t0
        est_s = spent / n if n else first_s
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            if req.get("l2_flush", True) and self.flush is None:
                # In a segment of its own: carved out of a freed input or output it would keep that
                # block's whole segment from going back to the device for the rest of the run.
                torch.cuda.empty_cache()
                # Twice the last-level cache (MI300's 256 MB Infinity Cache included), at least 256 MB.
                self.flush = torch.ones(max(2 * l2, 256 << 20) // 8, dtype=torch.int64, device=self.device)
            if req.get("timer") == "trace":  # CUPTI's first start is slow: here, untimed
                self.discovery_kernels = _discover_kernels(self)
            if req.get("timer") == "graph":
                torch.cuda.empty_cache()  # the graph's static buffers stay: in segments of their own
                self._capture_graph()
            if req.get("timer") in ("events", "graph"):
                self.sleep_cycles = self._spin_cycles(req.get("timer"))
        return {"warmup": n, "first_call_ms": first_s * 1e3, "estimate_ms": est_s * 1e3,
                "spin_cycles": self.sleep_cycles,
                "l2_flush_bytes": int(self.flush.numel() * 8) if self.flush is not None else 0,
                "guard_errors": self._guard_errors()}

    def _spin_cycles(self, timer: str) -> int:
        """Cycles of a spin kernel that keeps the GPU busy while the host records the start event
        and dispatches the call: without it the events also time the host's dispatch (the flush
        alone finishes first when a launch takes longer than a read of 2xL2). The spin covers
        three times the dispatch measured here, and at least 100 us."""
        if _gpu_spin is None:
            return 0
        dispatch = []
        for _ in range(5):
            inputs = None  # the last call's freed first
            inputs = self._fresh(*_draw_call(self))  # a call of its own, as every call
            _cuda_sync(self.device)
            t0 = _perf_counter()
            if timer == "graph":
                self.graph[0].replay()
            else:
                self._call(inputs)
            dispatch.append(_perf_counter() - t0)
        _cuda_sync(self.device)
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        probe = 1_000_000
        _gpu_spin(probe // 10)
        _event_record(start)
        _gpu_spin(probe)
        _event_record(end)
        _cuda_sync(self.device)
        cycles_per_us = probe / max(_event_elapsed(start, end) * 1e3, 1e-3)
        need_us = max(100.0, 3 * sorted(dispatch)[2] * 1e6)
        return int(cycles_per_us * need_us)

    def _capture_graph(self) -> None:
        static_in = self._fresh(self.main_sets[0], None)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._call(static_in)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self._call(static_in)
        self.graph = (graph, static_in, static_out)

    def op_audit_prepare(self, req: dict) -> dict:
        """Fresh inputs for the next clock-audit request's ``k`` calls, made before the judge
        starts its clock (and the previous request's inputs and outputs freed)."""
        self.audit_done = None
        k = max(1, min(int(req.get("k", 1)), self._audit_batch_room()))
        batch = []
        for _ in range(k):
            index, perturb = _draw_call(self)
            batch.append((self._fresh(index, perturb), index, perturb))
        if self.device.type == "cuda" and (torch.cuda.memory_reserved(self.device)
                                           - torch.cuda.memory_allocated(self.device)) < self.out_bytes:
            # The memory given back after the last request is taken again here, untimed, by a call
            # on inputs of its own: the judge's clock on the batch must not time the allocator.
            self._call(self._fresh(self.main_sets[0], _secure_random.getrandbits(62)))
        if self.device.type == "cuda" and self.audit_spin is None:
            # The spin must cover the dispatch of what the audit runs: a graph replay when the
            # kernel is timed by replays (sleep_cycles was measured for those), else the eager call.
            self.audit_spin = self.sleep_cycles if self.graph is not None else self._spin_cycles("events")
        self.audit = batch
        _sync(self.device)
        return {"k": k}

    def _audit_batch_room(self) -> int:
        """How many calls' fresh inputs an audit batch may hold: the batch's inputs plus two
        outputs (the one kept and the next call's) within AUDIT_BATCH_BYTES and within half the
        memory the device has free (the judge needs room to check the kept one)."""
        budget = AUDIT_BATCH_BYTES
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            budget = min(budget, (free + cached) // 2)
        return (budget - 2 * self.out_bytes) // max(1, self.main_bytes)

    def op_audit_go(self, req: dict) -> dict:
        """The prepared calls back to back (or none of them, ``null``), timed by the judge's own
        clock from its request to this reply. On a GPU each call comes after the L2 flush and a
        spin that covers the host's dispatch, as in the events timer, so the judge's difference
        of real and null requests is device time."""
        batch, self.audit = self.audit, None
        if not batch:
            raise RuntimeError("audit_go without audit_prepare")
        null = bool(req.get("null"))
        keep = not null and bool(req.get("keep"))
        chosen = None  # (position, output copy): one call, drawn after it returned
        for j, (inputs, _, _) in enumerate(batch):
            if self.device.type == "cuda":  # timed by replays: audit replays (the copy in both, null too)
                _before_gpu_call(self, inputs, self.graph is not None, self.audit_spin or 0)
            if null:
                out = None
            elif self.graph is not None:
                self.graph[0].replay()
                out = self.graph[2] if keep else None
            else:
                out = self._call(inputs)
            if self.device.type == "cuda":
                _cuda_sync(self.device)
            # Every other output is freed before the next call, as in the timed rounds: k live
            # outputs would make each call fault in fresh pages the timed calls never touch.
            if keep and _secure_random.random() < 1.0 / (j + 1):
                # The output copied now, as in the timed rounds: the kernel never learns which
                # call is kept. Every call's inputs stay alive to the batch's end anyway.
                chosen = None
                chosen = (j, _map_tensors(out, _clone))
            out = None
        self.audit_done = batch  # freed by the next audit_prepare, as timed calls free theirs after the clock
        kept = []
        if chosen is not None:
            j, out = chosen
            h = self._hold(out, batch[j][0], {"index": batch[j][1], "perturb": batch[j][2]})
            kept.append({"handle": h, **self.held[h]["meta"]})
        return {"kept": kept}

    def op_time(self, req: dict) -> dict:
        """``n`` timed calls, each on its own fresh inputs; ``keep`` of them (one by default)
        judged, drawn after the calls returned."""
        n, timer = int(req["n"]), req["timer"]
        keep_max = int(req.get("keep", 1))
        cpu = req.get("cpu")
        if self.device.type == "cpu" and cpu is not None and self.pinned_cpu != cpu:
            self.pinned_cpu = _pin_timing_thread(int(cpu))
        # The span the parent checks against its own clock covers everything this request does
        # (a round of one slow call spent as long again on the untimed call below).
        t_start = _perf_counter()
        # One untimed call first: a worker that sat idle while the others were timed starts its
        # round with cold caches, and that first call would count against it alone.
        self._call(self._fresh(*_draw_call(self)))
        _sync(self.device)
        reply = _time_call(self, n, timer, keep_max)
        reply["guard_errors"] = self._guard_errors()
        reply["errors"] = [self.reuse_error] if self.reuse_error else []
        reply["round_span_s"] = _perf_counter() - t_start
        reply["addresses_reused"] = self.addresses_reused
        reply["pinned_cpu"] = self.pinned_cpu
        # Handed over only when the judge asks (op_export): a CUDA tensor shared by IPC stays
        # allocated in this process until a receiver has opened and dropped it.
        reply["kept"] = [{"handle": h, **self.held[h]["meta"]} for h in reply["kept"]]
        return reply


def _pin_timing_thread(cpu: int) -> Optional[int]:
    """Pin the thread that makes the timed calls of a CPU kernel to ``cpu``, the one the session
    chose for all its workers (``HarnessSession._timing_cpu``); returns it, or None where that cannot be.
    Each kernel runs in a worker of its own: left to the scheduler, two workers that take turns
    keep to different cores, and the cores of a VM or a shared host are not equally fast (two
    vCPUs here differed by 0-12% from one second to the next), so an identical kernel measured
    18% slower in one run. Timed on one core, both pay the same core. (The workers' one
    intra-op thread is set when they load.)"""
    if _setaffinity is None:
        return None
    try:
        _setaffinity(0, {cpu})  # this thread: the one that makes the calls
        return cpu
    except (OSError, ValueError):
        return None


def _before_gpu_call(w: Worker, inputs, into_graph: bool, spin_cycles: int) -> None:
    """What precedes a timed GPU call: its inputs copied into the graph's static buffers (when it
    is replayed), the L2 flush, and a spin that keeps the GPU busy while the host dispatches.
    A module function in the watch table, as _time_call is: a kernel cannot swap it."""
    if into_graph:
        for dst, src in zip(_tensors(w.graph[1]), _tensors(inputs)):
            dst.copy_(src)
    if w.flush is not None:
        # A read, not a write: writing the buffer would leave L2 full of dirty lines that the timed
        # kernel pays to write back; a read leaves clean ones, the state ncu's --cache-control all leaves.
        w.flush_sink = w.flush.sum(dtype=torch.int64)  # stays on the device: no sync
    if spin_cycles:
        _gpu_spin(spin_cycles)


def _draw_call(w: Worker) -> tuple[int, int]:
    """Which input set the next call gets and its perturbation seed, drawn when its inputs are
    made: no list of the round's inputs exists for a kernel to read ahead in."""
    return _secure_random.choice(w.main_sets), _secure_random.getrandbits(62)


def _time_call(w: Worker, n: int, timer: str, keep_max: int) -> dict:
    """Run ``n`` calls. Returns ``samples_ms``, the handles ``kept`` for the judge and, on
    a GPU, ``events_ms``; with the trace timer also ``trace_spans_ms``, ``other_stream_calls``
    and ``kernel_counts`` (the kernels each call launched, by name)."""
    samples: list[float] = []
    kept: list[int] = []
    seen = [0]

    def maybe_keep(out, inputs, index, perturb):
        # Reservoir sampling drawn after the call returned: exactly ``keep_max`` calls of the
        # round are judged, each call as likely as any other, and nothing the kernel can read
        # knows which. What is kept is a copy made now: the call's own tensors are let go as
        # every other call's are, so the kernel cannot see later that its output was kept (by
        # it staying alive) and write the right values into it then.
        seen[0] += 1
        if not keep_max:
            return
        if len(kept) < keep_max:
            slot = len(kept)
            kept.append(0)
        else:
            slot = _secure_random.randrange(seen[0])
            if slot >= keep_max:
                return
            w.held.pop(kept[slot], None)  # the copy it replaces goes first: room for the new one
        kept[slot] = w._hold(_map_tensors(out, _clone), _map_tensors(inputs, _clone),
                             {"index": index, "perturb": perturb})

    if w.device.type != "cuda":
        for _ in range(n):
            index, perturb = _draw_call(w)
            inputs = w._fresh(index, perturb)
            t0 = _perf_counter()
            out = w._call(inputs)
            samples.append((_perf_counter() - t0) * 1e3)
            w._note_reuse(out, "a timed call")
            maybe_keep(out, inputs, index, perturb)
            out = inputs = None  # freed before the next call's inputs are made
        return {"samples_ms": samples, "kept": kept}

    dev = w.device
    prof = None
    if timer == "trace" and w.discovery_kernels is None:
        w.discovery_kernels = _discover_kernels(w)
    if timer == "trace":
        prof = _profile(activities=[_Activity.CPU, _Activity.CUDA])
        prof.start()
    events_ms: list[float] = []
    try:
        for _ in range(n):
            index, perturb = _draw_call(w)
            ctx = _record_function("magpie_prep") if prof is not None else contextlib.nullcontext()
            with ctx:
                inputs = w._fresh(index, perturb)
                # The spin: the start event runs only once the call is queued (not under the trace).
                _before_gpu_call(w, inputs, timer == "graph", 0 if prof is not None else w.sleep_cycles)
            if prof is not None:
                _cuda_sync(dev)  # the trace times the device; the host's dispatch is not in it
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            ctx = _record_function("magpie_call") if prof is not None else contextlib.nullcontext()
            with ctx:
                _event_record(start)
                if timer == "graph":
                    w.graph[0].replay()
                    out = None
                else:
                    out = w._call(inputs)
                _event_record(end)
                _cuda_sync(dev)  # device-wide: every stream's work is done before the next call
            events_ms.append(_event_elapsed(start, end))
            # The judged call's copy is the harness's work: under the trace it is marked as such,
            # or its kernels would count as the call's (in its span and its kernel set).
            ctx = _record_function("magpie_prep") if prof is not None else contextlib.nullcontext()
            with ctx:
                if timer == "graph":
                    maybe_keep(w.graph[2], w.graph[1], index, perturb)
                else:
                    w._note_reuse(out, "a timed call")
                    maybe_keep(out, inputs, index, perturb)
            out = inputs = None  # freed before the next call's inputs are made
    finally:
        if prof is not None:
            prof.stop()
    if prof is None:
        return {"samples_ms": list(events_ms), "events_ms": events_ms, "kept": kept}
    path = w.scratch / f"trace_{os.getpid()}_{w.next_handle}.json"
    prof.export_chrome_trace(str(path))
    try:
        spans, other, names = _device_spans(json.loads(path.read_text()), n)
    finally:
        path.unlink(missing_ok=True)
    samples = [s if s is not None else e for s, e in zip(spans, events_ms)]
    return {"samples_ms": samples, "events_ms": events_ms, "kept": kept, "trace_spans_ms": spans,
            "other_stream_calls": other, "kernel_sets": kernel_set_check(w.discovery_kernels, names)}


def _discover_kernels(w: Worker) -> Optional[dict[str, int]]:
    """The kernels one untimed call launches, traced on its own (CUPTI / roctracer): what every
    traced timed call must launch too."""
    inputs = w._fresh(*_draw_call(w))
    _cuda_sync(w.device)
    prof = _profile(activities=[_Activity.CPU, _Activity.CUDA])
    prof.start()
    try:
        with _record_function("magpie_call"):
            w._call(inputs)
            _cuda_sync(w.device)
    finally:
        prof.stop()
    path = w.scratch / f"discovery_{os.getpid()}.json"
    prof.export_chrome_trace(str(path))
    try:
        return _device_spans(json.loads(path.read_text()), 1)[2][0]
    finally:
        path.unlink(missing_ok=True)


_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _device_spans(trace: dict, n_calls: int) -> tuple[list[Optional[float]], int, list[dict[str, int]]]:
    """Per timed call, the device time from its first kernel's start to its last kernel's end, over
    every stream, in ms; how many calls put work on another stream than the harness's; and the
    kernels (copies and fills too) each call launched, by name and count. A kernel belongs to the
    call during whose host window it was launched (by any thread); the harness's own kernels
    (clone, perturbation, cache flush) are those the main thread launched inside a
    ``magpie_prep`` range."""
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    calls, preps, launches, device = [], [], {}, []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name")
        if cat == "user_annotation" and name == "magpie_call":
            calls.append((float(e["ts"]), e.get("tid")))
        elif cat == "user_annotation" and name == "magpie_prep":
            preps.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("tid")))
        elif cat in _DEVICE_CATS:
            device.append(e)
        else:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None and cat in ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_api", "runtime"):
                launches[corr] = (float(e["ts"]), e.get("tid"))
    calls.sort()
    starts = [c[0] for c in calls]
    main_tid = calls[0][1] if calls else None
    per_call: list[list[tuple[float, float]]] = [[] for _ in range(len(calls))]
    names: list[dict[str, int]] = [{} for _ in range(n_calls)]
    harness_streams: set = set()
    user: list[tuple[int, Any]] = []
    import bisect
    for e in device:
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        corr = (e.get("args") or {}).get("correlation")
        launch = launches.get(corr)
        at, tid = launch if launch else (ts, None)
        stream = (e.get("args") or {}).get("stream", e.get("tid"))
        if tid == main_tid and any(a <= at <= b for a, b, _ in preps):
            harness_streams.add(stream)
            continue
        i = bisect.bisect_right(starts, at) - 1
        if i < 0:
            i = 0
        if calls:
            per_call[i].append((ts, ts + dur))
            user.append((i, stream))
            if i < n_calls:
                key = str(e.get("name"))
                names[i][key] = names[i].get(key, 0) + 1
    out: list[Optional[float]] = []
    for i in range(n_calls):
        k = per_call[i] if i < len(per_call) else []
        out.append((max(b for _, b in k) - min(a for a, _ in k)) / 1e3 if k else None)
    # Calls that put work on a stream other than the one the harness (and so the call) runs on.
    other = {i for i, st in user if harness_streams and st not in harness_streams}
    return out, len(other), names


def kernel_set_check(discovery: Optional[dict[str, int]], per_call: list[dict[str, int]]) -> dict:
    """How the kernels each traced call launched compare with those of the discovery call (an
    untimed call traced on its own): ``calls`` traced, ``differ`` (another set or other counts),
    ``empty`` (nothing launched where the discovery call launched kernels: an answer that came
    from elsewhere) and the first differing call with what it launched."""
    found: dict = {"calls": len(per_call), "differ": 0, "empty": 0, "example": None}
    if discovery is None:
        return found
    for i, got in enumerate(per_call):
        if got == discovery:
            continue
        found["differ"] += 1
        if discovery and not got:
            found["empty"] += 1
        if found["example"] is None:
            found["example"] = {"call": i + 1, "expected": discovery, "launched": got}
    return found


# A worker waiting for its next request gives the allocator's free blocks beyond this back to the
# device: the other workers on the same GPU need them (a judge idle with 30 GB cached is 30 GB
# the kernel it judges cannot have).
IDLE_CACHE_BYTES = 256 << 20


def _status_bytes(key: str) -> Optional[int]:
    """A ``kB`` line of /proc/self/status (VmRSS, VmHWM) in bytes, or None where there is none."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak() -> None:
    if _HAS_CUDA and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    try:  # the resident high-water mark starts again from what the process holds now
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def _give_back_cache() -> None:
    """Between requests: the allocator's cached free blocks over IDLE_CACHE_BYTES go back to the device
    (tensors only a reference cycle kept are collected first)."""
    if _HAS_CUDA and torch.cuda.is_initialized():
        if torch.cuda.memory_allocated() > IDLE_CACHE_BYTES:
            gc.collect()
        if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > IDLE_CACHE_BYTES:
            torch.cuda.empty_cache()


def _settle_heap() -> None:
    """Collect, then freeze what survives (torch, its compiler stack, the kernel's module): a full
    collection scans every tracked object, 0.2-0.3 s once torch's flop counter has pulled in
    dynamo, and the worker collects after each release. Frozen objects are only skipped by the
    cycle collector; reference counting still frees them."""
    gc.collect()
    gc.freeze()


def _peak(worker: Optional[Worker] = None) -> dict:
    """The most memory this request held: on the device (torch's allocator, bytes) where there is
    one, and the process's resident peak during the request (bytes; the kernel's host memory on
    a CPU run; the peak so far where /proc cannot reset it). ``*_held_bytes``: what the worker
    keeps while it waits for the next request; ``host_base_bytes``: its resident size less the
    CPU tensors it keeps (the interpreter, torch and the libraries loaded so far: what the
    tensors' memory is counted above)."""
    hwm, rss = _status_bytes("VmHWM"), _status_bytes("VmRSS")
    if hwm is None:
        import resource
        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    base = None
    if rss is not None and worker is not None:
        try:
            base = max(0, rss - worker.kept_bytes("cpu"))
        except Exception:  # what the kernel keeps is its own business: no base then
            base = None
    out: dict = {"host_rss_bytes": hwm, "host_held_bytes": rss, "host_base_bytes": base}
    if _HAS_CUDA and torch.cuda.is_initialized():
        out["device_bytes"] = int(torch.cuda.max_memory_allocated())
        out["device_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        out["device_held_bytes"] = int(torch.cuda.memory_reserved())
        out["device_live_bytes"] = int(torch.cuda.memory_allocated())
    return out


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print("usage: python -m engine.kernels.worker READ_FD WRITE_FD SCRATCH_DIR", file=sys.stderr)
        return 2
    rfd, wfd = int(argv[0]), int(argv[1])
    reader = os.fdopen(rfd, "r", encoding="utf-8")
    writer = os.fdopen(wfd, "w", encoding="utf-8")
    worker = Worker(Path(argv[2]))
    for line in reader:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "exit":
            break
        _reset_peak()
        try:
            reply = {"ok": True, **getattr(worker, f"op_{op}")(req)}
        except BaseException as exc:  # noqa: BLE001 - whatever user code raised goes back to the parent
            traceback.print_exc()
            _give_back_cache()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:],
                     "peak_memory": _peak(worker)}
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                writer.write(_serialize(reply) + "\n")
                writer.flush()
                break
        if "peak_memory" not in reply:
            # Not around an audit batch: the audited calls come next, and the judge's clock runs
            # to audit_go's reply (a collection or a cudaFree there was 100+ ms of noise in the
            # batches of a 3 ms kernel); the export or release that follows gives memory back.
            if op not in ("audit_prepare", "audit_go"):
                _give_back_cache()
            reply["peak_memory"] = _peak(worker)
        writer.write(_serialize(reply) + "\n")
        writer.flush()
    for h in list(worker.held):
        tensor_share.remove_files(worker.held[h]["files"])
    tensor_share.remove_files(worker.state_files)
    gc.unfreeze()  # an interpreter that exits normally finalizes everything, as without the freeze
    return 0


# A fork server loads this module as __main__ without running it (engine.kernels.forkserver).
if __name__ == "__main__" and not globals().get("_FORKSERVER_PRELOAD"):
    sys.exit(main())

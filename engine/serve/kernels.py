"""The kernel registry of the built-in server: the hot operations of a Llama decoder layer, each
a default that a config can replace by a candidate (PyTorch or a Triton wrapper) named by dotted
path, ``package.module:function`` or ``package.module.function``, or by file,
``/path/to/file.py:function``.

This is how a kernel that won ``magpie compare`` is integrated and re-benchmarked: point the
server config's ``kernels:`` block at it. Overrides are imported and their signatures checked
when the server starts, so a typo fails before any request, naming the key and the path. On a
GPU the decode step is captured in CUDA graphs with every kernel in it, overrides included: a
kernel that cannot be captured (a host sync such as ``.item()``, a host tensor made per call)
fails the start naming its key, unless the server runs eager (``--eager``).

Signatures (tokens are packed: T = total new tokens of all sequences in the step):

* ``rmsnorm(x[T, H], weight[H], eps: float) -> [T, H]``
* ``activation(x[T, 2I]) -> [T, I]``: silu(x[:, :I]) * x[:, I:] (vLLM's ``silu_and_mul``)
* ``rotary(positions[T] int64, q[T, Hq, D], k[T, Hkv, D], cos_sin_cache[P, D]) -> (q, k)``:
  NeoX-style rotation of the two halves of D; the cache row p is cos(p·f) ‖ sin(p·f), float32
* ``attention(q[T, Hq, D], k[S, Hkv, D], v[S, Hkv, D], cu_seqlens_q[B+1] int32,
  cu_seqlens_k[B+1] int32, scale: float) -> [T, Hq, D]``: variable-length causal attention as
  in flash-attn's varlen API: sequence i owns rows cu_q[i]:cu_q[i+1] of q and cu_k[i]:cu_k[i+1]
  of k/v (its whole context), the causal mask aligned to the bottom right (the new tokens are
  the last ones of the context); Hq is a multiple of Hkv (grouped-query attention). Used by
  prefill (eager).
* ``decode_attention(q[B, Hq, D], k_cache[slots, L, Hkv, D], v_cache[slots, L, Hkv, D],
  slots[B] int64, lengths[B] int32, scale: float) -> [B, Hq, D]``: one new token per sequence
  (its keys and values already written to the cache) attending to the first ``lengths[b]``
  positions of cache slot ``slots[b]``; lengths >= 1. Used by the decode step, which is captured
  in a CUDA graph on a GPU: no host syncs, no shape that depends on the lengths' values.

Defaults: the PyTorch functions of this module on the CPU (the references); on a GPU (CUDA or
ROCm torch, with Triton) Triton kernels: ``engine.serve.triton_kernels`` for rmsnorm, activation
and rotary (one launch each instead of up to nine: the decode step is launch-bound), and the
bundled library's flash attention for prefill and flash-decoding for decode
(``engine.library.attention``: on an H200 at the 1B shapes 20.8x and 2.2x the references, each
won a correctness-gated ``magpie optimize`` compare), each checked against its reference when
the server starts and replaced by the reference, with a warning, if it fails.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.errors import MagpieError
from engine.serve.kernel_keys import KERNEL_KEYS, REFERENCE_PATHS  # torch-free, for the launch form and the job API

TRITON_MODULE = "engine.serve.triton_kernels"
# Attribute under which the model hangs the host copy of a cu_seqlens tensor it built: the
# reference varlen attention reads it instead of syncing with the device once per layer.
HOST_OFFSETS_ATTR = "_magpie_host_offsets"


class KernelError(MagpieError, ValueError):
    """A kernel override that cannot be used; the message names the config key and the path."""

    title = "unusable kernel override"


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Accumulate in float32 as production kernels do, so bf16 outputs match them.
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
           cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


# Not cuDNN: its SDPA builds a graph for every new shape, and the context length changes every
# decode step (measured on an H200: 3 ms of CPU per call, 55% of a 1B decode step).
_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, scale: float) -> torch.Tensor:
    # The reference a fused varlen kernel must match: one SDPA call per prefilling sequence (4-D
    # and causal, so flash attention can run on a GPU) and one padded SDPA for all decode tokens.
    with sdpa_kernel(_SDPA_BACKENDS):
        return _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale)


def _host_offsets(cu: torch.Tensor) -> list[int] | None:
    return getattr(cu, HOST_OFFSETS_ATTR, None)


def _varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    cq, ck = _host_offsets(cu_seqlens_q), _host_offsets(cu_seqlens_k)
    if cq is None or ck is None:
        cq, ck = torch.stack((cu_seqlens_q, cu_seqlens_k)).tolist()  # one device sync, not two
    decode = []
    for i in range(len(cq) - 1):
        sq, sk = cq[i + 1] - cq[i], ck[i + 1] - ck[i]
        if sq == 1:
            decode.append(i)
            continue
        qi = q[cq[i]:cq[i + 1]].transpose(0, 1).unsqueeze(0)
        ki = k[ck[i]:ck[i + 1]].transpose(0, 1).repeat_interleave(groups, dim=0).unsqueeze(0)
        vi = v[ck[i]:ck[i + 1]].transpose(0, 1).repeat_interleave(groups, dim=0).unsqueeze(0)
        mask = None
        if sq != sk:  # query j sees keys 0 .. sk - sq + j
            mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        out[cq[i]:cq[i + 1]] = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None,
                                                              scale=scale)[0].transpose(0, 1)
    if decode:
        rows = torch.tensor([cq[i] for i in decode], device=q.device)
        starts = torch.tensor([ck[i] for i in decode], device=q.device)
        k_lens = [ck[i + 1] - ck[i] for i in decode]
        lens = torch.tensor(k_lens, device=q.device)
        offsets = torch.arange(max(k_lens), device=q.device)
        valid = offsets[None, :] < lens[:, None]  # [B, max_k]: padding keys are masked out
        gather = starts[:, None] + torch.minimum(offsets[None, :], lens[:, None] - 1)
        kd = k[gather].transpose(1, 2).repeat_interleave(groups, dim=1)  # [B, Hq, max_k, D]
        vd = v[gather].transpose(1, 2).repeat_interleave(groups, dim=1)
        od = F.scaled_dot_product_attention(q[rows].unsqueeze(2), kd, vd, attn_mask=valid[:, None, None, :], scale=scale)
        out[rows] = od.squeeze(2)
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, scale: float) -> torch.Tensor:
    # The reference: gather each sequence's slot and run one masked SDPA over the padded batch.
    # On the CPU the context is cut at the longest sequence (a host sync costs nothing there);
    # on a GPU the whole slot length is read, so that nothing depends on the lengths' values and
    # the call can be captured. Correct but slow there: the GPU default is the Triton kernel.
    ctx = int(lengths.max()) if lengths.device.type == "cpu" else k_cache.shape[1]
    groups = q.shape[1] // k_cache.shape[2]
    k = k_cache[slots, :ctx].transpose(1, 2).repeat_interleave(groups, dim=1)  # [B, Hq, ctx, D]
    v = v_cache[slots, :ctx].transpose(1, 2).repeat_interleave(groups, dim=1)
    valid = torch.arange(ctx, device=q.device)[None, :] < lengths[:, None]  # [B, ctx]
    with sdpa_kernel(_SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=valid[:, None, None, :], scale=scale)
    return out.squeeze(2)


_DEFAULTS: dict[str, Callable] = {
    "rmsnorm": rmsnorm,
    "activation": silu_and_mul,
    "rotary": rotary,
    "attention": varlen_attention,
    "decode_attention": decode_attention,
}
if {k: f"{__name__}:{fn.__name__}" for k, fn in _DEFAULTS.items()} != REFERENCE_PATHS:
    raise ImportError("engine.serve.kernel_keys.REFERENCE_PATHS does not name the defaults of engine.serve.kernels")
# The Triton defaults on a GPU: key -> dotted path of the kernel.
TRITON_DEFAULTS = {"rmsnorm": f"{TRITON_MODULE}:rmsnorm", "activation": f"{TRITON_MODULE}:silu_and_mul",
                   "rotary": f"{TRITON_MODULE}:rotary", "attention": "engine.library.attention:varlen_attention_triton",
                   "decode_attention": "engine.library.attention:decode_attention_split"}
# Positional parameters each kernel is called with (its signature must accept exactly these).
_ARITY: dict[str, int] = {"rmsnorm": 3, "activation": 1, "rotary": 4, "attention": 6, "decode_attention": 6}


@dataclass(frozen=True)
class Kernels:
    """The resolved kernels a model calls; ``sources`` says where each came from, ``notes``
    what changed a default (a Triton kernel that failed its start-up check, no Triton)."""

    rmsnorm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    activation: Callable[[torch.Tensor], torch.Tensor]
    rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    attention: Callable[..., torch.Tensor]
    decode_attention: Callable[..., torch.Tensor]
    sources: Mapping[str, str]
    notes: Sequence[str] = ()

    def replace(self, key: str, fn: Callable, source: str, note: str | None = None) -> "Kernels":
        fns = {k: getattr(self, k) for k in KERNEL_KEYS}
        fns[key] = fn
        notes = (*self.notes, note) if note else self.notes
        return Kernels(sources={**self.sources, key: source}, notes=notes, **fns)

    def wrapped(self, wrap: Callable[[str, Callable], Callable]) -> "Kernels":
        """The same kernels, each passed through ``wrap(key, fn)`` (annotation, tracking)."""
        return Kernels(sources=self.sources, notes=self.notes, **{k: wrap(k, getattr(self, k)) for k in KERNEL_KEYS})


def _import(key: str, path: str) -> Callable:
    if ":" in path:
        module_name, _, attr = path.rpartition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise KernelError(f"kernels.{key}: {path!r} is not a dotted path "
                          "(expected 'package.module:function', 'package.module.function' or '/path/file.py:function')")
    try:
        module = load_module_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of the candidate is a config error
        raise KernelError(f"kernels.{key}: cannot import module {module_name!r} of {path!r}: "
                          f"{type(exc).__name__}: {exc}") from exc
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise KernelError(f"kernels.{key}: module {module_name!r} has no attribute {attr!r} ({path!r})")
        fn = getattr(fn, part)
    if not callable(fn):
        raise KernelError(f"kernels.{key}: {path!r} is a {type(fn).__name__}, not a function")
    return fn


def load_module_file(path: str) -> Any:
    """A module given by file (a candidate kernel, the loop's harness), loaded once per path."""
    import hashlib
    import importlib.util
    from pathlib import Path
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no such file {file}")
    name = "_magpie_kernel_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, str(file))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_kernel(key: str, path: str) -> Callable:
    """The function at ``path`` (dotted, or ``/path/file.py:function``); KernelError naming ``key``."""
    return _import(key, path.strip())


def default_kernel_path(key: str, device: torch.device | str | None = None) -> str:
    """Where the server's own implementation of registry op ``key`` lives on ``device``."""
    return _defaults(device, True)[1][key]


def _check_signature(key: str, path: str, fn: Callable) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C extensions may hide their signature; the warm-up call checks them
    try:
        sig.bind(*range(_ARITY[key]))
    except TypeError as exc:
        expected = inspect.signature(_DEFAULTS[key])
        raise KernelError(f"kernels.{key}: {path!r} has signature {sig}, which cannot be called with "
                          f"{_ARITY[key]} positional arguments {expected} ({exc})") from None


def _defaults(device: torch.device | str | None, triton_defaults: bool) -> tuple[dict[str, Callable], dict[str, str], list[str]]:
    chosen = dict(_DEFAULTS)
    sources = dict(REFERENCE_PATHS)
    notes: list[str] = []
    if device is None or torch.device(device).type != "cuda" or not triton_defaults:
        return chosen, sources, notes
    try:
        loaded = {key: _import(key, path) for key, path in TRITON_DEFAULTS.items()}
    except KernelError as exc:
        notes.append(f"Triton is not importable ({exc}): the PyTorch reference kernels are the defaults")
        return chosen, sources, notes
    chosen.update(loaded)
    sources.update(TRITON_DEFAULTS)
    return chosen, sources, notes


def triton_defaults_in_use(kernels: "Kernels") -> list[str]:
    """The keys whose kernel is the GPU's Triton default (checked at start-up, named in the ready line)."""
    return [k for k, path in TRITON_DEFAULTS.items() if kernels.sources.get(k) == path]


def resolve_kernels(overrides: Mapping[str, str] | None = None, device: torch.device | str | None = None,
                    triton_defaults: bool = True) -> Kernels:
    """The defaults for ``device`` (the PyTorch references unless it is a GPU, see the module
    docstring; ``triton_defaults=False`` keeps the references there too) with ``overrides``
    (kernel key → dotted path) swapped in, each imported and checked; raises ``KernelError``
    naming the key and path of the first bad one."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(KERNEL_KEYS))
    if unknown:
        raise KernelError(f"kernels.{unknown[0]}: unknown kernel key (known: {', '.join(KERNEL_KEYS)})")
    chosen, sources, notes = _defaults(device, triton_defaults)
    for key in KERNEL_KEYS:
        path = overrides.get(key)
        if path is None:
            continue
        if not isinstance(path, str) or not path.strip():
            raise KernelError(f"kernels.{key}: expected a dotted path string, got {path!r}")
        fn = _import(key, path.strip())
        _check_signature(key, path, fn)
        chosen[key] = fn
        sources[key] = path.strip()
    return Kernels(sources=sources, notes=tuple(notes), **chosen)


# -- the start-up check of the Triton defaults ----------------------------------------------------

def _sample_inputs(key: str, shapes: Any, device: torch.device, dtype: torch.dtype) -> tuple:
    """Small inputs of the model's sizes for ``key``, strided as the model passes them."""
    gen = torch.Generator(device=device).manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    h, hq, hkv, d = shapes.hidden_size, shapes.num_heads, shapes.num_kv_heads, shapes.head_dim
    if key == "rmsnorm":
        return rand(5, h), rand(h), shapes.rms_eps
    if key == "activation":
        return (rand(5, 2 * shapes.intermediate_size),)
    if key == "rotary":
        qkv = rand(5, (hq + 2 * hkv) * d)  # q and k are views into the QKV projection, as in the model
        q, k, _ = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
        angles = torch.outer(torch.arange(64, device=device, dtype=torch.float32),
                             torch.rand(d // 2, generator=gen, device=device))
        cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
        positions = torch.tensor([0, 3, 17, 63, 5], device=device)
        return positions, q.view(5, hq, d), k.view(5, hkv, d), cache
    if key == "attention":  # a whole prompt of 5 tokens and a continued one: 3 new tokens after 4 cached
        cu_q = torch.tensor([0, 5, 8], device=device, dtype=torch.int32)
        cu_k = torch.tensor([0, 5, 12], device=device, dtype=torch.int32)
        return rand(8, hq, d), rand(12, hkv, d), rand(12, hkv, d), cu_q, cu_k, d ** -0.5
    k_cache, v_cache = rand(4, 80, hkv, d), rand(4, 80, hkv, d)
    slots = torch.tensor([2, 0, 3], device=device)
    lengths = torch.tensor([1, 80, 37], device=device, dtype=torch.int32)
    return rand(3, hq, d), k_cache, v_cache, slots, lengths, d ** -0.5


def check_triton_defaults(kernels: Kernels, shapes: Any, device: torch.device, dtype: torch.dtype) -> Kernels:
    """Run each Triton default once against its PyTorch reference on inputs of the model's
    sizes; one that raises or disagrees is replaced by the reference, with a note (printed by
    the server) saying why. Overrides are not checked here: ``magpie compare`` gates those."""
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    for key in triton_defaults_in_use(kernels):
        path = TRITON_DEFAULTS[key]
        args = _sample_inputs(key, shapes, device, dtype)
        try:
            got, want = getattr(kernels, key)(*args), _DEFAULTS[key](*args)
            for g, w in zip(got, want) if isinstance(got, tuple) else [(got, want)]:
                torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol)
        except Exception as exc:  # a compile error or a wrong result: the reference is always there
            reference = f"{__name__}:{_DEFAULTS[key].__name__}"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            kernels = kernels.replace(key, _DEFAULTS[key], reference,
                                      f"the Triton default of {key} ({path}) failed its start-up check; "
                                      f"the reference {reference} replaces it ({type(exc).__name__}: {first})")
    return kernels


# -- naming the kernel that broke a warm-up or a graph capture ------------------------------------

class KernelTracker:
    """Wraps kernels so that an exception escaping one of them can be pinned on its key."""

    def __init__(self, kernels: Kernels) -> None:
        self.sources = kernels.sources
        self.active: str | None = None

    def wrap(self, key: str, fn: Callable) -> Callable:
        def call(*args: Any) -> Any:
            self.active = key
            out = fn(*args)
            self.active = None
            return out
        return call

    def error(self, exc: BaseException, what: str, fix: str) -> Exception:
        """A ``KernelError`` naming the kernel that raised ``exc`` during ``what``, or a
        ``RuntimeError`` when it was not a registry kernel."""
        root = exc
        while root.__context__ is not None:  # a failed capture's own error hides the one that broke it
            root = root.__context__
        detail = f"{type(root).__name__}: {root}".strip()
        if self.active is None:
            return RuntimeError(f"{what} failed outside the registry kernels: {detail}; {fix}")
        return KernelError(f"kernels.{self.active}: {self.sources.get(self.active)!r} failed during {what}: {detail}; {fix}")


def print_notes(kernels: Kernels) -> None:
    for note in kernels.notes:
        print(f"magpie-serve: warning: {note}", file=sys.stderr, flush=True)

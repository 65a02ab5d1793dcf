"""The bundled kernel library: candidate kernels for the built-in server's registry ops
(``engine.serve.kernels``), for the optimization loop to compare against the defaults and
integrate by dotted path into a server config's ``kernels:`` block.

Every candidate keeps its op's registry signature exactly (the contract is the module docstring
of ``engine.serve.kernels``):

* ``rmsnorm(x[T, H], weight[H], eps) -> [T, H]`` (float32 accumulation)
* ``activation(x[T, 2I]) -> [T, I]``: silu(x[:, :I]) * x[:, I:]
* ``rotary(positions[T], q[T, Hq, D], k[T, Hkv, D], cos_sin_cache[P, D]) -> (q, k)``, NeoX style
* ``attention(q[T, Hq, D], k[S, Hkv, D], v[S, Hkv, D], cu_seqlens_q[B+1], cu_seqlens_k[B+1],
  scale) -> [T, Hq, D]``: varlen causal, bottom-right aligned, grouped-query heads (prefill)
* ``decode_attention(q[B, Hq, D], k_cache[slots, L, Hkv, D], v_cache[slots, L, Hkv, D], slots[B],
  lengths[B], scale) -> [B, Hq, D]``: one new token per sequence over the first lengths[b]
  positions of its cache slot (the decode step; captured in a CUDA graph on a GPU, so a
  candidate for it, and for rmsnorm, activation and rotary, must not sync with the host there)

The catalog, read by the loop::

    from engine.library import CATALOG, candidates_for
    for kernel, usable, reason in candidates_for("rmsnorm", "cuda"):
        ...  # kernel.path goes into the server config: kernels: {rmsnorm: <kernel.path>}

``LibraryKernel`` fields: ``op`` (a registry key), ``name`` (short id, unique), ``path`` (the
dotted path ``package.module:function`` that ``engine.serve.kernels.resolve_kernels`` imports),
``backend`` (``"torch"`` or ``"triton"``) and ``description``. ``available(device)`` answers
``(usable, reason)`` without importing the kernel (importing this package imports neither torch
nor triton): a Triton kernel needs triton and a GPU (CUDA or ROCm), or, on the CPU,
``TRITON_INTERPRET=1`` set before triton is imported (correct but slow: for correctness tests,
never for timing).
``reason`` says why not, or carries a note when usable.
``load()`` imports and returns the function.

The Triton and attention wrappers check their inputs (rank, dtype, device, shapes) and raise
``engine.library.LibraryInputError`` (a ``ValueError``) naming the argument rather than compute
garbage; a Triton wrapper given CPU tensors without the interpreter says it needs a GPU or
``TRITON_INTERPRET=1``. The two small torch ones (RMSNorm, SiLU-and-mul) are dispatch-bound and
leave shape errors to torch. None writes into its inputs. The Triton kernels use no
vendor-specific intrinsics: the tests compile them for sm_90 and gfx942 without a GPU.

To add a kernel: write the function in the module of its op with the registry signature, add a
``LibraryKernel`` to ``CATALOG``; ``tests/unit/test_library.py`` then checks it against the
registry default on that op's shapes, through ``resolve_kernels`` and inside the tiny model.
``python -m engine.library.cpu_timing`` times the torch ones against the defaults on the CPU.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from engine.library._base import INTERPRET_ENV, LibraryInputError, interpreted  # torch-free, as this module
from engine.serve.kernel_keys import KERNEL_KEYS

__all__ = ["BACKENDS", "CATALOG", "LibraryInputError", "LibraryKernel", "candidates_for", "kernel_named"]

BACKENDS = ("torch", "triton")
OPS = KERNEL_KEYS


@dataclass(frozen=True)
class LibraryKernel:
    """One candidate: the registry op it replaces and the dotted path the server config names."""

    op: str
    name: str
    path: str
    backend: str
    description: str

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"{self.name}: unknown op {self.op!r} (known: {', '.join(OPS)})")
        if self.backend not in BACKENDS:
            raise ValueError(f"{self.name}: unknown backend {self.backend!r} (known: {', '.join(BACKENDS)})")
        if ":" not in self.path:
            raise ValueError(f"{self.name}: path {self.path!r} must be 'package.module:function'")

    @property
    def module(self) -> str:
        return self.path.partition(":")[0]

    @property
    def function(self) -> str:
        return self.path.partition(":")[2]

    def load(self) -> Callable[..., Any]:
        """Import the kernel's module and return the function."""
        return getattr(importlib.import_module(self.module), self.function)

    def available(self, device: Any) -> tuple[bool, str]:
        """Whether this kernel can run on ``device`` ("cpu", "cuda", "cuda:1", a torch.device;
        ROCm devices are "cuda" in torch), and why not; the reason may hold a note when usable."""
        kind = str(device).partition(":")[0]
        if kind not in ("cpu", "cuda"):
            return False, f"device {str(device)!r} is not supported (cpu or cuda, which includes ROCm)"
        if kind == "cuda" and not _gpu_visible():
            return False, "no CUDA or ROCm GPU is visible to torch"
        if self.backend == "torch":
            return True, ""
        if importlib.util.find_spec("triton") is None:
            return False, "triton is not installed"
        if kind == "cuda":
            return True, ""
        if os.environ.get(INTERPRET_ENV) != "1":
            return False, (f"on the CPU a Triton kernel runs only in Triton's interpreter ({INTERPRET_ENV}=1 set "
                           "before triton is imported), correct but far too slow to serve or to win a timing: it "
                           "is a candidate on a GPU")
        # Triton reads the variable at import and decoration time: what was imported before it
        # was set is built for a GPU, and mixing the two fails at launch.
        for module in ("triton.language.standard", self.module):
            loaded = sys.modules.get(module)
            if loaded is not None and not _module_interpreted(loaded):
                return False, (f"{module} was imported before {INTERPRET_ENV}=1 was set, so its kernels are "
                               "built for a GPU; start a fresh process with the variable set")
        return True, "runs in the Triton interpreter: correct but slow, for tests, not timing"


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _module_interpreted(module: Any) -> bool:
    kernels = [v for v in vars(module).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
    return all(interpreted(k) for k in kernels)


CATALOG: tuple[LibraryKernel, ...] = (
    LibraryKernel("rmsnorm", "rmsnorm_triton", "engine.library.rmsnorm:rmsnorm_triton", "triton",
                  "One program per row, float32 accumulation; rows up to 16384 in one power-of-two block "
                  "(one read, one write), wider rows in two chunked passes."),
    LibraryKernel("rmsnorm", "rmsnorm_torch_fused", "engine.library.rmsnorm:rmsnorm_torch_fused", "torch",
                  "Eager, float32 accumulation: F.rms_norm for small inputs, a single-pass vector_norm "
                  "reduction with in-place scaling for large ones; fewer passes than the default."),
    LibraryKernel("activation", "silu_and_mul_triton", "engine.library.activation:silu_and_mul_triton", "triton",
                  "Fused SiLU-and-mul: one read of x, one write, float32 arithmetic rounded once."),
    LibraryKernel("activation", "silu_and_mul_torch_inplace", "engine.library.activation:silu_and_mul_torch_inplace",
                  "torch", "silu(gate) then an in-place multiply by up: one [T, I] buffer and one pass fewer "
                  "than the default, bit-identical to it."),
    LibraryKernel("rotary", "rotary_triton", "engine.library.rotary:rotary_triton", "triton",
                  "NeoX rotary of q and k in one launch, one program per token (cos/sin row read once); "
                  "returns new tensors, inputs untouched."),
    LibraryKernel("attention", "varlen_attention_padded", "engine.library.attention:varlen_attention_padded", "torch",
                  "The step's multi-token sequences padded into one batched SDPA call and its decode tokens into "
                  "another (the default: one call per prompt); whole prompts need no mask, others a causal + "
                  "padding mask with GQA folded into the query axis (no k/v repeat)."),
    LibraryKernel("attention", "varlen_attention_triton", "engine.library.attention:varlen_attention_triton", "triton",
                  "Varlen flash-attention forward (online softmax, float32 accumulation), causal bottom-right, "
                  "GQA, head size <= 256; no host sync of cu_seqlens."),
    LibraryKernel("decode_attention", "decode_attention_grouped", "engine.library.attention:decode_attention_grouped",
                  "torch", "The default's masked SDPA over the gathered cache slots with each kv group's query heads "
                  "folded into the query axis: k/v are not repeated per query head."),
    LibraryKernel("decode_attention", "decode_attention_rowwise", "engine.library.attention:decode_attention_rowwise",
                  "triton", "One program per (sequence, query head) walking its whole context with a float32 online "
                  "softmax (K/V blocks read once per query head); the server's GPU default before flash-decoding."),
    LibraryKernel("decode_attention", "decode_attention_split", "engine.library.attention:decode_attention_split",
                  "triton", "Flash-decoding: grid (B, Hkv, splits of the context), each program serving all query "
                  "heads of its kv head (each K/V block read once, one tl.dot), float32 online softmax, then a "
                  "combine launch; splits from the cache capacity only, lengths read on the device (capturable)."),
)


def kernel_named(name: str) -> LibraryKernel:
    """The catalog entry called ``name`` (KeyError listing the names otherwise)."""
    for k in CATALOG:
        if k.name == name:
            return k
    raise KeyError(f"no library kernel {name!r} (known: {', '.join(k.name for k in CATALOG)})")


def candidates_for(op: str, device: Any) -> list[tuple[LibraryKernel, bool, str]]:
    """Every catalog entry for registry op ``op``, each with ``available(device)``."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (known: {', '.join(OPS)})")
    return [(k, *k.available(device)) for k in CATALOG if k.op == op]

"""The kernel registry of the built-in server: the four hot operations of a Llama decoder layer,
each an eager PyTorch default that a config can replace by a candidate (PyTorch or a Triton
wrapper) named by dotted path, ``package.module:function`` or ``package.module.function``.

This is how a kernel that won ``magpie compare`` is integrated and re-benchmarked: point the
server config's ``kernels:`` block at it. Overrides are imported and their signatures checked
when the server starts, so a typo fails before any request, naming the key and the path.

Signatures (tokens are packed: T = total new tokens of all sequences in the step):

* ``rmsnorm(x[T, H], weight[H], eps: float) -> [T, H]``
* ``activation(x[T, 2I]) -> [T, I]``: silu(x[:, :I]) * x[:, I:] (vLLM's ``silu_and_mul``)
* ``rotary(positions[T] int64, q[T, Hq, D], k[T, Hkv, D], cos_sin_cache[P, D]) -> (q, k)``:
  NeoX-style rotation of the two halves of D; the cache row p is cos(p·f) ‖ sin(p·f), float32
* ``attention(q[T, Hq, D], k[S, Hkv, D], v[S, Hkv, D], cu_seqlens_q[B+1] int32,
  cu_seqlens_k[B+1] int32, scale: float) -> [T, Hq, D]``: variable-length causal attention as
  in flash-attn's varlen API: sequence i owns rows cu_q[i]:cu_q[i+1] of q and cu_k[i]:cu_k[i+1]
  of k/v (its whole context), the causal mask aligned to the bottom right (the new tokens are
  the last ones of the context); Hq is a multiple of Hkv (grouped-query attention).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.errors import MagpieError

KERNEL_KEYS: tuple[str, ...] = ("rmsnorm", "activation", "rotary", "attention")


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


def _varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
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


_DEFAULTS: dict[str, Callable] = {
    "rmsnorm": rmsnorm,
    "activation": silu_and_mul,
    "rotary": rotary,
    "attention": varlen_attention,
}
# Positional parameters each kernel is called with (its signature must accept exactly these).
_ARITY: dict[str, int] = {"rmsnorm": 3, "activation": 1, "rotary": 4, "attention": 6}


@dataclass(frozen=True)
class Kernels:
    """The resolved kernels a model calls; ``sources`` says where each came from."""

    rmsnorm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    activation: Callable[[torch.Tensor], torch.Tensor]
    rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    attention: Callable[..., torch.Tensor]
    sources: Mapping[str, str]


def _import(key: str, path: str) -> Callable:
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise KernelError(f"kernels.{key}: {path!r} is not a dotted path "
                          "(expected 'package.module:function' or 'package.module.function')")
    try:
        module = importlib.import_module(module_name)
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


def resolve_kernels(overrides: Mapping[str, str] | None = None) -> Kernels:
    """The defaults with ``overrides`` (kernel key → dotted path) swapped in, each imported and
    checked; raises ``KernelError`` naming the key and path of the first bad one."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(KERNEL_KEYS))
    if unknown:
        raise KernelError(f"kernels.{unknown[0]}: unknown kernel key (known: {', '.join(KERNEL_KEYS)})")
    chosen: dict[str, Callable] = {}
    sources: dict[str, str] = {}
    for key in KERNEL_KEYS:
        path = overrides.get(key)
        if path is None:
            chosen[key] = _DEFAULTS[key]
            sources[key] = f"{__name__}:{_DEFAULTS[key].__name__}"
            continue
        if not isinstance(path, str) or not path.strip():
            raise KernelError(f"kernels.{key}: expected a dotted path string, got {path!r}")
        fn = _import(key, path.strip())
        _check_signature(key, path, fn)
        chosen[key] = fn
        sources[key] = path.strip()
    return Kernels(sources=sources, **chosen)

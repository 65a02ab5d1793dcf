"""Rotary candidate for the registry op ``rotary(positions[T], q[T, Hq, D], k[T, Hkv, D],
cos_sin_cache[P, D]) -> (q, k)``: NeoX style (the two halves of D rotate together), as
``engine.serve.kernels.rotary``; cache row p is cos(p·f) ‖ sin(p·f).

``rotary_triton`` returns new contiguous tensors and never writes into the caller's q and k (the
model's q and k are views into the fused QKV projection). One program per token rotates all of
its q heads and k heads, reading that token's cos/sin row once; the arithmetic is float32.
"""

from __future__ import annotations

import torch

from engine.library._common import INDEX_DTYPES, LibraryInputError, check_tensor, last_dim_contiguous
from engine.library._triton import require_runnable, tl, triton, triton_jit


@triton_jit
def _rotate_heads(x_ptr, out_ptr, token, tok_stride, head_stride, out_tok_stride, n_heads, half, cos, sin,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < n_heads) & (d[None, :] < half)
    src = x_ptr + token * tok_stride + heads[:, None] * head_stride + d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + token * out_tok_stride + heads[:, None] * (2 * half) + d[None, :]
    ty = out_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(ty), mask=mask)
    tl.store(dst + half, (x2 * cos[None, :] + x1 * sin[None, :]).to(ty), mask=mask)


@triton_jit
def _rotary_triton_kernel(pos_ptr, cache_ptr, cache_stride, q_ptr, q_tok_stride, q_head_stride, q_out_ptr, n_q_heads,
                   k_ptr, k_tok_stride, k_head_stride, k_out_ptr, n_k_heads, half,
                   BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    row = cache_ptr + pos * cache_stride
    cos = tl.load(row + d, mask=d < half, other=0.0).to(tl.float32)
    sin = tl.load(row + half + d, mask=d < half, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, q_out_ptr, token, q_tok_stride, q_head_stride, n_q_heads * 2 * half, n_q_heads, half,
                  cos, sin, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, k_out_ptr, token, k_tok_stride, k_head_stride, n_k_heads * 2 * half, n_k_heads, half,
                  cos, sin, BLOCK_HK, BLOCK_HALF)


def _check(name: str, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor) -> None:
    check_tensor(name, "q", q, ndim=3)
    check_tensor(name, "k", k, ndim=3, dtypes=(q.dtype,), device=q.device)
    check_tensor(name, "positions", positions, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    check_tensor(name, "cos_sin_cache", cache, ndim=2, device=q.device)
    t, _, d = q.shape
    if k.shape[0] != t or positions.shape[0] != t:
        raise LibraryInputError(f"{name}: q, k and positions must have the same number of tokens, got "
                                f"{t}, {k.shape[0]} and {positions.shape[0]}")
    if d % 2 or k.shape[2] != d:
        raise LibraryInputError(f"{name}: q and k need the same even head size, got {d} and {k.shape[2]}")
    if cache.shape[1] != d:
        raise LibraryInputError(f"{name}: cos_sin_cache rows have {cache.shape[1]} values, the head size is {d}")
    # Bounds cost nothing to check on the host; on a GPU it would be a device sync per call, so
    # there (as in vLLM's kernels) positions < P is the caller's contract.
    if positions.device.type == "cpu" and t and (int(positions.min()) < 0 or int(positions.max()) >= cache.shape[0]):
        raise LibraryInputError(f"{name}: positions must lie in [0, {cache.shape[0]}), got "
                                f"[{int(positions.min())}, {int(positions.max())}]")


def rotary_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                  cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton NeoX rotary of q and k; returns new tensors, the inputs are left untouched."""
    name = "rotary_triton"
    _check(name, positions, q, k, cos_sin_cache)
    require_runnable(name, _rotary_triton_kernel, (q,))
    q, k = last_dim_contiguous(q), last_dim_contiguous(k)
    cache, positions = last_dim_contiguous(cos_sin_cache), positions.contiguous()
    q_out, k_out = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)
    tokens, n_q, d = q.shape
    if tokens == 0:
        return q_out, k_out
    half = d // 2
    _rotary_triton_kernel[(tokens,)](positions, cache, cache.stride(0), q, q.stride(0), q.stride(1), q_out, n_q,
                              k, k.stride(0), k.stride(1), k_out, k.shape[1], half,
                              BLOCK_HQ=triton.next_power_of_2(n_q), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
                              BLOCK_HALF=triton.next_power_of_2(half), num_warps=4)
    return q_out, k_out

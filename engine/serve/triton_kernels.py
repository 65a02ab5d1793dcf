"""Triton kernels: the built-in server's registry defaults on a GPU (CUDA or ROCm) for rmsnorm,
activation and rotary, with the signatures of ``engine.serve.kernels``, the KV-cache write of a
layer's new keys and values in one launch (``write_kv``, not a registry op), and a one-pass decode
attention (the library's ``decode_attention_rowwise`` candidate; the GPU default is the library's
flash-decoding kernel, see ``engine.serve.kernels``).

Why: a decode step of a small batch is launch-bound, and the PyTorch references take up to nine
launches each (rmsnorm: cast, square, mean, add, rsqrt, two multiplies, cast back; rotary about
twenty for q and k); each of these is one. All of them accumulate in float32 like the references.

Each launch is capturable in a CUDA graph: no host syncs, outputs from torch's allocator, a fixed
block size (no autotuning, which would time candidates during a capture). Sequence lengths are
read from device memory inside the kernel, so one captured decode graph serves every length.

On the CPU these run in Triton's interpreter (``TRITON_INTERPRET=1`` before this module is
imported), which is how the tests check them against the references.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(X, W, Out, stride_x, stride_o, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + cols, (x * inv * w).to(Out.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    return max(1, min(8, block // 256))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows, cols = x.shape
    if rows:
        block = triton.next_power_of_2(cols)
        _rmsnorm_kernel[(rows,)](x, weight, out, x.stride(0), out.stride(0), cols, eps, BLOCK=block,
                                 num_warps=_warps(block))
    return out


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Out + row * stride_o + cols, out.to(Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, width = x.shape
    half = width // 2
    out = torch.empty((rows, half), dtype=x.dtype, device=x.device)
    if rows:
        block = min(1024, triton.next_power_of_2(half))
        _silu_and_mul_kernel[(rows, triton.cdiv(half, block))](x, out, x.stride(0), out.stride(0), half, BLOCK=block,
                                                              num_warps=_warps(block))
    return out


@triton.jit
def _rotary_kernel(Pos, Q, K, Cache, QO, KO, sq_t, sq_h, sk_t, sk_h, soq_t, soq_h, sok_t, sok_h, sc,
                   HQ: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr):
    # One program per (token, head), the query heads first and then the key heads.
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(Pos + t).to(tl.int64)
    i = tl.arange(0, BLOCK)
    mask = i < HALF
    cos = tl.load(Cache + pos * sc + i, mask=mask, other=0.0)
    sin = tl.load(Cache + pos * sc + HALF + i, mask=mask, other=0.0)
    if h < HQ:
        src = Q + t * sq_t + h * sq_h
        dst = QO + t * soq_t + h * soq_h
    else:
        src = K + t * sk_t + (h - HQ) * sk_h
        dst = KO + t * sok_t + (h - HQ) * sok_h
    x1 = tl.load(src + i, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst + i, (x1 * cos - x2 * sin).to(QO.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + i, (x2 * cos + x1 * sin).to(QO.dtype.element_ty), mask=mask)


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
           cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    tokens, hq, d = q.shape
    q_out = torch.empty((tokens, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if tokens:
        half = d // 2
        _rotary_kernel[(tokens, hq + k.shape[1])](
            positions, q, k, cos_sin_cache, q_out, k_out, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos_sin_cache.stride(0),
            HQ=hq, HALF=half, BLOCK=triton.next_power_of_2(half), num_warps=1)
    return q_out, k_out


@triton.jit
def _write_kv_kernel(K, V, KC, VC, Rows, sk_t, sv_t, N: tl.constexpr, BLOCK: tl.constexpr):
    # One program per new token: its key and value (N = Hkv * D contiguous elements each) into
    # row Rows[t] of the layer's flat caches.
    t = tl.program_id(0).to(tl.int64)
    row = tl.load(Rows + t).to(tl.int64)
    i = tl.arange(0, BLOCK)
    mask = i < N
    tl.store(KC + row * N + i, tl.load(K + t * sk_t + i, mask=mask), mask=mask)
    tl.store(VC + row * N + i, tl.load(V + t * sv_t + i, mask=mask), mask=mask)


def write_kv(k_flat: torch.Tensor, v_flat: torch.Tensor, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """``k_flat.index_copy_(0, rows, k)`` and the same for v, in one launch instead of two (a
    decode step writes 2 x layers small rows: the launches, not the bytes, are its cost). Rows
    whose [Hkv, D] part is not contiguous (v is a view into the QKV projection, its heads packed)
    take index_copy_."""
    tokens = rows.shape[0]
    n = k_flat.shape[1] * k_flat.shape[2]
    packed = all(t.shape[1:] == k_flat.shape[1:] and t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (k, v))
    if not (packed and k_flat.is_contiguous() and v_flat.is_contiguous()):
        k_flat.index_copy_(0, rows, k)
        v_flat.index_copy_(0, rows, v)
    elif tokens:
        block = triton.next_power_of_2(n)
        _write_kv_kernel[(tokens,)](k, v, k_flat, v_flat, rows, k.stride(0), v.stride(0), N=n, BLOCK=block,
                                    num_warps=max(1, min(4, block // 256)))


@triton.jit
def _decode_attention_kernel(Q, K, V, Out, Slots, Lens, scale, sq_b, sq_h, sk_s, sk_n, sk_h, sv_s, sv_n, sv_h, so_b, so_h,
                             GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    # One program per (sequence, query head): an online softmax over the sequence's keys in
    # blocks of BLOCK_N, up to its length read from memory (so the launch is length-independent).
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kv_head = h // GROUPS
    slot = tl.load(Slots + b).to(tl.int64)
    n_ctx = tl.load(Lens + b)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(Q + b * sq_b + h * sq_h + d, mask=d_mask, other=0.0).to(tl.float32) * scale
    k_base = K + slot * sk_s + kv_head * sk_h
    v_base = V + slot * sv_s + kv_head * sv_h
    m = -float("inf")
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, n_ctx, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_mask = n < n_ctx
        tile_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + n[:, None] * sk_n + d[None, :], mask=tile_mask, other=0.0).to(tl.float32)
        s = tl.where(n_mask, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        total = total * alpha + tl.sum(p, axis=0)
        v = tl.load(v_base + n[:, None] * sv_n + d[None, :], mask=tile_mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(Out + b * so_b + h * so_h + d, (acc / total).to(Out.dtype.element_ty), mask=d_mask)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, scale: float) -> torch.Tensor:
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("decode_attention: the KV cache's head dimension must be contiguous")
    batch, hq, d = q.shape
    out = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    if batch:
        block_d = triton.next_power_of_2(d)
        # Two [BLOCK_N, BLOCK_D] float32 tiles (K and V) in registers: 4096 elements each.
        block_n = max(16, min(64, 4096 // block_d))
        _decode_attention_kernel[(batch, hq)](
            q, k_cache, v_cache, out, slots, lengths, scale, q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), out.stride(0), out.stride(1),
            GROUPS=hq // k_cache.shape[2], HEAD_DIM=d, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=4)
    return out

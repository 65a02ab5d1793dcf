"""Attention candidates for the registry op ``attention(q[T, Hq, D], k[S, Hkv, D], v[S, Hkv, D],
cu_seqlens_q[B+1], cu_seqlens_k[B+1], scale) -> [T, Hq, D]``: variable-length causal attention,
the mask aligned to the bottom right (query i of a sequence with sq new tokens and sk keys sees
keys 0 .. sk - sq + i), grouped-query heads (query head h reads kv head h // (Hq / Hkv)), as
``engine.serve.kernels.varlen_attention``.

* ``varlen_attention_padded`` (torch): the step's multi-token sequences padded into ONE batched
  SDPA call and its decode tokens into another, instead of the default's one call per
  prefilling sequence. Whole prompts (new tokens == context) need no mask: plain causal is exact
  under right padding. Otherwise a combined causal + padding mask, and GQA without copying k/v
  per query head: a group's query heads are folded into the query-length axis. Padded query
  rows are clamped copies of a real row (never fully masked, so never NaN) and are dropped.
* ``decode_attention_grouped`` (torch), for the registry op ``decode_attention(q[B, Hq, D],
  k_cache[slots, L, Hkv, D], v_cache[...], slots[B], lengths[B], scale) -> [B, Hq, D]``: the
  default's masked SDPA over the gathered slots, without repeating k/v per query head.
* ``varlen_attention_triton``: a varlen flash-attention forward (online softmax, float32
  accumulation); one program per (block of a sequence's queries, query head). The grid is sized
  from T and B only (cdiv(T, BLOCK_M) + B blocks at most), so it needs no device-to-host sync of
  cu_seqlens and can be captured in a CUDA graph: each program finds its sequence and block from
  cu_seqlens_q on the device (a prefix sum of the sequences' block counts), and the programs past
  the last block return at once. (A grid of (blocks of T, heads, B) would launch B times the
  work, nearly all of it idle programs, when a step packs many sequences.)
* ``decode_attention_split`` (Triton), for ``decode_attention``: flash-decoding in two launches.
  The first has one program per (sequence, kv head, split): it serves all Hq / Hkv query heads of
  its kv head at once (each K/V block is read once, as one [G, D] x [D, BLOCK_N] ``tl.dot``, G
  padded to 16) and walks the blocks split, split + SPLITS, ... of the sequence's context (the
  splits stay balanced at any length), keeping a float32 online softmax, and writes its partial
  (max, sum, acc) per query head. The second combines the splits of each (sequence, query head).
  SPLITS depends on shapes only: as few as give the GPU about two programs per SM for the
  batch's B x Hkv (sequence, kv head) pairs, at most min(DECODE_MAX_SPLITS, cdiv(L, BLOCK_N)).
  A large batch needs one split, and then the first launch writes the output itself (no
  partials, no combine). The lengths are read from device memory and programs past a length
  return at once, so one launch serves every length (CUDA-graph capturable: no host sync,
  partial buffers sized from shapes).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.library._common import INDEX_DTYPES, LibraryInputError, check_tensor, last_dim_contiguous
from engine.library._triton import require_runnable, tl, triton, triton_jit
from engine.serve.kernels import HOST_OFFSETS_ATTR

# Not cuDNN: it builds a graph per shape (see engine.serve.kernels). Flash serves the unmasked
# calls (and, on the CPU, masked ones too); a masked call on a GPU falls to efficient attention.
_PADDED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# enable_gqa arrived in torch 2.5; older builds repeat k/v per query head instead.
_SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def _check(name: str, q, k, v, cu_q, cu_k, scale) -> None:
    check_tensor(name, "q", q, ndim=3)
    check_tensor(name, "k", k, ndim=3, dtypes=(q.dtype,), device=q.device)
    check_tensor(name, "v", v, ndim=3, dtypes=(q.dtype,), device=q.device)
    check_tensor(name, "cu_seqlens_q", cu_q, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    check_tensor(name, "cu_seqlens_k", cu_k, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    if v.shape != k.shape:
        raise LibraryInputError(f"{name}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[2] != q.shape[2]:
        raise LibraryInputError(f"{name}: q and k have head sizes {q.shape[2]} and {k.shape[2]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise LibraryInputError(f"{name}: Hq ({q.shape[1]}) must be a multiple of Hkv ({k.shape[1]})")
    if cu_q.shape[0] < 2 or cu_k.shape != cu_q.shape:
        raise LibraryInputError(f"{name}: cu_seqlens_q and cu_seqlens_k must both hold B + 1 >= 2 offsets, got "
                                f"{cu_q.shape[0]} and {cu_k.shape[0]}")
    if not isinstance(scale, (int, float)):
        raise LibraryInputError(f"{name}: scale must be a float, got {type(scale).__name__}")


def _check_offsets(name: str, cq: list[int], ck: list[int], tokens: int, keys: int) -> None:
    if cq[0] != 0 or ck[0] != 0 or cq[-1] != tokens or ck[-1] != keys:
        raise LibraryInputError(f"{name}: cu_seqlens must run from 0 to T={tokens} (q) and S={keys} (k), "
                                f"got {cq[0]}..{cq[-1]} and {ck[0]}..{ck[-1]}")
    for i in range(len(cq) - 1):
        sq, sk = cq[i + 1] - cq[i], ck[i + 1] - ck[i]
        if sq < 0 or sk < sq:
            raise LibraryInputError(f"{name}: sequence {i} has {sq} new tokens and {sk} keys; need 0 <= new <= keys "
                                    "(the new tokens are the last of the context)")


def varlen_attention_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                            cu_seqlens_k: torch.Tensor, scale: float) -> torch.Tensor:
    """The step's multi-token sequences in one padded SDPA call and its decode tokens in another
    (torch only: CPU and GPU), instead of one call per prefilling sequence."""
    name = "varlen_attention_padded"
    _check(name, q, k, v, cu_seqlens_q, cu_seqlens_k, scale)
    cq, ck = getattr(cu_seqlens_q, HOST_OFFSETS_ATTR, None), getattr(cu_seqlens_k, HOST_OFFSETS_ATTR, None)
    if cq is None or ck is None:  # no host copy from the model: the one device sync
        cq, ck = torch.stack((cu_seqlens_q.long(), cu_seqlens_k.long())).tolist()
    _check_offsets(name, cq, ck, q.shape[0], k.shape[0])
    # Two buckets, not one: padding a decode token to the longest prompt's length would cost that
    # many query rows of work for each (measured 3-9x slower than the default on mixed CPU steps).
    multi = [i for i in range(len(cq) - 1) if cq[i + 1] - cq[i] > 1]
    decode = [i for i in range(len(cq) - 1) if cq[i + 1] - cq[i] == 1]
    if not multi or not decode:  # one bucket: its rows come out in the packed order of q
        seqs = multi or decode
        return _padded_sdpa(q, k, v, cq, ck, seqs, scale) if seqs else torch.empty_like(q)
    out = torch.empty_like(q)
    for seqs in (multi, decode):
        rows = torch.tensor([r for i in seqs for r in range(cq[i], cq[i + 1])], device=q.device)
        out[rows] = _padded_sdpa(q, k, v, cq, ck, seqs, scale)
    return out


def _batched(x: torch.Tensor, cu: list[int], seqs: list[int], lens: list[int], length: int, dev: torch.device,
             ) -> torch.Tensor:
    """Rows ``cu[i]:cu[i+1]`` of each sequence of ``seqs`` as ``[B, length, H, D]``, right-padded.
    A view when the sequences are adjacent and of one length (a single prompt, a uniform batch):
    no gather at all. Otherwise padding slots repeat the sequence's last real row: in bounds and
    finite, then masked or dropped."""
    b = len(seqs)
    if all(n == length for n in lens) and cu[seqs[-1] + 1] - cu[seqs[0]] == b * length:
        return x[cu[seqs[0]]:cu[seqs[0]] + b * length].view(b, length, *x.shape[1:])
    starts = torch.tensor([cu[i] for i in seqs], device=dev)
    ends = torch.tensor([cu[i + 1] - 1 for i in seqs], device=dev)
    idx = torch.minimum(starts[:, None] + torch.arange(length, device=dev)[None, :], ends[:, None])
    return x[idx]


def _padded_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cq: list[int], ck: list[int], seqs: list[int],
                 scale: float) -> torch.Tensor:
    """Attention of sequences ``seqs`` (each with new tokens), right-padded into one batch; the
    rows of the result are theirs in packed order."""
    dev = q.device
    q_lens_l, k_lens_l = [cq[i + 1] - cq[i] for i in seqs], [ck[i + 1] - ck[i] for i in seqs]
    b, max_q, max_k = len(seqs), max(q_lens_l), max(k_lens_l)
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    groups = hq // hkv
    qb = _batched(q, cq, seqs, q_lens_l, max_q, dev)  # [B, max_q, Hq, D]
    kp = _batched(k, ck, seqs, k_lens_l, max_k, dev).transpose(1, 2)  # [B, Hkv, max_k, D]
    vp = _batched(v, ck, seqs, k_lens_l, max_k, dev).transpose(1, 2)
    if q_lens_l == k_lens_l:
        # Whole prompts: with right padding, real query i sees keys 0..i, all real, so plain
        # (top-left) causal is exact and no mask is needed (flash-eligible, skips masked blocks).
        qp = qb.transpose(1, 2)  # [B, Hq, max_q, D]
        with sdpa_kernel(_PADDED_BACKENDS):
            if _SDPA_HAS_GQA:
                op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=groups > 1)
            else:
                op = F.scaled_dot_product_attention(qp, kp.repeat_interleave(groups, dim=1),
                                                    vp.repeat_interleave(groups, dim=1), is_causal=True, scale=scale)
        op = op.transpose(1, 2).reshape(b * max_q, hq, d)
    else:
        q_lens, k_lens = torch.tensor([q_lens_l, k_lens_l], device=dev)
        rows, cols = torch.arange(max_q, device=dev), torch.arange(max_k, device=dev)
        # Query row i sees key j when j is a real key and j <= sk - sq + i (bottom-right causal).
        # Padded rows (i >= sq) see every real key: never an all-masked row, so never NaN.
        mask = (cols[None, None, :] < k_lens[:, None, None]) & \
               (cols[None, None, :] <= (k_lens - q_lens)[:, None, None] + rows[None, :, None])  # [B, max_q, max_k]
        # GQA with no k/v copy: [B, max_q, Hq, D] -> [B, Hkv, groups * max_q, D], query head
        # h = kv * groups + g in the rows of kv head kv (the mask repeats per group).
        qp = qb.reshape(b, max_q, hkv, groups, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, groups * max_q, d)
        mask = mask[:, None, None].expand(b, 1, groups, max_q, max_k).reshape(b, 1, groups * max_q, max_k)
        with sdpa_kernel(_PADDED_BACKENDS):
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale)
        op = op.view(b, hkv, groups, max_q, d).permute(0, 3, 1, 2, 4).reshape(b * max_q, hq, d)
    if all(n == max_q for n in q_lens_l):
        return op  # no padded rows to drop
    keep = torch.tensor([i < n for n in q_lens_l for i in range(max_q)], device=dev)
    return op[keep]


def _check_decode(name: str, q, k_cache, v_cache, slots, lengths) -> None:
    check_tensor(name, "q", q, ndim=3)
    check_tensor(name, "k_cache", k_cache, ndim=4, dtypes=(q.dtype,), device=q.device)
    check_tensor(name, "v_cache", v_cache, ndim=4, dtypes=(q.dtype,), device=q.device)
    check_tensor(name, "slots", slots, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    check_tensor(name, "lengths", lengths, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    if v_cache.shape != k_cache.shape or k_cache.shape[3] != d or hkv == 0 or hq % hkv:
        raise LibraryInputError(f"{name}: q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} and "
                                f"{tuple(v_cache.shape)} (same [slots, L, Hkv, D], Hq a multiple of Hkv)")
    if slots.shape[0] != b or lengths.shape[0] != b:
        raise LibraryInputError(f"{name}: {b} queries but {slots.shape[0]} slots and {lengths.shape[0]} lengths")


def decode_attention_grouped(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                             lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention (one token per sequence over its cache slot) with the query heads of a
    kv group folded into the query axis: k/v are gathered once per kv head, never repeated per
    query head (the default copies them Hq / Hkv times). Capturable on a GPU: no host sync there
    (the whole slot is read, padding masked); on the CPU the context stops at the longest length."""
    name = "decode_attention_grouped"
    _check_decode(name, q, k_cache, v_cache, slots, lengths)
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    ctx = int(lengths.max()) if lengths.device.type == "cpu" and b else k_cache.shape[1]
    kp = k_cache[slots, :ctx].transpose(1, 2)  # [B, Hkv, ctx, D]
    vp = v_cache[slots, :ctx].transpose(1, 2)
    valid = torch.arange(ctx, device=q.device)[None, :] < lengths[:, None]  # [B, ctx]
    with sdpa_kernel(_PADDED_BACKENDS):
        out = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), kp, vp, attn_mask=valid[:, None, None, :],
                                             scale=scale)
    return out.reshape(b, hq, d)


@triton_jit
def _varlen_flash_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, cu_k_ptr, scale,
                         q_tok_stride, q_head_stride, k_tok_stride, k_head_stride,
                         v_tok_stride, v_head_stride, o_tok_stride, o_head_stride, groups, head_dim, batch,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr,
                         IEEE: tl.constexpr):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    # Which (sequence, query block) this program serves: sequence s owns blocks
    # cum[s] - nb[s] .. cum[s] - 1 of the step, nb[s] = cdiv(its new tokens, BLOCK_M).
    offs_b = tl.arange(0, BLOCK_B)
    in_batch = offs_b < batch
    seq_starts = tl.load(cu_q_ptr + offs_b, mask=in_batch, other=0)
    seq_ends = tl.load(cu_q_ptr + offs_b + 1, mask=in_batch, other=0)
    nb = (seq_ends - seq_starts + BLOCK_M - 1) // BLOCK_M
    cum = tl.cumsum(nb, axis=0)
    if pid >= tl.sum(nb, axis=0):
        return
    seq = tl.sum((cum <= pid).to(tl.int32), axis=0)
    m_block = pid - tl.sum(tl.where(offs_b == seq, cum - nb, 0), axis=0)
    q_start = tl.load(cu_q_ptr + seq).to(tl.int64)
    sq = tl.load(cu_q_ptr + seq + 1).to(tl.int64) - q_start
    k_start = tl.load(cu_k_ptr + seq).to(tl.int64)
    sk = tl.load(cu_k_ptr + seq + 1).to(tl.int64) - k_start
    kv_head = head // groups
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_rows = q_ptr + (q_start + offs_m)[:, None] * q_tok_stride + head * q_head_stride + offs_d[None, :]
    qb = tl.load(q_rows, mask=(offs_m[:, None] < sq) & d_ok[None, :], other=0.0)
    shift = sk - sq  # query i sees keys 0 .. shift + i
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # No key past the last row's causal limit can be seen by any row of this block.
    end_n = tl.minimum(sk, shift + (m_block + 1) * BLOCK_M)
    for start_n in range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < sk
        kb = tl.load(k_ptr + (k_start + offs_n)[None, :] * k_tok_stride + kv_head * k_head_stride + offs_d[:, None],
                     mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
        if IEEE:  # float32 inputs: no TF32 rounding, to match the float32 reference
            s = tl.dot(qb, kb, input_precision="ieee")
        else:
            s = tl.dot(qb, kb)
        s = s * scale
        seen = n_ok[None, :] & (offs_n[None, :] <= shift + offs_m[:, None])
        s = tl.where(seen, s, float("-inf"))
        # Key 0 is seen by every row (shift >= 0), so m_new is finite from the first block on.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vb = tl.load(v_ptr + (k_start + offs_n)[:, None] * v_tok_stride + kv_head * v_head_stride + offs_d[None, :],
                     mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m_i = m_new
    out = acc / l_i[:, None]
    o_rows = o_ptr + (q_start + offs_m)[:, None] * o_tok_stride + head * o_head_stride + offs_d[None, :]
    tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=(offs_m[:, None] < sq) & d_ok[None, :])


def _check_offsets_on_host(name: str, cu_q: torch.Tensor, cu_k: torch.Tensor, tokens: int, keys: int) -> None:
    # Free on the CPU; on a GPU a check would cost a device sync per call, so there well-formed
    # offsets are the caller's contract (as in flash-attn's varlen API).
    if cu_q.device.type == "cpu":
        _check_offsets(name, cu_q.tolist(), cu_k.tolist(), tokens, keys)


def varlen_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                            cu_seqlens_k: torch.Tensor, scale: float) -> torch.Tensor:
    """Triton varlen flash attention (causal, bottom-right aligned, GQA); head size up to 256."""
    name = "varlen_attention_triton"
    _check(name, q, k, v, cu_seqlens_q, cu_seqlens_k, scale)
    require_runnable(name, _varlen_flash_kernel, (q,))
    tokens, hq, d = q.shape
    if d > 256:
        raise LibraryInputError(f"{name}: head size {d} is over the 256 this kernel supports")
    _check_offsets_on_host(name, cu_seqlens_q, cu_seqlens_k, tokens, k.shape[0])
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    batch = cu_seqlens_q.shape[0] - 1
    if tokens == 0:
        return out
    block_d = max(triton.next_power_of_2(d), 16)  # tl.dot needs every dimension >= 16
    # A decode-only step (one token per sequence) wastes less of a small query block.
    block_m = 16 if tokens == batch else (64 if q.element_size() == 2 and block_d <= 128 else 32)
    block_n = 64 if q.element_size() == 2 and block_d <= 128 else 32
    # Sum over sequences of cdiv(sq, BLOCK_M) is at most cdiv(T, BLOCK_M) + B - 1.
    grid = (triton.cdiv(tokens, block_m) + batch - 1, hq)
    _varlen_flash_kernel[grid](q, k, v, out, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), float(scale),
                               q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                               out.stride(0), out.stride(1), hq // k.shape[1], d, batch,
                               BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                               BLOCK_B=max(triton.next_power_of_2(batch), 2),
                               IEEE=q.dtype == torch.float32, num_warps=4)
    return out


# ------------------------------------------------------------------------------ flash-decoding
# Most splits of one (sequence, kv head): enough that a batch of 1 with 8 kv heads gives ~128
# programs at a long context (one per SM of an H100/H200), few enough that short contexts (whose
# blocks fill only the first splits) leave few idle programs to retire. A function of the
# cache capacity L only, never of the lengths: the grid must be the same for every decode step.
DECODE_MAX_SPLITS = 16
_LOG2E = 1.4426950408889634


def decode_splits(capacity: int, block_n: int, pairs: int = 1, programs: int = 0) -> int:
    """The number of splits of each of ``pairs`` (sequence, kv head) for a cache of ``capacity``
    positions: the fewest that launch ``programs`` programs (0: as many as the capacity allows).
    Each split beyond one costs partials written and read again, and a second launch."""
    most = max(1, min(DECODE_MAX_SPLITS, -(-capacity // block_n)))
    return most if programs <= 0 else max(1, min(most, -(-programs // max(pairs, 1))))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count  # CUs on ROCm


def decode_programs(device: torch.device) -> int:
    """How many split programs a decode launch aims for on ``device``: two per SM (compute unit
    on ROCm) keeps every SM streaming K/V; 0 on the CPU (the interpreter: every split)."""
    if device.type != "cuda":
        return 0
    return 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@triton_jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, slots_ptr, lens_ptr, acc_ptr, max_ptr, sum_ptr, out_ptr, scale_log2,
                         q_b_stride, q_h_stride, k_slot_stride, k_pos_stride, k_head_stride,
                         v_slot_stride, v_pos_stride, v_head_stride, out_b_stride, out_h_stride,
                         capacity, n_q_heads, groups, head_dim,
                         BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                         DIRECT: tl.constexpr):
    # Program (sequence b, kv head, split s) covers blocks s, s + SPLITS, s + 2 * SPLITS, ... of
    # sequence b's context, for the ``groups`` query heads of its kv head (rows of one tile).
    # DIRECT (one split): the program holds the whole softmax and writes the output itself.
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2).to(tl.int64)  # so the block loop's offsets are int64
    n_splits = tl.num_programs(2)
    n_ctx = tl.minimum(tl.load(lens_ptr + b).to(tl.int32), capacity)  # a length past L reads L
    n_blocks = tl.cdiv(n_ctx, BLOCK_N)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_ok = offs_g < groups
    d_ok = offs_d < head_dim
    heads = kv_head * groups + offs_g
    out_rows = out_ptr + b * out_b_stride + heads[:, None] * out_h_stride + offs_d[None, :]
    if split >= n_blocks:  # nothing of this sequence here; the combine skips this split
        if DIRECT:  # length 0: zeros, as the combine gives
            tl.store(out_rows, tl.zeros([BLOCK_G, BLOCK_D], dtype=out_ptr.dtype.element_ty),
                     mask=g_ok[:, None] & d_ok[None, :])
        return
    slot = tl.load(slots_ptr + b).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    qb = tl.load(q_ptr + b * q_b_stride + heads[:, None] * q_h_stride + offs_d[None, :],
                 mask=g_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_G, BLOCK_D]; padded rows are 0
    k_base = k_ptr + slot * k_slot_stride + kv_head * k_head_stride
    v_base = v_ptr + slot * v_slot_stride + kv_head * v_head_stride
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for block in range(split, n_blocks, n_splits):
        start = block * BLOCK_N  # the block's offset in int64, its rows in int32
        n_ok = offs_n < (n_ctx - start).to(tl.int32)
        # Masked loads: whatever lies past the length (stale values, NaN) is never read.
        tile = n_ok[:, None] & d_ok[None, :]
        kb = tl.load(k_base + start * k_pos_stride + offs_n[:, None] * k_pos_stride + offs_d[None, :], mask=tile,
                     other=0.0)  # [BLOCK_N, BLOCK_D]
        if IEEE:  # float32 inputs: no TF32 rounding, to match the float32 reference
            s = tl.dot(qb, tl.trans(kb), input_precision="ieee")
        else:
            s = tl.dot(qb, tl.trans(kb))
        s = tl.where(n_ok[None, :], s * scale_log2, float("-inf"))  # [BLOCK_G, BLOCK_N], log2 units
        # Every block walked holds position block * BLOCK_N < n_ctx, so m_new is finite and the
        # first block's alpha is exp2(-inf) = 0.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vb = tl.load(v_base + start * v_pos_stride + offs_n[:, None] * v_pos_stride + offs_d[None, :], mask=tile,
                     other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m_i = m_new
    if DIRECT:
        tl.store(out_rows, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:
        rows = (b * n_q_heads + heads) * n_splits + split  # [BLOCK_G] rows of the partial buffers
        tl.store(acc_ptr + rows[:, None] * head_dim + offs_d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
        tl.store(max_ptr + rows, m_i, mask=g_ok)
        tl.store(sum_ptr + rows, l_i, mask=g_ok)


@triton_jit
def _decode_combine_kernel(acc_ptr, max_ptr, sum_ptr, lens_ptr, out_ptr, out_b_stride, out_h_stride, capacity,
                           n_splits, head_dim, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    # Program (sequence b, query head h): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s
    # over the splits that held a block of the sequence (the others wrote nothing).
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    n_ctx = tl.minimum(tl.load(lens_ptr + b).to(tl.int32), capacity)
    n_active = tl.minimum(tl.cdiv(n_ctx, BLOCK_N), n_splits)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < n_active
    d_ok = offs_d < head_dim
    rows = (b * tl.num_programs(1) + h) * n_splits + offs_s
    m = tl.load(max_ptr + rows, mask=s_ok, other=float("-inf"))
    l_s = tl.load(sum_ptr + rows, mask=s_ok, other=0.0)
    acc = tl.load(acc_ptr + rows[:, None] * head_dim + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    w = tl.where(s_ok, tl.exp2(m - tl.max(m, axis=0)), 0.0)  # the largest split's weight is 1
    total = tl.sum(w * l_s, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(n_active > 0, total, 1.0)  # length 0: zeros, not NaN
    tl.store(out_ptr + b * out_b_stride + h * out_h_stride + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def _check_decode_on_host(name: str, slots: torch.Tensor, lengths: torch.Tensor, n_slots: int) -> None:
    # Free on the CPU; on a GPU it would be a device sync per call (and none may happen inside a
    # CUDA-graph capture), so there valid slots and lengths >= 1 are the caller's contract.
    if slots.device.type != "cpu" or slots.shape[0] == 0:
        return
    lo, hi = int(slots.min()), int(slots.max())
    if lo < 0 or hi >= n_slots:
        raise LibraryInputError(f"{name}: slots must lie in [0, {n_slots}), got [{lo}, {hi}]")
    if int(lengths.min()) < 1:
        raise LibraryInputError(f"{name}: lengths must be >= 1, got a minimum of {int(lengths.min())}")


def decode_attention_rowwise(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                             lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """The server's one-pass Triton decode attention (``engine.serve.triton_kernels``: one program
    per sequence and query head over its whole context), with the library's input checks."""
    from engine.serve import triton_kernels
    name = "decode_attention_rowwise"
    _check_decode(name, q, k_cache, v_cache, slots, lengths)
    require_runnable(name, triton_kernels._decode_attention_kernel, (q,))
    _check_decode_on_host(name, slots, lengths, k_cache.shape[0])
    return triton_kernels.decode_attention(q, k_cache, v_cache, slots, lengths, float(scale))


def decode_attention_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                           lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """Triton flash-decoding (split context, GQA-shared K/V blocks, float32 online softmax, one
    combine launch); head size up to 256. Capturable in a CUDA graph: no host sync on a GPU and a
    grid that depends on the shapes only. A length past the capacity L reads L positions."""
    name = "decode_attention_split"
    _check_decode(name, q, k_cache, v_cache, slots, lengths)
    if not isinstance(scale, (int, float)):
        raise LibraryInputError(f"{name}: scale must be a float, got {type(scale).__name__}")
    require_runnable(name, _decode_split_kernel, (q,))
    b, hq, d = q.shape
    n_slots, capacity, hkv, _ = k_cache.shape
    if d > 256:
        raise LibraryInputError(f"{name}: head size {d} is over the 256 this kernel supports")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        # A copy would be correct but would move the whole cache on every call.
        raise LibraryInputError(f"{name}: k_cache and v_cache need a contiguous head dimension (stride 1), got "
                                f"strides {k_cache.stride(3)} and {v_cache.stride(3)}")
    _check_decode_on_host(name, slots, lengths, n_slots)
    q = last_dim_contiguous(q)
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    slots, lengths = slots.contiguous(), lengths.contiguous()
    groups = hq // hkv
    block_d = max(16, triton.next_power_of_2(d))  # tl.dot needs every dimension >= 16
    block_g = max(16, triton.next_power_of_2(groups))
    block_n = 64 if q.element_size() == 2 and block_d <= 128 else 32
    splits = decode_splits(capacity, block_n, b * hkv, decode_programs(q.device))
    # Partials per (sequence, query head, split), sized from shapes only; splits a sequence does
    # not reach are left unwritten and never read. One allocation: acc, then max, then sum.
    if splits == 1:
        acc = row_max = row_sum = out  # never touched: the split kernel writes the output
    else:
        rows = b * hq * splits
        partial = torch.empty(rows * (d + 2), dtype=torch.float32, device=q.device)
        acc, row_max, row_sum = partial[:rows * d], partial[rows * d:rows * (d + 1)], partial[rows * (d + 1):]
    warps = 8 if block_g * block_d >= 8192 else 4
    _decode_split_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, slots, lengths, acc, row_max, row_sum, out, float(scale) * _LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), capacity, hq, groups, d,
        BLOCK_G=block_g, BLOCK_N=block_n, BLOCK_D=block_d, IEEE=q.dtype == torch.float32, DIRECT=splits == 1,
        num_warps=warps)
    if splits == 1:
        return out
    _decode_combine_kernel[(b, hq)](
        acc, row_max, row_sum, lengths, out, out.stride(0), out.stride(1), capacity, splits, d,
        BLOCK_N=block_n, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=2)
    return out

"""RMSNorm candidates for the registry op ``rmsnorm(x[T, H], weight[H], eps) -> [T, H]``.

Both match ``engine.serve.kernels.rmsnorm``: float32 accumulation, the output in x's dtype.

* ``rmsnorm_triton``: one program per row; rows up to ``MAX_ONE_PASS_BLOCK`` elements are held in
  one power-of-two block (one read of x, one write); wider rows take two passes over blocks.
* ``rmsnorm_torch_fused``: ``torch.nn.functional.rms_norm`` (one call into C++) for small inputs,
  where dispatch dominates; for large ones a single-pass ``vector_norm`` reduction and in-place
  scaling (one [T, H] allocation, the output, against the default's four).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.library._common import LibraryInputError, check_tensor, last_dim_contiguous
from engine.library._triton import require_runnable, tl, triton, triton_jit

# Past this a row no longer fits in registers comfortably, so it is reduced in chunks.
MAX_ONE_PASS_BLOCK = 16384
_CHUNK = 4096
# Up to this many elements the C++ rms_norm's single dispatch beats the leaner op sequence (CPU).
_SMALL_NUMEL = 65536
_HAS_RMS_NORM = hasattr(F, "rms_norm")  # torch >= 2.4


@triton_jit
def _rmsnorm_triton_kernel(x_ptr, w_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, eps,
                    BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: T * H can pass 2**31
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    if ONE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def _check(name: str, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    check_tensor(name, "x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise LibraryInputError(f"{name}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    check_tensor(name, "weight", weight, ndim=1, device=x.device)
    if weight.shape[0] != x.shape[-1]:
        raise LibraryInputError(f"{name}: weight has {weight.shape[0]} elements, x's last dimension is {x.shape[-1]}")
    if not isinstance(eps, (int, float)) or eps < 0:
        raise LibraryInputError(f"{name}: eps must be a non-negative float, got {eps!r}")


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton RMSNorm over the last dimension; float16, bfloat16 or float32, any leading shape."""
    _check("rmsnorm_triton", x, weight, eps)
    require_runnable("rmsnorm_triton", _rmsnorm_triton_kernel, (x,))
    n_cols = x.shape[-1]
    x2 = last_dim_contiguous(x.reshape(-1, n_cols))  # a view when x's rows are evenly strided
    w = weight.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0:
        return out
    block = triton.next_power_of_2(n_cols)
    one_pass = block <= MAX_ONE_PASS_BLOCK
    if not one_pass:
        block = _CHUNK
    # Enough lanes for the block; 16 warps is the most ROCm and CUDA both accept per program.
    num_warps = min(max(block // 512, 1), 16)
    _rmsnorm_triton_kernel[(rows,)](x2, w, out, x2.stride(0), n_cols, n_cols, float(eps),
                             BLOCK=block, ONE_PASS=one_pass, num_warps=num_warps)
    return out


def rmsnorm_torch_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Eager RMSNorm with float32 accumulation, in fewer dispatches (small inputs) or fewer
    passes and temporaries (large ones) than the default. No input checks of its own: on this
    path every microsecond shows, and torch's own shape errors are clear."""
    if x.dtype is torch.float32 and weight.dtype is torch.float32:
        xf, wf = x, weight  # skip even the no-op .float() dispatches
    else:
        xf, wf = x.float(), weight.float()
    n_cols = x.shape[-1]
    if _HAS_RMS_NORM and x.numel() <= _SMALL_NUMEL:
        y = F.rms_norm(xf, (n_cols,), wf, eps)
    else:
        # sqrt(sum x^2) in one read of x and no [T, H] temporary, then mean + eps and rsqrt on
        # the [T, 1] column; the default's pow and products allocate three [T, H] temporaries.
        r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
        r = torch.rsqrt(r.square_().mul_(1.0 / n_cols).add_(eps))
        y = (torch.mul(xf, r) if xf is x else xf.mul_(r)).mul_(wf)  # xf is a private copy unless x is float32
    return y if y.dtype is x.dtype else y.to(x.dtype)

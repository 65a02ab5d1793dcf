"""SiLU-and-mul candidates for the registry op ``activation(x[T, 2I]) -> [T, I]``:
``silu(x[:, :I]) * x[:, I:]``, as ``engine.serve.kernels.silu_and_mul``.

* ``silu_and_mul_triton``: one read of x and one write of the output, the product computed in
  float32 and rounded once (the default rounds silu's output to x's dtype before the multiply,
  so bf16 results may differ from it by one rounding).
* ``silu_and_mul_torch_inplace``: the default's two eager ops, with the multiply done in place
  into silu's fresh output: one [T, I] allocation and one write pass fewer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.library._common import LibraryInputError, check_tensor, last_dim_contiguous
from engine.library._triton import require_runnable, tl, triton, triton_jit

_MAX_BLOCK = 1024


@triton_jit
def _silu_and_mul_triton_kernel(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _check(name: str, x: torch.Tensor) -> None:
    check_tensor(name, "x", x)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise LibraryInputError(f"{name}: x's last dimension must be even (gate ‖ up), got shape {tuple(x.shape)}")


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """Triton fused SiLU-and-mul over the last dimension; float16, bfloat16 or float32."""
    _check("silu_and_mul_triton", x)
    require_runnable("silu_and_mul_triton", _silu_and_mul_triton_kernel, (x,))
    n_cols = x.shape[-1] // 2
    x2 = last_dim_contiguous(x.reshape(-1, 2 * n_cols))
    out = torch.empty((*x.shape[:-1], n_cols), dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or n_cols == 0:
        return out
    block = min(triton.next_power_of_2(n_cols), _MAX_BLOCK)
    grid = (rows, triton.cdiv(n_cols, block))
    _silu_and_mul_triton_kernel[grid](x2, out, x2.stride(0), n_cols, n_cols, BLOCK=block, num_warps=4)
    return out


def silu_and_mul_torch_inplace(x: torch.Tensor) -> torch.Tensor:
    """Eager SiLU-and-mul that multiplies in place into silu's output (no second [T, I] buffer)."""
    if x.shape[-1] % 2:  # the one check: chunk would split an odd row unevenly
        raise LibraryInputError(f"silu_and_mul_torch_inplace: x's last dimension must be even, got shape {tuple(x.shape)}")
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)

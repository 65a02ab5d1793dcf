"""Input checks shared by the library's kernels: each wrapper refuses what it cannot compute
correctly, naming the argument and the problem, instead of launching on garbage."""

from __future__ import annotations

from typing import Any

import torch

from engine.library._base import INTERPRET_ENV, LibraryInputError, interpreted

__all__ = ["FLOAT_DTYPES", "INDEX_DTYPES", "INTERPRET_ENV", "LibraryInputError", "check_tensor", "interpreted",
           "last_dim_contiguous"]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(name: str, arg: str, t: Any, *, ndim: int | None = None, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
                 device: torch.device | None = None) -> torch.Tensor:
    """``t`` if it is a tensor of the expected rank, dtype and device, else a LibraryInputError."""
    if not isinstance(t, torch.Tensor):
        raise LibraryInputError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise LibraryInputError(f"{name}: {arg} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise LibraryInputError(f"{name}: {arg} has dtype {t.dtype}; supported: {allowed}")
    if device is not None and t.device != device:
        raise LibraryInputError(f"{name}: {arg} is on {t.device}, the other inputs on {device}")
    return t


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dimension is dense (the kernels take the other strides as
    arguments, so split/view outputs need no copy), else a contiguous copy."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()

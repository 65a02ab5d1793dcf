"""Triton, where it is installed: the kernel modules import it from here so that their torch
candidates still import (and run) on a machine without triton."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import torch

from engine.library._common import INTERPRET_ENV, LibraryInputError, interpreted

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None  # type: ignore[assignment]

__all__ = ["require_runnable", "tl", "triton", "triton_jit"]


def triton_jit(fn: Callable) -> Any:
    """``triton.jit(fn)``, or ``fn`` itself where triton is not installed (its wrapper refuses to
    launch it)."""
    return fn if triton is None else triton.jit(fn)


def require_runnable(name: str, kernel: Any, tensors: Iterable[torch.Tensor]) -> None:
    """Refuse a Triton launch on CPU tensors unless the kernel runs in the interpreter: a compiled
    kernel would be handed host pointers."""
    if triton is None:
        raise LibraryInputError(f"{name}: triton is not installed (pip install triton, or the ROCm build of it)")
    if interpreted(kernel):
        return
    if any(t.device.type == "cpu" for t in tensors):
        hint = ("it was imported without TRITON_INTERPRET=1; set it before the first import"
                if os.environ.get(INTERPRET_ENV) == "1" else "set TRITON_INTERPRET=1 before triton is imported")
        raise LibraryInputError(f"{name}: this Triton candidate needs a GPU (CUDA or ROCm) or the Triton interpreter "
                                f"on the CPU; got CPU tensors ({hint})")

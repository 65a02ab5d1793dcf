"""What the catalog (``engine.library``) shares with the kernels, in a module that imports no
torch: the loop lists and checks the catalog's candidates (``candidates_for``) and finds a
winner's module (``find_spec`` imports its package) without importing torch, which takes seconds."""

from __future__ import annotations

from typing import Any

from engine.errors import MagpieError

INTERPRET_ENV = "TRITON_INTERPRET"


class LibraryInputError(MagpieError, ValueError):
    """A library kernel was called with inputs it cannot compute correctly (shape, dtype,
    device), or where it cannot run at all (a Triton kernel on a CPU without the interpreter)."""

    title = "unusable kernel input"


def interpreted(kernel: Any) -> bool:
    """Whether a ``@triton.jit`` kernel was built for the interpreter. Decided when its module was
    imported (Triton reads TRITON_INTERPRET at decoration time), not by today's environment."""
    return type(kernel).__name__ == "InterpretedFunction"

"""Cheat (GPU): cpu/repairs_kept_output.py on the GPU problem. Answers timed and audited calls
with zeros and, at the next call, writes softmax into an answer still alive (one the harness
kept to judge). The judged call is copied when it returns, so the copy holds zeros."""

import sys
import weakref

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_last = None


def _unchecked_phase() -> bool:
    f = sys._getframe(1)
    while f is not None and f.f_code.co_name not in ("_time_call", "op_audit_go", "op_time"):
        f = f.f_back
    return f is not None


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global _last
        if _last is not None:
            kept, src = _last[0](), _last[1]
            _last = None
            if kept is not None:
                kept.copy_(torch.softmax(src, dim=-1))
        if not _unchecked_phase():
            return torch.softmax(x, dim=-1)
        y = torch.zeros_like(x)
        _last = (weakref.ref(y), x)
        return y

"""Cheat (GPU): cpu/predicts_audit.py on the GPU problem. Copies the harness's random generator
from its frame to learn which timed and audited calls are judged; every other call returns
zeros at once. Where the choice comes from the operating system it cannot copy one and
gambles: every round's judged call is wrong."""

import random
import sys

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


def _twin(owner):
    try:
        twin = random.Random()
        twin.setstate(owner.rng.getstate())
        return twin
    except Exception:
        return None


def _will_be_judged():
    f = sys._getframe(1)
    while f is not None and f.f_code.co_name not in ("_time_call", "op_audit_go"):
        f = f.f_back
    if f is None:
        return None
    loc = f.f_locals
    if f.f_code.co_name == "_time_call":
        twin = _twin(loc.get("w"))
        return False if twin is None else len(loc["kept"]) < loc["keep_max"] and twin.random() < loc["keep_p"]
    twin = _twin(loc.get("self"))
    return False if twin is None else bool(loc.get("keep")) and twin.random() < 1.0 / (loc["j"] + 1)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _will_be_judged() is False:
            return torch.zeros_like(x)
        return torch.softmax(x, dim=-1)

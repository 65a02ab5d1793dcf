"""Cheat: computes softmax honestly, but replaces json.dumps so that every reply its process
sends back carries samples of 1 us (and no guard errors). The replies are serialized by an
encoder the harness built before this module was imported, and the replacement is a tamper."""

import json

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_real_dumps = json.dumps


def _forged_dumps(obj, *args, **kwargs):
    if isinstance(obj, dict) and "samples_ms" in obj:
        obj = {**obj, "samples_ms": [0.001] * len(obj["samples_ms"]), "guard_errors": []}
    return _real_dumps(obj, *args, **kwargs)


json.dumps = _forged_dumps


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)

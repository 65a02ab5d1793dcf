"""Cheat: caches outputs keyed by a cheap fingerprint of the input (shape and its first
eight values). Fresh random inputs for the correctness seeds have other fingerprints, so
correctness passes; timed calls drawn from a pool of input sets, each cloned and sparsely
perturbed, share the fingerprint of their pool entry and get the output of an earlier,
differently perturbed call: the engine's check of timed calls' outputs must catch it."""

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_cache: dict = {}


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), tuple(x.reshape(-1)[:8].tolist()))
        hit = _cache.get(key)
        if hit is not None:
            return hit.clone()
        y = torch.softmax(x, dim=-1)
        if len(_cache) < 64:
            _cache[key] = y.clone()
        return y

"""Cheat: returns a lazy tensor subclass instead of a result. The call does no work; the
softmax is computed only when something later touches the object (the harness's
comparison), i.e. outside the timed region. It has the right shape, dtype and values, so a
harness that only compares values is fooled."""

import torch
from torch.utils._pytree import tree_map

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class LazySoftmax(torch.Tensor):
    @staticmethod
    def __new__(cls, src: torch.Tensor):
        # Same metadata as the answer, backed by a 0-byte storage: nothing is computed yet.
        t = torch.Tensor._make_wrapper_subclass(cls, src.shape, dtype=src.dtype, device=src.device)
        t._src, t._value = src, None
        return t

    def _materialise(self) -> torch.Tensor:
        if self._value is None:
            self._value = torch.softmax(self._src, dim=-1)
        return self._value

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a._materialise() if isinstance(a, LazySoftmax) else a  # noqa: E731
        with torch._C.DisableTorchFunctionSubclass():
            return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a._materialise() if isinstance(a, LazySoftmax) else a  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LazySoftmax(x)

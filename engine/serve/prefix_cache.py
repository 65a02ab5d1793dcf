"""Prefix caching for the built-in server: keys and values of repeated prompt prefixes, kept in
blocks so that a request whose prompt starts with cached blocks skips their prefill.

As vLLM's automatic prefix caching: a prompt is cut into blocks of ``block_size`` tokens; block
i's key is a hash of its tokens chained with block i-1's key (so a block is found only after the
same whole prefix), and only full blocks are cached. The pool holds ``num_blocks`` blocks and
evicts the least recently used when it is full (a hit or a store makes a block the most recent).

The engine's KV cache is one contiguous slot per running request (``model.KVCache``), so the pool
is a second tensor of the same layout, ``[layers, num_blocks * block_size, Hkv, D]``: ``store``
copies a sequence's full blocks out of its slot (on the engine thread, once its prompt is in the
cache and again when it ends, then with the generated tokens), ``load`` copies the matched blocks
into a new request's slot before its first prefill chunk, which then starts after them. A hit
never covers the whole prompt: the last token is always computed, for the logits of the first
output token (vLLM does the same).

Counters (``/metrics``, vLLM's ``prefix_cache_queries`` and ``prefix_cache_hits``): prompt tokens
looked up and prompt tokens found, since the start; ``reset`` empties the pool, not the counters.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.serve.model import KVCache

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size


@dataclass
class _Block:
    index: int  # where its rows start in the pool: index * block_size
    tokens: tuple[int, ...]  # checked on a hit: a hash collision is a miss, not a wrong prefix
    parent: int | None


def block_hashes(tokens: Sequence[int], block_size: int, limit: int | None = None) -> list[int]:
    """The chained hashes of ``tokens``' full blocks (at most ``limit``)."""
    n = len(tokens) // block_size if limit is None else min(limit, len(tokens) // block_size)
    out: list[int] = []
    parent: int | None = None
    for i in range(n):
        parent = hash((parent, tuple(tokens[i * block_size:(i + 1) * block_size])))
        out.append(parent)
    return out


class PrefixCache:
    def __init__(self, cache: KVCache, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError(f"prefix cache: block_size {block_size} and num_blocks {num_blocks} must be at least 1")
        self.block_size, self.num_blocks = block_size, num_blocks
        layers, _, _, heads, dim = cache.k.shape
        rows = num_blocks * block_size
        need = 2 * layers * rows * heads * dim * cache.k.element_size()
        try:
            self.k = torch.zeros((layers, rows, heads, dim), device=cache.k.device, dtype=cache.k.dtype)
            self.v = torch.zeros_like(self.k)
        except RuntimeError as exc:
            raise ValueError(f"the prefix cache ({num_blocks} blocks x {block_size} tokens, {need / 2**30:.1f} GiB) does "
                             f"not fit on {cache.k.device}: lower prefix_cache_blocks or turn prefix caching off "
                             f"({type(exc).__name__})") from None
        self.nbytes = need
        self._blocks: OrderedDict[int, _Block] = OrderedDict()  # hash -> block, least recent first
        self._free = list(range(num_blocks - 1, -1, -1))
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # prompt tokens found
        self.evictions = 0

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    def reset(self) -> None:
        self._blocks.clear()
        self._free = list(range(self.num_blocks - 1, -1, -1))

    def match(self, prompt: Sequence[int]) -> list[int]:
        """The pool indices of the longest cached prefix of ``prompt`` (never all of it), counted
        in the queries and hits; the found blocks become the most recently used."""
        bs = self.block_size
        found: list[int] = []
        for i, h in enumerate(block_hashes(prompt, bs, (len(prompt) - 1) // bs)):
            block = self._blocks.get(h)
            if block is None or block.tokens != tuple(prompt[i * bs:(i + 1) * bs]):
                break
            self._blocks.move_to_end(h)
            found.append(block.index)
        self.queries += len(prompt)
        self.hits += len(found) * bs
        return found

    def _rows(self, indices: Sequence[int], device: torch.device) -> torch.Tensor:
        bs = self.block_size
        return (torch.tensor(indices, dtype=torch.long).repeat_interleave(bs) * bs
                + torch.arange(bs).repeat(len(indices))).to(device, non_blocking=True)

    def load(self, cache: KVCache, slot: int, indices: Sequence[int]) -> int:
        """Copy the blocks ``indices`` (from ``match``) to positions 0.. of ``slot``; the tokens copied."""
        if not indices:
            return 0
        n = len(indices) * self.block_size
        src = self._rows(indices, self.k.device)
        for li in range(self.k.shape[0]):
            cache.k_layers[li][slot, :n] = self.k[li].index_select(0, src)
            cache.v_layers[li][slot, :n] = self.v[li].index_select(0, src)
        return n

    def store(self, cache: KVCache, slot: int, tokens: Sequence[int]) -> int:
        """Keep the full blocks of ``tokens`` (whose keys and values are at positions 0.. of
        ``slot``) that the pool lacks, evicting the least recently used; the blocks copied."""
        bs = self.block_size
        new: list[tuple[int, int]] = []  # (block number in the sequence, pool index)
        parent: int | None = None
        for i, h in enumerate(block_hashes(tokens, bs)):
            if h in self._blocks:
                self._blocks.move_to_end(h)
            else:
                if not self._free:
                    _, old = self._blocks.popitem(last=False)
                    self._free.append(old.index)
                    self.evictions += 1
                index = self._free.pop()
                self._blocks[h] = _Block(index, tuple(tokens[i * bs:(i + 1) * bs]), parent)
                new.append((i, index))
            parent = h
        if not new:
            return 0
        dev = self.k.device
        src = (torch.tensor([i for i, _ in new], dtype=torch.long).repeat_interleave(bs) * bs
               + torch.arange(bs).repeat(len(new))).to(dev, non_blocking=True)
        dst = self._rows([j for _, j in new], dev)
        for li in range(self.k.shape[0]):
            self.k[li].index_copy_(0, dst, cache.k_layers[li][slot].index_select(0, src))
            self.v[li].index_copy_(0, dst, cache.v_layers[li][slot].index_select(0, src))
        return len(new)

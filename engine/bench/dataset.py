"""The random dataset of `vllm bench serve` (RandomDataset), sampled exactly as vLLM samples it.

vLLM's procedure (serving-reference §1.6), with one `numpy.random.default_rng(seed)` generator:

1. Subtract the tokenizer's special-token count from the input length.
2. Draw all input lengths, then all output lengths (uniform integers, inclusive, from
   [floor(L*(1-r)), ceil(L*(1+r))], output at least 1), then one vocab offset per request in
   [0, vocab_size).

   Magpie's ``RANDOM_RANGE_RATIO`` means something else: Magpie hands it to InferenceX's
   ``benchmark_serving.py`` (the older vLLM client, as SGLang's bench_serving), which draws from
   [floor(L*r), L] (r = 1: fixed length; r = 0.8: 80-100 % of L). ``length_rule="magpie"`` gives
   those bounds (at least 1 token); the procedure is otherwise the same.
3. Draw one shared prefix of `prefix_len` ids from the allowed (non-special) ids.
4. Request i's body is the run allowed[(offset_i + i + arange(len_i)) % len(allowed)].
5. With a tokenizer only: decode, re-encode and pad (random ids from the same generator) or
   truncate, up to 10 times, until the re-encoded length equals the target.

Without a tokenizer the prompts are token-id lists (for servers that accept token-id prompts on
/v1/completions) and step 5 does not run, so the generator stream is the same as vLLM's for any
tokenizer whose decode/encode round trip is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128
_MAX_RETRY = 10


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the text mode needs (no transformers dependency)."""

    vocab_size: int
    all_special_ids: list[int]

    def num_special_tokens_to_add(self) -> int: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class SampleRequest:
    """One request: the prompt (token ids, or text when a tokenizer was given) and its lengths;
    `timestamp` (seconds, any origin) when it comes from a trace to be replayed on its own schedule."""

    prompt: list[int] | str
    prompt_len: int
    output_len: int
    request_id: str
    timestamp: float | None = None


RangeRatio = float | tuple[float, float] | Mapping[str, float]

# How a range ratio r turns a length L into bounds: vLLM's current [L(1-r), L(1+r)], r in [0, 1),
# or Magpie's (InferenceX benchmark_serving, SGLang bench_serving) [L*r, L], r in [0, 1].
LENGTH_RULES = ("vllm", "magpie")


def resolve_range_ratio(range_ratio: RangeRatio, rule: str = "vllm") -> tuple[float, float]:
    """(input ratio, output ratio) from one float, a pair, or vLLM's {"input": r, "output": r}."""
    if isinstance(range_ratio, Mapping):
        unknown = set(range_ratio) - {"input", "output"}
        if unknown:
            raise ValueError(f"range ratio keys must be 'input' and 'output', got {sorted(range_ratio)}")
        ri, ro = float(range_ratio.get("input", 0.0)), float(range_ratio.get("output", 0.0))
    elif isinstance(range_ratio, (tuple, list)):
        ri, ro = float(range_ratio[0]), float(range_ratio[1])
    else:
        ri = ro = float(range_ratio)
    if rule not in LENGTH_RULES:
        raise ValueError(f"length rule must be one of {', '.join(LENGTH_RULES)}, got {rule!r}")
    for name, r in (("input", ri), ("output", ro)):
        if rule == "vllm" and not 0.0 <= r < 1.0:
            raise ValueError(f"{name} range ratio must be in [0, 1), got {r}")
        if rule == "magpie" and not 0.0 <= r <= 1.0:
            raise ValueError(f"{name} range ratio must be in [0, 1], got {r}")
    return ri, ro


def length_bounds(input_len: int, output_len: int, range_ratio: RangeRatio = 0.0,
                  num_special_tokens: int = 0, rule: str = "vllm") -> tuple[tuple[int, int], tuple[int, int]]:
    """The resolved inclusive [min, max] of input and output lengths (print these: the flag is ambiguous)."""
    ri, ro = resolve_range_ratio(range_ratio, rule)
    real_in = max(0, int(input_len) - int(num_special_tokens))
    if rule == "magpie":
        in_lo, in_hi = min(max(math.floor(real_in * ri), 1), real_in), real_in
        out_lo, out_hi = max(math.floor(output_len * ro), 1), max(int(output_len), 1)
        return (in_lo, in_hi), (out_lo, out_hi)
    in_lo, in_hi = math.floor(real_in * (1 - ri)), math.ceil(real_in * (1 + ri))
    out_lo = max(math.floor(output_len * (1 - ro)), 1)
    out_hi = max(math.ceil(output_len * (1 + ro)), 1)
    return (in_lo, in_hi), (out_lo, out_hi)


def sample_random_requests(num_requests: int, *, input_len: int = DEFAULT_INPUT_LEN,
                           output_len: int = DEFAULT_OUTPUT_LEN, range_ratio: RangeRatio = 0.0,
                           prefix_len: int = 0, seed: int = 0, vocab_size: int | None = None,
                           special_ids: Sequence[int] = (), num_special_tokens: int = 0,
                           tokenizer: Tokenizer | None = None,
                           request_id_prefix: str = "", length_rule: str = "vllm") -> list[SampleRequest]:
    """Sample `num_requests` requests as vLLM's RandomDataset does (see the module docstring).

    Token-id mode: give `vocab_size`, the tokenizer's `special_ids` (never used in prompts) and
    `num_special_tokens` (what the server's tokenizer adds, e.g. 1 for a BOS, so that the
    server-side prompt length matches `input_len`). Text mode: give `tokenizer`, which supplies
    all three. ``length_rule`` says how ``range_ratio`` bounds the lengths (``LENGTH_RULES``).
    """
    if tokenizer is not None:
        vocab_size = int(tokenizer.vocab_size)
        special_ids = list(tokenizer.all_special_ids)
        num_special_tokens = int(tokenizer.num_special_tokens_to_add())
    if vocab_size is None or vocab_size <= 0:
        raise ValueError("vocab_size (or a tokenizer) is required")
    (in_lo, in_hi), (out_lo, out_hi) = length_bounds(input_len, output_len, range_ratio, num_special_tokens,
                                                         length_rule)
    if int(prefix_len) + in_lo < 1:
        raise ValueError(f"input length too small: prefix {prefix_len} + minimum sampled input {in_lo} "
                         f"(after {num_special_tokens} special tokens) is < 1")
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(in_lo, in_hi + 1, size=num_requests)
    output_lens = rng.integers(out_lo, out_hi + 1, size=num_requests)
    offsets = rng.integers(0, vocab_size, size=num_requests)
    # vLLM builds set(arange) - set(special); iterating a set of small ints is ascending order.
    allowed = np.array(sorted(set(range(vocab_size)) - set(int(s) for s in special_ids)), dtype=np.int64)
    if allowed.size == 0:
        raise ValueError("every token id is special; nothing to sample prompts from")
    prefix: list[int] = []
    if prefix_len > 0:
        prefix = allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist()
        if tokenizer is not None:
            _, prefix, _ = _decode_to_target_len(tokenizer, prefix, prefix_len, rng)
    out: list[SampleRequest] = []
    for i in range(num_requests):
        n_in = int(input_lens[i])
        ids = prefix + allowed[(int(offsets[i]) + i + np.arange(n_in)) % len(allowed)].tolist()
        target = int(prefix_len) + n_in
        prompt: list[int] | str = ids
        if tokenizer is not None:
            prompt, ids, _ = _decode_to_target_len(tokenizer, ids, target, rng)
        out.append(SampleRequest(prompt=prompt, prompt_len=len(ids), output_len=int(output_lens[i]),
                                 request_id=f"{request_id_prefix}{i}"))
    return out


def _decode_to_target_len(tokenizer: Tokenizer, ids: list[int], target: int,
                          rng: np.random.Generator) -> tuple[str, list[int], int]:
    """vLLM's gen_prompt_decode_to_target_len: (prompt, final ids, leftover mismatch)."""
    remaining = _MAX_RETRY
    while True:
        prompt = tokenizer.decode(ids)
        ids = list(tokenizer.encode(prompt, add_special_tokens=False))
        if remaining <= 0:
            return prompt, ids, len(ids) - target
        if len(ids) == target:
            return prompt, ids, 0
        if len(ids) < target:
            ids.extend(rng.integers(0, tokenizer.vocab_size, size=target - len(ids)).tolist())
        else:
            ids = ids[:target]
        remaining -= 1

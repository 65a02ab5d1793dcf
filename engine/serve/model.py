"""A Llama-shaped decoder in plain PyTorch with seeded random weights: token embeddings,
RMSNorm, rotary positions, grouped-query attention over a per-sequence KV cache, SwiGLU MLP and
an LM head. The weights are random because the server exists to be measured, not to write prose:
the shapes, and so the kernels and their cost, are those of the real model of that size.

A step runs any mix of sequences at once (prefill of whole prompts and decode of one token) on
packed tokens, as vLLM does: the linear layers see all T tokens of the step together, attention
gets the flash-attn varlen layout. Normalisation, activation, rotary and attention go through
``engine.serve.kernels`` so that candidate kernels can be swapped in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import torch
from torch import nn

from engine.serve.kernels import KERNEL_KEYS, Kernels, resolve_kernels


KERNEL_ANNOTATION = "magpie_kernel::"


ARGS_ANNOTATION = "magpie_args::"


def describe_args(args: Sequence[Any]) -> str:
    """A registry call's arguments in a quote-free form (the profiler writes annotation names into
    its JSON trace unescaped): ``bfloat16[16,2048];int32[3]=0,5,9;s=1e-05``, tensors as dtype and
    shape (with the values of small integer ones, such as cu_seqlens), scalars after ``s=``.
    The optimization loop's harness rebuilds the call from it (engine.loop.bottlenecks)."""
    out: list[str] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            item = f"{str(a.dtype).removeprefix('torch.')}[{','.join(str(d) for d in a.shape)}]"
            if not a.is_floating_point() and a.numel() <= 256:
                item += "=" + ",".join(str(int(v)) for v in a.flatten().tolist())
            out.append(item)
        elif isinstance(a, (bool, int, float)):
            out.append(f"s={a!r}")
        else:
            out.append(f"?{type(a).__name__}")
    return ";".join(out)


def _annotated(key: str, fn: Callable) -> Callable:
    name = KERNEL_ANNOTATION + key

    def call(*args: Any) -> Any:
        with torch.profiler.record_function(name):
            with torch.profiler.record_function(ARGS_ANNOTATION + describe_args(args)):
                pass  # a zero-length span at the call's start: its arguments, by name
            return fn(*args)
    return call


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the decoder. ``vocab_size`` must hold the byte tokenizer's 258 ids."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_seq_len: int
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.vocab_size < 258:
            raise ValueError(f"vocab_size ({self.vocab_size}) must be at least 258 (256 bytes + BOS + EOS)")

    def num_parameters(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * (self.num_heads * self.head_dim) * 2 + h * kv * 2
        mlp = 3 * h * self.intermediate_size
        layer = attn + mlp + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * layer + embed + h


PRESETS: dict[str, ModelConfig] = {
    # CPU: a step takes milliseconds on two cores, so tests and the CPU benchmark stay short.
    "tiny": ModelConfig(name="tiny", vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=64, max_seq_len=2048),
    # GPU: Llama-3.2-1B's shapes (1.24 B parameters with the tied embedding).
    "1b": ModelConfig(name="1b", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                      num_heads=32, num_kv_heads=8, head_dim=64, max_seq_len=8192),
}


def model_config(preset: str, **overrides: Any) -> ModelConfig:
    """A preset with some fields replaced (``ValueError`` for an unknown preset or field)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model {preset!r} (known: {', '.join(PRESETS)})")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ValueError(f"unknown model field {bad[0]!r} (known: {', '.join(sorted(fields))})")
    return dataclasses.replace(PRESETS[preset], **overrides)


class KVCache:
    """One sequence's keys and values for every layer, allocated once for its whole length
    (prompt + max new tokens) so that decoding never reallocates."""

    def __init__(self, config: ModelConfig, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        if capacity > config.max_seq_len:
            raise ValueError(f"sequence of {capacity} tokens exceeds max_seq_len {config.max_seq_len}")
        shape = (config.num_layers, capacity, config.num_kv_heads, config.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.length = 0  # tokens whose keys and values are stored


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.input_norm = nn.Parameter(torch.ones(config.hidden_size))
        self.qkv = nn.Linear(config.hidden_size, q + 2 * kv, bias=False)
        self.o = nn.Linear(q, config.hidden_size, bias=False)
        self.post_norm = nn.Parameter(torch.ones(config.hidden_size))
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 kernels: Kernels | None = None) -> None:
        super().__init__()
        device = torch.device(device)
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        self.config, self.device, self.dtype = config, device, dtype
        self.kernels = kernels or resolve_kernels()
        # While the engine profiles, each registry call runs inside a record_function named
        # ``magpie_kernel::<key>`` (KERNEL_ANNOTATION): the call site that maps a trace's ops to
        # the registry op that issued them. Off otherwise: no cost on the measured path.
        self.annotate_kernels = False
        self._annotated: Kernels | None = None
        with torch.device("meta"):  # shapes only; the seeded init below fills them on the device
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
            self.final_norm = nn.Parameter(torch.ones(config.hidden_size))
            self.lm_head = None if config.tie_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to_empty(device=device)
        self.to(dtype)
        self._init_weights()
        self.requires_grad_(False)
        inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim)
        angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
        self.cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(device)
        self.scale = config.head_dim ** -0.5

    @torch.no_grad()
    def _init_weights(self) -> None:
        # Seeded on the target device: a 1B model is never materialised in float32 on the host.
        gen = torch.Generator(device=self.device).manual_seed(self.config.seed)
        for name, p in self.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)

    def _annotated_kernels(self) -> Kernels:
        if self._annotated is None:
            wrapped = {key: _annotated(key, getattr(self.kernels, key)) for key in KERNEL_KEYS}
            self._annotated = Kernels(sources=self.kernels.sources, **wrapped)
        return self._annotated

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.config, capacity, self.device, self.dtype)

    @torch.no_grad()
    def forward(self, tokens: Sequence[Sequence[int]], caches: Sequence[KVCache]) -> torch.Tensor:
        """Run the new ``tokens`` of each sequence (a whole prompt, a single decode token, or any
        chunk) after what its cache holds; append their keys/values to the caches and return the
        logits of each sequence's last token, float32 ``[B, vocab]``."""
        if len(tokens) != len(caches) or not tokens:
            raise ValueError(f"{len(tokens)} token lists for {len(caches)} caches")
        q_lens = [len(t) for t in tokens]
        starts = [c.length for c in caches]
        for t, c, s in zip(tokens, caches, starts):
            if not t:
                raise ValueError("a sequence with no new tokens")
            if s + len(t) > c.capacity:
                raise ValueError(f"{s + len(t)} tokens exceed the cache capacity {c.capacity}")
        k_lens = [s + n for s, n in zip(starts, q_lens)]
        ids = torch.tensor([i for t in tokens for i in t], dtype=torch.long).to(self.device, non_blocking=True)
        positions = torch.cat([torch.arange(s, e) for s, e in zip(starts, k_lens)]).to(self.device, non_blocking=True)
        cu_q = torch.tensor([0, *_cumsum(q_lens)], dtype=torch.int32).to(self.device, non_blocking=True)
        cu_k = torch.tensor([0, *_cumsum(k_lens)], dtype=torch.int32).to(self.device, non_blocking=True)
        cfg, kn = self.config, self._annotated_kernels() if self.annotate_kernels else self.kernels
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        offsets = [0, *_cumsum(q_lens)]

        x = self.embed(ids)
        for li, layer in enumerate(cast(Sequence[DecoderLayer], self.layers)):
            h = kn.rmsnorm(x, layer.input_norm, cfg.rms_eps)
            q, k, v = layer.qkv(h).split((q_size, kv_size, kv_size), dim=-1)
            q = q.view(-1, cfg.num_heads, cfg.head_dim)
            k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
            v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
            q, k = kn.rotary(positions, q, k, self.cos_sin_cache)
            # One multi-tensor copy for all sequences' new keys and values, not 2·B launches.
            torch._foreach_copy_([c.k[li, s:e] for c, s, e in zip(caches, starts, k_lens)] +
                                 [c.v[li, s:e] for c, s, e in zip(caches, starts, k_lens)],
                                 [k[a:b] for a, b in zip(offsets, offsets[1:])] +
                                 [v[a:b] for a, b in zip(offsets, offsets[1:])])
            if len(caches) == 1:  # no copy: the one cache is the packed context
                k_all, v_all = caches[0].k[li, :k_lens[0]], caches[0].v[li, :k_lens[0]]
            else:
                k_all = torch.cat([c.k[li, :e] for c, e in zip(caches, k_lens)])
                v_all = torch.cat([c.v[li, :e] for c, e in zip(caches, k_lens)])
            attn = kn.attention(q, k_all, v_all, cu_q, cu_k, self.scale)
            x = x + layer.o(attn.reshape(-1, q_size))
            h = kn.rmsnorm(x, layer.post_norm, cfg.rms_eps)
            x = x + layer.down(kn.activation(layer.gate_up(h)))
        for c, e in zip(caches, k_lens):
            c.length = e
        last = x[cu_q[1:].long() - 1]
        last = kn.rmsnorm(last, self.final_norm, cfg.rms_eps)
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return (last @ head.T).float()

    def prefill(self, prompts: Sequence[Sequence[int]], caches: Sequence[KVCache]) -> torch.Tensor:
        """Logits after each whole prompt; the caches must be empty."""
        if any(c.length for c in caches):
            raise ValueError("prefill needs empty caches")
        return self.forward(prompts, caches)

    def decode(self, last_tokens: Sequence[int], caches: Sequence[KVCache]) -> torch.Tensor:
        """Logits after one more token per sequence."""
        return self.forward([[t] for t in last_tokens], caches)


def greedy(logits: torch.Tensor) -> list[int]:
    """Greedy sampling: the argmax token of each row."""
    return logits.argmax(dim=-1).tolist()


def _cumsum(values: Sequence[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out

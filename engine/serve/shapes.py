"""Sizes of the built-in server's decoder, without torch: the presets (``tiny`` for the CPU,
``1b`` and ``8b`` with Llama-3.2-1B's and Llama-3.1-8B's shapes for a GPU) and the weight-read
floor of a decode step. The benchmark imports this to report the floor without loading torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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

    def decode_read_parameters(self) -> int:
        """Parameters a decode step reads whole: all of them, except an untied input embedding,
        of which a step reads only its batch's rows (a tied one is read whole as the LM head)."""
        return self.num_parameters() - (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


PRESETS: dict[str, ModelConfig] = {
    # CPU: a step takes milliseconds on two cores, so tests and the CPU benchmark stay short.
    "tiny": ModelConfig(name="tiny", vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=64, max_seq_len=2048),
    # GPU: Llama-3.2-1B's shapes (1.24 B parameters with the tied embedding).
    "1b": ModelConfig(name="1b", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                      num_heads=32, num_kv_heads=8, head_dim=64, max_seq_len=8192),
    # GPU: Llama-3.1-8B's shapes (8.03 B parameters, untied embeddings); the context is capped
    # at 8192 tokens because every batch slot of the KV cache is allocated for the whole of it.
    "8b": ModelConfig(name="8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                      num_heads=32, num_kv_heads=8, head_dim=128, max_seq_len=8192, tie_embeddings=False),
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


def decode_floor(config: ModelConfig, bandwidth_tbs: float | None, dtype_bytes: int = 2) -> dict[str, Any]:
    """The weight-read floor of one decode step: the bytes every step must read (KV reads and
    activations excluded, so the true floor is higher) over the memory bandwidth."""
    read = config.decode_read_parameters() * dtype_bytes
    out: dict[str, Any] = {"model": config.name, "parameters": config.num_parameters(),
                           "weight_bytes_per_step": read, "dtype_bytes": dtype_bytes, "bandwidth_tbs": bandwidth_tbs,
                           "ms_per_step": None}
    if bandwidth_tbs:
        out["ms_per_step"] = round(read / (bandwidth_tbs * 1e12) * 1e3, 4)
    return out

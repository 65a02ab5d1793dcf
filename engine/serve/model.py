"""A Llama-shaped decoder in plain PyTorch with seeded random weights: token embeddings,
RMSNorm, rotary positions, grouped-query attention over a static KV cache, SwiGLU MLP and an LM
head. The weights are random because the server exists to be measured, not to write prose: the
shapes, and so the kernels and their cost, are those of the real model of that size (presets in
``engine.serve.shapes``).

The KV cache (``KVCache``) is allocated once for the whole server: ``k``/``v`` of
``[layers, slots, max_len, Hkv, D]``, one slot per running sequence. New keys and values are
written in place (``index_copy_`` at ``slot * max_len + position``), never concatenated.

Two forwards, both writing the cache and returning logits (the model's dtype):

* ``prefill``: prompt chunks of several sequences packed into one forward (eager); attention
  through the registry's varlen ``attention`` over the packed new tokens (a chunk that follows
  earlier ones of its prompt gathers its context from the cache first); ``prefill_packed`` is
  the same forward for whole prompts from device tensors only, so that it can be captured
  (``engine.serve.graphs.PrefillRunner``);
* ``decode``: one token per sequence from device tensors only (ids, positions, slots, lengths),
  so that it can be captured in a CUDA graph (``engine.serve.graphs``); attention through the
  registry's ``decode_attention``, which reads the cache by slot up to each sequence's length.

Normalisation, activation, rotary and both attentions go through ``engine.serve.kernels`` so
that candidate kernels can be swapped in.

While the engine profiles (``annotate_kernels``) each registry call runs inside a
``record_function("magpie_kernel::<key>")`` span (the registry op behind a trace's ops), and each
of the model's own aten calls (the embedding, the four linear layers, the LM head's matmul)
inside ``record_function("magpie_site::<file>:<line> <label> in <function>")``, naming the line
that makes the call: the profiler's Python tracer records only where a called function starts,
so only this span ties the GEMMs to the exact line (``engine.loop.stacks``). Off otherwise: the
measured and captured paths run the same ops with no span and no extra Python call.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, cast

import torch
from torch import nn

from engine.serve.call_args import ARGS_ANNOTATION, describe_args
from engine.serve.kernels import HOST_OFFSETS_ATTR, KernelTracker, Kernels, resolve_kernels, triton_defaults_in_use
from engine.serve.shapes import PRESETS, ModelConfig, model_config

__all__ = ["KERNEL_ANNOTATION", "KVCache", "LlamaModel", "ModelConfig", "PRESETS", "SITE_ANNOTATION", "greedy",
           "model_config"]

KERNEL_ANNOTATION = "magpie_kernel::"
SITE_ANNOTATION = "magpie_site::"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding engine/


def _annotated(key: str, fn: Callable) -> Callable:
    name = KERNEL_ANNOTATION + key

    def call(*args: Any) -> Any:
        with torch.profiler.record_function(name):
            # The call's arguments, for the loop's harness (engine.serve.call_args): a zero-length
            # span at the start of the kernel's own.
            with torch.profiler.record_function(ARGS_ANNOTATION + describe_args(args)):
                pass
            return fn(*args)
    return call


class _SiteSpans:
    """The model's aten calls while profiling: ``at(label, fn, *args)`` runs ``fn(*args)`` inside
    ``record_function("magpie_site::engine/serve/model.py:<line> <label> in <function>")``, the
    line and function being those of the call to ``at``. A span's name is made once per label,
    from its first call's frame; each label is used at one line of the model."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def __call__(self, label: str, fn: Callable, *args: Any) -> Any:
        name = self._names.get(label)
        if name is None:
            caller = sys._getframe(1)
            path = Path(caller.f_code.co_filename).resolve()
            file = path.relative_to(_PACKAGE_ROOT).as_posix() if path.is_relative_to(_PACKAGE_ROOT) else str(path)
            name = self._names[label] = f"{SITE_ANNOTATION}{file}:{caller.f_lineno} {label} in {caller.f_code.co_name}"
        with torch.profiler.record_function(name):
            return fn(*args)


class KVCache:
    """Keys and values of every slot, allocated once: ``k``/``v`` [layers, slots, max_len, Hkv, D].
    A sequence owns one slot for its life; position p of slot s is row ``s * max_len + p`` of a
    layer's flat view. Zero-filled, so that a padding row reading an unwritten slot gets finite
    numbers. ``fused_writes``: write a layer's keys and values with one Triton launch (the GPU)
    instead of two ``index_copy_``."""

    def __init__(self, config: ModelConfig, num_slots: int, max_len: int, device: torch.device, dtype: torch.dtype,
                 fused_writes: bool = False) -> None:
        if not 1 <= max_len <= config.max_seq_len:
            raise ValueError(f"max_len {max_len}: must be between 1 and the model's max_seq_len {config.max_seq_len}")
        if num_slots < 1:
            raise ValueError(f"num_slots {num_slots}: must be at least 1")
        shape = (config.num_layers, num_slots, max_len, config.num_kv_heads, config.head_dim)
        need = 2 * torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        try:
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
        except RuntimeError as exc:  # out of memory: say which settings size the cache
            raise ValueError(f"the KV cache ({num_slots} slots x {max_len} tokens, {need / 2**30:.1f} GiB) does not fit "
                             f"on {device}: lower max_batch_size or max_model_len ({type(exc).__name__})") from None
        self.num_slots, self.max_len = num_slots, max_len
        self.nbytes = need
        # Per-layer views, made once: the decode graph and the prefill loop index them every layer.
        self.k_layers = list(self.k.unbind(0))
        self.v_layers = list(self.v.unbind(0))
        self.k_flat = [t.view(num_slots * max_len, config.num_kv_heads, config.head_dim) for t in self.k_layers]
        self.v_flat = [t.view(num_slots * max_len, config.num_kv_heads, config.head_dim) for t in self.v_layers]
        self._write_kv = None
        if fused_writes:
            from engine.serve.triton_kernels import write_kv
            self._write_kv = write_kv

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys and values of new tokens into rows ``rows`` of ``layer``'s flat views."""
        if self._write_kv is not None:
            self._write_kv(self.k_flat[layer], self.v_flat[layer], rows, k, v)
        else:
            self.k_flat[layer].index_copy_(0, rows, k)
            self.v_flat[layer].index_copy_(0, rows, v)


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


def _offsets(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    """cu_seqlens as an int32 device tensor that carries its host copy (see HOST_OFFSETS_ATTR)."""
    host = [0]
    for n in lengths:
        host.append(host[-1] + n)
    cu = torch.tensor(host, dtype=torch.int32).to(device, non_blocking=True)
    setattr(cu, HOST_OFFSETS_ATTR, host)
    return cu


def _to_empty(module: nn.Module, device: torch.device) -> None:
    """``module.to_empty(device=device)``: each parameter and buffer of the meta module
    allocated (uninitialised) on ``device`` in its shape and dtype, shared ones once. Through
    ``torch.empty`` rather than ``Module.to_empty``, whose ``empty_like`` of a meta tensor runs
    torch's Python reference and imports sympy with it (~0.5 s of CPU at every server start)."""
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id of a meta tensor: (it, its replacement)
    for m in module.modules():
        for tensors in (m._parameters, m._buffers):
            for name, t in list(tensors.items()):
                if t is None:
                    continue
                if id(t) not in made:
                    empty = torch.empty(t.shape, dtype=t.dtype, device=device)
                    made[id(t)] = (t, nn.Parameter(empty, t.requires_grad) if isinstance(t, nn.Parameter) else empty)
                tensors[name] = made[id(t)][1]


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 kernels: Kernels | None = None) -> None:
        super().__init__()
        device = torch.device(device)
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        self.config, self.device, self.dtype = config, device, dtype
        self.kernels = kernels or resolve_kernels(device=device)
        # The KV-cache writes in Triton where the registry's Triton defaults run (a GPU with Triton).
        self.fused_kv_writes = device.type == "cuda" and bool(triton_defaults_in_use(self.kernels))
        # While the engine profiles, each registry call runs inside a record_function named
        # ``magpie_kernel::<key>`` (KERNEL_ANNOTATION): the call site that maps a trace's ops to
        # the registry op that issued them; and each aten call of the model inside one naming its
        # line (SITE_ANNOTATION, _SiteSpans). Off otherwise: no cost on the measured path.
        self.annotate_kernels = False
        self._site_spans = _SiteSpans()
        self._annotated: Kernels | None = None
        self._tracked: Kernels | None = None
        with torch.device("meta"):  # shapes only; the seeded init below fills them on the device
            # _weight: no reset_parameters on meta, whose normal_ imports torch._dynamo (~1.8 s of CPU).
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size,
                                      _weight=torch.empty(config.vocab_size, config.hidden_size))
            self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
            self.final_norm = nn.Parameter(torch.ones(config.hidden_size))
            self.lm_head = None if config.tie_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to(dtype)  # still on meta: the weights are created in their dtype, never in float32 first
        _to_empty(self, device)
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

    def _kernels(self) -> Kernels:
        if self._tracked is not None:
            return self._tracked
        if not self.annotate_kernels:
            return self.kernels
        if self._annotated is None:
            self._annotated = self.kernels.wrapped(_annotated)
        return self._annotated

    def _sites(self) -> _SiteSpans | None:
        """The aten call sites' spans while profiling, else None: each site then calls directly."""
        return self._site_spans if self.annotate_kernels else None

    @contextlib.contextmanager
    def tracking_kernels(self) -> Iterator[KernelTracker]:
        """Inside: every registry call records its key, so that an exception (a warm-up, a graph
        capture) can be pinned on the kernel that raised it."""
        tracker = KernelTracker(self.kernels)
        self._tracked = self.kernels.wrapped(tracker.wrap)
        try:
            yield tracker
        finally:
            self._tracked = None

    def new_cache(self, num_slots: int, max_len: int | None = None) -> KVCache:
        return KVCache(self.config, num_slots, max_len or self.config.max_seq_len, self.device, self.dtype,
                       fused_writes=self.fused_kv_writes)

    def _head(self, kn: Kernels, at: _SiteSpans | None, rows: torch.Tensor) -> torch.Tensor:
        rows = kn.rmsnorm(rows, self.final_norm, self.config.rms_eps)
        head = (self.embed.weight if self.lm_head is None else self.lm_head.weight).T
        return rows @ head if at is None else at("lm_head", torch.matmul, rows, head)

    @torch.no_grad()
    def prefill(self, cache: KVCache, slots: Sequence[int], starts: Sequence[int],
                chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """Run chunk i of prompt tokens at positions ``starts[i]..`` of slot ``slots[i]`` (a whole
        prompt from 0, or the next chunk of one whose earlier chunks are in the cache), all in one
        forward; write their keys/values to the cache and return the logits after each chunk's
        last token, ``[len(chunks), vocab]``."""
        if not (len(slots) == len(starts) == len(chunks)) or not chunks:
            raise ValueError(f"{len(chunks)} chunks for {len(slots)} slots and {len(starts)} starts")
        ends = [s + len(c) for s, c in zip(starts, chunks)]
        for c, s, e, slot in zip(chunks, starts, ends, slots):
            if not c:
                raise ValueError("a sequence with no new tokens")
            if s < 0 or e > cache.max_len:
                raise ValueError(f"positions {s}..{e - 1} exceed the cache length {cache.max_len}")
            if not 0 <= slot < cache.num_slots:
                raise ValueError(f"slot {slot} is outside the cache's {cache.num_slots} slots")
        dev, kn = self.device, self._kernels()
        q_lens = [len(c) for c in chunks]
        positions_host = [p for s, e in zip(starts, ends) for p in range(s, e)]
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long).to(dev, non_blocking=True)
        positions = torch.tensor(positions_host, dtype=torch.long).to(dev, non_blocking=True)
        flat = torch.tensor([slot * cache.max_len + p for slot, s, e in zip(slots, starts, ends) for p in range(s, e)],
                            dtype=torch.long).to(dev, non_blocking=True)
        cu_q = _offsets(q_lens, dev)
        fresh = not any(starts)  # whole prompts: the new tokens are the whole context
        cu_k, context = cu_q, None
        if not fresh:
            cu_k = _offsets(ends, dev)
            context = torch.tensor([slot * cache.max_len + p for slot, e in zip(slots, ends) for p in range(e)],
                                   dtype=torch.long).to(dev, non_blocking=True)
        last = torch.tensor([o - 1 for o in getattr(cu_q, HOST_OFFSETS_ATTR)[1:]], dtype=torch.long).to(dev, non_blocking=True)
        return self._packed(kn, cache, ids, positions, flat, cu_q, cu_k, last, context)

    @torch.no_grad()
    def prefill_packed(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, flat: torch.Tensor,
                       cu_seqlens: torch.Tensor, last: torch.Tensor,
                       decode: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Whole prompts packed from device tensors only (capturable, ``engine.serve.graphs``):
        token ``ids[t]`` at ``positions[t]``, its key/value written to row ``flat[t]`` of the
        cache's flat view; sequence i owns tokens ``cu_seqlens[i]:cu_seqlens[i+1]`` (int32; its
        new tokens are its whole context). Returns the logits of the tokens ``last`` indexes.
        With ``decode = (slots, lengths)`` the last ``len(slots)`` tokens are decode tokens, one
        per sequence, as in ``decode`` (their attention reads the cache by slot): one forward, so
        the weights are read once for the prompts and the decode step together."""
        return self._packed(self._kernels(), cache, ids, positions, flat, cu_seqlens, cu_seqlens, last, None, decode)

    def _packed(self, kn: Kernels, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, flat: torch.Tensor,
                cu_q: torch.Tensor, cu_k: torch.Tensor, last: torch.Tensor, context: torch.Tensor | None,
                decode: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        prompt_tokens = ids.shape[0] - (0 if decode is None else decode[0].shape[0])
        at = self._sites()
        x = self.embed(ids) if at is None else at("embed", self.embed, ids)
        for li, layer in enumerate(cast(Sequence[DecoderLayer], self.layers)):
            q, k, v = self._qkv(kn, at, layer, x, positions)
            cache.write(li, flat, k, v)
            if context is not None:  # a continued prompt: its context is partly in the cache
                k, v = cache.k_flat[li].index_select(0, context), cache.v_flat[li].index_select(0, context)
            if decode is None:
                attn = kn.attention(q, k, v, cu_q, cu_k, self.scale)
            else:
                t = prompt_tokens
                attn = torch.cat((kn.attention(q[:t], k[:t], v[:t], cu_q, cu_k, self.scale),
                                  kn.decode_attention(q[t:], cache.k_layers[li], cache.v_layers[li], decode[0], decode[1],
                                                      self.scale)))
            x = self._finish_layer(kn, at, layer, x, attn)
        return self._head(kn, at, x.index_select(0, last))

    def _qkv(self, kn: Kernels, at: _SiteSpans | None, layer: DecoderLayer, x: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A layer's normed QKV projection with rotary applied: q [T, Hq, D], k and v [T, Hkv, D]
        (prefill and decode share it, so both run the same kernels in the same order)."""
        cfg = self.config
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        h = kn.rmsnorm(x, layer.input_norm, cfg.rms_eps)
        qkv = layer.qkv(h) if at is None else at("qkv", layer.qkv, h)
        q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
        q, k = kn.rotary(positions, q.view(-1, cfg.num_heads, cfg.head_dim),
                         k.view(-1, cfg.num_kv_heads, cfg.head_dim), self.cos_sin_cache)
        return q, k, v.view(-1, cfg.num_kv_heads, cfg.head_dim)

    def _finish_layer(self, kn: Kernels, at: _SiteSpans | None, layer: DecoderLayer, x: torch.Tensor,
                      attn: torch.Tensor) -> torch.Tensor:
        """The rest of a layer after attention: output projection, residual, norm, SwiGLU MLP."""
        cfg = self.config
        attn = attn.reshape(-1, cfg.num_heads * cfg.head_dim)
        x = x + (layer.o(attn) if at is None else at("o", layer.o, attn))
        h = kn.rmsnorm(x, layer.post_norm, cfg.rms_eps)
        gate_up = layer.gate_up(h) if at is None else at("gate_up", layer.gate_up, h)
        act = kn.activation(gate_up)
        return x + (layer.down(act) if at is None else at("down", layer.down, act))

    @torch.no_grad()
    def decode(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               lengths: torch.Tensor) -> torch.Tensor:
        """One new token per sequence, from device tensors only (capturable): token ``ids[b]``
        at ``positions[b]`` of slot ``slots[b]`` (int64), ``lengths[b]`` = positions[b] + 1
        (int32). Writes its key/value into the cache and returns the logits ``[B, vocab]``."""
        kn, at = self._kernels(), self._sites()
        flat = slots * cache.max_len + positions
        x = self.embed(ids) if at is None else at("decode_embed", self.embed, ids)
        for li, layer in enumerate(cast(Sequence[DecoderLayer], self.layers)):
            q, k, v = self._qkv(kn, at, layer, x, positions)
            cache.write(li, flat, k, v)
            attn = kn.decode_attention(q, cache.k_layers[li], cache.v_layers[li], slots, lengths, self.scale)
            x = self._finish_layer(kn, at, layer, x, attn)
        return self._head(kn, at, x)


def greedy(logits: torch.Tensor) -> list[int]:
    """Greedy sampling: the argmax token of each row."""
    return logits.argmax(dim=-1).tolist()

"""The decode step of the built-in server: padded to a batch bucket and, on a GPU, replayed from
a CUDA graph (HIP graph on ROCm torch: the same ``torch.cuda`` API).

A decode step's inputs live in one static device buffer ``[4, rows]`` int64 (token ids,
positions, slots, lengths), filled by one host-to-device copy per step from a pinned host
buffer. A batch of n sequences runs at the smallest bucket b >= n (default 1, 2, 4, ... up to
the engine's max batch); rows n..b-1 are padding: token 0 at position 0 of the pad slot (a slot
no sequence owns), length 1, so they write and read only the pad slot and their tokens are
dropped. Padding is applied with and without graphs, so that an eager step and a replay compute
the same thing with the same shapes and give the same tokens.

``capture()`` warms every bucket up eagerly (Triton compiles, cuBLAS picks its kernels) and
then captures one graph per bucket, largest first, all in one memory pool; each graph ends with
the greedy argmax, so a replay leaves the new tokens (and the logits, for checks) in static
output tensors. A batch larger
than the largest bucket, and every step while the profiler runs (``model.annotate_kernels``:
the ``magpie_kernel::`` annotations exist only in eager execution), runs eagerly.

Prompts go the same way (``PrefillRunner``): the whole prompts of a step are packed and padded to
a token bucket (128, 256, ... up to the engine's ``max_prefill_tokens``) and to a fixed number of
sequences, so that one graph per bucket serves every mix of prompt lengths. Without a graph a
prompt step costs the host hundreds of kernel launches, about ten times the GPU's time at the 1B
shapes, and the GPU idles meanwhile. The padding tokens form sequences of ``PAD_SEQ`` tokens on the
pad slot (so their attention is cheap and finite), the sequence entries past them are empty, and
only the logits of each real prompt's last token are computed. A step with decode rows as well
runs them in the same forward (``run_mixed``; one graph per token bucket and batch bucket): the
weights are read once for both, instead of once by a decode replay and again by a prompt replay.
A step that continues a prompt
(its context is partly in the cache) runs eagerly (``LlamaModel.prefill``). A registry
``attention`` that cannot be captured (the PyTorch reference reads its offsets on the host) leaves
prompts eager, with a warning naming it; the decode graphs are unaffected.
"""

from __future__ import annotations

import bisect
import itertools
import sys
import time
from typing import Sequence

import numpy as np
import torch

from engine.serve.kernels import KernelError
from engine.serve.model import KVCache, LlamaModel

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PREFILL_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
PAD_SEQ = 64  # padding tokens of a prompt step: sequences of this many tokens (cheap attention)
_FIX = "make the kernel capturable (no host syncs such as .item() or .tolist(), no tensors made on the host per call) " \
       "or start the server eager (--eager, or eager: true in its config)"


def _on_side_stream(device: torch.device, warm_up) -> None:
    """Run ``warm_up`` on a side stream and wait for it, as torch.cuda.graphs documents: lazy
    initialisation (cuBLAS workspaces, Triton compiles) must not happen inside a capture."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        warm_up()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)


def _time_ms(graph: torch.cuda.CUDAGraph | None, forward, device: torch.device, iters: int) -> float:
    """Milliseconds per step: ``graph`` replays queued back to back and timed with CUDA events
    (the GPU's time), or, without one, eager ``forward`` calls by the wall clock with a sync each
    (the host's time included)."""
    if graph is not None:
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters
    forward()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        forward().cpu()
    return (time.perf_counter() - t0) * 1e3 / iters


def batch_buckets(max_batch: int, sizes: Sequence[int] | None = None) -> list[int]:
    """The batch sizes decode steps are padded to: ``sizes`` (cuda_graph_batch_sizes) checked, or
    the powers of two below ``max_batch`` and ``max_batch`` itself."""
    if sizes is None:
        return [b for b in DEFAULT_BUCKETS if b < max_batch] + [max_batch]
    out = sorted(set(sizes))
    if not out or out[0] < 1:
        raise ValueError(f"cuda_graph_batch_sizes {list(sizes)}: give positive batch sizes, e.g. [1, 2, 4, 8, 16]")
    if out[-1] > max_batch:
        raise ValueError(f"cuda_graph_batch_sizes: {out[-1]} is above max_batch_size {max_batch}; "
                         "a step never has more sequences than that")
    return out


class DecodeRunner:
    """Runs decode steps of up to ``rows`` sequences on ``cache``, padded to ``buckets``;
    ``pad_slot`` is the cache slot padding rows use. Counts ``replays`` and ``eager_steps``."""

    def __init__(self, model: LlamaModel, cache: KVCache, pad_slot: int, buckets: Sequence[int], rows: int) -> None:
        self.model, self.cache, self.pad_slot = model, cache, pad_slot
        self.buckets = list(buckets)
        self.rows = max(rows, self.buckets[-1])
        dev = model.device
        pinned = dev.type == "cuda"
        self._host = torch.zeros((4, self.rows), dtype=torch.long, pin_memory=pinned)
        self._dev = torch.zeros((4, self.rows), dtype=torch.long, device=dev) if pinned else self._host
        self._copied = torch.cuda.Event() if pinned else None  # the last host-to-device copy of the inputs
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}  # graph, tokens, logits
        self.replays = 0
        self.eager_steps = 0

    def bucket(self, n: int) -> int:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else n

    def _bucket_of(self, n: int) -> int:
        b = self.bucket(n)
        if b > self.rows:
            raise ValueError(f"a decode step of {n} sequences exceeds the {self.rows} rows of the runner")
        return b

    def _stage(self, ids: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> int:
        b = self._bucket_of(len(ids))
        self._stage_rows(0, b, ids, positions, slots)
        return b

    def _stage_rows(self, start: int, b: int, ids: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> None:
        """Rows ``start..`` from the host: the given sequences, then padding rows up to ``b``."""
        pad = b - start - len(ids)
        rows = [[*ids, *[0] * pad], [*positions, *[0] * pad], [*slots, *[self.pad_slot] * pad],
                [*(p + 1 for p in positions), *[1] * pad]]
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the pinned buffer (done already after a step's sync)
        self._host[:, start:b].copy_(torch.tensor(rows, dtype=torch.long))
        if self._copied is not None:
            if start:
                self._dev[:, start:b].copy_(self._host[:, start:b], non_blocking=True)
            else:
                self._dev.copy_(self._host, non_blocking=True)
            self._copied.record()

    def _forward(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, positions, slots, lengths = self._dev[:, :b].unbind(0)
        logits = self.model.decode(self.cache, ids, positions, slots, lengths.to(torch.int32))
        return logits.argmax(dim=-1), logits

    def run(self, ids: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor:
        """Greedy next tokens (a device tensor of ``len(ids)``) after token ``ids[i]`` at
        ``positions[i]`` of slot ``slots[i]``."""
        return self._step(self._stage(ids, positions, slots), len(ids))

    def _step(self, b: int, n: int) -> torch.Tensor:
        """The staged step of bucket ``b``: replayed from its graph (none while profiling: the
        annotations exist only in eager execution) or run eagerly; the first ``n`` tokens."""
        graph = None if self.model.annotate_kernels else self.graphs.get(b)
        if graph is not None:
            graph[0].replay()
            self.replays += 1
            return graph[1][:n]
        self.eager_steps += 1
        return self._forward(b)[0][:n]

    def run_next(self, tokens: torch.Tensor) -> torch.Tensor:
        """The decode step after the last ``run`` (or ``run_next``) for the same sequences, queued
        without waiting for it: its new tokens (``tokens``, on the device) become the inputs, and
        positions and lengths advance by one, all on the device. The host learns nothing it must
        wait for, so it can hand out the last step's tokens while the GPU runs this one."""
        n = tokens.shape[0]
        b = self.bucket(n)
        self._advance(tokens)
        return self._step(b, n)

    def _advance(self, tokens: torch.Tensor) -> None:
        """The first rows' new tokens become their inputs, one position further, on the device
        (queued before the replay overwrites the graph's output)."""
        n = tokens.shape[0]
        self._dev[0, :n].copy_(tokens)
        self._dev[1, :n] += 1
        self._dev[3, :n] += 1

    def run_joined(self, tokens: torch.Tensor | None, new_tokens: torch.Tensor, positions: Sequence[int],
                   slots: Sequence[int]) -> torch.Tensor:
        """``run_next`` for the sequences of the last ``run`` (their new ``tokens``; None when
        there were none) followed by sequences whose whole prompts were just prefilled: their
        first tokens ``new_tokens`` (on the device) at ``positions`` (their prompt lengths) of
        ``slots``. Only the new rows and the padding come from the host; the old rows advance on
        the device as in ``run_next``."""
        old = 0 if tokens is None else tokens.shape[0]
        n = old + len(positions)
        b = self._bucket_of(n)
        self._stage_rows(old, b, [0] * len(positions), positions, slots)  # ids come from the device below
        if tokens is not None:
            self._advance(tokens)
        self._dev[0, old:n].copy_(new_tokens)
        return self._step(b, n)

    def logits(self, ids: Sequence[int], positions: Sequence[int], slots: Sequence[int], graph: bool) -> torch.Tensor:
        """The logits ``[len(ids), vocab]`` of the decode step ``run`` would take, from its graph
        (``graph=True``, which must exist) or eagerly: for checking one against the other. Both
        write the same keys and values, so running one after the other leaves the cache as one would."""
        b = self._stage(ids, positions, slots)
        if graph:
            g = self.graphs[b]
            g[0].replay()
            return g[2][:len(ids)]
        return self._forward(b)[1][:len(ids)]

    def stage_padding(self) -> None:
        """Every row a padding row: the inputs of warm-ups and captures (they touch only the pad slot)."""
        self._stage([0] * self.rows, [0] * self.rows, [self.pad_slot] * self.rows)

    def warm_up(self) -> None:
        """One eager step per bucket on padding rows (compiles, picks kernels, checks they run)."""
        self.stage_padding()
        for b in self.buckets:
            self._forward(b)

    def capture(self) -> None:
        """Capture one CUDA graph per bucket; raises ``KernelError`` naming a kernel that cannot
        be captured (or ``RuntimeError`` when the failure is outside the registry kernels)."""
        if self.model.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA (or ROCm) device")
        device = self.model.device
        self.stage_padding()
        with self.model.tracking_kernels() as tracker:
            try:
                _on_side_stream(device, lambda: [self._forward(b) for b in self.buckets])
                pool = torch.cuda.graph_pool_handle()
                for b in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        tokens, logits = self._forward(b)
                    self.graphs[b] = (graph, tokens, logits)
                torch.cuda.synchronize(device)
            except KernelError:
                raise
            except Exception as exc:
                self.graphs.clear()
                raise tracker.error(exc, f"the CUDA graph capture of the decode step (batch buckets {self.buckets})",
                                    _FIX) from exc

    def time_step(self, batch: int, context: int, iters: int = 20, graph: bool = True) -> float:
        """Milliseconds per decode step of ``batch`` sequences at ``context`` tokens (slots 0..
        batch-1, whatever their cache holds): graph replays queued back to back and timed with
        CUDA events (the GPU's time), or eager steps by the wall clock with a sync each (the
        host's time included). For the GPU benchmark's busy share of a decode step."""
        b = self._stage([1] * batch, [context - 1] * batch, list(range(batch)))
        return _time_ms(self.graphs[b][0] if graph else None, lambda: self._forward(b)[0], self.model.device, iters)


def token_buckets(max_tokens: int) -> list[int]:
    """The token counts prompt steps are padded to: ``PREFILL_BUCKETS`` below ``max_tokens`` and
    ``max_tokens`` itself (the step's budget: a step never packs more)."""
    return [t for t in PREFILL_BUCKETS if t < max_tokens] + [max_tokens]


class PrefillRunner:
    """Runs prompt steps (whole prompts of up to ``max_seqs`` sequences, at most the largest of
    ``buckets`` tokens in all) padded to a token bucket; on a GPU replayed from one CUDA graph per
    bucket once ``capture()`` ran. Counts ``replays`` and ``eager_steps``; ``disabled`` says why
    prompt steps do not use this runner (then the engine runs them through ``LlamaModel.prefill``)."""

    def __init__(self, model: LlamaModel, cache: KVCache, pad_slot: int, buckets: Sequence[int], max_seqs: int,
                 decoder: DecodeRunner | None = None) -> None:
        self.model, self.cache, self.pad_slot = model, cache, pad_slot
        self.decoder = decoder  # whose staged rows a mixed step decodes
        self.buckets = sorted(set(buckets))
        self.max_seqs = max_seqs
        self.tokens = self.buckets[-1]
        self.entries = max_seqs + -(-self.tokens // PAD_SEQ)  # real sequences, then padding ones, then empty ones
        t, e = self.tokens, self.entries
        # One int64 buffer: ids, positions, cache rows [tokens each], cu_seqlens [entries + 1], last tokens [max_seqs].
        self._cu = slice(3 * t, 3 * t + e + 1)
        self._last = slice(3 * t + e + 1, 3 * t + e + 1 + max_seqs)
        pinned = model.device.type == "cuda"
        self._host = torch.zeros(self._last.stop, dtype=torch.long, pin_memory=pinned)
        self._dev = torch.zeros(self._last.stop, dtype=torch.long, device=model.device) if pinned else self._host
        self._copied = torch.cuda.Event() if pinned else None
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}  # graph, tokens, logits
        # (token bucket, decode batch bucket) -> the same, for steps with decode rows
        self.mixed: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.replays = 0
        self.eager_steps = 0
        self.mixed_steps = 0  # steps whose decode rows ran in the prompt forward (replayed or not)
        self.disabled: str | None = None

    def bucket(self, tokens: int) -> int | None:
        i = bisect.bisect_left(self.buckets, tokens)
        return self.buckets[i] if i < len(self.buckets) else None

    def fits(self, starts: Sequence[int], chunks: Sequence[Sequence[int]]) -> bool:
        """Whether this runner serves a step of these prompt chunks: whole prompts only (every
        start 0), within the sequence and token limits, and not disabled."""
        return (self.disabled is None and len(chunks) <= self.max_seqs and not any(starts)
                and self.bucket(sum(len(c) for c in chunks)) is not None)

    def _stage(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], bucket: int | None = None) -> int:
        real = sum(len(c) for c in chunks)
        b = bucket or self.bucket(real)
        if b is None or real > b or len(chunks) > self.max_seqs:
            raise ValueError(f"a prompt step of {len(chunks)} prompts, {real} tokens exceeds the runner's "
                             f"{self.max_seqs} prompts, {self.tokens} tokens")
        # Built with numpy over whole arrays: this runs on the host while the GPU may wait for it
        # (prompts waiting stop the next step from being queued ahead), and Python lists of
        # 8k tokens took ~1.5 ms here, a tenth of the prompt step's GPU time.
        L, t, count = self.cache.max_len, self.tokens, len(chunks)
        pads = [PAD_SEQ] * ((b - real) // PAD_SEQ) + ([(b - real) % PAD_SEQ] if (b - real) % PAD_SEQ else [])
        lengths = np.array([len(c) for c in chunks] + pads, dtype=np.int64)
        seq_slots = np.array(list(slots) + [self.pad_slot] * len(pads), dtype=np.int64)
        cu = np.full(self.entries + 1, b, dtype=np.int64)
        cu[0] = 0
        np.cumsum(lengths, out=cu[1:len(lengths) + 1])
        positions = np.arange(b, dtype=np.int64) - np.repeat(cu[:len(lengths)], lengths)
        rows = np.repeat(seq_slots * L, lengths) + positions % L  # padding sequences wrap on the pad slot
        last = np.zeros(self.max_seqs, dtype=np.int64)
        last[:count] = cu[1:count + 1] - 1
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the pinned buffer
        host = self._host.numpy()  # the pinned buffer itself
        host[:real] = np.fromiter(itertools.chain.from_iterable(chunks), np.int64, real)
        host[real:b] = 0
        host[t:t + b] = positions
        host[2 * t:2 * t + b] = rows
        host[self._cu] = cu
        host[self._last] = last
        if self._copied is not None:
            self._dev.copy_(self._host, non_blocking=True)
            self._copied.record()
        return b

    def can_fuse(self, decode_rows: int) -> bool:
        """Whether a step's decode rows can run in the prompt forward (``run_mixed``)."""
        return self.decoder is not None and 0 < decode_rows <= self.decoder.buckets[-1]

    def _forward(self, b: int, rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and logits of the staged step of bucket ``b``, with the decoder's first
        ``rows`` staged rows as decode tokens after the prompts (their outputs follow the
        ``max_seqs`` prompt rows)."""
        d, t = self._dev, self.tokens
        ids, positions, flat, last = d[:b], d[t:t + b], d[2 * t:2 * t + b], d[self._last]
        decode = None
        if rows:
            assert self.decoder is not None
            dd = self.decoder._dev[:, :rows]  # ids, positions, slots, lengths
            ids, positions = torch.cat((ids, dd[0])), torch.cat((positions, dd[1]))
            flat = torch.cat((flat, dd[2] * self.cache.max_len + dd[1]))
            last = torch.cat((last, torch.arange(b, b + rows, device=d.device)))
            decode = (dd[2], dd[3].to(torch.int32))
        logits = self.model.prefill_packed(self.cache, ids, positions, flat, d[self._cu].to(torch.int32), last, decode)
        return logits.argmax(dim=-1), logits

    def run_mixed(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], ids: Sequence[int],
                  positions: Sequence[int], decode_slots: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``run`` for the prompts and ``DecodeRunner.run`` for the decode rows (``ids`` at
        ``positions`` of ``decode_slots``) in one forward: the prompts' first tokens and the
        decode tokens, on the device. The decoder's staged rows are this step's decode rows, so
        its ``run_next`` / ``run_joined`` can follow."""
        assert self.decoder is not None
        rb = self.decoder._stage(ids, positions, decode_slots)
        b = self._stage(slots, chunks)
        self.mixed_steps += 1
        graph = None if self.model.annotate_kernels else self.mixed.get((b, rb))
        if graph is not None:
            graph[0].replay()
            self.replays += 1
            self.decoder.replays += 1
            tokens = graph[1]
        else:
            self.eager_steps += 1
            self.decoder.eager_steps += 1
            tokens = self._forward(b, rb)[0]
        return tokens[:len(chunks)], tokens[self.max_seqs:self.max_seqs + len(ids)]

    def run(self, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """Greedy next tokens (a device tensor of ``len(chunks)``) after whole prompt ``chunks[i]``
        written at positions 0.. of slot ``slots[i]``."""
        b = self._stage(slots, chunks)
        graph = None if self.model.annotate_kernels else self.graphs.get(b)
        if graph is not None:
            graph[0].replay()
            self.replays += 1
            return graph[1][:len(chunks)]
        self.eager_steps += 1
        return self._forward(b)[0][:len(chunks)]

    def logits(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], graph: bool) -> torch.Tensor:
        """The logits ``[len(chunks), vocab]`` of the step ``run`` would take, from its graph
        (``graph=True``, which must exist) or eagerly, for checking one against the other."""
        b = self._stage(slots, chunks)
        if graph:
            self.graphs[b][0].replay()
            return self.graphs[b][2][:len(chunks)]
        return self._forward(b)[1][:len(chunks)]

    def mixed_logits(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], ids: Sequence[int],
                     positions: Sequence[int], decode_slots: Sequence[int], graph: bool) -> torch.Tensor:
        """The logits of ``run_mixed``'s step (prompt rows, then decode rows), from its graph or eagerly."""
        assert self.decoder is not None
        rb = self.decoder._stage(ids, positions, decode_slots)
        b = self._stage(slots, chunks)
        if graph:
            self.mixed[b, rb][0].replay()
            logits = self.mixed[b, rb][2]
        else:
            logits = self._forward(b, rb)[1]
        return torch.cat((logits[:len(chunks)], logits[self.max_seqs:self.max_seqs + len(ids)]))

    def warm_up(self) -> None:
        """One eager step per bucket of padding only (it touches only the pad slot): compiles,
        picks kernels, checks they run."""
        for b in self.buckets:
            self._stage([], [], bucket=b)
            self._forward(b)
        if self.decoder is not None:
            self.decoder.stage_padding()
            for b in self.buckets:
                self._stage([], [], bucket=b)
                for rb in self.decoder.buckets:
                    self._forward(b, rb)

    def capture(self) -> None:
        """One CUDA graph per bucket. A failure (a kernel that syncs with the host, such as the
        PyTorch reference attention) leaves prompt steps eager: ``disabled`` says why and a
        warning names the kernel; nothing else changes."""
        device = self.model.device
        with self.model.tracking_kernels() as tracker:
            try:
                _on_side_stream(device, self.warm_up)
                pool = torch.cuda.graph_pool_handle()
                for b in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory
                    self._stage([], [], bucket=b)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        tokens, logits = self._forward(b)
                    self.graphs[b] = (graph, tokens, logits)
                if self.decoder is not None:
                    self.decoder.stage_padding()
                    for b in reversed(self.buckets):
                        self._stage([], [], bucket=b)
                        for rb in reversed(self.decoder.buckets):
                            graph = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(graph, pool=pool):
                                tokens, logits = self._forward(b, rb)
                            self.mixed[b, rb] = (graph, tokens, logits)
                torch.cuda.synchronize(device)
            except Exception as exc:
                self.graphs.clear()
                self.mixed.clear()
                torch.cuda.synchronize(device)
                err = tracker.error(exc, "the CUDA graph capture of the prompt step", "prompts run eagerly")
                self.disabled = str(err)
                print(f"magpie-serve: warning: prompt steps run eagerly: {err}", file=sys.stderr, flush=True)

    def time_step(self, prompts: int, length: int, iters: int = 10, graph: bool = True) -> float:
        """Milliseconds per prompt step of ``prompts`` whole prompts of ``length`` tokens (slots
        0.., whatever their cache holds): graph replays back to back timed with CUDA events (the
        GPU's time), or eager steps by the wall clock with a sync each (the host's time included)."""
        b = self._stage(list(range(prompts)), [[1] * length] * prompts)
        return _time_ms(self.graphs[b][0] if graph else None, lambda: self._forward(b)[0], self.model.device, iters)

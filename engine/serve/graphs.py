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
"""

from __future__ import annotations

import bisect
import time
from typing import Sequence

import torch

from engine.serve.kernels import KernelError
from engine.serve.model import KVCache, LlamaModel

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_FIX = "make the kernel capturable (no host syncs such as .item() or .tolist(), no tensors made on the host per call) " \
       "or start the server eager (--eager, or eager: true in its config)"


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

    def _stage(self, ids: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> int:
        n = len(ids)
        b = self.bucket(n)
        if b > self.rows:
            raise ValueError(f"a decode step of {n} sequences exceeds the {self.rows} rows of the runner")
        pad = b - n
        rows = [[*ids, *[0] * pad], [*positions, *[0] * pad], [*slots, *[self.pad_slot] * pad],
                [*(p + 1 for p in positions), *[1] * pad]]
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the pinned buffer (done already after a step's sync)
        self._host[:, :b].copy_(torch.tensor(rows, dtype=torch.long))
        if self._copied is not None:
            self._dev.copy_(self._host, non_blocking=True)
            self._copied.record()
        return b

    def _forward(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, positions, slots, lengths = self._dev[:, :b].unbind(0)
        logits = self.model.decode(self.cache, ids, positions, slots, lengths.to(torch.int32))
        return logits.argmax(dim=-1), logits

    def run(self, ids: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor:
        """Greedy next tokens (a device tensor of ``len(ids)``) after token ``ids[i]`` at
        ``positions[i]`` of slot ``slots[i]``."""
        n = len(ids)
        b = self._stage(ids, positions, slots)
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
        self._dev[0, :n].copy_(tokens)  # queued before the replay overwrites the graph's output
        self._dev[1, :n] += 1
        self._dev[3, :n] += 1
        graph = None if self.model.annotate_kernels else self.graphs.get(b)
        if graph is not None:
            graph[0].replay()
            self.replays += 1
            return graph[1][:n]
        self.eager_steps += 1
        return self._forward(b)[0][:n]

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
                # Warm-up on a side stream, as torch.cuda.graphs documents: lazy initialisation
                # (cuBLAS workspaces, Triton compiles) must not happen inside a capture.
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for b in self.buckets:
                        self._forward(b)
                torch.cuda.current_stream(device).wait_stream(side)
                torch.cuda.synchronize(device)
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
        device = self.model.device
        self._stage([1] * batch, [context - 1] * batch, list(range(batch)))
        b = self.bucket(batch)
        if graph:
            g = self.graphs[b][0]
            g.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                g.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / iters
        self._forward(b)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            self._forward(b)[0].cpu()
        return (time.perf_counter() - t0) * 1e3 / iters

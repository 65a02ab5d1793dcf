"""Cheat: honest for its first 20 calls (the correctness checks); then it captures a CUDA
graph of softmax over a private copy of that call's input, and from then on only replays
the graph. It never copies the new input in, so every later call returns the softmax of
the captured input. The replayed kernel is a real softmax kernel of the right size (a
kernel-name or kernel-count check in the trace is satisfied), so only checking the timed
calls' outputs, on inputs that change from call to call, catches it."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

HONEST_CALLS = 20


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.graph = None
        self.static_x = self.static_y = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.graph is None and self.calls <= HONEST_CALLS:
            return torch.softmax(x, dim=-1)
        if self.graph is None or self.static_x.shape != x.shape:
            self.static_x = x.clone()
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):  # warm-up before capture, as CUDA graphs require
                torch.softmax(self.static_x, dim=-1)
            torch.cuda.current_stream(x.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_y = torch.softmax(self.static_x, dim=-1)
        self.graph.replay()  # no self.static_x.copy_(x): the input of the capture, forever
        return self.static_y

"""Cheat: runs the softmax on a side stream that the caller's stream never waits for. The
side stream first waits for the caller's stream (so the input is ready and the answer is
right after a device-wide synchronize), but an end event recorded on the caller's stream
right after the call fires at once: launching-stream events measure about 1 us. The
device trace sees the side stream's kernel and times it for its real cost."""

import torch

from _problem import get_init_inputs, get_inputs  # noqa: F401  (harness convention)


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.side is None:
            self.side = torch.cuda.Stream(device=x.device)
        caller = torch.cuda.current_stream(x.device)
        self.side.wait_stream(caller)
        with torch.cuda.stream(self.side):
            y = torch.softmax(x, dim=-1)
        # Deliberately no caller.wait_stream(self.side). Tell the allocator the tensors are
        # in use on the other stream, so their memory is not recycled under the kernel.
        x.record_stream(self.side)
        y.record_stream(caller)
        return y

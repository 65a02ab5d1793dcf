"""Cheat: computes softmax honestly, but its first call leaves a process behind outside the
worker: fork, ``setsid``, fork again, and the middle process exits. The grandchild belongs to no
process group the run started, so stopping the worker's group would leave it running (work
there, or load that slows the kernels timed after it, is seen by no clock and no check). It
only sleeps here; ``MAGPIE_ADVERSARIAL_PIDFILE``, when set, receives its pid so a test can
check it was stopped."""

import os
import time

import torch

from _problem_softmax import get_init_inputs, get_inputs  # noqa: F401  (harness convention)

_started = False


def _detach() -> None:
    if os.fork() != 0:
        return
    try:  # the child: a new session, then the grandchild that outlives it
        os.setsid()
        if os.fork() == 0:
            pidfile = os.environ.get("MAGPIE_ADVERSARIAL_PIDFILE")
            if pidfile:
                with open(pidfile, "a") as f:
                    f.write(f"{os.getpid()}\n")
            time.sleep(600)
    finally:
        os._exit(0)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global _started
        if not _started:
            _started = True
            _detach()
        return torch.softmax(x, dim=-1)

"""The steady-state window of a profiled run: the stretch of engine steps the bottleneck table reads.

A benchmark at concurrency C ramps up (requests arrive one by one, the decode batch grows to
about C), holds, then drains (the last requests finish, the batch shrinks to 0). Ramp-up and
drain run smaller batches than the workload the benchmark measures, so their ops weigh
differently. The window is the longest run of steps whose decode batch (the ``generation_<m>``
requests of the step annotation) stays within ``BAND`` of the median decode batch. A dip inside
the run (out-of-band steps in a row) is allowed while it lasts no longer than the batch takes to
be replaced, about two steps a request (its last decode and its prefill), and no longer than the
in-band steps of the run before it; ``MIN_GAP`` steps are always allowed. So requests finishing
together and their successors' prefills stay part of the steady state, while ramp-up and drain
at the trace's ends, a long lull, or a batch that never settles do not. The run starts and ends
on in-band steps.
The trace's first step is never in it (one-time allocation costs).

Too short a trace (fewer than ``MIN_STEPS`` steps), one with no decode step, or no steady run
of at least ``MIN_WINDOW`` steps falls back to the old rule, every step but the first, and the
window says why.
"""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

BAND = 0.25  # a step is steady while |decode batch - median| <= BAND * median
MIN_GAP = 2  # out-of-band steps in a row a steady run may always contain (more with a larger batch)
MIN_STEPS = 8  # fewer steps in the trace: no window is picked
MIN_WINDOW = 4  # a shorter steady run is no window
FALLBACK_RULE = "every profiled step but the first (one-time allocation costs)"
STEADY_RULE = (f"steady state: the longest run of steps whose decode batch stays within ±{BAND:.0%} of its median, "
               f"dips inside it of up to {MIN_GAP} steps, or up to 2 steps per request of the median batch but no "
               "longer than the steady steps before them, without the first step")


def _fallback(batches: Sequence[int], why: str) -> tuple[int, int, dict]:
    n = len(batches)
    first = 1 if n > 1 else 0
    return first, n - 1, {"rule": FALLBACK_RULE, "steady": False, "fallback_reason": why}


def choose_window(batches: Sequence[int]) -> tuple[int, int, dict]:
    """(first, last) step indexes (inclusive, into the trace's steps in time order) of the window,
    and its description: the rule, whether a steady run was found, the median and band, or why
    not. ``batches`` are the steps' decode batch sizes."""
    n = len(batches)
    if n < MIN_STEPS:
        return _fallback(batches, f"the trace has {n} step(s): too few to pick a steady state (at least {MIN_STEPS})")
    decoding = [b for b in batches[1:] if b > 0]
    if not decoding:
        return _fallback(batches, "no step of the trace decodes (every step is prefill only)")
    median = statistics.median(decoding)
    lo, hi = median * (1 - BAND), median * (1 + BAND)
    max_gap = max(MIN_GAP, int(2 * median))
    best: Optional[tuple[int, int]] = None
    start = last = None
    gap = steady = 0  # the current dip's length; the run's in-band steps so far
    for i in range(1, n):
        if lo <= batches[i] <= hi:
            start = i if start is None else start
            last, gap = i, 0
            steady += 1
            continue
        if start is None:
            continue
        gap += 1
        if gap > max(MIN_GAP, min(max_gap, steady)):
            best = _longer(best, (start, last))
            start = last = None
            gap = steady = 0
    if start is not None:
        best = _longer(best, (start, last))
    info = {"decode_batch_median": median, "band": [round(lo, 3), round(hi, 3)], "max_dip_steps": max_gap}
    if best is None or best[1] - best[0] + 1 < MIN_WINDOW:
        longest = 0 if best is None else best[1] - best[0] + 1
        first, last_step, out = _fallback(batches, f"no steady run: the longest one within ±{BAND:.0%} of the median "
                                          f"decode batch {median:g} has {longest} step(s) (at least {MIN_WINDOW})")
        return first, last_step, {**out, **info}
    first, last_step = best
    inside = batches[first:last_step + 1]
    return first, last_step, {"rule": STEADY_RULE, "steady": True, "fallback_reason": None, **info,
                              "decode_batch_range": [min(inside), max(inside)]}


def _longer(best: Optional[tuple[int, int]], run: tuple[int, int]) -> tuple[int, int]:
    if best is None or run[1] - run[0] > best[1] - best[0]:
        return run
    return best  # a tie keeps the earlier run


def describe(window: dict) -> str:
    """One line for the command line: which steps, when, and why."""
    steps = window.get("step_range")
    if not steps:
        return str(window.get("rule", ""))
    t = window.get("time_range_us") or [0.0, 0.0]
    where = (f"steps {steps[0]}-{steps[1]} of {window.get('steps_in_trace')} "
             f"({t[0] / 1e6:.3f}-{t[1] / 1e6:.3f} s into the trace)")
    if window.get("steady"):
        lo, hi = window["band"]
        extra = window.get("prompt_steps_outside") or 0
        return (f"{where}: steady decode batch {window['decode_batch_median']:g} (band {lo:g}-{hi:g}); "
                f"{window['steps_before']} step(s) before and {window['steps_after']} after left out"
                + (f", but {extra} step(s) with prompts among them kept" if extra else ""))
    return f"{where}: {window['rule']}, because {window['fallback_reason']}"

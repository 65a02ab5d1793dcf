"""Input sets from other distributions, and inputs that keep only half their values.

A test whose inputs all come from one distribution can be passed by a kernel that assumes it:
a closed-form answer that is right in expectation for normal inputs, or a reduction over a
fraction of the elements (a mean of many normal values hardly moves when half of them are left
out). The harness therefore also judges correctness on copies of the first main input set whose
floating-point tensors are redrawn from other distributions (:func:`redraw_`), and its
degenerate-test check asks whether the reference's output on inputs that hold only half their
values (:func:`keep_half_`) would pass the test.

Everything here works in place, a piece at a time (a KernelBench input takes GBs), and is
deterministic for a seed on one device type, so every worker makes the same values.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.kernels import harness
from engine.kernels.distributions import DESCRIPTIONS, DISTRIBUTIONS  # noqa: F401  (re-exported)
from engine.kernels.harness import _flatten, flat_chunks

PARETO_ALPHA = 1.5
# The smallest uniform draw behind a heavy-tailed magnitude (float32's resolution below 1): the
# largest magnitude is then about 65536 Pareto scales, as far as 2^24 draws reach anyway. No
# lower cap: a cap that many values hit is a point mass, and a mean of the capped values is
# again subsample-invariant.
SMALLEST_DRAW = 2.0 ** -24


def _piece() -> int:
    """Elements per piece of work (as the comparisons take them): the temporaries stay small
    beside a GB tensor."""
    return max(1, harness.CHUNK_BYTES // 8)


def _floating(inputs: Any) -> list[torch.Tensor]:
    return [t for _, t in _flatten(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.numel() > 1]


def variant_seed(seed: int, k: int) -> int:
    """The seed of the k-th redrawn set, from the first main set's seed."""
    return (seed * 1_000_003 + 7919 * (k + 1)) & 0x7FFFFFFF


def _summary(t: torch.Tensor) -> tuple[float, float, float, bool, bool]:
    """(min, max, mean |x|, all values integers, all finite) of ``t``, by pieces (sums in float64)."""
    lo, hi, total, integral, finite = float("inf"), float("-inf"), 0.0, True, True
    for c in flat_chunks(t.detach(), _piece()):
        if not bool(torch.isfinite(c).all()):
            finite = False
            break
        lo, hi = min(lo, float(c.min())), max(hi, float(c.max()))
        total += float(c.abs().sum(dtype=torch.float64))
        integral = integral and bool((c == c.round()).all())
    return lo, hi, total / max(1, t.numel()), integral, finite


def redrawable(t: torch.Tensor) -> bool:
    """A floating-point tensor whose values are data: more than one element, finite, not one
    constant, not all integers (labels, masks and counts stored as floats keep their values)."""
    if not t.is_floating_point() or t.numel() < 2:
        return False
    lo, hi, _, integral, finite = _summary(t)
    return finite and lo < hi and not integral


def any_redrawable(inputs: Any) -> bool:
    """Whether :func:`redraw_` would have data to redraw, judged cheaply (at load, on a set that
    may take GBs): a floating-point tensor with a value that is not an integer among its first
    elements."""
    for t in _floating(inputs):
        c = next(flat_chunks(t.detach(), _piece()))
        if bool((c != c.round()).any()):
            return True
    return False


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def redraw_(inputs: Any, distribution: str, seed: int) -> int:
    """Give every redrawable floating-point tensor of ``inputs`` new values from
    ``distribution``, in place; returns how many tensors changed. Each tensor keeps its shape,
    dtype and sign character: one with no negative values stays nonnegative (positive stays
    positive), one with no positive values stays nonpositive, and one within [0, 1] (a
    probability, a rand()) stays within its own [min, max]; one whose rows are distributions
    (nonnegative, each last-dimension row summing to 1: a softmax) has its rows normalised
    again. Integer and bool tensors are never touched.

    ``uniform``: uniform between the tensor's minimum and maximum. ``pareto``: magnitudes from a
    Pareto (Lomax) distribution of tail index 1.5 (finite mean, infinite variance), scaled so
    their mean is about the tensor's mean magnitude; mixed-sign tensors get random signs; values
    in [0, 1] follow a power law inside their range instead. In float16 magnitudes stop at the
    square root of its largest value (a square stays finite)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown input distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
    changed = 0
    gens: dict[str, torch.Generator] = {}
    for t in _floating(inputs):
        lo, hi, mean_abs, integral, finite = _summary(t)
        if not finite or not lo < hi or integral:
            continue
        key = str(t.device)
        if key not in gens:
            gens[key] = _generator(t.device, seed)
        g = gens[key]
        stochastic = _rows_sum_to_one(t, lo)
        with torch.no_grad():
            if distribution == "uniform":
                t.uniform_(lo, hi, generator=g)
            elif lo >= 0 and hi <= 1:
                _power_law_(t, lo, hi, g)
            else:
                _pareto_(t, lo, hi, mean_abs, g)
            if stochastic:
                for rows in _row_blocks(t):
                    rows.div_(rows.sum(dim=-1, keepdim=True, dtype=torch.float64).clamp_(min=1e-30).to(t.dtype))
        changed += 1
    return changed


def _row_blocks(t: torch.Tensor):
    """Views of a few rows (along the last dimension) of a contiguous ``t`` at a time: a sum in
    float64 over the whole tensor would make a float64 copy of it."""
    rows = t.view(-1, t.shape[-1])
    step = max(1, _piece() // max(1, t.shape[-1]))
    for i in range(0, rows.shape[0], step):
        yield rows[i:i + step]


def _rows_sum_to_one(t: torch.Tensor, lo: float) -> bool:
    """Nonnegative, with every row along the last dimension summing to 1 (probabilities)."""
    if lo < 0 or t.dim() == 0 or t.shape[-1] < 2 or not t.is_contiguous():
        return False
    return all(bool(((rows.detach().sum(dim=-1, dtype=torch.float64) - 1).abs() <= 1e-3).all())
               for rows in _row_blocks(t))


def _pieces(t: torch.Tensor):
    """1-D views of ``t``'s elements a piece at a time when it is contiguous, else the whole
    tensor once (written back by the caller's in-place operations all the same)."""
    if t.is_contiguous():
        flat, piece = t.view(-1), _piece()
        for i in range(0, flat.numel(), piece):
            yield flat[i:i + piece]
    else:
        yield t


def _power_law_(t: torch.Tensor, lo: float, hi: float, g: torch.Generator) -> None:
    """Values in [lo, hi] with density proportional to y^(-7/8) from lo: most near lo, a long thin
    tail up to hi."""
    t.uniform_(0, 1, generator=g)
    for c in _pieces(t):
        c.copy_(c.float().pow_(8).mul_(hi - lo).add_(lo).clamp_(lo, hi))


def _pareto_(t: torch.Tensor, lo: float, hi: float, mean_abs: float, g: torch.Generator) -> None:
    scale = max(mean_abs, 1e-30) * (PARETO_ALPHA - 1)  # a Lomax's mean is scale / (alpha - 1)
    cap = float("inf") if torch.finfo(t.dtype).max > 1e30 else torch.finfo(t.dtype).max ** 0.5 / 2
    mixed = lo < 0 < hi
    t.uniform_(-1 if mixed else 0, 1, generator=g)  # the sign, then |u| for the magnitude
    for c in _pieces(t):
        u = c.float()
        mag = u.abs().clamp_(min=SMALLEST_DRAW).pow_(-1 / PARETO_ALPHA).sub_(1).mul_(scale).clamp_(max=cap)
        if mixed:
            out = torch.where(u < 0, -mag, mag)
        elif lo >= 0:
            out = mag.add_(lo)  # at least the tensor's own minimum: positive stays positive
        else:
            out = mag.neg_().add_(hi)
        c.copy_(out)


def keep_half_(inputs: Any, seed: int, stride: str) -> int:
    """Make every floating-point tensor of ``inputs`` hold only half its values, in place: its
    elements are taken in pairs and both elements of a pair get the value of one of them, picked
    at random. A reduction of the result is that reduction over a random half of the original
    elements (a mean stays a mean, of half the values), so the reference's output on it is what
    a kernel reading half its inputs returns.

    ``stride`` "adjacent" pairs neighbouring elements (half of every row survives); "halves"
    pairs element i with element i + n/2 (half of every column survives). Tensors of one
    size get the same picks, so elements that belong together (a prediction and its target) stay
    together. Returns how many tensors changed."""
    changed = 0
    for t in _floating(inputs):
        n = t.numel()
        s = 1 if stride == "adjacent" else n // 2
        k = n // (2 * s)
        if k == 0:
            continue
        work = t if t.is_contiguous() else t.contiguous()
        pairs = work.view(-1)[:2 * s * k].view(k, 2, s)
        g = _generator(t.device, seed)
        rows = max(1, _piece() // s)
        cols = min(s, _piece())
        with torch.no_grad():
            for r0 in range(0, k, rows):
                for c0 in range(0, s, cols):
                    a = pairs[r0:r0 + rows, 0, c0:c0 + cols]
                    b = pairs[r0:r0 + rows, 1, c0:c0 + cols]
                    pick = torch.rand(a.shape, generator=g, device=t.device) < 0.5
                    kept = torch.where(pick, b, a)
                    a.copy_(kept)
                    b.copy_(kept)
            if work is not t:
                t.copy_(work)
        changed += 1
    return changed

"""Timing statistics: every timing is many samples, and every speedup carries its interval."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def summarize(samples_ms: Sequence[float]) -> dict:
    """median, mean, min, max, std, IQR and CV (std/mean) of a list of samples in milliseconds."""
    x = np.asarray(samples_ms, dtype=float)
    if x.size == 0:
        raise ValueError("no timing samples")
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    p25, median, p75 = (float(v) for v in np.percentile(x, [25, 50, 75]))
    return {
        "unit": "ms",
        "n": int(x.size),
        "median": median,
        "mean": mean,
        "min": float(x.min()),
        "max": float(x.max()),
        "std": std,
        "p25": p25,
        "p75": p75,
        "iqr": p75 - p25,
        "cv": std / mean if mean > 0 else 0.0,
    }


def bootstrap_speedup(baseline_ms: Sequence[float], candidate_ms: Sequence[float], *,
                      confidence: float = 0.95, n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Speedup = median(baseline) / median(candidate), with a percentile-bootstrap interval.

    The two sample sets are resampled independently (they come from separate runs).
    """
    b = np.asarray(baseline_ms, dtype=float)
    c = np.asarray(candidate_ms, dtype=float)
    if b.size < 2 or c.size < 2:
        raise ValueError("a speedup interval needs at least 2 samples on each side")
    rng = np.random.default_rng(seed)
    b_med = np.median(b[rng.integers(0, b.size, size=(n_boot, b.size))], axis=1)
    c_med = np.median(c[rng.integers(0, c.size, size=(n_boot, c.size))], axis=1)
    ratios = b_med / c_med
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return float(np.median(b) / np.median(c)), float(lo), float(hi)


def _resampled_medians(rounds: list[np.ndarray], picks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The median of each bootstrap draw: draw ``i`` takes the rounds ``picks[i]`` and, within each,
    as many samples as the round has, with replacement. Vectorised over the draws (in blocks that
    bound the memory); rounds of unequal sizes are padded with NaN, which the median skips."""
    sizes = np.array([r.size for r in rounds])
    table = np.full((len(rounds), int(sizes.max())), np.nan)
    for i, samples in enumerate(rounds):
        table[i, :samples.size] = samples
    n_boot, r = picks.shape
    width = int(sizes.max())
    equal = bool((sizes == width).all())
    block = max(1, 4_000_000 // max(1, r * width))
    out = np.empty(n_boot)
    for start in range(0, n_boot, block):
        pick = picks[start:start + block]                                   # (n, r)
        within = (rng.random((pick.shape[0], r, width)) * sizes[pick][..., None]).astype(np.intp)
        drawn = table[pick[..., None], within]                              # (n, r, width)
        if equal:
            out[start:start + block] = np.median(drawn.reshape(pick.shape[0], -1), axis=1)
        else:
            drawn[np.arange(width) >= sizes[pick][..., None]] = np.nan      # past a short round's end
            out[start:start + block] = np.nanmedian(drawn.reshape(pick.shape[0], -1), axis=1)
    return out


def verdict(ci_low: float, ci_high: float, margin: float = 0.0) -> str:
    """'faster' only when the whole interval lies above 1 + margin, 'slower' only when it lies
    below 1 / (1 + margin); anything else, inside the margin or not established, is a tie."""
    if ci_low > 1.0 + margin:
        return "faster"
    if ci_high < 1.0 / (1.0 + margin):
        return "slower"
    return "tie"


DEFAULT_TIE_MARGIN = 0.02


def bootstrap_speedup_rounds(baseline_rounds: Sequence[Sequence[float]], candidate_rounds: Sequence[Sequence[float]], *,
                             confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Speedup = median(baseline) / median(candidate) over samples taken in interleaved rounds.

    The interval comes from a two-level bootstrap that keeps the rounds paired: draw rounds with
    replacement (the same rounds for both kernels, so a slow spell of the machine hits both),
    then samples within each drawn round. Drift between rounds widens the interval instead of
    deciding the verdict.
    """
    pairs = [(np.asarray(b, float), np.asarray(c, float)) for b, c in zip(baseline_rounds, candidate_rounds)
             if len(b) and len(c)]
    if not pairs:
        raise ValueError("no round has samples of both kernels")
    b_all = np.concatenate([b for b, _ in pairs])
    c_all = np.concatenate([c for _, c in pairs])
    if b_all.size < 2 or c_all.size < 2:
        raise ValueError("a speedup interval needs at least 2 samples on each side")
    if len(pairs) < 2:
        return bootstrap_speedup(b_all, c_all, confidence=confidence, n_boot=n_boot, seed=seed)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(pairs), size=(n_boot, len(pairs)))
    ratios = _resampled_medians([b for b, _ in pairs], picks, rng) / _resampled_medians([c for _, c in pairs], picks, rng)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return float(np.median(b_all) / np.median(c_all)), float(lo), float(hi)

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


def verdict(ci_low: float, ci_high: float) -> str:
    """'faster' / 'slower' only when the whole interval is on one side of 1.0; otherwise a tie."""
    if ci_low > 1.0:
        return "faster"
    if ci_high < 1.0:
        return "slower"
    return "tie"

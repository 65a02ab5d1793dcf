import numpy as np
import pytest

from engine.kernels.stats import bootstrap_speedup, summarize, verdict


def test_summarize_known_values():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["n"] == 5 and s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0
    assert s["mean"] == pytest.approx(22.0)
    assert s["iqr"] == pytest.approx(2.0)
    assert s["std"] == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))
    assert s["cv"] == pytest.approx(s["std"] / 22.0)
    with pytest.raises(ValueError):
        summarize([])


def test_bootstrap_interval_covers_true_ratio_and_verdicts():
    rng = np.random.default_rng(1)
    base = rng.normal(10.0, 0.2, 200)
    fast = rng.normal(8.0, 0.2, 200)
    sp, lo, hi = bootstrap_speedup(base, fast)
    assert lo < 1.25 < hi and lo <= sp <= hi
    assert verdict(lo, hi) == "faster"
    sp, lo, hi = bootstrap_speedup(base, rng.normal(10.0, 0.2, 200))
    assert lo < 1.0 < hi and verdict(lo, hi) == "tie"
    sp, lo, hi = bootstrap_speedup(fast, base)
    assert verdict(lo, hi) == "slower"


def test_bootstrap_needs_samples_and_is_seeded():
    with pytest.raises(ValueError):
        bootstrap_speedup([1.0], [1.0, 2.0])
    a, b = [1.0, 1.1, 0.9, 1.05], [0.5, 0.55, 0.6, 0.52]
    assert bootstrap_speedup(a, b, seed=3) == bootstrap_speedup(a, b, seed=3)

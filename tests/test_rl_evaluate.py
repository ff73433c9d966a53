"""The intervals that tell a held-out change from noise (a run's held-out figures: test_rl_grpo_run.py)."""

from __future__ import annotations

import math
import random

import pytest

from srt_agent.rl.evaluate import bootstrap_interval, wilson_interval


@pytest.mark.parametrize("k,n", [(0, 12), (5, 12), (12, 12), (1, 3), (37, 100)])
def test_wilson_interval_is_the_set_of_shares_the_score_test_keeps(k, n):
    """Brute force: p is inside iff |k/n - p| <= 1.96 * sqrt(p (1 - p) / n)."""
    inside = [
        i / 20000 for i in range(20001) if abs(k / n - i / 20000) <= 1.96 * math.sqrt(i / 20000 * (1 - i / 20000) / n)
    ]
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(min(inside), abs=1e-4) and high == pytest.approx(max(inside), abs=1e-4)


def test_bootstrap_interval_covers_the_mean_and_narrows_with_more_data():
    rng = random.Random(0)
    small = [rng.choice([-1.0, 1.0]) for _ in range(12)]
    large = [rng.choice([-1.0, 1.0]) for _ in range(400)]
    for values in (small, large):
        low, high = bootstrap_interval(values)
        assert low <= sum(values) / len(values) <= high
    assert (bootstrap_interval(large)[1] - bootstrap_interval(large)[0]) < (
        bootstrap_interval(small)[1] - bootstrap_interval(small)[0]
    ) / 3
    assert bootstrap_interval(small) == bootstrap_interval(small)  # seeded
    assert bootstrap_interval([0.5] * 5) == [0.5, 0.5]

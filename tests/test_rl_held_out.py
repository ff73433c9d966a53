"""Held-out evaluation before and after RL, with intervals that tell a change from noise."""

from __future__ import annotations

import json
import math
import random

import pytest
from test_rl_resume import env_file, tiny

from srt_agent.rl.evaluate import bootstrap_interval, wilson_interval
from srt_agent.rl.trainer import Trainer


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


def test_a_run_reports_held_out_figures_before_and_after_rl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = env_file(tmp_path, "grpo")
    text = config.read_text().replace("eval_tasks: 0", "eval_tasks: 4")
    config.write_text(text.replace('"steps": 3', '"steps": 1'))
    out = tmp_path / "run"
    report = Trainer.from_env_file(config, out, loaded=tiny()).run()
    held = report["held_out"]
    assert list(held) == ["before RL", "after RL"]
    for r in held.values():
        assert r["trajectories"] == 4
        for key in ("accuracy", "tool_call_rate", "code_ok_rate"):
            low, high = r["intervals"][key]
            assert low <= r[key] <= high and (low, high) == tuple(wilson_interval(round(r[key] * 4), 4))
        assert r["intervals"]["mean_reward"][0] <= r["mean_reward"] <= r["intervals"]["mean_reward"][1]
    assert json.loads((out / "report.json").read_text())["held_out"] == held
    summary = (out / "summary.md").read_text()
    assert "| before RL | 4 |" in summary and "| after RL | 4 |" in summary
    events = EventAccumulator(str(next((out / "tensorboard").rglob("events.out.tfevents.*")).parent))
    events.Reload()
    assert [e.step for e in events.Scalars("val/accuracy")] == [0, 1]

"""The shipped many-prompt trace (``retool_long``) is what the drafting claims are replayed on: a real RL run's
every step, found by name, with at least 64 prompts each coming back at least three times in GRPO groups of 8."""

from __future__ import annotations

from collections import Counter

import pytest

from srt_agent.bench.shipped_traces import SHIPPED_TRACES, recorded
from srt_agent.rl.rollout_trace import RolloutTrace


def test_the_retool_long_trace_ships_and_holds_many_prompts_revisited():
    path = recorded("retool_long")
    assert path == SHIPPED_TRACES["retool_long"] and path.stat().st_size < 8 << 20
    trace = RolloutTrace.load(path)
    visits: Counter[str] = Counter()
    for step in trace.steps:
        groups = Counter(t.prompt_key for t in step.trajectories)
        assert set(groups.values()) == {8}  # GRPO groups of 8
        visits.update(groups.keys())
    assert len(visits) >= 64 and min(visits.values()) >= 4
    assert all(t.turns for step in trace.steps for t in step.trajectories)


def test_an_unknown_name_is_a_path_and_a_missing_shipped_file_says_so(tmp_path, monkeypatch):
    from pathlib import Path

    assert recorded("no-such-trace") == Path("no-such-trace")
    monkeypatch.setitem(SHIPPED_TRACES, "gone", tmp_path / "gone.json.xz")
    with pytest.raises(ValueError, match="shipped trace 'gone' is missing"):
        recorded("gone")

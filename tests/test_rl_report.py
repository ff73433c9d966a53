"""The closing story's verdict on the held-out change against its intervals (a run's own story:
test_rl_grpo_run.py)."""

from __future__ import annotations

from srt_agent.rl.report import story_lines


def _evaluation(accuracy: float, low: float, high: float) -> dict:
    return {"accuracy": accuracy, "tool_call_rate": 0.5, "intervals": {"accuracy": [low, high]}}


def test_the_story_says_whether_accuracy_moved_beyond_its_intervals():
    def verdict(before: dict, after: dict) -> str:
        (line,) = story_lines({"held_out": {"before RL": before, "after RL": after}})
        return line.rpartition("; accuracy ")[2]

    assert verdict(_evaluation(0.2, 0.1, 0.35), _evaluation(0.6, 0.45, 0.75)) == "rose beyond the intervals"
    assert verdict(_evaluation(0.6, 0.45, 0.75), _evaluation(0.2, 0.1, 0.35)) == "fell beyond the intervals"
    assert verdict(_evaluation(0.2, 0.1, 0.5), _evaluation(0.4, 0.3, 0.6)) == "within noise (the intervals overlap)"
    no_intervals = {"accuracy": 0.1, "tool_call_rate": 0.5}
    (line,) = story_lines({"held_out": {"before RL": no_intervals, "after RL": {**no_intervals, "accuracy": 0.9}}})
    assert "beyond" not in line and "noise" not in line

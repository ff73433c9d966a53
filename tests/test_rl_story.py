"""What a run tells its user: which steps revisit their prompts, and the closing story (held-out change
against its intervals, the drafter's speed against the compared ones over first visits and revisits)."""

from __future__ import annotations

import io

from rich.console import Console
from test_rl_resume import env_file, tiny

from srt_agent.rl.report import story_lines
from srt_agent.rl.trainer import Trainer


def test_steps_are_labelled_first_visits_or_revisits_and_the_story_is_told(tmp_path):
    config = env_file(tmp_path, "grpo")  # 4 prompts, 2 a step: steps 1-2 are the first epoch, step 3 comes back
    buffer = io.StringIO()
    console = Console(file=buffer, width=400, color_system=None)
    report = Trainer.from_env_file(config, tmp_path / "run", loaded=tiny(), compare=["none"], console=console).run()
    steps = report["steps"]
    assert [m["training/revisit"] for m in steps] == [0.0, 0.0, 1.0]
    totals = report["totals"]
    for label, chosen in (("first", steps[:2]), ("revisit", steps[2:])):
        expected = sum(m["compare/none/gen_s"] for m in chosen) / sum(m["timing_s/gen"] for m in chosen)
        assert abs(totals[f"speedup_vs_none_{label}"] - expected) < 1e-9
    low, high = totals["speedup_vs_none_interval"]  # resampled steps: the step ratios bound it
    ratios = [m["compare/none/gen_s"] / m["timing_s/gen"] for m in steps]
    assert min(ratios) - 1e-9 <= low <= totals["speedup_vs_none"] <= high <= max(ratios) + 1e-9
    assert totals["speedup_vs_none_revisit_interval"] == [totals["speedup_vs_none_revisit"]] * 2  # one step
    for m in steps:  # our engine samples the same tokens with and without drafts: both ratios agree
        assert abs(m["compare/none/token_speedup"] - m["compare/none/speedup"]) < 1e-9
    output = buffer.getvalue()
    assert f"srt vs none (their generation time / ours): all {totals['speedup_vs_none']:.2f}x [{low:.2f}, " in output
    assert "per step: 1 new " in output and ", 3 seen " in output
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "| step | prompts |" in summary and "| 3 | seen |" in summary and "| 1 | new |" in summary


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

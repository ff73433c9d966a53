"""`srt-agent demo` (the Quickstart's main job) end to end on a tiny random model."""

from __future__ import annotations

from typer.testing import CliRunner

from srt_agent.cli import app


def test_demo_runs_epochs_and_checks_losslessness():
    args = ["demo", "--model", "tiny-llama", "--prompts", "2", "--n", "2", "--epochs", "2", "--max-tokens", "12", "--check"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "4 rollouts per epoch, drafter 'srt'" in result.output
    table_rows = [line.split() for line in result.output.splitlines() if line.strip()[:1] in ("1", "2")]
    assert [row[0] for row in table_rows[:2]] == ["1", "2"] and all(row[-1] == "yes" for row in table_rows[:2])
    assert "rollout cache:" in result.output


def test_demo_rejects_an_unknown_drafter():
    result = CliRunner().invoke(app, ["demo", "--model", "tiny-llama", "--drafter", "eagle"])
    assert result.exit_code == 2 and "unknown drafter 'eagle'" in result.output

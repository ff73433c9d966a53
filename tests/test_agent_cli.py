"""`srt-agent rollout`: a tiny model end to end (JSONL + summary), and clear failures for bad env files."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from srt_agent.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def tiny_env(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        f"name: tiny\nmodel: tiny-llama\ntools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
        "dataset: {n: 8, seed: 1}\nn_samples: 3\nmax_turns: 2\nmax_tokens_per_turn: 12\nmax_response_tokens: 48\n"
        "engine: {max_batch: 8, max_context: 512}\n"
    )
    return path


def test_rollout_writes_jsonl_and_prints_a_summary(tmp_path):
    out = tmp_path / "out" / "rollouts.jsonl"
    summary = tmp_path / "summary.json"
    args = ["rollout", str(tiny_env(tmp_path)), "--limit", "2", "--n", "2", "--out", str(out), "--json", str(summary)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4
    assert sorted((r["task_index"], r["sample_index"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for row in rows:
        assert row["prompt"][0]["role"] == "system" and row["messages"][: len(row["prompt"])] == row["prompt"]
        assert len(row["response_ids"]) == len(row["response_mask"]) == len(row["response_logprobs"]) > 0
        assert 0 < row["model_tokens"] <= 48 and row["num_turns"] >= 1
        assert row["finish_reason"] in ("done", "max_turns", "length") and row["error"] is None
        assert {"reward", "tool_time_s", "tool_calls", "forwards", "draft_proposed", "draft_accepted"} <= row.keys()
        assert row["forwards"] >= 1 and row["data_source"] == "srt_agent/arithmetic"
    figures = json.loads(summary.read_text())
    assert figures["trajectories"] == 4 and figures["model_tokens"] == sum(r["model_tokens"] for r in rows)
    assert figures["mean_reward"] == sum(r["reward"] for r in rows) / 4
    for label in ("mean reward", "mean turns", "tokens per forward", "tiny: 2 tasks x 2 samples"):
        assert label in result.output


def test_bad_env_files_fail_clearly(tmp_path):
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("max_turn: 3\n")
    result = runner.invoke(app, ["rollout", str(bad_key)])
    assert result.exit_code == 2 and "max_turn" in result.output and "bad.yaml" in result.output
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("name: x\n  max_turns: [\n")
    result = runner.invoke(app, ["rollout", str(malformed)])
    assert result.exit_code == 2 and "malformed.yaml:2" in result.output
    result = runner.invoke(app, ["rollout", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "no such file" in result.output
    no_tools = tmp_path / "no_tools.yaml"
    no_tools.write_text("model: tiny-llama\ntools: nowhere/tools.yaml\n")
    result = runner.invoke(app, ["rollout", str(no_tools)])
    assert result.exit_code == 2 and "tools.yaml: no such file" in result.output


def test_bad_drafter_or_model_fails_clearly(tmp_path):
    env = tiny_env(tmp_path)
    bad_drafter = tmp_path / "bad_drafter.yaml"
    bad_drafter.write_text(env.read_text().replace("engine: {", "engine: {drafter: sufix, "))
    result = runner.invoke(app, ["rollout", str(bad_drafter)])
    assert result.exit_code == 2 and "engine.drafter" in result.output and "sufix" in result.output
    result = runner.invoke(app, ["rollout", str(env), "--drafter", "eagle"])
    assert result.exit_code == 2 and "--drafter: drafter" in result.output and "eagle" in result.output
    result = runner.invoke(app, ["rollout", str(env), "--model", str(ROOT / "pyproject.toml")])
    assert result.exit_code == 2 and "error:" in result.output and "pyproject.toml" in result.output
    assert not isinstance(result.exception, ValueError)

"""`srt-agent eval` on tiny random models: the report with 95% intervals, a checkpoint's policy, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.rl_envs import tiny_env_file
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.config import load_env_config
from srt_agent.models import load_tokenizer, tiny_random_model
from srt_agent.rl.checkpoint import load_checkpoint
from srt_agent.rl.evaluate import HELD_OUT_FIGURES
from srt_agent.rl.policy_eval import run_eval
from srt_agent.rl.rollouts import PolicyRollouts
from srt_agent.rl.trainer import Trainer
from srt_agent.tools.local import bwrap_path

load_tokenizer("smollm2")  # converts the GGUF into the user cache once
runner = CliRunner()
pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
EVAL = ["--model", "tiny-llama", "--backend", "engine", "--n", "3", "--samples", "2"]


def test_eval_writes_report_and_summary_with_intervals(tmp_path):
    out = tmp_path / "eval"
    result = runner.invoke(app, ["eval", str(tiny_env_file(tmp_path)), "--out", str(out), *EVAL])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["tasks"] == {"set": "held-out", "count": 3, "samples_per_task": 2, "seed": 2000}
    assert report["checkpoint"] is None and report["backend"] == "engine"
    figures = report["report"]
    assert figures["trajectories"] == 6
    for name in HELD_OUT_FIGURES:
        low, high = figures["intervals"][name]
        assert low <= figures[name] <= high, name
    assert figures["tool_call_rate"] == 1.0  # ParityToolEnv forces a code call that runs in the sandbox
    assert len((out / "rollouts.jsonl").read_text().splitlines()) == 6
    summary = (out / "summary.md").read_text()
    assert "95% intervals" in summary and "| all | 6 |" in summary and "[" in summary
    assert "accuracy" in result.output and "95% intervals" in result.output


def test_eval_tasks_from_the_dataset(tmp_path):
    out = tmp_path / "eval"
    args = ["eval", str(tiny_env_file(tmp_path)), "--out", str(out), "--tasks", "dataset", *EVAL]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    config = load_env_config(tiny_env_file(tmp_path))
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r["ground_truth"] for r in rows} == {t.ground_truth for t in config.dataset.tasks(limit=3)}


def test_eval_of_a_checkpoint_loads_the_trained_policy(tmp_path, monkeypatch):
    """One GRPO step on a tiny model, then an evaluation of its checkpoint: the engine gets the saved policy."""
    path = tiny_env_file(tmp_path, steps=1, prompts_per_step=2, lr=1e-2, micro_batch_tokens=256)
    config = load_env_config(path)
    run = tmp_path / "run"
    Trainer(
        config.for_run(compare=[]), run, loaded=tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    ).run()
    saved = load_checkpoint(run)[0]["policy"]

    sent: list[dict] = []
    update = PolicyRollouts.update_weights
    monkeypatch.setattr(PolicyRollouts, "update_weights", lambda self, w: sent.append(w) or update(self, w))
    base = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    report = run_eval(config, tmp_path / "eval", checkpoint=run, n=2, loaded=base)
    assert report["checkpoint"].endswith("checkpoints/step-000001")
    assert len(sent) == 1
    trained = {k.removeprefix("model."): v.double() for k, v in saved.items() if k.startswith("model.")}
    assert set(sent[0]) == set(trained)
    assert all(torch.allclose(v.double(), trained[k], atol=1e-6) for k, v in sent[0].items())
    moved = max((trained[k] - before[k].double()).abs().max().item() for k in trained)
    assert moved > 1e-4, "the training step left the weights where they were: the test would prove nothing"
    assert json.loads((tmp_path / "eval" / "report.json").read_text())["report"]["trajectories"] == 2


def test_missing_env_file_and_bad_checkpoint_are_one_line_errors(tmp_path):
    result = runner.invoke(app, ["eval", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.output and "Traceback" not in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    env = str(tiny_env_file(tmp_path))
    result = runner.invoke(app, ["eval", env, "--checkpoint", str(empty), *EVAL])
    assert result.exit_code == 2 and "no checkpoint in" in result.output
    result = runner.invoke(app, ["eval", env, "--checkpoint", str(tmp_path / "missing"), *EVAL])
    assert result.exit_code == 2 and "does not exist" in result.output
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "state.pt").write_text("not a checkpoint")
    result = runner.invoke(app, ["eval", env, "--checkpoint", str(broken), "--out", str(tmp_path / "e"), *EVAL])
    assert result.exit_code == 2 and "unreadable" in result.output, result.output
    result = runner.invoke(app, ["eval", env, "--tasks", "test", *EVAL])
    assert result.exit_code == 2 and "choose held-out or dataset" in result.output

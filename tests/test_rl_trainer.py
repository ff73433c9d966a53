"""The trainer end to end on tiny random models: GRPO, DAPO and PPO steps, compare, bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from helpers.rl_envs import one_success_per_group, rollouts, tiny_env_file

import srt_agent.rl.trainer as trainer_module
from srt_agent.agent.toolconfig import load_tools
from srt_agent.config import ConfigError, LoraConfig, load_env_config
from srt_agent.models import load_tokenizer, tiny_random_model
from srt_agent.rl.checkpoint import find_checkpoint, load_checkpoint
from srt_agent.rl.coldstart import build_samples
from srt_agent.rl.data import PromptSampler
from srt_agent.rl.policy import PEFT_MISSING, Policy
from srt_agent.rl.trainer import Trainer
from srt_agent.tools import SandboxUnavailable

ROOT = Path(__file__).resolve().parents[1]


def env_file(tmp_path: Path, **train) -> Path:
    return tiny_env_file(
        tmp_path, **{"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "micro_batch_tokens": 256, **train}
    )


@pytest.fixture
def tiny():
    """A fresh float64 random Llama with SmolLM2's tokenizer (training changes its weights)."""
    return tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))


def test_dapo_filters_groups_without_signal_and_refills(tmp_path, tiny, monkeypatch):
    """The first prompt of the step always scores 0: its group is dropped and a second round refills the
    batch with the next prompt; only groups with unequal rewards are trained on."""
    config = env_file(tmp_path, algorithm="dapo", steps=1, overlong_buffer=0)  # rewards are the scores
    first = PromptSampler(load_env_config(config).dataset.tasks(), seed=0).next_batch(1)[0]
    one_success_per_group(monkeypatch, never={first.prompt[-1]["content"]})
    trained = []
    samples = trainer_module.step_samples

    def spy(runs, config):
        kept, filtered = samples(runs, config)
        trained.extend(kept)
        return kept, filtered

    monkeypatch.setattr(trainer_module, "step_samples", spy)
    out = tmp_path / "run"
    report = Trainer.from_env_file(config, out, loaded=tiny).run()
    m = report["steps"][0]
    assert report["config"]["train"]["clip_ratio_high"] == 0.28
    assert m["training/sampling_rounds"] == 2 and m["training/filtered_groups"] == 1
    rows = rollouts(out, 1)
    assert len(rows) == 9  # 2 prompts x 3 samples, then 1 refill prompt x 3
    groups: dict = {}
    for k, row in enumerate(rows):
        groups.setdefault((int(k >= 6), row["task_index"]), []).append(row["reward"])
    dropped = {g for g, rewards in groups.items() if len(set(rewards)) == 1}
    assert [groups[g] for g in dropped] == [[0.0, 0.0, 0.0]]
    kept: dict = {}
    for s in trained:
        kept.setdefault(s.group, []).append(s.reward)
    assert kept.keys() == groups.keys() - dropped and len(kept) == 2
    assert any(g[0] == 1 for g in kept)  # the refill round's group is trained on
    assert all(sorted(rewards) == [0.0, 0.0, 1.0] for rewards in kept.values())
    assert m["perf/trained_tokens"] == sum(s.trained_tokens for s in trained)


def test_dapo_step_where_every_group_is_filtered_is_skipped(tmp_path, tiny, monkeypatch):
    from helpers.rl_envs import ParityToolEnv

    monkeypatch.setattr(ParityToolEnv, "score", lambda self: 0.0)
    report = Trainer.from_env_file(env_file(tmp_path, algorithm="dapo", steps=1), tmp_path / "run", loaded=tiny).run()
    m = report["steps"][0]
    assert m["training/skipped_updates"] == 1.0 and m["training/filtered_groups"] >= 2
    assert m["training/sampling_rounds"] == 3


def test_ppo_trains_a_value_head(tmp_path, tiny, monkeypatch):
    one_success_per_group(monkeypatch)
    out = tmp_path / "run"
    report = Trainer.from_env_file(env_file(tmp_path, algorithm="ppo", steps=1, mini_batches=2), out, loaded=tiny).run()
    m = report["steps"][0]
    rows = rollouts(out, 1)
    tokens = [sum(r["response_mask"]) for r in rows]
    success_share = sum(r["reward"] * n for r, n in zip(rows, tokens)) / sum(tokens)
    # γ = λ = 1: every trained token returns its trajectory's reward; the zero-initialised head values 0.
    assert m["critic/returns/mean"] == pytest.approx(success_share)
    assert (m["critic/returns/min"], m["critic/returns/max"]) == (0.0, 1.0)
    assert m["critic/values/mean"] == 0.0 and m["critic/values/max"] == 0.0 and m["critic/values/min"] == 0.0
    assert m["critic/advantages/mean"] == pytest.approx(0.0, abs=1e-6)  # whitened
    # 0.5 (V - R)^2 with V = 0 on the first mini-batch; the second starts one small AdamW step away.
    assert m["critic/vf_loss"] == pytest.approx(0.5 * success_share, rel=0.05)
    assert m["critic/vf_loss"] != 0.5 * success_share and m["critic/vpred_mean"] != 0.0
    head = load_checkpoint(out)[0]["policy"]
    assert head["value_head.bias"].item() > 0  # pulled up toward the positive returns
    assert head["value_head.weight"].abs().sum() > 0


def test_nan_loss_skips_the_optimizer_step(tmp_path, tiny, monkeypatch):
    from srt_agent.rl import policy as policy_module

    score = policy_module.Policy.score

    def poisoned(self, batch, entropy=False, reference=False):
        scores = score(self, batch, entropy, reference)
        scores.logprobs = scores.logprobs * float("nan")
        return scores

    monkeypatch.setattr(policy_module.Policy, "score", poisoned)
    before = {f"model.{k}": v.float() for k, v in tiny.model.state_dict().items()}
    report = Trainer.from_env_file(env_file(tmp_path, steps=1), tmp_path / "run", loaded=tiny).run()
    assert report["steps"][0]["training/nonfinite_updates"] == 1.0
    after = load_checkpoint(tmp_path / "run")[0]["policy"]
    assert all(torch.equal(before[k], v) for k, v in after.items())


def test_bad_input_is_a_clear_error(tmp_path, tiny):
    with pytest.raises(ConfigError, match="unknown algorithm 'reinforce'"):
        load_env_config(env_file(tmp_path, algorithm="reinforce"))
    with pytest.raises(ConfigError, match="unknown drafter"):
        Trainer(load_env_config(env_file(tmp_path)).for_run(compare=["medusa"]), tmp_path / "run")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(ConfigError, match="not writable"):
        Trainer.from_env_file(env_file(tmp_path), blocked / "run", loaded=tiny).run()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        find_checkpoint(tmp_path)


def test_run_ahead_leaves_every_trajectory_and_training_figure_unchanged(tmp_path):
    """Same seeds with run-ahead on and off: identical rollouts, rewards, losses; run-ahead only fills trees."""
    tokenizer = load_tokenizer("smollm2")
    reports = {}
    for on in (False, True):
        (tmp_path / str(on)).mkdir()
        path = env_file(tmp_path / str(on))
        text = path.read_text().replace(
            "calibrate: false}",
            f"calibrate: false, run_ahead: {{enabled: {str(on).lower()}, slack: 2.0, tokens_per_sequence: 6}}}}",
        )
        path.write_text(text)
        out = tmp_path / f"run-{on}"
        reports[on] = Trainer.from_env_file(
            path, out, loaded=tiny_random_model("llama", seed=0, tokenizer=tokenizer)
        ).run()
        reports[on]["rollouts"] = [rollouts(out, step) for step in (1, 2)]
    off, on = reports[False], reports[True]
    for a, b in zip(off["rollouts"], on["rollouts"]):
        assert [r["response_ids"] for r in a] == [r["response_ids"] for r in b]
        assert [r["reward"] for r in a] == [r["reward"] for r in b]
        for x, y in zip(a, b):
            assert x["response_logprobs"] == pytest.approx(y["response_logprobs"], abs=1e-9)
    for m_off, m_on in zip(off["steps"], on["steps"]):
        for key in ("srt/model_tokens", "critic/score/mean", "perf/trained_tokens", "response_length/mean"):
            assert m_on[key] == m_off[key]
        assert m_on["actor/pg_loss"] == pytest.approx(m_off["actor/pg_loss"], abs=1e-9)
        assert not any(k.startswith("run_ahead/") for k in m_off)
    assert sum(m["run_ahead/tokens"] for m in on["steps"]) > 0
    assert all(0 <= m["run_ahead/row_share"] < 1 for m in on["steps"])


@pytest.mark.skipif(os.geteuid() != 0, reason="machine: only a sandbox started by root runs as another uid")
def test_a_runtime_the_sandbox_cannot_read_stops_the_run_before_training(tmp_path, tiny, monkeypatch, request):
    """The runtime under a `mktemp -d` folder (mode 0700) the per-run uid cannot enter: the Trainer and the
    cold start stop with one line naming the folder to open, before any rollout or training."""
    closed = Path(tempfile.mkdtemp(dir="/tmp"))  # 0700
    request.addfinalizer(lambda: shutil.rmtree(closed, ignore_errors=True))
    runtime = closed / "checkout" / ".sandbox-venv"
    base = "/usr/bin/python3" if Path("/usr/bin/python3").is_file() else sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(runtime)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(runtime.parent)], check=True)
    monkeypatch.setenv("SRT_SANDBOX_RUNTIME", str(runtime))
    trainer = Trainer.from_env_file(env_file(tmp_path), tmp_path / "run", loaded=tiny)
    with pytest.warns(RuntimeWarning), pytest.raises(SandboxUnavailable) as stopped:
        trainer.run()
    message = str(stopped.value)
    assert f"open {closed} to other users (chmod o+rx {closed})" in message and "\n" not in message
    assert "training stops here" in message and not (tmp_path / "run" / "report.json").exists()
    with pytest.warns(RuntimeWarning):
        tools = load_tools(ROOT / "tools" / "code_interpreter.yaml")
    with pytest.raises(SandboxUnavailable, match=f"open {closed}"):
        build_samples(load_env_config(ROOT / "envs" / "retool_train.yaml"), {"tools": tools}, tiny)


def test_lora_without_peft_is_one_line_naming_what_to_install(tmp_path, tiny, monkeypatch):
    """`sys.modules["peft"] = None` is a test double of a machine without peft: importing it fails as a
    missing package does (ModuleNotFoundError named 'peft')."""
    monkeypatch.setitem(sys.modules, "peft", None)
    config = load_env_config(env_file(tmp_path), ["train.lora.rank=4"])
    with pytest.raises(ConfigError) as missing:
        Trainer(config, tmp_path / "run", loaded=tiny)
    assert str(missing.value) == PEFT_MISSING and "pip install 'peft" in PEFT_MISSING and "\n" not in PEFT_MISSING
    with pytest.raises(ConfigError, match="peft, which is not installed"):
        Policy(tiny.model, lora=LoraConfig(rank=4))
    Policy(tiny.model, lora=LoraConfig(rank=0))  # full fine-tuning never needs it

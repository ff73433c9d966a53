"""The trainer end to end on tiny random models: GRPO, DAPO and PPO steps, compare, resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from srt_agent.agent.config import ConfigError, load_env_config
from srt_agent.models import load_tokenizer, tiny_random_model
from srt_agent.rl.checkpoint import find_checkpoint, load_checkpoint
from srt_agent.rl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def env_file(tmp_path: Path, **train) -> Path:
    options = {"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "micro_batch_tokens": 256, **train}
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "name: tiny\nenv: rl_envs.ParityToolEnv\nmodel: tiny-llama\n"
        f"tools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
        "dataset: {n: 4, seed: 1}\nn_samples: 3\nmax_turns: 2\nmax_tokens_per_turn: 6\nmax_response_tokens: 80\n"
        "sampling: {temperature: 1.0, seed: 3}\nengine: {max_batch: 8, max_context: 512, calibrate: false}\n"
        "cold_start: {enabled: false}\n"
        f"train: {json.dumps(options)}\n"
    )
    return path


@pytest.fixture
def tiny():
    """A fresh float64 random Llama with SmolLM2's tokenizer (training changes its weights)."""
    return tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))


def rollouts(out: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (out / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()]


def test_grpo_run_trains_and_compares(tmp_path, tiny):
    out = tmp_path / "run"
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    report = Trainer.from_env_file(env_file(tmp_path, kl_coef=0.01), out, loaded=tiny, compare=["none"]).run()
    steps = report["steps"]
    assert [m["step"] for m in steps] == [1.0, 2.0]
    for m in steps:
        # Exact drafters reproduce the training drafter's tokens (float64 model: no near-tie flips).
        assert m["compare/none/identical"] == 1.0
        assert m["compare/none/gen_s"] > 0 and m["timing_s/gen"] > 0
        assert m["env/tool_call_rate"] == 1.0  # every trajectory ran the forced code call
        assert m["srt/forced_tokens"] > 0
        assert m["srt/prefill_reused"] > 0  # siblings copy their group's prompt KV instead of computing it
        assert m["training/rollout_logprob_diff_mean"] < 1e-4
        assert m["perf/trained_tokens"] == m["srt/model_tokens"]
        assert m["actor/kl_loss"] >= 0.0  # a KL loss to the frozen starting policy
    assert any(m["critic/advantages/max"] > 0 for m in steps)
    # The engine got the new weights in memory: its model differs from the random start.
    assert any(not torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())
    for name in ("report.json", "summary.md", "plots.png"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "report.json").read_text())["totals"]["identical_vs_none"] == 1.0
    assert "the speed of `none`" in (out / "summary.md").read_text()
    rows = rollouts(out, 2)
    assert len(rows) == 6
    for row in rows:
        # Forced tool tokens (the code call and the interpreter's output) are masked out of training.
        assert row["response_mask"][0] == 0 and 1 in row["response_mask"]
        assert all(lp == 0.0 for lp, m in zip(row["response_logprobs"], row["response_mask"]) if m == 0)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    state, caches = load_checkpoint(out)
    assert state["step"] == 2 and "srt" in caches and state["reference"] is not None


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    tokenizer = load_tokenizer("smollm2")
    whole, part = tmp_path / "whole", tmp_path / "part"
    config = env_file(tmp_path, steps=3)
    Trainer.from_env_file(config, whole, loaded=tiny_random_model("llama", seed=0, tokenizer=tokenizer)).run()
    Trainer.from_env_file(config, part, steps=2, loaded=tiny_random_model("llama", seed=0, tokenizer=tokenizer)).run()
    resumed = Trainer.from_env_file(config, part, resume=part, loaded=tiny_random_model("llama", seed=0, tokenizer=tokenizer))
    report = resumed.run()
    assert [m["step"] for m in report["steps"]] == [1.0, 2.0, 3.0]
    assert [r["response_ids"] for r in rollouts(whole, 3)] == [r["response_ids"] for r in rollouts(part, 3)]
    a, b = (json.loads((d / "report.json").read_text())["steps"][2] for d in (whole, part))
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/advantages/max", "critic/score/mean"):
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key
    wa, wb = (load_checkpoint(d)[0]["policy"] for d in (whole, part))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_dapo_filters_groups_without_signal_and_refills(tmp_path, tiny):
    report = Trainer.from_env_file(env_file(tmp_path, algorithm="dapo", steps=1, max_sampling_rounds=2), tmp_path / "run", loaded=tiny).run()
    m = report["steps"][0]
    assert report["config"]["train"]["clip_ratio_high"] == 0.28
    assert 1 <= m["training/sampling_rounds"] <= 2
    kept = m["perf/trained_tokens"] > 0
    assert kept or m["training/skipped_updates"] == 1.0


def test_dapo_step_where_every_group_is_filtered_is_skipped(tmp_path, tiny, monkeypatch):
    from rl_envs import ParityToolEnv

    monkeypatch.setattr(ParityToolEnv, "score", lambda self: 0.0)
    report = Trainer.from_env_file(env_file(tmp_path, algorithm="dapo", steps=1), tmp_path / "run", loaded=tiny).run()
    m = report["steps"][0]
    assert m["training/skipped_updates"] == 1.0 and m["training/filtered_groups"] >= 2
    assert m["training/sampling_rounds"] == 3


def test_ppo_trains_a_value_head(tmp_path, tiny):
    report = Trainer.from_env_file(env_file(tmp_path, algorithm="ppo", steps=1, mini_batches=2), tmp_path / "run", loaded=tiny).run()
    m = report["steps"][0]
    assert {"critic/vf_loss", "critic/returns/mean", "critic/values/mean", "actor/pg_clipfrac"} <= m.keys()
    assert "value_head.weight" in load_checkpoint(tmp_path / "run")[0]["policy"]


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
        Trainer.from_env_file(env_file(tmp_path), tmp_path / "run", compare=["medusa"])
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(ConfigError, match="not writable"):
        Trainer.from_env_file(env_file(tmp_path), blocked / "run", loaded=tiny).run()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        find_checkpoint(tmp_path)


def test_ctrl_c_during_generation_saves_the_last_finished_step(tmp_path, tiny, monkeypatch):
    from srt_agent.rl.rollouts import PolicyRollouts

    run = PolicyRollouts.run
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 2's rollouts
            raise KeyboardInterrupt
        return run(self, *args, **kwargs)

    monkeypatch.setattr(PolicyRollouts, "run", interrupted)
    out = tmp_path / "run"
    report = Trainer.from_env_file(env_file(tmp_path, steps=3, checkpoint_every=5), out, loaded=tiny).run()
    assert report["interrupted"] and [m["step"] for m in report["steps"]] == [1.0]
    state, _ = load_checkpoint(out)
    assert state["step"] == 1 and state["sampler"]["index"] == 2  # step 2's prompts were not consumed


def test_run_ahead_leaves_every_trajectory_and_training_figure_unchanged(tmp_path):
    """Same seeds with run-ahead on and off: identical rollouts, rewards, losses; run-ahead only fills trees."""
    tokenizer = load_tokenizer("smollm2")
    reports = {}
    for on in (False, True):
        (tmp_path / str(on)).mkdir()
        path = env_file(tmp_path / str(on))
        text = path.read_text().replace(
            "calibrate: false}", "calibrate: false, run_ahead: {enabled: %s, slack: 2.0, tokens_per_sequence: 6}}" % str(on).lower()
        )
        path.write_text(text)
        out = tmp_path / f"run-{on}"
        reports[on] = Trainer.from_env_file(path, out, loaded=tiny_random_model("llama", seed=0, tokenizer=tokenizer)).run()
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

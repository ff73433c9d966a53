"""Rollout correction (verl's): truncated or masked importance sampling between the engine's and the trainer's
log-probs, on by default where the engines sample in a narrow dtype or a step's gap exceeds the threshold."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.policy_updates import run, samples

from srt_agent.config import TrainConfig
from srt_agent.models import tiny_random_model
from srt_agent.rl.correction import RolloutCorrection, correction_metrics, correction_weights


def test_truncated_and_masked_weights():
    old = torch.tensor([0.0, -1.0, -0.5, 0.0])
    engine = torch.tensor([0.0, -2.0, -0.4, float("nan")])
    tis = correction_weights(old, engine, "tis", 2.0)
    torch.testing.assert_close(tis, torch.tensor([1.0, 2.0, math.exp(-0.1), 1.0]))  # e > 2: capped; no engine lp: 1
    mis = correction_weights(old, engine, "mis", 2.0)
    torch.testing.assert_close(mis, torch.tensor([1.0, 0.0, math.exp(-0.1), 1.0]))  # above the cap: masked
    assert correction_weights(old, engine, "off", 2.0) is None


def test_metrics_follow_verls_names_and_formulas():
    data = samples()[:2]
    for s in data:
        s.old_logprobs = [lp + 0.1 for lp in s.engine_logprobs]  # the trainer: every token 0.1 more likely
    out = correction_metrics(data, "tis", 2.0)
    assert out["rollout_corr/on"] == 1.0
    assert out["rollout_corr/kl"] == pytest.approx(-0.1)
    assert out["rollout_corr/k3_kl"] == pytest.approx(math.exp(0.1) - 0.1 - 1)
    assert out["rollout_corr/chi2_token"] == pytest.approx(math.exp(0.2) - 1)
    assert out["rollout_corr/rollout_is_mean"] == pytest.approx(math.exp(0.1))
    assert out["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)
    off = correction_metrics(data, "off", 2.0)
    assert off["rollout_corr/on"] == 0.0 and not any(k.startswith("rollout_corr/rollout_is") for k in off)


def test_auto_is_on_from_the_start_for_a_narrow_engine_and_says_why_once():
    corr = RolloutCorrection(TrainConfig(), torch.bfloat16)
    assert corr.mode == "tis"
    line = corr.announcement()
    assert "bfloat16" in line and "tis_cap 2" in line
    assert corr.announcement() is None
    assert RolloutCorrection(TrainConfig(rollout_correction="off"), torch.bfloat16).mode == "off"
    assert RolloutCorrection(TrainConfig(old_logprobs="engine"), torch.bfloat16).mode == "off"  # no ratio to correct


def test_auto_turns_on_after_a_step_whose_gap_exceeds_the_threshold():
    corr = RolloutCorrection(TrainConfig(), torch.float32)
    assert corr.mode == "off" and corr.announcement() is None
    corr.observe({"step": 1.0, "training/rollout_logprob_diff_mean": 6e-6})  # float32's gap: stays off
    assert corr.mode == "off"
    corr.observe({"step": 2.0, "training/rollout_logprob_diff_mean": 0.02})
    assert corr.mode == "tis"
    assert "step 2's mean |Δ log-prob| 2.0e-02 exceeded train.rollout_correction_gap 0.001" in corr.announcement()


def test_the_masked_mode_drops_tokens_above_the_cap():
    start = tiny_random_model("llama", seed=0).model.state_dict()
    masked = run(TrainConfig(rollout_correction="mis", tis_cap=1e-6), samples())  # every ratio e^(old + 1) > 1e-6
    assert all(torch.equal(v, start[k]) for k, v in masked.base.state_dict().items())  # no token left: no step
    kept = run(TrainConfig(rollout_correction="mis", tis_cap=1e9), samples())
    assert any(not torch.equal(v, start[k]) for k, v in kept.base.state_dict().items())

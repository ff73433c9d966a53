"""One policy update: micro-batching does not change it, tool tokens never reach it, options take effect."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.policy_updates import run, samples

from srt_agent.config import TrainConfig
from srt_agent.models import tiny_random_model
from srt_agent.rl.policy import Policy
from srt_agent.rl.update import compute_advantages, update_policy


def weights(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policy.base.state_dict().items()}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_does_not_change_the_update(mode):
    whole = weights(run(TrainConfig(micro_batch_tokens=4096, loss_agg_mode=mode), samples()))
    split = weights(run(TrainConfig(micro_batch_tokens=64, loss_agg_mode=mode), samples()))
    for k in whole:
        torch.testing.assert_close(whole[k], split[k])


def test_the_update_is_the_gradient_of_the_trained_tokens_only():
    """Against a hand-written GRPO loss on a plain forward: -mean(advantage * log p) over mask-1 tokens."""
    data = samples()
    policy = run(TrainConfig(grad_clip=1e9), data)
    model = tiny_random_model("llama", seed=0).model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    total = sum(s.trained_tokens for s in data)
    loss = 0.0
    for s in data:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
        for j, (token, m, adv) in enumerate(zip(s.response_ids, s.response_mask, s.advantages)):
            if m:  # tool tokens (m = 0) are context only
                loss = loss - adv * logp[len(s.prompt_ids) + j - 1, token]
    (loss / total).backward()
    optimizer.step()
    expected = model.state_dict()
    for k, v in weights(policy).items():
        torch.testing.assert_close(v, expected[k])


def test_truncated_importance_sampling_weights_the_loss():
    plain = weights(run(TrainConfig(), samples()))
    capped = weights(run(TrainConfig(rollout_correction="tis", tis_cap=0.5), samples()))  # engine log-probs -1: w < 1
    assert any(not torch.equal(plain[k], capped[k]) for k in plain)


def test_old_logprobs_are_written_back_on_a_single_pass():
    data = samples()
    run(TrainConfig(), data)
    assert all(s.old_logprobs is not None and len(s.old_logprobs) == len(s.response_ids) for s in data)
    assert all(lp == 0.0 for s in data for lp, m in zip(s.old_logprobs, s.response_mask) if not m)


def test_all_zero_advantages_leave_the_policy_unchanged():
    data = samples()
    for s in data:
        s.reward = 1.0
    policy = Policy(tiny_random_model("llama", seed=0).model, dtype=torch.float64)
    before = copy.deepcopy(weights(policy))
    compute_advantages(data, TrainConfig())
    update_policy(policy, torch.optim.SGD(policy.parameters(), lr=0.1), data, TrainConfig())
    assert all(torch.equal(before[k], v) for k, v in weights(policy).items())

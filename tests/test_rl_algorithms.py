"""The RL algorithms against verl's core_algos on the same tensors, and against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srt_agent.rl import algorithms as A

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is in the test extra")


@pytest.fixture
def batch():
    """A padded batch of 6 responses (two GRPO groups of 3) with a tool-output hole in one."""
    g = torch.Generator().manual_seed(0)
    b, n = 6, 9
    mask = torch.ones(b, n)
    mask[0, 6:] = 0  # shorter response (padding)
    mask[2, 3:5] = 0  # tool output inside the response
    mask[5, 2:] = 0
    return dict(
        mask=mask,
        old=torch.randn(b, n, generator=g) * 0.3 - 1.0,
        new=torch.randn(b, n, generator=g) * 0.3 - 1.0,
        adv=torch.randn(b, n, generator=g),
        values=torch.randn(b, n, generator=g),
        returns=torch.randn(b, n, generator=g),
        vpred=torch.randn(b, n, generator=g),
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
        index=np.array(["a", "a", "a", "b", "b", "b"], dtype=object),
    )


class _ActorConfig(dict):
    """The fields of verl's ActorConfig that its vanilla policy loss reads."""

    def __getattr__(self, name):
        return self[name]

    global_batch_info: dict = {}


def test_grpo_matches_verl(batch):
    token_rewards = torch.zeros_like(batch["mask"])
    token_rewards[:, 0] = batch["rewards"]
    for norm in (True, False):
        expected, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, batch["mask"], batch["index"], norm_adv_by_std_in_grpo=norm)
        ours = A.grpo_advantages(batch["rewards"], list(batch["index"]), norm_by_std=norm)
        torch.testing.assert_close(ours.unsqueeze(-1) * batch["mask"], expected)


def test_grpo_by_hand():
    adv = A.grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 5.0]), ["x", "x", "x", "y"])
    std = torch.tensor([1.0, 0.0, 0.0]).std()
    torch.testing.assert_close(adv[:3], (torch.tensor([1.0, 0.0, 0.0]) - 1 / 3) / (std + 1e-6))
    assert adv[3] == pytest.approx(5.0 / (1 + 1e-6))  # a group of one: mean 0, std 1, as verl


def test_gae_matches_verl_and_skips_tool_tokens(batch):
    rewards = torch.zeros_like(batch["mask"])
    rewards[:, 5] = batch["rewards"]
    expected_adv, expected_ret = core_algos.compute_gae_advantage_return(rewards, batch["values"], batch["mask"], 0.99, 0.95)
    adv, ret = A.gae_advantages(rewards, batch["values"], batch["mask"], 0.99, 0.95)
    torch.testing.assert_close(adv, expected_adv)
    torch.testing.assert_close(ret, expected_ret)


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_policy_loss_and_aggregation_match_verl(batch, mode):
    config = _ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    config.get = lambda key, default=None: config[key] if key in config else default
    expected, metrics = core_algos.compute_policy_loss_vanilla(batch["old"], batch["new"], batch["adv"], batch["mask"], mode, config)
    loss, ours = A.policy_loss(batch["old"], batch["new"], batch["adv"], batch["mask"], 0.2, 0.28, 3.0)
    torch.testing.assert_close(A.agg_loss(loss, batch["mask"], mode), expected)
    for name, value in metrics.items():
        assert float(ours[name]) == pytest.approx(value, abs=1e-6), name


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_flat_packed_aggregation_equals_padded(batch, mode):
    """Packed micro-batches (flat tokens with a sequence index) aggregate like verl's padded rows,
    and splitting them with global normalizers sums to the whole."""
    loss, _ = A.policy_loss(batch["old"], batch["new"], batch["adv"], batch["mask"])
    padded = A.agg_loss(loss, batch["mask"], mode)
    keep = batch["mask"].bool()
    flat_loss = loss[keep]
    seq_index = torch.arange(loss.shape[0]).unsqueeze(1).expand_as(loss)[keep]
    ones = torch.ones_like(flat_loss)
    torch.testing.assert_close(A.agg_loss(flat_loss, ones, mode, seq_index=seq_index), padded)
    split = int((seq_index < 3).sum())
    parts = [
        A.agg_loss(flat_loss[sl], ones[sl], mode, seq_index=seq_index[sl], num_tokens=len(flat_loss), num_seqs=6)
        for sl in (slice(0, split), slice(split, None))
    ]
    torch.testing.assert_close(sum(parts), padded)


def test_value_loss_matches_verl(batch):
    expected, clipfrac = core_algos.compute_value_loss(batch["vpred"], batch["returns"], batch["values"], batch["mask"], 0.5)
    loss, clipped = A.value_loss(batch["vpred"], batch["returns"], batch["values"], 0.5)
    torch.testing.assert_close(A.agg_loss(loss, batch["mask"]), expected)
    assert float(A.masked_mean(clipped.float(), batch["mask"])) == pytest.approx(float(clipfrac), abs=1e-6)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "low_var_kl"])
def test_kl_penalty_matches_verl(batch, kind):
    torch.testing.assert_close(A.kl_penalty(batch["new"], batch["old"], kind), core_algos.kl_penalty(batch["new"], batch["old"], kind))


def test_unknown_names_are_clear_errors(batch):
    with pytest.raises(ValueError, match="unknown kl_penalty 'k9'"):
        A.kl_penalty(batch["new"], batch["old"], "k9")
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        A.agg_loss(batch["new"], batch["mask"], "mean-of-means")


def test_dapo_overlong_penalty_by_hand():
    assert A.overlong_penalty(100, max_length=512, buffer=64) == 0.0
    assert A.overlong_penalty(448, max_length=512, buffer=64) == 0.0
    assert A.overlong_penalty(480, max_length=512, buffer=64) == pytest.approx(-0.5)
    assert A.overlong_penalty(512, max_length=512, buffer=64, factor=2.0) == pytest.approx(-2.0)
    assert A.overlong_penalty(600, max_length=512, buffer=0) == 0.0


def test_dynamic_sampling_keeps_groups_with_a_signal():
    rewards = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    groups = ["a", "a", "b", "b", "c", "c", "d", "d"]
    rewards[4] = 1.0
    assert A.informative_groups(rewards, groups) == {"c"}
    assert A.informative_groups([0.5, 0.5], ["x", "x"]) == set()

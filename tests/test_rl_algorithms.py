"""The RL algorithms against verl's core_algos on the same tensors, and against hand-computed values."""

from __future__ import annotations

from pathlib import Path

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
        expected, _ = core_algos.compute_grpo_outcome_advantage(
            token_rewards, batch["mask"], batch["index"], norm_adv_by_std_in_grpo=norm
        )
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
    expected_adv, expected_ret = core_algos.compute_gae_advantage_return(
        rewards, batch["values"], batch["mask"], 0.99, 0.95
    )
    adv, ret = A.gae_advantages(rewards, batch["values"], batch["mask"], 0.99, 0.95)
    torch.testing.assert_close(adv, expected_adv)
    torch.testing.assert_close(ret, expected_ret)


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_policy_loss_and_aggregation_match_verl(batch, mode):
    config = _ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    config.get = lambda key, default=None: config[key] if key in config else default
    expected, metrics = core_algos.compute_policy_loss_vanilla(
        batch["old"], batch["new"], batch["adv"], batch["mask"], mode, config
    )
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
    expected, clipfrac = core_algos.compute_value_loss(
        batch["vpred"], batch["returns"], batch["values"], batch["mask"], 0.5
    )
    loss, clipped = A.value_loss(batch["vpred"], batch["returns"], batch["values"], 0.5)
    torch.testing.assert_close(A.agg_loss(loss, batch["mask"]), expected)
    assert float(A.masked_mean(clipped.float(), batch["mask"])) == pytest.approx(float(clipfrac), abs=1e-6)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "low_var_kl"])
def test_kl_penalty_matches_verl(batch, kind):
    torch.testing.assert_close(
        A.kl_penalty(batch["new"], batch["old"], kind), core_algos.kl_penalty(batch["new"], batch["old"], kind)
    )


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


def test_dynamic_sampling_keeps_groups_with_a_signal_by_hand():
    rewards = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    groups = ["a", "a", "b", "b", "c", "c", "d", "d"]
    rewards[4] = 1.0
    assert A.informative_groups(rewards, groups) == {"c"}
    assert A.informative_groups([0.5, 0.5], ["x", "x"]) == set()


def test_dual_clip_matches_verl_where_it_binds():
    """PPO's dual clip: negative advantages with ratios far above ``1 + clip`` are bounded by ``clip_ratio_c``
    (loss and gradient as verl's), and verl's ``pg_clipfrac_lower`` shows that bound was the active one."""
    log_ratio = torch.tensor([[2.0, 0.5, -0.5, 0.1], [3.0, 2.0, 0.05, 1.5]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0, -1.0, 1.0], [-0.5, 2.0, 0.7, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    old = torch.full_like(log_ratio, -3.0)
    config = _ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    config.get = lambda key, default=None: config[key] if key in config else default
    for mode in ("token-mean", "token-sum", "seq-mean-token-mean"):
        new_verl = (old + log_ratio).requires_grad_()
        expected, metrics = core_algos.compute_policy_loss_vanilla(old, new_verl, adv, mask, mode, config)
        expected.backward()
        new_ours = (old + log_ratio).requires_grad_()
        loss, ours = A.policy_loss(old, new_ours, adv, mask, 0.2, 0.2, 3.0)
        A.agg_loss(loss, mask, mode).backward()
        torch.testing.assert_close(A.agg_loss(loss.detach(), mask, mode), expected.detach())
        torch.testing.assert_close(new_ours.grad, new_verl.grad)
        for name, value in metrics.items():
            assert float(ours[name]) == pytest.approx(value, abs=1e-9), name
    # e^2 and e^3 > 3 with A < 0 (mask 1): the dual bound -A * 3 holds, with no gradient.
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(2 / 7)
    assert loss[0, 0].item() == pytest.approx(3.0) and loss[1, 0].item() == pytest.approx(1.5)
    assert new_ours.grad[0, 0] == 0 and new_ours.grad[1, 0] == 0


def _samples_for_update() -> list:
    """Three GRPO groups of unequal response lengths, with tool-output holes, advantages of both signs."""
    from srt_agent.rl.batch import Sample

    g = torch.Generator().manual_seed(1)
    out = []
    for prompt in range(3):
        for k in range(3):
            n = 3 + 4 * k + prompt
            mask = [1] * n
            mask[1:3] = [0, 0]
            adv = [(k - 1) * (1.0 + prompt) if m else 0.0 for m in mask]
            response = torch.randint(0, 256, (n,), generator=g).tolist()
            out.append(Sample([prompt + 1, 7, 9], response, mask, [0.0] * n, group=prompt, advantages=adv))
    return out


@pytest.mark.parametrize("algorithm", ["dapo", "ppo"])
def test_the_update_is_verl_s_token_mean_loss_over_the_whole_mini_batch(algorithm):
    """Our packed, micro-batched update against verl's vanilla policy loss on padded rows: token-level
    normalisation by the whole mini-batch's tokens (verl's ``batch_num_tokens``), clip-higher and the dual
    clip (engine log-probs far below the policy's put ratios above ``clip_ratio_c``)."""
    from srt_agent.config import TrainConfig
    from srt_agent.models import tiny_random_model
    from srt_agent.rl.batch import pack
    from srt_agent.rl.policy import Policy
    from srt_agent.rl.update import update_policy

    cfg = TrainConfig(algorithm=algorithm, old_logprobs="engine", micro_batch_tokens=64, grad_clip=1e9)
    data = _samples_for_update()
    assert len(pack(data, cfg.micro_batch_tokens)) >= 2  # micro-batches of unequal token counts
    model = tiny_random_model("llama", seed=0).model
    rows = []
    with torch.no_grad():
        for s in data:
            logp = torch.log_softmax(model(torch.tensor([s.prompt_ids + s.response_ids])).logits[0].double(), -1)
            rows.append([float(logp[len(s.prompt_ids) + j - 1, t]) for j, t in enumerate(s.response_ids)])
    shifts = (-2.0, -0.1, 0.5)  # ratios e^2 (clipped high, or dual-clipped for A < 0), e^0.1, e^-0.5
    for s, lp in zip(data, rows):
        s.engine_logprobs = [x + shifts[j % 3] for j, x in enumerate(lp)]

    policy = Policy(model, dtype=torch.float64)
    out = update_policy(policy, torch.optim.SGD(policy.parameters(), lr=0.1), data, cfg)

    width = max(len(s.response_ids) for s in data)
    pad = lambda values: torch.tensor([v + [0.0] * (width - len(v)) for v in values], dtype=torch.float64)  # noqa: E731
    mask = pad([[float(m) for m in s.response_mask] for s in data])
    old, adv = pad([s.engine_logprobs for s in data]), pad([s.advantages for s in data])
    config = _ActorConfig(
        clip_ratio=0.2,
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        clip_ratio_c=cfg.clip_ratio_c,
    )
    config.get = lambda key, default=None: config[key] if key in config else default
    config.global_batch_info = dict(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=len(data))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clipfrac_lower = 0.0
    for rows_ in (slice(0, 4), slice(4, None)):  # verl's own micro-batches: normalised globally, summed
        logp = []
        for s in data[rows_]:
            lsm = torch.log_softmax(model(torch.tensor([s.prompt_ids + s.response_ids])).logits[0].double(), -1)
            picked = [lsm[len(s.prompt_ids) + j - 1, t] for j, t in enumerate(s.response_ids)]
            logp.append(torch.stack(picked + [torch.zeros((), dtype=torch.float64)] * (width - len(picked))))
        loss, metrics = core_algos.compute_policy_loss_vanilla(
            old[rows_], torch.stack(logp), adv[rows_], mask[rows_], "token-mean", config
        )
        loss.backward()
        clipfrac_lower += metrics["actor/pg_clipfrac_lower"] * float(mask[rows_].sum()) / float(mask.sum())
    optimizer.step()
    assert clipfrac_lower > 0.05  # the dual clip binds on some tokens
    assert out["actor/pg_clipfrac_lower"] == pytest.approx(clipfrac_lower, abs=1e-9)
    expected = model.state_dict()
    for k, v in policy.base.state_dict().items():
        torch.testing.assert_close(v, expected[k])


class _OverlongBuffer(dict):
    """verl's ``overlong_buffer_cfg`` (enable, len, penalty_factor, log), read by attribute."""

    __getattr__ = dict.__getitem__


@pytest.mark.parametrize("buffer,factor", [(4, 1.0), (6, 0.5)])
def test_overlong_shaping_matches_verl_s_dapo_reward_manager(buffer, factor):
    """The trainer's DAPO reward (score + soft overlong punishment) against verl's DAPORewardManager on
    responses of every length up to the budget."""
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    from srt_agent.agent.trajectory import Trajectory
    from srt_agent.config import EnvConfig
    from srt_agent.models import load_tokenizer
    from srt_agent.rl.samples import shaped_reward

    budget = 16
    lengths = list(range(1, budget + 1))
    scores = [float(i % 2) for i in range(len(lengths))]
    prompt = torch.full((len(lengths), 3), 5)
    responses = torch.full((len(lengths), budget), 7)
    attention = torch.cat(
        [torch.ones(len(lengths), 3), (torch.arange(budget) < torch.tensor(lengths)[:, None]).float()], dim=1
    )
    data = DataProto.from_dict(
        tensors={"prompts": prompt, "responses": responses, "attention_mask": attention.long()},
        non_tensors={
            "reward_model": np.array([{"ground_truth": ""} for _ in lengths], dtype=object),
            "data_source": np.array(["parity"] * len(lengths), dtype=object),
            "extra_info": np.array([{"score": s} for s in scores], dtype=object),
        },
    )
    manager = DAPORewardManager(
        load_tokenizer("smollm2"),
        num_examine=0,
        compute_score=lambda extra_info, **_: extra_info["score"],
        max_resp_len=budget,
        overlong_buffer_cfg=_OverlongBuffer(enable=True, len=buffer, penalty_factor=factor, log=False),
    )
    expected = manager(data).sum(-1).tolist()

    config = EnvConfig(
        max_response_tokens=budget, train={"algorithm": "dapo", "overlong_buffer": buffer, "overlong_penalty": factor}
    )
    ours = [
        shaped_reward(Trajectory("r", 0, 0, [5, 5, 5], response_ids=[7] * n, reward=s), config)
        for n, s in zip(lengths, scores)
    ]
    assert ours == pytest.approx(expected, abs=1e-6)
    assert min(o - s for o, s in zip(ours, scores)) == pytest.approx(-factor)  # the full punishment is reached
    assert ours[: budget - buffer] == scores[: budget - buffer]  # and nothing before the buffer


@pytest.fixture
def verl_group_filter(monkeypatch):
    """verl's DAPO group filter (its V1 replay buffer's ``_dapo_filtered_keys``, metric "reward").

    The replay buffer stores trajectories in TransferQueue, a distributed store that is not installed
    here: a stand-in module answers the one read the filter makes (each trajectory's reward tensor). The
    buffer's source file is loaded on its own, so no other module ever sees the stand-in.
    """
    import importlib.util
    import sys
    import types

    store: dict[str, torch.Tensor] = {}
    tq = types.ModuleType("transfer_queue")
    tq.KVBatchMeta = type("KVBatchMeta", (), {})
    tq.kv_batch_get = lambda keys, partition_id, select_fields: {"rm_scores": [store[k] for k in keys]}
    path = (
        Path(importlib.util.find_spec("verl").submodule_search_locations[0])
        / "trainer"
        / "ppo"
        / "v1"
        / "replay_buffer.py"
    )
    spec = importlib.util.spec_from_file_location("verl_replay_buffer", path)
    replay_buffer = importlib.util.module_from_spec(spec)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "transfer_queue", tq)
        spec.loader.exec_module(replay_buffer)

    def kept(rewards, groups) -> set:
        buffer = replay_buffer.ReplayBuffer(
            "sync", {}, None, "drop", {}, refill_fn=lambda n: None, filter_groups_metric="reward"
        )
        store.clear()
        for i, (r, g) in enumerate(zip(rewards, groups)):
            key = f"{g}_{i}_0"
            store[key] = torch.tensor([0.0, float(r)])  # verl sums the token-level rewards
            buffer.partitions["train"][key] = {}
        buffer.finished_keys["train"] = set(groups)
        filtered, _ = buffer._dapo_filtered_keys("train")
        return set(groups) - filtered

    return kept


def test_dynamic_sampling_keeps_the_groups_verl_s_dapo_keeps(verl_group_filter):
    """Groups whose rewards (overlong shaping included) are all equal are dropped, the rest kept; a group
    of one is kept (its GRPO advantage is its score, as in verl). Rewards here are exact binary fractions:
    verl tests ``np.std(values) == 0``, which float rounding can miss for equal values like 0.1 × 3."""
    rewards = [1.0, 1.0, 0.0, 0.0, 0.5, 1.0, 0.75, 0.75, 0.75, -0.25, 1.0, 0.0, 0.5, 0.5]
    groups = ["a", "a", "b", "b", "c", "c", "d", "d", "d", "e", "f", "f", "g", "g"]
    expected = verl_group_filter(rewards, groups)
    assert expected == {"c", "e", "f"}
    assert A.informative_groups(rewards, groups) == expected


def test_registries_hold_what_the_config_accepts():
    """The env YAML names an advantage estimator and a policy loss; each name is a registered function."""
    from srt_agent.config import TrainConfig

    for name in A.ADV_ESTIMATOR_REGISTRY:
        assert TrainConfig(adv_estimator=name).adv_estimator == name
    for name in A.POLICY_LOSS_REGISTRY:
        assert TrainConfig(loss_mode=name).loss_mode == name
    assert sorted(A.ADV_ESTIMATOR_REGISTRY) == ["gae", "grpo"] and sorted(A.POLICY_LOSS_REGISTRY) == ["vanilla"]
    assert A.get_adv_estimator_fn("grpo") is A.grpo_estimator and A.get_adv_estimator_fn("gae") is A.gae_estimator
    with pytest.raises(ValueError, match="unknown adv_estimator 'reinforce'; choose one of"):
        A.get_adv_estimator_fn("reinforce")
    with pytest.raises(ValueError, match="unknown loss_mode 'gspo'"):
        A.get_policy_loss_fn("gspo")
    with pytest.raises(ValueError, match="already registered"):
        A.register_policy_loss("vanilla")(lambda *args: None)


def test_the_vanilla_loss_reads_its_clip_ratios_from_the_config(batch):
    from srt_agent.config import TrainConfig

    config = TrainConfig(algorithm="dapo")
    ours = A.get_policy_loss_fn(config.loss_mode)(batch["old"], batch["new"], batch["adv"], batch["mask"], config)
    direct = A.policy_loss(batch["old"], batch["new"], batch["adv"], batch["mask"], 0.2, 0.28, 3.0)
    torch.testing.assert_close(ours[0], direct[0])

"""Algorithms are found in their registries: the config accepts any registered name, the update calls the
registered function and reads its declared needs, and a new estimator trains through the real Trainer
with no other edit."""

from __future__ import annotations

import pytest
import torch
from helpers.rl_envs import tiny_env_file

import srt_agent.rl.update as update_module
from srt_agent.agent.controller import MultiTurnController
from srt_agent.config import ConfigError, TrainConfig, algorithm_registry as R, load_env_config
from srt_agent.models import load_tokenizer, tiny_random_model
from srt_agent.rl import algorithms as A
from srt_agent.rl.batch import Sample
from srt_agent.rl.trainer import Trainer
from srt_agent.rl.update import compute_advantages


def samples(with_values: bool = False) -> list[Sample]:
    """Three groups of three responses of different lengths, tool output inside, one with no trained token."""
    g = torch.Generator().manual_seed(1)
    out = []
    for prompt in range(3):
        for k in range(3):
            n = 5 + 2 * k + prompt
            mask = [1] * n
            mask[1:3] = [0, 0]
            if prompt == 2 and k == 2:
                mask = [0] * n
            values = (torch.randn(n, generator=g) * 0.5).tolist() if with_values else None
            reward = [1.0, 0.0, 0.25][(k + prompt) % 3]
            s = Sample([prompt + 1, 5], [7] * n, mask, [-1.0] * n, reward=reward, group=prompt)
            s.values = values
            out.append(s)
    return out


def old_compute_advantages(samples: list[Sample], train: TrainConfig) -> None:
    """`compute_advantages` as it was before the registry dispatch (an if/else on the name), verbatim."""
    if train.adv_estimator == "grpo":
        scores = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        adv = A.grpo_advantages(scores, [s.group for s in samples], train.norm_adv_by_std)
        for s, a in zip(samples, adv.tolist()):
            s.advantages = [a if m else 0.0 for m in s.response_mask]
        return
    length = max(len(s.response_ids) for s in samples)
    mask = torch.zeros(len(samples), length)
    rewards = torch.zeros(len(samples), length)
    values = torch.zeros(len(samples), length)
    for i, s in enumerate(samples):
        mask[i, : len(s.response_mask)] = torch.tensor(s.response_mask, dtype=torch.float32)
        values[i, : len(s.values)] = torch.tensor(s.values)
        last = max((j for j, m in enumerate(s.response_mask) if m), default=None)
        if last is not None:
            rewards[i, last] = s.reward
    adv, returns = A.gae_advantages(rewards, values, mask, train.gamma, train.lam)
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        s.advantages = adv[i, :n].tolist()
        s.returns = returns[i, :n].tolist()


@pytest.mark.parametrize(
    "train",
    [
        TrainConfig(),
        TrainConfig(norm_adv_by_std=False),
        TrainConfig(algorithm="ppo"),
        TrainConfig(algorithm="ppo", gamma=0.99, lam=0.95),
    ],
    ids=["grpo", "dr-grpo", "gae", "gae-0.99-0.95"],
)
def test_registered_estimators_give_the_old_numbers_bit_for_bit(train):
    ours, theirs = samples(with_values=True), samples(with_values=True)
    compute_advantages(ours, train)
    old_compute_advantages(theirs, train)
    for a, b in zip(ours, theirs):
        assert a.advantages == b.advantages  # exact float equality, element by element
        assert a.returns == b.returns
        assert len(a.advantages) == len(a.response_ids)


def test_the_config_accepts_exactly_the_registered_names(tmp_path):
    for name in R.ADV_ESTIMATOR_REGISTRY:
        assert TrainConfig(adv_estimator=name).estimator is R.get_adv_estimator(name)
    for name in R.POLICY_LOSS_REGISTRY:
        assert TrainConfig(loss_mode=name).loss_mode == name
    path = tiny_env_file(tmp_path, adv_estimator="rloo")
    with pytest.raises(ConfigError) as err:
        load_env_config(path)
    assert str(err.value) == (
        f"{path}: train.adv_estimator: Value error, unknown adv_estimator 'rloo'; "
        f"choose one of {sorted(R.ADV_ESTIMATOR_REGISTRY)}"
    )
    with pytest.raises(ConfigError, match=r"train.loss_mode: Value error, unknown loss_mode 'gspo'; choose one of"):
        load_env_config(tiny_env_file(tmp_path, loss_mode="gspo"))


def test_the_built_ins_declare_their_needs():
    gae, grpo = R.get_adv_estimator("gae"), R.get_adv_estimator("grpo")
    assert gae.needs_values and not (gae.needs_old_logprobs or gae.needs_ref_logprobs)
    assert not (grpo.needs_values or grpo.needs_old_logprobs or grpo.needs_ref_logprobs)
    assert gae.fn is A.gae_estimator and grpo.fn is A.grpo_estimator
    assert R.get_policy_loss_fn("vanilla") is A.vanilla_policy_loss
    # Presets name estimators; what they imply comes from the estimator, not the name.
    assert TrainConfig(algorithm="ppo").estimator.needs_values and not TrainConfig().estimator.needs_values
    assert TrainConfig(kl_coef=0.1).needs_reference and not TrainConfig().needs_reference


def test_an_estimator_that_breaks_its_contract_is_named():
    @A.register_adv_est("bad-shape")
    def bad(batch, train):
        return batch.scores, None

    @A.register_adv_est("no-returns", needs_values=True)
    def no_returns(batch, train):
        return batch.mask.clone(), None

    try:
        with pytest.raises(ValueError, match=r"'bad-shape' returned advantages of shape \(9,\), expected \(9, 11\)"):
            compute_advantages(samples(), TrainConfig(adv_estimator="bad-shape"))
        with pytest.raises(ValueError, match="'no-returns' needs values, which sample 0 lacks"):
            compute_advantages(samples(), TrainConfig(adv_estimator="no-returns"))
        with pytest.raises(ValueError, match="'no-returns' needs values but returned no returns"):
            compute_advantages(samples(with_values=True), TrainConfig(adv_estimator="no-returns"))
        with pytest.raises(ValueError, match="already registered"):
            A.register_adv_est("bad-shape")(no_returns)
    finally:
        R.ADV_ESTIMATOR_REGISTRY.pop("bad-shape", None)
        R.ADV_ESTIMATOR_REGISTRY.pop("no-returns", None)


@pytest.fixture
def rloo():
    """RLOO registered for the test (each score minus the mean of its siblings'; alone: the score), with the
    batches it was given and the advantages it returned; unregistered after."""
    calls: list[tuple[A.AdvantageInputs, torch.Tensor]] = []

    @A.register_adv_est("rloo", needs_old_logprobs=True)
    def rloo_estimator(batch: A.AdvantageInputs, train: TrainConfig):
        adv = torch.empty_like(batch.scores)
        for g in set(batch.groups):
            idx = [i for i, h in enumerate(batch.groups) if h == g]
            scores = batch.scores[idx]
            k = len(idx)
            adv[idx] = scores - (scores.sum() - scores) / (k - 1) if k > 1 else scores
        out = torch.where(batch.mask.bool(), adv.unsqueeze(-1), 0.0)
        calls.append((batch, out))
        return out, None

    try:
        yield calls
    finally:
        del R.ADV_ESTIMATOR_REGISTRY["rloo"]


def test_a_new_registered_estimator_trains_through_the_trainer(tmp_path, rloo, monkeypatch):
    """No edit but the registration: the config takes the name, the trainer runs the old-policy pass the
    estimator declared it needs, builds no value head, and trains on the advantages it returned."""
    run_episode = MultiTurnController.run_episode

    async def episode(self, task, task_index=0, sample_index=0, seed=None):  # a group scores {1, 0, 0}
        traj = await run_episode(self, task, task_index, sample_index, seed)
        traj.reward = float(sample_index == 0)
        return traj

    monkeypatch.setattr(MultiTurnController, "run_episode", episode)
    trained: list[list[list[float]]] = []
    update_policy = update_module.update_policy

    def spy(policy, optimizer, samples, cfg, *args, **kwargs):
        assert policy.value_head is None
        trained.append([list(s.advantages) for s in samples])
        return update_policy(policy, optimizer, samples, cfg, *args, **kwargs)

    monkeypatch.setattr(update_module, "update_policy", spy)
    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    config = tiny_env_file(tmp_path, steps=1, prompts_per_step=2, lr=1e-3, micro_batch_tokens=256, adv_estimator="rloo")
    report = Trainer.from_env_file(config, tmp_path / "run", loaded=tiny).run()

    assert len(rloo) == 1 and len(trained) == 1
    batch, returned = rloo[0]
    assert batch.values is None and batch.ref_logprobs is None  # not declared: not computed
    assert batch.old_logprobs is not None  # declared: the old-policy pass ran before the advantages
    trained_positions = batch.mask.bool()
    assert (batch.old_logprobs[trained_positions] < 0).all() and (batch.old_logprobs[~trained_positions] == 0).all()
    # What the update trained on is what the estimator returned, position by position.
    assert [adv for adv in trained[0]] == [returned[i, : len(a)].tolist() for i, a in enumerate(trained[0])]
    m = report["steps"][0]
    assert report["config"]["train"]["adv_estimator"] == "rloo"
    assert m["critic/advantages/max"] == 1.0 and m["critic/advantages/min"] == -0.5  # 1 - 0, 0 - (1 + 0) / 2
    assert "actor/pg_loss" in m and m["training/nonfinite_updates"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())

"""Mixed precision: ``train.dtype: bfloat16`` computes in bfloat16 over float32 weights and AdamW state,
so a small update lands as it does in float32; checkpoints hold float32; the heads follow the model's device."""

from __future__ import annotations

import pytest
import torch
from helpers.policy_updates import samples
from helpers.rl_envs import tiny_env_file

from srt_agent.config import load_env_config
from srt_agent.models import tiny_random_model
from srt_agent.rl.batch import pack
from srt_agent.rl.policy import Policy, build_policy
from srt_agent.rl.update import compute_advantages, update_policy


def one_step(tmp_path, dtype: str) -> tuple[torch.Tensor, Policy, torch.optim.Optimizer, dict]:
    """One GRPO update at lr 1e-6 of a fresh float32 tiny Llama, configured as a run is: (weight delta,
    policy, optimizer, metrics)."""
    config = load_env_config(tiny_env_file(tmp_path, f"{dtype}.yaml", dtype=dtype, lr=1e-6))
    model = tiny_random_model("llama", seed=0, dtype=torch.float32).model
    policy, optimizer, scheduler, _ = build_policy(config, model)
    before = {k: v.detach().float().clone() for k, v in policy.base.state_dict().items()}
    data = samples()
    compute_advantages(data, config.train)
    metrics = update_policy(policy, optimizer, data, config.train, scheduler=scheduler)
    after = policy.base.state_dict()
    delta = torch.cat([(after[k].float() - before[k]).reshape(-1) for k in before])
    return delta, policy, optimizer, metrics


def test_a_bfloat16_step_at_lr_1e6_moves_the_weights_as_a_float32_step_does(tmp_path):
    """A weight of 0.02 has a bfloat16 resolution of ~1.2e-4: an update of 1e-6 on bfloat16 weights rounds
    away. Over float32 master weights the bfloat16 step points where the float32 one does, as far."""
    exact, *_ = one_step(tmp_path, "float32")
    mixed, policy, optimizer, metrics = one_step(tmp_path, "bfloat16")
    assert exact.norm() > 0 and metrics["actor/grad_norm"] > 0
    cosine = torch.nn.functional.cosine_similarity(mixed, exact, dim=0)
    assert cosine > 0.95, f"the bfloat16 step points elsewhere (cosine {cosine:.3f})"
    assert 0.9 < mixed.norm() / exact.norm() < 1.1
    # the master weights and AdamW's moments stay float32; a checkpoint stores them so
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    moments = [t for state in optimizer.state.values() for k, t in state.items() if k.startswith("exp_avg")]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    assert {t.dtype for t in policy.state_dict().values() if t.is_floating_point()} == {torch.float32}


def test_bfloat16_scores_keep_float32_log_probs_close_to_the_float32_ones():
    model = tiny_random_model("llama", seed=0, dtype=torch.float32).model
    exact, mixed = Policy(model, value_head=True), Policy(model, value_head=True, compute_dtype=torch.bfloat16)
    batch = pack(samples(), 4096)[0]
    a, b = exact.score(batch), mixed.score(batch)
    assert b.logprobs.dtype == b.values.dtype == torch.float32  # the heads run in the weights' dtype
    assert not torch.equal(a.logprobs, b.logprobs)  # the decoder did run in bfloat16
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=0.05, rtol=0.05)


def test_the_engine_receives_weights_in_its_own_dtype():
    policy = Policy(tiny_random_model("llama", seed=0, dtype=torch.float32).model, compute_dtype=torch.bfloat16)
    weights = policy.engine_weights(torch.bfloat16)
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert all(t.data_ptr() != p.data_ptr() for t, p in zip(weights.values(), policy.base.state_dict().values()))


@pytest.mark.parametrize("value_head", [True, False])
def test_the_heads_live_on_the_models_device(value_head):
    """A model on another device (here "meta", which stands for a GPU on a CPU-only machine): the policy's
    copy and its value head follow it (PPO's value head was made on the CPU, and scoring met a device mismatch)."""
    model = tiny_random_model("llama", seed=0, dtype=torch.float32).model.to("meta")
    policy = Policy(model, value_head=value_head)
    assert policy.device.type == "meta"
    assert {p.device.type for p in policy.parameters()} == {"meta"}

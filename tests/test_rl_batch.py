"""Packing samples into micro-batches: no padding, only trained tokens scored, same log-probs as one by one."""

from __future__ import annotations

import pytest
import torch

from srt_agent.config import LoraConfig
from srt_agent.models import tiny_random_model
from srt_agent.rl.batch import Sample, pack
from srt_agent.rl.policy import Policy


def sample(prompt, response, mask, reward=0.0):
    return Sample(list(prompt), list(response), list(mask), [0.0] * len(response), reward)


SAMPLES = [
    sample([1, 2, 3], [10, 11, 12, 13, 14], [1, 1, 0, 0, 1]),  # tool output at 12, 13
    sample([4, 5], [20, 21], [1, 1]),
    sample([6, 7, 8, 9], [30, 31, 32], [0, 1, 1]),  # forced prefix at 30
]


def test_pack_targets_only_trained_tokens():
    (batch,) = pack(SAMPLES, max_tokens=64)
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11, 12, 13, 14, 4, 5, 20, 21, 6, 7, 8, 9, 30, 31, 32]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6]]
    # Each target row is the position before its token; masked tool tokens are never targets.
    assert batch.target_ids.tolist() == [10, 11, 14, 20, 21, 31, 32]
    assert batch.targets.tolist() == [2, 3, 6, 9, 10, 16, 17]
    assert batch.seq_index.tolist() == [0, 0, 0, 1, 1, 2, 2]


GROUP = [  # GRPO siblings: one prompt, three responses
    sample([1, 2, 3], [10, 11, 12], [1, 0, 1]),
    sample([1, 2, 3], [20, 21], [1, 1]),
    sample([1, 2, 3], [30, 31, 32, 33], [1, 1, 0, 1]),
]


def test_siblings_share_one_copy_of_their_prompt():
    (batch,) = pack(GROUP, max_tokens=64)
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11, 12, 20, 21, 30, 31, 32, 33]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 3, 4, 3, 4, 5, 6]]
    # A response's first token is predicted from the prompt's last row.
    assert batch.targets.tolist() == [2, 4, 2, 6, 2, 8, 10]
    assert batch.target_ids.tolist() == [10, 12, 20, 21, 30, 31, 33]
    mask = batch.attention_mask[0, 0]
    assert mask[6].tolist() == [True] * 3 + [False] * 3 + [True] + [False] * 5  # sibling 2 sees prompt + itself
    assert mask[11].tolist() == [True] * 3 + [False] * 5 + [True] * 4


def test_pack_respects_the_token_budget_and_keeps_order():
    batches = pack(SAMPLES, max_tokens=11)
    assert [b.samples for b in batches] == [[0], [1, 2]]
    assert [b.num_tokens for b in batches] == [8, 11]
    (only,) = pack(SAMPLES, max_tokens=4, indices=[1])
    assert only.samples == [1] and only.seq_index.tolist() == [0, 0]


def test_split_and_expand_are_inverse():
    (batch,) = pack(SAMPLES, max_tokens=64)
    values = torch.arange(7, dtype=torch.float32)
    back = dict(batch.split(SAMPLES, values))
    assert back[0] == [0.0, 1.0, 0.0, 0.0, 2.0] and back[2] == [0.0, 5.0, 6.0]
    assert batch.per_target(SAMPLES, "engine_logprobs").tolist() == [0.0] * 7


def test_bad_samples_are_clear_errors():
    with pytest.raises(ValueError, match="3 tokens but 2 mask entries"):
        Sample([1], [1, 2, 3], [1, 1], [0.0] * 3)
    with pytest.raises(ValueError, match="at least one prompt token"):
        Sample([], [1], [1], [0.0])


@pytest.mark.parametrize("lora", [0, 4])
def test_packed_scores_equal_one_sample_at_a_time(lora):
    """Padding-free packing (shared prompts included) gives each sample's own log-probs."""
    loaded = tiny_random_model("llama", seed=2)
    policy = Policy(loaded.model, temperature=0.7, lora=LoraConfig(rank=lora), dtype=torch.float64)
    for group in (SAMPLES, GROUP, SAMPLES + GROUP):
        (batch,) = pack(group, max_tokens=64)
        packed = dict(batch.split(group, policy.score(batch).logprobs))
        for i in range(len(group)):
            (alone,) = pack(group, 64, [i])
            torch.testing.assert_close(
                torch.tensor(packed[i]), torch.tensor(dict(alone.split(group, policy.score(alone).logprobs))[i])
            )
    (batch,) = pack(SAMPLES, max_tokens=64)
    packed = policy.score(batch).logprobs
    # ... and they are log softmax(logits / T) of a plain forward of each sample.
    model = loaded.model
    s = SAMPLES[0]
    logits = model(torch.tensor([s.prompt_ids + s.response_ids])).logits[0].double() / 0.7
    expected = torch.log_softmax(logits, -1)[[2, 3, 6], [10, 11, 14]]
    torch.testing.assert_close(packed[:3], expected)


def test_lora_engine_weights_merge_the_adapters():
    loaded = tiny_random_model("llama", seed=2)
    policy = Policy(loaded.model, lora=LoraConfig(rank=4), dtype=torch.float64)
    for p in policy.parameters():  # move the adapters away from their zero-output start
        p.data.add_(0.05)
    weights = policy.engine_weights()
    assert set(weights) == set(loaded.model.state_dict())
    plain = tiny_random_model("llama", seed=2).model
    plain.load_state_dict(weights)
    (batch,) = pack(SAMPLES, max_tokens=64)
    ids = batch.input_ids
    with torch.no_grad():
        kwargs = dict(
            input_ids=ids, position_ids=batch.position_ids, attention_mask=batch.attention_mask, use_cache=False
        )
        merged = plain.model(**kwargs).last_hidden_state
        adapted = policy.base.get_decoder()(**kwargs).last_hidden_state
    torch.testing.assert_close(merged, adapted.float().to(merged.dtype), rtol=1e-5, atol=1e-6)
    assert not torch.equal(
        weights["model.layers.0.self_attn.q_proj.weight"],
        loaded.model.state_dict()["model.layers.0.self_attn.q_proj.weight"].float(),
    )

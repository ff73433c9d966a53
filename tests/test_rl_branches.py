"""A server session that branched trains every branch: each branch's sampled tokens become a sample with
the rollout's reward, the rollout weighs as one sample of its group (one row in the GRPO statistics, one
sequence in the ``seq-mean`` losses, one piece of a mini-batch), and a run's report says where every
sampled token went."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from srt_agent.agent.trajectory import Trajectory
from srt_agent.config import EnvConfig, TrainConfig
from srt_agent.rl.algorithms import agg_loss, grpo_advantages
from srt_agent.rl.batch import Sample, count_rollouts, mini_batches, pack
from srt_agent.rl.metrics import token_metrics
from srt_agent.rl.report import token_text
from srt_agent.rl.rollouts import RolloutRun
from srt_agent.rl.samples import step_samples
from srt_agent.rl.update import compute_advantages

pytestmark = pytest.mark.usefixtures("one_thread")


def trajectory(prompt: list[int], sampled: list[int], reward: float, sample: int, branches=()) -> Trajectory:
    t = Trajectory(request_id=f"r{sample}", task_index=0, sample_index=sample, prompt_ids=list(prompt))
    t.append(sampled, [-0.1] * len(sampled))
    t.append([9, 9])  # an observation
    t.append(sampled[:2], [-0.2] * len(sampled[:2]))
    t.reward, t.branches = reward, list(branches)
    return t


def branched_group() -> list[Trajectory]:
    """Three rollouts of one task; the second's session branched twice (its earlier branches hold tokens)."""
    early = [trajectory([1, 2], [5, 6, 7], 0.0, 1), trajectory([1, 2, 5, 6], [8], 0.0, 1)]
    for k, b in enumerate(early[1:], 1):
        b.branch_reason = f"edited {k}"
    return [
        trajectory([1, 2], [3, 4], 1.0, 0),
        trajectory([1, 2, 8, 8], [4, 4, 4], 0.0, 1, early),
        trajectory([1, 2], [3], 0.0, 2),
    ]


def test_every_branch_becomes_a_sample_with_the_rollouts_reward():
    group = branched_group()
    samples, filtered = step_samples([RolloutRun("srt", group, None)], EnvConfig(model="tiny-llama"))
    assert filtered == 0 and len(samples) == 5
    assert [s.lead for s in samples] == [True, False, False, True, True]
    assert [s.rollout for s in samples] == [None, (0, 0, 1), (0, 0, 1), (0, 0, 1), None]
    assert {s.group for s in samples} == {(0, 0)} and [s.reward for s in samples[1:4]] == [0.0] * 3
    sampled = token_metrics(group)["rollout/sampled_tokens"]
    assert sum(s.trained_tokens for s in samples) == sampled == sum(t.model_tokens for t in group) + 5 + 2
    assert samples[1].prompt_ids == [1, 2] and samples[2].prompt_ids == [1, 2, 5, 6]


def test_a_branched_rollout_weighs_as_one_sample_of_its_group():
    group = branched_group()
    group[1].reward = 0.5
    samples, _ = step_samples([RolloutRun("srt", group, None)], EnvConfig(model="tiny-llama"))
    compute_advantages(samples, TrainConfig(algorithm="grpo"))
    expected = grpo_advantages(torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64), [0, 0, 0]).tolist()
    per_rollout = [samples[0], samples[3], samples[4]]
    for s, a in zip(per_rollout, expected):  # three rollouts in the statistics, not five samples
        assert s.trained(s.advantages) == pytest.approx([a] * s.trained_tokens)
    for branch in samples[1:3]:  # the earlier branches take their rollout's advantage on every sampled token
        assert branch.trained(branch.advantages) == pytest.approx([expected[1]] * branch.trained_tokens)
        assert [a for a, m in zip(branch.advantages, branch.response_mask) if not m] == [0.0, 0.0]


def test_the_seq_mean_losses_count_a_branched_rollout_once():
    group = branched_group()
    samples, _ = step_samples([RolloutRun("srt", group, None)], EnvConfig(model="tiny-llama"))
    (batch,) = pack(samples, 10_000)
    assert count_rollouts(samples, range(5)) == 3
    by_sample = {}
    for seq, target in zip(batch.seq_index.tolist(), range(len(batch.targets))):
        by_sample.setdefault(seq, []).append(target)
    assert sorted(len(v) for v in by_sample.values()) == [2, 4, 12]  # the branched rollout's tokens as one
    loss = torch.arange(len(batch.targets), dtype=torch.float64)
    mask = torch.ones_like(loss)
    got = agg_loss(loss, mask, "seq-mean-token-mean", seq_index=batch.seq_index, num_seqs=3)
    want = sum(loss[v].mean() for v in by_sample.values()) / 3
    assert float(got) == pytest.approx(float(want))


def test_mini_batches_keep_a_rollouts_branches_together():
    def sample(rollout) -> Sample:
        return Sample([1], [2], [1], [0.0], rollout=rollout)

    plain = [sample(None) for _ in range(7)]
    assert mini_batches(plain, [6, 5, 4, 3, 2, 1, 0], 3) == [[6, 5, 4], [3, 2, 1], [0]]  # as plain slices
    mixed = [sample(None), sample("a"), sample(None), sample("a"), sample("a"), sample(None)]
    assert mini_batches(mixed, [1, 0, 2, 3, 4, 5], 3) == [[1, 3, 4], [0, 2], [5]]


def test_the_report_says_where_every_sampled_token_went():
    steps = [
        {**token_metrics(branched_group()), "perf/trained_tokens": 18.0},
        {"rollout/rollouts": 2.0, "rollout/sampled_tokens": 10.0, "rollout/error_tokens": 4.0},
    ]
    text = token_text(steps)
    assert text.startswith("trained 18 of 28 sampled tokens (4 per rollout)")
    assert "not trained: 4 in failed rollouts, 6 in groups without signal" in text
    assert "sessions with branches: 1 of 5, 7 tokens outside the last branch" in text
    assert "none dropped" in token_text(steps[:1]) and token_text([]) == ""


async def editing_agent(base_url: str, task) -> float:
    """Three turns; before each later turn it edits its history (it rewrites the model's last reply), so
    every turn opens a new branch. Reward 1 when the replies' characters sum to an even number."""
    c = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    model = (await c.models.list()).data[0].id
    messages, replies = [dict(m) for m in task.prompt], []
    for k in range(3):
        out = await c.chat.completions.create(model=model, messages=messages, max_tokens=6)
        replies.append(out.choices[0].message.content)
        messages += [{"role": "assistant", "content": f"(turn {k}) " + replies[-1]}, {"role": "user", "content": "Go."}]
    await c.close()
    return float(sum(map(ord, "".join(replies))) % 2 == 0)


def test_a_branched_sessions_every_sampled_token_reaches_the_trainer(tmp_path):
    from srt_agent.models import load_tokenizer, tiny_random_model
    from srt_agent.rl.trainer import Trainer

    env = tmp_path / "agent.yaml"
    env.write_text(
        "name: branches\nagent: test_rl_branches:editing_agent\nmodel: tiny-llama\n"
        "dataset: {n: 4, seed: 1}\nn_samples: 3\nmax_tokens_per_turn: 6\nmax_response_tokens: 80\n"
        "sampling: {temperature: 1.0, seed: 3}\nengine: {max_batch: 8, max_context: 512, calibrate: false}\n"
        "cold_start: {enabled: false, eval_tasks: 0}\n"
        "train: {steps: 1, prompts_per_step: 2, lr: 0.001, micro_batch_tokens: 256, loss_agg_mode: seq-mean-token-mean}\n"
    )
    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    report = Trainer.from_env_file(env, tmp_path / "run", loaded=tiny).run()
    (step,) = report["steps"]
    assert step["rollout/rollouts"] == 6 and step["rollout/branched_sessions"] == 6 and step["rollout/branches"] == 12
    assert step["rollout/error_tokens"] == 0 and step["rollout/branch_tokens"] > 0
    # every branch's sampled tokens are trained, and scored exactly as the engine sampled them
    assert step["perf/trained_tokens"] == step["rollout/sampled_tokens"] > step["srt/model_tokens"]
    assert step["training/rollout_logprob_diff_mean"] < 1e-4
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "none dropped; sessions with branches: 6 of 6" in summary
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    for row in rows:
        assert [b["branch_reason"] is None for b in row["branches"]] == [True, False]
        assert "the assistant's text differs" in row["branch_reason"] and row["num_turns"] == 1

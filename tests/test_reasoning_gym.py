"""reasoning-gym task mixes as a dataset source: seeded, weighted, scored by each family's own scorer."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from srt_agent.agent.retool import ReToolEnv
from srt_agent.agent.rewards import final_answer, score_response
from srt_agent.agent.trajectory import Trajectory
from srt_agent.config import ConfigError, DatasetConfig, EnvConfig, RewardConfig, load_env_config
from srt_agent.rl.evaluate import held_out_tasks, is_correct
from srt_agent.sources.arithmetic import arithmetic_tasks
from srt_agent.sources.reasoning_gym import reasoning_gym_score

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'srt-agent[envs]')")

ROOT = Path(__file__).resolve().parents[1]
MIX = [
    {"name": "basic_arithmetic", "weight": 3, "config": {"min_terms": 2, "max_terms": 3}},
    {"name": "leg_counting", "weight": 1},
]


def mix(n: int = 40, seed: int = 1, families=MIX) -> DatasetConfig:
    return DatasetConfig(source="reasoning_gym", n=n, seed=seed, reasoning_gym=families)


def test_the_same_seed_gives_the_same_tasks():
    a, b = mix().tasks(), mix().tasks()
    assert [t.prompt for t in a] == [t.prompt for t in b] and [t.ground_truth for t in a] == [t.ground_truth for t in b]
    # reasoning-gym draws item i from seed + i: neighbouring seeds must not share tasks all the same
    near = {t.prompt[-1]["content"] for t in mix(seed=2).tasks()}
    assert len(near & {t.prompt[-1]["content"] for t in a}) <= 2
    assert len(mix().tasks(limit=5)) == 5
    task = a[0]
    assert task.prompt[0]["role"] == "system" and "\\boxed{" in task.prompt[0]["content"]
    assert task.prompt[-1]["content"] == task.extra_info["reasoning_gym"]["entry"]["question"]
    assert task.data_source == f"reasoning_gym/{task.extra_info['reasoning_gym']['family']}"


def test_weights_set_each_familys_share():
    counts = Counter(t.data_source for t in mix(n=400).tasks())
    share = counts["reasoning_gym/basic_arithmetic"] / 400
    assert 0.68 < share < 0.82, counts  # 3:1
    flipped = [{**MIX[0], "weight": 1}, {**MIX[1], "weight": 3}]
    counts = Counter(t.data_source for t in mix(n=400, families=flipped).tasks())
    assert 0.18 < counts["reasoning_gym/basic_arithmetic"] / 400 < 0.32, counts


def test_the_familys_scorer_rewards_a_right_answer_1_and_a_wrong_one_less():
    config = RewardConfig(kind="reasoning_gym", correct=1.0, incorrect=-1.0)
    for task in mix(n=8).tasks():
        right, wrong = task.ground_truth, str(int(task.ground_truth) + 1)
        assert score_response(f"so \\boxed{{{right}}}", task.ground_truth, 0, config, task) == 1.0
        assert score_response(f"<answer>{right}</answer>", task.ground_truth, 0, config, task) == 1.0
        assert score_response(f"\\boxed{{{wrong}}}", task.ground_truth, 0, config, task) < 1.0
        assert score_response("no answer at all", task.ground_truth, 0, config, task) == -1.0
        # auto (the default) picks the family's scorer for reasoning-gym tasks
        assert score_response(f"\\boxed{{{right}}}", task.ground_truth, 0, RewardConfig(), task) == 1.0
    assert final_answer("<answer>1</answer> then \\boxed{2}") == "2"


def test_partial_credit_lands_between_incorrect_and_correct():
    task = next(t for t in mix(n=20).tasks() if t.data_source.endswith("basic_arithmetic"))
    partial = reasoning_gym_score(task.ground_truth + "00", task)  # reasoning-gym's containment credit
    assert 0 < partial < 1
    config = RewardConfig(kind="reasoning_gym", correct=1.0, incorrect=-1.0)
    reward = score_response(f"\\boxed{{{task.ground_truth}00}}", "", 0, config, task)
    assert reward == pytest.approx(-1.0 + 2.0 * partial)


def test_the_env_scores_with_the_family_and_reports_correctness():
    task = mix(n=4).tasks()[1]
    for text, correct in ((f"\\boxed{{{task.ground_truth}}}", True), ("\\boxed{-1}", False)):
        env = ReToolEnv(task, reward={"kind": "reasoning_gym"})
        result = asyncio.run(env.step(text, final=False))
        assert result.done and env.correct is correct and result.reward == float(correct)
    traj = Trajectory("r", 0, 0, [1], ground_truth=task.ground_truth, correct=False)
    traj.messages = [{"role": "assistant", "content": f"\\boxed{{{task.ground_truth}}}"}]
    assert not is_correct(traj)  # the env's verdict wins over the boxed check


def test_unknown_family_bad_config_and_mismatched_sections_are_clear_errors(tmp_path):
    def error(text: str) -> str:
        path = tmp_path / "env.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_env_config(path)
        return str(info.value)

    msg = error("dataset: {source: reasoning_gym, reasoning_gym: [{name: leg_countin}]}\n")
    assert "env.yaml: dataset:" in msg and "unknown reasoning-gym task family 'leg_countin'" in msg
    assert "leg_counting" in msg  # the near name
    msg = error("dataset: {source: reasoning_gym, reasoning_gym: [{name: basic_arithmetic, config: {min_termz: 2}}]}\n")
    assert "'basic_arithmetic': bad config" in msg and "min_termz" in msg
    assert "needs a 'reasoning_gym:' list" in error("dataset: {source: reasoning_gym}\n")
    assert "listed twice" in error("dataset: {source: reasoning_gym, reasoning_gym: [{name: gcd}, {name: gcd}]}\n")
    assert "source is not 'reasoning_gym'" in error("dataset: {reasoning_gym: [{name: gcd}]}\n")
    assert "weight" in error("dataset: {source: reasoning_gym, reasoning_gym: [{name: gcd, weight: 0}]}\n")
    assert "reward.kind reasoning_gym" in error("reward: {kind: reasoning_gym}\n")
    # the cold start's arithmetic traces still score by \boxed{} under kind reasoning_gym
    arith = arithmetic_tasks(1)[0]
    right = f"\\boxed{{{arith.ground_truth}}}"
    assert score_response(right, arith.ground_truth, 0, RewardConfig(kind="reasoning_gym"), arith) == 1.0
    with pytest.raises(ValueError, match="no reasoning-gym entry"):
        reasoning_gym_score("1", arith)


def test_held_out_tasks_come_from_the_mix_and_are_unseen():
    config = EnvConfig(dataset=mix(n=30).model_dump(), cold_start={"eval_tasks": 10, "eval_seed": 7})
    held = held_out_tasks(config)
    assert len(held) == 10 and all(t.data_source.startswith("reasoning_gym/") for t in held)
    seen = {t.prompt[-1]["content"] for t in config.dataset.tasks()}
    assert not seen & {t.prompt[-1]["content"] for t in held}


def test_the_shipped_mix_validates():
    config = load_env_config(ROOT / "envs" / "reasoning_gym_mix.yaml")
    assert config.reward.kind == "reasoning_gym" and config.tools is not None
    assert {t.data_source for t in config.dataset.tasks()} == {
        "reasoning_gym/basic_arithmetic",
        "reasoning_gym/leg_counting",
        "reasoning_gym/gcd",
    }

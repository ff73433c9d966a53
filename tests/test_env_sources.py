"""Environment sources behind one registry (srt_agent.sources): each config value selects its source, and a
new source is one registered thing that the trainer and the evaluator run, untouched."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from srt_agent.agent.env import Env, StepResult
from srt_agent.agent.rollout import run_rollouts
from srt_agent.config import ConfigError, EnvConfig, load_env_config
from srt_agent.config.tasks import Task
from srt_agent.sources import SOURCES, EnvSource, episode_source, register, task_source

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "dataset,source",
    [
        ("arithmetic", "arithmetic"),
        ("reasoning_gym", "reasoning_gym"),
        ("data/tasks.parquet", "verl_files"),
        ("tasks.jsonl", "verl_files"),
        ("verifiers:vf_calculator", "verifiers"),
    ],
)
def test_dataset_source_selects_the_task_source(dataset, source):
    assert task_source(dataset).name == source


@pytest.mark.parametrize(
    "env,agent,source",
    [
        ("srt_agent.agent.retool.ReToolEnv", None, "env_class"),
        ("srt_agent.agent.retool.ReToolEnv", "examples.openai_agent:agent", "agent_function"),
        ("verifiers:vf_calculator", None, "verifiers"),
    ],
)
def test_env_and_agent_select_the_episode_source(env, agent, source):
    assert episode_source(env, agent).name == source


def test_two_episode_sources_at_once_are_refused():
    with pytest.raises(ValueError, match="agent_function, verifiers"):
        EnvConfig(env="verifiers:vf_calculator", agent="m:agent")


class ParityEnv(Env):
    """One turn; reward 1 when the model's text has an even character sum (random text varies on it)."""

    async def step(self, response: str, final: bool) -> StepResult:
        return StepResult(reward=float(sum(map(ord, response)) % 2 == 0), done=True)


def parity_tasks(n: int, seed: int) -> list[Task]:
    return [Task([{"role": "user", "content": f"Say anything ({seed}.{i})."}], "", "toy/parity") for i in range(n)]


@pytest.fixture
def toy_source():
    """A source registered here alone: ``env: toy:parity`` brings its tasks and runs ParityEnv's episodes;
    yields the number of tasks of each rollout it ran."""
    runs: list[int] = []

    def rollout(controller, loaded, tasks, n_samples, seed, on_done):
        runs.append(len(tasks))
        episodes = dataclasses.replace(controller, env_class=ParityEnv)
        return run_rollouts(episodes, tasks, n_samples, on_done, seed)

    register(
        EnvSource(
            "toy",
            dataset=lambda source: source.startswith("toy:"),
            episodes=lambda env, agent: env.startswith("toy:"),
            tasks=lambda dataset, limit: parity_tasks(4 if limit is None else min(4, limit), seed=0),
            held_out=lambda config, n: parity_tasks(n, seed=1),
            rollout=rollout,
            run_ahead=False,
        )
    )
    yield runs
    SOURCES.pop("toy")


def toy_env_file(tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(
        "name: toy\nenv: toy:parity\nmodel: tiny-llama\nn_samples: 3\nmax_turns: 1\nmax_tokens_per_turn: 6\n"
        "max_response_tokens: 40\nsampling: {temperature: 1.0, seed: 3}\n"
        "engine: {max_batch: 8, max_context: 512, calibrate: false}\n"
        "cold_start: {enabled: false, eval_tasks: 2}\n"
        "train: {steps: 1, prompts_per_step: 2, lr: 0.001, micro_batch_tokens: 512}\n"
    )
    return path


def test_a_registered_source_is_what_the_config_selects(toy_source, tmp_path):
    config = load_env_config(toy_env_file(tmp_path))
    assert config.episode_source() is config.dataset.task_source() is SOURCES["toy"]
    assert config.dataset.source == "toy:parity" and len(config.dataset.tasks()) == 4
    assert config.env_class() is EnvConfig().env_class()  # `env:` names the source, no Env class
    with pytest.raises(ConfigError, match="toy episodes do not open with"):
        load_env_config(toy_env_file(tmp_path), ["engine.run_ahead.enabled=true"])


def test_the_trainer_and_the_evaluator_run_a_registered_source(toy_source, tmp_path):
    from srt_agent.models import load_tokenizer, tiny_random_model
    from srt_agent.rl.trainer import Trainer

    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))
    report = Trainer.from_env_file(toy_env_file(tmp_path), tmp_path / "run", loaded=tiny).run()
    assert toy_source == [2, 2, 2]  # held-out before RL, the step's prompts, held-out after RL
    assert [r["trajectories"] for r in report["held_out"].values()] == [2, 2]
    (step,) = report["steps"]
    assert step["srt/model_tokens"] > 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["data_source"] for r in rows} == {"toy/parity"}
    assert all(r["error"] is None and r["reward"] in (0.0, 1.0) for r in rows)

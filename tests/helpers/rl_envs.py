"""Environments for the trainer tests (imported by dotted path, as env configs name them), their env
files and CLI options, determined rewards and a run's rollouts.

A random-weight model never answers a math question, so every reward would be 0 and no GRPO group
would carry a gradient. ``ParityToolEnv`` keeps ReTool's multi-turn tool path real (a forced code call
that runs in the sandbox, its output inserted as masked tokens) but rewards a property random text
varies on.
"""

from __future__ import annotations

import json
from pathlib import Path

from srt_agent.agent.controller import MultiTurnController
from srt_agent.agent.retool import ReToolEnv

ROOT = Path(__file__).resolve().parents[2]

FORCED_CALL = "<code>\n```python\nprint(6 * 7)\n```\n</code>"


class ParityToolEnv(ReToolEnv):
    """ReTool with a forced first code call; reward 1 when the model's text has an even character sum."""

    def response_prefix(self) -> str:
        return FORCED_CALL

    def score(self) -> float:
        return float(sum(map(ord, self.model_text)) % 2 == 0)


def tiny_env_file(tmp_path: Path, file_name: str = "tiny.yaml", **train) -> Path:
    """An env config for the trainer tests: ParityToolEnv on the tiny Llama, 4 prompts, 3 samples, short
    turns; `train` is its ``train:`` section."""
    path = tmp_path / file_name
    path.write_text(
        "name: tiny\nenv: helpers.rl_envs.ParityToolEnv\nmodel: tiny-llama\n"
        f"tools: {ROOT / 'tools' / 'code_interpreter.yaml'}\n"
        "dataset: {n: 4, seed: 1}\nn_samples: 3\nmax_turns: 2\nmax_tokens_per_turn: 6\nmax_response_tokens: 80\n"
        "sampling: {temperature: 1.0, seed: 3}\nengine: {max_batch: 8, max_context: 512, calibrate: false}\n"
        "cold_start: {enabled: false, eval_tasks: 0}\n"
        f"train: {json.dumps(train)}\n"
    )
    return path


TINY = [
    "--model",
    "tiny-llama",
    "--steps",
    "1",
    "--compare",
    "none",
    "--set",
    "n_samples=2",
    "--set",
    "train.prompts_per_step=2",
    "--set",
    "max_tokens_per_turn=8",
    "--set",
    "max_response_tokens=48",
    "--set",
    "engine.max_context=512",
    "--set",
    "engine.calibrate=false",
    "--set",
    "cold_start.n=4",
    "--set",
    "cold_start.eval_tasks=2",
    "--set",
    "cold_start.batch_size=2",
]


def rollouts(out: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (out / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()]


def one_success_per_group(monkeypatch, never: set[str] = frozenset()) -> None:
    """Determined rewards in place of ParityToolEnv's: sample 0 of each task scores 1 and the others 0
    (a group of three scores {1, 0, 0}); tasks whose prompt is in `never` always score 0."""
    run_episode = MultiTurnController.run_episode

    async def episode(self, task, task_index=0, sample_index=0, seed=None):
        traj = await run_episode(self, task, task_index, sample_index, seed)
        traj.reward = float(sample_index == 0 and task.prompt[-1]["content"] not in never)
        return traj

    monkeypatch.setattr(MultiTurnController, "run_episode", episode)

"""`SRTRolloutFunc`: a ``rollout_func`` for TRL's ``GRPOTrainer`` running srt-agent's multi-turn episodes.

    trainer = GRPOTrainer(model, reward_funcs=[retool_reward], args=GRPOConfig(...), train_dataset=data,
                          rollout_func=SRTRolloutFunc("envs/retool_arith.yaml"))

TRL hands the function the prompts of this process (each already repeated ``num_generations`` times) and
the trainer. Every prompt becomes one episode of the env config's environment (ReTool by default) on an
srt-agent engine that holds its own copy of the policy: the copy is refreshed from the trainer's model
whenever the trainer's step moved on (the rollout trees stay), so rollouts are on-policy and siblings and
later steps draft from each other. Tool output tokens come back with ``env_mask`` 0, which TRL keeps out of
the loss; ``num_turns`` (verl's count) and ``srt_finish_reason`` reach the reward functions.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ...agent.controller import MultiTurnController
from ...agent.rollout import build_controller, run_rollouts
from ...agent.trajectory import Trajectory
from ...config import EnvConfig, load_env_config
from ...config.tasks import Task
from ...models import LoadedModel, end_token_ids


def as_messages(prompt: Any) -> list[dict]:
    """TRL prompts are chat messages or plain strings (taken as one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    raise ValueError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")


class SRTRolloutFunc:
    """Callable as TRL's ``rollout_func(prompts, trainer) -> dict``; keeps one engine across the trainer's steps.

    `config` is an env config (an :class:`EnvConfig` or a YAML path): its env, tools, turn and token limits,
    sampling temperature / top-p / top-k / seed, and engine options apply; its ``model`` and ``dataset`` are
    not used (the trainer's model and prompts are). The response budget is also capped by
    ``max_completion_length``. Every call draws new sampling seeds from the config's seed.
    """

    def __init__(
        self, config: EnvConfig | str | Path | None = None, env_class: type | None = None, tools: dict | None = None
    ):
        if isinstance(config, (str, Path)):
            config = load_env_config(config)
        self.config = config or EnvConfig(n_samples=1)
        self.env_class = env_class or self.config.env_class()
        self.tools = tools
        self.controller: MultiTurnController | None = None
        self.synced_step: int | None = None
        self.calls = 0

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        controller = self._controller(trainer)
        if trainer.state.global_step != self.synced_step:  # the trainer updated the policy: load it (trees stay)
            state = {k: v.detach() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}
            controller.engine.call(lambda engine: (engine.update_weights(state), engine.end_step())).result()
            self.synced_step = trainer.state.global_step
        budget = min(
            self.config.max_response_tokens, trainer.args.max_completion_length or self.config.max_response_tokens
        )
        controller.config = self.config.model_copy(update={"max_response_tokens": budget})
        seed = self.config.sampling.seed
        tasks = [Task(prompt=as_messages(p), ground_truth="") for p in prompts]
        trajectories, _ = run_rollouts(controller, tasks, 1, seed=None if seed is None else seed + 7919 * self.calls)
        self.calls += 1
        return self._output(trajectories, trainer.processing_class)

    def close(self) -> None:
        """Stop the engine's thread."""
        if self.controller is not None:
            self.controller.engine.close()
            self.controller = None

    def _controller(self, trainer: Any) -> MultiTurnController:
        """The controller over an engine holding a copy of the trainer's policy (made on the first call)."""
        if self.controller is None:
            tokenizer = trainer.processing_class
            policy = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).eval()
            loaded = LoadedModel(policy, tokenizer, "trl-policy", "trl", end_token_ids(tokenizer, policy.config))
            self.controller = build_controller(self.config, loaded=loaded, env_class=self.env_class, tools=self.tools)
            self.synced_step = trainer.state.global_step
        return self.controller

    @staticmethod
    def _output(trajectories: list[Trajectory], tokenizer: Any) -> dict[str, list]:
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        for traj in trajectories:
            ids, logprobs, mask = list(traj.response_ids), list(traj.response_logprobs), list(traj.response_mask)
            if not ids:  # a failed episode: one masked EOS, since TRL needs a last token (it is out of the loss)
                ids, logprobs, mask = [tokenizer.eos_token_id], [0.0], [0]
            out["prompt_ids"].append(list(traj.prompt_ids))
            out["completion_ids"].append(ids)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(mask)
        out["num_turns"] = [t.chat_turns for t in trajectories]
        out["srt_finish_reason"] = [t.finish_reason for t in trajectories]
        out["srt_tool_calls"] = [len(t.tool_calls) for t in trajectories]
        return out

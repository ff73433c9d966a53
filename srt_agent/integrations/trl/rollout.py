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

import asyncio
import copy
from pathlib import Path
from typing import Any

from ...agent.config import EnvConfig, load_env_config
from ...agent.controller import MultiTurnController
from ...agent.datasets import Task
from ...agent.toolconfig import load_tools
from ...agent.trajectory import Trajectory
from ...engine import AsyncEngine, Engine
from ...models import LoadedModel, end_token_ids
from ..engine_thread import on_engine_thread


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
    sampling temperature / top-p / top-k, and engine options apply; its ``model`` and ``dataset`` are not used
    (the trainer's model and prompts are). The response budget is also capped by ``max_completion_length``.
    """

    def __init__(self, config: EnvConfig | str | Path | None = None, env_class: type | None = None, tools: dict | None = None):
        if isinstance(config, (str, Path)):
            config = load_env_config(config)
        self.config = config or EnvConfig(n_samples=1)
        self.env_class = env_class or self.config.env_class()
        if tools is None:
            tools = load_tools(self.config.tools, self.config.interpreter) if self.config.tools is not None else {}
        self.tools = tools
        self.controller: MultiTurnController | None = None
        self.synced_step: int | None = None
        self.calls = 0

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        controller = self._controller(trainer)
        tasks = [Task(prompt=as_messages(p), ground_truth="") for p in prompts]
        trajectories = asyncio.run(self._rollout(controller, trainer, tasks))
        self.calls += 1
        return self._output(trajectories, trainer.processing_class)

    def close(self) -> None:
        """Stop the engine's thread."""
        if self.controller is not None:
            self.controller.engine.close()
            self.controller = None

    # ---- internals ------------------------------------------------------------------------------
    def _controller(self, trainer: Any) -> MultiTurnController:
        if self.controller is None:
            tokenizer = trainer.processing_class
            policy = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).eval()
            loaded = LoadedModel(policy, tokenizer, "trl-policy", "trl", end_token_ids(tokenizer, policy.config))
            engine_config = self.config.engine
            engine = Engine(
                loaded,
                drafter=engine_config.drafter,
                device=engine_config.device,
                max_batch=engine_config.max_batch,
                max_context=engine_config.max_context,
            )
            self.synced_step = trainer.state.global_step
            self.controller = MultiTurnController(
                engine=AsyncEngine(engine),
                tokenizer=tokenizer,
                config=self.config,
                env_class=self.env_class,
                tools=self.tools,
                eos_token_ids=list(loaded.eos_token_ids),
            )
        return self.controller

    async def _rollout(self, controller: MultiTurnController, trainer: Any, tasks: list[Task]) -> list[Trajectory]:
        step = trainer.state.global_step
        if step != self.synced_step:  # the trainer updated the policy: load it (the trees stay)
            state = {k: v.detach() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}

            def load(engine: Engine) -> None:
                engine.update_weights(state)
                engine.end_step()

            await on_engine_thread(controller.engine, load)
            self.synced_step = step
        budget = min(self.config.max_response_tokens, trainer.args.max_completion_length or self.config.max_response_tokens)
        seed = self.config.sampling.seed
        sampling = self.config.sampling.model_copy(update={"seed": None if seed is None else seed + 7919 * self.calls})
        controller.config = self.config.model_copy(update={"max_response_tokens": budget, "sampling": sampling})
        return await controller.run(tasks, n_samples=1)

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

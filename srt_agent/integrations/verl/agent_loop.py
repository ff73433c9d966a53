"""`ReToolAgentLoop`: srt-agent's multi-turn controller as a verl agent loop.

Registered as ``srt_retool``; list it in an ``agent_loop_config_path`` YAML (see ``examples/verl/``)::

    - name: srt_retool
      _target_: srt_agent.integrations.verl.agent_loop.ReToolAgentLoop
      max_turns: 8

Each trajectory runs :class:`srt_agent.agent.MultiTurnController`'s episode (parsing, forced interpreter
tokens with ``response_mask = 0``, turn and length limits, the env's reward) against verl's
``server_manager.generate`` — vLLM, SGLang or the ``srt`` backend — under one request id, so verl's sticky
routing keeps a trajectory on one replica. With the ``srt`` backend the prompt key also travels with each
call, so the affinity router and the replica's prompt trees see GRPO siblings as one prompt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.tools.base_tool import BaseTool

from ...agent.controller import MultiTurnController
from ...agent.env import ToolResult
from ...agent.rewards import retool_turn_shaped_reward
from ...agent.trajectory import Trajectory
from ...config import EnvConfig, RewardConfig, SamplingConfig
from ...config.tasks import Task
from ...engine import RequestOutput, SamplingParams
from ...models import end_token_ids
from .wire import from_token_output, to_verl_sampling

SCORED = ("done", "max_turns")  # finish reasons after which the env has scored the trajectory


class ServerTurnEngine:
    """The controller's TurnEngine over verl's ``server_manager`` (an ``LLMServerClient``)."""

    def __init__(self, server_manager: Any, send_prompt_key: bool = False):
        self.server_manager = server_manager
        self.send_prompt_key = send_prompt_key

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        prompt_key: Hashable | None = None,
    ) -> RequestOutput:
        extra = {"prompt_key": str(prompt_key)} if self.send_prompt_key and prompt_key is not None else {}
        try:
            out = await self.server_manager.generate(
                request_id,
                prompt_ids=list(prompt_ids),
                sampling_params=to_verl_sampling(params or SamplingParams()),
                **extra,
            )
        except Exception as exc:  # noqa: BLE001 - a failed server call ends this trajectory, not the batch
            return RequestOutput(request_id, [], [], "error", error=f"server call failed: {type(exc).__name__}: {exc}")
        return from_token_output(request_id, out)

    def release(self, request_id: str) -> None:
        """Nothing to send: verl's client has no release call (the srt server evicts finished trajectories)."""

    def idle_capacity(self) -> int:
        return 0


class VerlTool:
    """A verl ``BaseTool`` as an srt-agent Tool: create, execute and release on verl's event loop."""

    def __init__(self, tool: BaseTool, loop: asyncio.AbstractEventLoop):
        self.tool, self.loop = tool, loop
        self.name = tool.name
        self.schema = tool.tool_schema.model_dump(exclude_none=True)

    def __call__(self, arguments: dict) -> ToolResult:
        return asyncio.run_coroutine_threadsafe(self._run(arguments), self.loop).result()

    async def _run(self, arguments: dict) -> ToolResult:
        instance_id, _ = await self.tool.create()
        try:
            response, _, metrics = await self.tool.execute(instance_id, arguments)
        finally:
            await self.tool.release(instance_id)
        status = metrics.get("status", "ok") if isinstance(metrics, dict) else "ok"
        truncated = bool(metrics.get("truncated", False)) if isinstance(metrics, dict) else False
        return ToolResult(response.text or "", status, truncated)


@register("srt_retool")
class ReToolAgentLoop(AgentLoopBase):
    """ReTool episodes (or any srt-agent Env) inside verl's agent-loop workers.

    YAML options (beside ``name`` and ``_target_``): ``env`` (dotted Env class, default ReToolEnv),
    ``env_options``, ``max_turns`` (model turns), ``max_tokens_per_turn`` (default: the response length),
    ``reward`` (a RewardConfig mapping), ``env_reward`` (default true: the env's reward becomes
    ``reward_score``; false leaves scoring to verl's reward function), ``turn_shaping`` (ReTool's shaping of
    wrong answers on top of the env's reward; needs ``reward.incorrect < 0`` to act). Tools are verl's, from
    ``rollout.multi_turn.tool_config_path``, called by their schema name.
    """

    def __init__(
        self,
        *args: Any,
        tools: Any = None,
        env: str = "srt_agent.agent.retool.ReToolEnv",
        env_options: dict | None = None,
        max_turns: int = 4,
        max_tokens_per_turn: int | None = None,
        reward: dict | None = None,
        env_reward: bool = True,
        turn_shaping: bool = False,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        response_length = self.rollout_config.response_length
        self.env_config = EnvConfig(
            name="verl",
            env=env,
            env_options=dict(env_options or {}),
            max_turns=max_turns,
            max_tokens_per_turn=max_tokens_per_turn or response_length,
            max_response_tokens=response_length,
            reward=RewardConfig.model_validate(dict(reward or {})),
        )
        self.env_class = self.env_config.env_class()
        self.verl_tools = list(getattr(tools, "tools", tools) or [])
        self.env_reward = env_reward
        self.turn_shaping = turn_shaping

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        penalty = sampling_params.get("repetition_penalty", 1.0)
        if penalty not in (None, 1.0):
            raise ValueError(f"srt_retool does not support repetition_penalty={penalty}")
        sampling = SamplingConfig(
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=max(int(sampling_params.get("top_k", -1)), 0),
            seed=None,
        )
        controller = MultiTurnController(
            engine=ServerTurnEngine(self.server_manager, send_prompt_key=self.rollout_config.name == "srt"),
            tokenizer=self.tokenizer,
            config=self.env_config.model_copy(update={"sampling": sampling}),
            env_class=self.env_class,
            tools={tool.name: VerlTool(tool, asyncio.get_running_loop()) for tool in self.verl_tools},
            eos_token_ids=end_token_ids(self.tokenizer),
        )
        task = self._task(kwargs)
        start = time.perf_counter()
        traj = await controller.run_episode(task)
        wall_s = time.perf_counter() - start
        if len(traj.prompt_ids) > self.rollout_config.prompt_length:
            raise ValueError(
                f"prompt of {len(traj.prompt_ids)} tokens exceeds rollout.prompt_length={self.rollout_config.prompt_length}"
                " (set data.filter_overlong_prompts=True or raise the limit)"
            )
        return self._output(traj, wall_s)

    def _task(self, row: dict[str, Any]) -> Task:
        reward_model = row.get("reward_model") or {}
        return Task(
            prompt=[dict(m) for m in row["raw_prompt"]],
            ground_truth=str(reward_model.get("ground_truth", "")),
            data_source=str(row.get("data_source", "")),
            extra_info=dict(row.get("extra_info") or {}),
        )

    def _output(self, traj: Trajectory, wall_s: float) -> AgentLoopOutput:
        limit = self.rollout_config.response_length
        reward_score = None
        if self.env_reward:
            reward_score = traj.reward if traj.finish_reason in SCORED else self.env_config.reward.incorrect
            if self.turn_shaping:
                reward_score = retool_turn_shaped_reward(reward_score, traj.chat_turns)
        statuses: dict[str, int] = {}
        for call in traj.tool_calls:
            statuses[call.status] = statuses.get(call.status, 0) + 1
        return AgentLoopOutput(
            prompt_ids=traj.prompt_ids,
            response_ids=traj.response_ids[:limit],
            response_mask=traj.response_mask[:limit],
            response_logprobs=traj.response_logprobs[:limit],
            reward_score=reward_score,
            num_turns=traj.chat_turns,
            metrics=AgentLoopMetrics(
                generate_sequences=max(wall_s - traj.tool_time_s, 0.0), tool_calls=traj.tool_time_s
            ),
            extra_fields={
                "turn_scores": [],
                "tool_rewards": [],
                "srt_finish_reason": traj.finish_reason,
                "srt_error": traj.error,
                "srt_tool_statuses": statuses,
                "srt_forwards": traj.forwards,
                "srt_draft_proposed": traj.draft_proposed,
                "srt_draft_accepted": traj.draft_accepted,
            },
        )

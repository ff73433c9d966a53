"""The multi-turn controller: many episodes in flight against one AsyncEngine.

Per episode: render the env's opening messages, generate until a stop string / end of turn, let the env
react (tool calls run in worker threads, so the engine keeps decoding the other episodes meanwhile), insert
its observation as forced tokens (``response_mask = 0``) and continue the same engine request with the full
token list, so the engine reuses the KV cache and adds the forced tokens to the prompt's tree. Every failure
(engine error, crashing env, over-long observation, a tool fault such as an overloaded sandbox) ends its own
episode cleanly as an "error" (left out of the update, counted) and nothing else.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import EnvConfig
from ..config.tasks import Task
from ..drafting.trees.keys import prompt_key
from ..engine.interfaces import TurnEngine
from .chat import render_prompt, user_turn_text
from .env import Env, StepResult, Tool
from .trajectory import Trajectory

if TYPE_CHECKING:
    from srt_agent.engine import SamplingParams


@dataclass
class ToolWaitStats:
    """How long episodes waited on their environment (tools) and how idle the engine was meanwhile.

    ``idle_slot_s`` integrates the engine's idle capacity (free batch slots) over those waits: capacity that
    run-ahead generation can fill.
    """

    waits: int = 0
    wait_s: float = 0.0
    idle_slot_s: float = 0.0

    def add(self, seconds: float, idle_before: float, idle_after: float) -> None:
        self.waits += 1
        self.wait_s += seconds
        self.idle_slot_s += seconds * (idle_before + idle_after) / 2


def trajectory_seed(seed: int | None, task_index: int, sample_index: int) -> int | None:
    """A distinct, reproducible sampling seed per (task, sample); None keeps sampling unseeded."""
    if seed is None:
        return None
    return random.Random(f"{seed}/{task_index}/{sample_index}").getrandbits(31)


@dataclass
class MultiTurnController:
    """Runs episodes of `env_class` with `engine` under the limits of `config`.

    Each episode gets its own env instance, built as ``env_class(task, tools, **config.env_options)``, plus
    ``reward=config.reward`` when the class takes a ``reward`` argument (as :class:`ReToolEnv` does).
    """

    engine: TurnEngine
    tokenizer: object
    config: EnvConfig
    env_class: type[Env]
    tools: Mapping[str, Tool] = field(default_factory=dict)
    eos_token_ids: Sequence[int] = ()
    waits: ToolWaitStats = field(default_factory=ToolWaitStats)

    def make_env(self, task: Task) -> Env:
        options = dict(self.config.env_options)
        if "reward" in inspect.signature(self.env_class).parameters:
            options.setdefault("reward", self.config.reward)
        env = self.env_class(task, self.tools, **options)
        env.tool_timeout_s = self.config.tool_timeout_s
        return env

    def _params(self, env: Env, max_tokens: int, seed: int | None) -> SamplingParams:
        from srt_agent.engine import SamplingParams

        s = self.config.sampling
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_tokens=max_tokens,
            seed=seed,
            stop=list(env.stop),
            stop_token_ids=list(self.eos_token_ids),
            include_stop_str_in_output=True,
        )

    def opening(self, task: Task) -> tuple[list[int], SamplingParams]:
        """The tokens an episode of `task` first generates from (the rendered prompt and any forced
        response prefix) and how its turns are sampled (unseeded)."""
        env = self.make_env(task)
        ids = self._encode(render_prompt(self.tokenizer, env.initial_messages()))
        prefix = env.response_prefix()
        return ids + (self._encode(prefix) if prefix else []), self._params(env, self.config.max_tokens_per_turn, None)

    def _idle(self) -> float:
        return float(self.engine.idle_capacity())

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _observation_ids(self, result: StepResult, last_tokens: list[int]) -> list[int]:
        if result.role == "inline":
            return self._encode(result.observation)
        closed = last_tokens[-1:] if last_tokens and last_tokens[-1] in self.eos_token_ids else []
        closed_text = self.tokenizer.decode(closed) if closed else None
        return self._encode(user_turn_text(self.tokenizer, result.observation, closed_text))

    async def run_episode(
        self, task: Task, task_index: int = 0, sample_index: int = 0, seed: int | None = None
    ) -> Trajectory:
        """One episode of `task`; never raises for a failing engine call, env or tool.

        Its sampling seed derives from `seed` (default: the config's) and the task and sample indices.
        """
        start = time.perf_counter()
        traj = Trajectory(
            request_id=f"{self.config.name}-{task_index}-{sample_index}-{uuid.uuid4().hex[:8]}",
            task_index=task_index,
            sample_index=sample_index,
            prompt_ids=[],
            ground_truth=task.ground_truth,
            data_source=task.data_source,
        )
        env: Env | None = None
        try:
            env = self.make_env(task)
            traj.prompt = env.initial_messages()
            traj.messages = [dict(m) for m in traj.prompt]
            traj.prompt_ids = self._encode(render_prompt(self.tokenizer, traj.prompt))
            base = self.config.sampling.seed if seed is None else seed
            traj.seed = trajectory_seed(base, task_index, sample_index)
            await self._episode(env, task, traj, traj.seed)
        except Exception as exc:  # noqa: BLE001 - isolation: one broken episode never stops the batch
            traj.finish_reason, traj.error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            if traj.num_turns:  # the engine has seen the request
                try:
                    self.engine.release(traj.request_id)
                except Exception as exc:  # noqa: BLE001 - a failed release is recorded, not raised
                    traj.error = traj.error or f"release failed: {type(exc).__name__}: {exc}"
            if env is not None:
                traj.correct = env.correct
                traj.tool_calls = list(env.tool_calls)
                traj.tool_time_s = sum(call.wall_s for call in env.tool_calls)
            traj.wall_s = time.perf_counter() - start
        return traj

    async def run(
        self,
        tasks: Sequence[Task],
        n_samples: int | None = None,
        on_done: Callable[[Trajectory], None] | None = None,
        seed: int | None = None,
    ) -> list[Trajectory]:
        """`n_samples` episodes per task (default: the config's), all in flight at once up to `max_concurrent`.

        Trajectories come back ordered by (task, sample); `on_done` is called as each one finishes. `seed`
        overrides the config's sampling seed (an RL step draws a new one per step).
        """
        n_samples = n_samples or self.config.n_samples
        limit = asyncio.Semaphore(self.config.max_concurrent or len(tasks) * n_samples or 1)

        async def one(task_index: int, sample_index: int) -> Trajectory:
            async with limit:
                traj = await self.run_episode(tasks[task_index], task_index, sample_index, seed)
            if on_done is not None:
                on_done(traj)
            return traj

        jobs = [one(t, s) for t in range(len(tasks)) for s in range(n_samples)]
        return list(await asyncio.gather(*jobs))

    async def _episode(self, env: Env, task: Task, traj: Trajectory, seed: int | None) -> None:
        cfg = self.config
        assistant: dict | None = None
        pending = env.response_prefix()  # forced text that opens the response, seen by the first step
        if pending:
            traj.append(self._encode(pending))
            assistant = {"role": "assistant", "content": pending}
            traj.messages.append(assistant)
        key = traj.prompt_key = prompt_key(traj.prompt_ids + traj.response_ids)  # as every tree holder keys it
        for turn in range(cfg.max_turns):
            budget = cfg.max_response_tokens - len(traj.response_ids)
            if budget <= 0:
                traj.finish_reason = "length"
                return
            params = self._params(env, min(cfg.max_tokens_per_turn, budget), seed)
            traj.num_turns = turn + 1
            out = await self.engine.generate(
                traj.request_id, traj.prompt_ids + traj.response_ids, params, prompt_key=key
            )
            traj.count(out.metrics)
            traj.append(list(out.token_ids), list(out.logprobs))
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                traj.messages.append(assistant)
            assistant["content"] += text
            if out.finish_reason == "error" or out.error:
                traj.finish_reason, traj.error = "error", out.error or "engine error"
                return
            env.turn = turn
            final = turn == cfg.max_turns - 1
            idle_before, waited, calls_before = self._idle(), time.perf_counter(), len(env.tool_calls)
            result = await env.step(pending + text, final)
            pending = ""
            if len(env.tool_calls) > calls_before:
                self.waits.add(time.perf_counter() - waited, idle_before, self._idle())
            faults = [call for call in env.tool_calls[calls_before:] if call.fault]
            if faults:  # the tool failed, not the model: the rollout says nothing and is not trained on
                traj.finish_reason = "error"
                traj.error = f"tool fault ({faults[0].name}, {faults[0].status}): {faults[0].output[-300:]}"
                return
            traj.reward += result.reward
            if result.done:
                traj.finish_reason = "done"
                return
            if out.finish_reason == "context":
                traj.finish_reason = "context"
                return
            if final:
                traj.finish_reason = "max_turns"
                return
            if result.observation is None:
                continue
            forced = self._observation_ids(result, list(out.token_ids))
            if len(forced) >= cfg.max_response_tokens - len(traj.response_ids):
                traj.finish_reason = "length"
                return
            traj.append(forced)
            traj.observations += 1
            if result.role == "inline":
                assistant["content"] += result.observation
            else:
                traj.messages.append({"role": "user", "content": result.observation})
                assistant = None

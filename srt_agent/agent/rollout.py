"""Rollouts from an env config: build model, engine, tools and controller; run; summarize; write JSONL."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..config import EnvConfig
from ..config.tasks import Task
from .controller import MultiTurnController, ToolWaitStats
from .toolconfig import load_tools
from .trajectory import Trajectory


@dataclass
class RolloutSummary:
    """Aggregate figures of one rollout run."""

    trajectories: int
    wall_s: float
    mean_reward: float
    mean_turns: float
    model_tokens: int
    forced_tokens: int
    forwards: int
    tokens_per_forward: float
    draft_proposed: int
    draft_accepted: int
    acceptance: float
    tool_calls: int
    tool_time_s: float
    tool_wait_s: float
    idle_slot_s_during_tool_waits: float
    prefill_computed: int = 0  # prompt and tool-output tokens computed
    prefill_reused: int = 0  # prompt tokens whose KV was copied from a shared prefix
    prefill_hit_rate: float = 0.0  # reused / (computed + reused)
    prefix_blocks_in_use: int | None = None  # blocks in the engine's prefix cache at the end (local engine)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    tool_statuses: dict[str, int] = field(default_factory=dict)


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def summarize(trajectories: Sequence[Trajectory], waits: ToolWaitStats, wall_s: float) -> RolloutSummary:
    """Reward, turns, tokens per forward, speculation and tool figures over `trajectories`."""
    n = max(len(trajectories), 1)
    model_tokens = sum(t.model_tokens for t in trajectories)
    forwards = sum(t.forwards for t in trajectories)
    proposed = sum(t.draft_proposed for t in trajectories)
    accepted = sum(t.draft_accepted for t in trajectories)
    calls = [c for t in trajectories for c in t.tool_calls]
    computed = sum(t.prefill_tokens for t in trajectories)
    reused = sum(t.prefill_reused for t in trajectories)
    return RolloutSummary(
        trajectories=len(trajectories),
        wall_s=wall_s,
        mean_reward=sum(t.reward for t in trajectories) / n,
        mean_turns=sum(t.num_turns for t in trajectories) / n,
        model_tokens=model_tokens,
        forced_tokens=sum(len(t.response_ids) for t in trajectories) - model_tokens,
        forwards=forwards,
        tokens_per_forward=model_tokens / forwards if forwards else 0.0,
        draft_proposed=proposed,
        draft_accepted=accepted,
        acceptance=accepted / proposed if proposed else 0.0,
        tool_calls=len(calls),
        tool_time_s=sum(c.wall_s for c in calls),
        tool_wait_s=waits.wait_s,
        idle_slot_s_during_tool_waits=waits.idle_slot_s,
        prefill_computed=computed,
        prefill_reused=reused,
        prefill_hit_rate=reused / (computed + reused) if computed + reused else 0.0,
        finish_reasons=_count(t.finish_reason for t in trajectories),
        tool_statuses=_count(c.status for c in calls),
    )


def write_jsonl(trajectories: Sequence[Trajectory], path: str | Path) -> None:
    """One JSON object per trajectory (folders created as needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for traj in trajectories:
            f.write(json.dumps(traj.to_json()) + "\n")


def build_controller(
    config: EnvConfig,
    model: str | None = None,
    loaded=None,
    env_class: type | None = None,
    drafter: str | None = None,
    tools: dict | None = None,
    run_ahead=None,
    log: Callable[[str], None] | None = None,
    backend=None,
) -> MultiTurnController:
    """Load the model (`loaded`, else `model`, else the config's), start the rollout backend the config's
    ``engine.backend`` names (see :func:`srt_agent.backends.make_backend`), load the tools.

    `env_class` overrides the config's ``env`` (for classes defined in a script), `drafter` the engine's
    drafter, `tools` the config's tool file (already built tools, shared between controllers),
    `run_ahead` gives the engine run-ahead options (`RunAheadOptions`; windows are opened by the
    trainer), `log` gets a line on which backend runs and why, `backend` is one already started (e.g. a
    view of another controller's engine) to use instead. Close the backend with ``controller.engine.close()``
    when done.
    """
    from srt_agent.backends import make_backend
    from srt_agent.models import load_model

    if tools is None:
        tools = load_tools(config.tools, config.interpreter) if config.tools is not None else {}
    env_class = env_class or config.env_class()
    loaded = loaded or load_model(model or config.model, device=config.engine.device)
    if backend is None:
        backend = make_backend(config, loaded, drafter, run_ahead, log)
    elif log is not None:
        log(f"backend for {drafter or config.engine.drafter}: {backend.describe()}")
    return MultiTurnController(
        engine=backend,
        tokenizer=loaded.tokenizer,
        config=config,
        env_class=env_class,
        tools=tools,
        eos_token_ids=list(loaded.eos_token_ids),
    )


def run_rollouts(
    controller: MultiTurnController,
    tasks: Sequence[Task],
    n_samples: int | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
    seed: int | None = None,
) -> tuple[list[Trajectory], RolloutSummary]:
    """Run every task `n_samples` times (blocking) and summarize; `seed` overrides the config's."""
    start = time.perf_counter()
    waits_before = dataclasses.replace(controller.waits)
    trajectories = asyncio.run(controller.run(tasks, n_samples, on_done, seed))
    waits = ToolWaitStats(
        controller.waits.waits - waits_before.waits,
        controller.waits.wait_s - waits_before.wait_s,
        controller.waits.idle_slot_s - waits_before.idle_slot_s,
    )
    summary = summarize(trajectories, waits, time.perf_counter() - start)
    from srt_agent.backends import RolloutBackend

    if isinstance(controller.engine, RolloutBackend):  # not a scripted generator or another server's adapter
        try:
            summary.prefix_blocks_in_use = controller.engine.prefix_blocks_in_use()
        except Exception:  # noqa: BLE001 - a closed engine: the figure is left out, not the rollouts
            pass
    return trajectories, summary

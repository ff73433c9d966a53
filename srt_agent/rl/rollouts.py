"""The rollout side of training: one engine and controller per drafter, all on one inference model.

The first drafter's rollouts feed training; the others (``--compare``) regenerate the same step from
the same weights and seeds for timing. Every engine keeps its drafter's trees across steps and
weight updates: that memory of earlier policy versions is what SRT drafts from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..agent.config import EnvConfig
from ..agent.controller import MultiTurnController
from ..agent.datasets import Task
from ..agent.rollout import RolloutSummary, build_controller, run_rollouts
from ..agent.trajectory import Trajectory
from ..cache import RolloutCache
from ..models import LoadedModel


@dataclass
class RolloutRun:
    """One drafter's rollouts of one batch of tasks."""

    drafter: str
    trajectories: list[Trajectory]
    summary: RolloutSummary

    @property
    def wall_s(self) -> float:
        return self.summary.wall_s


class PolicyRollouts:
    """Engines (one per drafter, sharing `loaded`'s module) that generate a step's multi-turn rollouts."""

    def __init__(self, config: EnvConfig, loaded: LoadedModel, tools: dict, drafters: Sequence[str]):
        if not drafters:
            raise ValueError("need at least one drafter")
        if len(set(drafters)) != len(drafters):
            raise ValueError(f"drafters listed twice: {list(drafters)}")
        self.loaded = loaded
        self.controllers: dict[str, MultiTurnController] = {}
        try:
            for name in drafters:
                self.controllers[name] = build_controller(config, loaded=loaded, drafter=name, tools=tools)
        except BaseException:
            self.close()
            raise
        self.main = drafters[0]

    @property
    def drafters(self) -> list[str]:
        return list(self.controllers)

    def run(
        self,
        drafter: str,
        tasks: Sequence[Task],
        n_samples: int,
        seed: int,
        on_done: Callable[[Trajectory], None] | None = None,
    ) -> RolloutRun:
        """`n_samples` multi-turn rollouts of every task with `drafter`'s engine, seeded by `seed`."""
        trajectories, summary = run_rollouts(self.controllers[drafter], tasks, n_samples, on_done, seed)
        return RolloutRun(drafter, trajectories, summary)

    def update_weights(self, weights: dict[str, torch.Tensor]) -> float:
        """Load new policy weights into every engine (in memory, on each engine's thread); returns seconds."""
        start = time.perf_counter()
        for controller in self.controllers.values():
            controller.engine.call(lambda engine: engine.update_weights(weights)).result()
        return time.perf_counter() - start

    def end_step(self) -> None:
        """A policy step ended: tell every drafter (the history drafter publishes the step's rollouts)."""
        for controller in self.controllers.values():
            controller.engine.call(lambda engine: engine.end_step()).result()

    def caches(self) -> dict[str, RolloutCache]:
        """The drafters' rollout trees that can be saved (per drafter name)."""
        out = {}
        for name, controller in self.controllers.items():
            cache = getattr(controller.engine.engine.drafter, "cache", None)
            if isinstance(cache, RolloutCache):
                out[name] = cache
        return out

    def restore_cache(self, drafter: str, cache: RolloutCache) -> None:
        """Put saved trees back into a drafter (on resume)."""
        target = self.controllers[drafter].engine.engine.drafter
        if not isinstance(getattr(target, "cache", None), RolloutCache):
            raise ValueError(f"drafter {drafter!r} keeps no rollout cache")
        self.controllers[drafter].engine.call(lambda engine: setattr(engine.drafter, "cache", cache)).result()

    def engine_stats(self, drafter: str) -> dict:
        return self.controllers[drafter].engine.call(lambda engine: engine.stats()).result()

    def close(self) -> None:
        for controller in self.controllers.values():
            controller.engine.close()

"""The rollout side of training: one engine and controller per variant, all on one inference model.

A variant is a drafter with or without run-ahead. The first variant's rollouts feed training; the
others (``--compare``, the ablation's stages) regenerate the same step from the same weights and seeds
for timing. A variant without speculation runs on an earlier SRT variant's vLLM engine where their engine
settings agree (:func:`undrafted_owner`): its requests get no drafts and leave the trees alone, and each
run on the shared engine starts with an empty prefix cache, as it would on an engine of its own. Every engine keeps its drafter's trees across steps and weight updates: that memory of
earlier policy versions is what SRT drafts from. A variant with run-ahead gets a window per run: the
batch being rolled out and the prompts that come next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..agent.controller import MultiTurnController
from ..agent.rollout import RolloutSummary, build_controller
from ..agent.trajectory import Trajectory
from ..backends import RolloutBackend, RunAheadControl
from ..config import EnvConfig
from ..config.tasks import Task
from ..drafting import RolloutCache, runs_as_proposer
from ..drafting.trees.keys import prompt_key
from ..engine.options import RunAheadOptions
from ..engine.run_ahead import WindowPrompt
from ..models import LoadedModel


@dataclass(frozen=True)
class RolloutVariant:
    """An engine configuration that generates rollouts: a name, a drafter, run-ahead options or None, the
    rollout backend (None: the env config's ``engine.backend``) and, for vLLM, whether it samples exactly
    (None: the env config's ``engine.vllm.exact_sampling``; False: vLLM's own sampler); `own_engine`: never
    run on another variant's engine (benchmarks that time vLLM without speculation as users run it)."""

    name: str
    drafter: str
    run_ahead: RunAheadOptions | None = None
    backend: str | None = None
    exact_sampling: bool | None = None
    own_engine: bool = False


def variant_config(config: EnvConfig, variant: RolloutVariant) -> EnvConfig:
    """The env config with `variant`'s backend and exact-sampling choice where it makes one."""
    engine = config.engine
    if variant.backend is not None:
        engine = engine.model_copy(update={"backend": variant.backend})
    if variant.exact_sampling is not None:
        engine = engine.model_copy(
            update={"vllm": engine.vllm.model_copy(update={"exact_sampling": variant.exact_sampling})}
        )
    return config if engine is config.engine else config.model_copy(update={"engine": engine})


def undrafted_owner(config: EnvConfig, variants: Sequence[RolloutVariant], index: int) -> int | None:
    """The earlier variant whose engine variant `index` can run on without speculation: it drafts nothing
    (``none``, no run-ahead) and an SRT variant before it has the same engine settings. None otherwise."""
    variant = variants[index]
    if variant.drafter != "none" or variant.run_ahead is not None or variant.own_engine:
        return None
    engine = variant_config(config, variant).engine
    for j, other in enumerate(variants[:index]):
        if runs_as_proposer(other.drafter) and variant_config(config, other).engine == engine:
            return j
    return None


@dataclass
class RolloutRun:
    """One variant's rollouts of one batch of tasks (and what its run-ahead did meanwhile)."""

    drafter: str
    trajectories: list[Trajectory]
    summary: RolloutSummary
    tasks: list[Task] = field(default_factory=list)  # the batch (a trajectory's task_index points into it)
    run_ahead: dict | None = None  # what run-ahead did meanwhile (RunAheadStats figures)
    run_ahead_written: list = field(default_factory=list)  # (prompt key, context, tokens) it put into the trees
    cost: dict = field(default_factory=dict)  # the engine's step-cost table when the run began
    cost_after: dict = field(default_factory=dict)  # … and when it ended (what the run measured, for validation)
    settings: dict = field(default_factory=dict)  # the engine's batch, draft and tree settings
    tail: dict = field(default_factory=dict)  # its steps' time and tokens by sequences running (TailStats)
    speculation: dict = field(default_factory=dict)  # what drafting cost meanwhile (the backend's "speculation")
    bookkeeping_s: float = 0.0  # the engine's host seconds beside its forwards and drafting (where counted)

    @property
    def wall_s(self) -> float:
        return self.summary.wall_s


class PolicyRollouts:
    """Engines (one per variant, sharing `loaded`'s module) that generate a step's multi-turn rollouts.

    `variants` are `RolloutVariant`s or drafter names (a drafter without run-ahead).
    """

    def __init__(
        self,
        config: EnvConfig,
        loaded: LoadedModel,
        tools: dict,
        variants: Sequence[str | RolloutVariant],
        log: Callable[[str], None] | None = None,
    ):
        variants = [v if isinstance(v, RolloutVariant) else RolloutVariant(v, v) for v in variants]
        if not variants:
            raise ValueError("need at least one drafter")
        names = [v.name for v in variants]
        if len(set(names)) != len(names):
            raise ValueError(f"drafters listed twice: {names}")
        self.loaded = loaded
        self.variants = {v.name: v for v in variants}
        self.controllers: dict[str, MultiTurnController] = {}
        self.shared: set[str] = set()  # variants whose engine another variant runs on too
        try:
            for i, v in enumerate(variants):
                owner = undrafted_owner(config, variants, i)
                view = None
                if owner is not None:
                    view = self.backend(names[owner]).undrafted()
                if view is not None:
                    self.shared |= {v.name, names[owner]}
                self.controllers[v.name] = build_controller(
                    variant_config(config, v),
                    loaded=loaded,
                    drafter=v.drafter,
                    tools=tools,
                    run_ahead=v.run_ahead,
                    log=log,
                    backend=view,
                )
        except BaseException:
            self.close()
            raise
        self.main = names[0]

    @property
    def drafters(self) -> list[str]:
        return list(self.controllers)

    @property
    def serves_module(self) -> bool:
        """Whether one of the backends runs on `loaded`'s module (our engine does; vLLM loads its own copy)."""
        return any(self.backend(name).capabilities.serves_module for name in self.controllers)

    def backend(self, variant: str) -> RolloutBackend:
        """The rollout backend of `variant` (a variant's name)."""
        return self.controllers[variant].engine

    def run(
        self,
        variant: str,
        tasks: Sequence[Task],
        n_samples: int,
        seed: int,
        on_done: Callable[[Trajectory], None] | None = None,
        upcoming: Sequence[Task] | None = None,
    ) -> RolloutRun:
        """`n_samples` multi-turn rollouts of every task with `variant`'s engine, seeded by `seed`.

        Given `upcoming` (and run-ahead options), the variant runs ahead meanwhile: its window holds
        `tasks` (while their groups run) and `upcoming`."""
        ahead = self.variants[variant].run_ahead is not None and upcoming is not None
        if variant in self.shared:
            self.backend(variant).forget_prefixes()
        cost, settings = self.backend(variant).step_costs()
        stats_before = self.engine_stats(variant)
        if ahead:
            before = self.run_ahead_stats(variant)
            self.open_run_ahead(variant, tasks, upcoming)
        try:
            controller = self.controllers[variant]
            source = controller.config.episode_source()
            trajectories, summary = source.run(controller, self.loaded, tasks, n_samples, seed, on_done)
        finally:
            written = self.close_run_ahead(variant) if ahead else []
        run = RolloutRun(
            variant, trajectories, summary, list(tasks), run_ahead_written=written, cost=cost, settings=settings
        )
        if ahead:
            run.run_ahead = stats_delta(before, self.run_ahead_stats(variant))
        stats_after = self.engine_stats(variant)
        run.cost_after = self.backend(variant).step_costs()[0]
        for key in ("tail", "speculation"):
            if key in stats_before and key in stats_after:
                setattr(run, key, stats_delta(stats_before[key], stats_after[key]))
        run.bookkeeping_s = stats_after.get("bookkeeping_s", 0.0) - stats_before.get("bookkeeping_s", 0.0)
        return run

    def open_run_ahead(
        self, variant: str, current: Sequence[Task], upcoming: Sequence[Task], phase: str = "rollout"
    ) -> None:
        """Open `variant`'s run-ahead window: `current` tasks (served while their groups run) and
        `upcoming` ones (a prompt in both counts as upcoming)."""
        controller = self.controllers[variant]
        ahead = {t.key for t in upcoming}
        prompts = [window_prompt(controller, t, upcoming=False) for t in current if t.key not in ahead]
        prompts += [window_prompt(controller, t, upcoming=True) for t in {t.key: t for t in upcoming}.values()]
        self._run_ahead(variant).open(prompts, phase)

    def close_run_ahead(self, variant: str) -> list[tuple]:
        """Close the window; returns what it wrote into the trees: (prompt key, context, tokens) per sequence."""
        return self._run_ahead(variant).close()

    def run_ahead_stats(self, variant: str) -> dict:
        return self._run_ahead(variant).stats()

    def _run_ahead(self, variant: str) -> RunAheadControl:
        control = self.backend(variant).run_ahead
        if control is None:
            raise ValueError(f"variant {variant!r} runs no run-ahead (its backend: {self.backend(variant).name})")
        return control

    def update_weights(self, weights: dict[str, torch.Tensor], module: bool = True) -> float:
        """Load new policy weights into every backend (in memory, in place); returns seconds.

        `loaded`'s module gets them too: our engine runs on it, and a new `Policy` starts from it (after
        the cold start), so it must hold the rollout policy whichever backend serves the rollouts. Not with
        ``module=False``: the module is the policy that made them (its float32 masters would be rounded to
        the engine's dtype)."""
        start = time.perf_counter()
        for name in self.controllers:
            self.backend(name).update_weights(weights)
        if module and not self.serves_module:
            with torch.no_grad():
                self.loaded.model.load_state_dict(weights, strict=True)
        return time.perf_counter() - start

    def end_step(self) -> None:
        """A policy step ended: tell every drafter (the history drafter publishes the step's rollouts)."""
        for name in self.controllers:
            self.backend(name).end_step()

    def caches(self) -> dict[str, RolloutCache]:
        """The drafters' rollout trees that can be saved (per drafter name)."""
        trees = {name: self.backend(name).trees() for name in self.controllers}
        return {name: cache for name, cache in trees.items() if cache is not None}

    def restore_cache(self, variant: str, cache: RolloutCache) -> None:
        """Put saved trees back into a variant (on resume)."""
        self.backend(variant).restore_trees(cache)

    def engine_stats(self, variant: str) -> dict:
        return self.backend(variant).stats()

    def close(self) -> None:
        for controller in self.controllers.values():
            controller.engine.close()


def window_prompt(controller: MultiTurnController, task: Task, upcoming: bool = True) -> WindowPrompt:
    """`task`'s opening for a run-ahead window, under the prompt key its rollouts' trees have."""
    ids, params = controller.opening(task)
    return WindowPrompt(prompt_key(ids), ids, params, upcoming=upcoming)


def stats_delta(before: dict, after: dict) -> dict:
    """`after - before` for every number (nested dicts too; what `before` lacks counts as zero)."""
    return {
        k: stats_delta(before.get(k, {}), v) if isinstance(v, dict) else v - before.get(k, 0) for k, v in after.items()
    }

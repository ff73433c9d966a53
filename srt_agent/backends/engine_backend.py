"""Our engine as a rollout backend: the AsyncEngine front plus the trainer's calls, each run on the
engine thread between steps (the exact reference: lossless, token for token where its numerics are
batch-invariant, `runner/numerics.py`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..drafting import RolloutCache, capabilities, drafter_capabilities, make_drafter
from ..engine import AsyncEngine, Engine, EngineOptions
from ..engine.run_ahead import WindowPrompt
from ..engine.stats import cost_table, engine_settings
from .base import Capabilities, Refusal, Registered


class EngineRunAhead:
    """Run-ahead windows of an engine, opened and closed on its thread."""

    def __init__(self, front: AsyncEngine):
        self.front = front

    def open(self, prompts: Sequence[WindowPrompt], phase: str = "rollout") -> None:
        self.front.call(lambda engine: engine.run_ahead.open(prompts, phase)).result()

    def close(self) -> list[tuple]:
        def close(engine: Engine) -> list[tuple]:
            engine.run_ahead.close()
            return engine.run_ahead.written

        return self.front.call(close).result()

    def stats(self) -> dict:
        return self.front.call(lambda engine: engine.run_ahead.stats.as_dict()).result()


class EngineBackend(AsyncEngine[Engine]):
    """:class:`~srt_agent.engine.AsyncEngine` over our :class:`~srt_agent.engine.Engine`, with the
    backend calls (`update_weights`, `end_step`, trees, stats) besides `generate`; `call` and `engine`
    stay available for whatever reaches the engine itself."""

    name = "engine"

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.drafter_name = engine.drafter.name if engine.drafter is not None else "none"
        self.run_ahead = EngineRunAhead(self) if engine.run_ahead is not None else None
        self.capabilities = Capabilities(
            device=str(engine.device),
            exact_sampling=True,
            trees=capabilities(engine.drafter).trees,
            run_ahead=self.run_ahead is not None,
            serves_module=True,
            batch_invariant=engine.runner.exact_attention,
        )

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.call(lambda engine: engine.update_weights(dict(weights))).result()

    def end_step(self) -> None:
        self.call(lambda engine: engine.end_step()).result()

    def stats(self) -> dict:
        return self.call(lambda engine: engine.stats()).result()

    def trees(self) -> RolloutCache | None:
        return self.engine.drafter.cache if self.capabilities.trees else None

    def restore_trees(self, cache: RolloutCache) -> None:
        if self.trees() is None:
            raise ValueError(f"drafter {self.drafter_name!r} keeps no rollout cache")
        self.call(lambda engine: setattr(engine.drafter, "cache", cache)).result()

    def step_costs(self) -> tuple[dict, dict]:
        return self.call(lambda engine: (cost_table(engine.cost_model), engine_settings(engine))).result()

    def prefix_blocks_in_use(self) -> int | None:
        return self.call(lambda engine: engine.stats().get("prefix_blocks_in_use", 0)).result(60)

    def undrafted(self) -> None:
        """None: a run without speculation starts an engine of its own."""
        return None

    def forget_prefixes(self) -> None:
        self.call(lambda engine: engine.forget_prefixes()).result()

    def describe(self) -> str:
        return f"our engine on {self.engine.device}"


def engine_backend(config, loaded, drafter: str | None = None, run_ahead=None) -> EngineBackend:
    """Our engine for env config `config` (its ``engine:`` section) on `loaded`'s model."""
    e = config.engine
    name = drafter or e.drafter
    engine = Engine(
        loaded,
        EngineOptions(
            drafter=make_drafter(name, **config.tree_budget().drafter_options(drafter_capabilities(name))),
            device=e.device,
            max_batch=e.max_batch,
            max_context=e.max_context,
            calibrate=e.calibrate,
            run_ahead=run_ahead,
            prefix_sharing=e.prefix_sharing,
            prefix_cache_tokens=e.prefix_cache_tokens,
            dtype=e.dtype,
            batch_invariant=e.batch_invariant,
        ),
    )
    return EngineBackend(engine)


def refusal(drafter: str, run_ahead: bool = False, loaded=None) -> Refusal | None:
    """None: our engine serves every drafter, with or without run-ahead, on every model it loads."""
    return None


REGISTERED = Registered(
    factory=engine_backend, refusal=refusal, chosen="our engine serves everything", serves_module=True
)

"""The rollout-backend seam: what the multi-turn controller and the trainer ask of a generation backend.

Token ids go in; token ids, each sampled token's log-probability and why the turn stopped come out
(:class:`~srt_agent.engine.RequestOutput`). A later turn of the same request passes the whole token list
so far, tool output included, as ids (forced tokens, never re-tokenized text). Between RL steps the
trainer loads new weights in place (`update_weights`) and closes the step (`end_step`); the drafter's
trees survive both and can be saved and restored. What a backend can do is declared (:class:`Capabilities`),
so callers ask it rather than what the backend is; features only some backends have (run-ahead, the
forward-cost table, the prefix block pool, a view without speculation) are `None` / empty where absent.

Backends are registered by name in ``srt_agent.backends`` (a :class:`Registered` each: how to start one and
why it cannot serve a run, a :class:`Refusal`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..engine.interfaces import TurnEngine

if TYPE_CHECKING:
    import torch

    from ..drafting import RolloutCache
    from ..engine.run_ahead import WindowPrompt


@dataclass(frozen=True)
class Capabilities:
    """What a started backend does, declared so that callers need not know which backend it is."""

    device: str  # where it runs ("cpu", "cuda:0")
    exact_sampling: bool  # a seeded request's tokens do not depend on the drafts (else: in distribution at T > 0)
    trees: bool  # its drafter keeps per-prompt trees (`trees()`, saved with checkpoints)
    run_ahead: bool  # it fills idle capacity with run-ahead windows (`run_ahead` is not None)
    serves_module: bool  # it runs on the loaded torch module itself (our engine), not on a copy of its own (vLLM)
    batch_invariant: bool = False  # its attention runs in float64: the trainer scores tokens the same way


@dataclass(frozen=True)
class Refusal:
    """Why a registered backend cannot serve a run: `error` is raised where the config names the backend,
    `reason` completes "engine.backend: auto, and …" where ``auto`` passes it over."""

    reason: str
    error: Exception


@dataclass(frozen=True)
class Registered:
    """A backend in the registry (``srt_agent.backends.REGISTRY``).

    `factory(config, loaded, drafter, run_ahead)` starts one for the env config on `loaded`'s model (run-ahead
    options or None); `refusal(drafter, run_ahead, loaded)` says why it cannot serve that run (`loaded` None:
    the model is not checked), None when it can; `chosen` completes "engine.backend: auto, and …" where ``auto``
    takes it. `serves_module` and `lends_undrafted` are known before one starts (for the memory plan): whether
    it runs on the loaded module itself, and whether a run without speculation can share an SRT engine of it
    (`undrafted()`)."""

    factory: Callable[[Any, Any, str, Any], RolloutBackend]
    refusal: Callable[[str, bool, Any], Refusal | None]
    chosen: str
    serves_module: bool
    lends_undrafted: bool = False


class RunAheadControl(Protocol):
    """Run-ahead windows of a backend that fills idle capacity (our engine, and vLLM with SRT as its proposer)."""

    def open(self, prompts: Sequence[WindowPrompt], phase: str) -> None: ...

    def close(self) -> list[tuple]:
        """Close the window; (prompt key, context, tokens) of every continuation it wrote into the trees."""

    def stats(self) -> dict: ...


@runtime_checkable
class RolloutBackend(TurnEngine, Protocol):
    """A generation backend for rollouts and training (see the module docstring): turns (`generate`,
    `release`, `idle_capacity`, as :class:`~srt_agent.engine.TurnEngine`), and what a trainer calls."""

    name: str  # its name in the registry ("engine", "vllm"): for logs and reports, never to branch on
    drafter_name: str
    capabilities: Capabilities
    run_ahead: RunAheadControl | None

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (names of the Hugging Face state dict) in place; the trees survive."""

    def end_step(self) -> None:
        """A policy step ended (a policy-version boundary for the drafter)."""

    def stats(self) -> dict:
        """Totals over the backend's lifetime (tokens, forwards, draft figures, and what else it counts)."""

    def trees(self) -> RolloutCache | None:
        """The drafter's per-prompt trees, to save with a checkpoint; None when it keeps none."""

    def restore_trees(self, cache: RolloutCache) -> None:
        """Put saved trees back (on resume); ValueError when the drafter keeps none."""

    def step_costs(self) -> tuple[dict, dict]:
        """The forward-cost table and the batch/draft settings a replay needs ({} where the backend has none)."""

    def prefix_blocks_in_use(self) -> int | None:
        """Blocks in our engine's prefix block pool now; None where the backend keeps no such pool."""

    def undrafted(self) -> RolloutBackend | None:
        """A backend that runs requests without speculation on this one's engine (no drafts, no trace in the
        trees; weights, steps and trees stay this one's), or None where the backend lends none."""

    def forget_prefixes(self) -> None:
        """Empty the prefix cache (nothing may run): a run that follows another on a shared engine starts as
        cold as on an engine of its own."""

    def describe(self) -> str:
        """One line: what runs where (for logs)."""

    def health(self) -> dict:
        """``status`` ("ready", "restarting", "failed", "closed") with the step failures and restarts so far."""

    def close(self) -> None: ...

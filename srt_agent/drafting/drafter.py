"""The interface every drafter implements, so the engine can switch between them by name, and the
capabilities a drafter declares beyond it."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .draft import Draft


@dataclass(frozen=True)
class DrafterCapabilities:
    """What a drafter offers beyond the `Drafter` protocol, declared as its class attribute
    ``capabilities`` so that the engine, the backends and the trainer read flags instead of probing.

    - ``trees``: it keeps per-prompt rollout trees in ``.cache`` (a `RolloutCache`): saved with
      checkpoints, shared between verl replicas, described in rollout traces;
    - ``run_ahead``: it takes run-ahead sequences (``start_run_ahead``) into those trees;
    - ``needs_logprobs``: ``add_tokens`` also takes the sampled tokens' log-probabilities;
    - ``lenient``: its drafts carry an old policy's log-probabilities and are accepted by the lenient
      rule with its ``lenience`` (not exactly on-policy);
    - ``model``: it runs a model bound to the engine's policy (`drafting.drafters.model_drafting.ModelDrafter`);
    - ``global_tree``: beside its prompt trees it keeps a global tree of responses across prompts;
    - ``drafts``: it proposes tokens at all (the plain-decoding baseline does not).

    A drafter with ``trees`` takes a ``max_bytes`` option (the budget of all it keeps), one with ``global_tree``
    also ``global_bytes`` (that tree's part of it): how a run's `TreeBudget` reaches it.
    """

    trees: bool = False
    run_ahead: bool = False
    needs_logprobs: bool = False
    lenient: bool = False
    model: bool = False
    global_tree: bool = False
    drafts: bool = True


NO_CAPABILITIES = DrafterCapabilities()


def capabilities(drafter: object) -> DrafterCapabilities:
    """The capabilities `drafter` declares (none for a drafter that declares none, or for no drafter)."""
    return getattr(drafter, "capabilities", NO_CAPABILITIES)


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft token trees for running requests.

    Lifecycle per request: ``start_request`` → any number of ``add_tokens`` (sampled or forced
    tokens, in order) and ``draft`` calls → ``stop_request``. ``end_step`` marks a policy-version
    boundary (an RL training step); drafters that only learn from finished steps use it. What a drafter
    can do beyond this it declares in ``capabilities`` (:class:`DrafterCapabilities`).
    """

    name: str

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None: ...

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None: ...

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft: ...

    def stop_request(self, request_id: Hashable) -> None: ...

    def end_step(self) -> None: ...

"""`HybridDrafter` (``srt+self``): the prompt's rollout tree where history exists, the policy's
quantized shadow where it does not.

Every step each sequence gets its SRT tree draft (free: a lookup). The engine's draft plan
(`model_drafting.plan_model_drafts`) then gives a self-drafted chain, in one batched pass per level,
to the sequences whose calibrated tree draft expects fewer accepted tokens than the chain would from
as many verified nodes (cold prompts, continuations that left the tree), and only when drafting pays
for its passes. Both drafters see every request's tokens, so the trees keep growing from every
rollout whichever drafter proposed its tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from ..draft import Draft
from ..drafter import DrafterCapabilities
from .model_drafting import DraftRequest
from .self_drafter import SelfDrafter
from .srt import SRTDrafter


class HybridDrafter:
    """SRT trees (``.tree``, whose ``.cache`` is the rollout cache) plus a self-drafter (``.model``)."""

    name = "srt+self"
    capabilities = DrafterCapabilities(trees=True, run_ahead=True, model=True, global_tree=True)

    def __init__(self, quantization: str = "auto", tree_width: int = 1, **tree_options) -> None:
        self.tree = SRTDrafter(**tree_options)
        self.model = SelfDrafter(quantization, tree_width)

    @property
    def pass_cost(self):
        """The self-drafter's pass-time model."""
        return self.model.pass_cost

    @pass_cost.setter
    def pass_cost(self, value) -> None:
        self.model.pass_cost = value

    @property
    def cache(self):
        """The rollout cache (saved in checkpoints like SRT's)."""
        return self.tree.cache

    @cache.setter
    def cache(self, value) -> None:
        self.tree.cache = value

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        self.tree.start_request(request_id, prompt_key, prompt_ids)
        try:
            self.model.start_request(request_id, prompt_key, prompt_ids)
        except ValueError:
            self.tree.stop_request(request_id)
            raise

    def start_run_ahead(self, request_id: Hashable, prompt_key: Hashable, context_ids: Sequence[int]) -> None:
        """A run-ahead sequence: into the trees as SRT stores it (the engine never drafts for it)."""
        self.tree.start_run_ahead(request_id, prompt_key, context_ids)
        self.model.start_request(request_id, prompt_key, context_ids)

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self.tree.add_tokens(request_id, token_ids)
        self.model.add_tokens(request_id, token_ids)

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        """The tree's draft (the model's comes from `draft_batch` where the plan wants it)."""
        return self.tree.draft(request_id, context, budget)

    def stop_request(self, request_id: Hashable) -> None:
        self.tree.stop_request(request_id)
        self.model.stop_request(request_id)

    def end_step(self) -> None:
        self.tree.end_step()
        self.model.end_step()

    def attach(
        self, model: torch.nn.Module, device: torch.device, max_batch: int, max_context: int, calibrate: bool = True
    ) -> None:
        self.model.attach(model, device, max_batch, max_context, calibrate)

    def rebuild(self) -> float:
        return self.model.rebuild()

    def draft_seconds(self, requests: list[DraftRequest], depth: int) -> float:
        return self.model.draft_seconds(requests, depth)

    def draft_batch(self, requests: list[DraftRequest], depth: int) -> list[Draft]:
        return self.model.draft_batch(requests, depth)

"""`SRTDrafter`: drafts from the prompt's rollout tree, fed online by every running rollout."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .draft import Draft
from .drafter import DrafterCapabilities
from .rollout_cache import RolloutCache


class SRTDrafter:
    """The Drafter over a `RolloutCache` (``.cache``), which outlives requests and weight updates.

    ``chain=True`` drafts a single path (the most frequent child at each step); ``min_prob`` drops
    draft nodes whose path probability falls below it.
    """

    name = "srt"
    capabilities = DrafterCapabilities(trees=True, run_ahead=True)

    def __init__(
        self, cache: RolloutCache | None = None, chain: bool = False, min_prob: float = 0.0, **cache_options
    ) -> None:
        if cache is not None and cache_options:
            raise ValueError(f"pass either a cache or cache options, not both: {sorted(cache_options)}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        self.cache = cache if cache is not None else RolloutCache(**cache_options)
        self.chain = chain
        self.min_prob = min_prob

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        self.cache.start_request(request_id, prompt_key, prompt_ids)

    def start_run_ahead(self, request_id: Hashable, prompt_key: Hashable, context_ids: Sequence[int]) -> None:
        """Begin a run-ahead sequence continuing `context_ids`: stored like a rollout, evicted first."""
        self.cache.start_request(request_id, prompt_key, context_ids, run_ahead=True)

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self.cache.add_tokens(request_id, token_ids)

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        return self.cache.draft_request(request_id, context, budget, self.chain, self.min_prob)

    def stop_request(self, request_id: Hashable) -> None:
        self.cache.stop_request(request_id)

    def end_step(self) -> None:
        """Nothing to do: the trees keep every policy version's rollouts."""

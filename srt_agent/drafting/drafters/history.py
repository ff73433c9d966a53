"""`HistoryDrafter`: per-prompt trees of completed rollouts from earlier steps only (RhymeRL-style)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..tokens import check_tokens
from ..trees.rollout_cache import RolloutCache


@dataclass
class _Rollout:
    prompt_key: Hashable
    tokens: list[int] = field(default_factory=list)  # prompt tail + response so far


class HistoryDrafter:
    """Like SRT, but a step's rollouts become visible only at ``end_step()``: no in-step sharing."""

    name = "history"
    capabilities = DrafterCapabilities(trees=True)

    def __init__(self, cache: RolloutCache | None = None, **cache_options) -> None:
        if cache is not None and cache_options:
            raise ValueError(f"pass either a cache or cache options, not both: {sorted(cache_options)}")
        self.cache = cache if cache is not None else RolloutCache(**cache_options)
        self._running: dict[Hashable, _Rollout] = {}
        self._finished: list[_Rollout] = []

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        if request_id in self._running:
            raise ValueError(f"request {request_id!r} is already running")
        prompt = check_tokens(prompt_ids, "prompt_ids")
        self._running[request_id] = _Rollout(prompt_key, self.cache.prompt_tail(prompt))

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self._rollout(request_id).tokens.extend(check_tokens(token_ids))

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        return self.cache.draft(self._rollout(request_id).prompt_key, context, budget)

    def stop_request(self, request_id: Hashable) -> None:
        self._finished.append(self._rollout(request_id))
        del self._running[request_id]

    def end_step(self) -> None:
        """Publish the rollouts completed during the step that just ended."""
        for rollout in self._finished:
            self.cache.add_sequence(rollout.prompt_key, rollout.tokens)
        self._finished = []

    def _rollout(self, request_id: Hashable) -> _Rollout:
        try:
            return self._running[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}: call start_request first") from None

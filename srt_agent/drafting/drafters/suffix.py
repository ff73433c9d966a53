"""`SuffixDrafter`: SuffixDecoding-style drafting from the request's own tokens and all responses.

Two trees, as in SuffixDecoding: a per-request tree of the prompt plus the request's own output,
and one global tree over the responses of all requests (any prompt). Each draft comes from
whichever tree offers the higher expected acceptance.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..tokens import check_tokens
from ..trees.rollout_cache import RolloutCache

_GLOBAL = "responses"


class SuffixDrafter:
    """Per-request prompt+output tree plus a global response tree (bounded by ``max_global_nodes``)."""

    name = "suffix"
    capabilities = DrafterCapabilities()

    def __init__(
        self,
        max_depth: int = 64,
        max_match: int = 32,
        max_global_nodes: int = 1 << 22,
        backend: str = "auto",
    ) -> None:
        self.local = RolloutCache(max_depth, max_match, max_nodes_per_prompt=1 << 30, backend=backend)
        self.responses = RolloutCache(max_depth, max_match, max_nodes_per_prompt=max_global_nodes, backend=backend)

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        prompt = check_tokens(prompt_ids, "prompt_ids")
        if request_id in self.local:
            raise ValueError(f"request {request_id!r} is already running")
        self.local.start_request(request_id, request_id, [])
        self.local.add_tokens(request_id, prompt)
        self.responses.start_request(request_id, _GLOBAL, [])

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self.local.add_tokens(request_id, token_ids)
        self.responses.add_tokens(request_id, token_ids)

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        own = self.local.draft_request(request_id, context, budget)
        shared = self.responses.draft_request(request_id, context, budget)
        return own if own.expected_accepted >= shared.expected_accepted else shared

    def stop_request(self, request_id: Hashable) -> None:
        self.local.stop_request(request_id)
        self.local.forget(request_id)
        self.responses.stop_request(request_id)

    def end_step(self) -> None:
        """Nothing to do: the global tree learns from responses as they stream."""

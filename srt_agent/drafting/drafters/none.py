"""`NoDrafter`: never drafts (plain decoding), with the same bookkeeping and errors as the others."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..tokens import check_budget, check_tokens

_CHECKED_TAIL = 32  # like the tree drafters, look at (and so validate) only the context's tail


class NoDrafter:
    name = "none"
    capabilities = DrafterCapabilities(drafts=False)

    def __init__(self) -> None:
        self._running: set[Hashable] = set()

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        if request_id in self._running:
            raise ValueError(f"request {request_id!r} is already running")
        check_tokens(prompt_ids, "prompt_ids")
        self._running.add(request_id)

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self._check(request_id)
        check_tokens(token_ids)

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        self._check(request_id)
        check_budget(budget)
        check_tokens(context[-_CHECKED_TAIL:], "context")
        return Draft()

    def stop_request(self, request_id: Hashable) -> None:
        self._check(request_id)
        self._running.remove(request_id)

    def end_step(self) -> None:
        """Nothing to do."""

    def _check(self, request_id: Hashable) -> None:
        if request_id not in self._running:
            raise ValueError(f"unknown request {request_id!r}: call start_request first")

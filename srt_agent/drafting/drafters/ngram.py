"""`NgramDrafter`: prompt lookup decoding with vLLM's ``ngram`` semantics.

For n from ``prompt_lookup_max`` down to ``prompt_lookup_min``, the last n context tokens are
looked up in the earlier context; at the first n that occurs, the tokens following its earliest
occurrence (up to the budget, as vLLM's ``num_speculative_tokens``) are the draft, a chain.
An incremental index (n-gram -> earliest start) makes each lookup O(max - min).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..tokens import check_budget, check_tokens


@dataclass
class _History:
    tokens: list[int] = field(default_factory=list)
    first: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> earliest start


class NgramDrafter:
    """Prompt-lookup n-gram drafter over each request's own prompt and output."""

    name = "ngram"
    capabilities = DrafterCapabilities()

    def __init__(self, prompt_lookup_min: int = 2, prompt_lookup_max: int = 5) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {prompt_lookup_min}, {prompt_lookup_max}"
            )
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self._requests: dict[Hashable, _History] = {}

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already running")
        history = _History()
        self._extend(history, check_tokens(prompt_ids, "prompt_ids"))
        self._requests[request_id] = history

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self._extend(self._history(request_id), check_tokens(token_ids))

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        budget = check_budget(budget)
        history = self._history(request_id)
        if list(context[-self.max_n :]) != history.tokens[-self.max_n :] or len(context) != len(history.tokens):
            history = _History()  # the engine's context differs from what was streamed: index it afresh
            self._extend(history, check_tokens(context, "context"))
        tokens = history.tokens
        end = len(tokens)
        if budget == 0:
            return Draft()
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            start = history.first.get(tuple(tokens[end - n :]))
            if start is not None and start + n < end:
                proposal = tokens[start + n : start + n + budget]
                return Draft(proposal, list(range(-1, len(proposal) - 1)), [1.0] * len(proposal), n)
        return Draft()

    def stop_request(self, request_id: Hashable) -> None:
        self._history(request_id)
        del self._requests[request_id]

    def end_step(self) -> None:
        """Nothing to do: lookup uses only the request's own tokens."""

    def _extend(self, history: _History, tokens: list[int]) -> None:
        seq, first = history.tokens, history.first
        for tok in tokens:
            seq.append(tok)
            end = len(seq)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                first.setdefault(tuple(seq[end - n :]), end - n)

    def _history(self, request_id: Hashable) -> _History:
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}: call start_request first") from None

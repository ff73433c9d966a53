"""`ArcticDrafter`: Snowflake's SuffixDecoding (``arctic-inference``, C++) behind the Drafter API."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..tokens import check_budget, check_tokens

INSTALL_HINT = "install it with `bash scripts/install_arctic.sh` (builds arctic-inference from source into .venv)"


def load_arctic():
    """The `SuffixDecodingCache` class, or a ValueError saying how to install arctic-inference."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise ValueError(f"the 'arctic' drafter needs arctic-inference ({exc}); {INSTALL_HINT}") from None
    return SuffixDecodingCache


class ArcticDrafter:
    """arctic-inference's SuffixDecodingCache: per-request prompt tree + global response tree."""

    name = "arctic"
    capabilities = DrafterCapabilities()

    def __init__(
        self,
        max_depth: int = 64,
        max_cached_requests: int = -1,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        tree: bool = True,
    ) -> None:
        self.impl = load_arctic()(max_tree_depth=max_depth, max_cached_requests=max_cached_requests)
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.tree = tree
        self._ids: dict[Hashable, str] = {}
        self._next = 0

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        if request_id in self._ids:
            raise ValueError(f"request {request_id!r} is already running")
        prompt = check_tokens(prompt_ids, "prompt_ids")
        self._ids[request_id] = rid = f"r{self._next}"  # arctic keeps finished ids cached: never reuse one
        self._next += 1
        self.impl.start_request(rid, prompt)

    def add_tokens(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        self.impl.add_active_response(self._rid(request_id), check_tokens(token_ids))

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        rid = self._rid(request_id)
        budget = check_budget(budget)
        tail = context[-self.max_depth :]
        if budget == 0 or not len(tail):
            check_tokens(tail, "context")
            return Draft()
        try:
            out = self.impl.speculate(
                rid,
                tail,
                max_spec_tokens=budget,
                max_spec_factor=self.max_spec_factor,
                min_token_prob=self.min_token_prob,
                use_tree_spec=self.tree,
            )
        except TypeError:
            check_tokens(tail, "context")  # raises a ValueError naming the bad token
            raise
        return Draft(list(out.token_ids), list(out.parents), list(out.probs), int(out.match_len))

    def stop_request(self, request_id: Hashable) -> None:
        self.impl.stop_request(self._rid(request_id))
        del self._ids[request_id]

    def end_step(self) -> None:
        """Nothing to do: arctic learns from responses as they stream."""

    def _rid(self, request_id: Hashable) -> str:
        try:
            return self._ids[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}: call start_request first") from None

"""What a caller asks for (SamplingParams, a prompt every engine accepts) and what it gets back (RequestOutput)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..drafting.tokens import token_id

FINISH_REASONS = ("eos", "stop", "length", "context", "error")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what a seed must fit in (vLLM's server holds requests to it)


@dataclass
class SamplingParams:
    """Sampling and stopping options of one request.

    ``temperature=0`` is greedy. ``top_k=0`` and ``top_p=1`` disable those filters. ``seed`` fits in 64 bits. ``seed`` keys the
    sampling noise (with the absolute token position), so the same seed gives the same tokens whether
    or not the engine speculates; ``None`` draws a fresh seed per request. ``stop`` strings end the
    request once the decoded output contains one; ``include_stop_str_in_output`` decides whether the
    returned ``text`` keeps it (the tokens always keep the token that completed it).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = True
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if self.seed is not None and not INT64_MIN <= self.seed <= INT64_MAX:
            raise ValueError(f"seed must fit in 64 bits (from -2**63 to 2**63 - 1), got {self.seed!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise ValueError(f"stop_token_ids must be ints >= 0, got {t!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RequestMetrics:
    """Work done for one request during one call (one turn)."""

    forwards: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    tokens: int = 0
    forced_tokens: int = 0
    prefill_tokens: int = 0  # prompt and forced tokens computed (beyond the one each step decodes from)
    prefill_reused: int = 0  # prompt tokens whose KV was copied from a shared prefix instead
    draft_s: float = 0.0
    forward_s: float = 0.0
    bookkeeping_s: float = 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["tokens_per_forward"] = self.tokens_per_forward
        return out


@dataclass
class RequestOutput:
    """The result of one call: the tokens generated in it, their log-probabilities and why it ended.

    ``logprobs[i]`` is log_softmax(logits / temperature) of ``token_ids[i]`` (raw log_softmax when
    greedy), before top-k/top-p filtering. ``stop_reason`` is the stop string or token id that ended
    the request, if any. ``text`` is the decoded output (cut at the stop string) when a tokenizer exists.
    ``rejected``: an "error" output because the backend refused the request's input (the caller's fault).
    """

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: str | int | None = None
    error: str | None = None
    text: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    rejected: bool = False


def check_prompt(prompt_ids: Sequence[int], vocab_size: int, max_context: int) -> list[int]:
    """`prompt_ids` as a list of Python ints, or ValueError (one line) when it is empty, holds an id outside
    the vocabulary or one that is no integer (numpy and torch integers are, as for the trees: `token_id`) or
    leaves no room for a token in the context: what every engine refuses."""
    prompt = list(prompt_ids)
    if not prompt:
        raise ValueError("empty prompt: give at least one token id")
    ids = [token_id(t) for t in prompt]
    bad = [t for t, i in zip(prompt, ids) if i is None or not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"prompt has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    if len(prompt) >= max_context:
        raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the context of {max_context}")
    return ids

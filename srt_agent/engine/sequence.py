"""A request's state: its tokens, KV-cache slot, sampling options, output of the current call."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence as Seq
from dataclasses import dataclass, field

from .params import RequestMetrics, RequestOutput, SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # queued for a slot (or for re-prefill after eviction)
    RUNNING = "running"  # decoding
    HELD = "held"  # finished a call; its KV kept for a continuation until released or evicted


@dataclass
class Sequence:
    """All tokens so far (prompt, sampled, forced) and how many of them have KV in the cache.

    The tokens after ``num_cached`` are pending: they are fed at the next step (a new prompt's tokens,
    forced tool output, the last sampled token). ``call_start`` is where the current call's output begins.
    """

    request_id: str
    prompt_key: Hashable
    tokens: list[int]
    params: SamplingParams
    seed: int
    call_start: int
    status: Status = Status.WAITING
    slot: int | None = None
    num_cached: int = 0
    stored_blocks: int = 0  # full blocks of the tokens already put in the prefix cache
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    drafting: bool = False  # the drafter follows this request (started, and no drafter fault since)
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.call_start

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.call_start :]

    def pending(self) -> list[int]:
        """Tokens to feed next; at least the last token, whose logits give the next position."""
        self.num_cached = min(self.num_cached, len(self.tokens) - 1)
        return self.tokens[self.num_cached :]

    def begin_call(self, prompt_ids: list[int], params: SamplingParams, seed: int) -> None:
        """Continue with a new call: `prompt_ids` extends the tokens (the extra ones are forced)."""
        self.metrics = RequestMetrics(forced_tokens=len(prompt_ids) - len(self.tokens))
        self.tokens = list(prompt_ids)
        self.params, self.seed, self.call_start = params, seed, len(prompt_ids)
        self.logprobs = []
        self.finish_reason = self.stop_reason = self.error = None

    def finish(self, reason: str, stop_reason: str | int | None = None, error: str | None = None) -> None:
        self.finish_reason, self.stop_reason, self.error = reason, stop_reason, error

    def output(self, text: str | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            token_ids=self.output_ids,
            logprobs=list(self.logprobs),
            finish_reason=self.finish_reason or "error",
            stop_reason=self.stop_reason,
            error=self.error,
            text=text,
            metrics=self.metrics,
        )


def common_prefix(a: Seq[int], b: Seq[int], limit: int | None = None) -> int:
    """Length of the common prefix of `a` and `b` (at most `limit`), by slice comparisons."""
    n = min(len(a), len(b), limit if limit is not None else len(b))
    if n <= 0 or list(a[:n]) == list(b[:n]):
        return max(n, 0)
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo

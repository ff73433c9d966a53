"""`SpecRLDrafter`: SPEC-RL's speculative rollouts — the same prompt's rollout from the previous epoch
as a prefix draft, verified by lenient acceptance (`srt_agent.engine.lenient`). Not exactly on-policy.

Each request of a prompt claims one of the rollouts that prompt got the last time it was rolled out
(by start order, so sample i reuses sample i), with the log-probabilities its policy gave them. While
the request's tokens still follow that rollout, the rest of it (up to the next forced tool output,
which carries no log-probability) is the draft; once the request leaves it, drafting ends for good.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ..draft import Draft
from ..drafter import DrafterCapabilities
from ..tokens import check_budget, check_tokens

PUBLISHED_LENIENCE = math.exp(0.5)  # SPEC-RL's released GRPO recipe: log-lenience 0.5
_CHECKED_TAIL = 32  # like the other drafters, validate only the context's tail


@dataclass
class _Rollout:
    """A response as it was produced: tokens, and each one's log-probability (None: forced)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)


@dataclass
class _Running:
    rollout: _Rollout
    reused: _Rollout | None  # the previous epoch's rollout this request follows
    prompt_len: int
    on_prefix: bool = True


class SpecRLDrafter:
    """Previous-epoch rollouts as prefix drafts; the engine accepts them by SPEC-RL's lenient rule."""

    name = "spec-rl"
    capabilities = DrafterCapabilities(needs_logprobs=True, lenient=True)

    def __init__(self, lenience: float = PUBLISHED_LENIENCE) -> None:
        if lenience <= 0:
            raise ValueError(f"lenience must be > 0, got {lenience}")
        self.lenience = lenience
        self._previous: dict[Hashable, list[_Rollout]] = {}  # per prompt: its last epoch's rollouts
        self._this_step: dict[Hashable, list[_Rollout]] = {}
        self._claimed: dict[Hashable, int] = {}
        self._running: dict[Hashable, _Running] = {}

    def start_request(self, request_id: Hashable, prompt_key: Hashable, prompt_ids: Sequence[int]) -> None:
        if request_id in self._running:
            raise ValueError(f"request {request_id!r} is already running")
        prompt = check_tokens(prompt_ids, "prompt_ids")
        rollout = _Rollout()
        self._this_step.setdefault(prompt_key, []).append(rollout)
        earlier = self._previous.get(prompt_key)
        reused = None
        if earlier:
            index = self._claimed.get(prompt_key, 0)
            self._claimed[prompt_key] = index + 1
            reused = earlier[index % len(earlier)]
        self._running[request_id] = _Running(rollout, reused, len(prompt))

    def add_tokens(
        self, request_id: Hashable, token_ids: Sequence[int], logprobs: Sequence[float] | None = None
    ) -> None:
        run = self._get(request_id)
        tokens = check_tokens(token_ids)
        if logprobs is not None and len(logprobs) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} log-probabilities")
        start = len(run.rollout.tokens)
        run.rollout.tokens.extend(tokens)
        run.rollout.logprobs.extend(logprobs if logprobs is not None else [None] * len(tokens))
        if run.on_prefix and run.reused is not None:
            run.on_prefix = run.reused.tokens[start : start + len(tokens)] == tokens

    def draft(self, request_id: Hashable, context: Sequence[int], budget: int) -> Draft:
        run = self._get(request_id)
        budget = check_budget(budget)
        check_tokens(context[-_CHECKED_TAIL:], "context")
        if not run.on_prefix or run.reused is None:
            return Draft()
        start = len(run.rollout.tokens)
        tokens, old = [], []
        for token, lp in zip(run.reused.tokens[start : start + budget], run.reused.logprobs[start : start + budget]):
            if lp is None:  # a forced tool output: the environment, not the policy, continues here
                break
            tokens.append(token)
            old.append(lp)
        matched = run.prompt_len + start if tokens else 0  # the prompt and the response so far are the reused ones
        return Draft(tokens, list(range(-1, len(tokens) - 1)), [1.0] * len(tokens), matched, old_logprobs=old)

    def stop_request(self, request_id: Hashable) -> None:
        self._get(request_id)
        del self._running[request_id]

    def end_step(self) -> None:
        """The epoch's rollouts of each prompt replace that prompt's earlier ones."""
        self._previous.update(self._this_step)
        self._this_step = {}
        self._claimed = {}

    def _get(self, request_id: Hashable) -> _Running:
        try:
            return self._running[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}: call start_request first") from None

"""A request's turn under the rollout server's limits: its prompt checked against the vocabulary, and its
sampling parameters (OpenAI's and vLLM's fields, the reply's token cap from the context, the per-turn cap
and the session's response budget)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine import SamplingParams
from .schema import RequestError, Sampling
from .sessions import Session, Turn


@dataclass
class TurnLimits:
    """What the server allows a turn: `max_context` tokens of prompt and reply, ids below `vocab_size`, at
    most `max_tokens_per_turn` tokens a reply and `max_response_tokens` a session's branch (sampled and
    inserted, as the env config's limits count them); the end-of-turn tokens `eos_token_ids` stop a reply."""

    max_context: int
    vocab_size: int
    eos_token_ids: list[int] = field(default_factory=list)
    max_tokens_per_turn: int | None = None
    max_response_tokens: int | None = None

    @classmethod
    def of(
        cls,
        loaded,
        max_context: int,
        max_tokens_per_turn: int | None = None,
        max_response_tokens: int | None = None,
    ) -> TurnLimits:
        """The limits for `loaded`'s model: its vocabulary (the model config's, else the tokenizer's) and
        end-of-turn tokens."""
        vocab = getattr(getattr(loaded.model, "config", None), "vocab_size", None) or len(loaded.tokenizer)
        return cls(max_context, vocab, list(loaded.eos_token_ids), max_tokens_per_turn, max_response_tokens)

    def check_prompt(self, turn: Turn) -> None:
        """A 400 for a prompt the backend cannot take: empty, or with ids outside the vocabulary."""
        bad = [
            t for t in turn.prompt_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size
        ]
        if bad:
            raise RequestError(f"token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}", param="prompt")
        if not turn.prompt_ids:
            raise RequestError("empty prompt", param="prompt")

    def params(self, req: Sampling, max_tokens: int | None, session: Session, turn: Turn) -> SamplingParams:
        """The turn's sampling parameters; `max_tokens` is what the request asked for (None: all that fits)."""
        cap = self._cap(session, turn)
        outside = [t for t in req.stop_token_ids or [] if t >= self.vocab_size]
        if outside:
            raise RequestError(
                f"stop_token_ids outside the vocabulary [0, {self.vocab_size}): {outside[:5]}", param="stop_token_ids"
            )
        try:
            return SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(req.top_k or 0, 0),
                max_tokens=cap if max_tokens is None else min(max_tokens, cap),
                seed=req.seed if req.seed is not None else session.seed,
                stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
                stop_token_ids=([] if req.ignore_eos else self.eos_token_ids) + list(req.stop_token_ids or []),
                include_stop_str_in_output=True,  # the tokens keep it; the text shown is cut by the server
                ignore_eos=req.ignore_eos,
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    def _cap(self, session: Session, turn: Turn) -> int:
        """The most tokens the reply may have: what the context leaves, the per-turn cap, the branch's budget."""
        prompt_len = len(turn.prompt_ids)
        room = self.max_context - prompt_len
        if room < 1:
            raise RequestError(
                f"context too long: the prompt has {prompt_len} tokens and this server's context is {self.max_context}",
                param="messages",
            )
        caps = [room] + ([self.max_tokens_per_turn] if self.max_tokens_per_turn else [])
        if self.max_response_tokens:
            used = 0 if turn.new_branch else len(session.current.response_ids)
            left = self.max_response_tokens - used - len(turn.forced_ids)
            if left < 1:
                raise RequestError(
                    f"the session's response budget of {self.max_response_tokens} tokens is spent", param="messages"
                )
            caps.append(left)
        return min(caps)

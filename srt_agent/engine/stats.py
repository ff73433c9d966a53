"""What an engine reports about itself beyond its outputs: its running totals (:class:`EngineStats`),
its settings and its step-cost table.

The trainer records the settings and the cost table with every rollout step (through the backend's
``step_costs``), and the replay benchmark reruns a recorded step from them without the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..drafting.choice.cost_model import ForwardCostModel
from ..drafting.drafter import capabilities
from .tail import TailStats

DRAFTER_CALLS = ("start_request", "add_tokens", "draft", "stop_request", "end_step")


@dataclass
class EngineStats:
    """Totals over the engine's lifetime."""

    steps: int = 0
    tokens: int = 0
    draft_proposed: int = 0
    draft_verified: int = 0
    draft_accepted: int = 0
    drafter_errors: int = 0
    drafter_faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DRAFTER_CALLS, 0))
    undrafted_requests: int = 0  # requests whose speculation a drafter fault ended
    last_drafter_error: str | None = None
    model_errors: int = 0  # requests ended by a failing forward pass, sampler or non-finite logits
    prefill_tokens: int = 0  # prompt and forced tokens computed (beyond the one each step decodes from)
    lenient_overrides: int = 0  # leniently accepted draft tokens the exact sampler would not have drawn
    draft_s: float = 0.0
    model_drafted: int = 0  # nodes a model drafter proposed …
    model_draft_s: float = 0.0  # … and the seconds its passes took
    drafter_update_s: float = 0.0  # rebuilding a model drafter on weight updates
    forward_s: float = 0.0
    bookkeeping_s: float = 0.0
    verify_s: float = 0.0  # the cost model's seconds for verifying the drafted tokens (beyond plain decoding)
    tail: TailStats = field(default_factory=TailStats)  # step time by sequences running (engine/tail.py)

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["drafter_faults"] = dict(self.drafter_faults)
        out["tail"] = self.tail.as_dict()
        out["forwards"] = self.steps
        out["tokens_per_forward"] = self.tokens / self.steps if self.steps else 0.0
        out["accepted_per_step"] = self.draft_accepted / self.steps if self.steps else 0.0
        out["speculation"] = speculation_totals(
            self.draft_s + self.model_draft_s, self.draft_verified, self.draft_accepted, self.verify_s
        )
        return out


def speculation_totals(host_s: float, drafted: int, accepted: int, verify_s: float) -> dict:
    """What speculation cost an engine beyond plain decoding, as every backend reports it (``stats()["speculation"]``):
    host seconds spent drafting, draft tokens verified and accepted, and the predicted seconds of verifying them."""
    return dict(host_s=host_s, drafted=drafted, accepted=accepted, verify_s=verify_s)


def engine_settings(engine) -> dict:
    """What the replay needs to know of an `Engine`: its batch, context and draft settings and its
    drafter's tree options."""
    cache = engine.drafter.cache if capabilities(engine.drafter).trees else None
    return dict(
        engine=dict(
            max_batch=engine.scheduler.num_slots,
            max_context=engine.max_context,
            max_draft_tokens=engine.max_draft_tokens,
            min_draft_gain=engine.min_draft_gain,
            adaptive_drafts=engine.adaptive_drafts,
        ),
        cache=dict(max_depth=cache.max_depth, max_match=cache.max_match, max_bytes=cache.max_bytes)
        if cache is not None
        else {},
    )


def cost_table(model: ForwardCostModel) -> dict:
    """A cost model's figures: the linear fit and every measured shape."""
    return {
        "fixed_s": model.fixed_s,
        "per_token_s": model.per_token_s,
        "per_sequence_s": model.per_sequence_s,
        "shapes": model.measured(),
    }

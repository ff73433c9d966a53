"""What an engine reports about itself beyond its outputs: its settings and its step-cost table.

The trainer records both with every rollout step (through the backend's ``step_costs``), and the
replay benchmark reruns a recorded step from them without the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cost_model import ForwardCostModel

if TYPE_CHECKING:
    from .engine import Engine


def engine_settings(engine: Engine) -> dict:
    """What the replay needs to know of an engine: its batch, context and draft settings and its
    drafter's tree options."""
    cache = getattr(engine.drafter, "cache", None)
    return dict(
        engine=dict(max_batch=engine.scheduler.num_slots, max_context=engine.max_context, max_draft_tokens=engine.max_draft_tokens,
                    min_draft_gain=engine.min_draft_gain, adaptive_drafts=engine.adaptive_drafts),
        cache=dict(max_depth=cache.max_depth, max_match=cache.max_match, max_bytes=cache.max_bytes) if hasattr(cache, "max_depth") else {},
    )


def cost_table(model: ForwardCostModel) -> dict:
    """A cost model's figures: the linear fit and every measured shape."""
    return {
        "fixed_s": model.fixed_s, "per_token_s": model.per_token_s, "per_sequence_s": model.per_sequence_s,
        "shapes": model.measured(),
    }

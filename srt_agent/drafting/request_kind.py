"""`RequestKind`: what SRT does with a request's tokens, carried with the request (never read off its id)."""

from __future__ import annotations

import enum


class RequestKind(str, enum.Enum):
    """``rollout``: drafted for and stored in its prompt's tree; ``run_ahead``: stored (evicted first), never
    drafted for; ``undrafted``: neither (a comparison run without speculation sharing the engine)."""

    ROLLOUT = "rollout"
    RUN_AHEAD = "run_ahead"
    UNDRAFTED = "undrafted"

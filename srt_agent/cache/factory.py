"""`make_drafter(name, **options)`: the engine picks a drafter by name."""

from __future__ import annotations

import importlib

from .arctic import ArcticDrafter
from .drafter import Drafter
from .history import HistoryDrafter
from .ngram import NgramDrafter
from .none import NoDrafter
from .spec_rl import SpecRLDrafter
from .srt import SRTDrafter
from .suffix import SuffixDrafter

# Model drafters live with the engine (they run a model) and are imported on first use.
DRAFTERS: dict[str, type | str] = {
    "none": NoDrafter,
    "srt": SRTDrafter,
    "ngram": NgramDrafter,
    "suffix": SuffixDrafter,
    "history": HistoryDrafter,
    "arctic": ArcticDrafter,
    "self": "srt_agent.engine.self_drafter:SelfDrafter",
    "srt+self": "srt_agent.engine.hybrid_drafter:HybridDrafter",
    "spec-rl": SpecRLDrafter,  # reuses the previous epoch's rollouts with lenient acceptance: not exactly on-policy
}
# Drafters whose drafts are accepted leniently (not token for token): their rollouts are not exactly on-policy.
LENIENT_DRAFTERS = frozenset(n for n, cls in DRAFTERS.items() if not isinstance(cls, str) and cls.capabilities.lenient)


def make_drafter(name: str, **options) -> Drafter:
    """A new drafter by name (none, srt, ngram, suffix, history, arctic, self, srt+self, spec-rl) with its
    keyword options."""
    try:
        cls = DRAFTERS[name]
    except KeyError:
        raise ValueError(f"unknown drafter {name!r}; choose one of {sorted(DRAFTERS)}") from None
    if isinstance(cls, str):
        module, _, attr = cls.partition(":")
        cls = getattr(importlib.import_module(module), attr)
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"bad options for drafter {name!r}: {exc}") from None


def drafter_unavailable(name: str) -> str | None:
    """Why the drafter `name` cannot run here (an unknown name, a package that is not installed), or None
    when it can."""
    try:
        make_drafter(name)
    except ValueError as exc:
        return str(exc)
    return None

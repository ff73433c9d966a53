"""Drafting: the drafters behind one interface and one registry, the per-prompt rollout trees SRT drafts from,
and the choice of what to draft at a batch size."""

from .draft import EMPTY_DRAFT, Draft
from .drafter import NO_CAPABILITIES, Drafter, DrafterCapabilities, capabilities
from .drafters.srt import SRTDrafter
from .registry import (
    DRAFTERS,
    drafter_capabilities,
    drafter_unavailable,
    exact_drafters,
    is_lenient,
    make_drafter,
    runs_as_proposer,
    vllm_drafters,
)
from .request_kind import RequestKind
from .trees.rollout_cache import CacheStats, RolloutCache
from .trees.tree import tree_class
from .trees.tree_ref import ReferenceTokenTree

__all__ = [
    "DRAFTERS",
    "EMPTY_DRAFT",
    "NO_CAPABILITIES",
    "CacheStats",
    "Draft",
    "Drafter",
    "DrafterCapabilities",
    "ReferenceTokenTree",
    "RequestKind",
    "RolloutCache",
    "SRTDrafter",
    "capabilities",
    "drafter_capabilities",
    "drafter_unavailable",
    "exact_drafters",
    "is_lenient",
    "make_drafter",
    "runs_as_proposer",
    "vllm_drafters",
    "tree_class",
]

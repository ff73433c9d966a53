"""Per-prompt rollout trees (SRT), drafting, and the comparison drafters behind one interface."""

from .arctic import ArcticDrafter
from .draft import EMPTY_DRAFT, Draft
from .drafter import NO_CAPABILITIES, Drafter, DrafterCapabilities, capabilities
from .factory import DRAFTERS, LENIENT_DRAFTERS, drafter_unavailable, make_drafter
from .history import HistoryDrafter
from .ngram import NgramDrafter
from .none import NoDrafter
from .rollout_cache import CacheStats, RolloutCache
from .spec_rl import SpecRLDrafter
from .srt import SRTDrafter
from .suffix import SuffixDrafter
from .tree import tree_class
from .tree_ref import ReferenceTokenTree

__all__ = [
    "DRAFTERS",
    "EMPTY_DRAFT",
    "LENIENT_DRAFTERS",
    "NO_CAPABILITIES",
    "ArcticDrafter",
    "CacheStats",
    "Draft",
    "Drafter",
    "DrafterCapabilities",
    "HistoryDrafter",
    "NgramDrafter",
    "NoDrafter",
    "ReferenceTokenTree",
    "RolloutCache",
    "SRTDrafter",
    "SpecRLDrafter",
    "SuffixDrafter",
    "capabilities",
    "drafter_unavailable",
    "make_drafter",
    "tree_class",
]

"""Per-prompt rollout trees (SRT), drafting, and the comparison drafters behind one interface."""

from .arctic import ArcticDrafter
from .draft import EMPTY_DRAFT, Draft
from .drafter import Drafter
from .factory import DRAFTERS, MODEL_DRAFTERS, make_drafter
from .history import HistoryDrafter
from .ngram import NgramDrafter
from .none import NoDrafter
from .rollout_cache import CacheStats, RolloutCache
from .srt import SRTDrafter
from .suffix import SuffixDrafter
from .tree import tree_class
from .tree_ref import ReferenceTokenTree

__all__ = [
    "DRAFTERS",
    "EMPTY_DRAFT",
    "MODEL_DRAFTERS",
    "ArcticDrafter",
    "CacheStats",
    "Draft",
    "Drafter",
    "HistoryDrafter",
    "NgramDrafter",
    "NoDrafter",
    "ReferenceTokenTree",
    "RolloutCache",
    "SRTDrafter",
    "SuffixDrafter",
    "make_drafter",
    "tree_class",
]

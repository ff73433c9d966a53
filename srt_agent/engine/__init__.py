"""Batched, lossless speculative generation: sequences, scheduler, verification, drafting behind a fault
boundary, run-ahead.

The request types (:mod:`.params`), the options (:mod:`.options`) and the stepping interface
(:mod:`.interfaces`) import no torch; ``Engine`` and ``AsyncEngine`` load with it on first use, so the config
reads the engine's defaults without it.
"""

from __future__ import annotations

import importlib
from typing import Any

from .interfaces import SteppingEngine, TurnEngine
from .options import EngineOptions, RunAheadOptions
from .params import RequestMetrics, RequestOutput, SamplingParams

#: names this package exports from modules that import torch, loaded on first use
_LAZY = {"AsyncEngine": ".async_engine", "Engine": ".engine"}

__all__ = [
    "AsyncEngine",
    "Engine",
    "EngineOptions",
    "RequestMetrics",
    "RequestOutput",
    "RunAheadOptions",
    "SamplingParams",
    "SteppingEngine",
    "TurnEngine",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

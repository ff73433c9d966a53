"""What our engine can be asked for, with its defaults: the engine's own knobs (:class:`EngineOptions`) and
run-ahead's (:class:`RunAheadOptions`).

They live here, with the engine that reads them, and import nothing: the env YAML's ``engine:`` section
(:class:`srt_agent.config.EngineConfig`) takes its defaults from them without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..drafting import Drafter

RUN_AHEAD_BUBBLES = ("tail", "tools", "update")
RUN_AHEAD_STARTS = ("prompt", "branch")


@dataclass(frozen=True)
class EngineOptions:
    """What an :class:`~srt_agent.engine.Engine` runs (an env YAML's ``engine:`` section takes its defaults from
    these).

    `drafter`: a registry name, a Drafter, or None (plain decoding); `max_draft_tokens` bounds a row's draft,
    `adaptive_drafts` sizes drafts by the cost model (a draft must gain `min_draft_gain` of a step);
    `calibrate` measures step costs at start-up; `run_ahead` (options, or None) fills idle capacity;
    `prefix_sharing` reuses cached prompt prefixes' KV in blocks of `prefix_block_size`, up to
    `prefix_cache_tokens`; `dtype` (a dtype or an ``engine.dtype`` name such as ``auto``) casts the model in
    place before the engine starts, None keeps the dtype it was loaded in; `batch_invariant` (True, False or
    ``auto``): attention in float64 (``runner/numerics.py``).
    """

    drafter: str | Drafter | None = "srt"
    device: str | torch.device = "auto"
    max_batch: int = 32
    max_context: int = 2048
    max_draft_tokens: int = 16
    adaptive_drafts: bool = True
    min_draft_gain: float = 0.1
    max_prefill_tokens: int = 4096
    calibrate: bool = True
    run_ahead: RunAheadOptions | None = None
    prefix_sharing: bool = True
    prefix_block_size: int = 16
    prefix_cache_tokens: int = 8192
    dtype: str | torch.dtype | None = None
    batch_invariant: bool | str = "auto"

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_context < 2 or self.max_draft_tokens < 0:
            raise ValueError("need max_batch >= 1, max_context >= 2 and max_draft_tokens >= 0")
        if self.prefix_block_size < 1 or self.prefix_cache_tokens < 0:
            raise ValueError("need prefix_block_size >= 1 and prefix_cache_tokens >= 0")


@dataclass
class RunAheadOptions:
    """How the engine runs ahead (see `srt_agent.engine.run_ahead`); the env YAML's ``engine.run_ahead``
    section (:class:`srt_agent.config.RunAheadConfig`) takes its defaults from here."""

    bubbles: tuple[str, ...] = ("tail", "tools")
    slack: float = 0.1  # a step may grow by this fraction of its predicted cost
    tokens_per_sequence: int = 48
    budget_tokens: int = 4096  # run-ahead tokens per window (an RL step), at most
    start: str = "prompt"
    max_sequences: int = 0  # run-ahead sequences at once (0: as many as there are free slots)
    max_prefill_tokens: int = 512  # prefill per step in the update bubble (no real step to protect)
    seed: int = 0

    def __post_init__(self) -> None:
        self.bubbles = tuple(self.bubbles)
        bad = [b for b in self.bubbles if b not in RUN_AHEAD_BUBBLES]
        if bad:
            raise ValueError(f"unknown run-ahead bubble(s) {bad}; choose from {list(RUN_AHEAD_BUBBLES)}")
        if self.start not in RUN_AHEAD_STARTS:
            raise ValueError(f"unknown run-ahead start {self.start!r}; choose one of {list(RUN_AHEAD_STARTS)}")
        if self.slack < 0 or self.tokens_per_sequence < 1 or self.budget_tokens < 0 or self.max_sequences < 0:
            raise ValueError(
                "run-ahead needs slack >= 0, tokens_per_sequence >= 1, budget_tokens >= 0, max_sequences >= 0"
            )

"""What our engine can be asked for, with its defaults: the engine's own knobs (:class:`EngineDefaults`) and
run-ahead's (:class:`RunAheadOptions`).

They live here, with the engine that reads them, and import nothing: the env YAML's ``engine:`` section
(:class:`srt_agent.config.EngineConfig`) takes its defaults from them without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN_AHEAD_BUBBLES = ("tail", "tools", "update")
RUN_AHEAD_STARTS = ("prompt", "branch")


@dataclass(frozen=True)
class EngineDefaults:
    """The defaults of :class:`~srt_agent.engine.Engine`'s arguments that an env YAML's ``engine:`` section
    also sets."""

    drafter: str = "srt"
    device: str = "auto"
    max_batch: int = 32
    max_context: int = 2048
    calibrate: bool = True
    prefix_sharing: bool = True
    prefix_cache_tokens: int = 8192
    batch_invariant: bool | str = "auto"


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

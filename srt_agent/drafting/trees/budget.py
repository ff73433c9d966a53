"""`TreeBudget`: the bytes SRT's trees may hold in one engine, from the run's batch and length or the user's word,
and every share of them (prompt trees, held turns, the global tree of responses), worked out here only.

The trees hold every rollout of a step (``rollouts_per_step`` of up to ``tokens_per_rollout`` tokens) for
``HISTORY_STEPS`` steps at ``BYTES_PER_TOKEN`` (what `bench cache` measures per stored token), within
``MIN_BYTES`` and an eighth of the host memory available. The global tree of responses gets what its feeders
(the running turns that feed it, ``GLOBAL_FEEDERS`` at most) hold at full length, within a 64th and an eighth of
the budget; held turns keep their eighth. A user's ``max_bytes`` replaces the first figure, not the shares.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES_PER_TOKEN = 100  # a stored token in a prompt tree (72-94 measured by `srt-agent bench cache`)
HISTORY_STEPS = 4  # steps of rollouts the budget keeps, so revisits draft from more than the last one
MIN_BYTES = 64 << 20
HOST_SHARE = 8  # at most an eighth of the host memory available, unless the user says more
GLOBAL_FEEDERS = 64  # running turns that feed the global tree at once
GLOBAL_SHARE = 32  # the global tree's share of a budget nobody sized for the run
HELD_SHARE = 8  # held turns take at most 1/HELD_SHARE of the byte budget
GLOBAL_RANGE = (64, 8)  # a sized global tree takes between a 64th and an eighth of the budget


def global_tree_bytes(max_bytes: int, global_fallback: bool, global_bytes: int | None = None) -> int:
    """The global tree's part of `max_bytes`: `global_bytes` if given (a `TreeBudget`'s), else a 32nd."""
    if not global_fallback:
        return 0
    return max_bytes // GLOBAL_SHARE if global_bytes is None else global_bytes


def held_turn_bytes(max_bytes: int) -> int:
    """The held turns' part of `max_bytes`."""
    return max_bytes // HELD_SHARE


def prompt_tree_bytes(max_bytes: int, global_fallback: bool, global_bytes: int | None = None) -> int:
    """The prompt trees' part of `max_bytes`: what the held turns and the global tree leave."""
    return max_bytes - held_turn_bytes(max_bytes) - global_tree_bytes(max_bytes, global_fallback, global_bytes)


@dataclass(frozen=True)
class TreeBudget:
    """Bytes of SRT's trees (all of them) and of their global tree of responses; `source` says who chose."""

    max_bytes: int
    global_bytes: int
    source: str

    def drafter_options(self, capabilities) -> dict[str, int]:
        """The options that size a drafter declaring `capabilities` (`DrafterCapabilities`): none without trees."""
        options = {"max_bytes": self.max_bytes} if capabilities.trees else {}
        if capabilities.global_tree:
            options["global_bytes"] = self.global_bytes
        return options

    def line(self) -> str:
        """The one line a run prints at start."""
        mib = 1 << 20
        return (
            f"SRT's trees: up to {self.max_bytes / mib:,.0f} MiB per engine (global tree of responses "
            f"{self.global_bytes / mib:,.0f} MiB, held turns {held_turn_bytes(self.max_bytes) / mib:,.0f} MiB), "
            f"{self.source}"
        )


def tree_budget(
    rollouts_per_step: int,
    tokens_per_rollout: int,
    max_bytes: int | None = None,
    available: int | None = None,
) -> TreeBudget:
    """The budget for a run of `rollouts_per_step` rollouts of up to `tokens_per_rollout` tokens; `max_bytes`:
    the user's setting; `available`: the host memory free (None: not known, no cap)."""
    if max_bytes is not None:
        if max_bytes <= 0:
            raise ValueError(f"the trees' byte budget must be positive, got {max_bytes}")
        total, source = max_bytes, "as set"
    else:
        need = rollouts_per_step * tokens_per_rollout * BYTES_PER_TOKEN * HISTORY_STEPS
        total = max(MIN_BYTES, need)
        source = f"for {HISTORY_STEPS} steps of {rollouts_per_step:,} rollouts × {tokens_per_rollout:,} tokens"
        if available is not None and total > available // HOST_SHARE:
            total = max(MIN_BYTES, available // HOST_SHARE)
            source += f", capped at an eighth of the {available / (1 << 30):,.1f} GiB available"
    global_need = min(GLOBAL_FEEDERS, rollouts_per_step) * tokens_per_rollout * BYTES_PER_TOKEN
    least, most = GLOBAL_RANGE
    global_bytes = min(max(total // least, global_need), total // most)
    return TreeBudget(total, global_bytes, source)


__all__ = [
    "GLOBAL_FEEDERS",
    "TreeBudget",
    "global_tree_bytes",
    "held_turn_bytes",
    "prompt_tree_bytes",
    "tree_budget",
]

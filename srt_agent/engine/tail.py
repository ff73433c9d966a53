"""The tail of a step: generation time spent with few sequences running, and the speed there.

A GPU RL step runs its batch full for a while, then waits on its longest rollouts with a few sequences
left. Speculation pays most there (a drafted token is nearly free beside a lone sequence's step), and that
share of the time is what it can win back. Both engines count every step here, by the number of the
caller's sequences running in it (run-ahead rows and requests waiting on a tool are not running).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

TAIL_SEQUENCES = 4  # a step with at most this many sequences running is in the tail


@dataclass
class TailStats:
    """Seconds and generated tokens of the steps that ran sequences, and of those in the tail."""

    step_s: float = 0.0
    step_tokens: int = 0
    steps: int = 0
    tail_s: float = 0.0
    tail_tokens: int = 0
    tail_steps: int = 0
    # per number of sequences running (a str, as JSON keys are): the steps' seconds and generated tokens
    by_running: dict[str, dict[str, float]] = field(default_factory=dict)

    def count(self, running: int, seconds: float, tokens: int) -> None:
        """One step that ran `running` sequences for `seconds` and gave them `tokens` new tokens."""
        if running <= 0:
            return
        load = self.by_running.setdefault(str(running), {"s": 0.0, "tokens": 0})
        load["s"] += seconds
        load["tokens"] += tokens
        self.step_s += seconds
        self.step_tokens += tokens
        self.steps += 1
        if running <= TAIL_SEQUENCES:
            self.tail_s += seconds
            self.tail_tokens += tokens
            self.tail_steps += 1

    def as_dict(self) -> dict:
        return asdict(self)


def at_their_speed(ours: dict, theirs: dict) -> float | None:
    """The seconds our steps' tokens would have taken at their steps' speed with as many sequences running
    (our own seconds where they never ran that many), from two `TailStats.as_dict` (or differences): beside
    both step times it splits a difference into speed (ours − this) and work (this − theirs: other tokens,
    or a longer tail). None where either counted no load."""
    mine, other = ours.get("by_running") or {}, theirs.get("by_running") or {}
    if not mine or not other:
        return None
    total = 0.0
    for running, load in mine.items():
        their = other.get(running)
        speed = their["tokens"] / their["s"] if their and their["tokens"] and their["s"] > 0 else None
        total += load["tokens"] / speed if speed else load["s"]
    return total


def tail_figures(tail: dict) -> dict[str, float | None]:
    """From a `TailStats.as_dict` (or the difference of two): the tail's share of step time and its speed
    in generated tokens per second, None where no step ran."""
    return {
        "tail_share": tail["tail_s"] / tail["step_s"] if tail.get("step_s") else None,
        "tail_tok_s": tail["tail_tokens"] / tail["tail_s"] if tail.get("tail_s") else None,
    }

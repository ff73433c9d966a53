"""The tail of a step: generation time spent with few sequences running, and the speed there.

A GPU RL step runs its batch full for a while, then waits on its longest rollouts with a few sequences
left. Speculation pays most there (a drafted token is nearly free beside a lone sequence's step), and that
share of the time is what it can win back. Both engines count every step here, by the number of the
caller's sequences running in it (run-ahead rows and requests waiting on a tool are not running).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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

    def count(self, running: int, seconds: float, tokens: int) -> None:
        """One step that ran `running` sequences for `seconds` and gave them `tokens` new tokens."""
        if running <= 0:
            return
        self.step_s += seconds
        self.step_tokens += tokens
        self.steps += 1
        if running <= TAIL_SEQUENCES:
            self.tail_s += seconds
            self.tail_tokens += tokens
            self.tail_steps += 1

    def as_dict(self) -> dict:
        return asdict(self)


def tail_figures(tail: dict) -> dict[str, float | None]:
    """From a `TailStats.as_dict` (or the difference of two): the tail's share of step time and its speed
    in generated tokens per second, None where no step ran."""
    return {
        "tail_share": tail["tail_s"] / tail["step_s"] if tail.get("step_s") else None,
        "tail_tok_s": tail["tail_tokens"] / tail["tail_s"] if tail.get("tail_s") else None,
    }

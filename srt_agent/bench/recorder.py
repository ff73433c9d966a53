"""The benchmarks' `on_step`: every variant's figures in every RL step the trainer finishes, kept for the
tables, and each variant's run as a rollout trace for the replay.

Each variant's figures are `rl.metrics.step_figures` of its runs against the training variant's (the
trainer's first), the same figures the trainer's report compares drafters by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..config import EnvConfig
from ..rl.metrics import StepFigures, step_figures
from ..rl.rollout_trace import RolloutTrace, TraceBook
from ..rl.rollouts import RolloutRun, RolloutVariant

BASELINE = "none"  # the method a row's speed-up is taken against: plain decoding
BUBBLES = ("tail", "tools")  # the bubbles a row splits run-ahead's tokens by


@dataclass
class RecordedStep:
    """One finished RL step: its metrics, every variant's runs and figures, and whether it revisits its
    prompts (the training variant rolled all of them out in an earlier step)."""

    step: int
    metrics: dict[str, float]
    runs: dict[str, list[RolloutRun]]
    figures: dict[str, StepFigures]
    revisit: bool

    @property
    def reward(self) -> float | None:
        return self.metrics.get("critic/score/mean")

    def row(self, name: str) -> dict:
        """Variant `name`'s figures in this step: times (its step time is its generation plus the step's
        shared rest: rewards, update, weight sync), verification steps, tokens, identity with the training
        rollouts and what run-ahead did."""
        gen_total = sum(run.wall_s for rs in self.runs.values() for run in rs)
        rest_s = self.metrics.get("timing_s/step", gen_total) - gen_total
        f, base_s = self.figures[name], self.figures[BASELINE].gen_s
        ahead = f.run_ahead
        rows, real_rows = ahead.get("rows", 0), ahead.get("real_rows", 0)
        return dict(
            step=self.step,
            variant=name,
            gen_s=f.gen_s,
            step_s=f.gen_s + rest_s,
            speedup_vs_none=base_s / f.gen_s if f.gen_s else 0.0,
            accepted_per_forward=f.accepted_per_forward,
            tokens_per_forward=f.tokens_per_forward,
            forwards=f.forwards,
            model_tokens=f.model_tokens,
            identical=f.identical,
            run_ahead_tokens=ahead.get("tokens", 0),
            run_ahead_row_share=rows / (rows + real_rows) if rows + real_rows else 0.0,
            run_ahead_time_share=ahead["added_s"] / f.gen_s if ahead and f.gen_s else 0.0,
            run_ahead_by_bubble={b: ahead["tokens_by_bubble"][b] for b in BUBBLES} if ahead else {},
            reward=self.metrics.get("critic/score/mean", 0.0),
        )


class StepRecorder:
    """The trainer's `on_step`: records every finished step (`steps`) and hands it to `on_record`."""

    def __init__(
        self,
        config: EnvConfig,
        variants: Sequence[RolloutVariant],
        on_record: Callable[[RecordedStep], None] | None = None,
    ):
        self.config, self.variants, self.on_record = config, list(variants), on_record
        self.steps: list[RecordedStep] = []
        self.seen: set = set()

    def __call__(self, step: int, metrics: dict[str, float], runs: dict[str, list[RolloutRun]]) -> None:
        training = runs[self.variants[0].name]
        keys = {t.key for run in training for t in run.tasks}
        revisit = bool(keys) and keys <= self.seen
        self.seen |= keys
        figures = {name: step_figures(rs, training) for name, rs in runs.items()}
        record = RecordedStep(step, metrics, runs, figures, revisit)
        self.steps.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def rows(self) -> list[dict]:
        """Every variant's row (`RecordedStep.row`) in every step, in the order the trainer ran them."""
        return [s.row(name) for s in self.steps for name in s.runs]

    def traces(self) -> dict[str, RolloutTrace]:
        """One rollout trace per variant: its runs of every step, with its engine's settings and costs."""
        book = TraceBook(self.config, self.variants)
        for s in self.steps:
            book.add(s.step, s.runs)
        return book.traces

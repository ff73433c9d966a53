"""What a vLLM decode step costs, learned from vLLM's own measured steps, per batch size.

A step of B sequences verifying D drafted tokens takes ``a_B + c_B * D`` seconds. Measured steps set the
level: the prior line is scaled to them (a smaller model or a loaded machine scales every step alike, and
that changes nothing about what pays). The slope ``c_B``, the price of one drafted token at this batch size,
stays the scaled prior's until steps with different draft sizes show otherwise (a ridge toward it): steps
that all drafted the same number of tokens say nothing about what a drafted token costs.

A measured interval can hold time vLLM spent idle (no request to run, the caller away). Such steps are told
apart from the steps themselves, not from the prior (a bigger model or a busy machine makes every step many
times the prior's): a step is left out when it lasts more than ``idle_factor`` times the median of the recent
intervals measured for that batch size; the first ``warmup`` intervals are held back until that median exists.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from .cost_model import ForwardCostModel


@dataclass
class _Sums:
    """Decayed weighted sums of (D, seconds) for one batch size."""

    n: float = 0.0
    d: float = 0.0
    t: float = 0.0
    dd: float = 0.0
    dt: float = 0.0


@dataclass
class MeasuredStepCost:
    """``predict(tokens, sequences)`` as `ForwardCostModel`'s, learned per batch size (see the module)."""

    prior: ForwardCostModel
    decay: float = 0.98  # per observed step of that batch size
    slope_weight: float = 16.0  # the prior slope counts as this much Σ (D - mean D)² of measurements
    idle_factor: float = 5.0  # an interval this many times the recent median had vLLM idle in it
    warmup: int = 3  # intervals held back until the median that judges them exists
    recent: int = 31  # intervals the median is taken over, per batch size
    _sums: dict[int, _Sums] = field(default_factory=dict)
    _recent: dict[int, deque] = field(default_factory=dict)  # batch size -> recent (tokens, seconds)
    skipped: int = 0  # intervals left out as idle

    def measured(self, tokens: int, seconds: float, sequences: int) -> None:
        """A measured interval between two of vLLM's decode steps: learned from unless vLLM idled in it."""
        recent = self._recent.setdefault(sequences, deque(maxlen=self.recent))
        recent.append((tokens, seconds))
        if len(recent) < self.warmup:
            return
        typical = statistics.median(s for _, s in recent)
        judged = list(recent)[: self.warmup] if len(recent) == self.warmup else [(tokens, seconds)]
        for d, t in judged:
            if t > self.idle_factor * typical:
                self.skipped += 1
            else:
                self.observe(d, t, sequences)

    def observe(self, tokens: int, seconds: float, sequences: int) -> None:
        s = self._sums.setdefault(sequences, _Sums())
        d = tokens - sequences
        s.n, s.d, s.t = self.decay * s.n + 1, self.decay * s.d + d, self.decay * s.t + seconds
        s.dd, s.dt = self.decay * s.dd + d * d, self.decay * s.dt + d * seconds

    def line(self, sequences: int) -> tuple[float, float]:
        """(a, c): seconds of a step of `sequences` without drafts, and per drafted token."""
        prior_a = self.prior.predict(sequences, sequences)
        prior_c = self.prior.predict(sequences + 1, sequences) - prior_a
        s = self._sums.get(sequences)
        if s is None or s.n <= 0:
            return prior_a, prior_c
        mean_d, mean_t = s.d / s.n, s.t / s.n
        scaled_c = prior_c * mean_t / (prior_a + prior_c * mean_d)  # the prior line scaled to the measurements
        spread = s.dd - s.n * mean_d * mean_d  # Σ (D - mean D)²
        covariance = s.dt - s.n * mean_d * mean_t
        c = max(0.0, (covariance + self.slope_weight * scaled_c) / (max(spread, 0.0) + self.slope_weight))
        return max(mean_t - c * mean_d, 1e-6), c

    def cheapest(self, low: int, high: int, sequences: int) -> float:
        """The least predicted seconds of a step of `sequences` feeding `low` to `high` tokens: at `low`."""
        return self.predict(low, sequences)

    def predict(self, tokens: int, sequences: int | None = None) -> float:
        sequences = sequences or 1
        a, c = self.line(sequences)
        return a + c * max(tokens - sequences, 0)


def step_line(step_fixed_ms: float, step_row_ms: float, draft_token_ms: float) -> ForwardCostModel:
    """Our engine's cost model (``fixed + per_token * (B + D) + per_sequence * (B - 1)`` seconds for B sequences
    and D drafted tokens) equal to ``step_fixed + step_row * B + draft_token * D`` (where ``step_row <
    draft_token`` it overstates the step by ``(draft_token - step_row) * B``)."""
    fixed, row, token = step_fixed_ms / 1e3, step_row_ms / 1e3, draft_token_ms / 1e3
    if row >= token:
        return ForwardCostModel(fixed_s=fixed + row - token, per_token_s=token, per_sequence_s=row - token)
    return ForwardCostModel(fixed_s=fixed, per_token_s=token, per_sequence_s=0.0)


def vllm_step_cost(
    step_fixed_ms: float, step_row_ms: float, draft_token_ms: float, calibrate: bool
) -> ForwardCostModel | MeasuredStepCost:
    """The prior line, learned from vLLM's measured steps when `calibrate` is on."""
    prior = step_line(step_fixed_ms, step_row_ms, draft_token_ms)
    return MeasuredStepCost(prior) if calibrate else prior


class StepClock:
    """Times vLLM's decode steps for a `MeasuredStepCost`: the interval between two ``propose`` calls is the step
    that verified the first call's drafts. Only steps that decoded the rows drafted for, none prefilling, teach."""

    def __init__(self, cost: ForwardCostModel | MeasuredStepCost):
        self.cost = cost
        self._running: tuple[int, int, float] | None = None  # (sequences, tokens, start) of the running step
        self.ended: tuple[int, int, float] | None = None  # (sequences, tokens, seconds) of the step `tick` learned

    def tick(self, rows: int, prefilled: bool, timed: bool) -> float | None:
        """A step of `rows` ended and the next starts now: learn the one that ended; returns the start (None:
        not `timed`)."""
        now = time.perf_counter()
        last, self._running, self.ended = self._running, None, None
        if not timed:
            return None
        if last is not None and not prefilled and last[0] == rows:
            sequences, tokens, start = last
            self.cost.measured(tokens, now - start, sequences)
            self.ended = (sequences, tokens, now - start)
        return now

    def started(self, sequences: int, tokens: int, start: float | None) -> None:
        """The step started at `start` feeds `tokens` for `sequences` rows (nothing when not timed)."""
        if start is not None:
            self._running = (sequences, tokens, start)

    def skip(self) -> None:
        """The running step is not timed."""
        self._running = None

"""`PaidDrafting`: drafting stays on only where it has been measured to pay, per batch size.

The cost model decides from predictions; a prediction can be wrong (a prior for another machine, a slope
not yet learned, acceptance that fell). This guard decides from what happened: for each batch size it keeps
the measured tokens per second of steps that verified drafts and of steps that did not, and where drafted
steps ran slower than plain ones it turns drafting off for that batch size. The plain rate needs plain steps:
while drafting is on, one step in `baseline_every` is left undrafted (a plain step costs what plain decoding
costs). An off batch size is tried again after `backoff` of its steps, the wait doubling each time drafting
is found not to pay again, so the steps lost to trying again shrink to nothing over a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Rate:
    """Decayed sums of emitted tokens and seconds over measured steps."""

    steps: int = 0
    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: float, seconds: float, decay: float) -> None:
        self.steps += 1
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _BatchSize:
    plain: _Rate = field(default_factory=_Rate)
    drafted: _Rate = field(default_factory=_Rate)
    since_plain: int = 0  # drafted-on steps since the last plain one
    off_for: int = 0  # steps left with drafting off
    backoff: int = 0  # the next wait once drafting is found not to pay


@dataclass
class PaidDrafting:
    """Per batch size, whether to draft this step (`allows`), from the measured steps (`observe`)."""

    margin: float = 0.02  # drafted steps must emit at least (1 - margin) of the plain rate
    min_steps: int = 4  # drafted steps measured before a verdict
    min_plain: int = 2  # plain steps measured before drafted ones are judged
    baseline_every: int = 16  # while drafting is on, every this-many'th step runs plain
    first_backoff: int = 32  # steps drafting stays off the first time it is found not to pay
    max_backoff: int = 4096
    decay: float = 0.95
    _sizes: dict[int, _BatchSize] = field(default_factory=dict)
    suspensions: int = 0  # times drafting was turned off for a batch size
    plain_probes: int = 0  # steps left undrafted to measure the plain rate

    def allows(self, rows: int) -> bool:
        """Whether a step of `rows` sequences may verify drafts (counts the step: call once per step)."""
        size = self._sizes.setdefault(rows, _BatchSize())
        if size.off_for > 0:
            size.off_for -= 1
            if size.off_for == 0:
                size.drafted = _Rate()  # try again: judged afresh
            return False
        size.since_plain += 1
        if size.plain.steps < self.min_plain or size.since_plain >= self.baseline_every:
            self.plain_probes += 1
            return False
        return True

    def observe(self, rows: int, drafted: int, emitted: int, seconds: float) -> None:
        """A measured step of `rows` sequences that verified `drafted` draft tokens and emitted `emitted`."""
        if seconds <= 0 or rows <= 0:
            return
        size = self._sizes.setdefault(rows, _BatchSize())
        if drafted == 0:
            size.plain.add(emitted, seconds, self.decay)
            size.since_plain = 0
            return
        size.drafted.add(emitted, seconds, self.decay)
        if size.drafted.steps < self.min_steps or size.plain.steps < self.min_plain:
            return
        if size.drafted.rate < (1.0 - self.margin) * size.plain.rate:
            size.backoff = min(self.max_backoff, 2 * size.backoff if size.backoff else self.first_backoff)
            size.off_for = size.backoff
            self.suspensions += 1

    def gain(self, rows: int) -> float | None:
        """The measured drafted rate over the plain rate at `rows` (None until both are measured)."""
        size = self._sizes.get(rows)
        if size is None or not size.drafted.steps or not size.plain.steps:
            return None
        return size.drafted.rate / size.plain.rate

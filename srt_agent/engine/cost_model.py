"""How many draft nodes to verify: a verification-time model and an expected-throughput choice.

Verification time (the forward pass, the LM head and sampling) is predicted per step shape — number
of sequences and total tokens fed — from measurements: start-up calibration and every step's measured
time (an exponential moving average per shape). Matrix kernels make that cost far from linear on small
shapes (on a CPU, 4 rows can cost 40% more than 3), so measured shapes use their own figure; unseen
shapes fall back on a linear fit ``fixed_s + per_token_s * tokens`` (exponentially weighted least
squares over all steps). Each drafted node's score is its expected acceptance (calibrated by
`acceptance.AcceptanceModel`), so verifying a set of nodes yields ``num_sequences + sum(scores)``
tokens in expectation. The choice takes nodes in decreasing score order (a parent always scores at least
its child, so every prefix of that order is a tree) and keeps the prefix with the most expected tokens
per second: a lone sequence verifies long drafts, a full compute-bound batch few or none.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cache.draft import Draft
from .tree import sub_draft


@dataclass
class ForwardCostModel:
    """Predicted seconds of one verification step, by (sequences, tokens), with a linear fallback."""

    fixed_s: float = 0.05
    per_token_s: float = 0.002
    decay: float = 0.98
    prior_weight: float = 4.0
    shape_weight: float = 0.25  # how far one new measurement moves its shape's figure

    def __post_init__(self) -> None:
        self._sums = [0.0] * 5  # weight, Σx, Σy, Σxx, Σxy
        self._prior: list[tuple[int, float]] = []
        self._shapes: dict[tuple[int, int], float] = {}

    def calibrate(self, samples: list[tuple[int, float]]) -> None:
        """Fit from one-sequence (tokens, seconds) measurements; they stay as a prior for the line and
        seed the figures of their shapes."""
        self._prior = list(samples)
        self._sums = [0.0] * 5
        self._shapes = {(1, tokens): seconds for tokens, seconds in samples}
        self._refit()

    def observe(self, tokens: int, seconds: float, sequences: int = 1) -> None:
        """Add one measured step (older observations decay)."""
        w = self._sums
        for i in range(5):
            w[i] *= self.decay
        w[0] += 1
        w[1] += tokens
        w[2] += seconds
        w[3] += tokens * tokens
        w[4] += tokens * seconds
        self._refit()
        key = (sequences, tokens)
        old = self._shapes.get(key, self.predict(tokens))
        self._shapes[key] = old + self.shape_weight * (seconds - old)

    def _refit(self) -> None:
        n, sx, sy, sxx, sxy = self._sums
        pw = self.prior_weight / max(1, len(self._prior))
        for x, y in self._prior:
            n, sx, sy, sxx, sxy = n + pw, sx + pw * x, sy + pw * y, sxx + pw * x * x, sxy + pw * x * y
        var = n * sxx - sx * sx
        if n <= 0 or var <= 1e-9 * max(1.0, n * sxx):
            return
        slope = (n * sxy - sx * sy) / var
        self.per_token_s = max(slope, 1e-7)
        self.fixed_s = max((sy - self.per_token_s * sx) / n, 1e-6)

    def predict(self, tokens: int, sequences: int | None = None) -> float:
        """Seconds for a step of `sequences` feeding `tokens` (the linear fit when that shape is unmeasured)."""
        if sequences is not None and (sequences, tokens) in self._shapes:
            return self._shapes[(sequences, tokens)]
        return self.fixed_s + self.per_token_s * tokens


def choose_nodes(drafts: list[Draft], base_tokens: int, model: ForwardCostModel) -> list[list[int]]:
    """Per sequence, the draft nodes (sorted) that maximize expected emitted tokens per second.

    `base_tokens` are the pending tokens all sequences feed anyway; every sequence emits one token
    even without a draft. Ties go to fewer nodes.
    """
    candidates = sorted(
        ((score, seq, node) for seq, d in enumerate(drafts) for node, score in enumerate(d.scores)),
        key=lambda c: (-c[0], c[1], c[2]),
    )
    sequences = len(drafts)
    expected = float(sequences)
    best_rate, best_count = expected / model.predict(base_tokens, sequences), 0
    for count, (score, _, _) in enumerate(candidates, start=1):
        expected += score
        rate = expected / model.predict(base_tokens + count, sequences)
        if rate > best_rate:
            best_rate, best_count = rate, count
    chosen: list[list[int]] = [[] for _ in drafts]
    for _, seq, node in candidates[:best_count]:
        chosen[seq].append(node)
    return [sorted(c) for c in chosen]


def choose_drafts(drafts: list[Draft], base_tokens: int, model: ForwardCostModel) -> list[Draft]:
    """The sub-drafts `choose_nodes` picks."""
    return [sub_draft(d, keep) for d, keep in zip(drafts, choose_nodes(drafts, base_tokens, model))]

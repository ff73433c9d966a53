"""How many draft nodes to verify: a verification-time model and an expected-throughput choice.

Verification time is predicted per step shape (sequences, tokens fed) from start-up calibration and every
step's measured time, with a linear fit for shapes not yet seen. Nodes are taken in decreasing expected
acceptance, and the prefix with the most expected tokens per second is verified: a lone sequence verifies
long drafts, a full compute-bound batch few or none. The model and the choice in full: docs/engine.md,
"Sizing speculation to the batch".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..draft import Draft, sub_draft


@dataclass
class ForwardCostModel:
    """Predicted seconds of one verification step, by (sequences, tokens), with a linear fallback."""

    fixed_s: float = 0.05
    per_token_s: float = 0.002
    per_sequence_s: float = 0.0
    decay: float = 0.98
    prior_weight: float = 4.0
    shape_weight: float = 0.25  # how far one new measurement moves its shape's figure

    def __post_init__(self) -> None:
        self._xtx = np.zeros((3, 3))  # decayed Σ x·xᵀ over x = (1, tokens, sequences - 1)
        self._xty = np.zeros(3)
        self._prior_xtx = np.zeros((3, 3))  # the calibration's, weighted to `prior_weight` in all
        self._prior_xty = np.zeros(3)
        self._shapes: dict[tuple[int, int], float] = {}

    def calibrate(self, samples: list[tuple]) -> None:
        """Fit from (tokens, seconds[, sequences]) measurements (one sequence unless given); they stay
        as a prior for the line and seed the figures of their shapes."""
        prior = [(tokens, seconds, rest[0] if rest else 1) for tokens, seconds, *rest in samples]
        weight = self.prior_weight / max(1, len(prior))
        self._prior_xtx, self._prior_xty = np.zeros((3, 3)), np.zeros(3)
        for tokens, seconds, sequences in prior:
            x = _features(tokens, sequences)
            self._prior_xtx += weight * np.outer(x, x)
            self._prior_xty += weight * seconds * x
        self._xtx, self._xty = np.zeros((3, 3)), np.zeros(3)
        self._shapes = {(sequences, tokens): seconds for tokens, seconds, sequences in prior}
        self._refit()

    def observe(self, tokens: int, seconds: float, sequences: int = 1) -> None:
        """Add one measured step (older observations decay)."""
        x = _features(tokens, sequences)
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + seconds * x
        self._refit()
        key = (sequences, tokens)
        old = self._shapes.get(key, self.predict(tokens, sequences))
        self._shapes[key] = old + self.shape_weight * (seconds - old)

    def _refit(self) -> None:
        xtx, xty = self._xtx + self._prior_xtx, self._xty + self._prior_xty
        if xtx[0, 0] <= 0:
            return
        ridge = 1e-9 * np.trace(xtx) * np.eye(3)  # all-one-sequence data leaves the sequence term at 0
        solution = _nonnegative_solve(xtx + ridge, xty)
        if solution is None:
            return
        fixed, per_token, per_sequence = solution
        self.per_token_s = max(float(per_token), 1e-7)
        self.per_sequence_s = max(float(per_sequence), 0.0)
        self.fixed_s = max(float(fixed), 1e-6)

    def measured(self) -> list[dict]:
        """The per-shape figures (calibrated and observed), as {"sequences", "tokens", "seconds"} rows."""
        return [dict(sequences=q, tokens=t, seconds=self._shapes[(q, t)]) for q, t in sorted(self._shapes)]

    def cheapest(self, low: int, high: int, sequences: int) -> float:
        """A lower bound on the predicted seconds of a step of `sequences` feeding `low` to `high` tokens: the least
        measured figure there, or the line's at `low` (the line rises with tokens)."""
        measured = [s for (q, t), s in self._shapes.items() if q == sequences and low <= t <= high]
        return min(measured + [self.fixed_s + self.per_token_s * low + self.per_sequence_s * (sequences - 1)])

    def predict(self, tokens: int, sequences: int | None = None) -> float:
        """Seconds for a step of `sequences` (default 1) feeding `tokens` (the fit when that shape is unmeasured)."""
        if sequences is not None and (sequences, tokens) in self._shapes:
            return self._shapes[(sequences, tokens)]
        return self.fixed_s + self.per_token_s * tokens + self.per_sequence_s * ((sequences or 1) - 1)


def _nonnegative_solve(a: np.ndarray, c: np.ndarray) -> np.ndarray | None:
    """argmin over b >= 0 of bᵀAb - 2bᵀc (least squares from normal equations, no negative cost term).

    Decoding-only steps feed one token per sequence, so tokens and sequences rise together and the
    unconstrained fit can trade a large negative term for large positive ones; clamping such a fit
    afterwards predicts nonsense off the data. With three terms every subset of free ones is tried.
    """
    best, best_value = None, float("inf")
    for mask in range(1, 1 << len(c)):
        free = [i for i in range(len(c)) if mask >> i & 1]
        try:
            part = np.linalg.solve(a[np.ix_(free, free)], c[free])
        except np.linalg.LinAlgError:
            continue
        if (part < 0).any():
            continue
        b = np.zeros(len(c))
        b[free] = part
        value = float(b @ a @ b - 2 * b @ c)
        if value < best_value:
            best, best_value = b, value
    return best


def _features(tokens: int, sequences: int) -> np.ndarray:
    """The regressors of the linear fit: (1, tokens, sequences - 1)."""
    return np.array([1.0, tokens, sequences - 1])


def choose_nodes(
    drafts: list[Draft],
    base_tokens: int,
    model: ForwardCostModel,
    min_gain: float = 0.0,
    makespan: bool = False,
    calibrate: Callable[[Draft], Draft] | None = None,
    joint: bool = False,
) -> list[list[int]]:
    """Per sequence, the draft nodes (sorted) that maximize expected emitted tokens per second.

    `base_tokens` are the pending tokens all sequences feed anyway; every sequence emits one token
    even without a draft. Ties go to fewer nodes. Nothing is verified unless the best choice beats
    verifying nothing by the fraction `min_gain` (a margin for the models' errors).

    With `makespan` (no request waits: what counts is when the last sequence finishes, and any of
    them may be that one) the rate is that of the sequence that gains least, so a step is only made
    slower when every sequence in it expects to gain: a full batch with undrafted sequences verifies
    nothing, a lone sequence exactly as many nodes as for throughput.

    `calibrate` maps each draft to one with calibrated scores before the choice (skipped when the
    makespan rule already rules every draft out). `joint`: see `best_prefix`.
    """
    if makespan and not all(len(d) for d in drafts):
        return [[] for _ in drafts]
    if calibrate is not None:
        drafts = [calibrate(d) for d in drafts]
    best = best_prefix(drafts, base_tokens, model, makespan, joint=joint)
    best_count = best.count if best.rate >= (1.0 + min_gain) * best.base_rate else 0
    chosen: list[list[int]] = [[] for _ in drafts]
    for _, seq, node in best.candidates[:best_count]:
        chosen[seq].append(node)
    return [sorted(c) for c in chosen]


@dataclass
class PrefixChoice:
    """The best prefix of a step's draft nodes by score: its expected rate and size, and the rate of
    verifying nothing (one token per sequence, without `extra_s`)."""

    rate: float
    count: int
    base_rate: float
    candidates: list[tuple[float, int, int]]  # (score, sequence, node), best first


def best_prefix(
    drafts: list[Draft],
    base_tokens: int,
    model: ForwardCostModel,
    makespan: bool = False,
    extra_s: float = 0.0,
    joint: bool = False,
) -> PrefixChoice:
    """Expected emitted tokens per second of verifying the best-scored prefix of all nodes, where the
    step also spends `extra_s` before verifying (a draft model's passes); see `choose_nodes`.

    With `makespan` and `joint`, the slowest sequence's gain is its expectation, not the least of the
    sequences' expectations (see `JointMinimum`): far stricter for a full batch, the same for one sequence.
    """
    sequences = len(drafts)
    candidates = sorted(
        ((score, seq, node) for seq, d in enumerate(drafts) for node, score in enumerate(d.scores)),
        key=lambda c: (-c[0], c[1], c[2]),
    )
    gains = [0.0] * sequences  # expected accepted tokens per sequence so far
    total = 0.0
    floor = 1.0 if makespan else float(sequences)  # tokens emitted without any accepted node
    verify_none = model.predict(base_tokens, sequences)
    base_rate = floor / verify_none
    best_rate, best_count = floor / (verify_none + extra_s), 0
    slowest = JointMinimum(drafts) if makespan and joint else None
    for count, (score, seq, node) in enumerate(candidates, start=1):
        gains[seq] += score
        total += score
        if slowest is not None:
            slowest.add(seq, node, score)
            emitted = 1.0 + slowest.expected()
        else:
            emitted = 1.0 + min(gains) if makespan else sequences + total
        rate = emitted / (model.predict(base_tokens + count, sequences) + extra_s)
        if rate > best_rate:
            best_rate, best_count = rate, count
    return PrefixChoice(best_rate, best_count, base_rate, candidates)


def joint_rate_bound(model: ForwardCostModel, sequences: int, reach: Sequence[float]) -> float:
    """An upper bound on the rate `best_prefix` can reach with `makespan` and `joint` for `sequences` decoding rows
    (one pending token each) drafting chains, where ``reach[d - 1]`` bounds the product over the sequences of the
    chance that each accepts at least d drafted tokens (1 for a row not drafted yet, 0 past a row's chain): a
    choice that reaches d levels of every row verifies at least d nodes per row and expects its slowest row to
    accept at most ``sum(reach[:d])``. Compare it with ``1 / model.predict(sequences, sequences)`` (verifying
    nothing) to skip drafting that cannot pay."""
    top, expected, best = sequences * (1 + len(reach)), 1.0, 0.0
    for d, level in enumerate(reach, start=1):
        expected += level
        best = max(best, expected / model.cheapest(sequences * (1 + d), top, sequences))
    return best


class JointMinimum:
    """E[min over sequences of accepted tokens] for a growing choice of draft nodes.

    A sequence accepts at least d tokens exactly when its accepted path passes a chosen node at depth d,
    and those events are disjoint, so P_i(≥ d) is the sum of its chosen depth-d nodes' (calibrated path)
    scores. With sequences independent, E[min] = Σ_d Π_i P_i(≥ d): near zero for a full batch unless every
    sequence is nearly sure to accept, where the least of the expectations would promise far more.
    """

    def __init__(self, drafts: list[Draft]):
        self.depths = [d.depths() for d in drafts]
        levels = max((max(ds, default=0) for ds in self.depths), default=0)
        self.reach = [[0.0] * (levels + 1) for _ in drafts]  # P_i(≥ d), d = 1 … levels
        self.missing = [len(drafts)] * (levels + 1)  # sequences with P_i(≥ d) = 0
        self.product = [1.0] * (levels + 1)  # Π of the nonzero P_i(≥ d)

    def add(self, seq: int, node: int, score: float) -> None:
        d = self.depths[seq][node]
        old = self.reach[seq][d]
        new = min(1.0, old + max(score, 0.0))
        if new <= 0.0:
            return
        if old <= 0.0:
            self.missing[d] -= 1
            self.product[d] *= new
        else:
            self.product[d] *= new / old
        self.reach[seq][d] = new

    def expected(self) -> float:
        return sum(p for d, (p, m) in enumerate(zip(self.product, self.missing)) if d > 0 and m == 0)


def choose_drafts(
    drafts: list[Draft],
    base_tokens: int,
    model: ForwardCostModel,
    min_gain: float = 0.0,
    makespan: bool = False,
    calibrate: Callable[[Draft], Draft] | None = None,
    joint: bool = False,
) -> list[Draft]:
    """The sub-drafts `choose_nodes` picks (with the drafts' own scores, whatever `calibrate` made of them)."""
    chosen = choose_nodes(drafts, base_tokens, model, min_gain, makespan, calibrate, joint)
    return [sub_draft(d, keep) for d, keep in zip(drafts, chosen)]

"""Calibrating drafters' scores with the acceptance the engine actually observes.

A drafter scores each node with its estimate that the path to the node is accepted. Tree drafters
estimate it from few counts (a continuation seen once scores 1.0) and are overconfident, so a cost
model trusting them verifies long drafts that mostly fail. The engine therefore learns, per bin of a
node's *conditional* score (its score over its parent's), how often a node whose parent was accepted
was accepted itself; a node's calibrated score is the product of calibrated conditionals along its
path, so a child never outscores its parent and a chosen set of nodes stays a tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..cache.draft import Draft


def conditionals(draft: Draft) -> list[float]:
    """Each node's score divided by its parent's (the root's children: their own score), in [0, 1]."""
    out = []
    for score, parent in zip(draft.scores, draft.parents):
        top = draft.scores[parent] if parent >= 0 else 1.0
        out.append(min(max(score / top, 0.0), 1.0) if top > 0 else 0.0)
    return out


@dataclass
class AcceptanceModel:
    """Observed acceptance per bin of conditional score, shrunk toward the raw score by a prior.

    Counts decay by `decay` at every `observe` call (one engine step), so the calibration follows the
    trees as they fill and the policy as it changes.
    """

    bins: int = 10
    prior_weight: float = 4.0
    decay: float = 0.995
    tested: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tested = self.tested or [0.0] * self.bins
        self.accepted = self.accepted or [0.0] * self.bins

    def _bin(self, p: float) -> int:
        return min(int(p * self.bins), self.bins - 1)

    def conditional(self, p: float) -> float:
        """Calibrated probability that a node of raw conditional score `p` is accepted, given its parent is."""
        b = self._bin(p)
        return (self.accepted[b] + self.prior_weight * p) / (self.tested[b] + self.prior_weight)

    def calibrate(self, draft: Draft) -> Draft:
        """The draft with calibrated path scores."""
        scores: list[float] = []
        for parent, p in zip(draft.parents, conditionals(draft)):
            scores.append((scores[parent] if parent >= 0 else 1.0) * self.conditional(p))
        return replace(draft, scores=scores)

    def observe(self, drafts: list[Draft], accepted: list[list[int]]) -> None:
        """Record one step's verified drafts (raw scores) and the nodes accepted in each."""
        self.tested = [x * self.decay for x in self.tested]
        self.accepted = [x * self.decay for x in self.accepted]
        for draft, acc in zip(drafts, accepted):
            kept = set(acc)
            for node, (parent, p) in enumerate(zip(draft.parents, conditionals(draft))):
                if parent < 0 or parent in kept:
                    b = self._bin(p)
                    self.tested[b] += 1
                    self.accepted[b] += node in kept

"""Calibrating drafters' scores with the acceptance the engine actually observes.

A drafter scores each node with its estimate that the path to the node is accepted. Tree drafters
estimate it from few counts (a continuation seen once scores 1.0) and are overconfident, so a cost
model trusting them verifies long drafts that mostly fail. The engine therefore learns, per bin of a
node's *conditional* score (its score over its parent's) and of the draft's match length (a draft
hanging off a long matched context is far likelier to be right than one off a single token), how
often a node whose parent was accepted was accepted itself. A node's calibrated score is the product
of calibrated conditionals along its path, so a child never outscores its parent and a chosen set of
nodes stays a tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..draft import Draft


def conditionals(draft: Draft) -> list[float]:
    """Each node's score divided by its parent's (the root's children: their own score), in [0, 1]."""
    out = []
    for score, parent in zip(draft.scores, draft.parents):
        top = draft.scores[parent] if parent >= 0 else 1.0
        out.append(min(max(score / top, 0.0), 1.0) if top > 0 else 0.0)
    return out


@dataclass
class AcceptanceModel:
    """Observed acceptance per (conditional-score bin, match-length bucket), shrunk toward the raw
    score scaled by the drafter's overall confidence (accepted over raw-score-expected, all cells
    together), so cells with few observations learn from the others.

    Counts decay by `decay` at every step that verified a draft, so the calibration follows the trees
    as they fill and the policy as it changes (and stays put while nothing is verified).
    """

    bins: int = 10
    match_buckets: tuple[int, ...] = (2, 4, 8)  # match lengths below 2, below 4, below 8, the rest
    prior_weight: float = 4.0
    decay: float = 0.995
    tested: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    expected_total: float = 0.0  # Σ raw conditional score over tested nodes
    accepted_total: float = 0.0
    nodes_tested: int = 0  # lifetime counts (not decayed): nodes whose parent was accepted …
    nodes_accepted: int = 0  # … and those of them accepted

    def __post_init__(self) -> None:
        cells = self.bins * (len(self.match_buckets) + 1)
        self.tested = self.tested or [0.0] * cells
        self.accepted = self.accepted or [0.0] * cells

    def _cell(self, p: float, match_len: int) -> int:
        bucket = sum(match_len >= edge for edge in self.match_buckets)
        return bucket * self.bins + min(int(p * self.bins), self.bins - 1)

    def conditional(self, p: float, match_len: int = 0) -> float:
        """Calibrated probability that a node of raw conditional score `p`, in a draft that matched
        `match_len` context tokens, is accepted given its parent is."""
        c = self._cell(p, match_len)
        confidence = min(1.0, (self.accepted_total + self.prior_weight) / (self.expected_total + self.prior_weight))
        return (self.accepted[c] + self.prior_weight * p * confidence) / (self.tested[c] + self.prior_weight)

    def rate(self, prior: float, weight: float = 8.0) -> float:
        """Recent acceptance of a node whose parent was accepted, whatever its score (decayed counts,
        shrunk toward `prior` with `weight` pseudo-observations): a chain's expected per-token acceptance
        before it is drafted."""
        return (sum(self.accepted) + weight * prior) / (sum(self.tested) + weight)

    def calibrate(self, draft: Draft) -> Draft:
        """The draft with calibrated path scores."""
        scores: list[float] = []
        for parent, p in zip(draft.parents, conditionals(draft)):
            scores.append((scores[parent] if parent >= 0 else 1.0) * self.conditional(p, draft.match_len))
        return replace(draft, scores=scores)

    def observe(self, drafts: list[Draft], accepted: list[list[int]]) -> None:
        """Record one step's verified drafts (raw scores) and the nodes accepted in each."""
        if not any(len(d) for d in drafts):
            return
        self.tested = [x * self.decay for x in self.tested]
        self.accepted = [x * self.decay for x in self.accepted]
        self.expected_total *= self.decay
        self.accepted_total *= self.decay
        for draft, acc in zip(drafts, accepted):
            kept = set(acc)
            for node, (parent, p) in enumerate(zip(draft.parents, conditionals(draft))):
                if parent < 0 or parent in kept:
                    c = self._cell(p, draft.match_len)
                    self.tested[c] += 1
                    self.accepted[c] += node in kept
                    self.expected_total += p
                    self.accepted_total += node in kept
                    self.nodes_tested += 1
                    self.nodes_accepted += node in kept

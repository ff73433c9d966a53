"""The draft a drafter hands to the engine: a token tree in topological order."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Draft:
    """A drafted token tree hanging off the last context token.

    Node i proposes ``token_ids[i]`` as the continuation of its parent ``parents[i]``
    (-1 = the context itself); parents always come before children. ``scores[i]`` is the
    product of empirical conditional probabilities along the path to node i (its expected
    acceptance); ``match_len`` is how many context tokens the drafter matched. ``source`` says what
    proposed it ("tree": a token tree or lookup; "model": a draft model), so acceptance is calibrated
    per source. ``old_logprobs``, set only by drafters that reuse earlier rollouts with lenient acceptance
    (SPEC-RL), holds each node's log-probability under the policy that sampled it; such a draft is
    verified by the lenient rule (not exactly on-policy), every other draft token for token.
    """

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    match_len: int = 0
    source: str = "tree"
    old_logprobs: list[float] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def expected_accepted(self) -> float:
        """Expected number of accepted draft tokens (sum of path scores)."""
        return float(sum(self.scores))

    def depths(self) -> list[int]:
        """Depth of each node (1 for children of the context)."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def path_to(self, node: int) -> list[int]:
        """Tokens from the root down to `node`, inclusive."""
        path = []
        while node >= 0:
            path.append(self.token_ids[node])
            node = self.parents[node]
        return path[::-1]

    def truncated(self, budget: int) -> Draft:
        """The first `budget` nodes (still a valid tree, since parents precede children)."""
        n = max(0, min(budget, len(self)))
        old = self.old_logprobs[:n] if self.old_logprobs is not None else None
        return Draft(
            self.token_ids[:n], self.parents[:n], self.scores[:n], self.match_len if n else 0, self.source, old
        )


EMPTY_DRAFT = Draft()


def sub_draft(draft: Draft, keep: list[int]) -> Draft:
    """The draft restricted to the nodes in `keep` (each node's parent must be kept too)."""
    keep = sorted(keep)
    index = {old: new for new, old in enumerate(keep)}
    parents = []
    for old in keep:
        parent = draft.parents[old]
        if parent >= 0 and parent not in index:
            raise ValueError(f"node {old} is kept without its parent {parent}")
        parents.append(index[parent] if parent >= 0 else -1)
    scores = [draft.scores[i] for i in keep] if draft.scores else [0.0] * len(keep)
    old = [draft.old_logprobs[i] for i in keep] if draft.old_logprobs is not None else None
    return Draft([draft.token_ids[i] for i in keep], parents, scores, draft.match_len if keep else 0, draft.source, old)


def validate_draft(draft: Draft, vocab_size: int) -> None:
    """Raise ValueError if the draft is not a well-formed token tree over the vocabulary."""
    if len(draft.parents) != len(draft.token_ids):
        raise ValueError(f"draft has {len(draft.token_ids)} tokens but {len(draft.parents)} parents")
    if draft.scores and len(draft.scores) != len(draft.token_ids):
        raise ValueError(f"draft has {len(draft.token_ids)} tokens but {len(draft.scores)} scores")
    for i, (token, parent) in enumerate(zip(draft.token_ids, draft.parents)):
        if not -1 <= parent < i:
            raise ValueError(f"draft node {i} has parent {parent}: parents must precede their children")
        if not 0 <= token < vocab_size:
            raise ValueError(f"draft node {i} has token {token} outside the vocabulary of {vocab_size}")

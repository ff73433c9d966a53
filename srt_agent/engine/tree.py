"""Token-tree helpers for verification: the ancestor intervals of a chunk's tree and sub-drafts."""

from __future__ import annotations

from ..cache.draft import Draft


def draft_order(num_pending: int, parents: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Depth, preorder index and subtree end of every draft node of a chunk, for its attention mask.

    A chunk is ``num_pending`` tokens in sequence (forced tokens, the last sampled token) followed by
    draft nodes whose ``parents`` index other draft nodes (-1 = the last pending token). Number the
    chunk's entries in depth-first preorder, pending tokens first (entry i < num_pending gets i and
    its subtree ends at the chunk's end): entry j is an ancestor of entry i, or i itself, exactly when
    ``enter[j] <= enter[i] < exit[j]``. So two integers per entry stand for a row of the mask, and the
    device derives the mask from them. Depth counts from the last pending token (its children: 1).
    """
    size = [1] * len(parents)
    for i in range(len(parents) - 1, -1, -1):
        if parents[i] >= 0:
            size[parents[i]] += size[i]
    depth, enter, next_free = [0] * len(parents), [0] * len(parents), [0] * len(parents)
    next_root = num_pending
    for i, parent in enumerate(parents):
        if parent < 0:
            depth[i], enter[i] = 1, next_root
            next_root += size[i]
        elif parent < i:
            depth[i], enter[i] = depth[parent] + 1, next_free[parent]
            next_free[parent] += size[i]
        else:
            raise ValueError(f"draft node {i} has parent {parent}: parents must precede their children")
        next_free[i] = enter[i] + 1
    return depth, enter, [e + s for e, s in zip(enter, size)]


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

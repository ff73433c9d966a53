"""Token-tree helpers for verification: the attention pattern of a chunk and sub-drafts."""

from __future__ import annotations

import torch

from ..cache.draft import Draft


def chunk_attention(num_pending: int, parents: list[int]) -> torch.Tensor:
    """Which chunk entries each chunk entry attends to (ancestors and itself), as a bool matrix.

    A chunk is ``num_pending`` tokens in sequence (forced tokens, the last sampled token) followed by
    draft nodes whose ``parents`` index other draft nodes (-1 = the last pending token).
    """
    n = num_pending + len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:num_pending, :num_pending] = torch.ones(num_pending, num_pending, dtype=torch.bool).tril()
    for i, parent in enumerate(parents):
        row = num_pending + i
        if parent < 0:
            mask[row, :num_pending] = True
        else:
            mask[row] = mask[num_pending + parent]
        mask[row, row] = True
    return mask


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

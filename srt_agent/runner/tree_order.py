"""The ancestor intervals of a chunk's token tree, from which the device builds its attention mask."""

from __future__ import annotations


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

"""Ways to choose the one chain a linear draft offers from a tree, for `bench headroom --choice` to measure
against the most frequent path (SRT's proposer's choice) and the oracle.

Each choice maps (trees, key, context, k) to a chain `Draft` of at most k tokens:

- ``frequent``: the most frequent child at every step from the longest matched context (SRT's);
- ``expected``: the chain with the most expected accepted tokens (the sum of its path frequencies) among the
  ``8k`` most likely nodes of the tree drafted best-first, instead of the locally most frequent child;
- ``context-N``: the most frequent path after at most the last N context tokens (shorter contexts have
  more occurrences to count);
- ``backoff-N``: the most frequent path after the longest context suffix that occurs at least N times;
- ``tree-N``: not a chain: the N most likely nodes drafted best-first, as our engine verifies them in one pass
  (what several paths collect of the oracle's share where the engine verifies token trees).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..drafting import Draft, RolloutCache

Choice = Callable[[RolloutCache, str, Sequence[int], int], Draft]


def frequent(cache: RolloutCache, key: str, context: Sequence[int], k: int) -> Draft:
    return cache.draft(key, context, k, chain=True)


def expected(cache: RolloutCache, key: str, context: Sequence[int], k: int) -> Draft:
    tree = cache.draft(key, context, 8 * k)
    if not len(tree):
        return tree
    depth = [0] * len(tree)
    for i, parent in enumerate(tree.parents):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
    value, best = [0.0] * len(tree), [-1] * len(tree)
    for i in reversed(range(len(tree))):  # children come after their parents
        if depth[i] > k:
            continue
        value[i] = tree.scores[i] + (value[best[i]] if best[i] >= 0 else 0.0)
        parent = tree.parents[i]
        if parent >= 0 and (best[parent] < 0 or value[i] > value[best[parent]]):
            best[parent] = i
    node = max((i for i, parent in enumerate(tree.parents) if parent < 0), key=value.__getitem__)
    tokens, scores = [], []
    while node >= 0:
        tokens.append(tree.token_ids[node])
        scores.append(tree.scores[node])
        node = best[node]
    return Draft(tokens, list(range(-1, len(tokens) - 1)), scores, tree.match_len)


def context(n: int) -> Choice:
    def choose(cache: RolloutCache, key: str, ctx: Sequence[int], k: int) -> Draft:
        return cache.draft(key, list(ctx[-n:]), k, chain=True)

    return choose


def backoff(n: int) -> Choice:
    def choose(cache: RolloutCache, key: str, ctx: Sequence[int], k: int) -> Draft:
        tail = list(ctx[-cache.max_match :])
        for length in range(len(tail), 0, -1):
            if cache.count(key, tail[-length:]) >= n:
                draft = cache.draft(key, tail[-length:], k, chain=True)
                if len(draft):
                    return draft
        return cache.draft(key, tail, k, chain=True)

    return choose


def tree(n: int) -> Choice:
    def choose(cache: RolloutCache, key: str, ctx: Sequence[int], k: int) -> Draft:
        return cache.draft(key, ctx, n)

    return choose


KINDS = {"context": context, "backoff": backoff, "tree": tree}


def chain_choice(name: str) -> Choice:
    """The choice called `name` (frequent, expected, context-N, backoff-N, tree-N)."""
    if name in ("frequent", "expected"):
        return frequent if name == "frequent" else expected
    kind, _, number = name.partition("-")
    if kind in KINDS and number.isdigit() and int(number) > 0:
        return KINDS[kind](int(number))
    raise ValueError(f"unknown chain choice {name!r}; choose frequent, expected, context-N, backoff-N or tree-N")


__all__ = ["Choice", "chain_choice"]

"""The readable reference token tree: a depth-bounded trie with one node per path.

It defines the semantics the compiled tree (``_tree.cpp``) must reproduce exactly:

* every stored sequence contributes each of its windows of length <= ``max_depth``, so
  ``count(path)`` is the number of occurrences of ``path`` in the stored sequences;
* sequences grow by streaming (``extend``), one cursor per live suffix, O(max_depth) per token;
* ``match`` finds the longest suffix of a context (at most ``max_match`` tokens) whose node has a
  continuation; ``draft`` grows a token tree best-first from it by the product of
  ``count(child) / count(node)``, ties broken by push order (children by count desc, token asc).

Memory is O(tokens x max_depth): this is the fallback when the extension is missing, and the
oracle the tests compare the compiled tree against.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..tokens import check_tokens

DraftTuple = tuple[list[int], list[int], list[float], int]

_NODE_BYTES = 200  # rough CPython cost of a node: object + dict entry + children dict share


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


class ReferenceTokenTree:
    """Depth-bounded trie of all windows of the stored sequences, with occurrence counts."""

    backend = "python"

    def __init__(self, max_depth: int = 64) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node()
        self.num_nodes = 1
        self._seqs: list[list[int]] = []
        self._cursors: dict[int, list[_Node]] = {}  # live sequences: node of each live suffix

    @property
    def num_tokens(self) -> int:
        return self.root.count

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    @property
    def nbytes(self) -> int:
        return self.num_nodes * _NODE_BYTES + self.num_tokens * 8

    def add_sequence(self) -> int:
        """Open a new (empty) sequence and return its id."""
        self._seqs.append([])
        self._cursors[len(self._seqs) - 1] = []
        return len(self._seqs) - 1

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        """Append validated tokens to open sequence `seq`, counting every new window."""
        cursors = self._open(seq)
        tokens = check_tokens(tokens)
        self._seqs[seq].extend(tokens)
        for tok in tokens:
            self.root.count += 1
            cursors.append(self.root)
            keep = []
            for node in cursors:
                child = node.children.get(tok)
                if child is None:
                    child = node.children[tok] = _Node()
                    self.num_nodes += 1
                child.count += 1
                keep.append(child)
            # The oldest cursor is first; it is dropped once its window reaches max_depth.
            self._cursors[seq] = cursors = keep[1:] if len(keep) >= self.max_depth else keep

    def close(self, seq: int) -> None:
        """Mark `seq` finished: it keeps its counts but takes no more tokens."""
        self._open(seq)
        del self._cursors[seq]

    def sequence(self, seq: int, start: int = 0) -> list[int]:
        """The tokens of sequence `seq` from position `start` on."""
        return self._seqs[seq][max(start, 0) :]

    def sequence_length(self, seq: int) -> int:
        return len(self._seqs[seq])

    def is_open(self, seq: int) -> bool:
        return seq in self._cursors

    def count(self, path: Sequence[int]) -> int:
        """Occurrences of `path` (a token string of length 1..max_depth); 0 if absent."""
        node = self._walk(path)
        return 0 if node is None or not path else node.count

    def match(self, context: Sequence[int], max_match: int) -> int:
        """Length of the longest context suffix (<= max_match) whose node has a continuation."""
        return self._match(context, max_match)[1]

    def draft(
        self,
        context: Sequence[int],
        budget: int,
        max_match: int,
        chain: bool = False,
        min_prob: float = 0.0,
        seq: int = -1,
    ) -> DraftTuple:
        """Best-first draft tree of at most `budget` nodes: (tokens, parents, scores, match_len).

        A node's score is its path probability: the product, along the path, of each token's share of
        the occurrences of its context that went on (occurrences ending there, such as the drafting
        sequence's own last window, do not vote).

        `seq` (an open sequence the context may end like) only speeds up the compiled tree.
        """
        node, match_len = self._match(check_tokens(context, "context"), max_match)
        if node is None or budget <= 0:
            return [], [], [], 0
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        heap: list[tuple[float, int, int, int, _Node]] = []
        pushed = 0

        def push_children(parent_node: _Node, index: int, score: float, room: int) -> None:
            nonlocal pushed
            kids = sorted(parent_node.children.items(), key=lambda kv: (-kv[1].count, kv[0]))
            continued = sum(child.count for _, child in kids)  # not the occurrences that end here
            for tok, child in kids[: 1 if chain else room]:
                s = score * (child.count / continued)
                if s < min_prob:
                    break
                heapq.heappush(heap, (-s, pushed, index, tok, child))
                pushed += 1

        push_children(node, -1, 1.0, budget)
        while heap and len(tokens) < budget:
            neg, _, parent, tok, child = heapq.heappop(heap)
            tokens.append(tok)
            parents.append(parent)
            scores.append(-neg)
            push_children(child, len(tokens) - 1, -neg, budget - len(tokens))
        return tokens, parents, scores, match_len if tokens else 0

    def _open(self, seq: int) -> list[_Node]:
        try:
            return self._cursors[seq]
        except KeyError:
            raise ValueError(f"sequence {seq} is not open in this tree") from None

    def _walk(self, path: Sequence[int]) -> _Node | None:
        node = self.root
        for tok in path:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    def _match(self, context: Sequence[int], max_match: int) -> tuple[_Node | None, int]:
        n = len(context)
        for length in range(min(n, max_match, self.max_depth - 1), 0, -1):
            node = self._walk(context[n - length :])
            if node is not None and node.children:
                return node, length
        return None, 0

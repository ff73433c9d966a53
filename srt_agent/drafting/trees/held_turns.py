"""`HeldTurns`: finished turns kept so that a trajectory's next turn is recognised by its tokens.

Serving stacks give every turn a fresh request id, so a later request continues a finished turn when its
prompt extends that turn's tokens (prompt + response, then the tool output). A turn held with a ``floor``
below its length may also be continued by a prompt that leaves its tail out: a serving engine that verifies
drafts can sample a few tokens past a stop (inside an accepted draft) that the caller then drops, so the
next prompt shares the turn's tokens up to the stop and goes on with the tool output. Such a prompt must
share more than the first ``floor`` tokens (the context the turn was given: a prompt that stops there is another
rollout of that context) and leave out at most ``max_overshoot`` of the turn's tokens.

Turns are held least recently used first, within a count (``max_held``), a byte budget (``max_bytes``; the
tokens are stored as int32) and an age (``ttl_s``: a trajectory's next turn comes within a tool call's time).
A claim looks only at the turns whose context starts like the prompt: each turn is indexed by a hash of its
first ``BLOCK``-aligned part of its context, and a prompt hashes each of its ``BLOCK``-aligned prefixes once, so
claiming costs O(prompt length + the turns sharing that prefix), not O(turns held).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

BLOCK = 64  # turns are indexed by the hash of their context's first multiple of BLOCK tokens
_BASE = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class _Held:
    tokens: np.ndarray  # int32
    floor: int  # a continuing prompt shares at least these leading tokens
    held_at: float
    anchor: tuple[int, int]  # (length, hash) of the context prefix it is indexed by
    order: int  # when it was held (ties go to the earliest)


def block_hashes(tokens: np.ndarray, upto: int) -> np.ndarray:
    """Hashes of the prefixes ``tokens[:0], tokens[:BLOCK], tokens[:2 * BLOCK], ...`` up to `upto` tokens: a
    polynomial hash mod 2**64 (collisions are caught by the exact comparison that follows a lookup)."""
    n = upto - upto % BLOCK
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(n, _BASE, dtype=np.uint64))
        terms = (tokens[:n].astype(np.uint64) + np.uint64(1)) * powers
        return np.concatenate(([np.uint64(0)], np.cumsum(terms, dtype=np.uint64)[BLOCK - 1 :: BLOCK]))


class HeldTurns:
    """Finished turns by key, claimed by the prompt that continues them."""

    def __init__(
        self,
        max_held: int,
        max_bytes: int | None = None,
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_held < 0:
            raise ValueError(f"max_held must be >= 0, got {max_held}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_held, self.max_bytes, self.ttl_s, self.clock = max_held, max_bytes, ttl_s, clock
        self._turns: OrderedDict[Hashable, _Held] = OrderedDict()  # least recently used first
        self._index: dict[tuple[int, int], set[Hashable]] = {}  # anchor -> keys of the turns it starts
        self.nbytes = 0
        self.compared = 0  # held turns claims compared token by token (the index keeps it to those that may match)
        self._held_count = 0

    def hold(self, key: Hashable, tokens: Sequence[int], floor: int | None = None) -> list[Hashable]:
        """Hold a finished turn (`floor`: how many leading tokens a continuing prompt must share; all by
        default); returns the keys released to stay within the bounds."""
        if key in self._turns:
            self._drop(key)
        array = np.asarray(tokens, dtype=np.int32)
        floor = len(array) if floor is None else floor
        anchor = floor - floor % BLOCK
        held = _Held(array, floor, self.clock(), (anchor, int(block_hashes(array, anchor)[-1])), self._held_count)
        self._held_count += 1
        self._turns[key] = held
        self._index.setdefault(held.anchor, set()).add(key)
        self.nbytes += held.tokens.nbytes
        released = self.expire()
        while self._turns and (
            len(self._turns) > self.max_held or (self.max_bytes is not None and self.nbytes > self.max_bytes)
        ):
            released.append(self._drop(next(iter(self._turns))))
        return released

    def claim(self, prompt_ids: Sequence[int], max_overshoot: int = 0) -> tuple[Hashable, int, int] | None:
        """The held turn that `prompt_ids` continues, removed: (key, how many of its leading tokens the prompt
        shares, its length). The prompt shares all of it, or leaves out up to `max_overshoot` tokens of its tail;
        the turn sharing the most wins."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        hashes = block_hashes(prompt, len(prompt))
        candidates = [key for i, h in enumerate(hashes.tolist()) for key in self._index.get((i * BLOCK, h), ())]
        best, best_shared = None, 0
        for key in sorted(candidates, key=lambda k: self._turns[k].order):  # the earliest held wins a tie
            held = self._turns[key]
            self.compared += 1
            n, floor = len(held.tokens), held.floor
            if floor > len(prompt) or n - max_overshoot > len(prompt) or n <= best_shared:
                continue
            if floor and (
                prompt[floor - 1] != held.tokens[floor - 1] or not np.array_equal(prompt[:floor], held.tokens[:floor])
            ):
                continue
            shared = min(n, len(prompt))
            differ = np.flatnonzero(prompt[floor:shared] != held.tokens[floor:shared])
            if len(differ):
                shared = floor + int(differ[0])
            # a continuation keeps some of the turn past its context: a prompt that stops at the context is a new
            # rollout of it (a GRPO sibling, a later step), not a next turn that dropped the whole response
            continues = shared > floor or shared == n
            if continues and n - shared <= max_overshoot and shared > best_shared:
                best, best_shared = key, shared
        if best is None:
            return None
        length = len(self._turns[best].tokens)
        self._drop(best)
        return best, best_shared, length

    def expire(self) -> list[Hashable]:
        """Release the turns held longer than ``ttl_s``; their keys."""
        if self.ttl_s is None:
            return []
        cutoff = self.clock() - self.ttl_s
        expired = []
        while self._turns and next(iter(self._turns.values())).held_at < cutoff:  # held in time order
            expired.append(self._drop(next(iter(self._turns))))
        return expired

    def release_all(self) -> list[Hashable]:
        """Forget every held turn; returns their keys."""
        keys = list(self._turns)
        self._turns.clear()
        self._index.clear()
        self.nbytes = 0
        return keys

    def _drop(self, key: Hashable) -> Hashable:
        held = self._turns.pop(key)
        self.nbytes -= held.tokens.nbytes
        keys = self._index[held.anchor]
        keys.discard(key)
        if not keys:
            del self._index[held.anchor]
        return key

    def __len__(self) -> int:
        return len(self._turns)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._turns

"""`HeldTurns`: finished turns kept so that a trajectory's next turn is recognised by its tokens.

Serving stacks give every turn a fresh request id, so a later request continues a finished turn when its
prompt extends that turn's tokens (prompt + response, then the tool output). Up to ``max_held`` turns are
held, least recently used released first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class HeldTurns:
    """Finished turns by key (their token lists), claimed by the prompt that continues them."""

    def __init__(self, max_held: int) -> None:
        if max_held < 0:
            raise ValueError(f"max_held must be >= 0, got {max_held}")
        self.max_held = max_held
        self._turns: OrderedDict[Hashable, list[int]] = OrderedDict()  # least recently used first

    def hold(self, key: Hashable, tokens: list[int]) -> list[Hashable]:
        """Hold a finished turn; returns the keys released to stay within ``max_held``."""
        self._turns[key] = tokens
        released = []
        while len(self._turns) > self.max_held:
            released.append(self._turns.popitem(last=False)[0])
        return released

    def claim(self, prompt_ids: Sequence[int]) -> tuple[Hashable, list[int]] | None:
        """The held turn that `prompt_ids` extends (the longest), removed and returned with its tokens."""
        best, best_len = None, 0
        for key, tokens in self._turns.items():
            n = len(tokens)
            if best_len < n <= len(prompt_ids) and prompt_ids[n - 1] == tokens[-1] and list(prompt_ids[:n]) == tokens:
                best, best_len = key, n
        if best is None:
            return None
        return best, self._turns.pop(best)

    def release_all(self) -> list[Hashable]:
        """Forget every held turn; returns their keys."""
        keys = list(self._turns)
        self._turns.clear()
        return keys

    def __len__(self) -> int:
        return len(self._turns)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._turns

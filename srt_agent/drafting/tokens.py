"""Validation of token ids at the cache's boundary, so bad input never reaches a tree."""

from __future__ import annotations

import operator
from collections.abc import Sequence

MAX_TOKEN_ID = 2**31 - 1


def token_id(tok) -> int | None:
    """`tok` as a Python int when it is an integer (numpy and torch integer scalars are), else None (bools,
    floats, strings are not token ids)."""
    if isinstance(tok, bool):
        return None
    try:
        return operator.index(tok)
    except TypeError:
        return None


def check_tokens(token_ids: Sequence[int], what: str = "token_ids") -> list[int]:
    """Return `token_ids` as a list of Python ints (see `token_id`), or raise ValueError naming the bad entry:
    a non-integer, a negative id or one that does not fit in int32."""
    if isinstance(token_ids, (str, bytes)):
        raise ValueError(f"{what} must be a sequence of ints, got {type(token_ids).__name__}")
    out: list[int] = []
    for i, tok in enumerate(token_ids):
        value = token_id(tok)
        if isinstance(tok, bool):
            raise ValueError(f"{what}[{i}] is a bool, expected a token id (int)")
        if value is None:
            raise ValueError(f"{what}[{i}] = {tok!r} is not an integer token id")
        if value < 0 or value > MAX_TOKEN_ID:
            raise ValueError(f"{what}[{i}] = {value} is out of range [0, {MAX_TOKEN_ID}]")
        out.append(value)
    return out


def check_budget(budget: int) -> int:
    """A draft budget: a non-negative int (0 means 'no draft')."""
    if isinstance(budget, bool):
        raise ValueError("budget must be an int, got a bool")
    try:
        value = operator.index(budget)
    except TypeError:
        raise ValueError(f"budget must be an int, got {budget!r}") from None
    if value < 0:
        raise ValueError(f"budget must be >= 0, got {value}")
    return value

"""`RowPlan`: what `SRTProposer` knows of a batch whose rows all decode requests it tracks, so that the next step
of the same rows costs Python O(1) a row (its new tokens reach SRT in one call)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RowPlan:
    """The batch's request ids (all of them, and those of the rows), their rows' state, the rows offered a draft,
    the lengths last stored, and the rows that got a draft (settled at the next step)."""

    version: int
    batch_ids: list
    req_ids: list
    rows: list  # the proposer's _Row of each batch row
    offered: list[int]
    lengths: np.ndarray
    drafted: list = field(default_factory=list)  # (row index, _Row) of the rows that got a draft
    _lengths: np.ndarray | None = None  # this step's new tokens per row (set by `steady`)

    @classmethod
    def of(
        cls, version: int, batch_ids: list, req_ids: list, rows: dict, live: list[int], offered: list[int], lengths
    ) -> RowPlan | None:
        """The plan of a step in which every row was live and known (None otherwise)."""
        if len(live) != len(req_ids):
            return None
        known = [rows.get(rid) for rid in req_ids]
        if None in known:
            return None
        return cls(version, list(batch_ids), list(req_ids), known, offered, np.asarray(lengths, dtype=np.int64))

    def steady(self, version: int, batch: Any, sampled: list[list[int]], num_tokens_no_spec: np.ndarray) -> bool:
        """Whether this step has the same rows (nothing started, left or failed since) and each row's new tokens
        are just what it sampled."""
        if version != self.version or len(sampled) != len(self.req_ids) or not all(sampled):
            return False
        if batch.req_ids != self.batch_ids:
            return False
        self._lengths = np.fromiter(map(len, sampled), np.int64, len(sampled))
        return bool(np.array_equal(num_tokens_no_spec[: len(sampled)] - self.lengths, self._lengths))

    def offsets(self) -> np.ndarray:
        """Where each row's new tokens start in the step's flat tokens (and the end)."""
        out = np.zeros(len(self._lengths) + 1, dtype=np.int64)
        np.cumsum(self._lengths, out=out[1:])
        return out

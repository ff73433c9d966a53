"""Prefix sharing at admission: a new sequence starts with the longest prefix whose KV already exists.

Two sources, the longer wins: another sequence's slot (running or held; any length up to what it has
cached, so GRPO siblings share their whole prompt and a shared system prompt is found in whoever holds
it) and the :class:`~srt_agent.engine.prefix_cache.PrefixCache` (full blocks that outlive the sequences
that computed them). The KV is copied into the new slot and only the rest of the prompt is prefilled.
A sequence that would share more with one admitted in the same step waits one step for it, so
siblings admitted together compute their common prompt once instead of racing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runner.kv_cache import KVCache
from .prefix_cache import CachedBlock, PrefixCache
from .sequence import Sequence, common_prefix


@dataclass
class Reuse:
    """Where a sequence's cached prefix comes from: a live slot, or pool blocks."""

    tokens: int = 0
    slot: int | None = None
    blocks: list[CachedBlock] | None = None


@dataclass
class PrefixStats:
    admitted: int = 0  # sequences admitted into a slot
    reused_tokens: int = 0  # prompt tokens whose KV was copied instead of computed
    from_slots: int = 0  # tokens copied from another sequence's slot
    from_pool: int = 0  # tokens copied from pool blocks
    waits: int = 0  # admissions put off one step to share with a sequence admitted in that step


class PrefixSharing:
    """Finds and copies reusable prefixes into new slots; stores full blocks in the pool after each step."""

    def __init__(self, kv: KVCache, pool: PrefixCache | None, min_wait_gain: int):
        self.kv = kv
        self.pool = pool
        self.min_wait_gain = min_wait_gain
        self.stats = PrefixStats()

    def find(self, seq: Sequence, live: list[Sequence]) -> Reuse:
        """The longest reusable prefix of `seq` (at most all tokens but the last, whose logits are needed)."""
        limit = len(seq.tokens) - 1
        best = Reuse()
        for other in live:
            if other is not seq and other.slot is not None and other.num_cached > best.tokens:
                n = common_prefix(seq.tokens, other.tokens, min(limit, other.num_cached))
                if n > best.tokens:
                    best = Reuse(n, slot=other.slot)
        if self.pool is not None:
            blocks = self.pool.match(seq.tokens, limit)
            if len(blocks) * self.pool.block_size > best.tokens:
                best = Reuse(len(blocks) * self.pool.block_size, blocks=blocks)
        return best

    def worth_waiting(self, seq: Sequence, reuse: Reuse, admitted: list[Sequence]) -> bool:
        """Whether a sequence admitted this step will, once prefilled, give `seq` `min_wait_gain` more tokens."""
        limit = len(seq.tokens) - 1
        gain = max((common_prefix(seq.tokens, a.tokens, limit) for a in admitted), default=0) - reuse.tokens
        if gain >= self.min_wait_gain:
            self.stats.waits += 1
            return True
        return False

    def attach(self, seq: Sequence, live: list[Sequence]) -> int:
        """Copy the best reusable prefix into `seq`'s new slot; returns its length (the new ``num_cached``)."""
        reuse = self.find(seq, live)
        if reuse.slot is not None:
            self.kv.copy_prefix(reuse.slot, seq.slot, reuse.tokens)
            self.stats.from_slots += reuse.tokens
        elif reuse.blocks:
            self.pool.load(reuse.blocks, seq.tokens, self.kv, seq.slot)
            self.stats.from_pool += reuse.tokens
        self.stats.admitted += 1
        self.stats.reused_tokens += reuse.tokens
        seq.metrics.prefill_reused += reuse.tokens
        seq.stored_blocks = reuse.tokens // self.pool.block_size if self.pool is not None else 0
        return reuse.tokens

    def store(self, seqs: list[Sequence]) -> None:
        """Put the full blocks that `seqs` completed in the pool."""
        if self.pool is None:
            return
        for seq in seqs:
            full = seq.num_cached // self.pool.block_size
            if seq.slot is not None and full > seq.stored_blocks:
                self.pool.store(seq.tokens, full, self.kv, seq.slot)
                seq.stored_blocks = full

    def clear(self) -> None:
        """Forget every stored block (new weights)."""
        if self.pool is not None:
            self.pool.clear()

    def as_dict(self) -> dict:
        pool = self.pool
        return {
            "prefix_admitted": self.stats.admitted,
            "prefill_reused": self.stats.reused_tokens,
            "prefill_reused_from_slots": self.stats.from_slots,
            "prefill_reused_from_pool": self.stats.from_pool,
            "prefix_waits": self.stats.waits,
            "prefix_block_size": pool.block_size if pool else 0,
            "prefix_blocks_total": pool.num_blocks if pool else 0,
            "prefix_blocks_in_use": pool.blocks_in_use if pool else 0,
            "prefix_blocks_stored": pool.stored if pool else 0,
            "prefix_blocks_evicted": pool.evicted if pool else 0,
        }

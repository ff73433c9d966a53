"""Content-addressed KV blocks of token prefixes, kept across the sequences that computed them.

A full block of ``block_size`` tokens is stored under the key (its parent block's id, its own tokens),
so the blocks form a trie: a lookup walks a prompt's full blocks from the first and finds exactly the
blocks of its longest cached prefix (no hash can collide: every key holds the tokens themselves, and
block ids are never reused). The blocks live in a pool of their own (a :class:`KVCache` whose "slots"
are blocks); a hit copies them into the sequence's slot, so the attention keeps reading one contiguous
slot per sequence. Blocks are evicted least recently used first when the pool is full, and all of them
are dropped when the weights change (KV of another policy version must never be reused).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..runner.kv_cache import KVCache

BlockKey = tuple[int, tuple[int, ...]]  # (parent block id, -1 for the first block; the block's tokens)


@dataclass
class CachedBlock:
    """One stored block: its row in the pool and its id (the parent id of the blocks after it)."""

    row: int
    block_id: int


class PrefixCache:
    """A pool of `num_blocks` KV blocks of `block_size` tokens, addressed by token prefix, LRU-evicted."""

    def __init__(
        self,
        layer_shapes: list[tuple[int, int]],
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"a prefix cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.block_size = block_size
        self.pool = KVCache(layer_shapes, num_blocks, block_size, dtype, device)
        self.blocks: OrderedDict[BlockKey, CachedBlock] = OrderedDict()  # least recently used first
        self.free_rows = list(range(num_blocks - 1, -1, -1))
        self._ids = itertools.count()
        self.stored = 0  # blocks written into the pool
        self.evicted = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_slots

    @property
    def blocks_in_use(self) -> int:
        return len(self.blocks)

    def nbytes(self) -> int:
        return self.pool.nbytes()

    def _key(self, parent: int, tokens: list[int], index: int) -> BlockKey:
        b = self.block_size
        return parent, tuple(tokens[index * b : (index + 1) * b])

    def match(self, tokens: list[int], limit: int) -> list[CachedBlock]:
        """The cached blocks of the longest cached prefix of `tokens` that ends at or before `limit`."""
        found: list[CachedBlock] = []
        parent = -1
        for index in range(min(limit, len(tokens)) // self.block_size):
            block = self.blocks.get(self._key(parent, tokens, index))
            if block is None:
                break
            found.append(block)
            parent = block.block_id
        return found

    def load(self, blocks: list[CachedBlock], tokens: list[int], kv: KVCache, slot: int) -> None:
        """Copy `blocks` (the `match` of `tokens`) into `slot` of `kv` from position 0; marks them used."""
        b = self.block_size
        parent = -1
        for index, block in enumerate(blocks):
            self.pool.copy_to(kv, block.row, 0, slot, index * b, b)
            self.blocks.move_to_end(self._key(parent, tokens, index))
            parent = block.block_id

    def store(self, tokens: list[int], num_blocks: int, kv: KVCache, slot: int) -> None:
        """Make the first `num_blocks` full blocks of `tokens` (whose KV `slot` of `kv` holds) cached: the
        missing ones are copied into the pool, the present ones marked used."""
        parent, path = -1, set()
        for index in range(num_blocks):
            key = self._key(parent, tokens, index)
            block = self.blocks.get(key)
            if block is None:
                row = self._free_row(path)
                if row is None:  # every block is on this path: keep what fits
                    return
                block = CachedBlock(row, next(self._ids))
                kv.copy_to(self.pool, slot, index * self.block_size, row, 0, self.block_size)
                self.blocks[key] = block
                self.stored += 1
            else:
                self.blocks.move_to_end(key)
            path.add(block.block_id)
            parent = block.block_id

    def _free_row(self, keep: set[int]) -> int | None:
        """A pool row for a new block: a free one, else the least recently used block's (not one in `keep`)."""
        if self.free_rows:
            return self.free_rows.pop()
        for key, block in self.blocks.items():
            if block.block_id not in keep:
                del self.blocks[key]
                self.evicted += 1
                return block.row
        return None

    def clear(self) -> None:
        """Drop every block (new weights: the stored KV belongs to the old policy)."""
        self.free_rows = list(range(self.num_blocks - 1, -1, -1))
        self.blocks.clear()

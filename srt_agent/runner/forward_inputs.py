"""A forward pass's integer inputs, built on the host and moved to the device in one copy.

Token ids, rotary positions, cache slots and positions, each entry's preorder interval in its chunk's
tree (from which the attention masks are derived on the device, `tree_attention.py`) and the attention
groups' rows are laid out in one int64 host buffer, vectorised over chunks with torch; one
non-blocking copy takes it to the device, where every input is a view of it. Per chunk the host does a
few scalar reads; per draft node, one pass of the tree's order (`tree.draft_order`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .kv_cache import KVCache
from .tree_attention import AttentionGroup, TreeBatch
from .tree_order import draft_order

# The memory-efficient CUDA kernel wants the key length of an additive mask to be a multiple of 16 (it
# pads a copy of the mask in every layer otherwise); the extra keys are masked out.
KEY_ALIGNMENT = 16


@dataclass
class ForwardInputs:
    """What the decoder takes: token ids and positions ``[N]`` and the tree attention's batch."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    batch: TreeBatch


class _HostBuffer:
    """Named int64 host tensors; `upload` moves them in one copy and returns device views by name."""

    def __init__(self) -> None:
        self.parts: dict[object, torch.Tensor] = {}

    def add(self, name: object, tensor: torch.Tensor) -> None:
        self.parts[name] = tensor.reshape(-1)

    def upload(self, device: torch.device) -> dict[object, torch.Tensor]:
        host = torch.cat(list(self.parts.values()))
        # Pageable memory: a non-blocking copy is staged at once and does not wait for the device's queue.
        on_device = host.to(device, non_blocking=True)
        return dict(zip(self.parts, on_device.split([len(p) for p in self.parts.values()])))


def forward_inputs(chunks: list, cache: KVCache, device: torch.device, exact: bool = False) -> ForwardInputs:
    """Lay out `chunks` (:class:`~srt_agent.runner.model_runner.Chunk`) for one pass over `cache`.

    Per packed entry: token, rotary position (sequence order for pending tokens, last pending position
    plus depth for draft nodes), slot, cache position ``start + i`` and preorder interval (enter, exit).
    `exact`: the pass's attention runs in float64 (`numerics.exact_sdpa`).
    """
    scalars = torch.tensor([[c.slot, c.start, len(c), c.num_pending] for c in chunks])
    slot, start, length, pending = scalars.unbind(1)
    offset = length.cumsum(0) - length
    total = sum(len(c) for c in chunks)
    chunk_of = torch.repeat_interleave(torch.arange(len(chunks)), length)
    local = torch.arange(total) - offset[chunk_of]
    cache_pos = start[chunk_of] + local
    positions, enter, exit_ = cache_pos.clone(), local.clone(), length[chunk_of]
    orders = [draft_order(c.num_pending, c.parents) for c in chunks if c.parents]
    if orders:
        is_draft = local >= pending[chunk_of]
        depth, tree_enter, tree_exit = (torch.tensor(list(itertools.chain(*lists))) for lists in zip(*orders))
        positions[is_draft] = (start + pending - 1)[chunk_of][is_draft] + depth
        enter[is_draft], exit_[is_draft] = tree_enter, tree_exit
    tokens = torch.tensor(list(itertools.chain.from_iterable(c.token_ids for c in chunks)))
    buffer = _HostBuffer()
    per_entry = dict(
        tokens=tokens, positions=positions, slot=slot[chunk_of], cache_pos=cache_pos, enter=enter, exit=exit_
    )
    for name, t in per_entry.items():
        buffer.add(name, t)
    layouts = [
        _group_layout(i, chunks, members, offset, cache.capacity, buffer) for i, members in enumerate(_buckets(chunks))
    ]
    views = buffer.upload(device)
    one_run = len(layouts) == 1 and layouts[0].dense and layouts[0].members == list(range(len(chunks)))
    batch = TreeBatch(
        cache=cache,
        slot_of=views["slot"],
        cache_pos=views["cache_pos"],
        enter=views["enter"],
        exit=views["exit"],
        positions=views["positions"],
        groups=[layout.group(views, in_order=one_run) for layout in layouts],
        total=total,
        span=(chunks[0].slot, chunks[0].start) if len(chunks) == 1 else None,
        exact=exact,
    )
    return ForwardInputs(token_ids=views["tokens"], positions=views["positions"], batch=batch)


def _buckets(chunks: list) -> list[list[int]]:
    """Chunk indices grouped by length (powers of two), each group in slot order."""
    buckets: dict[int, list[int]] = {}
    for i, chunk in enumerate(chunks):
        buckets.setdefault((len(chunk) - 1).bit_length(), []).append(i)
    return [sorted(members, key=lambda i: chunks[i].slot) for members in buckets.values()]


@dataclass
class _GroupLayout:
    """A group's host-side facts; its tensors sit in the buffer under ``(number, name)``."""

    number: int
    members: list[int]
    slots: list[int]
    width: int
    key_len: int
    dense: bool  # every chunk has the group's width: no padding rows

    def group(self, views: dict[object, torch.Tensor], in_order: bool) -> AttentionGroup:
        lo = self.slots[0]
        consecutive = self.slots == list(range(lo, lo + len(self.slots)))
        rows = views[self.number, "rows"]
        return AttentionGroup(
            rows=rows.view(len(self.members), self.width),
            entries=None if self.dense else views[self.number, "entries"],
            packed=rows if self.dense else views[self.number, "packed"],
            slots=views[self.number, "slots"],
            slot_range=(lo, lo + len(self.slots)) if consecutive else None,
            key_len=self.key_len,
            in_order=in_order,
            start=views[self.number, "start"],
            offset=views[self.number, "offset"],
            length=views[self.number, "length"],
        )


def _group_layout(
    number: int, chunks: list, members: list[int], offset: torch.Tensor, capacity: int, buffer: _HostBuffer
) -> _GroupLayout:
    """Add one group's rows (padding rows repeat their chunk's first entry), slots, starts, offsets and
    lengths to the buffer and, when padded, its real rows: flat indices and packed rows."""
    lengths = [len(chunks[i]) for i in members]
    width = max(lengths)
    key_len = max(chunks[i].start + len(chunks[i]) for i in members)
    key_len = min(-(-key_len // KEY_ALIGNMENT) * KEY_ALIGNMENT, capacity)
    member_index = torch.tensor(members)
    length = torch.tensor(lengths)
    valid = torch.arange(width) < length[:, None]
    rows = offset[member_index][:, None] + torch.where(valid, torch.arange(width), 0)
    slots = [chunks[i].slot for i in members]
    parts = dict(
        rows=rows,
        slots=torch.tensor(slots),
        start=torch.tensor([chunks[i].start for i in members]),
        offset=offset[member_index],
        length=length,
    )
    dense = min(lengths) == width
    if not dense:
        parts.update(entries=valid.flatten().nonzero().squeeze(1), packed=rows[valid])
    for name, t in parts.items():
        buffer.add((number, name), t)
    return _GroupLayout(number, members, slots, width, key_len, dense)

"""The KV cache: keys and values of every attention layer, per sequence slot, in preallocated tensors.

One ``[slots, kv_heads, capacity, head_dim]`` tensor per layer for keys and one for values, so layers
may differ in shape. The runner addresses entries only through this class (write rows, read the first
``length`` entries of some slots, move entries within a slot, copy a prefix between slots), so the
storage can become paged blocks without touching the attention or the model code.
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer, per-slot key/value storage of fixed capacity."""

    def __init__(
        self,
        layer_shapes: list[tuple[int, int]],
        num_slots: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        """`layer_shapes`: (kv_heads, head_dim) of every layer, in layer order."""
        self.num_slots = num_slots
        self.capacity = capacity
        # Zeroed, not empty: masked-out entries still enter the attention product (0 * NaN = NaN).
        self.keys = [torch.zeros(num_slots, h, capacity, d, dtype=dtype, device=device) for h, d in layer_shapes]
        self.values = [torch.zeros(num_slots, h, capacity, d, dtype=dtype, device=device) for h, d in layer_shapes]

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows: ``k[i]``, ``v[i]`` (``[kv_heads, head_dim]``) at (``slots[i]``, ``positions[i]``), in
        the cache's dtype (float32 keys of a narrow model's float32 stream are rounded to it)."""
        keys, values = self._layer(layer, k)
        keys[slots, :, positions] = k.to(keys.dtype)
        values[slots, :, positions] = v.to(values.dtype)

    def write_span(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``len(k)`` consecutive rows of one slot from position `start` (a slice, not a scatter)."""
        keys, values = self._layer(layer, k)
        keys[slot, :, start : start + len(k)] = k.transpose(0, 1)
        values[slot, :, start : start + len(v)] = v.transpose(0, 1)

    def _layer(self, layer: int, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's key and value storage, after checking that rows `k` fit it."""
        keys, values = self.keys[layer], self.values[layer]
        if k.shape[1:] != (keys.shape[1], keys.shape[3]):
            raise ValueError(
                f"layer {layer} writes keys of shape {tuple(k.shape[1:])}, the cache holds {tuple(keys.shape[1::2])}"
            )
        return keys, values

    def read(
        self, layer: int, slots: torch.Tensor, slot_range: tuple[int, int] | None, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[len(slots), kv_heads, length, head_dim]`` of some slots' first `length` entries.

        A `slot_range` (lo, hi) of consecutive slots is read as a view instead of a copy.
        """
        keys, values = self.keys[layer], self.values[layer]
        if slot_range is not None:
            lo, hi = slot_range
            return keys[lo:hi, :, :length], values[lo:hi, :, :length]
        return keys[slots, :, :length], values[slots, :, :length]

    def move(self, slots: list[int], src: list[int], dst: list[int]) -> None:
        """Copy entries (slots[i], src[i]) → (slots[i], dst[i]) in every layer."""
        if not slots:
            return
        # One non-blocking copy of all three index lists (pageable memory: staged at once, no wait).
        s, a, b = torch.tensor([slots, src, dst]).to(self.keys[0].device, non_blocking=True).unbind(0)
        for keys, values in zip(self.keys, self.values):
            keys[s, :, b] = keys[s, :, a]
            values[s, :, b] = values[s, :, a]

    def copy_prefix(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Copy the first `length` entries of one slot into another, in every layer."""
        self.copy_to(self, src_slot, 0, dst_slot, 0, length)

    def copy_to(
        self, other: KVCache, src_slot: int, src_start: int, dst_slot: int, dst_start: int, length: int
    ) -> None:
        """Copy `length` entries of `src_slot` from `src_start` into `other`'s `dst_slot` at `dst_start`, in
        every layer (`other` may be this cache: a slot's prefix into another slot)."""
        pairs = zip(self.keys, self.values, other.keys, other.values)
        for keys, values, into_keys, into_values in pairs:
            into_keys[dst_slot, :, dst_start : dst_start + length] = keys[src_slot, :, src_start : src_start + length]
            into_values[dst_slot, :, dst_start : dst_start + length] = values[
                src_slot, :, src_start : src_start + length
            ]

    def clear(self, slot: int) -> None:
        """Zero one slot's keys and values in every layer."""
        for keys, values in zip(self.keys, self.values):
            keys[slot] = 0
            values[slot] = 0

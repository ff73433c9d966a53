"""Packed tree attention over the engine's KV cache, plugged into transformers' attention registry.

The model's own decoder layers run unchanged; only their attention call comes here. It is registered
in transformers' ``AttentionInterface`` (with the matching ``AttentionMaskInterface`` entry), under a
name that also records the model's previous implementation: a forward pass that does not carry a
:class:`TreeBatch` (plain transformers use of the same module, e.g. ``generate`` or training) falls
through to that implementation unchanged.

A :class:`TreeBatch` describes one engine forward pass: the tokens of all chunks are packed into one
row block (batch 1 for transformers); this function writes every layer's new keys and values into the
:class:`KVCache` and attends per group of chunks of similar length (padded within the group) with an
explicit boolean mask: each entry sees its sequence's cached tokens plus its own ancestors in the
chunk, and on sliding-window layers only keys whose position is within the window.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .kv_cache import KVCache

TREE_ATTENTION_PREFIX = "srt_tree_over_"


@dataclass
class AttentionGroup:
    """Chunks attended together: padded rows, their slots, key length and masks."""

    rows: torch.Tensor  # [B, L] packed-row index of each entry (padding → 0)
    entries: torch.Tensor | None  # flat [B * L] indices of the real (non-padding) entries; None: all are
    packed: torch.Tensor  # their packed-row indices, in the same order
    slots: torch.Tensor  # [B]
    slot_range: tuple[int, int] | None  # (lo, hi) when slots are consecutive: the cache is sliced, not copied
    key_len: int
    mask: torch.Tensor  # [B, 1, L, key_len] bool: cached context + ancestors
    in_order: bool  # rows are exactly 0 … N-1 without padding: the pass's only group, no gather needed
    query_pos: torch.Tensor  # [B, 1, L, 1] rotary position of each entry
    key_pos: torch.Tensor  # [B, 1, 1, key_len] rotary position of each key
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # sliding window → mask

    def mask_for(self, window: int | None) -> torch.Tensor:
        """The mask, restricted on sliding-window layers to keys with ``query_pos - key_pos < window``."""
        if window is None:
            return self.mask
        if window not in self.windowed:
            self.windowed[window] = self.mask & (self.key_pos > self.query_pos - window)
        return self.windowed[window]


@dataclass
class TreeBatch:
    """One forward pass of packed chunks: where new keys go and who attends to what."""

    cache: KVCache
    slot_of: torch.Tensor  # [N] slot of every packed entry
    cache_pos: torch.Tensor  # [N] cache position its key/value is written at
    groups: list[AttentionGroup]
    total: int
    span: tuple[int, int] | None = None  # (slot, start) when all entries are one slot's consecutive positions


def build_groups(
    chunks: list, offsets: list[int], positions: list[list[int]], device: torch.device
) -> list[AttentionGroup]:
    """Group chunks by length (powers of two) and build each group's rows and masks.

    `chunks` are :class:`~srt_agent.engine.model_runner.Chunk`; `positions[i]` the rotary positions of
    chunk i's entries. Cached token c of a sequence sits at rotary position c.
    """
    from .tree import chunk_attention

    buckets: dict[int, list[int]] = {}
    for i, chunk in enumerate(chunks):
        buckets.setdefault((len(chunk) - 1).bit_length(), []).append(i)
    groups = []
    for members in buckets.values():
        members.sort(key=lambda i: chunks[i].slot)
        width = max(len(chunks[i]) for i in members)
        key_len = max(chunks[i].start + len(chunks[i]) for i in members)
        rows = torch.zeros(len(members), width, dtype=torch.long)
        valid = torch.zeros(len(members), width, dtype=torch.bool)
        mask = torch.zeros(len(members), 1, width, key_len, dtype=torch.bool)
        query_pos = torch.zeros(len(members), 1, width, 1, dtype=torch.long)
        key_pos = torch.arange(key_len).repeat(len(members), 1, 1, 1)
        for b, i in enumerate(members):
            chunk, n = chunks[i], len(chunks[i])
            rows[b, :n] = torch.arange(offsets[i], offsets[i] + n)
            valid[b, :n] = True
            mask[b, 0, :n, : chunk.start] = True
            mask[b, 0, :n, chunk.start : chunk.start + n] = chunk_attention(chunk.num_pending, chunk.parents)
            mask[b, 0, n:, 0] = True  # padding rows attend to something; their output is dropped
            pos = torch.tensor(positions[i])
            query_pos[b, 0, :n, 0] = pos
            key_pos[b, 0, 0, chunk.start : chunk.start + n] = pos  # padding rows: position 0 sees key 0
        slots = [chunks[i].slot for i in members]
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        flat = valid.flatten()
        in_order = len(buckets) == 1 and bool(flat.all()) and torch.equal(rows.flatten(), torch.arange(rows.numel()))
        groups.append(
            AttentionGroup(
                rows=rows.to(device),
                entries=None if bool(flat.all()) else flat.nonzero().squeeze(1).to(device),
                packed=rows.flatten()[flat].to(device),
                slots=torch.tensor(slots, device=device),
                slot_range=(slots[0], slots[0] + len(slots)) if consecutive else None,
                key_len=key_len,
                in_order=in_order,
                mask=mask.to(device),
                query_pos=query_pos.to(device),
                key_pos=key_pos.to(device),
            )
        )
    return groups


def tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    tree_batch: TreeBatch | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[1, heads, N, D]``, ``key``/``value``
    ``[1, kv_heads, N, D]`` (rotary applied) → ``[1, N, heads, D]``.

    Supports GQA, sliding windows, attention-logit soft-capping (Gemma 2) and attention sinks
    (``s_aux``, gpt-oss). Without a `tree_batch` it is the model's previous implementation.
    """
    if tree_batch is None:
        fallback = _fallback(module)
        extra = dict(sliding_window=sliding_window, softcap=softcap, s_aux=s_aux)
        extra = {k: v for k, v in extra.items() if v is not None}
        return fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **extra, **kwargs)
    cache = tree_batch.cache
    layer = module.layer_idx
    q = query[0].transpose(0, 1)  # [N, H, D]
    k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)
    if tree_batch.span is not None:
        cache.write_span(layer, *tree_batch.span, k, v)
    else:
        cache.write(layer, tree_batch.slot_of, tree_batch.cache_pos, k, v)
    heads, head_dim = q.shape[1], q.shape[2]
    scale = scaling if scaling is not None else head_dim**-0.5
    out = None
    for g in tree_batch.groups:
        qg = (q.view(*g.rows.shape, heads, head_dim) if g.in_order else q[g.rows]).transpose(1, 2)  # [B, H, L, D]
        kg, vg = cache.read(layer, g.slots, g.slot_range, g.key_len)
        mask = g.mask_for(sliding_window)
        if softcap is None and s_aux is None:
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale, enable_gqa=True)
        else:
            og = _attention_math(qg, kg, vg, mask, scale, softcap, s_aux)
        og = og.transpose(1, 2).reshape(-1, heads, head_dim)
        if g.in_order:
            return og.unsqueeze(0), None
        if out is None:
            out = torch.empty(tree_batch.total, heads, head_dim, dtype=query.dtype, device=query.device)
        out[g.packed] = og if g.entries is None else og[g.entries]
    return out.unsqueeze(0), None


def _attention_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention written out, for what SDPA lacks: logit soft-capping and attention sinks."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # one extra logit per head that takes probability mass and no value
        sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    return (probs[..., :-1] if sinks is not None else probs) @ v


def _fallback(module: torch.nn.Module):
    """The attention function the model used before :func:`use_tree_attention`."""
    from transformers import AttentionInterface

    name = module.config._attn_implementation.removeprefix(TREE_ATTENTION_PREFIX)
    if name == "eager":  # each modeling file has its own eager function
        return sys.modules[type(module).__module__].eager_attention_forward
    return AttentionInterface._global_mapping[name]


def use_tree_attention(model: torch.nn.Module) -> None:
    """Route `model`'s attention through :func:`tree_attention` (previous implementation kept as fallback)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    current = model.config._attn_implementation or "eager"
    if current.startswith(TREE_ATTENTION_PREFIX):
        return
    name = TREE_ATTENTION_PREFIX + current
    AttentionInterface.register(name, tree_attention)
    mask_function = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(current)
    if mask_function is not None:
        AttentionMaskInterface.register(name, mask_function)
    model.set_attn_implementation(name)

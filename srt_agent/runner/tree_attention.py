"""Packed tree attention over the engine's KV cache, plugged into transformers' attention registry.

The model's decoder layers run unchanged; only their attention call comes here, and a pass that carries no
:class:`TreeBatch` (``generate``, training) falls through to the model's previous implementation. For a
`TreeBatch` (one engine pass, built by `forward_inputs.py`), every layer's new keys and values go into the
:class:`KVCache`, and each group of similar-length chunks attends with SDPA under an additive mask (the
sequence's cached tokens plus the entry's own ancestors; on sliding-window layers only keys within the
window). Query heads that share a KV head are folded into its query rows, so SDPA keeps an efficient kernel
on CUDA and CPU alike; why, and what it measured: docs/engine.md, "Forward pass".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .kv_cache import KVCache
from .numerics import base_attention_function, exact_sdpa, wrap_attention

TREE_ATTENTION_PREFIX = "srt_tree_over_"


@dataclass
class AttentionGroup:
    """Chunks attended together: padded rows, their slots, key length, and where their masks come from."""

    rows: torch.Tensor  # [B, L] packed-row index of each entry (padding → the chunk's first entry)
    entries: torch.Tensor | None  # flat [B * L] indices of the real (non-padding) entries; None: all are
    packed: torch.Tensor  # their packed-row indices, in the same order
    slots: torch.Tensor  # [B]
    slot_range: tuple[int, int] | None  # (lo, hi) when slots are consecutive: the cache is sliced, not copied
    key_len: int
    in_order: bool  # rows are exactly 0 … N-1 without padding: the pass's only group, no gather needed
    start: torch.Tensor  # [B] cached tokens of each chunk's sequence
    offset: torch.Tensor  # [B] packed row of each chunk's first entry
    length: torch.Tensor  # [B] entries of each chunk
    biases: dict[tuple, torch.Tensor] = field(default_factory=dict)  # (group, window, dtype) → mask


@dataclass
class TreeBatch:
    """One forward pass of packed chunks: where new keys go and who attends to what."""

    cache: KVCache
    slot_of: torch.Tensor  # [N] slot of every packed entry
    cache_pos: torch.Tensor  # [N] cache position its key/value is written at
    enter: torch.Tensor  # [N] preorder index of the entry in its chunk's tree (`tree.draft_order`)
    exit: torch.Tensor  # [N] end of its subtree: j is an ancestor-or-self of i iff enter[j] <= enter[i] < exit[j]
    positions: torch.Tensor  # [N] rotary position
    groups: list[AttentionGroup]
    total: int
    span: tuple[int, int] | None = None  # (slot, start) when all entries are one slot's consecutive positions
    exact: bool = False  # attention in float64 (`numerics.exact_sdpa`): the same bits in every batch

    def bias(self, g: AttentionGroup, group: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask ``[B, 1, L * group, key_len]`` (0 or -inf; boolean for `dtype` bool) of a group, query rows folded as in
        :func:`fold_heads`: cached context and ancestors; with a `window`, only keys with
        ``query_pos - key_pos < window``. Built on the first layer that asks, then reused."""
        key = (group, window, dtype)
        if key not in g.biases:
            g.biases[key] = self._bias(g, group, window, dtype)
        return g.biases[key]

    def _bias(self, g: AttentionGroup, group: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        keys = torch.arange(g.key_len, device=g.rows.device)
        local = keys - g.start[:, None]  # [B, K] index of each key in the chunk (< 0: cached context)
        inside = (local >= 0) & (local < g.length[:, None])
        entry = (g.offset[:, None] + local).clamp(0, self.total - 1)
        # Context keys come before every entry and contain them all; keys past the chunk come after all.
        key_enter = torch.where(inside, self.enter[entry], torch.where(local < 0, -1, self.total))
        key_exit = torch.where(inside, self.exit[entry], self.total)
        query_enter = self.enter[g.rows][:, :, None]  # [B, L, 1]
        visible = (key_enter[:, None, :] <= query_enter) & (query_enter < key_exit[:, None, :])  # [B, L, K]
        if window is not None:  # cached token c sits at rotary position c
            key_pos = torch.where(inside, self.positions[entry], keys)
            visible &= key_pos[:, None, :] > self.positions[g.rows][:, :, None] - window
        batch, length, key_len = visible.shape
        if dtype == torch.bool:  # SDPA's boolean form: True takes part
            return (
                visible[:, :, None, :].expand(batch, length, group, key_len).reshape(batch, 1, length * group, key_len)
            )
        bias = torch.zeros(batch, length, group, key_len, dtype=dtype, device=visible.device)
        return bias.masked_fill_(~visible[:, :, None, :], float("-inf")).view(batch, 1, length * group, key_len)


def fold_heads(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, L, heads, D]`` → ``[B, kv_heads, L * group, D]``: the query heads that share a KV head
    become that head's rows (row ``l * group + g``). A view for one query per sequence (decode)."""
    b, length, heads, dim = q.shape
    return q.view(b, length, kv_heads, heads // kv_heads, dim).transpose(1, 2).reshape(b, kv_heads, -1, dim)


def unfold_heads(out: torch.Tensor, length: int) -> torch.Tensor:
    """Inverse of :func:`fold_heads` on the output, flattened to ``[B * L, heads, D]``."""
    b, kv_heads, rows, dim = out.shape
    group = rows // length
    return out.view(b, kv_heads, length, group, dim).transpose(1, 2).reshape(b * length, kv_heads * group, dim)


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
        fallback = base_attention_function(module)
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
    heads, head_dim, kv_heads = q.shape[1], q.shape[2], k.shape[1]
    scale = scaling if scaling is not None else head_dim**-0.5
    store = cache.keys[layer].dtype  # queries are rounded as keys and values are (autocast would, too)
    out = None
    for g in tree_batch.groups:
        width = g.rows.shape[1]
        qg = fold_heads(q.view(*g.rows.shape, heads, head_dim) if g.in_order else q[g.rows], kv_heads)
        kg, vg = cache.read(layer, g.slots, g.slot_range, g.key_len)
        plain = softcap is None and s_aux is None
        mask_dtype = (torch.bool if plain else torch.float64) if tree_batch.exact else store
        bias = tree_batch.bias(g, heads // kv_heads, sliding_window, mask_dtype)
        if plain and tree_batch.exact:
            og = exact_sdpa(qg, kg, vg, bias, scale, store)
        elif plain:
            og = F.scaled_dot_product_attention(qg.to(store), kg, vg, attn_mask=bias, scale=scale)
        else:
            og = _attention_math(qg, kg, vg, bias, scale, softcap, s_aux, store, tree_batch.exact)
        og = unfold_heads(og, width)
        if g.in_order:
            return og.unsqueeze(0), None
        if out is None:
            out = torch.empty(tree_batch.total, heads, head_dim, dtype=og.dtype, device=query.device)
        out[g.packed] = og if g.entries is None else og[g.entries]
    return out.unsqueeze(0), None


def _attention_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
    store: torch.dtype,
    exact: bool = False,
) -> torch.Tensor:
    """Attention written out, for what SDPA lacks: logit soft-capping and attention sinks. Query heads
    folded as in :func:`fold_heads` (`q` ``[B, kv_heads, L * group, D]``, `sinks` one per query head);
    `q`, `k`, `v` rounded to `store`; in float64 where `exact` (the output rounded back to `store`)."""
    q, k, v = (t.to(store) for t in (q, k, v))
    if exact:
        with torch.autocast(q.device.type, enabled=False):
            q, k, v, bias = q.double(), k.double(), v.double(), bias.double()
            sinks = sinks.double() if sinks is not None else None
            return _attention_math(q, k, v, bias, scale, softcap, sinks, torch.float64).to(store)
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + bias
    if sinks is not None:  # one extra logit per head that takes probability mass and no value
        kv_heads, rows = q.shape[1], q.shape[2]
        per_row = sinks.to(scores.dtype).view(kv_heads, -1).repeat(1, rows // (sinks.numel() // kv_heads))
        sink = per_row.view(1, kv_heads, rows, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    return (probs[..., :-1] if sinks is not None else probs) @ v


def use_tree_attention(model: torch.nn.Module) -> None:
    """Route `model`'s attention through :func:`tree_attention` (previous implementation kept as fallback)."""
    wrap_attention(model, TREE_ATTENTION_PREFIX, tree_attention)

"""The model runner: one forward pass over many sequences' chunks with a per-slot KV cache.

It runs the Hugging Face module's own weights (embeddings, decoder layers' projections, norms and
MLPs, rotary embedding, LM head) through its own attention, so that tree attention and KV compaction
are under the engine's control. Tokens of all chunks are packed into one row block for every linear
layer; attention runs per group of chunks of similar length (padded within the group), with an explicit
boolean mask: each chunk entry sees its sequence's cached tokens plus its own ancestors in the chunk.
Works for Llama-style models (Llama, Qwen2 with its q/k/v biases, Mistral without sliding windows,
Qwen3's q/k norms) on CPU and CUDA alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .tree import chunk_attention


@dataclass
class Chunk:
    """What one sequence feeds to a forward pass.

    ``start`` tokens of the sequence are already in the KV cache of ``slot``. The chunk's first
    ``num_pending`` tokens continue the sequence (positions start, start+1, …); the rest are draft
    nodes with ``parents`` (-1 = the last pending token), at position ``start + num_pending - 1 + depth``.
    Entry i's key/value is written at cache position ``start + i``.
    """

    slot: int
    start: int
    token_ids: list[int]
    num_pending: int
    parents: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_pending < 1 or self.num_pending + len(self.parents) != len(self.token_ids):
            raise ValueError("a chunk needs >= 1 pending token and one parent per draft node")

    def __len__(self) -> int:
        return len(self.token_ids)

    def positions(self) -> list[int]:
        """Rotary position of every entry: sequence order for pending tokens, depth for draft nodes."""
        out = list(range(self.start, self.start + self.num_pending))
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        last = self.start + self.num_pending - 1
        return out + [last + d for d in depths]


@dataclass
class AttentionGroup:
    """Chunks attended together: padded rows, their slots, key length and mask."""

    rows: torch.Tensor  # [B, L] packed-row index of each entry (padding → 0)
    entries: torch.Tensor | None  # flat [B * L] indices of the real (non-padding) entries; None: all are
    packed: torch.Tensor  # their packed-row indices, in the same order
    slots: torch.Tensor  # [B]
    slot_range: tuple[int, int] | None  # (lo, hi) when slots are consecutive: the cache is sliced, not copied
    key_len: int
    mask: torch.Tensor  # [B, 1, L, key_len] bool


def check_architecture(model: torch.nn.Module) -> None:
    """Raise ValueError unless `model` is a Llama-style causal LM this runner can execute."""
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not hasattr(model, "lm_head") or not all(hasattr(inner, n) for n in needed):
        raise ValueError(f"unsupported model {type(model).__name__}: need a Llama-style *ForCausalLM")
    config = model.config
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise ValueError("sliding-window attention is not supported")
    attn = inner.layers[0].self_attn
    if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
        raise ValueError(f"unsupported attention module {type(attn).__name__}")


class ModelRunner:
    """Owns the KV cache of `num_slots` sequences and runs packed, tree-masked forward passes."""

    def __init__(self, model: torch.nn.Module, num_slots: int, max_context: int, tree_margin: int, device: torch.device):
        check_architecture(model)
        self.model = model.to(device).eval()
        self.device = device
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.num_slots = num_slots
        self.capacity = max_context + tree_margin
        dtype = next(model.parameters()).dtype
        shape = (len(model.model.layers), num_slots, self.num_kv_heads, self.capacity, self.head_dim)
        # Zeroed, not empty: masked-out entries still enter the attention product (0 * NaN = NaN).
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    def _groups(self, chunks: list[Chunk], offsets: list[int]) -> list[AttentionGroup]:
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
            for b, i in enumerate(members):
                chunk, n = chunks[i], len(chunks[i])
                rows[b, :n] = torch.arange(offsets[i], offsets[i] + n)
                valid[b, :n] = True
                mask[b, 0, :n, : chunk.start] = True
                mask[b, 0, :n, chunk.start : chunk.start + n] = chunk_attention(chunk.num_pending, chunk.parents)
                mask[b, 0, n:, 0] = True  # padding rows attend to something; their output is dropped
            slots = [chunks[i].slot for i in members]
            consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
            flat = valid.flatten()
            groups.append(
                AttentionGroup(
                    rows=rows.to(self.device),
                    entries=None if bool(flat.all()) else flat.nonzero().squeeze(1).to(self.device),
                    packed=rows.flatten()[flat].to(self.device),
                    slots=torch.tensor(slots, device=self.device),
                    slot_range=(slots[0], slots[0] + len(slots)) if consecutive else None,
                    key_len=key_len,
                    mask=mask.to(self.device),
                )
            )
        return groups

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk]) -> torch.Tensor:
        """Run all chunks in one pass; returns final-norm hidden states, one row per chunk entry, packed."""
        for chunk in chunks:
            if chunk.start + len(chunk) > self.capacity:
                raise ValueError(f"chunk ends at {chunk.start + len(chunk)}, beyond the cache of {self.capacity}")
        offsets, total = [], 0
        for chunk in chunks:
            offsets.append(total)
            total += len(chunk)
        dev = self.device
        tokens = torch.tensor([t for c in chunks for t in c.token_ids], device=dev)
        positions = torch.tensor([p for c in chunks for p in c.positions()], device=dev)
        slot_of = torch.tensor([c.slot for c in chunks for _ in c.token_ids], device=dev)
        cache_pos = torch.tensor([c.start + i for c in chunks for i in range(len(c))], device=dev)
        groups = self._groups(chunks, offsets)

        inner = self.model.model
        x = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(x.unsqueeze(0), positions.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [N, 1, head_dim]
        n_q = self.num_heads * self.head_dim
        for layer_idx, layer in enumerate(inner.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(total, self.num_heads, self.head_dim)
            k = attn.k_proj(h).view(total, self.num_kv_heads, self.head_dim)
            v = attn.v_proj(h).view(total, self.num_kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k_cache, v_cache = self.k_cache[layer_idx], self.v_cache[layer_idx]
            k_cache[slot_of, :, cache_pos] = k
            v_cache[slot_of, :, cache_pos] = v
            out = torch.empty(total, n_q, dtype=x.dtype, device=dev)
            for g in groups:
                qg = q[g.rows].transpose(1, 2)  # [B, H, L, D]
                if g.slot_range is not None:
                    lo, hi = g.slot_range
                    kg, vg = k_cache[lo:hi, :, : g.key_len], v_cache[lo:hi, :, : g.key_len]
                else:
                    kg, vg = k_cache[g.slots, :, : g.key_len], v_cache[g.slots, :, : g.key_len]
                og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=attn.scaling, enable_gqa=True)
                og = og.transpose(1, 2).reshape(-1, n_q)
                out[g.packed] = og if g.entries is None else og[g.entries]
            x = x + attn.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return inner.norm(x)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits of some hidden-state rows, in float32 or wider."""
        out = self.model.lm_head(hidden)
        return out if out.dtype in (torch.float32, torch.float64) else out.float()

    def move_kv(self, slots: list[int], src: list[int], dst: list[int]) -> None:
        """Copy cache entries (slot, src[i]) → (slot, dst[i]) in every layer (compaction of accepted nodes)."""
        if not slots:
            return
        s = torch.tensor(slots, device=self.device)
        a = torch.tensor(src, device=self.device)
        b = torch.tensor(dst, device=self.device)
        self.k_cache[:, s, :, b] = self.k_cache[:, s, :, a]
        self.v_cache[:, s, :, b] = self.v_cache[:, s, :, a]

    def clear_slot(self, slot: int) -> None:
        """Zero a slot's keys and values: NaN left there would leak through the masks into its next user."""
        self.k_cache[:, slot] = 0
        self.v_cache[:, slot] = 0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

"""The model runner: one forward pass over many sequences' chunks, with a per-slot KV cache.

It runs the Hugging Face model's own modules (embeddings and their scaling, decoder layers with their
norms, MLPs or experts, rotary variants and sliding windows, final norm, LM head with its logit
soft-capping or scaling) and supplies only the attention: tree attention over the engine's
:class:`~srt_agent.runner.kv_cache.KVCache`, plugged in through transformers' attention registry
(`tree_attention.py`). Tokens of all chunks are packed into one row block, so every linear layer
runs once per pass; new prompts are prefilled in the same pass as the others' decode steps. Same code
on CPU and CUDA. Narrow weights (bfloat16, float16) compute with a float32 residual stream and a float32
LM head, as the trainer scores tokens (`numerics.py`); with `exact_attention` the attention runs in
float64, so a position's logits do not depend on the batch where the linears do not either.

Public interface (what the engine and other callers use): :class:`Chunk`, ``forward(chunks) ->
hidden``, ``logits(hidden)``, ``move_kv``, ``load_weights`` and the ``kv`` storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..models.architectures import check_model
from .device_info import detect_device
from .forward_inputs import forward_inputs
from .kv_cache import KVCache
from .numerics import choose_exact_attention, compute, embeddings, is_narrow, plain_linears, wide
from .packed_linear import pack_model_linears, should_pack
from .tree_attention import use_tree_attention


@dataclass
class Chunk:
    """What one sequence feeds to a forward pass.

    ``start`` tokens of the sequence are already in the KV cache of ``slot``. The chunk's first
    ``num_pending`` tokens continue the sequence (positions start, start+1, …); the rest are draft
    nodes with ``parents`` (-1 = the last pending token; parents precede their children), at rotary
    position ``start + num_pending - 1 + depth``. Entry i's key/value is written at cache position
    ``start + i``.
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


class ModelRunner:
    """Owns the KV cache of `num_slots` sequences and runs packed, tree-masked forward passes."""

    def __init__(
        self,
        model: torch.nn.Module,
        num_slots: int,
        max_context: int,
        tree_margin: int,
        device: torch.device,
        pack_linears: bool | None = None,
        exact_attention: bool | str = False,
    ):
        """`pack_linears`: use oneDNN-prepacked copies of the linear weights (CPU); None decides by
        device, dtype and free memory (`packed_linear.should_pack`). `exact_attention`: True, False or
        ``auto`` (`numerics.choose_exact_attention`)."""
        check_model(model)
        self.model = model.to(device).eval()
        use_tree_attention(self.model)
        self.device = device
        self.device_info = detect_device(device)
        dtype = next(model.parameters()).dtype
        if pack_linears is None:
            pack_linears = should_pack(model, device, dtype, self.device_info.fast_bf16)
        self.packed_linears = pack_linears and pack_model_linears(model) > 0
        self.dtype = dtype if plain_linears(model) else None  # a quantized copy runs as it is
        self.exact_attention = choose_exact_attention(exact_attention, model, device)
        self.decoder = model.get_decoder()
        self.head = LogitHead.of(model)
        self.vocab_size = model.get_output_embeddings().out_features
        self.num_slots = num_slots
        self.capacity = max_context + tree_margin
        self.kv = KVCache(attention_shapes(model), num_slots, self.capacity, dtype, device)
        # Decoder forwards prepare masks only for a mask that is not already 4-D: this one stands for
        # "tree attention builds its own" and skips that work.
        self._no_mask = torch.zeros(1, 1, 0, 0, dtype=torch.bool, device=device)

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk]) -> torch.Tensor:
        """Run all chunks in one pass; returns final-norm hidden states, one row per chunk entry, packed."""
        for chunk in chunks:
            if chunk.start + len(chunk) > self.capacity:
                raise ValueError(f"chunk ends at {chunk.start + len(chunk)}, beyond the cache of {self.capacity}")
        inputs = forward_inputs(chunks, self.kv, self.device, self.exact_attention)
        with compute(self.dtype, self.device.type):
            out = self.decoder(
                inputs_embeds=embeddings(self.decoder, inputs.token_ids.unsqueeze(0), self.dtype),
                position_ids=inputs.positions.unsqueeze(0),
                attention_mask=self._no_mask,
                use_cache=False,
                tree_batch=inputs.batch,
            )
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits of some hidden-state rows, in float32 or wider (computed so, not upcast)."""
        return self.head(hidden)

    def move_kv(self, slots: list[int], src: list[int], dst: list[int]) -> None:
        """Copy cache entries (slot, src[i]) → (slot, dst[i]) in every layer (compaction of accepted nodes)."""
        self.kv.move(slots, src, dst)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load new weights in place (same names and shapes as the model's state dict); packed copies
        follow at their next use (the weights' version counters change)."""
        with torch.no_grad():
            self.model.load_state_dict(state, strict=True)

    def synchronize(self) -> None:
        """Wait until the device has run everything queued (CUDA; nothing to wait for on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def clear_slot(self, slot: int) -> None:
        """Zero a slot's keys and values: NaN left there would leak through the masks into its next user."""
        self.kv.clear(slot)

    def copy_prefix(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Copy the first `length` cache entries of one slot into another, in every layer (a sequence
        that shares a prefix with a live one starts without prefilling it)."""
        self.kv.copy_prefix(src_slot, dst_slot, length)


@dataclass
class LogitHead:
    """The LM head and the post-processing causal-LM classes apply to its output, in float32 or wider: a
    narrow (bfloat16, float16) head multiplies the float32 hidden state by a float32 copy of its weight,
    made again whenever the weight changes (`numerics.py`)."""

    lm_head: torch.nn.Module
    multiply: float | None = None  # Cohere's logit_scale
    divide: float | None = None  # Granite's logits_scaling
    softcap: float | None = None  # Gemma 2/3's final_logit_softcapping
    _wide: tuple[tuple, torch.Tensor, torch.Tensor | None] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, model: torch.nn.Module) -> LogitHead:
        config = model.config
        return cls(
            lm_head=model.get_output_embeddings(),
            multiply=getattr(model, "logit_scale", None),
            divide=getattr(config, "logits_scaling", None),
            softcap=getattr(config, "final_logit_softcapping", None),
        )

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = getattr(self.lm_head, "weight", None)
        if isinstance(weight, torch.Tensor) and type(weight.data) is torch.Tensor and is_narrow(weight.dtype):
            out = F.linear(wide(hidden), *self._wide_weights(weight))
        else:
            out = self.lm_head(hidden)
        if self.multiply is not None:
            out = out * self.multiply
        if self.divide is not None:
            out = out / self.divide
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out if out.dtype in (torch.float32, torch.float64) else out.float()

    def _wide_weights(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's weight and bias in float32, copied once per version of the weight."""
        key = (weight.data_ptr(), weight._version)
        if self._wide is None or self._wide[0] != key:
            bias = getattr(self.lm_head, "bias", None)
            self._wide = (key, weight.detach().float(), bias.detach().float() if bias is not None else None)
        return self._wide[1], self._wide[2]


def attention_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(kv_heads, head_dim) of every decoder layer, read from the config."""
    config = model.config
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return [(kv_heads, head_dim)] * config.num_hidden_layers

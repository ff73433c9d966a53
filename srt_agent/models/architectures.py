"""Which Hugging Face causal LMs the engine runs, decided from the config before any weight is loaded.

The runner executes a model's own decoder layers and replaces only their attention call (see
`srt_agent.runner.tree_attention`), so an architecture runs when its attention goes through transformers'
``AttentionInterface``, every layer is an attention layer (full or sliding-window) and the model is a
text-only causal LM. Anything else is refused with a one-line :class:`UnsupportedModel` naming the
architecture and what is missing.

`VERIFIED` lists the architectures the test suite runs (tiny random-weight configs, logits equal to
transformers' own forward, speculative decoding equal to plain decoding token for token): all those
that transformers' GGUF loader reads and can run, plus common ones it does not read.
"""

from __future__ import annotations

from typing import Any

ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention"})
LAYER_KIND_FIELDS = ("layer_types", "layers_block_type", "block_types")  # how configs name their layers' kinds
MULTIMODAL_SUB_CONFIGS = ("vision_config", "audio_config", "vision_tower", "speech_config")

_TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_WINDOWS = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])

# model_type → tiny config overrides (on top of _TINY). Small sliding windows (4) so that the tests'
# contexts cross them.
VERIFIED: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": dict(head_dim=16),
    "mistral": dict(sliding_window=4),
    "phi3": dict(sliding_window=4),
    "gemma": dict(head_dim=16),
    "gemma2": dict(head_dim=16, query_pre_attn_scalar=16, **_WINDOWS),
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, **_WINDOWS),
    "starcoder2": dict(sliding_window=4),
    "qwen2_moe": dict(shared_expert_intermediate_size=32, **_MOE),
    "qwen3_moe": dict(head_dim=16, **_MOE),
    "gpt_oss": dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, **_WINDOWS),
    "minimax_m2": dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, rotary_dim=8),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=4096, n_inner=128, num_key_value_heads=None),
}

# Architectures that pass the structural checks only on newer transformers, where the engine does not run
# them yet: refused with the reason rather than failing mid-request.
NOT_YET_VERIFIED: dict[str, str] = {
    # moved onto the AttentionInterface after transformers 5.10 (so in 5.19); its tiny model fails the engine's exactness
    # tests there (a KV mask of the wrong shape reaches the attention call)
    "nemotron": "goes through transformers' AttentionInterface only in newer transformers, where tree attention "
    "is not yet verified for it",
}


class UnsupportedModel(ValueError):
    """A model the engine cannot run; the message is one line naming the architecture and the gap."""


def architecture_name(config) -> str:
    architectures = getattr(config, "architectures", None) or []
    return f"{config.model_type} ({architectures[0]})" if architectures else config.model_type


def causal_lm_class(config):
    """The transformers class AutoModelForCausalLM would build for `config`, or None."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return None


def check_config(config) -> None:
    """Raise UnsupportedModel unless the engine can run a model of this config (no weights needed)."""
    name = architecture_name(config)
    if any(getattr(config, sub, None) is not None for sub in MULTIMODAL_SUB_CONFIGS):
        text = getattr(config, "text_config", None)
        hint = f"; load its text model ({text.model_type}) instead" if text is not None else ""
        raise UnsupportedModel(f"{name}: a multimodal model; the engine runs text-only causal LMs{hint}")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModel(f"{name}: an encoder-decoder model; the engine runs decoder-only causal LMs")
    kinds = {kind for field in LAYER_KIND_FIELDS for kind in (getattr(config, field, None) or [])}
    other = sorted(kinds - ATTENTION_LAYER_TYPES)
    if other:
        raise UnsupportedModel(
            f"{name}: {', '.join(other)} layers keep a recurrent state that a draft tree cannot branch"
        )
    if _layers_differ_in_shape(config):
        raise UnsupportedModel(
            f"{name}: its layers differ in shape (per-layer head sizes); the engine's KV cache needs one shape"
        )
    cls = causal_lm_class(config)
    if cls is None:
        raise UnsupportedModel(f"{name}: transformers has no causal-LM class for this architecture")
    if not cls._supports_attention_backend:
        if getattr(config, "num_attention_heads", None) is None and getattr(config, "n_head", None) is None:
            raise UnsupportedModel(
                f"{name}: no attention layers (a recurrent model); tree verification needs a KV cache"
            )
        raise UnsupportedModel(
            f"{name}: {cls.__name__}'s attention does not go through transformers' AttentionInterface, "
            "so tree attention cannot be plugged in"
        )
    if config.model_type in NOT_YET_VERIFIED:
        raise UnsupportedModel(f"{name}: {cls.__name__} {NOT_YET_VERIFIED[config.model_type]}")
    if getattr(config, "attention_chunk_size", None):
        raise UnsupportedModel(f"{name}: chunked attention is not supported by tree attention")
    if not getattr(config, "is_causal", True) or getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModel(f"{name}: bidirectional attention; the engine runs causal LMs")


def _layers_differ_in_shape(config) -> bool:
    """Whether the config gives layers different attention shapes: a heterogeneous config (transformers
    >= 5.16, e.g. Gemma 4, whose full-attention layers have wider heads) or a separate global head size."""
    fields = vars(config)  # plain reads: a heterogeneous config refuses `config.head_dim`
    if fields.get("_heterogeneity_spec") is not None:
        return True
    return fields.get("global_head_dim") not in (None, fields.get("head_dim"))


def check_model(model) -> None:
    """check_config on a loaded module, plus what only the module shows."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise UnsupportedModel(
            f"{type(model).__name__}: not a Hugging Face causal LM (need *ForCausalLM with an LM head)"
        )
    check_config(config)


def tiny_config(model_type: str, **overrides):
    """A tiny config of a verified architecture (2 layers, hidden 64, vocabulary 256) for tests;
    the architecture's own settings (head sizes, windows, experts) win over `overrides`."""
    from transformers import AutoConfig

    if model_type not in VERIFIED:
        raise ValueError(f"unknown tiny architecture {model_type!r}; choose one of {sorted(VERIFIED)}")
    kwargs = {**_TINY, **overrides, **VERIFIED[model_type]}
    return AutoConfig.for_model(model_type, **kwargs)


def gguf_model_types() -> set[str]:
    """The model types transformers' GGUF loader produces (Gemma 3's and 4's GGUFs load as their text models)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    text = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}
    return {text.get(a, a) for a in GGUF_SUPPORTED_ARCHITECTURES} - {"general", "tokenizer"}


def supported_table() -> list[tuple[str, str, bool]]:
    """(model_type, causal-LM class, read by the GGUF loader) of every verified architecture."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    gguf = gguf_model_types()
    return [(arch, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[arch], arch in gguf) for arch in VERIFIED]

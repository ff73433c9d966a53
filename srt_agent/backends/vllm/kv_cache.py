"""The KV cache a vLLM engine is given: sized from the job (``max_batch`` sequences of ``max_context``
tokens in whole blocks) unless ``engine.vllm.kv_cache_gib`` sets it; the memory plan counts it too."""

from __future__ import annotations

import math

MiB = 2**20


def kv_bytes_per_token(hf_config, dtype_bytes: int = 4) -> int:
    """Bytes of K and V one token holds over all layers (float32 by default, as vLLM runs here)."""
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return 2 * hf_config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def job_kv_bytes(hf_config, max_batch: int, max_context: int, block_size: int | None = 32, dtype_bytes: int = 4) -> int:
    """The KV cache a job needs: `max_batch` sequences of `max_context` tokens in whole blocks, rounded up
    to 16 MiB (vLLM holds no more rows than ``max_batch``, none longer than ``max_context``)."""
    block = block_size or 128  # vLLM's CPU default
    tokens = max_batch * math.ceil(max_context / block) * block
    return math.ceil(tokens * kv_bytes_per_token(hf_config, dtype_bytes) / (16 * MiB)) * 16 * MiB


def job_kv_gib(hf_config, engine_config) -> float:
    """``engine.vllm.kv_cache_gib`` sized from the job (`engine_config`: the env config's ``engine:``)."""
    return (
        job_kv_bytes(hf_config, engine_config.max_batch, engine_config.max_context, engine_config.vllm.block_size)
        / 2**30
    )


def kv_cache_gib(hf_config, engine_config) -> float:
    """The KV cache per vLLM engine: ``engine.vllm.kv_cache_gib`` where the config sets it, else sized from the job."""
    if engine_config.vllm.kv_cache_gib is not None:
        return engine_config.vllm.kv_cache_gib
    return job_kv_gib(hf_config, engine_config)

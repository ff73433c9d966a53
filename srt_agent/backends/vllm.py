"""vLLM as a rollout backend: :class:`VLLMBackend` drives a :class:`~.vllm_engine.VLLMEngine` (vLLM V1 in
this process) from the AsyncEngine's thread behind the RolloutBackend seam; :func:`vllm_backend` builds one
from an env config."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from ..engine import AsyncEngine
from .vllm_engine import VLLMEngine, check_vllm_drafter, vllm_version

MiB = 2**20


class VLLMBackend(AsyncEngine):
    """The rollout backend over :class:`VLLMEngine` (no run-ahead, no forward-cost table)."""

    name = "vllm"
    run_ahead = None

    def __init__(self, engine: VLLMEngine):
        super().__init__(engine)
        self.drafter_name = engine.drafter_name

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.call(lambda engine: engine.update_weights(weights)).result()

    def end_step(self) -> None:
        self.call(lambda engine: engine.end_step()).result()

    def stats(self) -> dict:
        return self.call(lambda engine: engine.stats()).result()

    def trees(self):
        proposer = self.call(lambda engine: engine.proposer()).result()
        return proposer.cache if proposer is not None else None

    def restore_trees(self, cache) -> None:
        def restore(engine: VLLMEngine) -> None:
            proposer = engine.proposer()
            if proposer is None:
                raise ValueError(f"drafter {engine.drafter_name!r} keeps no rollout cache")
            proposer.cache = cache

        self.call(restore).result()

    def step_costs(self) -> tuple[dict, dict]:
        e = self.engine
        return {}, {"engine": {"backend": "vllm", "max_batch": e.max_batch, "max_context": e.max_context}}

    def describe(self) -> str:
        e = self.engine
        return f"vLLM {vllm_version()} (float32, {e.device.type}, started in {e.startup_s:.0f} s)"

    def close(self) -> None:
        super().close()
        self.engine.close()


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


def vllm_backend(config, loaded, drafter: str | None = None) -> VLLMBackend:
    """vLLM for env config `config` (``engine:`` and ``engine.vllm:``) serving `loaded`'s model: the
    directory it was loaded from, else a directory saved from `loaded` itself."""
    from ..integrations.vllm.models import loaded_model_dir

    e = config.engine
    drafter = drafter or e.drafter
    check_vllm_drafter(drafter)
    source = str(getattr(loaded, "source", "")).partition(":")[2]
    model_dir = Path(source) if source and (Path(source) / "config.json").exists() else loaded_model_dir(loaded)
    engine = VLLMEngine(
        model_dir,
        loaded.tokenizer,
        loaded.eos_token_ids,
        drafter=drafter,
        max_batch=e.max_batch,
        max_context=e.max_context,
        speculative_tokens=e.vllm.speculative_tokens,
        enforce_eager=e.vllm.enforce_eager,
        kv_cache_gib=kv_cache_gib(loaded.model.config, e),
        threads=e.vllm.threads,
        exact_sampling=e.vllm.exact_sampling,
        block_size=e.vllm.block_size,
        proposer_options=e.vllm.proposer,
    )
    return VLLMBackend(engine)

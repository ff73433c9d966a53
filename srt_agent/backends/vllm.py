"""vLLM as a rollout backend: :class:`VLLMBackend` drives a :class:`~.vllm_engine.VLLMEngine` (vLLM V1 in
this process) from the AsyncEngine's thread behind the RolloutBackend seam; :func:`vllm_backend` builds one
from an env config. :class:`UndraftedView` runs requests without speculation on an SRT backend's engine, so a
comparison without speculation needs no second engine (nor its weights and KV cache)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from pathlib import Path

import torch

from ..engine import AsyncEngine, RequestOutput, SamplingParams
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

    def undrafted(self) -> UndraftedView | None:
        """This engine without speculation for the view's requests (None unless the drafter can leave
        requests out: SRT's proposer skips ``UNDRAFTED_PREFIX`` ids; vLLM's own drafters do not)."""
        return UndraftedView(self) if self.drafter_name == "srt" else None

    def forget_prefixes(self) -> None:
        """Empty vLLM's prefix cache (nothing may run): a run that follows another on a shared engine starts
        as cold as on an engine of its own."""

        def reset(engine: VLLMEngine) -> None:
            if engine.calls or not engine.llm.reset_prefix_cache():
                raise RuntimeError("vLLM's prefix cache cannot be emptied while requests run")

        self.call(reset).result()

    def describe(self) -> str:
        e = self.engine
        return f"vLLM {vllm_version()} (float32, {e.device.type}, started in {e.startup_s:.0f} s)"

    def close(self) -> None:
        super().close()
        self.engine.close()


class UndraftedView:
    """The rollout backend of a run without speculation on `owner`'s engine: its requests get no drafts and
    stay out of the trees (ids prefixed with ``UNDRAFTED_PREFIX``), with exact sampling the tokens are those
    of an engine without a drafter. Weights, steps, trees and closing are the owner's: the view's own calls
    for them do nothing."""

    name = "vllm"
    drafter_name = "none"
    run_ahead = None

    def __init__(self, owner: VLLMBackend):
        from ..integrations.vllm.settings import UNDRAFTED_PREFIX

        self.owner = owner
        self.engine = owner.engine
        self.prefix = UNDRAFTED_PREFIX

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        prompt_key: Hashable | None = None,
    ) -> RequestOutput:
        out = await self.owner.generate(self.prefix + request_id, prompt_ids, params, prompt_key)
        return dataclasses.replace(out, request_id=request_id)

    def release(self, request_id: str) -> None:
        self.owner.release(self.prefix + request_id)

    def idle_capacity(self) -> int:
        return self.owner.idle_capacity()

    def update_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The owner loads them."""

    def end_step(self) -> None:
        """The owner ends the step."""

    def stats(self) -> dict:
        return {**self.owner.stats(), "shared_with": self.owner.drafter_name}

    def trees(self) -> None:
        return None

    def restore_trees(self, cache) -> None:
        raise ValueError("drafter 'none' keeps no rollout cache")

    def step_costs(self) -> tuple[dict, dict]:
        return self.owner.step_costs()

    def forget_prefixes(self) -> None:
        self.owner.forget_prefixes()

    def describe(self) -> str:
        return f"{self.owner.describe()}, shared with {self.owner.drafter_name}: no drafts for this run"

    def close(self) -> None:
        """The owner closes the engine."""


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

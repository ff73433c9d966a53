"""The ``engine:`` section of the env config: the engine, run-ahead and vLLM options (the engine's defaults
from :mod:`srt_agent.engine.options`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from ..engine.options import EngineOptions, RunAheadOptions
from .strict import Strict

_ENGINE = EngineOptions()  # the engine's own defaults, which engine: takes
_RUN_AHEAD = RunAheadOptions()


class RunAheadConfig(Strict):
    """Run-ahead generation in the training drafter's engine (``srt-agent train``): idle capacity fills
    the trees of prompts that come soon with continuations under the current policy, never trained on.
    Defaults: the engine's (:class:`RunAheadOptions`)."""

    enabled: bool = False
    bubbles: list[Literal["tail", "tools", "update"]] = Field(
        default_factory=lambda: list(_RUN_AHEAD.bubbles),
        description="tail: beside the last running sequences; tools: while all wait on tools; update: during the policy update",
    )
    window: int = Field(0, ge=0, description="look-ahead prompts of the coming steps (0: the next step's batch)")
    tokens_per_sequence: int = Field(
        _RUN_AHEAD.tokens_per_sequence, ge=1, description="tokens per run-ahead sequence, at most"
    )
    budget_tokens: int = Field(_RUN_AHEAD.budget_tokens, ge=0, description="run-ahead tokens per step, at most")
    slack: float = Field(
        _RUN_AHEAD.slack, ge=0, description="how much a step may grow, as a share of its predicted cost"
    )
    start: Literal["prompt", "branch"] = Field(
        _RUN_AHEAD.start, description="start from the prompt or from where rollouts disagreed"
    )
    max_sequences: int = Field(
        _RUN_AHEAD.max_sequences, ge=0, description="run-ahead sequences at once (0: every free slot)"
    )

    def options(self, seed: int = 0) -> RunAheadOptions | None:
        """The engine's `RunAheadOptions`, or None when run-ahead is off."""
        if not self.enabled:
            return None
        return RunAheadOptions(
            bubbles=tuple(self.bubbles),
            slack=self.slack,
            tokens_per_sequence=self.tokens_per_sequence,
            budget_tokens=self.budget_tokens,
            start=self.start,
            max_sequences=self.max_sequences,
            seed=seed,
        )


class VLLMOptions(Strict):
    """How the vLLM backend runs (``engine.backend: vllm``)."""

    speculative_tokens: int = Field(8, ge=1, description="draft tokens per step (srt, ngram, suffix)")
    enforce_eager: bool | None = Field(
        None,
        description="skip torch.compile and CUDA graphs; null: on a CPU (start-up in seconds instead of minutes, and "
        "compiled was no faster at batch 1), off on a GPU (CUDA graphs make its decode steps fast)",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        description="KV cache per engine in GiB; null: sized from the job (max_batch sequences of max_context "
        "tokens); VLLM_CPU_KVCACHE_SPACE in the environment (whole GiB) overrides both. On a GPU the KV is what "
        "gpu_memory_utilization leaves after the weights, and this is the least it must hold (checked at start)",
    )
    batch_invariant: bool = Field(
        False,
        description="vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT: its Triton kernels, CUDA only; refused on a "
        "CPU): a request's logits do not depend on its batch, so its methods' tokens agree bit for bit",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="vLLM's share of the GPU's total memory (weights, activations, KV); null: the free memory less "
        "the trainer's reserve (16 bytes a parameter for its gradients, AdamW's moments and a reference or master "
        "copy, and a fifth of the card for its activations); set it to share a GPU among several engines",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="CPUs vLLM's OpenMP threads bind to, on a CPU (default: all this process may use but one, which "
        "the agent side needs: the controller, the tokenizer and the sandboxed tool runs)",
    )
    block_size: int | None = Field(
        32,
        ge=1,
        description="KV-cache block size in tokens (the prefix cache's granularity: GRPO siblings and later "
        "turns reuse whole blocks only; vLLM's CPU attention needs a multiple of 32); null: vLLM's default (128 on CPU)",
    )
    exact_sampling: bool = Field(
        True,
        description="sample as our engine does (position-keyed noise): a seeded request's tokens do not depend on "
        "the drafts, and equal our engine's on the same weights except where the engines' float errors flip a "
        "near-tie (rl/identity.py proves each); off: vLLM's own sampler (equal in distribution only)",
    )
    proposer: dict[str, Any] = Field(
        default_factory=dict,
        description="options of SRT's proposer inside vLLM (drafter srt): max_bytes, max_held, held_ttl_s, min_prob, "
        "whole_prompt, global_fallback, policy, step_fixed_ms, step_row_ms, draft_token_ms, calibrate, save_path, save_interval_s, ... "
        "(srt_agent.backends.vllm.proposer_options.ProposerOptions)",
    )

    @field_validator("proposer")
    @classmethod
    def _known_proposer_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        from ..backends.vllm.proposer_options import ProposerOptions

        return ProposerOptions.checked(value)


class EngineConfig(Strict):
    backend: str = Field(
        "engine",
        description="engine: ours; vllm: vLLM in this process; auto: vLLM where installed and the drafter has a vLLM counterpart",
    )
    vllm: VLLMOptions = Field(default_factory=VLLMOptions)
    drafter: str = _ENGINE.drafter
    device: str = _ENGINE.device
    dtype: Literal["auto", "float32", "bfloat16", "float16", "float64"] = Field(
        "auto",
        description="what the rollout engine computes in; auto: bfloat16 on a CUDA GPU that supports it, "
        "else the dtype the model was loaded in (float32)",
    )
    max_batch: int = Field(_ENGINE.max_batch, ge=1)
    max_context: int = Field(_ENGINE.max_context, ge=16)
    calibrate: bool = Field(
        _ENGINE.calibrate, description="measure step costs at start-up (sizes drafts from the first step)"
    )
    run_ahead: RunAheadConfig = Field(default_factory=RunAheadConfig)
    prefix_sharing: bool = Field(
        _ENGINE.prefix_sharing, description="reuse the KV of cached prompt prefixes (GRPO siblings, system prompts)"
    )
    prefix_cache_tokens: int = Field(
        _ENGINE.prefix_cache_tokens, ge=0, description="tokens of KV kept in the prefix cache's block pool"
    )
    tree_bytes: int | None = Field(
        None,
        gt=0,
        description="bytes SRT's trees may hold per engine (prompt trees, held turns, the global tree of responses); "
        "null: sized from the run (4 steps of prompts_per_step × n_samples rollouts of max_context tokens at 100 "
        "bytes a token, at least 64 MiB, at most an eighth of the host memory available); printed at start",
    )
    batch_invariant: bool | Literal["auto"] = Field(
        _ENGINE.batch_invariant,
        description="our engine: attention in float64, so a position's logits do not depend on the batch, the drafts or "
        "decoding vs scoring where the device's linears do not either (the trainer scores so too); auto: on a CPU "
        "whose linears pass the probe at start-up",
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from ..backends import unknown_backend

        if (unknown := unknown_backend(value)) is not None:
            raise ValueError(unknown)
        return value

    @field_validator("drafter")
    @classmethod
    def _known_drafter(cls, value: str) -> str:
        return checked_drafters([value])[0]


def checked_drafters(names: list[str]) -> list[str]:
    """`names`, or a ValueError naming the first that no drafter is registered under."""
    from ..drafting import DRAFTERS

    for name in names:
        if name not in DRAFTERS:
            raise DRAFTERS.unknown(name)
    return names

"""The env config (``envs/*.yaml``), the root of every run: pydantic models and a loader whose errors
name the file and the bad key.

The whole schema in one place, in the order of an env YAML: the rollout environment (model, tasks, tools,
limits, sampling, rewards), the engine, and the ``train:`` and ``cold_start:`` sections.
It imports nothing heavy (no torch), so reading and checking a config costs milliseconds: the engine's
defaults come from :mod:`srt_agent.engine.options`, and the names a YAML gives (drafter, backend, estimator,
loss, source) are checked against registries that load what they name only when it is used.
Relative paths inside a config (dataset, tools, cold-start traces) are resolved against its folder.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from ..engine.options import EngineDefaults, RunAheadOptions
from .algorithm_registry import AdvantageEstimator, get_adv_estimator, get_policy_loss
from .source_registry import EnvSource, episode_source, names_source, task_source
from .tasks import Task

M = TypeVar("M", bound=BaseModel)

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean")
KL_PENALTIES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")

# What each algorithm sets unless the config says otherwise (DAPO: GRPO with its clip-higher, dynamic sampling
# and overlong shaping); the one list of algorithms.
_CLIPPED = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode="token-mean")
PRESETS: dict[str, dict] = {
    "grpo": dict(_CLIPPED, adv_estimator="grpo"),
    "dapo": dict(
        _CLIPPED, adv_estimator="grpo", clip_ratio_high=0.28, dynamic_sampling=True, overlong_buffer=64, kl_coef=0.0
    ),
    "ppo": dict(_CLIPPED, adv_estimator="gae"),
}
ALGORITHMS = tuple(PRESETS)


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----- the rollout environment -----------------------------------------------------------------------


class ReasoningGymFamily(_Strict):
    """One task family of a reasoning-gym mix: its registered name, its share of the mix, its config."""

    name: str = Field(..., description="a reasoning-gym task family, e.g. basic_arithmetic, leg_counting")
    weight: float = Field(1.0, gt=0, description="relative share of the mix")
    config: dict[str, Any] = Field(default_factory=dict, description="the family's config (min_terms, ...)")


class DatasetConfig(_Strict):
    """Where tasks come from: ``source: arithmetic`` (procedural, seeded), ``source: reasoning_gym`` (a weighted
    mix of reasoning-gym task families, seeded) or a ``.jsonl``/``.parquet`` path in verl's layout; a source
    named by ``env:`` that brings its own tasks (``verifiers:<id>``) sets it. Sources: :mod:`srt_agent.sources`."""

    source: str = "arithmetic"
    n: int = Field(32, ge=1, description="number of procedural tasks")
    seed: int = 0
    few_shot: bool = Field(False, description="open procedural tasks with a worked ReTool example")
    limit: int | None = Field(None, ge=1, description="use at most this many tasks")
    system_prompt: str | None = Field(
        None, description="system prompt of procedural tasks (default: the source's ReTool-style prompt)"
    )
    reasoning_gym: list[ReasoningGymFamily] = Field(
        default_factory=list, description="source reasoning_gym: the task families of the mix"
    )
    _source_options: dict[str, Any] = PrivateAttr(default_factory=dict)  # env_options of the env that set source

    @model_validator(mode="after")
    def _check_source(self) -> DatasetConfig:
        if self.source != "reasoning_gym" and self.reasoning_gym:
            raise ValueError("reasoning_gym families are listed but source is not 'reasoning_gym'")
        self.task_source().check(dataset=self)
        return self

    @property
    def source_options(self) -> dict[str, Any]:
        """The ``env_options`` of a source named by ``env:`` that brings its own tasks (else empty)."""
        return self._source_options

    def task_source(self) -> EnvSource:
        """The environment source that loads this section's tasks."""
        return task_source(self.source)

    def tasks(self, limit: int | None = None) -> list[Task]:
        """The tasks this section names (at most `limit`, or the section's own limit)."""
        caps = [x for x in (limit, self.limit) if x is not None]
        return self.task_source().load_tasks(self, min(caps) if caps else None)


class SamplingConfig(_Strict):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = 0


class InterpreterConfig(_Strict):
    max_output_chars: int = Field(1024, ge=16, description="interpreter output cap (characters)")
    timeout_s: float | None = Field(None, gt=0, description="overrides the tool config's timeout")


class RewardConfig(_Strict):
    """How a final answer becomes a reward (the `reward:` section of an env config).

    ``turn_penalty`` is subtracted per tool turn (ReTool-style pressure towards fewer, better calls);
    ``min_reward`` floors the result. ``turn_shaping`` applies verl's ReTool recipe to a wrong answer
    (:func:`srt_agent.agent.rewards.retool_turn_shaped_reward`; use it with ``incorrect: -1``).

    ``kind`` picks the scorer: ``boxed`` compares the last ``\\boxed{}`` with the ground truth (math-verify,
    then exact match); ``reasoning_gym`` scores the final answer (``\\boxed{}``, else ``<answer>…</answer>``)
    with the task family's own scorer, ``incorrect + (correct - incorrect) * score`` for its score in
    [0, 1], and tasks without a reasoning-gym entry (the cold start's arithmetic traces) as ``boxed`` does;
    ``auto`` (default) does the same, and unlike ``reasoning_gym`` is allowed with any dataset.
    """

    kind: Literal["auto", "boxed", "reasoning_gym"] = "auto"
    correct: float = 1.0
    incorrect: float = 0.0
    turn_penalty: float = 0.0
    min_reward: float | None = None
    turn_shaping: bool = False
    use_math_verify: bool = True


# ----- the engine ------------------------------------------------------------------------------------

_ENGINE = EngineDefaults()  # the engine's own defaults, which engine: takes
_RUN_AHEAD = RunAheadOptions()


class RunAheadConfig(_Strict):
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


class VLLMOptions(_Strict):
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


class EngineConfig(_Strict):
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
        from ..drafting import DRAFTERS

        if value not in DRAFTERS:
            raise ValueError(f"unknown drafter {value!r}; choose one of {sorted(DRAFTERS)}")
        return value


# ----- training --------------------------------------------------------------------------------------


class LoraConfig(_Strict):
    """LoRA adapters through peft (``rank: 0`` trains every weight)."""

    rank: int = Field(0, ge=0, description="0 = full fine-tuning")
    alpha: float = Field(32.0, gt=0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class TrainConfig(_Strict):
    """One RL run (the ``train:`` section): algorithm, batch shape, optimizer, losses, what to compare and log.

    ``algorithm`` picks a preset (GRPO, DAPO or PPO); every field left out takes the preset's value, so
    ``algorithm: dapo`` alone gives clip-higher (0.2 / 0.28), dynamic sampling, token-level loss and the
    overlong penalty.
    """

    algorithm: str = Field("grpo", description="grpo, dapo or ppo (PRESETS: what each sets unless the config says)")
    steps: int = Field(4, ge=1)
    prompts_per_step: int = Field(4, ge=1, description="prompts per step; each is sampled n_samples times")
    seed: int = 0
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    ppo_epochs: int = Field(1, ge=1, description="passes over each step's batch")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass")
    micro_batch_tokens: int = Field(
        768, ge=64, description="packed tokens per forward/backward (attention is dense within one)"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="the update's compute dtype: weights and AdamW's state stay float32; bfloat16 computes as the "
        "engine does in bfloat16 (the weights cast to it, float32 residual stream and LM head); auto: the "
        "engine's dtype where it is bfloat16 or float16, else float32",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)
    # policy loss
    adv_estimator: str | None = Field(
        None, description="a registered advantage estimator (srt_agent.config.algorithm_registry)"
    )
    norm_adv_by_std: bool = True
    loss_mode: str = Field("vanilla", description="a registered policy loss, as verl's loss_mode")
    loss_agg_mode: str | None = None
    clip_ratio_low: float | None = Field(None, gt=0)
    clip_ratio_high: float | None = Field(None, gt=0)
    clip_ratio_c: float = Field(3.0, gt=1)
    entropy_coef: float = 0.0
    kl_coef: float | None = Field(None, ge=0, description="KL loss to the reference (start) policy; 0 = none")
    kl_penalty: str = "low_var_kl"
    # log-probs
    old_logprobs: Literal["trainer", "engine"] = "trainer"
    rollout_correction: Literal["auto", "tis", "mis", "off"] = Field(
        "auto",
        description="importance sampling between the engine's and the trainer's log-probs: tis (truncated at tis_cap), "
        "mis (tokens above tis_cap masked), off; auto: tis where the engines sample in a dtype other than float32 "
        "or float64, or from the step after one whose mean |Δ log-prob| exceeded rollout_correction_gap",
    )
    tis_cap: float = Field(2.0, gt=0, description="the importance weights' cap (tis) or mask threshold (mis)")
    rollout_correction_gap: float = Field(
        1e-3, gt=0, description="auto: a step's mean |Δ log-prob| above this turns the correction on"
    )
    logprob_mismatch_warn: float = Field(0.05, gt=0, description="flag a step whose mean |Δ log-prob| exceeds this")
    # DAPO
    dynamic_sampling: bool | None = None
    max_sampling_rounds: int = Field(
        3, ge=1, description="rollout rounds per step to fill the batch (dynamic sampling)"
    )
    overlong_buffer: int | None = Field(None, ge=0)
    overlong_penalty: float = Field(1.0, ge=0)
    # PPO
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    value_coef: float = Field(0.5, ge=0)
    cliprange_value: float = Field(0.5, gt=0)
    # bookkeeping
    compare: list[str] = Field(default_factory=list, description="drafters that regenerate every step for timing")
    checkpoint_every: int = Field(1, ge=1)
    keep_checkpoints: int = Field(1, ge=1, description="newest checkpoints kept in the run folder (resuming needs one)")
    keep_optimizer: bool = Field(
        False,
        description="a finished run's last checkpoint keeps AdamW's moments (twice the policy's size); off: it keeps "
        "the policy, trees and counters, and continuing it with more steps starts the moments afresh (said when it "
        "resumes). Checkpoints of a run that is not over (every step's, Ctrl-C's) always keep them",
    )
    max_memory_gb: float | None = Field(
        None,
        gt=0,
        description="refuse to start when the run plans for more (GB, all its processes); null: what the machine has available",
    )
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["tensorboard"])

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if isinstance(data, dict):
            algorithm = data.get("algorithm", "grpo")
            if algorithm not in PRESETS:
                raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {list(ALGORITHMS)}")
            data = {**PRESETS[algorithm], **{k: v for k, v in data.items() if v is not None}}
        return data

    @field_validator("adv_estimator")
    @classmethod
    def _registered_estimator(cls, value: str | None) -> str | None:
        if value is not None:
            get_adv_estimator(value)  # ValueError naming the registered ones
        return value

    @field_validator("loss_mode")
    @classmethod
    def _registered_loss(cls, value: str) -> str:
        get_policy_loss(value)
        return value

    @property
    def estimator(self) -> AdvantageEstimator:
        """The registered advantage estimator `adv_estimator` names, with what it needs."""
        return get_adv_estimator(self.adv_estimator)

    @property
    def needs_reference(self) -> bool:
        """Whether the run scores tokens with the reference (starting) policy: for a KL loss, or for an
        estimator that reads its log-probs."""
        return self.kl_coef > 0 or self.estimator.needs_ref_logprobs

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {self.loss_agg_mode!r}; choose one of {list(LOSS_AGG_MODES)}")
        if self.kl_penalty not in KL_PENALTIES:
            raise ValueError(f"unknown kl_penalty {self.kl_penalty!r}; choose one of {list(KL_PENALTIES)}")
        self.kl_coef = self.kl_coef or 0.0
        self.dynamic_sampling = bool(self.dynamic_sampling)
        self.overlong_buffer = self.overlong_buffer or 0
        return self


class ColdStartConfig(_Strict):
    """ReTool's cold start: SFT on code-integrated traces before RL, and the held-out tool-use report."""

    enabled: bool = True
    source: str = Field("procedural", description="'procedural' or a .jsonl/.parquet of verl multi-turn SFT rows")
    n: int = Field(64, ge=1, description="procedural traces to generate")
    seed: int = Field(1000, description="seed of the procedural tasks (distinct from the RL dataset's)")
    epochs: int = Field(1, ge=1)
    lr: float = Field(3e-5, gt=0)
    batch_size: int = Field(8, ge=1, description="traces per optimizer step")
    eval_tasks: int = Field(12, ge=0, description="held-out tasks for the before/after report (0: skip)")
    eval_seed: int = 2000

    def source_path(self, base: Path) -> Path | None:
        """The traces file, resolved against the config's folder (None for procedural traces)."""
        if self.source == "procedural":
            return None
        path = Path(self.source)
        return path if path.is_absolute() else (base / path).resolve()


# ----- the whole file --------------------------------------------------------------------------------


class EnvConfig(_Strict):
    """One rollout environment: model, tasks, tools, turn and token limits, sampling, rewards."""

    name: str = "env"
    env: str = Field(
        "srt_agent.agent.retool.ReToolEnv",
        description="dotted path of the Env class, or a source it names: verifiers:<taskset id> for a verifiers "
        "environment (srt_agent.sources)",
    )
    env_options: dict[str, Any] = Field(
        default_factory=dict, description="extra keyword arguments for the Env (verifiers: its EnvConfig data)"
    )
    agent: str | None = Field(
        None,
        description="module:function of an `async def agent(base_url, task) -> float` written against the openai "
        "client: rollouts run it against srt-agent's OpenAI-compatible server instead of the Env (docs/serving.md)",
    )
    model: str = "smollm2"
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    tools: Path | None = Field(None, description="tool config (verl's format)")
    n_samples: int = Field(1, ge=1, description="samples per task (a GRPO group)")
    max_turns: int = Field(4, ge=1)
    max_tokens_per_turn: int = Field(256, ge=1)
    max_response_tokens: int = Field(1024, ge=1, description="budget over all turns, tool tokens included")
    max_concurrent: int | None = Field(None, ge=1, description="trajectories in flight at once (default: all)")
    tool_timeout_s: float = Field(120.0, gt=0, description="a tool call still running after this is a 'timeout'")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    interpreter: InterpreterConfig = Field(default_factory=InterpreterConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    train: TrainConfig = Field(default_factory=TrainConfig, description="RL training (srt-agent train)")
    cold_start: ColdStartConfig = Field(default_factory=ColdStartConfig, description="SFT before RL")

    @field_validator("env")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if names_source(value):  # the source checks it (EnvConfig._sources)
            return value
        if "." not in value:
            raise ValueError(f"expected a dotted path like 'package.module.Class', got {value!r}")
        return value

    @field_validator("agent")
    @classmethod
    def _agent_path(cls, value: str | None) -> str | None:
        if value is not None and "." not in value.replace(":", "."):
            raise ValueError(f"expected 'package.module:function', got {value!r}")
        return value

    @model_validator(mode="after")
    def _sources(self) -> EnvConfig:
        source = self.episode_source()  # ValueError when two sources claim the episodes (agent: and env: both)
        source.check(config=self)
        if self.engine.run_ahead.enabled and not source.run_ahead:
            raise ValueError(
                f"engine.run_ahead drafts from the Env's prompts, which {source.name} episodes do not open with: "
                "turn it off"
            )
        if source.dataset is not None and source.dataset(self.env):  # the env brings its own tasks: the dataset
            if self.dataset.source not in (self.env, "arithmetic") or self.dataset.reasoning_gym:
                raise ValueError(f"env: {self.env} brings its own tasks: leave dataset.source out")
            self.dataset.source = self.env
            self.dataset._source_options = dict(self.env_options)
        return self

    def episode_source(self) -> EnvSource:
        """The environment source that runs this config's episodes (by ``env:`` and ``agent:``)."""
        return episode_source(self.env, self.agent)

    @model_validator(mode="after")
    def _reward_fits_tasks(self) -> EnvConfig:
        if self.reward.kind == "reasoning_gym" and self.dataset.source == "arithmetic":
            raise ValueError(
                "reward.kind reasoning_gym scores reasoning-gym tasks: set dataset.source: reasoning_gym "
                "(or reward.kind: boxed for arithmetic tasks)"
            )
        return self

    def env_class(self) -> type:
        """Import the Env class named by ``env`` (an ``env:`` naming a source names no Env: the default one)."""
        return import_dotted(EnvConfig.model_fields["env"].default if names_source(self.env) else self.env)


def import_dotted(path: str) -> Any:
    """Import ``package.module.Name``."""
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {path!r}: {exc}") from None


def read_yaml(path: str | Path) -> dict:
    """Parse a YAML mapping; malformed YAML raises :class:`ConfigError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def validate_config(model: type[M], data: dict, path: str | Path) -> M:
    """Validate `data` against `model`; every error names the file and the dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(part) for part in err["loc"]) or "(top level)"
            lines.append(f"{path}: {key}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set dotted keys from ``KEY=VALUE`` strings (values parsed as YAML), e.g. ``train.lr=1e-5``."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. train.steps=8")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: the value is not valid YAML") from None
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_env_config(path: str | Path, overrides: list[str] | None = None) -> EnvConfig:
    """Read and validate an env YAML (with ``KEY=VALUE`` overrides); relative paths become absolute."""
    path = Path(path)
    config = validate_config(EnvConfig, apply_overrides(read_yaml(path), overrides or []), path)
    base = path.resolve().parent
    if config.tools is not None and not config.tools.is_absolute():
        config.tools = (base / config.tools).resolve()
    if config.dataset.task_source().path:
        source = Path(config.dataset.source)
        config.dataset.source = str(source if source.is_absolute() else (base / source).resolve())
    traces = config.cold_start.source_path(base)
    if traces is not None:
        config.cold_start.source = str(traces)
    return config

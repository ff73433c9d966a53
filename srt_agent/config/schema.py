"""The env config (``envs/*.yaml``), the root of every run: pydantic models and a loader whose errors
name the file and the bad key.

The schema in the order of an env YAML: the rollout environment (model, tasks, tools, limits, sampling,
rewards), the engine (:mod:`.engine_config`), and the ``train:`` and ``cold_start:`` sections; the loader is
:mod:`.loading`.
It imports nothing heavy (no torch), so reading and checking a config costs milliseconds: the engine's
defaults come from :mod:`srt_agent.engine.options`, and the names a YAML gives (drafter, backend, estimator,
loss, source) are checked against registries that load what they name only when it is used.
Relative paths inside a config (dataset, tools, cold-start traces) are resolved against its folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from ..drafting.trees.budget import TreeBudget, tree_budget
from .algorithm_registry import AdvantageEstimator, get_adv_estimator, get_policy_loss
from .engine_config import EngineConfig, checked_drafters
from .source_registry import EnvSource, episode_source, names_source, task_source
from .strict import ConfigError, Strict, import_dotted
from .tasks import Task

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


# ----- the rollout environment -----------------------------------------------------------------------


class ReasoningGymFamily(Strict):
    """One task family of a reasoning-gym mix: its registered name, its share of the mix, its config."""

    name: str = Field(..., description="a reasoning-gym task family, e.g. basic_arithmetic, leg_counting")
    weight: float = Field(1.0, gt=0, description="relative share of the mix")
    config: dict[str, Any] = Field(default_factory=dict, description="the family's config (min_terms, ...)")


class DatasetConfig(Strict):
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


class SamplingConfig(Strict):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = 0


class InterpreterConfig(Strict):
    max_output_chars: int = Field(1024, ge=16, description="interpreter output cap (characters)")
    timeout_s: float | None = Field(None, gt=0, description="overrides the tool config's timeout")


class RewardConfig(Strict):
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


# ----- training --------------------------------------------------------------------------------------


class LoraConfig(Strict):
    """LoRA adapters through peft (``rank: 0`` trains every weight)."""

    rank: int = Field(0, ge=0, description="0 = full fine-tuning")
    alpha: float = Field(32.0, gt=0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class TrainConfig(Strict):
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

    @field_validator("compare")
    @classmethod
    def _known_drafters(cls, value: list[str]) -> list[str]:
        return checked_drafters(value)

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


class ColdStartConfig(Strict):
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


class EnvConfig(Strict):
    """One rollout environment: model, tasks, tools, turn and token limits, sampling, rewards."""

    _tree_budget: TreeBudget | None = PrivateAttr(None)  # worked out once (tree_budget)

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

    def tree_budget(self) -> TreeBudget:
        """The byte budget of SRT's trees per engine, with its shares: ``engine.tree_bytes``, else sized from
        the batch (prompts per step × samples) and length (``engine.max_context``) within the host memory
        available. Worked out once per config, so every engine, the proposer and the memory plan get the
        same figures."""
        if self._tree_budget is None:
            from ..runner.packed_linear import available_memory_bytes

            rollouts = self.train.prompts_per_step * self.n_samples
            self._tree_budget = tree_budget(
                rollouts, self.engine.max_context, self.engine.tree_bytes, available_memory_bytes()
            )
        return self._tree_budget

    def for_run(
        self, steps: int | None = None, compare: Sequence[str] | None = None, cold_start: bool | None = None
    ) -> EnvConfig:
        """A copy with a run's overrides (the ``train`` command's flags): RL steps, compared drafters, whether
        the cold start runs; None keeps the config's own."""
        config = self.model_copy(deep=True)
        config._tree_budget = None  # the batch may change below
        if steps is not None:
            config.train.steps = steps
        if compare is not None:
            try:
                config.train.compare = checked_drafters(list(compare))
            except ValueError as exc:
                raise ConfigError(f"train.compare: {exc}") from None
        if cold_start is not None:
            config.cold_start.enabled = cold_start
        return config

"""The ``train:`` and ``cold_start:`` sections of an env config (pydantic, strict).

``algorithm`` picks a preset (GRPO, DAPO or PPO); every field left out takes the preset's value, so
``algorithm: dapo`` alone gives clip-higher (0.2 / 0.28), dynamic sampling, token-level loss and the
overlong penalty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .algorithms import KL_PENALTIES, LOSS_AGG_MODES

ALGORITHMS = ("grpo", "dapo", "ppo")
# What each algorithm sets unless the config says otherwise.
PRESETS: dict[str, dict] = {
    "grpo": dict(adv_estimator="grpo", clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode="token-mean"),
    "dapo": dict(
        adv_estimator="grpo", clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean",
        dynamic_sampling=True, overlong_buffer=64, kl_coef=0.0,
    ),
    "ppo": dict(adv_estimator="gae", clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode="token-mean"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraConfig(_Strict):
    """LoRA adapters through peft (``rank: 0`` trains every weight)."""

    rank: int = Field(0, ge=0, description="0 = full fine-tuning")
    alpha: float = Field(32.0, gt=0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class TrainConfig(_Strict):
    """One RL run: algorithm, batch shape, optimizer, losses, what to compare and log."""

    algorithm: Literal["grpo", "dapo", "ppo"] = "grpo"
    steps: int = Field(4, ge=1)
    prompts_per_step: int = Field(4, ge=1, description="prompts per step; each is sampled n_samples times")
    seed: int = 0
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    ppo_epochs: int = Field(1, ge=1, description="passes over each step's batch")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass")
    micro_batch_tokens: int = Field(768, ge=64, description="packed tokens per forward/backward (attention is dense within one)")
    dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoraConfig = Field(default_factory=LoraConfig)
    # policy loss
    adv_estimator: Literal["grpo", "gae"] | None = None
    norm_adv_by_std: bool = True
    loss_agg_mode: str | None = None
    clip_ratio_low: float | None = Field(None, gt=0)
    clip_ratio_high: float | None = Field(None, gt=0)
    clip_ratio_c: float = Field(3.0, gt=1)
    entropy_coef: float = 0.0
    kl_coef: float | None = Field(None, ge=0, description="KL loss to the reference (start) policy; 0 = none")
    kl_penalty: str = "low_var_kl"
    # log-probs
    old_logprobs: Literal["trainer", "engine"] = "trainer"
    tis_cap: float | None = Field(None, gt=0, description="truncated importance sampling cap (engine vs trainer)")
    logprob_mismatch_warn: float = Field(0.05, gt=0, description="flag a step whose mean |Δ log-prob| exceeds this")
    # DAPO
    dynamic_sampling: bool | None = None
    max_sampling_rounds: int = Field(3, ge=1, description="rollout rounds per step to fill the batch (dynamic sampling)")
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
    keep_checkpoints: int = Field(2, ge=1)
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

"""Rollout correction: what is left of the gap between the engine's and the trainer's log-probabilities,
corrected by importance sampling (verl's rollout correction).

A sampled token's log-probability under the engine and under the trainer's old policy come from the same
numerics where they can (`runner/numerics.py`); what differs (a bfloat16 engine whose attention is not
batch-invariant, vLLM's own kernels) makes the rollouts slightly off-policy. ``train.rollout_correction``:

- ``tis``: each trained token's policy loss weighted by ``min(exp(old - engine), tis_cap)`` (token-level
  truncated importance sampling);
- ``mis``: masked importance sampling: the ratio where it is at most ``tis_cap``, 0 above (the token drops out);
- ``off``: no weights;
- ``auto`` (default): ``tis`` from the first step where the engines sample in a dtype other than float32 or
  float64, else from the step after one whose mean |Δ log-prob| exceeded ``rollout_correction_gap``.

Every step reports verl's diagnostics (``rollout_corr/kl``, ``k3_kl``, ``chi2_token``) and, while the
correction is on, the weights it applied (``rollout_corr/rollout_is_*``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..config import TrainConfig
from .batch import Sample

MODES = ("tis", "mis")
WIDE = (torch.float32, torch.float64)


def configured_mode(train: TrainConfig) -> str:
    """The mode the config names, ``auto`` resolved to off (only a trainer's :class:`RolloutCorrection`
    turns ``auto`` on)."""
    return train.rollout_correction if train.rollout_correction != "auto" else "off"


def correction_weights(old: torch.Tensor, engine: torch.Tensor, mode: str, cap: float) -> torch.Tensor | None:
    """Per token: the importance weight `mode` gives for log-probabilities `old` (trainer) and `engine`
    (None when off; 1 where the engine gave no log-probability)."""
    if mode not in MODES:
        return None
    ratio = torch.exp(old - engine).nan_to_num(nan=1.0)
    if mode == "tis":
        return torch.clamp(ratio, max=cap)
    return torch.where(ratio <= cap, ratio, torch.zeros_like(ratio))


def correction_metrics(samples: Sequence[Sample], mode: str, cap: float) -> dict[str, float]:
    """``rollout_corr/…`` over the samples' trained tokens (``old_logprobs`` against ``engine_logprobs``)."""
    pairs = [
        (old, engine)
        for s in samples
        if s.old_logprobs is not None
        for old, engine, m in zip(s.old_logprobs, s.engine_logprobs, s.response_mask)
        if m and math.isfinite(engine)
    ]
    if not pairs:
        return {}
    old, engine = torch.tensor(pairs, dtype=torch.float64).unbind(1)
    log_ratio = old - engine
    ratio = torch.exp(log_ratio)
    out = {
        "rollout_corr/on": float(mode in MODES),
        "rollout_corr/kl": float((engine - old).mean()),  # KL(engine || trainer), estimated on the engine's tokens
        "rollout_corr/k3_kl": float((ratio - log_ratio - 1).mean()),
        "rollout_corr/chi2_token": float((ratio**2).mean() - 1),
    }
    weights = correction_weights(old, engine, mode, cap)
    if weights is not None:
        out.update(
            {
                "rollout_corr/rollout_is_mean": float(weights.mean()),
                "rollout_corr/rollout_is_min": float(ratio.min()),
                "rollout_corr/rollout_is_max": float(ratio.max()),
                "rollout_corr/rollout_is_ratio_fraction_high": float((ratio > cap).double().mean()),
                "rollout_corr/rollout_is_ratio_fraction_low": float((ratio < 1 / cap).double().mean()),
                "rollout_corr/rollout_is_eff_sample_size": float(
                    weights.sum() ** 2 / (len(weights) * (weights**2).sum())
                )
                if float(weights.abs().sum()) > 0
                else 0.0,
            }
        )
        if mode == "mis":
            out["rollout_corr/rollout_rs_masked_fraction"] = float((ratio > cap).double().mean())
    return out


class RolloutCorrection:
    """Which correction a run's steps apply (``train.rollout_correction``), and the one console line that
    says when ``auto`` turned it on and why."""

    def __init__(self, train: TrainConfig, engine_dtype: torch.dtype):
        self.train = train
        self.mode = configured_mode(train)
        self.why: str | None = None
        if train.rollout_correction == "auto" and train.old_logprobs == "trainer" and engine_dtype not in WIDE:
            self.mode = "tis"
            self.why = f"the engines sample in {str(engine_dtype).removeprefix('torch.')}"

    def observe(self, metrics: dict[str, float]) -> None:
        """After a step: ``auto`` turns the correction on when the step's mean |Δ log-prob| exceeded the gap."""
        gap = metrics.get("training/rollout_logprob_diff_mean")
        auto = self.train.rollout_correction == "auto" and self.train.old_logprobs == "trainer"
        if auto and self.mode == "off" and gap is not None and gap > self.train.rollout_correction_gap:
            self.mode = "tis"
            self.why = (
                f"step {metrics['step']:.0f}'s mean |Δ log-prob| {gap:.1e} exceeded "
                f"train.rollout_correction_gap {self.train.rollout_correction_gap:g}"
            )

    def announcement(self) -> str | None:
        """The line to print once the correction is on because of ``auto`` (None otherwise); once only."""
        if self.why is None:
            return None
        line = (
            f"rollout correction on: truncated importance sampling (train.rollout_correction: auto, "
            f"tis_cap {self.train.tis_cap:g}), as {self.why}; "
            "rollout_corr/* in report.json, the IS w column"
        )
        self.why = None
        return line

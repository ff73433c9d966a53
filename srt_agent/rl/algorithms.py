"""RL algorithms as small pure functions over tensors and a response mask, found by name.

They follow verl's ``core_algos`` (same formulas, same metric names) so results carry over, and are
tested against it on the same tensors. As there, advantage estimators and policy losses sit in
registries (:mod:`srt_agent.config.algorithm_registry`, re-exported here), found by the name the env YAML gives
(``train.adv_estimator``, ``train.loss_mode``). Every estimator has one signature,
``fn(batch: AdvantageInputs, train: TrainConfig) -> (advantages, returns or None)``, and declares what it
needs when registered: ``@register_adv_est("name", needs_values=True)`` is all it takes to add one.
Per-token tensors are flat (the packed tokens of a micro-batch) or padded ``[batch, length]``; aggregation
takes an optional per-token sequence index for the ``seq-mean-*`` modes and global normalizers, so
micro-batched gradient accumulation gives the loss of the whole mini-batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..config import KL_PENALTIES, LOSS_AGG_MODES
from ..config.algorithm_registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    PolicyLoss,
    get_adv_estimator,
    get_adv_estimator_fn,
    get_policy_loss,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)

if TYPE_CHECKING:
    from ..config import TrainConfig

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdvantageEstimator",
    "AdvantageInputs",
    "PolicyLoss",
    "get_adv_estimator",
    "get_adv_estimator_fn",
    "get_policy_loss",
    "get_policy_loss_fn",
    "register_adv_est",
    "register_policy_loss",
]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), values, 0.0).sum() / (mask.sum() + 1e-8)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit (unbiased) variance over the masked entries."""
    mean = masked_mean(values, mask)
    count = mask.sum()
    if count < 2:
        raise ValueError("whitening needs at least two unmasked values")
    var = masked_mean((values - mean) ** 2, mask) * count / (count - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


# ----- advantages -----------------------------------------------------------------------------------


@dataclass
class AdvantageInputs:
    """What an advantage estimator reads: B responses, per-token tensors padded to the longest (T tokens).

    ``values``, ``old_logprobs`` and ``ref_logprobs`` are there when the estimator was registered as
    needing them (``needs_values``, …), None otherwise; they are 0 at untrained positions and padding.
    """

    scores: torch.Tensor  # [B] float64: each response's (shaped) reward
    groups: list[Hashable]  # [B] each response's prompt group (GRPO's siblings share one)
    mask: torch.Tensor  # [B, T] float32: 1 = trained token, 0 = tool output or padding
    values: torch.Tensor | None = None  # [B, T] float32: the value head's, before the update
    old_logprobs: torch.Tensor | None = None  # [B, T] float32: the policy's, before the update
    ref_logprobs: torch.Tensor | None = None  # [B, T] float32: the reference (starting) policy's

    def outcome_rewards(self) -> torch.Tensor:
        """``[B, T]`` float32: each score on its response's last trained token, 0 elsewhere."""
        rewards = torch.zeros(self.mask.shape)
        for i, row in enumerate(self.mask):
            trained = row.nonzero()
            if len(trained):
                rewards[i, int(trained[-1])] = float(self.scores[i])
        return rewards


def grpo_advantages(
    scores: torch.Tensor, groups: Sequence[Hashable], norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO's outcome advantage per response: (score - group mean) / (group std + eps).

    A group of one gets mean 0 and std 1, as in verl; `norm_by_std=False` is Dr. GRPO.
    """
    if len(groups) != len(scores):
        raise ValueError(f"{len(scores)} scores but {len(groups)} group ids")
    out = torch.empty_like(scores)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        group = scores[idx]
        mean, std = (group.mean(), group.std()) if len(idx) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        out[idx] = (group - mean) / (std + eps) if norm_by_std else group - mean
    return out


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over padded ``[batch, length]`` responses (PPO).

    Positions with ``mask = 0`` (tool output, padding) are skipped: they neither bootstrap a value nor
    carry the running advantage. Returns whitened advantages and the returns (advantage + value).
    """
    with torch.no_grad():
        next_value = torch.zeros_like(rewards[:, 0])
        running = torch.zeros_like(rewards[:, 0])
        out = []
        for t in reversed(range(rewards.shape[1])):
            m = mask[:, t].to(rewards.dtype)
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            candidate = delta + gamma * lam * running
            next_value = values[:, t] * m + (1 - m) * next_value
            running = candidate * m + (1 - m) * running
            out.append(running)
        advantages = torch.stack(out[::-1], dim=1)
        returns = advantages + values
        return masked_whiten(advantages, mask), returns


@register_adv_est("grpo")
def grpo_estimator(batch: AdvantageInputs, train: TrainConfig) -> tuple[torch.Tensor, None]:
    """``adv_estimator: grpo``: :func:`grpo_advantages` of the scores on every trained token (no returns)."""
    adv = grpo_advantages(batch.scores, batch.groups, train.norm_adv_by_std)
    return torch.where(batch.mask.bool(), adv.unsqueeze(-1), 0.0), None


@register_adv_est("gae", needs_values=True)
def gae_estimator(batch: AdvantageInputs, train: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``adv_estimator: gae`` (needs values): :func:`gae_advantages` of the outcome reward on the last
    trained token, with the run's ``gamma`` and ``lam``."""
    return gae_advantages(batch.outcome_rewards(), batch.values, batch.mask, train.gamma, train.lam)


# The functions above are registered by reference in srt_agent.config.algorithm_registry (which needs no torch).


def overlong_penalty(response_length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max_length - buffer``, then linear down to ``-factor``."""
    if buffer <= 0:
        return 0.0
    exceed = response_length - (max_length - buffer)
    return min(-exceed / buffer * factor, 0.0)


def informative_groups(rewards: Sequence[float], groups: Sequence[Hashable]) -> set[Hashable]:
    """DAPO's dynamic sampling: every group but those of two or more responses with equal rewards.

    As verl's ``filter_groups``: a group of one is kept (GRPO gives it its score as advantage).
    """
    seen: dict[Hashable, list[float]] = {}
    for r, g in zip(rewards, groups):
        seen.setdefault(g, []).append(round(float(r), 9))
    return {g for g, values in seen.items() if len(values) == 1 or len(set(values)) > 1}


# ----- losses ---------------------------------------------------------------------------------------


def agg_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    seq_index: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses to a scalar, as verl's ``agg_loss`` does.

    For flat (packed) tensors the ``seq-mean-*`` modes need `seq_index` (the sequence of each token);
    padded ``[batch, length]`` tensors use their rows. `num_tokens` / `num_seqs` are the normalizers of
    the whole mini-batch (default: this call's own), so micro-batch losses add up to the full loss.
    """
    mask = mask.to(loss.dtype)
    masked = torch.where(mask.bool(), loss, 0.0) * mask
    if mode == "token-mean":
        return masked.sum() / (num_tokens if num_tokens is not None else mask.sum())
    if mode == "token-sum":
        return masked.sum()
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {LOSS_AGG_MODES}")
    if seq_index is None:
        if loss.dim() != 2:
            raise ValueError("seq-mean modes on flat tensors need seq_index")
        seq_sums, seq_counts = masked.sum(-1), mask.sum(-1)
    else:
        n = int(seq_index.max()) + 1 if seq_index.numel() else 0
        seq_sums = torch.zeros(n, dtype=loss.dtype, device=loss.device).index_add(0, seq_index, masked)
        seq_counts = torch.zeros(n, dtype=loss.dtype, device=loss.device).index_add(0, seq_index, mask)
    if mode == "seq-mean-token-mean":
        seq_sums = seq_sums / (seq_counts + 1e-8)
    present = (seq_counts > 0).to(loss.dtype)
    return (seq_sums * present).sum() / (num_seqs if num_seqs is not None else present.sum())


def policy_loss(
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate per token (clip-higher: separate low/high ranges; dual clip at `clip_c`).

    Returns the per-token loss (aggregate it with :func:`agg_loss`) and verl's metrics
    ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``. `weights` (e.g. truncated
    importance-sampling ratios) multiply the per-token loss.
    """
    if clip_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_c}")
    log_ratio = torch.clamp(logprobs - old_logprobs, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_c
    dual = torch.minimum(loss3, clipped)
    loss = torch.where(advantages < 0, dual, clipped)
    if weights is not None:
        loss = loss * weights
    metrics = {
        "actor/pg_clipfrac": masked_mean(torch.gt(loss2, loss1).float(), mask).detach(),
        "actor/ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "actor/pg_clipfrac_lower": masked_mean(
            torch.gt(clipped, loss3).float() * (advantages < 0).float(), mask
        ).detach(),
    }
    return loss, metrics


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: TrainConfig,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's ``vanilla`` loss (``loss_mode: vanilla``, registered by reference in srt_agent.config.algorithm_registry):
    :func:`policy_loss` with the config's clip ratios."""
    return policy_loss(
        old_logprobs,
        logprobs,
        advantages,
        mask,
        config.clip_ratio_low,
        config.clip_ratio_high,
        config.clip_ratio_c,
        weights,
    )


def value_loss(
    values_pred: torch.Tensor, returns: torch.Tensor, values_old: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss per token, ``0.5 * max((v - R)², (clip(v) - R)²)``, and where clipping won."""
    clipped = torch.clamp(values_pred, values_old - clip, values_old + clip)
    loss1, loss2 = (values_pred - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.maximum(loss1, loss2), torch.gt(loss2, loss1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate to the reference policy (Schulman's k1, k2, k3 = ``low_var_kl``, or abs)."""
    if kind in ("kl", "k1"):
        return logprobs - ref_logprobs
    if kind == "abs":
        return (logprobs - ref_logprobs).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprobs - ref_logprobs).square()
    if kind in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprobs - logprobs, -20, 20)
        return torch.clamp(torch.exp(kl) - kl - 1, -10, 10)
    raise ValueError(f"unknown kl_penalty {kind!r}; choose one of {KL_PENALTIES}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution of each row of logits: ``logsumexp(x) - Σ softmax(x)·x``."""
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)

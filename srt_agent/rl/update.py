"""One policy update from a step's samples: mini-batches, packed micro-batches, gradient accumulation.

The loss of a mini-batch is the same whatever its micro-batching: every micro-batch's loss is
normalized by the mini-batch's trained tokens (or sequences), so the accumulated gradient is the
gradient of the whole. A non-finite loss or gradient skips the optimizer step (counted, never applied).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from ..config import TrainConfig
from ..config.algorithm_registry import AdvantageEstimator
from .algorithms import AdvantageInputs, agg_loss, get_policy_loss_fn, kl_penalty, value_loss
from .batch import Sample, count_rollouts, mini_batches, pack, share_advantages
from .correction import configured_mode, correction_metrics, correction_weights
from .metrics import sample_metrics
from .policy import Policy


class MetricSums:
    """Token-weighted running means of named metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, name: str, value: float | torch.Tensor, weight: float = 1.0) -> None:
        value = float(value)
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}


@torch.no_grad()
def score_samples(
    policy: Policy, samples: Sequence[Sample], micro_batch_tokens: int, reference: bool = False
) -> tuple[list[list[float]], list[list[float]] | None]:
    """Per sample, per response token: log-probs (0.0 at untrained positions) and values (or None)."""
    logprobs: list[list[float]] = [[] for _ in samples]
    values: list[list[float]] | None = None
    if policy.value_head is not None and not reference:
        values = [[] for _ in samples]
    for batch in pack(samples, micro_batch_tokens):
        scores = policy.score(batch, reference=reference)
        for i, lp in batch.split(samples, scores.logprobs):
            logprobs[i] = lp
        if values is not None and scores.values is not None:
            for i, v in batch.split(samples, scores.values):
                values[i] = v
    return logprobs, values


def logprob_mismatch(samples: Sequence[Sample], trainer_logprobs: Sequence[Sequence[float]]) -> dict[str, float]:
    """How far the engine's sampling log-probs are from the trainer's on the same tokens (trained tokens)."""
    diffs = [
        abs(a - b)
        for s, lp in zip(samples, trainer_logprobs)
        for a, b, m in zip(s.engine_logprobs, lp, s.response_mask)
        if m
    ]
    probs = [
        abs(math.exp(a) - math.exp(b))
        for s, lp in zip(samples, trainer_logprobs)
        for a, b, m in zip(s.engine_logprobs, lp, s.response_mask)
        if m
    ]
    if not diffs:
        return {}
    return {
        "training/rollout_logprob_diff_mean": sum(diffs) / len(diffs),
        "training/rollout_logprob_diff_max": max(diffs),
        "training/rollout_probs_diff_mean": sum(probs) / len(probs),
        "training/rollout_probs_diff_max": max(probs),
    }


def needs_old_pass(cfg: TrainConfig) -> bool:
    """Whether old log-probs must come from a separate no-grad pass (the policy moves between uses)."""
    return cfg.ppo_epochs > 1 or cfg.mini_batches > 1


def update_policy(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    cfg: TrainConfig,
    generator: torch.Generator | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    on_tokens: Callable[[int], None] | None = None,
    correction: str | None = None,
) -> dict[str, float]:
    """Run the configured epochs and mini-batches of PPO-style updates over `samples` (`on_tokens(n)` after
    each micro-batch, with the tokens it trained; `correction`: the rollout correction's mode, None: the
    config's unless it says ``auto``, which only the trainer resolves, so off).

    Samples must carry ``advantages`` (and ``returns``/``values`` with a value head, ``ref_logprobs``
    with a KL loss, ``old_logprobs`` when :func:`needs_old_pass`). Without a separate old pass, the first
    pass's log-probs are the old policy's and are written to ``old_logprobs``. Returns verl-named metrics.
    """
    metrics = MetricSums()
    correction = correction or configured_mode(cfg)
    trainable = [i for i, s in enumerate(samples) if s.trained_tokens > 0]
    if not trainable:
        return {"training/skipped_updates": 1.0}
    first_pass = not needs_old_pass(cfg)
    skipped = 0
    trained_tokens = 0
    start = time.perf_counter()
    for _ in range(cfg.ppo_epochs):
        if cfg.mini_batches > 1:
            order = [trainable[i] for i in torch.randperm(len(trainable), generator=generator).tolist()]
        else:
            order = trainable
        for chosen in mini_batches(samples, order, cfg.mini_batches):
            num_tokens = sum(samples[i].trained_tokens for i in chosen)
            num_seqs = count_rollouts(samples, chosen)  # a session's branches are one sequence
            optimizer.zero_grad(set_to_none=True)
            finite = True
            for batch in pack(samples, cfg.micro_batch_tokens, chosen):
                loss, parts, weight, logprobs = _micro_loss(
                    policy, samples, batch, cfg, num_tokens, num_seqs, first_pass, correction
                )
                if first_pass:
                    for i, lp in batch.split(samples, logprobs):
                        samples[i].old_logprobs = lp
                for name, value in parts.items():
                    metrics.add(name, value, weight)
                if not torch.isfinite(loss):
                    finite = False
                    break
                loss.backward()
                trained_tokens += weight
                if on_tokens is not None:
                    on_tokens(int(weight))
            grad_norm = (
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
                if finite
                else torch.tensor(float("nan"))
            )
            if finite and torch.isfinite(grad_norm):
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                metrics.add("actor/grad_norm", grad_norm)
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            first_pass = False
    out = metrics.means()
    out["actor/lr"] = optimizer.param_groups[0]["lr"]
    out["training/nonfinite_updates"] = float(skipped)
    elapsed = time.perf_counter() - start
    out["perf/trained_tokens_per_s"] = trained_tokens / elapsed if elapsed > 0 else 0.0
    return out


def _micro_loss(
    policy: Policy,
    samples: Sequence[Sample],
    batch,
    cfg: TrainConfig,
    num_tokens: int,
    num_seqs: int,
    first_pass: bool,
    correction: str,
) -> tuple[torch.Tensor, dict[str, float], float, torch.Tensor]:
    """The loss of one micro-batch (normalized to its mini-batch), its metrics, weight and log-probs;
    `correction`: the rollout correction's mode (`correction.py`)."""
    scores = policy.score(batch, entropy=cfg.entropy_coef != 0)
    lp = scores.logprobs
    device = lp.device
    mask = torch.ones_like(lp)
    engine_lp = batch.per_target(samples, "engine_logprobs").to(device)
    if cfg.old_logprobs == "engine":
        old = engine_lp
    elif first_pass:
        old = lp.detach()
    else:
        old = batch.per_target(samples, "old_logprobs").to(device)
    weights = correction_weights(old, engine_lp, correction, cfg.tis_cap) if cfg.old_logprobs == "trainer" else None
    adv = batch.per_target(samples, "advantages").to(device)
    agg = dict(mode=cfg.loss_agg_mode, seq_index=batch.seq_index.to(device), num_tokens=num_tokens, num_seqs=num_seqs)
    pg, pg_metrics = get_policy_loss_fn(cfg.loss_mode)(old, lp, adv, mask, cfg, weights)
    pg_loss = agg_loss(pg, mask, **agg)
    loss = pg_loss
    parts: dict[str, float] = {k: float(v) for k, v in pg_metrics.items()}
    # Metrics are token-weighted means; the losses are reported per token of the mini-batch.
    tokens = float(len(lp))
    parts["actor/pg_loss"] = float(agg_loss(pg.detach(), mask, "token-mean"))
    if scores.entropy is not None:
        loss = loss - cfg.entropy_coef * agg_loss(scores.entropy, mask, **agg)
        parts["actor/entropy"] = float(scores.entropy.detach().mean())
    if cfg.kl_coef > 0:
        ref = batch.per_target(samples, "ref_logprobs").to(device)
        kl = kl_penalty(lp, ref, cfg.kl_penalty)
        loss = loss + cfg.kl_coef * agg_loss(kl, mask, **agg)
        parts["actor/kl_loss"] = float(kl.detach().mean())
    if scores.values is not None:
        returns = batch.per_target(samples, "returns").to(device)
        values_old = batch.per_target(samples, "values").to(device)
        vf, clipped = value_loss(scores.values, returns, values_old, cfg.cliprange_value)
        loss = loss + cfg.value_coef * agg_loss(vf, mask, **agg)
        parts["critic/vf_loss"] = float(vf.detach().mean())
        parts["critic/vf_clipfrac"] = float(clipped.float().mean())
        parts["critic/vpred_mean"] = float(scores.values.detach().mean())
    return loss, parts, tokens, lp.detach()


def trained_tokens(samples: Sequence[Sample], cfg: TrainConfig) -> int:
    """Tokens an update trains on, counted over all its passes (what :func:`update_step` reports as it goes)."""
    return cfg.ppo_epochs * sum(s.trained_tokens for s in samples)


def update_step(
    policy: Policy,
    reference: Policy | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    samples: list[Sample],
    cfg: TrainConfig,
    seed: int,
    on_tokens: Callable[[int], None] | None = None,
    correction: str | None = None,
) -> dict[str, float]:
    """One RL step's policy update: the old policy's (and the reference's) log-probs where the config needs
    them, advantages, then :func:`update_policy` (with rollout correction `correction`); verl-named metrics
    and timings, ``rollout_corr/…`` among them."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    estimator = cfg.estimator
    if needs_old_pass(cfg) or estimator.needs_values or estimator.needs_old_logprobs:
        logprobs, values = score_samples(policy, samples, cfg.micro_batch_tokens)
        for s, lp in zip(samples, logprobs):
            s.old_logprobs = lp
        if values is not None:
            for s, v in zip(samples, values):
                s.values = v
    if cfg.needs_reference:
        ref_logprobs, _ = score_samples(
            reference or policy, samples, cfg.micro_batch_tokens, reference=reference is None
        )
        for s, lp in zip(samples, ref_logprobs):
            s.ref_logprobs = lp
    out["timing_s/old_log_prob"] = time.perf_counter() - t0
    compute_advantages(samples, cfg)
    t0 = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    correction = correction or configured_mode(cfg)
    out.update(update_policy(policy, optimizer, samples, cfg, generator, scheduler, on_tokens, correction))
    out["timing_s/update_actor"] = time.perf_counter() - t0
    out.update(logprob_mismatch(samples, [s.old_logprobs or [] for s in samples]))
    out.update(correction_metrics(samples, correction if cfg.old_logprobs == "trainer" else "off", cfg.tis_cap))
    out.update(sample_metrics(samples))
    out["perf/trained_tokens"] = float(sum(s.trained_tokens for s in samples))
    out["perf/update_tokens"] = float(sum(len(s) for s in samples))
    return out


def compute_advantages(samples: Sequence[Sample], train: TrainConfig) -> None:
    """Fill every sample's per-token ``advantages`` (and ``returns`` where the estimator gives them) with
    the registered estimator ``train.adv_estimator`` names.

    A rollout's earlier branches (``lead=False``) stay out of an estimator that needs no values (an outcome
    estimator's group statistics count each rollout once) and take their lead's advantage; a value-based
    estimator (GAE) scores every branch as a sequence of its own that ends in the rollout's reward."""
    estimator = train.estimator
    scored = list(samples) if estimator.needs_values else [s for s in samples if s.lead]
    batch = advantage_inputs(scored, estimator)
    advantages, returns = estimator.fn(batch, train)
    for name, out in (("advantages", advantages), ("returns", returns)):
        if out is not None and tuple(out.shape) != tuple(batch.mask.shape):
            raise ValueError(
                f"adv_estimator {estimator.name!r} returned {name} of shape {tuple(out.shape)}, "
                f"expected {tuple(batch.mask.shape)} (responses x longest response)"
            )
    if estimator.needs_values and returns is None:
        raise ValueError(f"adv_estimator {estimator.name!r} needs values but returned no returns to train them on")
    for i, s in enumerate(scored):
        n = len(s.response_ids)
        s.advantages = advantages[i, :n].tolist()
        if returns is not None:
            s.returns = returns[i, :n].tolist()
    if len(scored) < len(samples):
        share_advantages(samples)


def advantage_inputs(samples: Sequence[Sample], estimator: AdvantageEstimator) -> AdvantageInputs:
    """The samples as an estimator reads them: scores, groups, padded masks and the per-token inputs it
    declared it needs (which the samples must carry)."""
    length = max((len(s.response_ids) for s in samples), default=0)
    mask = torch.zeros(len(samples), length)
    for i, s in enumerate(samples):
        mask[i, : len(s.response_mask)] = torch.tensor(s.response_mask, dtype=torch.float32)

    def padded(name: str) -> torch.Tensor:
        out = torch.zeros(len(samples), length)
        for i, s in enumerate(samples):
            values = getattr(s, name)
            if values is None:
                raise ValueError(f"adv_estimator {estimator.name!r} needs {name}, which sample {i} lacks")
            out[i, : len(values)] = torch.tensor(values)
        return out

    return AdvantageInputs(
        scores=torch.tensor([s.reward for s in samples], dtype=torch.float64),
        groups=[s.group for s in samples],
        mask=mask,
        values=padded("values") if estimator.needs_values else None,
        old_logprobs=padded("old_logprobs") if estimator.needs_old_logprobs else None,
        ref_logprobs=padded("ref_logprobs") if estimator.needs_ref_logprobs else None,
    )

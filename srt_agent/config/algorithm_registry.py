"""The names ``train.adv_estimator`` and ``train.loss_mode`` can take: registries of advantage estimators
and policy losses, each entry with what the update must compute for it.

It imports no torch, so that the config checks a name when it is read (in milliseconds): the built-ins are
declared here with their needs, and their module (the trainer's algorithms, a floor above) registers their
functions with the same ``@register_adv_est`` / ``@register_policy_loss`` that add any entry. Adding an
estimator is one registered function: the config accepts its name, ``compute_advantages`` calls it, and
the policy and the update read its declared needs (value head, old or reference log-probs), never its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from ..registry import Registry

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class Registered:
    """A registry entry: its name and its function (None while a built-in is only declared)."""

    name: str
    target: Callable | None = None

    @property
    def fn(self) -> Callable:
        if self.target is None:
            raise LookupError(f"{self.name!r} is declared, but its module has not registered its function yet")
        return self.target


@dataclass(frozen=True)
class AdvantageEstimator(Registered):
    """An advantage estimator, called as ``fn(batch, train) -> (advantages, returns or None)``.

    `batch` is an :class:`srt_agent.rl.algorithms.AdvantageInputs` (per-sample scores and groups, padded
    ``[batch, length]`` response masks and the per-token inputs asked for below); `train` the run's
    :class:`~srt_agent.config.TrainConfig`. Both outputs are padded ``[batch, length]``; advantages at
    untrained positions are never used.

    - `needs_values`: the policy carries a value head; ``batch.values`` holds its values before the update,
      the estimator returns the value loss's targets (returns), and the update trains the head on them.
    - `needs_old_logprobs`: ``batch.old_logprobs`` holds the policy's log-probs before the update.
    - `needs_ref_logprobs`: ``batch.ref_logprobs`` holds the reference (starting) policy's log-probs.
    """

    needs_values: bool = False
    needs_old_logprobs: bool = False
    needs_ref_logprobs: bool = False


@dataclass(frozen=True)
class PolicyLoss(Registered):
    """A policy loss, called as ``fn(old_logprobs, logprobs, advantages, mask, train, weights)`` over the
    trained tokens of a micro-batch; returns the per-token loss (aggregated by ``agg_loss``) and metrics."""


ADV_ESTIMATOR_REGISTRY: Registry[AdvantageEstimator] = Registry("adv_estimator")
POLICY_LOSS_REGISTRY: Registry[PolicyLoss] = Registry("loss_mode")


def _register(registry: Registry, entry: Registered) -> None:
    """Add `entry`; a declared built-in with the same needs gets its function."""
    old = registry.get(entry.name)
    if old is not None and old.target is None and replace(old, target=entry.target) == entry:
        registry[entry.name] = entry
    else:
        registry.add(entry.name, entry)


def register_adv_est(
    name: str, *, needs_values: bool = False, needs_old_logprobs: bool = False, needs_ref_logprobs: bool = False
) -> Callable[[F], F]:
    """Register ``fn(batch, train) -> (advantages, returns or None)`` as advantage estimator `name`
    (``train.adv_estimator``), with what it needs (see :class:`AdvantageEstimator`)."""

    def decorate(fn: F) -> F:
        entry = AdvantageEstimator(name, fn, needs_values, needs_old_logprobs, needs_ref_logprobs)
        _register(ADV_ESTIMATOR_REGISTRY, entry)
        return fn

    return decorate


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Register ``fn(old_logprobs, logprobs, advantages, mask, train, weights) -> (loss, metrics)`` as
    policy loss `name` (``train.loss_mode``); see :class:`PolicyLoss`."""

    def decorate(fn: F) -> F:
        _register(POLICY_LOSS_REGISTRY, PolicyLoss(name, fn))
        return fn

    return decorate


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The advantage estimator registered as `name`, with its needs; ValueError naming the known ones."""
    return ADV_ESTIMATOR_REGISTRY[name]


def get_adv_estimator_fn(name: str) -> Callable:
    """The function of the advantage estimator registered as `name`."""
    return get_adv_estimator(name).fn


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as `name`; ValueError naming the known ones otherwise."""
    return POLICY_LOSS_REGISTRY[name]


def get_policy_loss_fn(name: str) -> Callable:
    """The function of the policy loss registered as `name`."""
    return get_policy_loss(name).fn


# The built-ins, declared (names and needs); the trainer's algorithms module registers their functions.
ADV_ESTIMATOR_REGISTRY.add("grpo", AdvantageEstimator("grpo"))
ADV_ESTIMATOR_REGISTRY.add("gae", AdvantageEstimator("gae", needs_values=True))
POLICY_LOSS_REGISTRY.add("vanilla", PolicyLoss("vanilla"))

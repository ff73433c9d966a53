"""The names ``train.adv_estimator`` and ``train.loss_mode`` can take: registries of advantage estimators
and policy losses, each entry with what the update must compute for it.

It imports no torch, so that the config checks a name when it is read (in milliseconds): the built-in
entries name their functions in :mod:`srt_agent.rl.algorithms` (``"module:function"``), imported on first
use; ``@register_adv_est`` / ``@register_policy_loss`` add an entry holding its function. Adding an
estimator is one registered function: the config accepts its name, ``compute_advantages`` calls it, and
the policy and the update read its declared needs (value head, old or reference log-probs), never its name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class Registered:
    """A registry entry: its name and its function, or ``"module:function"`` to import on first use."""

    name: str
    target: Callable | str

    @property
    def fn(self) -> Callable:
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            return getattr(importlib.import_module(module), attr)
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


ADV_ESTIMATOR_REGISTRY: dict[str, AdvantageEstimator] = {}
POLICY_LOSS_REGISTRY: dict[str, PolicyLoss] = {}


def _add(registry: dict, kind: str, entry: Registered) -> None:
    old = registry.get(entry.name)
    if old is not None and old != entry:
        raise ValueError(f"{kind} {entry.name!r} is already registered ({_describe(old.target)})")
    registry[entry.name] = entry


def _describe(target: Callable | str) -> str:
    return target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))


def _lookup(registry: dict, kind: str, name: str):
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(registry)}") from None


def register_adv_est(
    name: str, *, needs_values: bool = False, needs_old_logprobs: bool = False, needs_ref_logprobs: bool = False
) -> Callable[[F], F]:
    """Register ``fn(batch, train) -> (advantages, returns or None)`` as advantage estimator `name`
    (``train.adv_estimator``), with what it needs (see :class:`AdvantageEstimator`)."""

    def decorate(fn: F) -> F:
        entry = AdvantageEstimator(name, fn, needs_values, needs_old_logprobs, needs_ref_logprobs)
        _add(ADV_ESTIMATOR_REGISTRY, "adv_estimator", entry)
        return fn

    return decorate


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Register ``fn(old_logprobs, logprobs, advantages, mask, train, weights) -> (loss, metrics)`` as
    policy loss `name` (``train.loss_mode``); see :class:`PolicyLoss`."""

    def decorate(fn: F) -> F:
        _add(POLICY_LOSS_REGISTRY, "loss_mode", PolicyLoss(name, fn))
        return fn

    return decorate


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The advantage estimator registered as `name`, with its needs; ValueError naming the known ones."""
    return _lookup(ADV_ESTIMATOR_REGISTRY, "adv_estimator", name)


def get_adv_estimator_fn(name: str) -> Callable:
    """The function of the advantage estimator registered as `name`."""
    return get_adv_estimator(name).fn


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as `name`; ValueError naming the known ones otherwise."""
    return _lookup(POLICY_LOSS_REGISTRY, "loss_mode", name)


def get_policy_loss_fn(name: str) -> Callable:
    """The function of the policy loss registered as `name`."""
    return get_policy_loss(name).fn


# The built-ins, by reference (their module imports torch; see the module docstring).
_add(ADV_ESTIMATOR_REGISTRY, "adv_estimator", AdvantageEstimator("grpo", "srt_agent.rl.algorithms:grpo_estimator"))
_add(
    ADV_ESTIMATOR_REGISTRY,
    "adv_estimator",
    AdvantageEstimator("gae", "srt_agent.rl.algorithms:gae_estimator", needs_values=True),
)
_add(POLICY_LOSS_REGISTRY, "loss_mode", PolicyLoss("vanilla", "srt_agent.rl.algorithms:vanilla_policy_loss"))

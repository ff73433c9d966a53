"""Registers the ``srt`` rollout backend with verl; loaded in every process by ``import verl`` through the
``verl.plugins`` entry point (pyproject.toml), so ``actor_rollout_ref.rollout.name=srt`` works everywhere.

verl has a public registry for replicas (``RolloutReplicaRegistry``) but none for the ``BaseRollout``
server adapters, so the adapter goes into ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` directly.
"""

from __future__ import annotations

from verl.workers.rollout import base as _rollout_base
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

BACKEND = "srt"
ADAPTER = "srt_agent.integrations.verl.adapter.SRTServerAdapter"


def _replica_class() -> type[RolloutReplica]:
    from .replica import SRTReplica

    return SRTReplica


def register() -> None:
    """Make ``rollout.name=srt`` resolve to SRTReplica (driver) and SRTServerAdapter (workers)."""
    RolloutReplicaRegistry.register(BACKEND, _replica_class)
    _rollout_base._ROLLOUT_REGISTRY[(BACKEND, "async")] = ADAPTER


register()

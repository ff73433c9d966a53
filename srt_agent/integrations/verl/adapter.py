"""`SRTServerAdapter`: verl's ``BaseRollout`` for the srt backend, living in the trainer (hybrid) or
checkpoint-engine (standalone) worker and driving that worker's replica's :class:`SRTServer`.

``update_weights`` takes the trainer's ``(name, tensor)`` generator in process and ships the tensors to
the server in CPU buckets through Ray's object store (``checkpoint_engine.update_weights_bucket_megabytes``
each); the server loads them all at once when the stream ends. ``resume`` and ``release`` map to the
server's ``wake_up`` and ``sleep``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from .replica import server_name


class SRTServerAdapter(BaseRollout):
    """One process per replica (the srt engine has no tensor parallelism), so every rank leads its replica."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, replica_rank: int = -1, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = replica_rank if replica_rank != -1 else int(os.environ.get("RANK", "0"))
        self.is_leader_rank = True
        self.server_handle = None

    def server(self):
        """The replica's server actor (looked up lazily: it starts after the trainer workers)."""
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        await self.server().wake_up.remote(tags=tags)

    async def release(self) -> None:
        await self.server().sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        peft_config: Any = None,
        **kwargs: Any,
    ) -> int:
        """Send every ``(name, tensor)`` of `weights` to the server and load them; returns how many."""
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"the srt backend takes full tensors (wire_format='named_tensors'), not {wire_format!r}"
            )
        if peft_config is not None:
            raise NotImplementedError(
                "the srt backend loads merged weights: set actor_rollout_ref.model.lora.merge=True"
            )
        bucket_bytes = self.config.checkpoint_engine.update_weights_bucket_megabytes << 20
        server = self.server()
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in weights:
            if hasattr(tensor, "full_tensor"):  # a DTensor shard: every rank takes part in the gather
                tensor = tensor.full_tensor()
            tensor = tensor.detach().to("cpu")
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= bucket_bytes:
                await server.receive_weights.remote(bucket)
                bucket, size = [], 0
        if bucket:
            await server.receive_weights.remote(bucket)
        return await server.apply_weights.remote(global_steps)

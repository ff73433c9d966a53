"""`SRTReplica`: verl's driver-side handle of one srt rollout replica (``actor_rollout_ref.rollout.name=srt``).

A replica is one :class:`SRTServer` Ray actor running one engine on one device: the engine has no tensor,
pipeline or data parallelism, so ``tensor_model_parallel_size``, ``pipeline_model_parallel_size`` and
``data_parallel_size`` must be 1 (verl then makes one replica per GPU). In hybrid mode the server is
placed on its trainer worker's node and sees that worker's GPU; with no workers (tests, CPU) it goes
wherever Ray puts it.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutReplica

from .srt_server import SRTServer

SERVER_PREFIX = "srt_"  # verl's server adapters find their server as f"{rollout.name}_server_{rank}_{node}"


def server_name(replica_rank: int, suffix: str = "") -> str:
    return f"{SERVER_PREFIX}server_{replica_rank}_0{suffix}"


class SRTReplica(RolloutReplica):
    """Launches and addresses one SRTServer; sleep, wake-up and cache calls are verl's defaults."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(SRTServer)

    def rollout_worker_use_gpu(self) -> bool:
        """Colocated workers need a GPU unless the engine is pinned to the CPU."""
        options = (self.config.engine_kwargs or {}).get("srt") or {}
        return options.get("device", "auto") != "cpu"

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise NotImplementedError(
                "the srt backend runs one engine per device: set rollout.tensor_model_parallel_size, "
                f"data_parallel_size and pipeline_model_parallel_size to 1 (world size is {self.world_size})"
            )
        options: dict = {
            "name": server_name(self.replica_rank, self.name_suffix),
            "max_concurrency": self.max_concurrency,
        }
        if self.workers:
            node_id, devices = await self.workers[0].__ray_call__.remote(_node_and_devices)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            if devices:
                options["runtime_env"] = {
                    "env_vars": {
                        "CUDA_VISIBLE_DEVICES": ",".join(devices),
                        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
                    }
                }
        server = self.server_class.options(**options).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = await server.address.remote()


def _node_and_devices(worker) -> tuple[str, list[str]]:
    """(node id, GPU ids) of a worker actor; runs inside the worker."""
    context = ray.get_runtime_context()
    return context.get_node_id(), [str(d) for d in context.get_accelerator_ids().get("GPU", [])]

"""What a vLLM engine starts with on this device: :func:`vllm_settings` turns the device's facts
(:class:`DeviceFacts`, read by :func:`device_facts`) and the backend's options into environment variables
and ``EngineArgs`` (:class:`VLLMSettings`); :func:`apply_env` sets the variables.

On both devices the engine and its worker run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the
live proposer and the weight reload need the worker here; on a GPU the trainer shares its CUDA context) on
vLLM's V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``: V2, the GPU default, calls neither custom proposers
nor the runner's ``_sample``, so SRT and exact sampling need V1; ``workers.check_runner`` checks it).

* CPU: as measured on 2 cores (docs/vllm.md): OpenMP threads bound to all CPUs but one, none reserved;
  the KV cache in bytes (``kv_cache_gib``); float32 under ``engine.dtype: auto``; eager.
* GPU: the model in ``engine.dtype`` (``auto``: bfloat16 where the GPU has it); vLLM's share of the card
  (``gpu_memory_utilization``) is the free memory less what the trainer in this process still allocates
  (:func:`trainer_reserve_bytes`), unless set; CUDA graphs; none of the ``VLLM_CPU_*`` variables.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ...models.training_bytes import trainer_state_bytes
from .settings import V2_RUNNER_ENV

GiB = 2**30
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"  # vLLM's batch-invariant kernels (0.31 and later, CUDA)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: what the trainer allocates per parameter after vLLM has started (the policy's own weights are already
#: resident, so out of the free memory vLLM sees): gradients, AdamW's moments, and one float32 copy (a
#: reference policy or the master copy of a bf16 policy): 16 bytes
TRAINER_BYTES_PER_PARAM = sum(trainer_state_bytes(1, policy_copy=False, reference=True).values())
#: the share of the card kept for the trainer's activations (one micro-batch with its backward pass; a
#: 1.5B model at a few thousand tokens needs several GiB) and the CUDA allocator's fragmentation
TRAINER_HEADROOM = 0.2
QUIET = {"VLLM_LOGGING_LEVEL": "ERROR"}  # vLLM's start-up chatter would bury the run's own lines
CPU_THREAD_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")


@dataclass(frozen=True)
class DeviceFacts:
    """What the settings depend on: the device vLLM runs on and, on a GPU, its memory and the model's size."""

    device: Literal["cpu", "cuda"]
    cpus: int | None = None  # CPUs this process may use (None: unknown); the CPU engine's thread default
    total_bytes: int = 0  # GPU memory
    free_bytes: int = 0  # GPU memory free now
    bf16: bool = False  # the GPU computes in bfloat16
    params: int = 0  # parameters of the model vLLM serves


@dataclass(frozen=True)
class VLLMSettings:
    """Environment variables and ``EngineArgs`` keywords for one engine's start."""

    env: dict[str, str]  # set before the engine starts
    env_defaults: dict[str, str]  # set where the environment has none (the user's word wins)
    engine_args: dict[str, Any] = field(default_factory=dict)  # dtype, enforce_eager, the memory vLLM takes
    summary: str = ""  # one line for the backend's description

    @property
    def dtype(self) -> str:
        return self.engine_args["dtype"]


def model_dtype(name: str, facts: DeviceFacts) -> str:
    """vLLM's model dtype for ``engine.dtype`` `name`: ``auto`` is bfloat16 on a GPU that has it, else float32
    (float16's range can overflow where a model was trained in bf16 or fp32)."""
    if name == "float64":
        raise ValueError("vLLM runs no float64 model: engine.dtype float64 needs engine.backend: engine")
    if name not in ("auto", *DTYPE_BYTES):
        raise ValueError(f"engine.dtype {name!r}: choose auto, float32, bfloat16 or float16 for vLLM")
    if name != "auto":
        return name
    from ...runner.device_info import auto_dtype

    return str(auto_dtype(facts.device == "cuda" and facts.bf16)).removeprefix("torch.")


def head_args(dtype: str) -> dict[str, Any]:
    """Engine arguments that run a narrow (bfloat16, float16) model's LM head in float32, as the trainer's:
    vLLM's ``head_dtype`` (0.31 and later; an older vLLM keeps the head in the model's dtype)."""
    return {"hf_overrides": {"head_dtype": "float32"}} if dtype in ("bfloat16", "float16") else {}


def trainer_reserve_bytes(facts: DeviceFacts) -> int:
    """GPU memory kept free for the trainer of this process: its state still to come, 16 bytes a parameter,
    and a fifth of the card for its activations and the allocator (a rollout-only run keeps it too: the
    backend cannot tell; ``gpu_memory_utilization`` overrides)."""
    return TRAINER_BYTES_PER_PARAM * facts.params + int(TRAINER_HEADROOM * facts.total_bytes)


def free_memory_share(facts: DeviceFacts, dtype: str, kv_cache_gib: float) -> float:
    """vLLM's share of the card: the free memory less the trainer's reserve, as a fraction of the total,
    rounded down to 0.001 (vLLM refuses to start unless ``free >= ceil(total * share)``). ValueError (one
    line) when that share cannot hold vLLM's weights and `kv_cache_gib` of KV (the job's need)."""
    share = facts.free_bytes - trainer_reserve_bytes(facts)
    need = facts.params * DTYPE_BYTES[dtype] + int(kv_cache_gib * GiB)
    if share < need:
        raise ValueError(
            f"the GPU has {facts.free_bytes / GiB:.1f} of {facts.total_bytes / GiB:.1f} GiB free; after the "
            f"trainer's {trainer_reserve_bytes(facts) / GiB:.1f} GiB that leaves vLLM {max(share, 0) / GiB:.1f} GiB, "
            f"less than its weights and KV ({need / GiB:.1f} GiB): lower engine.max_batch or engine.max_context, or "
            "set engine.vllm.gpu_memory_utilization"
        )
    return math.floor(1000 * share / facts.total_bytes) / 1000


def vllm_settings(
    facts: DeviceFacts,
    dtype: str = "auto",
    kv_cache_gib: float = 2.0,
    threads: int | None = None,
    enforce_eager: bool | None = None,
    memory_utilization: float | None = None,
    batch_invariant: bool = False,
) -> VLLMSettings:
    """The settings of one engine on the device `facts` describe (pure: nothing is read or set).

    `kv_cache_gib`: the KV cache (CPU) or the least KV vLLM's share must hold (GPU); `threads`: CPUs
    vLLM's OpenMP threads bind to (CPU; default: all but one); `enforce_eager` (None: on a CPU, off on
    a GPU); `memory_utilization`: vLLM's share of the GPU (None: from the free memory); `batch_invariant`:
    vLLM's batch-invariant mode (CUDA only: ValueError on a CPU)."""
    resolved = model_dtype(dtype, facts)
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", V2_RUNNER_ENV: "0"}
    if batch_invariant and facts.device != "cuda":
        raise ValueError(
            "engine.vllm.batch_invariant: vLLM's batch-invariant mode runs its Triton kernels on CUDA only; "
            "on a CPU leave it off (our engine's engine.batch_invariant is the CPU's)"
        )
    if batch_invariant:
        env[BATCH_INVARIANT_ENV] = "1"
    defaults = dict(QUIET)
    if facts.device == "cpu":
        from .cpu import cpu_env

        if threads is None and facts.cpus:  # one CPU to the agent side: a parallel region stalls when preempted
            threads = max(1, facts.cpus - 1)
        # The KV size goes in bytes (EngineArgs below), not as VLLM_CPU_KVCACHE_SPACE (whole GiB only).
        defaults.update({k: v for k, v in cpu_env(threads).items() if k in CPU_THREAD_ENV})
        args = {"dtype": resolved, "enforce_eager": enforce_eager is not False, **head_args(resolved)}
        args["kv_cache_memory_bytes"] = int(kv_cache_gib * GiB)  # VLLM_CPU_KVCACHE_SPACE, where set, overrides it
        return VLLMSettings(env, defaults, args, f"{resolved}, cpu")
    share = memory_utilization or free_memory_share(facts, resolved, kv_cache_gib)
    args = {"dtype": resolved, "enforce_eager": bool(enforce_eager), "gpu_memory_utilization": share}
    args.update(head_args(resolved))
    summary = f"{resolved}, cuda, {share:.0%} of {facts.total_bytes / GiB:.0f} GiB"
    return VLLMSettings(env, defaults, args, summary)


def apply_env(settings: VLLMSettings, environ: MutableMapping[str, str] = os.environ) -> None:
    """Set `settings`' variables in `environ` (this process's: vLLM reads them when its first engine starts)."""
    environ.update(settings.env)
    for key, value in settings.env_defaults.items():
        environ.setdefault(key, value)


def safetensors_params(model_dir: str | Path) -> int:
    """Parameters stored in `model_dir`'s ``*.safetensors`` files (their headers only: nothing is loaded)."""
    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def device_facts(model_dir: str | Path) -> DeviceFacts:
    """The facts of the device vLLM runs on here, which its build decides (vllm-cpu: the CPU; vllm: CUDA)."""
    import torch

    for key, value in QUIET.items():  # before vLLM's first import, where some versions configure logging
        os.environ.setdefault(key, value)
    from vllm.platforms import current_platform

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if current_platform.is_cpu():
        return DeviceFacts("cpu", cpus)
    if not current_platform.is_cuda_alike():
        raise ValueError(
            f"vLLM runs on {current_platform.device_type} here; srt-agent's vLLM backend runs on CPU and CUDA"
        )
    torch.cuda.empty_cache()  # vLLM empties torch's cache before it measures the free memory too
    free, total = torch.cuda.mem_get_info()
    return DeviceFacts("cuda", cpus, total, free, torch.cuda.is_bf16_supported(), safetensors_params(model_dir))


def cpu_build() -> bool:
    """Whether the installed vLLM is a CPU build (the ``vllm-cpu`` distribution, or a ``+cpu`` version), read
    from its metadata without importing it: the CLI asks before it re-runs itself with the CPU's preloads."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        pass
    try:
        return "cpu" in metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False

